"""slurmkit.Sweep: a sweep as a Python object over the same sweep directory as the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import PAYLOAD, run_cli

import slurmkit
from slurmkit.errors import UserError

BODY = f"""
name: api
command: [python, {PAYLOAD}]
params: {{x: [1, 2, 3]}}
"""


@pytest.fixture
def spec_path(tmp_path: Path) -> Path:
    path = tmp_path / "api.yaml"
    path.write_text(BODY + f"output_root: {tmp_path / 'runs'}\n")
    return path


def test_load_lists_trials_without_creating_anything(spec_path, tmp_path):
    sw = slurmkit.Sweep.load(str(spec_path), ["params.x=1,2"])
    assert [t["params"] for t in sw.trials] == [{"x": 1}, {"x": 2}]
    assert not sw.submitted and "not submitted" in repr(sw)
    with pytest.raises(UserError, match="not been submitted"):
        sw.status()
    assert not (tmp_path / "runs").exists()


def test_submit_status_results_logs_on_the_local_backend(spec_path):
    sw = slurmkit.Sweep.load(str(spec_path)).submit(backend="local")
    assert sw.submission is not None and sw.submission.ran_here
    st = sw.status()
    assert st.counts == {"COMPLETED": 3} and st.finished
    rows = sw.results(sort="x", desc=True)
    assert [r["x"] for r in rows] == [3, 2, 1] and all(r["state"] == "COMPLETED" for r in rows)
    assert rows[0]["score"] == 6.0  # the metric the payload reports
    assert "attempt 1" in sw.logs(0)
    with pytest.raises(UserError, match="submitted already"):
        sw.submit(backend="local")
    assert sw.wait(progress=False, interval=0.1).finished


def test_a_cli_sweep_is_read_and_resumed_from_python_and_the_reverse(spec_path, tmp_path):
    proc = run_cli("sweep", str(spec_path), "--backend", "local", "--json")
    assert proc.returncode == 0, proc.stderr
    root = json.loads(proc.stdout)["sweep_dir"]
    sw = slurmkit.Sweep.open(root)
    assert len(sw.trials) == 3 and sw.status().counts == {"COMPLETED": 3}
    first = Path(root) / "trials" / sw.trials[0]["id"] / "status.json"
    first.unlink()  # as if it never ran: a resume runs it again
    again = sw.resume(backend="local")
    assert again.indices == [0] and sw.status().counts == {"COMPLETED": 3}
    # and the CLI reads what Python made
    made = slurmkit.Sweep.load(str(spec_path), ["params.x=7"]).submit(backend="local")
    shown = run_cli("results", made.sweep_dir, "--json")
    assert shown.returncode == 0 and [r["x"] for r in json.loads(shown.stdout)] == [7]


def test_open_of_something_that_is_no_sweep_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="not a sweep directory"):
        slurmkit.Sweep.open(str(tmp_path))


def test_results_as_frame(spec_path):
    sw = slurmkit.Sweep.load(str(spec_path)).submit(backend="local")
    try:
        import pandas  # noqa: F401
    except ImportError:
        with pytest.raises(UserError, match="needs pandas"):
            sw.results(as_frame=True)
        return
    frame = sw.results(sort="x", as_frame=True)
    assert list(frame["x"]) == [1, 2, 3] and list(frame.columns[:3]) == ["index", "id", "state"]


def test_bad_wait_interval_is_refused(spec_path):
    sw = slurmkit.Sweep.load(str(spec_path)).submit(backend="local")
    for bad in (0, -1, float("nan")):
        with pytest.raises(UserError, match="interval must be > 0"):
            sw.wait(interval=bad)


@pytest.mark.cluster
def test_on_the_cluster_a_cli_sweep_is_read_and_resumed_from_python(slurm_cluster, tmp_path):
    """`slurmkit sweep` on the test cluster, whose trials fail on their first attempt;
    Sweep.open reads it, Sweep.resume submits them again, and the sweep completes."""
    from conftest import slurm_submit, wait_sweep

    body = f"command: [python, {PAYLOAD}]\nparams: {{x: [1, 2, 3], flaky: [1]}}\n"
    root = slurm_submit(tmp_path, body)["sweep_dir"]
    wait_sweep(root, timeout=120)
    sw = slurmkit.Sweep.open(root)
    assert sw.status().counts == {"FAILED": 3} and len(sw.trials) == 3
    again = sw.resume(backend="slurm")
    assert again.indices == [0, 1, 2] and again.jobs
    assert sw.wait(progress=False, interval=1).counts == {"COMPLETED": 3}
    assert [r["score"] for r in sw.results(sort="x")] == [2.0, 4.0, 6.0]
