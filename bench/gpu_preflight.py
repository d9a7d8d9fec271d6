"""all_reduce bus bandwidth as `slurmkit preflight` measures it, against a minimal
torch.distributed loop, both under plain torchrun on this host, in the same run.

    python bench/gpu_preflight.py                # every visible GPU, 1 MiB .. 1 GiB
    python bench/gpu_preflight.py --gpus 8 --repeat 5
    python bench/gpu_preflight.py --cpu          # smoke test anywhere: 2 gloo processes

preflight: ``torchrun --standalone --nproc-per-node=G -m slurmkit.runtime.preflight
--only=allreduce --json`` (``distributed.init()``, as jobs do, then the preflight's loop).
Baseline: ``torchrun --standalone --nproc-per-node=G bench/gpu_preflight.py --worker``, a
minimal loop set up the usual way (``set_device(LOCAL_RANK)``, ``init_process_group``). Both,
per size: ``--warmup`` calls, a barrier, ``--iters`` timed calls, a device synchronize, the
slowest rank's mean time per call; algbw = bytes / time, busbw = algbw * 2(n-1)/n (nccl-tests).
The two launches alternate, ``--repeat`` times each; per size the median of each and their
ratio (preflight / baseline; goal: 1.00 +- noise). With one GPU the world size is 1 and busbw
is undefined (2(n-1)/n = 0): algbw is compared instead, and said so.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GPU_SIZES = "1M,16M,64M,256M,1G"
CPU_SIZES = "64K,1M,4M"
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK")


# --- the baseline worker: one per rank, under torchrun -----------------------------------------


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    local = int(os.environ["LOCAL_RANK"])
    device = torch.device("cpu" if args.cpu else f"cuda:{local}")
    if not args.cpu:
        torch.cuda.set_device(device)
    dist.init_process_group("gloo" if args.cpu else "nccl")
    world = dist.get_world_size()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    rows = []
    for size in sizes(args.sizes):
        x = torch.ones(size // 4, dtype=torch.float32, device=device)
        for _ in range(args.warmup):
            dist.all_reduce(x)
        sync()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_reduce(x)
        sync()
        slowest = torch.tensor(
            [(time.perf_counter() - t0) / args.iters], dtype=torch.float64, device=device
        )
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        algbw = size / slowest.item() / 1e9
        busbw = algbw * 2 * (world - 1) / world if world > 1 else None
        rows.append({"bytes": size, "algbw_gbps": algbw, "busbw_gbps": busbw})
        del x
    if dist.get_rank() == 0:
        print(json.dumps({"backend": dist.get_backend(), "world_size": world, "sizes": rows}))
    dist.destroy_process_group()


def sizes(text: str) -> list[int]:
    sys.path.insert(0, str(ROOT))
    from slurmkit.runtime.preflight import parse_size  # the preflight's own reading

    return [parse_size(s) for s in text.split(",")]


# --- the launcher -----------------------------------------------------------------------------


def clean_env(args: argparse.Namespace) -> dict[str, str]:
    """This environment without Slurm's, slurmkit's or a launcher's variables; GPUs hidden for
    ``--cpu``, else the first ``--gpus`` visible ones."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM", "TORCHELASTIC_")) and k not in LAUNCHER_VARS
    }
    if args.cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    else:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(args.gpus))))
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible.split(",")[: args.gpus])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def torchrun(args: argparse.Namespace, procs: int, target: list[str]) -> dict:
    """rank 0's JSON line from ``torchrun --standalone --nproc-per-node=PROCS TARGET``."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={procs}",
        *target,
    ]
    proc = subprocess.run(
        cmd, env=clean_env(args), capture_output=True, text=True, timeout=args.timeout, cwd=ROOT
    )
    if proc.returncode:
        sys.exit(f"{' '.join(target[:3])}: exit code {proc.returncode}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def preflight(args: argparse.Namespace, procs: int, out: str) -> dict:
    found = torchrun(
        args,
        procs,
        [
            "-m",
            "slurmkit.runtime.preflight",
            f"--out={out}",
            "--only=allreduce",
            f"--sizes={args.sizes}",
            f"--iters={args.iters}",
            f"--warmup={args.warmup}",
            "--json",
        ],
    )
    first = found["ranks"][0]
    if "allreduce" not in first:
        sys.exit(f"the preflight measured nothing: {first.get('errors') or first.get('skipped')}")
    return first["allreduce"]


def baseline(args: argparse.Namespace, procs: int) -> dict:
    return torchrun(
        args,
        procs,
        [
            __file__,
            "--worker",
            f"--sizes={args.sizes}",
            f"--iters={args.iters}",
            f"--warmup={args.warmup}",
            *(["--cpu"] if args.cpu else []),
        ],
    )


def human(size: int) -> str:
    for shift, unit in ((30, "GiB"), (20, "MiB"), (10, "KiB")):
        if size >= 1 << shift:
            return f"{size >> shift} {unit}"
    return f"{size} B"


def report(ours: list[dict], base: list[dict], procs: int, args: argparse.Namespace) -> None:
    world = ours[0]["world_size"]
    key = "busbw_gbps" if world > 1 else "algbw_gbps"
    what = "busbw" if world > 1 else "algbw (busbw is undefined for world size 1)"
    kind = "CPU processes" if args.cpu else "GPUs"
    print(
        f"\nall_reduce (sum, float32), 1 node x {procs} {kind}, world size {world}, "
        f"{ours[0]['backend']} / {base[0]['backend']}; {args.iters} timed calls per size after "
        f"{args.warmup} warm-up; median of {args.repeat} alternating launches each; {what}"
    )
    print(f"{'size':>8}  {'preflight':>14}  {'plain loop':>14}  ratio")
    xs = [
        statistics.median(run["sizes"][i][key] for run in ours)
        for i in range(len(ours[0]["sizes"]))
    ]
    ys = [statistics.median(run["sizes"][i][key] for run in base) for i in range(len(xs))]
    for size, x, y in zip(sizes(args.sizes), xs, ys):
        print(f"{human(size):>8}  {x:>9.2f} GB/s  {y:>9.2f} GB/s  {x / y:5.2f}")
    print(f"{'peak':>8}  {max(xs):>9.2f} GB/s  {max(ys):>9.2f} GB/s  {max(xs) / max(ys):5.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="gloo processes, tiny sizes")
    parser.add_argument(
        "--gpus", type=int, help="GPUs (processes with --cpu) to use (default: every one; 2)"
    )
    parser.add_argument("--sizes", help=f"message sizes (default {GPU_SIZES}; --cpu {CPU_SIZES})")
    parser.add_argument("--iters", type=int, help="timed all_reduce calls per size (20; --cpu 5)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3, help="launches of each, alternating")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per launch")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.sizes = args.sizes or (CPU_SIZES if args.cpu else GPU_SIZES)
    args.iters = args.iters or (5 if args.cpu else 20)
    if args.worker:
        worker(args)
        return
    if args.cpu:
        procs = args.gpus = args.gpus or 2
    else:
        import torch

        found = torch.cuda.device_count()
        if not found:
            sys.exit("no GPU visible (use --cpu for a smoke test)")
        procs = args.gpus = min(args.gpus or found, found)
    ours, base = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for n in range(args.repeat):  # alternate: a passing load falls on both
            ours.append(preflight(args, procs, os.path.join(tmp, f"preflight-{n}")))
            base.append(baseline(args, procs))
    report(ours, base, procs, args)


if __name__ == "__main__":
    main()
