"""``python -m slurmkit.runtime.preflight``: what each task of ``slurmkit preflight`` measures,
written to ``OUT/rank-NNNNN.json`` (stdlib at import; torch loads inside the functions).

Every rank records the GPUs it sees against the allocation and joins an all_reduce over all
ranks, set up by :func:`slurmkit.runtime.distributed.init` as jobs are (nccl on GPUs, gloo on
CPU). The first task of each node (local rank 0) measures the filesystem under ``OUT``: write
throughput (fsync included), read throughput (the file's cached pages dropped first with
``posix_fadvise(DONTNEED)``), the file-create rate, and a checkpoint save + restore through
:class:`~slurmkit.runtime.checkpoint.Checkpointer` with the state's checksum compared. With
``--signal-wait S``, each rank then writes ``OUT/ready-NNNNN`` and waits up to S seconds for the
requeue signal (the login side sends it to the batch shell, which forwards it to the step).

A measurement that fails is recorded under ``errors`` and the task still exits 0 (under
``srun --kill-on-bad-exit`` an early exit would kill the other ranks before they write).
It runs the same without Slurm::

    torchrun --nproc-per-node=8 -m slurmkit.runtime.preflight --out /tmp/pf --json
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..core.contract import requeue_signal
from ..core.fsutil import atomic_write_bytes, atomic_write_json, read_json
from . import preemption
from .distributed import RankInfo, rank_info

CHECKS = ("gpus", "fs", "checkpoint", "allreduce", "signal")
BLOCK = 8 << 20  # bytes per read or write call of the throughput test
GPU_SIZES = "1M,16M,64M,256M,1G"
CPU_SIZES = "64K,1M,4M"
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """``64K``, ``16M``, ``1G`` (binary units; ``MiB``, ``MB`` too) or a byte count, as bytes."""
    clean = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = clean[-1:] if clean[-1:] in _UNITS else ""
    digits = clean[: len(clean) - len(unit)]
    if not digits.isdigit() or int(digits) == 0:
        raise ValueError(f"{text!r} is not a size above 0 (bytes, or a number with K, M or G)")
    return int(digits) * _UNITS[unit]


def busbw(algbw: float, world: int) -> float | None:
    """nccl-tests' bus bandwidth of an all_reduce, ``algbw * 2(n-1)/n``; undefined for n = 1."""
    return algbw * 2 * (world - 1) / world if world > 1 else None


def rank_file(out: str, rank: int) -> str:
    return os.path.join(out, f"rank-{rank:05d}.json")


def ready_file(out: str, rank: int) -> str:
    return os.path.join(out, f"ready-{rank:05d}")


# -- GPUs --


def allocated_gpus(env: Mapping[str, str]) -> tuple[int | None, str | None]:
    """GPUs the job was given on this node and where that was read (``None``: no allocation
    known): ``SLURM_GPUS_ON_NODE``, else the entries of ``CUDA_VISIBLE_DEVICES``."""
    if env.get("SLURM_GPUS_ON_NODE", "").isdigit():
        return int(env["SLURM_GPUS_ON_NODE"]), "SLURM_GPUS_ON_NODE"
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip()]), "CUDA_VISIBLE_DEVICES"
    return None, None


def nvidia_smi() -> list[str] | None:
    """``nvidia-smi -L``'s GPU lines; ``None`` when there is no nvidia-smi (or it fails)."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        proc = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return [line.strip() for line in proc.stdout.splitlines() if line.startswith("GPU ")]


def torch_gpus() -> int | None:
    """CUDA devices torch sees; ``None`` when torch is not importable."""
    try:
        import torch
    except ImportError:
        return None
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_view(env: Mapping[str, str]) -> dict[str, Any]:
    """What this task was allocated and what it sees."""
    count, source = allocated_gpus(env)
    return {
        "allocated": count,
        "allocated_from": source,
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "torch": torch_gpus(),
        "nvidia_smi": nvidia_smi(),
    }


# -- the filesystem --


def _drop_cache(path: str) -> bool:
    """Drop the page cache of ``path`` (a file, or every file below a directory); False where
    the platform cannot."""
    if not hasattr(os, "posix_fadvise"):
        return False
    files = [path]
    if os.path.isdir(path):
        files = [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]
    for name in files:
        fd = os.open(name, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def measure_fs(directory: str, size: int, files: int) -> dict[str, Any]:
    """Write ``size`` random bytes (then fsync), read them back after dropping their cached
    pages, and create ``files`` empty files; every file is removed afterwards."""
    os.makedirs(directory, exist_ok=True)
    data = os.urandom(size)  # incompressible, and unlike any other node's: no dedup shortcut
    path = os.path.join(directory, "throughput.bin")
    view = memoryview(data)
    try:
        with open(path, "wb", buffering=0) as fh:
            start = time.perf_counter()
            for offset in range(0, size, BLOCK):
                chunk = view[offset : offset + BLOCK]
                while chunk:
                    chunk = chunk[fh.write(chunk) or 0 :]
            os.fsync(fh.fileno())
            write_s = time.perf_counter() - start
        dropped = _drop_cache(path)
        back = bytearray(size)
        into = memoryview(back)
        with open(path, "rb", buffering=0) as fh:
            start = time.perf_counter()
            done = 0
            while done < size:
                n = fh.readinto(into[done : done + BLOCK])
                if not n:
                    break
                done += n
            read_s = time.perf_counter() - start
        intact = done == size and back == data
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    many = os.path.join(directory, "creates")
    os.makedirs(many, exist_ok=True)
    try:
        start = time.perf_counter()
        for i in range(files):
            os.close(os.open(os.path.join(many, f"f{i:07d}"), os.O_CREAT | os.O_EXCL, 0o600))
        create_s = time.perf_counter() - start
    finally:
        shutil.rmtree(many, ignore_errors=True)
    return {
        "path": directory,
        "bytes": size,
        "write_s": write_s,
        "read_s": read_s,
        "write_gbps": size / write_s / 1e9,
        "read_gbps": size / read_s / 1e9,
        "intact": intact,
        "cache_dropped": dropped,
        "files": files,
        "create_s": create_s,
        "creates_per_s": files / create_s if create_s > 0 else None,
    }


# -- a checkpoint round trip --


def _state(size: int) -> tuple[Any, str, str]:
    """A state of about ``size`` bytes, its kind and its SHA-256: a torch tensor when torch is
    importable, else plain bytes."""
    try:
        import torch
    except ImportError:
        blob = os.urandom(size)
        return {"step": 1, "blob": blob}, "bytes", hashlib.sha256(blob).hexdigest()
    weights = torch.randn(max(1, size // 4))
    return {"step": 1, "weights": weights}, "torch", _digest(weights)


def _digest(tensor: Any) -> str:
    """SHA-256 of a tensor's bytes (copied to host memory, contiguous)."""
    t = tensor.detach().cpu().contiguous()
    return hashlib.sha256(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size())).hexdigest()


def measure_checkpoint(directory: str, size: int) -> dict[str, Any]:
    """Save a state through :class:`Checkpointer`, drop its cached pages, restore it with a new
    Checkpointer (as a requeued job would), and compare checksums; the checkpoint is removed."""
    from .checkpoint import Checkpointer

    root = os.path.join(directory, "checkpoint")
    state, kind, digest = _state(size)
    try:
        with Checkpointer(root, keep=1, rank=0) as ckpt:
            start = time.perf_counter()
            ckpt.save(state, 1)
            save_s = time.perf_counter() - start
        del state
        dropped = _drop_cache(root)
        with Checkpointer(root, keep=1, rank=0) as ckpt:
            start = time.perf_counter()
            found = ckpt.load_latest()
            restore_s = time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if found is None:
        raise RuntimeError(f"the checkpoint just saved under {root} was not found")
    step, back = found
    seen = _digest(back["weights"]) if kind == "torch" else hashlib.sha256(back["blob"]).hexdigest()
    return {
        "kind": kind,
        "bytes": size,
        "step": step,
        "save_s": save_s,
        "restore_s": restore_s,
        "cache_dropped": dropped,
        "checksum": digest,
        "match": seen == digest and step == 1,
    }


# -- all_reduce --


def measure_allreduce(
    info: RankInfo, sizes: Sequence[int], iters: int, warmup: int
) -> dict[str, Any]:
    """all_reduce (sum, float32) of each size over every rank: the slowest rank's mean time
    per call, algbw = bytes / time and busbw (nccl-tests' definitions); first a sum checked."""
    import torch
    import torch.distributed as dist

    device = torch.device(info.device)
    world = dist.get_world_size()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    check = torch.full((1024,), float(dist.get_rank() + 1), device=device)
    dist.all_reduce(check)
    sum_ok = bool((check == world * (world + 1) / 2).all().item())
    rows: list[dict[str, Any]] = []
    for size in sizes:
        tensor = torch.ones(max(1, size // 4), dtype=torch.float32, device=device)
        for _ in range(warmup):
            dist.all_reduce(tensor)
        sync()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(tensor)
        sync()
        mean = (time.perf_counter() - start) / iters
        slowest = torch.tensor([mean], dtype=torch.float64, device=device)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        seconds = float(slowest.item())
        nbytes = tensor.numel() * 4
        alg = nbytes / seconds / 1e9
        rows.append(
            {"bytes": nbytes, "time_s": seconds, "algbw_gbps": alg, "busbw_gbps": busbw(alg, world)}
        )
        del tensor
    peaks = [r["busbw_gbps"] for r in rows if r["busbw_gbps"] is not None]
    return {
        "backend": str(dist.get_backend()),
        "world_size": world,
        "device": info.device,
        "iters": iters,
        "warmup": warmup,
        "sum_ok": sum_ok,
        "sizes": rows,
        "peak_busbw_gbps": max(peaks) if peaks else None,
        "peak_algbw_gbps": max(r["algbw_gbps"] for r in rows) if rows else None,
    }


# -- the requeue signal --


def wait_for_signal(out: str, rank: int, seconds: float, name: str) -> dict[str, Any]:
    """Say this rank is ready (``OUT/ready-NNNNN``), then wait up to ``seconds`` for the
    requeue signal (the handler of :func:`preemption.install` sets the flag)."""
    atomic_write_bytes(ready_file(out, rank), b"", fsync=False)
    start = time.monotonic()
    while not preemption.should_stop() and time.monotonic() - start < seconds:
        time.sleep(0.05)
    got = [n.removeprefix("SIG") for n in preemption.received()]  # as Slurm names it: USR2
    return {
        "signal": name,
        "received": got,
        "at": time.time() if got else None,
        "waited_s": time.monotonic() - start,
    }


# -- the task --


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m slurmkit.runtime.preflight",
        description="Measure this node for slurmkit preflight (one process per task).",
    )
    p.add_argument("--out", help="results directory (default $SLURMKIT_SWEEP_DIR/ranks)")
    p.add_argument("--only", default=",".join(CHECKS), help=f"checks to run, of {','.join(CHECKS)}")
    p.add_argument("--fs-mib", type=int, default=1024, help="MiB written and read per node")
    p.add_argument("--files", type=int, default=1000, help="files created per node")
    p.add_argument("--checkpoint-mib", type=int, default=256, help="MiB of checkpointed state")
    p.add_argument("--sizes", help=f"all_reduce sizes (default {GPU_SIZES} on GPUs, {CPU_SIZES})")
    p.add_argument("--iters", type=int, default=20, help="timed all_reduce calls per size")
    p.add_argument("--warmup", type=int, default=5, help="untimed all_reduce calls first")
    p.add_argument("--signal-wait", type=float, default=0, help="seconds to wait for the signal")
    p.add_argument("--json", action="store_true", help="rank 0 prints every rank's results")
    return p


def _guarded(record: dict[str, Any], key: str, fn: Callable[[], Any]) -> None:
    """``record[key] = fn()``; a failure is recorded under ``errors`` instead."""
    try:
        record[key] = fn()
    except Exception as exc:  # every failure is a finding to report, not a crash
        record["errors"][key] = f"{type(exc).__name__}: {exc}"


def _options(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = _parser()
    args = parser.parse_args(argv)
    sweep = os.environ.get("SLURMKIT_SWEEP_DIR")
    if not args.out and not sweep:
        parser.error("--out is required outside a slurmkit job")
    args.out = os.path.abspath(args.out or os.path.join(sweep or "", "ranks"))
    args.only = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = [c for c in args.only if c not in CHECKS]
    if unknown:
        parser.error(f"unknown check {unknown[0]!r} (of {', '.join(CHECKS)})")
    for name in ("fs_mib", "files", "checkpoint_mib", "iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    try:
        args.sizes = [parse_size(s) for s in args.sizes.split(",")] if args.sizes else None
    except ValueError as exc:
        parser.error(f"--sizes: {exc}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    # first: the requeue signal must not kill a task that is measuring (TERM still does)
    preemption.install((requeue_signal(os.environ),))
    args = _options(argv)
    info = rank_info(os.environ)
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    record: dict[str, Any] = {
        "rank": info.rank,
        "local_rank": info.local_rank,
        "node_rank": info.node_rank,
        "world_size": info.world_size,
        "host": host,
        "job_id": os.environ.get("SLURM_JOB_ID"),
        "errors": {},
    }
    os.makedirs(args.out, exist_ok=True)
    if "gpus" in args.only:
        _guarded(record, "gpus", lambda: gpu_view(os.environ))
    dist, info = _distributed(record, info, "allreduce" in args.only or info.world_size > 1)
    leader = info.local_rank == 0
    scratch = os.path.join(args.out, f"scratch-{info.rank:05d}")
    for key, fn in (
        ("fs", lambda: measure_fs(scratch, args.fs_mib << 20, args.files)),
        ("checkpoint", lambda: measure_checkpoint(scratch, args.checkpoint_mib << 20)),
    ):
        if dist is not None:
            dist.barrier()  # the nodes measure at once: the filesystem under a real load
        if key in args.only and leader:
            _guarded(record, key, fn)
    shutil.rmtree(scratch, ignore_errors=True)
    if "allreduce" in args.only:
        if dist is None:
            if "allreduce" not in record["errors"]:
                record["skipped"] = {"allreduce": "torch is not importable here"}
        else:
            sizes = args.sizes or [
                parse_size(s) for s in (GPU_SIZES if info.device != "cpu" else CPU_SIZES).split(",")
            ]
            _guarded(
                record, "allreduce", lambda: measure_allreduce(info, sizes, args.iters, args.warmup)
            )
    if "signal" in args.only and args.signal_wait > 0:
        name = requeue_signal(os.environ)
        record["signal"] = wait_for_signal(args.out, info.rank, args.signal_wait, name)
    atomic_write_json(rank_file(args.out, info.rank), record)
    if dist is not None:
        dist.barrier()
    if info.rank == 0:
        _print(args.out, info.world_size, args.json)
    if dist is not None:
        dist.destroy_process_group()
    return 0


def _distributed(record: dict[str, Any], info: RankInfo, wanted: bool) -> tuple[Any, RankInfo]:
    """``torch.distributed`` set up by :func:`distributed.init`, as jobs do, and this rank's
    info from it; ``None`` (and ``info``) when not wanted, when torch is missing, or when the
    rendezvous failed (recorded: the other measurements go on)."""
    if not wanted:
        return None, info
    try:
        import torch.distributed as dist
    except ImportError:
        return None, info
    from . import distributed

    try:
        return dist, distributed.init()
    except Exception as exc:  # a rendezvous that fails is a finding about the network
        record["errors"]["allreduce"] = f"distributed.init() failed: {type(exc).__name__}: {exc}"
        return None, info


def _print(out: str, world: int, as_json: bool) -> None:
    """Rank 0's report of every rank's file: JSON, or one line per rank."""
    ranks = [read_json(rank_file(out, r)) for r in range(world)]
    if as_json:
        print(json.dumps({"ranks": ranks}))
        return
    for r in ranks:
        if r is None:
            continue
        parts = [f"rank {r['rank']} on {r['host']}"]
        if "fs" in r:
            fs = r["fs"]
            parts.append(
                f"fs write {fs['write_gbps']:.3g} GB/s read {fs['read_gbps']:.3g} GB/s "
                f"{fs['creates_per_s'] or 0:.0f} creates/s"
            )
        if "checkpoint" in r:
            parts.append(f"checkpoint {'ok' if r['checkpoint']['match'] else 'MISMATCH'}")
        if "allreduce" in r:
            a = r["allreduce"]
            peak = a["peak_busbw_gbps"]
            parts.append(
                f"all_reduce {a['backend']} x{a['world_size']}: "
                + (f"busbw {peak:.3g} GB/s" if peak is not None else "busbw undefined (1 rank)")
            )
        parts += [f"{k} failed: {v}" for k, v in r["errors"].items()]
        print("; ".join(parts))


if __name__ == "__main__":
    sys.exit(main())
