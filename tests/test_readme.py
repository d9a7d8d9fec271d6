"""Every example in README.md and in the commands' --help runs as written: specs load, and each
`slurmkit ...` command line runs (sweeps and jobs with --dry-run; the others on a real sweep
directory that stands in for the examples' `runs/NAME-20261130-101500`)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PAYLOAD, ROOT, SLURMKIT

from slurmkit import spec as spec_mod

README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", README, re.S)
PLACEHOLDER = re.compile(r"runs/\w+-20261130-101500")
# Lines that cannot run here, and why.
CANNOT = {
    "image import": "needs enroot (a compute node's tool): tests/test_jobs.py fakes it",
    "stage": "needs object storage: tests/test_stage.py runs it against a local S3 server",
    "report --since": "asks the cluster's accounting (exit 1 without one): "
    "tests/test_cluster_report.py runs it on the test cluster",
    "doctor": "judges the cluster it runs on (exit 1 without one; the examples name a site's "
    "partition and path): tests/test_doctor.py runs it on the test cluster",
}


def _commands(text: str) -> list[str]:
    """The `slurmkit ...` lines of a block (continuations joined, comments dropped)."""
    out, current = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if current:
            current += " " + line.strip().rstrip("\\")
        elif line.strip().startswith("slurmkit "):
            current = line.strip().rstrip("\\")
        if current and not line.endswith("\\"):
            out.append(current)
            current = ""
    return out


def _help_examples() -> list[str]:
    from slurmkit.cli import main

    lines = []
    commands = [[name] for name in main.commands] + [["image", "import"]]
    for words in commands:
        proc = subprocess.run([*SLURMKIT, *words, "--help"], capture_output=True, text=True)
        assert proc.returncode == 0, (words, proc.stderr)
        lines += _commands(proc.stdout.partition("Example")[2])
    return lines


# Commands that submit: their examples run with --dry-run, under a temporary output_root.
SUBMITS = ("sweep", "submit", "preflight")
README_LINES = [line for kind, text in BLOCKS if kind == "bash" for line in _commands(text)]
HELP_LINES = _help_examples()


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> str:
    """A finished local sweep whose trials report the examples' metrics (loss, acc)."""
    tmp = tmp_path_factory.mktemp("readme")
    spec = tmp / "s.yaml"
    report = json.dumps({"loss": 0.5, "acc": 0.9})
    spec.write_text(
        f"command: [python, {PAYLOAD}]\nparams: {{x: [1, 2, 3, 4], report: ['{report}']}}\n"
    )
    proc = subprocess.run(
        [*SLURMKIT, "sweep", str(spec), f"output_root={tmp}", "--backend", "local", "--json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["sweep_dir"]


def _run(line: str, sweep_dir: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    line = re.split(r"\s+[|>]\s+|\s+#\s", line)[0]  # no pipes, redirections or comments
    words = shlex.split(PLACEHOLDER.sub(sweep_dir, line))[1:]
    ids = [json.loads(r)["id"] for r in Path(sweep_dir, "trials.jsonl").read_text().splitlines()]
    words = [ids[0][:6] if w == "9f2c1a" else w for w in words]  # the examples' id prefix
    if words[0] in SUBMITS and "--resume" not in words and "--list" not in words:
        words.append("--dry-run")
    env = {**os.environ, "SLURMKIT_CONFIG": os.devnull}
    if words[0] == "completion" or "--watch" in words:
        return subprocess.run(
            [*SLURMKIT, *words], capture_output=True, text=True, cwd=ROOT, env=env, timeout=60
        )
    return subprocess.run(
        [
            *SLURMKIT,
            *words,
            *(
                [f"output_root={tmp_path}"]
                if words[0] in SUBMITS and "--resume" not in words
                else []
            ),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=120,
    )


def test_the_examples_are_found():
    assert len(README_LINES) >= 5 and len(HELP_LINES) >= 15
    assert any(line.startswith("slurmkit sweep --resume") for line in HELP_LINES)


@pytest.mark.parametrize("line", sorted(set(README_LINES + HELP_LINES)))
def test_command_line_runs_as_written(line, sweep_dir, tmp_path):
    for words, why in CANNOT.items():
        if line.startswith(f"slurmkit {words}"):
            pytest.skip(why)
    proc = _run(line, sweep_dir, tmp_path)
    assert "Traceback" not in proc.stderr
    assert proc.returncode == 0, f"{line}\n{proc.stderr}"


@pytest.mark.parametrize(
    "text", [t for kind, t in BLOCKS if kind == "yaml"], ids=lambda t: t.splitlines()[0][:40]
)
def test_yaml_examples_load(text, tmp_path, monkeypatch):
    """A spec (it has a command) loads as it is; the user-config example works as one; a
    fragment (a requeue block) loads inside a minimal spec."""
    path = tmp_path / "example.yaml"
    if re.search(r"^command:", text, re.M):
        path.write_text(text)
        spec_mod.load(str(path), job=True)
    elif text.startswith("resources:") and "output_root:" in text:
        config = tmp_path / "config.yaml"
        config.write_text(text)
        monkeypatch.setenv("SLURMKIT_CONFIG", str(config))
        path.write_text("command: x\n")
        assert spec_mod.load(str(path), job=True).output_root == "/mnt/data/runs"
    else:
        path.write_text("command: x\n" + text)
        spec_mod.load(str(path), job=True)


@pytest.mark.slow
@pytest.mark.cluster  # on the cluster when it is up, else on this machine
def test_the_python_api_example_runs(tmp_path):
    """The README's Python API block, as written, in a copy of the repository's sweeps and
    examples (it submits through `backend="auto"`: the test cluster when it is up)."""
    code = next(t for kind, t in BLOCKS if kind == "python" and "slurmkit.load(" in t)
    for folder in ("sweeps", "examples"):
        shutil.copytree(ROOT / folder, tmp_path / folder)
    env = {**os.environ, "SLURMKIT_CONFIG": os.devnull}
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["acc"] == 0.97  # report() outside a trial
