"""Checkpointing a ~1B-parameter model with AdamW state (~12.9 GB) from one GPU, in one run.

    python bench/gpu_checkpoint.py [--dir /local/nvme] [--layers 16 --width 8192]

For each method: the time the training loop is blocked by one checkpoint, and the time until
that checkpoint is whole on disk (written, fsynced, committed), against a raw sequential
write+fsync of the same bytes from host memory with early writeback, measured before every
steady slurmkit save (the median is the baseline; plain writes, first and last, for reference).
Methods: slurmkit async (first save: page-locks its host buffers, also timed with the buffers
from torch's pin_memory; then steady, with and without
``overlap``: without a training loop here, its blocked time means little), slurmkit sync (also
through torch.save's own copies, as when its page-locked copy does not fit),
torch.distributed.checkpoint.async_save (single-rank gloo group; default, and with a
FileSystemWriter caching its staged state dict) and plain torch.save (+ fsync).
Goals: slurmkit async blocks <= 0.3 s; its whole save takes <= 1.3x the raw write.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmkit.runtime import memory, pinned  # noqa: E402
from slurmkit.runtime.checkpoint import Checkpointer  # noqa: E402


def settle() -> None:
    """Quiet GPU and disk (deleted files' discards included) before a timed step."""
    torch.cuda.synchronize()
    os.sync()
    time.sleep(2)


def fsync_tree(path: str) -> None:
    for directory, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)


def drop_old(root: str) -> None:
    """Delete all but the newest checkpoint (untimed: the disk holds only a few)."""
    for name in sorted(os.listdir(root))[:-1]:
        shutil.rmtree(os.path.join(root, name))


def raw_write(nbytes: int, path: str, writeback: bool) -> float:
    """Write+fsync ``nbytes`` from a host buffer in 64 MiB pieces; ``writeback``: with the early
    writeback slurmkit uses (posix_fadvise DONTNEED every 64 MiB, over the last two windows)."""
    import ctypes

    host = torch.ones(nbytes, dtype=torch.uint8)
    view = memoryview((ctypes.c_char * nbytes).from_address(host.data_ptr())).cast("B")
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for off in range(0, nbytes, 64 << 20):
        piece = view[off : off + (64 << 20)]
        while piece:
            piece = piece[os.write(fd, piece) :]
        if writeback and off >= 64 << 20:
            os.posix_fadvise(fd, off - (64 << 20), 128 << 20, os.POSIX_FADV_DONTNEED)
    os.fsync(fd)
    os.close(fd)
    elapsed = time.perf_counter() - start
    os.unlink(path)
    return elapsed


def timed(save: Callable[..., Callable[[], object]], *args: object) -> tuple[float, float]:
    """(blocked, whole): ``save(*args)`` returns once the loop may go on, with a function that
    waits until the checkpoint is on disk."""
    settle()
    start = time.perf_counter()
    finish = save(*args)
    blocked = time.perf_counter() - start
    finish()
    return blocked, time.perf_counter() - start


def slurmkit_save(
    ckpt: Checkpointer, state: dict, step: int, overlap: object = None
) -> Callable[[], None]:
    ckpt.save(state, step, overlap=overlap)
    return ckpt.wait


def dcp_save(state: dict, target: str, writer: object) -> Callable[[], object]:
    import torch.distributed.checkpoint as dcp

    return dcp.async_save(state, checkpoint_id=target, storage_writer=writer).result


def plain_save(state: dict, path: str) -> Callable[[], None]:
    torch.save(state, path)
    return lambda: fsync_tree(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="where to write (default: a temp dir in the repo)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--skip", default="", help="comma-separated: sync,dcp,torch")
    ap.add_argument(
        "--rounds", type=int, default=3, help="steady slurmkit saves, each after a raw write"
    )
    args = ap.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    work = tempfile.mkdtemp(prefix=".bench-gpu-checkpoint-", dir=args.dir or str(ROOT))
    device = torch.device("cuda")
    model = torch.nn.Sequential(
        *[torch.nn.Linear(args.width, args.width, bias=False) for _ in range(args.layers)]
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    model(torch.randn(8, args.width, device=device)).square().mean().backward()
    opt.step()  # AdamW state: exp_avg, exp_avg_sq

    def state() -> dict:
        return {"model": model.state_dict(), "optimizer": opt.state_dict()}

    params = sum(p.numel() for p in model.parameters())
    nbytes = sum(t.numel() * t.element_size() for t in _tensors(state()))
    print(
        f"{torch.cuda.get_device_name()}: {params / 1e9:.2f}B parameters, "
        f"{nbytes / 1e9:.1f} GB of model+AdamW state; writing under {work}",
        flush=True,
    )
    raws: dict[str, float] = {}
    rows: list[tuple[str, float, float]] = []

    def raw(when: str, modes: tuple[bool, ...] = (False, True)) -> None:
        for writeback in modes:
            settle()
            label = f"{when}, {'early writeback' if writeback else 'plain'}"
            raws[label] = raw_write(nbytes, os.path.join(work, "raw.bin"), writeback)
            print(f"raw write+fsync ({label}): {raws[label]:.2f} s", flush=True)

    def row(name: str, times: tuple[float, float]) -> None:
        rows.append((name, *times))
        print(f"{name}: blocked {times[0]:.3f} s, whole {times[1]:.2f} s", flush=True)

    try:
        raw("first")
        # the same first save with every buffer from torch's pin_memory (cudaHostAlloc), as
        # slurmkit did before it registered its large buffers itself
        pinned.REGISTER_FROM, register_from = 1 << 62, pinned.REGISTER_FROM
        try:
            with Checkpointer(
                os.path.join(work, "slurmkit-async-hostalloc"), async_save=True
            ) as ckpt:
                row(
                    "slurmkit async (first; buffers from torch pin_memory)",
                    timed(slurmkit_save, ckpt, state(), 0),
                )
        finally:
            pinned.REGISTER_FROM = register_from
        shutil.rmtree(os.path.join(work, "slurmkit-async-hostalloc"))
        torch._C._host_emptyCache()  # give the cached pinned memory back
        with Checkpointer(
            os.path.join(work, "slurmkit-async"), keep=args.rounds + 3, async_save=True
        ) as ckpt:
            row(
                "slurmkit async (first: page-locks its host buffers)",
                timed(slurmkit_save, ckpt, state(), 0),
            )
            for rnd in range(1, args.rounds + 1):  # the checkpointer prunes none: keep > rounds
                raw(f"round {rnd}", (True,))
                drop_old(ckpt.root)
                row("slurmkit async (steady)", timed(slurmkit_save, ckpt, state(), 2 * rnd))
                drop_old(ckpt.root)
                row(
                    "slurmkit async, overlap=optimizer (steady)",
                    timed(slurmkit_save, ckpt, state(), 2 * rnd + 1, opt),
                )
        shutil.rmtree(os.path.join(work, "slurmkit-async"))
        if "sync" not in skip:
            with Checkpointer(os.path.join(work, "slurmkit-sync"), keep=1) as ckpt:
                row("slurmkit sync", timed(slurmkit_save, ckpt, state(), 1))
                # as when the page-locked copy does not fit: torch.save copies each storage
                available, memory.available = memory.available, lambda: 0
                try:
                    row(
                        "slurmkit sync through torch.save's copies",
                        timed(slurmkit_save, ckpt, state(), 2),
                    )
                finally:
                    memory.available = available
            shutil.rmtree(os.path.join(work, "slurmkit-sync"))
        if "dcp" not in skip:
            import torch.distributed as dist
            import torch.distributed.checkpoint as dcp

            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            dist.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1
            )
            target = os.path.join(work, "dcp")
            cached = dcp.FileSystemWriter(target, cache_staged_state_dict=True)
            for label, writer in {
                "default": None,
                "cached staging, first": cached,
                "cached staging, second": cached,
            }.items():
                row(f"torch DCP async_save ({label})", timed(dcp_save, state(), target, writer))
                shutil.rmtree(target)
            dist.destroy_process_group()
        if "torch" not in skip:
            path = os.path.join(work, "plain.pt")
            row("plain torch.save (+ fsync)", timed(plain_save, state(), path))
            os.unlink(path)
        raw("last")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wb = [v for k, v in raws.items() if "early writeback" in k]
    base = statistics.median(wb)
    print(
        "\nraw write+fsync of the same bytes from host memory: "
        + ", ".join(f"{k} {v:.2f} s" for k, v in raws.items())
        + f"; baseline: the median with early writeback, {base:.2f} s = "
        f"{nbytes / base / 1e9:.2f} GB/s (fastest {min(raws.values()):.2f} s)"
    )
    print(f"{'method':50} {'blocked':>9} {'whole':>8} {'whole/raw':>9}  (medians; every save)")
    for name in dict.fromkeys(name for name, _, _ in rows):
        blocked = statistics.median(b for n, b, _ in rows if n == name)
        whole = [w for n, _, w in rows if n == name]
        print(
            f"{name:50} {blocked:8.3f}s {statistics.median(whole):7.2f}s "
            f"{statistics.median(whole) / base:9.2f}  {' '.join(f'{w:.2f}' for w in whole)}"
        )
    print("goals: slurmkit async (steady) blocked <= 0.3 s, whole/raw <= 1.3")


def _tensors(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in _tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in _tensors(v)]
    return []


if __name__ == "__main__":
    main()
