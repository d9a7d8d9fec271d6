"""Bad nodes in the trial runtime: a node's failure is requeued under the `node` budget and
recorded against its node; a trial's own error is FAILED with no node blamed; a vanished attempt
blames its one node; the sweep's excluded nodes go to later submissions as --exclude."""

from __future__ import annotations

import json
import os

from slurmkit.core import badnodes
from slurmkit.core.contract import REQUEUE_EXIT
from slurmkit.core.fsutil import read_json

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def _sweep(tmp_path, spec_file, say: str, trials: int = 1, requeue: str = ""):
    from slurmkit import plan, store
    from slurmkit import spec as spec_mod

    values = ", ".join(str(i) for i in range(trials))
    s = spec_mod.load(
        str(
            spec_file(
                f"command: [sh, -c, {json.dumps(say)}]\nargs: none\nparams: {{a: [{values}]}}\n"
                f"requeue: {{{requeue}}}\n"
            )
        )
    )
    rows = plan.expand(s)
    sweep = store.create(plan.make(s, rows, os.getcwd()), str(tmp_path / "sweep"))
    return sweep, [r.id for r in rows]


def _run(sweep, index, monkeypatch, node):
    from slurmkit.runtime.trial import TrialRun

    monkeypatch.setenv("SLURM_JOB_ID", str(100 + index))
    monkeypatch.setenv("SLURM_JOB_NODELIST", node)
    monkeypatch.setenv("PATH", "/nonexistent-slurm:" + os.environ["PATH"])  # no squeue/sinfo
    run = TrialRun(sweep, index, under_slurm=True)
    run.start()
    return run.wait()


def test_an_ecc_error_is_requeued_under_the_node_budget_and_excludes_after_two(
    tmp_path, spec_file, monkeypatch
):
    sweep, ids = _sweep(tmp_path, spec_file, f"echo '{ECC}' >&2; exit 1", trials=2)
    assert _run(sweep, 0, monkeypatch, "n2") == REQUEUE_EXIT
    status = read_json(sweep.status(ids[0]))
    [attempt] = status["attempts"]
    assert (status["state"], status["cause"]) == ("REQUEUED", "node")
    assert (attempt["nodes"], attempt["blamed"], attempt["evidence"]) == (["n2"], ["n2"], ECC)
    assert badnodes.for_trial(sweep.root, ids[0]) == ["n2"]
    assert badnodes.excluded(sweep.root) == []
    assert _run(sweep, 1, monkeypatch, "n2") == REQUEUE_EXIT
    assert badnodes.excluded(sweep.root) == ["n2"]
    [rec, _] = badnodes.failures(sweep.root)
    assert (rec["trial"], rec["kind"], rec["blamed"], rec["exclude_after"]) == (
        ids[0],
        "ecc",
        ["n2"],
        2,
    )


def test_the_node_budget_runs_out(tmp_path, spec_file, monkeypatch):
    sweep, ids = _sweep(tmp_path, spec_file, f"echo '{ECC}'; exit 1", requeue="budgets: {node: 1}")
    assert _run(sweep, 0, monkeypatch, "n2") == REQUEUE_EXIT
    assert _run(sweep, 0, monkeypatch, "n3") == 1
    status = read_json(sweep.status(ids[0]))
    assert (status["state"], status["cause"]) == ("FAILED", "node")
    assert status["reason"] == "node budget exhausted (1 requeue)"


def test_a_plain_python_exception_fails_and_blames_no_node(tmp_path, spec_file, monkeypatch):
    say = "python3 -c 'raise ValueError(\"bad lr\")'"
    sweep, ids = _sweep(tmp_path, spec_file, say)
    assert _run(sweep, 0, monkeypatch, "n2") == 1
    status = read_json(sweep.status(ids[0]))
    assert (status["state"], status["cause"]) == ("FAILED", "error")  # as today
    assert "blamed" not in status["attempts"][0] and status["attempts"][0]["nodes"] == ["n2"]
    assert badnodes.failures(sweep.root) == []


def test_the_users_exit_code_is_a_node_fault(tmp_path, spec_file, monkeypatch):
    sweep, ids = _sweep(tmp_path, spec_file, "exit 7", requeue="node_fault: {exit_codes: [7]}")
    assert _run(sweep, 0, monkeypatch, "n4") == REQUEUE_EXIT
    assert read_json(sweep.status(ids[0]))["attempts"][0]["evidence"] == "exit code 7"


def test_a_vanished_attempt_blames_its_one_node(tmp_path, spec_file, monkeypatch):
    from slurmkit.core.fsutil import atomic_write_json

    sweep, ids = _sweep(tmp_path, spec_file, "exit 0")
    os.makedirs(sweep.trial(ids[0]))
    vanished = {"n": 1, "state": "RUNNING", "host": "n3", "start": 1.0, "nodes": ["n3"]}
    atomic_write_json(sweep.status(ids[0]), {"id": ids[0], "index": 0, "attempts": [vanished]})
    assert _run(sweep, 0, monkeypatch, "n1") == 0
    first = read_json(sweep.status(ids[0]))["attempts"][0]
    assert (first["cause"], first["blamed"]) == ("node_failure", ["n3"])
    assert [r["kind"] for r in badnodes.failures(sweep.root)] == ["node_failure"]


def test_later_submissions_get_the_sweeps_excluded_nodes(tmp_path, monkeypatch):
    from slurmkit.backends import slurm

    for n in (1, 2):
        badnodes.record(
            str(tmp_path),
            {"trial": f"t{n}", "attempt": 1, "time": n, "blamed": ["n2"], "kind": "ecc"},
        )
    assert slurm.exclude_option(str(tmp_path), {}) == ["--exclude=n2"]
    assert slurm.exclude_option(str(tmp_path), {"exclude": "n[4-5]"}) == ["--exclude=n2,n4,n5"]
    assert slurm.exclude_option(str(tmp_path / "none"), {"exclude": "n1"}) == []


def _shims(tmp_path, monkeypatch, pending: str):
    """squeue (lists ``pending``), scontrol and sbatch that log their arguments; sinfo, 4 nodes."""
    log, bin_dir = tmp_path / "calls.log", tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "squeue": f'echo "squeue $*" >> {log}; printf "%s\\n" {pending}',
        "scontrol": f'echo "scontrol $*" >> {log}',
        "sbatch": f'echo "sbatch $*" >> {log}; echo 42',
        "sinfo": "printf 'n1\\nn2\\nn3\\nn4\\n'",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return log


def test_a_newly_excluded_node_is_kept_from_the_sweeps_pending_tasks(
    tmp_path, spec_file, monkeypatch
):
    from slurmkit.core.fsutil import atomic_write_json
    from slurmkit.runtime.trial import TrialRun

    sweep, ids = _sweep(tmp_path, spec_file, f"echo '{ECC}'; exit 1", trials=3)
    os.makedirs(sweep.submissions, exist_ok=True)
    atomic_write_json(
        os.path.join(sweep.submissions, "0001.json"),
        {"jobs": [{"job_id": "12", "offset": 0, "array": "0-2"}]},
    )
    log = _shims(tmp_path, monkeypatch, "12_0 12_2")  # trial 0 requeued, trial 2 not started
    monkeypatch.setenv("SLURM_JOB_PARTITION", "low")
    badnodes.record(sweep.root, {"trial": ids[0], "attempt": 9, "time": 0, "blamed": ["n1"]})
    for index in (0, 1):
        monkeypatch.setenv("SLURM_JOB_NODELIST", "n2")
        monkeypatch.setenv("SLURM_JOB_ID", str(100 + index))
        run = TrialRun(sweep, index, under_slurm=True)
        run.start()
        assert run.wait() == REQUEUE_EXIT
        if index == 0:
            assert not log.exists()  # one failure: the sweep excludes nothing yet
    assert log.read_text().splitlines() == [
        "squeue -h -r -t PD -j 12 -o %i",
        "scontrol update JobId=12_0 ExcNodeList=n1,n2",  # its own bad node kept
        "scontrol update JobId=12_2 ExcNodeList=n2",
    ]
    assert [r.get("partition_nodes") for r in badnodes.failures(sweep.root)] == [None, 4, 4]


def test_sbatch_passes_the_exclude_option(tmp_path, monkeypatch):
    from slurmkit.backends import slurm

    log = _shims(tmp_path, monkeypatch, "")
    assert slurm.sbatch("job.sh", dependency="afterok:1", options=["--exclude=n2"]) == "42"
    assert log.read_text() == "sbatch --parsable --exclude=n2 --dependency=afterok:1 job.sh\n"


def test_a_function_job_whose_step_died_of_its_node_is_requeued_under_the_node_budget(
    tmp_path, monkeypatch
):
    """The function job's step died without a result, with an ECC error on its one node."""
    import pytest

    pytest.importorskip("submitit")
    from slurmkit.core.jobcontract import JobContract, Policy
    from slurmkit.runtime.fnjob import Supervisor

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n3")
    folder = tmp_path / "jobs"
    folder.mkdir()
    say = f"echo '{ECC}' >> {folder / '7_0_log.err'}; exit 1"
    sup = Supervisor(JobContract(folder=str(folder), requeue=Policy()), ["sh", "-c", say])
    assert sup.begin() is None and sup.start()
    assert sup.finish(sup.wait_step()) == REQUEUE_EXIT
    [done] = sup.record["attempts"]
    assert (done["state"], done["cause"], done["blamed"]) == ("REQUEUED", "node", ["n3"])


def test_the_submitit_backend_excludes_them_too(tmp_path, spec_file):
    import pytest

    pytest.importorskip("submitit")
    from slurmkit import spec as spec_mod
    from slurmkit.backends.submitit import Trials

    s = spec_mod.load(str(spec_file("command: [/bin/true]\nparams: {a: [1]}\n")))
    assert "exclude" not in Trials(s, str(tmp_path)).parameters["additional_parameters"]
    for n in (1, 2):
        badnodes.record(str(tmp_path), {"trial": f"t{n}", "attempt": 1, "time": n,
                                        "blamed": ["n2"], "kind": "ecc"})  # fmt: skip
    assert Trials(s, str(tmp_path)).parameters["additional_parameters"]["exclude"] == "n2"


def test_a_failure_seen_on_more_nodes_than_may_be_excluded_is_the_trials(
    tmp_path, spec_file, monkeypatch
):
    """Two nodes already blamed for the same kind (a partition of 4 may lose one): a third node
    showing it means the job fails everywhere: FAILED as the trial's error, no node blamed."""
    sweep, ids = _sweep(tmp_path, spec_file, f"echo '{ECC}'; exit 1")
    for n, node in enumerate(["n1", "n2"]):
        badnodes.record(sweep.root, {"trial": f"x{n}", "attempt": 1, "time": n, "kind": "ecc",
                                     "blamed": [node], "partition_nodes": 4})  # fmt: skip
    assert _run(sweep, 0, monkeypatch, "n3") == 1
    status = read_json(sweep.status(ids[0]))
    assert (status["state"], status["cause"]) == ("FAILED", "error")
    assert "blamed" not in status["attempts"][0] and len(badnodes.failures(sweep.root)) == 2
