"""Bad nodes on the real test cluster: one node made faulty (a marker file names it; the payload
prints a CUDA ECC error there) is blamed, the trial's next attempt avoids it and the sweep
completes, and status/report name the node; a trial that raises on every node of its two is
FAILED with no node blamed."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_cli, slurm_submit, wait_sweep

from slurmkit.core import badnodes

pytestmark = pytest.mark.cluster
FAULTY = "n1"
ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
PAYLOAD = """
import os, sys, time
if os.path.exists(os.path.join(sys.argv[1], os.environ["SLURMD_NODENAME"])):
    print({ecc!r}, file=sys.stderr, flush=True)
    sys.exit(1)
time.sleep(8)  # the healthy nodes stay busy: only the faulty one is free at the release
"""


def _release(sweep_dir: str, trial_id: str, job: str, timeout: float = 60) -> None:
    """What the release helper's releaser does once the requeued task is PENDING: start it
    now, away from the nodes this trial must avoid (badnodes.for_trial)."""
    avoid = badnodes.for_trial(sweep_dir, trial_id)
    # slurmd refuses a launch credential of the second the old one was revoked in
    [ended] = [f["time"] for f in badnodes.failures(sweep_dir) if f["trial"] == trial_id]
    time.sleep(max(0.0, ended + 2.5 - time.time()))
    end = time.time() + timeout
    while time.time() < end:
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True
        ).stdout.strip()
        if state == "PENDING":
            subprocess.run(
                ["scontrol", "update", f"JobId={job}", "StartTime=now",
                 f"ExcNodeList={','.join(avoid)}"],
                check=True,
            )  # fmt: skip
            return
        time.sleep(0.5)
    raise AssertionError(f"job {job} not pending after {timeout} s")


def test_a_faulty_node_is_blamed_avoided_and_named(slurm_cluster, tmp_path):
    markers = tmp_path / "faulty"
    markers.mkdir()
    (markers / FAULTY).touch()
    code = PAYLOAD.format(ecc=ECC)
    # four trials of four CPUs each: one on every node, so one meets the faulty node
    bad = slurm_submit(
        tmp_path,
        f"name: badnode\ncommand: [python, -c, {json.dumps(code)}, {markers}]\nargs: none\n"
        'params: {i: [0, 1, 2, 3]}\nresources: {cpus: 4, time: "0:05:00"}\n',
    )
    # a trial that raises on both of its nodes: its own error, no node's
    (tmp_path / "own").mkdir()
    own = slurm_submit(
        tmp_path / "own",
        "name: own\ncommand: [python, -c, 'raise ValueError(\"bad lr\")']\nargs: none\n"
        'params: {i: [0]}\nlauncher: srun\nresources: {nodes: 2, time: "0:05:00"}\n',
    )
    root = bad["sweep_dir"]
    end = time.time() + 120
    while not badnodes.failures(root) and time.time() < end:
        time.sleep(0.5)
    [failure] = badnodes.failures(root)
    _release(root, failure["trial"], str(failure["job"]))
    final = wait_sweep(root, timeout=150)
    assert final["counts"] == {"COMPLETED": 4}
    status = json.loads((Path(root) / "trials" / failure["trial"] / "status.json").read_text())
    first, second = status["attempts"]
    assert (first["cause"], first["blamed"], first["evidence"]) == ("node", [FAULTY], ECC)
    assert second["state"] == "COMPLETED" and FAULTY not in second["nodes"]
    shown = json.loads(run_cli("status", root, "--json").stdout)["nodes"]
    assert [(n["node"], n["failures"], n["evidence"]) for n in shown] == [(FAULTY, 1, ECC)]
    assert FAULTY in run_cli("status", root).stdout
    report = json.loads(run_cli("report", root, own["sweep_dir"], "--json").stdout)
    assert [n["node"] for n in report["nodes"]] == [FAULTY]

    final = wait_sweep(own["sweep_dir"], timeout=120)
    [trial] = final["trials"]
    assert (trial["state"], trial["cause"]) == ("FAILED", "error")
    status = json.loads(
        (Path(own["sweep_dir"]) / "trials" / trial["id"] / "status.json").read_text()
    )
    [attempt] = status["attempts"]
    assert len(attempt["nodes"]) == 2 and "blamed" not in attempt
    assert badnodes.failures(own["sweep_dir"]) == []
