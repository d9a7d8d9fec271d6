"""Resuming from a checkpoint against a raw sequential read of its bytes, in one run.

    python bench/checkpoint.py --resume                   # this machine: a 3 GiB CPU state
    python bench/resume.py --device cpu --gib 3 --dir /scratch
    python3 bench/gpu_resume.py --dir /local/nvme         # a GPU host (see gpu_resume.py)

Every method reads files written first (``Setup``) and dropped from the page cache
(``posix_fadvise(DONTNEED)``, after ``os.sync()``) right before it runs; each run goes through
the methods in turn, the second run in reverse order:

- raw read: ``cat FILE > /dev/null`` of the Checkpointer's file, and the same sequential read
  in Python (1 MiB buffer, reused); the faster of the two is the run's baseline;
- raw read into fresh memory (for reference): the file into new memory of its size, with the
  page faults that every loader making the state in memory pays (costly in some VMs);
- ``torch.load(map_location=DEVICE)``;
- DCP ``load`` into tensors already on DEVICE, their memory made before the timing (a job's
  model and optimizer, DCP's way; a single-process group);
- ``Checkpointer.load_latest(map_location=DEVICE)``: one pass, checked as it reads;
- the same, done as before this change: the checksum pass, then ``torch.load``;
- ``Checkpointer.load_sharded`` into such tensors (the same DCP files, slurmkit's one-pass
  reader);
- with ``--mirror``: ``Checkpointer(EMPTY, mirror=DIR).load_latest(map_location=DEVICE)``, a
  resume from the mirror after the fast path was wiped (the mirror a directory on the same
  disk, written by the Checkpointer's uploader);
- with ``--mirror-url s3://BUCKET/PATH`` instead: the same from an object store (endpoint and
  credentials from the AWS environment), against a raw download of the same object by the AWS
  CLI (``aws s3 cp URL FILE``, into the page cache; ``--aws`` names the command). An object
  store's page cache is dropped with ``/proc/sys/vm/drop_caches`` (root; the server's files are
  its own).

Times run until the state is on DEVICE (``torch.cuda.synchronize``), its memory given back
between methods. Target: ``Checkpointer.load_latest`` <= 1.1x the raw read.

``--first-save``: the time the first asynchronous save of a process blocks, without and with
``Checkpointer.prepare(state)`` made while the loop trains, against a steady save.
"""

from __future__ import annotations

import argparse
import gc
import mmap
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmkit.runtime.checkpoint import Checkpointer  # noqa: E402

MiB = 1 << 20


def synthetic_state(nbytes: int, device: torch.device) -> dict[str, Any]:
    """A model + AdamW state dict of about ``nbytes``: weights of 64 MiB (a third of the bytes),
    each with its ``exp_avg`` and ``exp_avg_sq``, filled cheaply (the values do not matter)."""
    weights = max(1, nbytes // 3 // (64 * MiB))
    n = nbytes // 3 // weights // 4
    model = {
        f"layers.{i}.weight": torch.full((n,), float(i), device=device) for i in range(weights)
    }
    state = {
        i: {
            "step": torch.tensor(1.0),
            "exp_avg": torch.full((n,), 0.5, device=device),
            "exp_avg_sq": torch.full((n,), 0.25, device=device),
        }
        for i in range(weights)
    }
    groups = [{"lr": 1e-4, "betas": (0.9, 0.999), "params": list(range(weights))}]
    return {"model": model, "optimizer": {"state": state, "param_groups": groups}}


def model_state(layers: int, width: int, device: torch.device) -> tuple[Any, Any, Callable]:
    """(model, optimizer, state()) of ``layers`` x Linear(width, width) after one AdamW step."""
    model = torch.nn.Sequential(
        *[torch.nn.Linear(width, width, bias=False) for _ in range(layers)]
    ).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=device.type == "cuda")
    model(torch.randn(8, width, device=device)).square().mean().backward()
    opt.step()
    return model, opt, lambda: {"model": model.state_dict(), "optimizer": opt.state_dict()}


def tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors(v)]
    return []


def like(obj: Any) -> Any:
    """Empty tensors shaped as ``obj``'s, on the same devices (DCP loads into them)."""
    if isinstance(obj, torch.Tensor):
        return torch.empty_like(obj)
    if isinstance(obj, dict):
        return {k: like(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [like(v) for v in obj]
    return obj


def files(path: str) -> list[str]:
    if "://" in path:
        return [path]  # an object store: drop() drops every clean page
    if os.path.isfile(path):
        return [path]
    return [os.path.join(d, f) for d, _, names in os.walk(path) for f in names]


def drop(paths: list[str]) -> None:
    """Drop the files' pages from the page cache (clean pages: ``os.sync()`` ran after writing);
    for a URL, every clean page of the machine (the server's files are its own)."""
    if any("://" in path for path in paths):
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as fh:  # root only: a clear error otherwise
            fh.write("3\n")
        paths = [path for path in paths if "://" not in path]
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def py_read(path: str) -> None:
    buf = bytearray(MiB)
    with memoryview(buf) as view:
        fd = os.open(path, os.O_RDONLY)
        try:
            while os.readv(fd, [view]):
                pass
        finally:
            os.close(fd)


def fresh_read(path: str) -> None:
    """The file into new memory of its size (pages made by the read, as a loader's are)."""
    size = os.path.getsize(path)
    mem = mmap.mmap(-1, max(1, size), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with memoryview(mem) as view:
        fd = os.open(path, os.O_RDONLY)
        try:
            done = 0
            while done < size:
                done += os.readv(fd, [view[done : done + 16 * MiB]])
        finally:
            os.close(fd)
    mem.close()


def cat(path: str) -> None:
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)


class Setup:
    """The files the methods read, written once: a Checkpointer's torch file (which the raw
    reads and torch.load read too) and a Checkpointer's sharded checkpoint (whose DCP directory
    DCP's own load reads too): twice the state on disk."""

    def __init__(
        self, work: str, state: Any, device: torch.device, mirror: str | bool, aws: str
    ) -> None:
        self.device, self.work, self.aws = device, work, aws
        self.root = os.path.join(work, "slurmkit")
        self.mirror = (mirror if isinstance(mirror, str) else os.path.join(work, "mirror")) or None
        with Checkpointer(self.root, keep=1, mirror=self.mirror or False) as ckpt:
            ckpt.save(state, 1)
            if not ckpt.wait_mirrored(3600):
                raise SystemExit(f"the mirror upload did not end: {ckpt.mirror_status()}")
        self.sharded = os.path.join(work, "slurmkit-sharded")
        with Checkpointer(self.sharded, keep=1) as ckpt:
            ckpt.save_sharded(state, 1)
        (self.plain,) = [p for p in files(self.root) if "state-" in p]
        (self.dcp,) = {os.path.dirname(p) for p in files(self.sharded) if "dcp-" in p}
        self.nbytes = os.path.getsize(self.plain)
        self.template = state
        os.sync()

    def target(self) -> Any:
        """Tensors like the state's, their memory made (a job's model and optimizer, there
        before a resume: what DCP loads into; untimed)."""
        made = like(self.template)
        for t in tensors(made):
            t.zero_()
        return made

    def methods(self) -> dict[str, tuple[list[str], Callable[[Any], Any]]]:
        """name -> (files it reads, what it does with :meth:`target`'s tensors, returning what
        stays in memory until timed)."""
        import torch.distributed.checkpoint as dcp

        location = str(self.device)

        def dcp_load(target: Any) -> Any:
            dcp.load(target, checkpoint_id=self.dcp)
            return target

        def sharded(target: Any) -> Any:
            Checkpointer(self.sharded).load_sharded(target)
            return target

        def before(_: Any) -> Any:
            ckpt = Checkpointer(self.root)
            ckpt.dir.verify(1, ckpt.dir.record(1))  # the checksum pass it made first
            return torch.load(self.plain, map_location=location, weights_only=False)

        def from_mirror(_: Any) -> Any:
            empty = tempfile.mkdtemp(prefix="wiped-", dir=self.work)  # the fast path, wiped
            with Checkpointer(empty, mirror=self.mirror, mirror_wait=0) as ckpt:
                found = ckpt.load_latest(map_location=location)
            assert found is not None and found[0] == 1, found
            return found

        mirrored: dict[str, tuple[list[str], Callable[[Any], Any]]] = {}
        if self.mirror:
            mirrored["  from the mirror (fast path wiped)"] = (files(self.mirror), from_mirror)
        if self.mirror and "://" in self.mirror:
            url = self.mirror.rstrip("/") + "/" + os.path.relpath(self.plain, self.root)
            mirrored[MIRROR_RAW] = ([url], lambda _: aws_cp(self.aws, url, self.work))
        return {
            "raw read: cat": ([self.plain], lambda _: cat(self.plain)),
            "raw read: python, 1 MiB buffer": ([self.plain], lambda _: py_read(self.plain)),
            "raw read into fresh memory (ref.)": ([self.plain], lambda _: fresh_read(self.plain)),
            f"torch.load(map_location={location!r})": (
                [self.plain],
                lambda _: torch.load(self.plain, map_location=location, weights_only=False),
            ),
            "DCP load (into the job's tensors)": (files(self.dcp), dcp_load),
            f"Checkpointer.load_latest({location!r})": (
                files(self.root),
                lambda _: Checkpointer(self.root).load_latest(map_location=location),
            ),
            **mirrored,
            "  as before: checksum pass + torch.load": (files(self.root), before),
            "Checkpointer.load_sharded (into them)": (files(self.sharded), sharded),
            SHARDED_RAW: (files(self.dcp), lambda _: [cat(p) for p in files(self.dcp)]),
        }


SHARDED_RAW = "  raw read of its files: cat"  # load_sharded's own baseline
MIRROR_RAW = "  raw download from the mirror: aws s3 cp"  # the mirror's own baseline


def aws_cp(aws: str, url: str, work: str) -> None:
    """The object at ``url`` downloaded by the AWS CLI (its parallel ranged GETs) into a file
    under ``work``, removed after: to stdout, the CLI writes in order on one thread."""
    target = os.path.join(work, "aws-download")
    try:
        subprocess.run(
            [*shlex.split(aws), "s3", "cp", "--only-show-errors", url, target], check=True
        )
    finally:
        if os.path.exists(target):
            os.unlink(target)


def timed(paths: list[str], method: Callable[[Any], Any], setup: Setup, name: str) -> float:
    device = setup.device
    target = setup.target() if "into" in name else None
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    drop(paths)
    start = time.perf_counter()
    kept = method(target)
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    del kept
    return elapsed


def resume_table(setup: Setup, runs: int, skip: list[str]) -> None:
    methods = {
        name: how
        for name, how in setup.methods().items()
        if "raw read:" in name or not any(word in name for word in skip)
    }
    times: dict[str, list[float]] = {name: [] for name in methods}
    bases: list[float] = []
    warm = []
    for run in range(runs):
        order = list(methods) if run % 2 == 0 else list(reversed(methods))
        got: dict[str, float] = {}
        for name in order:
            paths, method = methods[name]
            got[name] = timed(paths, method, setup, name)
            times[name].append(got[name])
            print(f"run {run + 1}: {name}: {got[name]:.2f} s", flush=True)
        bases.append(min(got["raw read: cat"], got["raw read: python, 1 MiB buffer"]))
        start = time.perf_counter()
        py_read(setup.plain)  # not dropped: from the page cache, if it kept the file
        warm.append(time.perf_counter() - start)
    gb = setup.nbytes / 1e9
    print(
        f"\nresume of {gb:.2f} GB ({len(tensors(setup.template))} tensors) to "
        f"{setup.device}; page cache dropped before each method; {runs} runs (the second in "
        f"reverse order); baseline: the faster raw read of each run "
        f"({', '.join(f'{b:.2f} s' for b in bases)}); a read left in the page cache took "
        f"{', '.join(f'{w:.2f} s' for w in warm)}"
    )
    print(f"{'method':44} {'time per run':>22} {'x raw read (per run)':>24}")
    for name, values in times.items():
        ratios = [v / b for v, b in zip(values, bases)]
        print(
            f"{name:44} {' / '.join(f'{v:6.2f} s' for v in values):>22} "
            f"{' / '.join(f'{r:5.2f}x' for r in ratios):>24}"
        )
    sharded = [
        v / b
        for v, b in zip(times.get("Checkpointer.load_sharded (into them)", []), times[SHARDED_RAW])
    ]
    shown = " / ".join(f"{r:.2f}x" for r in sharded)
    print(f"load_sharded against the raw read of its files: {shown}")
    if MIRROR_RAW in times:
        mirror = times["  from the mirror (fast path wiped)"]
        shown = " / ".join(f"{v / b:.2f}x" for v, b in zip(mirror, times[MIRROR_RAW]))
        print(f"the resume from the mirror against its raw download: {shown}")
    print("target: load_latest, from the fast path and the mirror, and load_sharded <= 1.10x")


def first_save(
    state: Callable[[], Any], device: torch.device, work: str, runs: int, train: Callable[[], None]
) -> None:
    """The first async save of a checkpointer blocks, without and with prepare() made while
    the loop trains; then a steady save."""
    rows: dict[str, list[float]] = {"first save": [], "first save after prepare": []}
    steady: list[float] = []
    prepared: list[float] = []
    for run in range(runs):
        for with_prepare in (False, True) if run % 2 == 0 else (True, False):
            gc.collect()
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch._C._host_emptyCache()  # no pinned memory cached from the last one
            root = os.path.join(work, f"first-{run}-{with_prepare}")
            with Checkpointer(root, keep=1, async_save=True) as ckpt:
                if with_prepare:
                    start = time.perf_counter()
                    ckpt.prepare(state())
                    while ckpt._preparing is not None and ckpt._preparing.is_alive():
                        train()  # the loop goes on meanwhile
                    prepared.append(time.perf_counter() - start)
                train()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                start = time.perf_counter()
                ckpt.save(state(), 1)
                blocked = time.perf_counter() - start
                rows["first save after prepare" if with_prepare else "first save"].append(blocked)
                ckpt.wait()
                if not with_prepare:
                    train()
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    ckpt.save(state(), 2)
                    steady.append(time.perf_counter() - start)
                    ckpt.wait()
            shutil.rmtree(root, ignore_errors=True)
    print(f"\nasync save blocked ({runs} runs), on {device}:")
    for name, values in {**rows, "steady save (the second)": steady}.items():
        print(f"{name:34} {' / '.join(f'{v:.3f} s' for v in values)}")
    print(
        f"prepare() made the buffers in {' / '.join(f'{p:.2f} s' for p in prepared)} while the "
        f"loop trained. Target: the first save after prepare blocks <= 0.3 s (like a steady one)."
    )


def single_process_group() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def main(argv: list[str] | None = None, defaults: dict[str, Any] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", help="cpu, or cuda")
    ap.add_argument("--gib", type=float, default=3.0, help="synthetic state size (no --layers)")
    ap.add_argument("--layers", type=int, default=0, help="a real model: Linear layers")
    ap.add_argument("--width", type=int, default=8192, help="--layers: layer width")
    ap.add_argument("--dir", help="where to write (default: a temp dir in the repo)")
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--first-save", action="store_true", help="also: the first save's block")
    ap.add_argument("--no-resume", action="store_true", help="skip the resume table")
    ap.add_argument("--mirror", action="store_true", help="also: a resume from the mirror")
    ap.add_argument("--mirror-url", help="also: a resume from this object store URL (s3://...)")
    ap.add_argument("--aws", default="aws", help="--mirror-url's baseline: the AWS CLI command")
    ap.add_argument(
        "--skip", action="append", default=[], help="leave out the methods naming this (repeat)"
    )
    ap.set_defaults(**(defaults or {}))
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":  # "cuda" alone names no index: set_device wants one
        torch.cuda.set_device(device.index or 0)
    work = tempfile.mkdtemp(prefix=".bench-resume-", dir=args.dir or str(ROOT))
    single_process_group()  # DCP's collectives, one rank
    try:
        if args.layers:
            model, opt, state = model_state(args.layers, args.width, device)
            x = torch.randn(8, args.width, device=device)

            def train() -> None:
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()
        else:
            fixed = synthetic_state(int(args.gib * (1 << 30)), device)
            state = lambda: fixed

            def train() -> None:
                time.sleep(0.05)

        print(
            f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'CPU'}: state of "
            f"{sum(t.nbytes for t in tensors(state())) / 1e9:.2f} GB; files under {work}",
            flush=True,
        )
        if not args.no_resume:
            setup = Setup(work, state(), device, args.mirror_url or args.mirror, args.aws)
            resume_table(setup, args.runs, args.skip)
            del setup
        if args.first_save:
            first_save(state, device, work, args.runs, train)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
