"""pyslurm where it fits: the choice between pyslurm and the command-line tools, and the
fallback. No test here claims that pyslurm works: no Slurm that pyslurm builds against is
reachable, so pyslurm is a stand-in with pyslurm's surface (``Jobs.load()``)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from slurmkit.backends import schedq
from slurmkit.backends.base import TaskState


def fake(version: str, jobs: dict | None = None) -> SimpleNamespace:
    return SimpleNamespace(__version__=version, Jobs=SimpleNamespace(load=lambda: dict(jobs or {})))


@pytest.mark.parametrize(
    ("module", "slurm", "name", "why"),
    [
        (None, "slurm 22.05.8", "cli", "pyslurm is not installed"),
        (fake("25.11.0"), "slurm 22.05.8", "cli", "pyslurm 25.11.0 does not match libslurm 22.05"),
        (fake("22.5.0"), "slurm 22.05.8", "pyslurm", "pyslurm 22.5.0 matches libslurm 22.05"),
        (fake("24.11.1"), "slurm 24.11.3", "pyslurm", "matches libslurm 24.11"),
        (fake("24.11.1"), None, "cli", "Slurm version is unknown"),
        (fake(""), "slurm 24.11.3", "cli", "pyslurm ? does not match"),
    ],
)
def test_the_choice(module, slurm, name, why):
    made = schedq.decide(module, slurm)
    assert made.name == name and why in made.why
    assert made.module is (module if name == "pyslurm" else None)


def test_the_choice_is_made_and_logged_once(monkeypatch, caplog):
    monkeypatch.setattr(schedq, "_chosen", [])
    asked: list[int] = []
    with caplog.at_level(logging.INFO, logger="slurmkit"):
        for _ in range(3):
            made = schedq.choice(lambda: asked.append(1) or None, lambda: "slurm 22.05.8")
    assert made.name == "cli" and asked == [1]
    assert [r.getMessage() for r in caplog.records] == [
        "slurmkit: scheduler queries through cli: pyslurm is not installed"
    ]


def test_without_pyslurm_the_version_is_not_even_asked(monkeypatch):
    monkeypatch.setattr(schedq, "_chosen", [])

    def version() -> str:
        raise AssertionError("sinfo --version asked although pyslurm is missing")

    assert schedq.choice(lambda: None, version).name == "cli"


def test_pyslurm_answers_like_the_cli_path():
    jobs = {
        1: SimpleNamespace(
            id=1,
            user_name="ann",
            array_id=7,
            array_task_id=0,
            state="RUNNING",
            state_reason="None",
            array_tasks_waiting=None,
        ),
        2: SimpleNamespace(
            id=2,
            user_name="ann",
            array_id=7,
            array_task_id=None,
            state="PENDING",
            state_reason="Resources",
            array_tasks_waiting="1-3%2",
        ),
        3: SimpleNamespace(
            id=3,
            user_name="bob",
            array_id=None,
            array_task_id=None,
            state="RUNNING",
            state_reason="None",
            array_tasks_waiting=None,
        ),
    }
    module = fake("22.05.0", jobs)
    mine = schedq.pyslurm_tasks(module, user="ann")
    assert mine == {
        ("7", 0): TaskState("RUNNING", "None"),
        **{("7", t): TaskState("PENDING", "Resources") for t in (1, 2, 3)},
    }
    assert set(schedq.pyslurm_tasks(module, jobs={"3"})) == {("3", 0)}


def test_the_slurm_backend_falls_back_to_the_cli_when_pyslurm_does_not_match(monkeypatch):
    """A mismatched pyslurm is importable: the backend still asks squeue (a stand-in here,
    which also proves that pyslurm's Jobs.load() is never called)."""
    from slurmkit.backends import slurm

    def never() -> dict:
        raise AssertionError("a mismatched pyslurm was used")

    module = SimpleNamespace(__version__="25.11.0", Jobs=SimpleNamespace(load=never))
    monkeypatch.setattr(schedq, "_chosen", [schedq.decide(module, "slurm 22.05.8")])
    asked: list[str] = []
    monkeypatch.setattr(slurm, "_squeue", lambda selection: asked.append(selection) or {})
    slurm.user_tasks("ann")
    assert asked == ["--user=ann"]
