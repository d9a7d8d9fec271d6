"""A sweep with a `search` on the real test cluster, on every path a sweep runs: the slurm
backend, the submitit backend, and a plain `sbatch` of a rendered script. Pruned trials end
PRUNED with exit 0 (their array task too: sacct's 0:0), the best trial runs every epoch, and
each trial's decisions agree with the rung records; a trial of two srun tasks on two nodes
stops both ranks at the same epoch. (The 81-trial proof with preemption is
asha-ui's.)"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from conftest import run_cli, run_spec, sbatch_plain, wait_sweep

from slurmkit.core import search
from slurmkit.sweepstate import collect

pytestmark = pytest.mark.cluster

CURVE = Path(__file__).parent / "payloads" / "curve.py"
SPEC = f"""
name: asha
command: [python, {CURVE}]
params: {{q: [0.0, 1.0, 2.0, 3.0, 4.0, 5.0], epochs: 8}}
max_parallel: 2
resources: {{time: "0:05:00", mem: 100M}}
search: {{metric: val_loss, max_resource: 8, reduction_factor: 2}}
output_root: runs
"""


# two nodes, one srun task each (SLURM_PROCID 0 and 1): both ranks report, rank 0 decides
TWO_RANKS = SPEC.replace("mem: 100M}", "mem: 100M, nodes: 2}") + "launcher: srun\n"


def _submit(where: Path, backend: str, spec: str = SPEC) -> str:
    where.mkdir()
    proc = run_spec(where, spec, backend=backend)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["sweep_dir"]


def _plain(where: Path) -> tuple[str, str]:
    where.mkdir()
    (where / "asha.yaml").write_text(SPEC)
    proc = run_cli("sweep", "asha.yaml", "--dry-run", "--plain", cwd=where)
    assert proc.returncode == 0, proc.stderr
    script = where / "asha.sbatch"
    script.write_text(proc.stdout)
    job, root = sbatch_plain(where, script, "asha")
    return job, str(root)


def _wait_plain(root: str, n: int, timeout: float = 240) -> dict:
    end = time.time() + timeout
    while time.time() < end:
        current = collect(root)
        if len(current.trials) == n and current.finished:
            return current.as_dict()
        time.sleep(1)
    raise AssertionError(f"{root}: not finished: {collect(root).counts}")


def _exit_codes(job: str) -> set[str]:
    """sacct's ExitCode of each task of array ``job`` (empty where accounting keeps none)."""
    proc = subprocess.run(
        ["sacct", "-j", job, "-X", "-n", "-P", "-o", "ExitCode"], capture_output=True, text=True
    )
    return set(proc.stdout.split()) if proc.returncode == 0 else set()


def _check(root: str, final: dict, ranks: int = 1) -> None:
    trials = {t["params"]["q"]: t for t in final["trials"]}
    assert {t["state"] for t in trials.values()} <= {"COMPLETED", "PRUNED"}, final["counts"]
    assert trials[0.0]["state"] == "COMPLETED"  # the best at every rung
    assert trials[5.0]["state"] == "PRUNED"  # the worst, judged among at least 5 values
    for q, t in trials.items():
        assert t["exit_code"] == 0
        tdir = Path(root) / "trials" / t["id"]
        epochs = [int(e) for e in (tdir / "epochs.txt").read_text().split()]
        assert epochs == list(range(1, len(epochs) + 1))  # no epoch twice
        d = search.decisions(str(tdir))
        assert d is not None and d["pruned"] == (t["state"] == "PRUNED")
        for r in d["rungs"]:
            assert search.rung_values(root, r["rung"])[t["id"]] == q + 1 / r["reached"]
        if t["state"] == "PRUNED":
            assert len(epochs) == d["rungs"][-1]["reached"]  # it stopped at its pruning
        else:
            assert len(epochs) == 8
        for rank in range(1, ranks):  # every other rank stopped at the same epoch
            assert (tdir / f"epochs-rank{rank}.txt").read_text().split() == [str(e) for e in epochs]


@pytest.mark.slow
def test_a_search_prunes_on_every_path_with_exit_0(slurm_cluster, tmp_path):
    on_slurm = _submit(tmp_path / "slurm", "slurm")
    on_submitit = _submit(tmp_path / "submitit", "submitit")
    two_ranks = _submit(tmp_path / "ranks", "slurm", TWO_RANKS)
    job, plain = _plain(tmp_path / "plain")
    for root in (on_slurm, on_submitit):
        _check(root, wait_sweep(root))
    _check(two_ranks, wait_sweep(two_ranks), ranks=2)
    _check(plain, _wait_plain(plain, 6))
    arrays = [job]
    for root in (on_slurm, on_submitit, two_ranks):
        for sub in sorted(Path(root, "submissions").glob("*.json")):
            arrays += [str(j["job_id"]) for j in json.loads(sub.read_text())["jobs"]]
    for array in arrays:
        assert _exit_codes(array) <= {"0:0"}, array
    st = run_cli("status", on_slurm, "--json")
    assert st.returncode == 0  # PRUNED is no failure
