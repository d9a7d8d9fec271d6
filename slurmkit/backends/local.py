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


class _Trials:
    """The trials of one :func:`run`: :meth:`one` runs a trial (in a thread of the pool),
    :meth:`halt` stops every one running."""

    def __init__(self, sweep: SweepDir, on_done: Progress | None) -> None:
        self.sweep, self.on_done = sweep, on_done
        self.config = store.config(sweep)
        self.rows = {i: row for i, row in enumerate(store.manifest(sweep)) if row is not None}
        self.stop = threading.Event()
        self.running: dict[int, TrialRun] = {}
        self.lock = threading.Lock()

    def one(self, index: int) -> int:
        if index not in self.rows:  # its manifest line is damaged: nothing to run
            return 2
        trial = TrialRun(self.sweep, index, config=self.config, row=self.rows[index])
        if self.stop.is_set():
            return -1
        with self.lock:
            self.running[index] = trial
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
            if self.stop.is_set():
                trial.terminate()
            return trial.wait()
        finally:
            trial.release()
            with self.lock:
                self.running.pop(index, None)
            if self.on_done is not None and not self.stop.is_set():
                self.on_done(trial, index)

    def halt(self, signum: int = signal.SIGTERM) -> None:
        self.stop.set()
        with self.lock:
            for trial in self.running.values():
                trial.terminate(signum)


def run(
    sweep: SweepDir,
    indices: Sequence[int],
    *,
    max_parallel: int | None = None,
    on_done: Progress | None = None,
) -> dict[int, int]:
    """Run the given trials; return ``{index: exit_code}``. Ctrl-C or SIGTERM stops them all."""
    trials = _Trials(sweep, on_done)
    parallel = max_parallel or default_parallel()
    codes: dict[int, int] = {}
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
            if signalled and not trials.stop.is_set():
                trials.halt(signalled[0])
            while todo and len(futures) < parallel and not trials.stop.is_set():
                index = todo.pop(0)
                futures[pool.submit(trials.one, index)] = index
            if not futures:
                break
            done, _ = wait(futures, timeout=0.5, return_when=FIRST_COMPLETED)
            for fut in done:
                codes[futures.pop(fut)] = fut.result()
    except KeyboardInterrupt:
        trials.halt(signal.SIGINT)
        raise
    finally:
        if trials.stop.is_set() or todo:
            trials.halt()
        pool.shutdown(wait=True)
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return codes
