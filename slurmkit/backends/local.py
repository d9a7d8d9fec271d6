"""The local backend: trials run as processes on this machine, ``max_parallel`` at a time, with
the same environment contract and sweep directory as on Slurm (the runtime's TrialRun)."""

from __future__ import annotations

import os
import signal
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable, Sequence

from ..core.fsutil import read_json
from ..core.layout import SweepDir
from ..runtime.trial import TrialRun

Progress = Callable[[TrialRun, int], None]


def default_parallel() -> int:
    return max(1, os.cpu_count() or 1)


def run(sweep: SweepDir, indices: Sequence[int], *, max_parallel: int | None = None,
        on_done: Progress | None = None) -> dict[int, int]:
    """Run the given trials; return ``{index: exit_code}``. Ctrl-C or SIGTERM stops them all."""
    config = read_json(sweep.sweep_json)
    rows = {row["index"]: row for row in sweep.iter_manifest()}
    parallel = max_parallel or default_parallel()
    stop = threading.Event()
    running: dict[int, TrialRun] = {}
    lock = threading.Lock()
    codes: dict[int, int] = {}

    def one(index: int) -> int:
        trial = TrialRun(sweep, index, config=config, row=rows[index])
        if stop.is_set():
            return -1
        with lock:
            running[index] = trial
        try:
            if trial.already_completed():
                return 0
            trial.start()
            if stop.is_set():
                trial.terminate()
            return trial.wait()
        finally:
            with lock:
                running.pop(index, None)
            if on_done is not None and not stop.is_set():
                on_done(trial, index)

    def halt(signum: int = signal.SIGTERM) -> None:
        stop.set()
        with lock:
            for trial in running.values():
                trial.terminate(signum)

    # The handler only records the signal: taking a lock in it could deadlock when a second
    # SIGTERM arrives while the first handler holds it (see slurmkit.runtime.preemption).
    signalled: list[int] = []
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda s, _f: signalled.append(s))
    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="slurmkit-trial")
    futures: dict[Future[int], int] = {}
    todo = list(indices)
    try:
        while todo or futures:
            if signalled and not stop.is_set():
                halt(signalled[0])
            while todo and len(futures) < parallel and not stop.is_set():
                index = todo.pop(0)
                futures[pool.submit(one, index)] = index
            if not futures:
                break
            done, _ = wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                codes[futures.pop(fut)] = fut.result()
    except KeyboardInterrupt:
        halt(signal.SIGINT)
        raise
    finally:
        if stop.is_set() or todo:
            halt()
        pool.shutdown(wait=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return codes

