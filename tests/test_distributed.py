"""Rank info from torchrun's and Slurm's environments; a real 2-node x 2-task gloo job on the test
cluster, launched by srun and by torchrun; the GPU bench's CPU smoke mode."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

from slurmkit.core.rendezvous import first_host, job_port
from slurmkit.runtime.distributed import RankInfo, rank_info, tasks_per_node

# What srun gave task 3 of `sbatch --nodes=2 --ntasks-per-node=2` on the test cluster (job 92).
SLURM_TASK = {
    "SLURM_JOB_ID": "92",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_NODELIST": "n[1-2]",
    "SLURM_NNODES": "2",
    "SLURM_NTASKS": "4",
    "SLURM_NPROCS": "4",
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2)",
    "SLURM_NODEID": "1",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_GTIDS": "2,3",
    "SLURM_SUBMIT_DIR": "/tmp/dk",
}
# ... and what the batch script itself saw: no step.
SLURM_BATCH = {
    k: v for k, v in SLURM_TASK.items() if not k.startswith(("SLURM_STEP", "SLURM_GTIDS"))
}
SLURM_BATCH.update(SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_GTIDS="0")
TORCHRUN = {
    "RANK": "5",
    "WORLD_SIZE": "8",
    "LOCAL_RANK": "1",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "gpu-001",
    "MASTER_PORT": "29400",
}


def test_slurm_task():
    assert rank_info(SLURM_TASK) == RankInfo(
        rank=3,
        local_rank=1,
        world_size=4,
        local_world_size=2,
        node_rank=1,
        master_addr="n1",
        master_port=10000 + 92 % 50000,
        device="cpu",
    )


def test_slurm_port_wraps_and_gpus_pick_the_device():
    info = rank_info({**SLURM_TASK, "SLURM_JOB_ID": "1234567"}, gpus=2)
    assert info.master_port == job_port("1234567")
    assert info.device == "cuda:1"
    assert rank_info(SLURM_TASK, gpus=1).device == "cuda:0"  # one GPU bound per task


def test_slurm_master_from_the_environment_wins_unless_empty():
    env = {**SLURM_TASK, "MASTER_ADDR": "head", "MASTER_PORT": "23456"}
    info = rank_info(env)
    assert (info.master_addr, info.master_port) == ("head", 23456)
    # enroot's PyTorch hook writes MASTER_ADDR= (empty) when scontrol fails in its context
    info = rank_info({**SLURM_TASK, "MASTER_ADDR": "", "MASTER_PORT": ""})
    assert (info.master_addr, info.master_port) == ("n1", 10092)


def test_slurm_step_on_some_nodes_with_uneven_tasks():
    """Seen on the test cluster: `srun -N2 -n3 -r 1` in a 3-node job; SLURM_NODEID counts from
    the step's first node."""
    env = {
        **SLURM_TASK,
        "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_STEP_NODELIST": "n[2-3]",
        "SLURM_STEP_TASKS_PER_NODE": "2,1",
        "SLURM_STEP_NUM_TASKS": "3",
        "SLURM_NTASKS": "3",
        "SLURM_NODEID": "1",
        "SLURM_PROCID": "2",
        "SLURM_LOCALID": "0",
    }
    info = rank_info(env)
    assert (
        info.rank,
        info.local_rank,
        info.world_size,
        info.local_world_size,
        info.node_rank,
        info.master_addr,
    ) == (2, 0, 3, 1, 1, "n2")
    env.update(SLURM_NODEID="0", SLURM_PROCID="1", SLURM_LOCALID="1")
    assert rank_info(env).local_world_size == 2


def test_step_nodelist_names_the_master():
    env = {**SLURM_TASK, "SLURM_JOB_NODELIST": "n[1-4]", "SLURM_STEP_NODELIST": "n[3-4]"}
    assert rank_info(env).master_addr == "n3"


def test_batch_script_is_a_single_process():
    assert rank_info(SLURM_BATCH) == RankInfo(0, 0, 1, 1, 0, "127.0.0.1", 0)


def test_no_launcher_is_a_single_process():
    assert rank_info({}) == RankInfo(0, 0, 1, 1, 0, "127.0.0.1", 0)
    assert rank_info({"MASTER_PORT": "1234"}).master_port == 1234


def test_torchrun():
    assert rank_info(TORCHRUN, gpus=4) == RankInfo(5, 1, 8, 4, 1, "gpu-001", 29400, "cuda:1")


def test_torchrun_inside_a_slurm_step_wins():
    info = rank_info({**SLURM_TASK, **TORCHRUN})
    assert (info.rank, info.world_size, info.node_rank, info.master_addr) == (5, 8, 1, "gpu-001")


def test_enroot_hook_variables_in_a_slurm_step():
    """The PyTorch hook sets RANK, LOCAL_RANK, WORLD_SIZE, MASTER_* but no LOCAL_WORLD_SIZE."""
    env = {
        **SLURM_TASK,
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": str(92 % 4536 + 61000),
    }
    assert rank_info(env) == RankInfo(3, 1, 4, 2, 1, "n1", 61092)


def test_torchrun_without_master_defaults_to_localhost():
    info = rank_info({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"})
    assert (info.master_addr, info.master_port, info.local_world_size) == ("127.0.0.1", 29500, 2)


@pytest.mark.parametrize(
    "nodelist",
    [
        "n[1-2]",
        "n1",
        "gpu-[007-009,012],cpu1",
        "a1,b[2-3]",
        "rack[1-2]-node[03-04]",
        "n[10,2]",
        "h100-[0001-0128]",
    ],
)
def test_first_host_matches_scontrol(nodelist):
    expected = {
        "n[1-2]": "n1",
        "n1": "n1",
        "gpu-[007-009,012],cpu1": "gpu-007",
        "a1,b[2-3]": "a1",
        "rack[1-2]-node[03-04]": "rack1-node03",
        "n[10,2]": "n10",
        "h100-[0001-0128]": "h100-0001",
    }[nodelist]
    assert first_host(nodelist) == expected
    if shutil.which("scontrol"):
        proc = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30
        )
        if proc.returncode == 0:
            assert proc.stdout.split()[0] == expected


def test_tasks_per_node():
    assert tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert tasks_per_node("8") == [8]
    with pytest.raises(ValueError):
        tasks_per_node("2(y3)")


def test_import_is_stdlib_only():
    code = (
        "import sys, slurmkit.runtime.distributed, slurmkit.runtime.selfcheck; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.slow
def test_init_single_process_cpu():
    code = textwrap.dedent("""
        import os, torch, torch.distributed as dist
        from slurmkit.runtime import distributed
        for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
            os.environ.pop(k, None)
        info = distributed.init()
        assert distributed.init() == info  # idempotent
        t = torch.tensor([2.0]); dist.all_reduce(t)
        assert dist.get_backend() == "gloo" and t.item() == 2.0 and info.device == "cpu"
        assert os.environ["RANK"] == "0" and os.environ["WORLD_SIZE"] == "1"
        dist.destroy_process_group()
        print("ok")
    """)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.slow
def test_gpu_bench_cpu_smoke():
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench" / "gpu_distributed.py"),
            "--cpu",
            "--sizes",
            "4096",
            "65536",
            "--iters",
            "2",
            "--warmup",
            "1",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert any(
        "slurmkit rank 1: init() read {'rank': 1, 'local_rank': 1, 'world_size': 2" in ln
        for ln in lines
    )
    for label in ("4 KiB", "64 KiB", "DDP step"):
        row = next(ln for ln in lines if ln.strip().startswith(label))
        assert float(row.split()[-4 if label == "DDP step" else -2]) > 0  # the ratio


# --- on the real test cluster ---------------------------------------------------------------

PAYLOAD = """\
import dataclasses, json, os, socket, sys
import torch, torch.distributed as dist
from slurmkit.runtime import distributed
info = distributed.init(timeout=60)
t = torch.tensor([float(info.rank + 1)])
dist.all_reduce(t)
out = {**dataclasses.asdict(info), "sum": t.item(), "host": socket.gethostname(),
       "backend": dist.get_backend(), "launcher": "torchrun" if "TORCHELASTIC_RUN_ID" in os.environ
       else "srun"}
dist.destroy_process_group()
with open(os.path.join(sys.argv[1], f"rank-{info.rank}.json"), "w") as fh:
    json.dump(out, fh)
"""


def run_job(cluster, tmp_path: Path, script: str, *sbatch: str) -> tuple[str, list[dict]]:
    (tmp_path / "payload.py").write_text(PAYLOAD)
    (tmp_path / "job.sh").write_text(script)
    job = cluster.sbatch(
        "--job-name=slurmkit-dist",
        "--time=2",
        "--no-requeue",
        f"--chdir={tmp_path}",
        f"--output={tmp_path}/job.out",
        *sbatch,
        str(tmp_path / "job.sh"),
    )
    states = cluster.wait_for_jobs([job], timeout=90)
    log = (tmp_path / "job.out").read_text() if (tmp_path / "job.out").exists() else ""
    assert states[job] == "COMPLETED", log
    results = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("rank-*.json"))]
    return job, sorted(results, key=lambda r: r["rank"])


def check_ranks(results: list[dict], launcher: str) -> None:
    assert [r["rank"] for r in results] == [0, 1, 2, 3]
    assert all(r["sum"] == 1 + 2 + 3 + 4 for r in results)
    assert all(r["world_size"] == 4 and r["local_world_size"] == 2 for r in results)
    assert all(r["backend"] == "gloo" and r["device"] == "cpu" for r in results)
    assert all(r["launcher"] == launcher for r in results)
    hosts = [r["host"] for r in results]
    assert hosts[0] == hosts[1] != hosts[2] == hosts[3], hosts
    assert [r["node_rank"] for r in results] == [0, 0, 1, 1]
    assert [r["local_rank"] for r in results] == [0, 1, 0, 1]
    assert len({(r["master_addr"], r["master_port"]) for r in results}) == 1


@pytest.mark.cluster
def test_srun_two_nodes_two_tasks(slurm_cluster, tmp_path):
    script = f"#!/bin/bash\nsrun {sys.executable} payload.py {tmp_path}\n"
    job, results = run_job(slurm_cluster, tmp_path, script, "--nodes=2", "--ntasks-per-node=2")
    check_ranks(results, "srun")
    assert results[0]["master_addr"] == results[0]["host"]  # the step's first node
    assert results[0]["master_port"] == job_port(job)


@pytest.mark.cluster
def test_torchrun_two_nodes_two_procs(slurm_cluster, tmp_path):
    script = textwrap.dedent(f"""\
        #!/bin/bash
        head=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
        port=$((10000 + SLURM_JOB_ID % 50000))
        srun bash -c 'exec {sys.executable} -m torch.distributed.run --nnodes 2 \\
            --nproc-per-node 2 --node-rank $SLURM_NODEID --rdzv-backend c10d \\
            --rdzv-endpoint '"$head:$port"' --rdzv-id $SLURM_JOB_ID payload.py {tmp_path}'
        """)
    _, results = run_job(
        slurm_cluster, tmp_path, script, "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=2"
    )
    check_ranks(results, "torchrun")
