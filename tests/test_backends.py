"""The backend interface: a backend added to the registry works through submit, status, resume
and cancel without a change anywhere else; choosing and falling back."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from slurmkit import backends, steer, store, sweep, sweepstate
from slurmkit import spec as spec_mod
from slurmkit.backends.base import Backend, LiveTask, Stopped, Submission, TaskState
from slurmkit.errors import SchedulerError, UserError

QUEUE: dict[str, TaskState] = {}  # the fake scheduler's view: "fake-N" -> state
CANCELLED: list[str] = []


class FakeBackend(Backend):
    """Trials "queued" in QUEUE, one task per trial."""

    name = "fake"
    needs = "nothing"
    where = "in a dict"
    cancel_key = "fake_tasks"
    runs_here = False
    sticky = True

    def submit(self, sweep_dir, plan, indices, scripts, on_done, recorded) -> Submission:
        store.record_submission(sweep_dir, {"backend": self.name, "tasks": indices})
        recorded()
        for i in indices:
            QUEUE[f"fake-{i}"] = TaskState("PENDING", "Resources")
        return Submission(
            sweep_dir.root,
            self.name,
            plan.total,
            indices,
            scripts=[s for _, s in scripts],
            note=self.note,
        )

    def indices(self, record: dict[str, Any]) -> list[int]:
        return list(record["tasks"])

    def live(self, records, owned, ask, *, fresh=False) -> dict[int, LiveTask]:
        mine = [i for rec in records for i in rec["tasks"] if owned is None or owned(i)]
        return {
            i: LiveTask(f"fake-{i}", QUEUE.get(f"fake-{i}") if ask(i) else None, False)
            for i in mine
        }

    def cancel(
        self, records: Sequence[dict[str, Any]], live_jobs: set[str], dry_run: bool
    ) -> list[Stopped]:
        mine = sorted(j for j in live_jobs if j.startswith("fake-"))
        if not dry_run:
            for job in mine:
                QUEUE[job] = TaskState("CANCELLED")
                CANCELLED.append(job)
        return [Stopped(self.cancel_key, job, f"fake task {job}") for job in mine]


@pytest.fixture
def fake(monkeypatch):
    import sys
    import types

    module = types.ModuleType("fake_backend_module")
    module.FakeBackend = FakeBackend  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_backend_module", module)
    monkeypatch.setitem(backends.REGISTRY, "fake", "fake_backend_module:FakeBackend")
    monkeypatch.setattr(backends, "NAMES", (*backends.NAMES, "fake"))
    QUEUE.clear()
    CANCELLED.clear()


def test_a_registered_backend_runs_submit_status_resume_and_cancel(fake, spec_file, tmp_path):
    s = spec_mod.load(
        str(spec_file(f"command: x\nparams: {{a: [1, 2, 3]}}\noutput_root: {tmp_path / 'runs'}\n"))
    )
    sub = sweep.submit(s, backend="fake")
    assert (sub.backend, sub.indices, len(sub.scripts)) == ("fake", [0, 1, 2], 1)
    current = sweepstate.collect(sub.sweep_dir)
    assert [(t.state, t.job, t.reason) for t in current.trials] == [
        ("PENDING", f"fake-{i}", "Resources") for i in range(3)
    ]
    QUEUE["fake-1"] = TaskState("FAILED", "", 3)
    assert sweepstate.collect(sub.sweep_dir).trials[1].state == "FAILED"
    again = sweep.resume(sub.sweep_dir)  # sticky: back to the fake backend, failed trial only
    assert (again.backend, again.indices) == ("fake", [1])
    done = steer.cancel(sub.sweep_dir)
    assert done.as_dict()["fake_tasks"] == ["fake-0", "fake-1", "fake-2"]
    assert done.texts == ["fake task fake-0", "fake task fake-1", "fake task fake-2"]
    assert CANCELLED == ["fake-0", "fake-1", "fake-2"]
    assert [t.state for t in sweepstate.collect(sub.sweep_dir).trials] == ["CANCELLED"] * 3


def test_unknown_backend_names_the_allowed_ones():
    with pytest.raises(UserError) as info:
        backends.choose("nope")
    assert info.value.key == "--backend" and "auto, slurm, local" in info.value.hint


def test_auto_without_sbatch_runs_here_and_says_why(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    chosen = backends.choose("auto")
    assert chosen.name == "local" and chosen.runs_here
    assert chosen.note == "no sbatch on PATH: running the sweep on this machine"


def test_auto_falls_back_when_the_controller_does_not_answer(monkeypatch):
    from slurmkit.backends import slurm

    monkeypatch.setattr(slurm, "available", lambda tool="sbatch": True)

    def refuse(timeout: float) -> Any:
        raise SchedulerError("no Slurm controller answered (x)")

    monkeypatch.setattr(
        slurm.SlurmBackend, "probe", classmethod(lambda cls, timeout: refuse(timeout))
    )
    chosen = backends.choose("auto")
    assert chosen.name == "local"
    assert chosen.note == "no Slurm controller answered (x): running the sweep on this machine"
    with pytest.raises(SchedulerError):
        backends.choose("slurm")


def test_resume_goes_back_to_sticky_backends_only():
    assert backends.for_resume([]) == "auto"
    assert backends.for_resume([{"backend": "slurm"}]) == "slurm"
    assert backends.for_resume([{"backend": "slurm"}, {"backend": "local"}]) == "auto"


def test_latest_submission_owns_a_trial_across_backends(monkeypatch):
    from slurmkit.backends import local

    monkeypatch.setattr(local, "running", lambda r: 111 if r.get("pid") == 111 else None)
    records = [
        {"backend": "slurm", "jobs": [{"job_id": "7", "offset": 0, "array": "0-2"}]},
        {"backend": "local", "pid": 111, "indices": "1"},
    ]
    monkeypatch.setattr("slurmkit.backends.slurm.available", lambda tool="sbatch": False)
    live = backends.live_tasks(records, lambda i: True)
    assert live[0] == LiveTask("7_0", None, False) and live[2] == LiveTask("7_2", None, False)
    assert live[1] == LiveTask(None, None, True)


def test_more_trials_than_the_cluster_holds_are_refused_before_expanding(
    monkeypatch, spec_file, tmp_path
):
    """MaxJobCount of 5 (a controller's answer, faked): 6 trials are refused with the limit
    named, and nothing is created."""
    from slurmkit.backends import slurm

    class Answer:
        def result(self) -> Backend:
            return slurm.SlurmBackend(max_jobs=5)

        def cancel(self) -> None:
            pass

    monkeypatch.setattr(slurm.SlurmBackend, "probe", classmethod(lambda cls, timeout: Answer()))
    body = f"command: x\nparams: {{a: 'range(0,6)'}}\noutput_root: {tmp_path / 'runs'}\n"
    s = spec_mod.load(str(spec_file(body)))
    with pytest.raises(UserError) as info:
        sweep.submit(s, backend="slurm")
    assert "at most 5 jobs" in info.value.message and "MaxJobCount" in info.value.message
    assert info.value.exit_code == 2 and not (tmp_path / "runs").exists()


def test_a_huge_sweep_needs_yes_and_is_not_expanded_without_it(monkeypatch, spec_file, tmp_path):
    from slurmkit import plan

    expanded: list[int] = []
    real = plan.expand
    monkeypatch.setattr(plan, "expand", lambda s: expanded.append(1) or real(s))
    body = "command: x\nparams: {a: 'range(0,1000)', b: 'range(0,1000)'}\n"
    s = spec_mod.load(str(spec_file(body + f"output_root: {tmp_path / 'runs'}\n")))
    with pytest.raises(UserError) as info:
        sweep.submit(s, backend="local")
    assert "1000000 trials" in info.value.message and "--yes" in info.value.hint
    assert expanded == [] and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_a_slow_scheduler_command_says_what_it_printed():
    """sbatch retries for a minute when the controller is full: the error shows its words
    instead of guessing that slurmctld is down."""
    from slurmkit.backends.slurm import Command

    said = "sbatch: error: Slurm temporarily unable to accept job, sleeping and retrying"
    slow = Command(["sh", "-c", f"echo '{said}' >&2; exec sleep 30"], timeout=1)
    with pytest.raises(SchedulerError) as info:
        slow.wait()
    assert said in info.value.message and "MaxJobCount" in info.value.hint
    quiet = Command(["sleep", "30"], timeout=0.5)
    with pytest.raises(SchedulerError) as info:
        quiet.wait()
    assert "scontrol ping" in info.value.hint
