"""The hang watchdog on the real test cluster: a 2-node gloo trial (``launcher: srun``) whose
rank 1 stops while rank 0 waits inside ``all_reduce`` is found, both ranks' stacks are written to
its hang file, and it is requeued (cause ``hang``) and completes from its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, run_cli, slurm_submit, wait_sweep

pytestmark = pytest.mark.cluster
PAYLOAD = ROOT / "tests" / "payloads" / "hang.py"
TIMEOUT = 10  # requeue.hang_timeout of the trial


def test_a_hung_rank_is_requeued_with_every_ranks_stacks(slurm_cluster, tmp_path):
    result = slurm_submit(
        tmp_path,
        f"""
name: hung
command: [python, {PAYLOAD}]
launcher: srun
resources: {{nodes: 2, tasks_per_node: 1, time: "0:10:00"}}
env: {{GLOO_SOCKET_IFNAME: lo, OMP_NUM_THREADS: 1}}
requeue: {{hang_timeout: {TIMEOUT}}}
""",
        command="submit",
    )
    root = Path(result["sweep_dir"])
    final = wait_sweep(str(root), timeout=400)
    trial = final["trials"][0]
    tdir = root / "trials" / trial["id"]
    status = json.loads((tdir / "status.json").read_text())
    log = (tdir / "output.log").read_text()[-4000:]
    assert final["counts"] == {"COMPLETED": 1}, log
    first, second = status["attempts"]
    assert (first["state"], first["cause"]) == ("REQUEUED", "hang"), first
    assert second["state"] == "COMPLETED"
    hang = first["hang"]
    assert hang["file"] == "hang-1.txt" and hang["timeout"] == TIMEOUT
    # found within hang_timeout (+ the watchdog's look, once a second), ended soon after
    assert hang["declared"] - hang["last_progress"] < TIMEOUT + 5
    assert first["end"] - hang["last_progress"] < TIMEOUT + 30
    assert sorted(hang["ranks"]) == ["0", "1"]
    assert first["first_progress"] <= first["last_progress"] == hang["last_progress"]
    assert first["last_checkpoint"] <= first["last_progress"]
    text = (tdir / "hang-1.txt").read_text()
    rank0 = text.split("=== rank 0 ")[1].split("=== rank 1 ")[0]
    rank1 = text.split("=== rank 1 ")[1]
    assert "all_reduce" in rank0, text
    assert "stuck_forever" in rank1, text
    nodes = {json.loads((tdir / f"rank-{r}.json").read_text())["node"] for r in (0, 1)}
    assert len(nodes) == 2 and all(f"node {n}" in text for n in nodes), text
    assert set(hang["nodes"]) == nodes  # each node's last progress, for attributing the hang
    ranks = [json.loads((tdir / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert all(r["attempt"] == "2" and r["first"] == 3 for r in ranks), ranks  # resumed
    shown = run_cli("logs", str(root), "0", "--hang")
    assert shown.returncode == 0 and "=== rank 1 " in shown.stdout, shown.stderr


def test_torchruns_workers_dump_their_stacks_too(slurm_cluster, tmp_path):
    """torchrun's workers start sessions of their own: the step's signal does not reach them
    where Slurm tracks a step by process group (the test cluster); the watchdog signals each by
    its pid, on its node. Outside the requeue policy, the hung trial ends FAILED (cause hang)."""
    result = slurm_submit(
        tmp_path,
        f"""
name: hung-torchrun
command: [python, {PAYLOAD}]
launcher: torchrun
resources: {{nodes: 2, tasks_per_node: 1, time: "0:05:00"}}
env: {{GLOO_SOCKET_IFNAME: lo, OMP_NUM_THREADS: 1}}
requeue: {{enabled: false, hang_timeout: {TIMEOUT}}}
""",
        command="submit",
    )
    root = Path(result["sweep_dir"])
    final = wait_sweep(str(root), timeout=180)
    tdir = root / "trials" / final["trials"][0]["id"]
    status = json.loads((tdir / "status.json").read_text())
    assert (status["state"], status["cause"]) == ("FAILED", "hang"), status
    text = (tdir / "hang-1.txt").read_text()
    assert "all_reduce" in text.split("=== rank 0 ")[1].split("=== rank 1 ")[0], text
    assert "stuck_forever" in text.split("=== rank 1 ")[1], text
