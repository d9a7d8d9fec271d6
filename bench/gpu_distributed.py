"""all_reduce bus bandwidth and a DDP step on 1 node x 2 GPUs, launched two ways in one run.

    python bench/gpu_distributed.py            # 2 GPUs, nccl, 1 MiB .. 1 GiB
    python bench/gpu_distributed.py --cpu      # smoke test anywhere: gloo, tiny sizes

slurmkit: two processes started here with the environment srun gives the tasks of
``sbatch --nodes=1 --ntasks-per-node=2 --gpus-per-node=2`` (SLURM_PROCID, SLURM_LOCALID,
SLURM_NTASKS, SLURM_STEP_*, SLURM_JOB_NODELIST, SLURM_JOB_ID, ...; no RANK or MASTER_*), each
calling ``slurmkit.runtime.distributed.init()``. Baseline: the same work under plain
``torchrun --standalone --nproc-per-node 2``, set up the usual way (``set_device(LOCAL_RANK)``,
``init_process_group``). Per size: bus bandwidth as nccl-tests computes it
(busbw = algbw * 2(n-1)/n, the slowest rank's time), both ways, and their ratio; then one DDP
training step (mean of 10, 3 with --cpu, after 3 warm-up). Goal: ratios of 1.00 +- noise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmkit.core.rendezvous import local_port_range, port_span  # noqa: E402

GPU_SIZES = [1 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30]
CPU_SIZES = [4 << 10, 64 << 10, 1 << 20]
LAUNCHER_VARS = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)


# --- the worker: runs in each of the two processes -------------------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    if args.worker == "slurmkit":
        from slurmkit.runtime import distributed

        info = distributed.init()
        rank, world, device = info.rank, info.world_size, torch.device(info.device)
        seen = {
            "rank": rank,
            "local_rank": info.local_rank,
            "world_size": world,
            "device": info.device,
            "master": f"{info.master_addr}:{info.master_port}",
        }
    else:
        local = int(os.environ["LOCAL_RANK"])
        device = torch.device("cpu" if args.cpu else f"cuda:{local}")
        if not args.cpu:
            torch.cuda.set_device(device)
        dist.init_process_group("gloo" if args.cpu else "nccl")
        rank, world, seen = dist.get_rank(), dist.get_world_size(), {}

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def slowest(seconds: float) -> float:
        t = torch.tensor([seconds], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    busbw = {}
    for size in args.sizes:
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(x)
        sync()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(x)
        sync()
        algbw = size / slowest((time.perf_counter() - t0) / args.iters) / 1e9
        busbw[size] = algbw * 2 * (world - 1) / world
        del x

    width = 64 if args.cpu else 4096
    torch.manual_seed(0)
    layers = [torch.nn.Linear(width, width) for _ in range(4)]
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(*layers).to(device),
        device_ids=[device.index] if device.type == "cuda" else None,
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    batch = torch.randn(64, width, device=device)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        model(batch).square().mean().backward()
        opt.step()

    for _ in range(3):
        step()
    sync()
    t0 = time.perf_counter()
    steps = 3 if args.cpu else 10
    for _ in range(steps):
        step()
    sync()
    step_s = slowest((time.perf_counter() - t0) / steps)
    params = sum(p.numel() for p in model.parameters())

    Path(f"{args.out}.{rank}").write_text(
        json.dumps(
            {
                "seen": seen,
                "busbw": busbw,
                "step_s": step_s,
                "params": params,
                "backend": dist.get_backend(),
            }
        )
    )
    dist.destroy_process_group()
    # torch 2.13 (CPU, gloo) sometimes aborts at interpreter exit after DDP ("terminate called
    # without an active exception"), whichever the launcher: the results are written, leave now.
    sys.stdout.flush()
    os._exit(0)


# --- the launcher -----------------------------------------------------------------------------


def clean_env(cpu: bool) -> dict[str, str]:
    """This environment without Slurm's or a launcher's variables; GPUs hidden for ``cpu``,
    else the first two visible ones."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TORCHELASTIC_")) and k not in LAUNCHER_VARS
    }
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0,1").split(",")
    env["CUDA_VISIBLE_DEVICES"] = "" if cpu else ",".join(visible[:2])
    return env


def free_job_id() -> int:
    """A job id whose rendezvous port (:func:`slurmkit.core.rendezvous.job_port`) is free here."""
    first, count = port_span(local_port_range())
    for job_id in random.sample(range(count), 200):
        with socket.socket() as s:
            try:
                s.bind(("", first + job_id))
            except OSError:
                continue
        return job_id
    raise SystemExit("no free rendezvous port")


def node_name() -> str:
    """This host's short name when it resolves (srun's node list names it), else localhost."""
    name = socket.gethostname().split(".")[0]
    try:
        socket.gethostbyname(name)
        return name
    except OSError:
        return "localhost"


def worker_args(args: argparse.Namespace, mode: str, out: str) -> list[str]:
    return [
        __file__,
        "--worker",
        mode,
        "--out",
        out,
        "--iters",
        str(args.iters),
        "--warmup",
        str(args.warmup),
        "--sizes",
        *map(str, args.sizes),
    ] + (["--cpu"] if args.cpu else [])


def collect(out: str, procs: int) -> list[dict]:
    return [json.loads(Path(f"{out}.{r}").read_text()) for r in range(procs)]


def launch_slurmkit(args: argparse.Namespace, out: str) -> list[dict]:
    job_id = free_job_id()
    node = node_name()
    step = {
        "SLURM_JOB_ID": str(job_id),
        "SLURM_JOBID": str(job_id),
        "SLURM_JOB_NAME": "bench",
        "SLURM_JOB_NODELIST": node,
        "SLURM_NODELIST": node,
        "SLURM_STEP_NODELIST": node,
        "SLURM_JOB_NUM_NODES": "1",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "2",
        "SLURM_NPROCS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_TASKS_PER_NODE": "2",
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_STEP_NUM_NODES": "1",
        "SLURM_STEP_NUM_TASKS": "2",
        "SLURM_STEP_TASKS_PER_NODE": "2",
        "SLURM_NODEID": "0",
        "SLURM_GTIDS": "0,1",
        "SLURM_SUBMIT_DIR": os.getcwd(),
        "SLURM_TOPOLOGY_ADDR": node,
    }
    if not args.cpu:
        step.update(SLURM_GPUS_ON_NODE="2", SLURM_GPUS_PER_NODE="2")
    procs = [
        subprocess.Popen(
            [sys.executable, *worker_args(args, "slurmkit", out)],
            env={**clean_env(args.cpu), **step, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r)},
        )
        for r in range(2)
    ]
    codes = [p.wait(timeout=args.timeout) for p in procs]
    if any(codes):
        sys.exit(f"slurmkit launch failed: exit codes {codes}")
    return collect(out, 2)


def launch_torchrun(args: argparse.Namespace, out: str) -> list[dict]:
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *worker_args(args, "torchrun", out),
    ]
    code = subprocess.run(cmd, env=clean_env(args.cpu), timeout=args.timeout).returncode
    if code:
        sys.exit(f"torchrun launch failed: exit code {code}")
    return collect(out, 2)


def human(size: int) -> str:
    return (
        f"{size >> 30} GiB"
        if size >= 1 << 30
        else f"{size >> 20} MiB"
        if size >= 1 << 20
        else f"{size >> 10} KiB"
    )


def report(ours: list[dict], base: list[dict], args: argparse.Namespace) -> None:
    a, b = ours[0], base[0]
    print(
        f"\nall_reduce, 1 node x 2 {'CPU processes' if args.cpu else 'GPUs'} ({a['backend']}), "
        f"{args.iters} iterations per size after {args.warmup} warm-up"
    )
    for r, run in enumerate(ours):
        print(f"  slurmkit rank {r}: init() read {run['seen']}")
    print(f"{'':>10}  {'slurmkit init()':>16}  {'plain torchrun':>16}  ratio")
    for size in args.sizes:
        x, y = a["busbw"][str(size)], b["busbw"][str(size)]
        print(f"{human(size):>10}  {x:>11.2f} GB/s  {y:>11.2f} GB/s  {x / y:5.2f}  busbw")
    x, y = a["step_s"], b["step_s"]
    print(
        f"{'DDP step':>10}  {x * 1e3:>13.2f} ms  {y * 1e3:>13.2f} ms  {x / y:5.2f}  time "
        f"({a['params']:,} parameters)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="gloo on CPU with tiny sizes")
    parser.add_argument("--sizes", type=int, nargs="+", help="message sizes in bytes")
    parser.add_argument("--iters", type=int, help="timed all_reduce calls per size")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    parser.add_argument("--worker", choices=("slurmkit", "torchrun"), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = args.sizes or (CPU_SIZES if args.cpu else GPU_SIZES)
    args.iters = args.iters or (5 if args.cpu else 20)
    if args.worker:
        worker(args)
        return
    if not args.cpu:
        import torch

        if torch.cuda.device_count() < 2:
            sys.exit("needs 2 GPUs (or --cpu)")
    with tempfile.TemporaryDirectory() as tmp:
        ours = launch_slurmkit(args, os.path.join(tmp, "slurmkit"))
        base = launch_torchrun(args, os.path.join(tmp, "torchrun"))
    report(ours, base, args)


if __name__ == "__main__":
    main()
