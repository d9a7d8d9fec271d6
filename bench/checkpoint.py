"""Checkpoint throughput against a raw sequential write of the same bytes, in one run.

    python bench/checkpoint.py                       # 1 GiB state, a temp dir in the repo
    python bench/checkpoint.py --gib 4 --dir /shared/scratch --repeat 3

    python bench/checkpoint.py --loop --device cuda --width 8192 --layers 16 --batch 4096
    python bench/checkpoint.py --resume              # resume: bench/resume.py, 3 GiB on the CPU

Per round, in turn: raw writes of the state's tensor bytes (write + fsync; plain, and with the
early writeback slurmkit uses), a synchronous ``Checkpointer.save``, an asynchronous one (the
time ``save`` blocks, then the background write). Each timed step starts after os.sync(); a
first, uncounted round warms the page cache and memory up. Medians over the rounds, against the
faster raw write. Targets: sync save >= 0.8x raw throughput, async blocking far below the sync
save time.

``--loop``: a training loop (an MLP whose parameters and AdamW state make about ``--gib``) that
checkpoints with each method in turn. For each: how long the loop is blocked (``save`` itself,
plus the wait in the next ``optimizer.step()`` for an overlapped snapshot, timed between step
pre-hooks run before and after the checkpoint's) and how much slower
the loop ran in all until the checkpoint was on disk (the steps run meanwhile against the median
plain step: on a machine with few cores, the background write competes with training).
Then the loop's time per step with an asynchronous save every ``--every`` steps, its checkpoints
mirrored (``Checkpointer(..., mirror="s3://...")``) to a local S3 server (moto, a process of
its own, at the lowest CPU priority: it stands for a store on other machines) or not, in
alternating runs: mirror on against mirror off (target: at most 1.05x).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from slurmkit.runtime.checkpoint import Checkpointer  # noqa: E402


def make_state(nbytes: int) -> dict[str, torch.Tensor]:
    """Model-like float32 tensors of 64 MiB (the last one smaller) adding up to ``nbytes``."""
    state, left, i = {}, nbytes, 0
    while left > 0:
        n = min(left, 64 << 20)
        state[f"layer{i}.weight"] = torch.randn(n // 4)
        left -= n
        i += 1
    return state


def settle() -> None:
    """Let earlier writes and deletions (journal commits, discards) finish before timing."""
    os.sync()
    time.sleep(0.5)


def raw_write(state: dict[str, torch.Tensor], path: str, writeback: bool) -> float:
    """Write+fsync the tensors' bytes; ``writeback``: with the early writeback slurmkit uses
    (posix_fadvise DONTNEED every 64 MiB, over the last two windows)."""
    start = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written = kicked = 0
        for t in state.values():
            view = _view(t)
            while view:
                n = os.write(fd, view[: 64 << 20])
                view = view[n:]
                written += n
                if writeback and written - kicked >= 64 << 20:
                    begin = max(0, kicked - (64 << 20))
                    os.posix_fadvise(fd, begin, written - begin, os.POSIX_FADV_DONTNEED)
                    kicked = written
        os.fsync(fd)
    finally:
        os.close(fd)
    elapsed = time.perf_counter() - start
    os.unlink(path)
    return elapsed


def _view(t: torch.Tensor) -> memoryview:
    """The tensor's bytes without numpy: through the untyped storage's buffer."""
    import ctypes

    n = t.untyped_storage().nbytes()
    return memoryview((ctypes.c_char * n).from_address(t.data_ptr())).cast("B")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="state size in GiB")
    ap.add_argument("--dir", help="where to write (default: a temp dir in the repo)")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--loop", action="store_true", help="only the training-loop measurement")
    ap.add_argument("--resume", action="store_true", help="only resume (bench/resume.py)")
    ap.add_argument("--device", default="cpu", help="--loop: cpu or cuda")
    ap.add_argument("--width", type=int, default=4096, help="--loop: layer width")
    ap.add_argument("--layers", type=int, default=0, help="--loop: layers (default: from --gib)")
    ap.add_argument("--batch", type=int, default=256, help="--loop: batch size")
    ap.add_argument("--every", type=int, default=10, help="--loop: steps between mirrored saves")
    ap.add_argument("--saves", type=int, default=3, help="--loop: saves per mirror run")
    args = ap.parse_args()
    if args.resume:  # 3 GiB: loaded, written and its DCP target fit in this VM's 24 GB
        import resume

        resume.main(["--gib", "3", "--first-save", *(["--dir", args.dir] if args.dir else [])])
        return
    base = args.dir or str(ROOT)
    work = tempfile.mkdtemp(prefix=".bench-checkpoint-", dir=base)
    if args.loop:
        try:
            loop_bench(args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    nbytes = int(args.gib * (1 << 30))
    state = make_state(nbytes)
    raw: list[float] = []
    raw_wb: list[float] = []
    sync: list[float] = []
    prune: list[float] = []
    blocked: list[float] = []
    background: list[float] = []
    try:
        with (
            Checkpointer(os.path.join(work, "sync"), keep=1) as ckpt,
            Checkpointer(os.path.join(work, "async"), keep=1, async_save=True) as actx,
        ):
            for step in range(args.repeat + 1):
                if step == 1:  # round 0 warmed up
                    del raw[:], raw_wb[:], sync[:], prune[:], blocked[:], background[:]
                settle()
                raw.append(raw_write(state, os.path.join(work, "raw.bin"), False))
                settle()
                raw_wb.append(raw_write(state, os.path.join(work, "raw.bin"), True))
                settle()
                start = time.perf_counter()
                ckpt.save(state, step)
                sync.append(time.perf_counter() - start)
                start = time.perf_counter()
                ckpt.wait()  # the previous checkpoint's deletion, in the background
                prune.append(time.perf_counter() - start)
                settle()
                start = time.perf_counter()
                actx.save(state, step)
                blocked.append(time.perf_counter() - start)
                start = time.perf_counter()
                actx.wait()
                background.append(time.perf_counter() - start)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = statistics.median
    gb = nbytes / 1e9
    base_s = min(med(raw), med(raw_wb))

    def line(name: str, times: list[float], note: str = "") -> None:
        print(
            f"{name:34} {med(times):7.3f} s {gb / med(times):6.2f} GB/s  {note:28} "
            f"{' '.join(f'{x:.3f}' for x in times)}"
        )

    print(
        f"state {nbytes / (1 << 30):.2f} GiB in {len(state)} tensors, {args.repeat} rounds after "
        f"a warm-up, under {base}; medians, then every round"
    )
    line("raw write+fsync", raw)
    line("raw write+fsync, early writeback", raw_wb)
    line("slurmkit sync save", sync, f"throughput {base_s / med(sync):.2f}x raw")
    print(f"{'  then pruning (background)':34} {med(prune):7.3f} s")
    line("slurmkit async save: blocked", blocked, f"{med(blocked) / med(sync):.2f}x the sync save")
    line("  then writing (+ pruning)", background)
    print(
        f"raw = the faster raw write ({base_s:.3f} s). Targets: sync save >= 0.80x raw "
        f"throughput; async blocked far below the sync save."
    )


def loop_bench(args: argparse.Namespace, work: str) -> None:
    device = torch.device(args.device)
    width = args.width
    layers = args.layers or max(1, round(args.gib * (1 << 30) / (12 * width * width)))
    model = torch.nn.Sequential(
        *[m for _ in range(layers) for m in (torch.nn.Linear(width, width), torch.nn.ReLU())]
    )
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6)
    x = torch.randn(args.batch, width, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    def step() -> tuple[float, float]:
        """(forward+backward, optimizer step) seconds."""
        start = time.perf_counter()
        model(x).square().mean().backward()
        sync()
        middle = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        return middle - start, time.perf_counter() - middle

    for _ in range(3):
        step()
    plain = [step() for _ in range(max(5, args.repeat))]
    fb, st = statistics.median(p[0] for p in plain), statistics.median(p[1] for p in plain)
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    print(
        f"\ntraining loop on {device}: {layers} x Linear({width}, {width}), batch {args.batch}, "
        f"{nbytes / (1 << 30):.2f} GiB of parameters + AdamW state; plain step "
        f"{fb + st:.3f} s (forward+backward {fb:.3f} s, optimizer {st:.3f} s)"
    )
    methods = {
        "sync save": (False, False),
        "async save": (True, False),
        "async save, overlap=optimizer": (True, True),
    }
    results: dict[str, tuple[list[float], list[float]]] = {}
    for name, (is_async, overlap) in methods.items():
        blocked: list[float] = []
        slowed: list[float] = []
        root = os.path.join(work, "loop-" + name.replace(" ", "").replace(",", "-"))
        with Checkpointer(root, keep=1, async_save=is_async) as ckpt:
            for rnd in range(args.repeat + 1):
                step()
                settle()
                state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
                start = time.perf_counter()
                ckpt.save(state, rnd, overlap=opt if overlap else None)
                saved = time.perf_counter() - start
                waited: list[float] = []
                # global step-pre-hooks run before the checkpoint's, the optimizer's own after it
                first = register_optimizer_step_pre_hook(
                    lambda *_: waited.append(-time.perf_counter())  # noqa: B023 - this round's
                )
                last = opt.register_step_pre_hook(
                    lambda *_: waited.append(time.perf_counter())  # noqa: B023 - this round's
                )
                after = [step()]
                first.remove()
                last.remove()
                while ckpt.writing and len(after) < 1000:
                    after.append(step())
                start = time.perf_counter()
                ckpt.wait()
                left = time.perf_counter() - start
                if rnd == 0:
                    continue  # warm-up: buffers allocated, files created
                blocked.append(saved + sum(waited))  # save() + the wait in the next step()
                slowed.append(saved + sum(a + b for a, b in after) - len(after) * (fb + st) + left)
        results[name] = (blocked, slowed)
    sync_s = statistics.median(results["sync save"][0])
    print(f"{'method':32} {'loop blocked':>13} {'vs sync save':>13} {'loop slowed in all':>19}")
    for name, (blocked, slowed) in results.items():
        b = statistics.median(blocked)
        print(
            f"{name:32} {b:12.3f}s {b / sync_s:12.2f}x {statistics.median(slowed):18.3f}s   "
            f"blocked per round: {' '.join(f'{x:.3f}' for x in blocked)}"
        )
    print(
        f"medians over {args.repeat} rounds after a warm-up; 'slowed in all': the save plus the "
        f"extra time of the steps that ran until the checkpoint was on disk. "
        f"Target: async blocked <= 0.10x the sync save."
    )
    mirror_bench(args, work, step, model, opt)


def mirror_bench(
    args: argparse.Namespace,
    work: str,
    step: Callable[[], tuple[float, float]],
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
) -> None:
    """Time per step of the loop with an async save every ``--every`` steps, mirrored to a local
    S3 server or not, in alternating runs (the first of a round alternating too)."""
    try:
        import s3fs
    except ImportError:
        print("\nmirror on vs off: skipped (no s3fs; pip install 'slurmkit[dev]')")
        return
    from run import _s3_server

    server, url, _ = _s3_server(Path(work))
    # The object store runs on other machines in a cluster: here it gets only the CPU time that
    # training leaves (at the same priority, its own work is what slows the loop most)
    os.setpriority(os.PRIO_PROCESS, server.pid, 19)
    os.environ.update(
        AWS_ACCESS_KEY_ID="bench",
        AWS_SECRET_ACCESS_KEY="bench-secret",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=url,
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
        AWS_EC2_METADATA_DISABLED="true",
    )
    per_step: dict[str, list[float]] = {"mirror off": [], "mirror on": []}
    cpu: dict[str, list[float]] = {"mirror off": [], "mirror on": [], "moto": []}
    notes: list[str] = []
    steps = args.every * args.saves
    try:
        s3fs.S3FileSystem().mkdir("bench")
        for rnd in range(args.repeat):
            names = list(per_step) if rnd % 2 == 0 else list(reversed(per_step))
            for name in names:
                mirror = f"s3://bench/loop-{rnd}" if name == "mirror on" else False
                root = os.path.join(work, f"mirror-{rnd}-{name.split()[1]}")
                with Checkpointer(root, keep=2, async_save=True, mirror=mirror) as ckpt:
                    settle()
                    start, used, moto = time.perf_counter(), time.process_time(), _cpu(server.pid)
                    for i in range(1, steps + 1):
                        step()
                        if i % args.every == 0:
                            state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
                            ckpt.save(state, i, overlap=opt)
                    ckpt.wait()  # the last save on disk: in both
                    per_step[name].append((time.perf_counter() - start) / steps)
                    status = ckpt.mirror_status()
                    if status is not None:
                        ckpt.wait_mirrored()
                        cpu["moto"].append(_cpu(server.pid) - moto)
                        status = ckpt.mirror_status()
                        assert status is not None
                        notes.append(f"{status.uploaded}/{args.saves}")
                    cpu[name].append(time.process_time() - used)
    finally:
        server.terminate()
        server.wait()
    off, on = (statistics.median(per_step[k]) for k in ("mirror off", "mirror on"))
    print(
        f"\nmirror on vs off: {steps} steps, an async save (overlap=optimizer) every "
        f"{args.every}, {args.repeat} alternating runs each; checkpoints uploaded to moto "
        f"(nice 19) of those saved (the rest superseded by newer ones): {' '.join(notes)}"
    )
    for name, times in per_step.items():
        print(
            f"{name:32} {statistics.median(times):12.4f}s per step   "
            f"runs: {' '.join(f'{x:.4f}' for x in times)}"
        )
    print(f"mirror on / mirror off: {on / off:.3f}x per step (target: <= 1.05x)")
    med = {k: statistics.median(v) for k, v in cpu.items()}
    print(
        f"CPU seconds per run (until every upload ended): this process {med['mirror off']:.1f} "
        f"mirror off, {med['mirror on']:.1f} mirror on; the S3 server (same machine) "
        f"{med['moto']:.1f}; {os.cpu_count()} CPUs"
    )


def _cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
