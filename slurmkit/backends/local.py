"""The local backend: trials run as processes on this machine, ``max_parallel`` at a time, with
the same environment contract and sweep directory as on Slurm (the runtime's TrialRun)."""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import TYPE_CHECKING, Any

from .. import store
from ..core.arrays import compress, expand_array_spec
from ..core.layout import SweepDir
from ..core.pids import identity, running
from ..errors import UserError
from ..runtime.trial import TrialRun
from .base import Backend, LiveTask, Progress, Stopped, Submission

if TYPE_CHECKING:
    from ..plan import Chunk, Plan
    from ..spec import SweepSpec


class LocalBackend(Backend):
    """Trials as processes of this machine, ``max_parallel`` at a time; the submit call
    returns when they have ended."""

    name = "local"
    needs = "nothing"
    where = "on this machine"
    cancel_key = "local_pids"
    runs_here = True
    sticky = False

    def check(self, spec: SweepSpec, trials: int) -> None:
        if spec.container is not None:
            raise UserError(
                "container trials need Slurm with pyxis; the local backend runs none",
                key="--backend",
                hint="submit from a login node of the cluster",
            )

    def submit(
        self,
        sweep: SweepDir,
        plan: Plan,
        indices: list[int],
        scripts: Sequence[tuple[Chunk, str]],
        on_done: Progress | None,
        recorded: Callable[[], None],
    ) -> Submission:
        store.record_submission(
            sweep, {"backend": self.name, **identity(os.getpid()), "indices": compress(indices)}
        )
        recorded()
        result = Submission(
            sweep.root, self.name, plan.total, indices, note=self.note, ran_here=True
        )
        result.exit_codes = run(
            sweep, indices, max_parallel=plan.spec.max_parallel, on_done=on_done
        )
        return result

    def indices(self, record: dict[str, Any]) -> list[int]:
        return expand_array_spec(record["indices"]) if record.get("indices") else []

    def live(
        self,
        records: Sequence[dict[str, Any]],
        owned: Callable[[int], bool] | None,
        ask: Callable[[int], bool],
        *,
        fresh: bool = False,
    ) -> dict[int, LiveTask]:
        alive: dict[int, bool] = {}
        for record in records:
            here = running(record) is not None
            alive.update((i, here) for i in self.indices(record))
        return {
            i: LiveTask(None, None, here) for i, here in alive.items() if owned is None or owned(i)
        }

    def cancel(
        self, records: Sequence[dict[str, Any]], live_jobs: set[str], dry_run: bool
    ) -> list[Stopped]:
        pids = [pid for r in records if (pid := running(r)) is not None and pid != os.getpid()]
        if not dry_run:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
        return [Stopped(self.cancel_key, pid, f"local pid {pid}") for pid in pids]


def default_parallel() -> int:
    return max(1, os.cpu_count() or 1)


def run(
    sweep: SweepDir,
    indices: Sequence[int],
    *,
    max_parallel: int | None = None,
    on_done: Progress | None = None,
) -> dict[int, int]:
    """Run the given trials; return ``{index: exit_code}``. Ctrl-C or SIGTERM stops them all."""
    config = store.config(sweep)
    rows = {i: row for i, row in enumerate(store.manifest(sweep)) if row is not None}
    parallel = max_parallel or default_parallel()
    stop = threading.Event()
    running: dict[int, TrialRun] = {}
    lock = threading.Lock()
    codes: dict[int, int] = {}

    def one(index: int) -> int:
        if index not in rows:  # its manifest line is damaged: nothing to run
            return 2
        trial = TrialRun(sweep, index, config=config, row=rows[index])
        if stop.is_set():
            return -1
        with lock:
            running[index] = trial
        try:
            holder = trial.claim(wait=1.0)  # a dead holder of this host is broken at once
            if holder is not None:
                raise UserError.failure(
                    f"trial {trial.id} is running elsewhere, in {holder}",
                    hint="wait for it to end, or cancel it, then resume",
                )
            if trial.already_completed():
                return 0
            trial.start()
            if stop.is_set():
                trial.terminate()
            return trial.wait()
        finally:
            trial.release()
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
