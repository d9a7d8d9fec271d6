"""Multi-node jobs on the real test cluster, run from the very script slurmkit renders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, slurm_submit, wait_sweep

pytestmark = pytest.mark.cluster
PAYLOAD = ROOT / "tests" / "payloads" / "allreduce.py"


def submit_job(tmp_path: Path, body: str, *overrides: str, expect: int = 0):
    return slurm_submit(tmp_path, body, *overrides, command="submit", expect=expect)


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_two_nodes_two_tasks_all_reduce(slurm_cluster, tmp_path, launcher):
    result = submit_job(
        tmp_path,
        f"""
name: allreduce-{launcher}
command: [python, {PAYLOAD}]
launcher: {launcher}
resources: {{nodes: 2, tasks_per_node: 2, time: "0:05:00"}}
env: {{GLOO_SOCKET_IFNAME: lo, OMP_NUM_THREADS: 1}}
""",
    )
    final = wait_sweep(result["sweep_dir"], timeout=180)
    trial = final["trials"][0]
    tdir = Path(result["sweep_dir"]) / "trials" / trial["id"]
    assert final["counts"] == {"COMPLETED": 1}, (tdir / "output.log").read_text()[-3000:]
    ranks = [json.loads((tdir / f"rank-{r}.json").read_text()) for r in range(4)]
    assert [r["rank"] for r in ranks] == [0, 1, 2, 3]
    assert all(r["world_size"] == 4 and r["sum"] == 10.0 for r in ranks)
    assert sorted(r["local_rank"] for r in ranks) == [0, 0, 1, 1]
    hosts = sorted(r["host"] for r in ranks)
    assert len(set(hosts)) == 2 and hosts[0] == hosts[1] and hosts[2] == hosts[3]
    assert len({r["master"] for r in ranks}) == 1


def test_container_job_without_pyxis_names_the_plugin(slurm_cluster, tmp_path):
    proc = submit_job(
        tmp_path,
        f"""
name: boxed
command: [python, {PAYLOAD}]
container: {{image: nvcr.io/nvidia/pytorch:24.01-py3}}
""",
        expect=2,
    )
    assert "pyxis" in proc["stderr"] and "--container-image" in proc["stderr"]
    assert "Traceback" not in proc["stderr"]
    runs = tmp_path / "runs"
    assert not runs.exists() or not any(runs.iterdir())


def test_sweep_of_multi_node_trials(slurm_cluster, tmp_path):
    result = slurm_submit(
        tmp_path,
        f"""
name: mn
command: [python, {PAYLOAD}]
params: {{tag: [a, b]}}
launcher: srun
resources: {{nodes: 2, tasks_per_node: 2, time: "0:05:00"}}
env: {{GLOO_SOCKET_IFNAME: lo, OMP_NUM_THREADS: 1}}
""",
    )
    root = result["sweep_dir"]
    final = wait_sweep(root, timeout=180)
    assert final["counts"] == {"COMPLETED": 2}
    for trial in final["trials"]:
        tdir = Path(root) / "trials" / trial["id"]
        sums = {json.loads((tdir / f"rank-{r}.json").read_text())["sum"] for r in range(4)}
        assert sums == {10.0}


# What each task prints: its rank and its world, as the MPI plugin hands them over
# (pmi2: PMI_RANK, PMI_SIZE; pmix: PMIX_RANK, and the namespace that is the job step's world).
WORLD = {
    "pmi2": 'echo "$PMI_RANK $PMI_SIZE $(hostname)"',
    "pmix": 'echo "$PMIX_RANK $PMIX_NAMESPACE $(hostname)"',
}


@pytest.mark.parametrize("mpi", ["pmi2", "pmix"])
def test_an_mpi_job_runs_one_rank_per_task(slurm_cluster, tmp_path, mpi):
    """`mpi: NAME` puts --mpi on the step (sbatch refuses it): each of the 2 x 2 tasks is one
    rank of one world, as all_reduce_perf needs. pmix is what SUNK's nccl-tests use (the test
    cluster gives each node its own PMIx client directory: see tests/cluster/up.sh)."""
    script = WORLD[mpi] + ' >> "$SLURMKIT_TRIAL_DIR/ranks"'
    body = (
        f"command: [bash, -c, '{script}']\nmpi: {mpi}\nresources: {{nodes: 2, tasks_per_node: 2}}\n"
    )
    result = submit_job(tmp_path, body)
    final = wait_sweep(result["sweep_dir"], timeout=120)
    assert final["counts"] == {"COMPLETED": 1}, final
    trial = Path(result["sweep_dir"]) / "trials" / final["trials"][0]["id"]
    ranks = sorted(line.split() for line in (trial / "ranks").read_text().splitlines())
    assert [r[0] for r in ranks] == ["0", "1", "2", "3"]
    worlds = {r[1] for r in ranks}  # one world: PMI_SIZE 4, or one PMIx namespace
    assert len(worlds) == 1 and (worlds == {"4"} if mpi == "pmi2" else "pmix" in worlds.pop())
    assert len({r[2] for r in ranks}) == 2  # two nodes


def test_run_time_values_reach_every_task_of_a_two_node_step(slurm_cluster, tmp_path):
    """env_runtime placeholders are filled by the runtime (the job's own id), env_prepend is
    joined with the value the task would see, and both reach the tasks srun starts."""
    script = 'echo "$SLURM_JOB_ID $SCR $LIBS" >> "$SLURMKIT_TRIAL_DIR/seen"'
    body = (
        f"command: [bash, -c, '{script}']\nlauncher: none\n"
        "resources: {nodes: 2, tasks_per_node: 1}\n"
        "env: {LIBS: /base/lib}\nenv_prepend: {LIBS: [/opt/a, /opt/b]}\n"
        "env_runtime: {SCR: '/scratch/{job_id}/{array_task_id}-{{x}}'}\n"
    )
    result = submit_job(tmp_path, body)
    final = wait_sweep(result["sweep_dir"], timeout=120)
    assert final["counts"] == {"COMPLETED": 1}, final
    trial = Path(result["sweep_dir"]) / "trials" / final["trials"][0]["id"]
    seen = [line.split() for line in (trial / "seen").read_text().splitlines()]
    assert len(seen) == 2
    for job, scr, libs in seen:
        assert scr == f"/scratch/{job}/0-{{x}}" and libs == "/opt/a:/opt/b:/base/lib"


def test_a_container_that_cannot_start_fails_at_once_not_under_the_error_budget(
    slurm_cluster, tmp_path
):
    """The test cluster has no pyxis, so `slurmkit sweep` refuses a container spec; the script
    it renders, submitted by hand with plain sbatch, meets the real srun's refusal of
    --container-image: cause `container`, one attempt, although the `error` budget is 2."""
    from conftest import run_cli, sbatch_plain

    spec = tmp_path / "c.yaml"
    spec.write_text(
        "name: c\noutput_root: runs\ncommand: [/bin/true]\nargs: none\nparams: {a: [1]}\n"
        "container: {image: 'nvcr.io#nvidia/pytorch:24.01-py3'}\nrequeue: {budgets: {error: 2}}\n"
    )
    refused = run_cli("sweep", str(spec), "--backend", "slurm", cwd=tmp_path)
    assert refused.returncode == 2 and "this cluster has no pyxis" in refused.stderr
    script = run_cli("sweep", str(spec), "--dry-run", "--plain", cwd=tmp_path)
    assert script.returncode == 0, script.stderr
    (tmp_path / "c.sbatch").write_text(script.stdout)
    _, root = sbatch_plain(tmp_path, tmp_path / "c.sbatch", "c")
    final = wait_sweep(str(root), timeout=120)
    assert final["counts"] == {"FAILED": 1}
    tid = final["trials"][0]["id"]
    status = json.loads((root / "trials" / tid / "status.json").read_text())
    assert (status["cause"], len(status["attempts"])) == ("container", 1)
    assert status["reason"] == "its container did not start (see its output.log)"
    shown = json.loads(run_cli("status", str(root), "--json").stdout)["trials"][0]
    assert shown["reason"] == status["reason"]  # not Slurm's NonZeroExitCode
    assert (
        "unrecognized option '--container-image"
        in (root / "trials" / tid / "output.log").read_text()
    )


def test_an_exclusive_torchrun_job_on_gpus_pins_no_cpus(slurm_cluster, tmp_path):
    """The test cluster's nodes have four fake GPUs each (gres.conf). `exclusive: true` and no
    `cpus_per_task`: no --cpus-per-task is rendered, so the step has no SLURM_CPUS_PER_TASK
    (what srun >= 23.11 would inherit, pinning torchrun's workers to one CPU); torchrun starts
    one worker per allocated GPU, and Slurm gives every task of the node both GPUs."""
    result = submit_job(
        tmp_path,
        f"""
name: excl
command: [python, {PAYLOAD}]
launcher: torchrun
resources: {{nodes: 2, gpus_per_node: 2, exclusive: true, time: "0:05:00"}}
env: {{GLOO_SOCKET_IFNAME: lo, OMP_NUM_THREADS: 1}}
""",
    )
    root = Path(result["sweep_dir"])
    script = next((root / "scripts").iterdir()).read_text()
    assert "--cpus-per-task" not in script and "#SBATCH --exclusive" in script
    assert "#SBATCH --gpus-per-node=2" in script
    final = wait_sweep(str(root), timeout=180)
    tdir = root / "trials" / final["trials"][0]["id"]
    assert final["counts"] == {"COMPLETED": 1}, (tdir / "output.log").read_text()[-3000:]
    ranks = [json.loads((tdir / f"rank-{r}.json").read_text()) for r in range(4)]
    assert all(r["world_size"] == 4 and r["sum"] == 10.0 for r in ranks)
    assert [r["env"] for r in ranks] == [
        {"CUDA_VISIBLE_DEVICES": "0,1", "SLURM_CPUS_PER_TASK": None}
    ] * 4


@pytest.mark.parametrize("smi", [True, False], ids=["gpus-seen", "gpus-missing"])
def test_the_self_check_counts_the_gpus_slurm_allocates(slurm_cluster, tmp_path, smi):
    """runtime/selfcheck.sh in a real GPU allocation (Slurm sets CUDA_VISIBLE_DEVICES): with an
    nvidia-smi that lists two GPUs it passes and runs the command; without one, and without
    /dev/nvidia*, it fails the task (exit 3) naming what the allocation gives."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi:
        tool = bin_dir / "nvidia-smi"
        tool.write_text("#!/bin/sh\necho 'GPU 0: Fake (UUID: a)'\necho 'GPU 1: Fake (UUID: b)'\n")
        tool.chmod(0o755)
    check = ROOT / "slurmkit" / "runtime" / "selfcheck.sh"
    mark = 'echo ran > "$SLURMKIT_TRIAL_DIR/ran"'
    # /usr/bin's python3 has no torch: the torch check is skipped, not failed (the venv's CPU
    # torch would see no GPU)
    result = submit_job(
        tmp_path,
        f"""
name: gpucheck
command: [env, "PATH={bin_dir}:/usr/bin:/bin", sh, {check}, sh, -c, '{mark}']
args: none
resources: {{gpus_per_node: 2}}
requeue: {{enabled: false}}
""",
    )
    root = Path(result["sweep_dir"])
    final = wait_sweep(str(root), timeout=120)
    tdir = root / "trials" / final["trials"][0]["id"]
    log = (tdir / "output.log").read_text()
    if smi:
        assert final["counts"] == {"COMPLETED": 1}, log
        assert "2 GPUs (CUDA_VISIBLE_DEVICES=0,1; 2 seen by nvidia-smi)" in log
        assert (tdir / "ran").exists()
    else:
        assert final["counts"] == {"FAILED": 1}, log
        assert json.loads((tdir / "status.json").read_text())["exit_code"] == 3
        assert "gpus: 0 visible (/dev/nvidia* device files), the allocation gives 2" in log
        assert not (tdir / "ran").exists()
