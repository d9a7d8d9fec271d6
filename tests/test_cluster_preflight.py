"""`slurmkit preflight` on the real test cluster: 2 nodes, the CPU path (gloo), the requeue
signal sent to the batch shell; and the cluster's fake GPUs (allocated, seen by nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
SMALL = ("--fs-mib=4", "--files=50", "--checkpoint-mib=1", "--sizes=4K,64K", "--timeout=240")


def test_two_nodes_cpu_path_all_ok(slurm_cluster, tmp_path):
    runs = tmp_path / "runs"
    proc = run_cli(
        "preflight", "--nodes=2", "--gpus-per-node=0", f"--output-root={runs}", "--json", *SMALL
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout)
    checks = {c["name"]: c for c in result["checks"]}
    assert {c["level"] for c in checks.values()} == {"ok"}, checks
    assert checks["all_reduce"]["detail"].startswith("gloo, 2 rank(s): peak busbw")
    assert "reached all 2 rank(s)" in checks["requeue signal (USR2)"]["detail"]
    root = Path(result["sweep_dir"])
    assert root.parent == runs and root.name.startswith("preflight-")
    assert json.loads((root / "preflight.json").read_text()) == result  # stored as printed
    ranks = result["ranks"]
    hosts = [r["host"] for r in ranks]  # whichever 2 nodes are free (the cluster is shared)
    assert len(set(hosts)) == 2 and {r["world_size"] for r in ranks} == {2}
    assert checks["job"]["detail"] == f"2 rank(s) on {', '.join(sorted(hosts))}"
    for r in ranks:  # each node measured its own: they are two writers of the shared directory
        assert r["fs"]["intact"] and r["fs"]["cache_dropped"] and r["checkpoint"]["match"]
        assert r["signal"]["received"] == ["USR2"]
    assert not list((root / "ranks").glob("scratch-*"))  # no test file left on the filesystem
    (trial,) = (root / "trials").iterdir()
    status = json.loads((trial / "status.json").read_text())
    assert status["state"] == "COMPLETED" and status["attempts"][-1]["signals"] == ["USR2"]


def test_fake_gpus_thresholds_and_the_user_configs_signal(slurm_cluster, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("requeue: {signal: USR1}\n")
    runs = tmp_path / "runs"
    proc = run_cli(
        "preflight",
        "--nodes=2",
        "--gpus-per-node=1",
        f"--output-root={runs}",
        "--min-fs-gbps=1000000",
        "--min-busbw=1000000",
        *SMALL,
        env={"SLURMKIT_CONFIG": str(config)},
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "preflight.json" in proc.stdout
    (root,) = runs.iterdir()
    result = json.loads((root / "preflight.json").read_text())
    checks = {c["name"]: c for c in result["checks"]}
    gpus = checks["gpus"]
    assert gpus["level"] == "fail"
    assert "n1: 1 allocated (SLURM_GPUS_ON_NODE), 0 seen by torch; no nvidia-smi" in gpus["detail"]
    assert checks["shared filesystem"]["level"] == "fail"
    assert "--min-fs-gbps 1e+06" in checks["shared filesystem"]["hint"]
    assert checks["all_reduce"]["level"] == "fail" and "--min-busbw" in checks["all_reduce"]["hint"]
    assert checks["requeue signal (USR1)"]["level"] == "ok"  # the user config's, end to end
    assert checks["job"]["level"] == "ok" and checks["checkpoint"]["level"] == "ok"
    assert [r["gpus"]["cuda_visible_devices"] for r in result["ranks"]] == ["0", "0"]
