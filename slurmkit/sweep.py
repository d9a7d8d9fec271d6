"""Submitting and resuming sweeps: the library behind ``slurmkit sweep`` (and the Python API).

The flow, each step once: spec -> plan (trials, launch) -> rendered scripts -> backend ->
sweep directory (created before the backend submits, recorded by it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from . import backends, render, store
from . import plan as plans
from . import spec as spec_mod
from .backends.base import Backend, Progress, Submission
from .core import states
from .core.layout import SweepDir
from .core.lock import Lock
from .errors import UserError

__all__ = ["Submission", "choose_backend", "resume", "submit"]

OnTarget = Callable[[Backend, SweepDir], None]  # told where trials go, before they are submitted
LARGE = 100_000  # a sweep of more trials needs yes=True (--yes): a typo can make millions


def choose_backend(name: str) -> Backend:
    """``auto``: Slurm when ``sbatch`` is on PATH and a controller answers; else local."""
    return backends.choose(name)


def submit(
    spec: spec_mod.SweepSpec,
    *,
    backend: str = "auto",
    sweep_dir: str | None = None,
    dry_run: bool = False,
    on_done: Progress | None = None,
    on_target: OnTarget | None = None,
    yes: bool = False,
) -> Submission:
    """Create the sweep directory and submit every trial.

    Nothing is left behind when the spec is invalid or the scheduler refuses the first array.
    More than :data:`LARGE` trials need ``yes``; they are checked against what the scheduler
    holds before they are expanded.
    """
    total = plans.count(spec)
    if total > LARGE and not (yes or dry_run):
        raise UserError(
            f"{total} trials: more than {LARGE} need a confirmation",
            file=spec.source,
            key="params",
            hint="pass --yes (yes=True) to submit them, or --dry-run to look first",
        )
    choosing = backends.Choosing(backend)
    target = None
    if total > LARGE:  # ask the scheduler first: expanding millions takes a while
        target = choosing.result()
        if not dry_run:
            target.check(spec, total)
    try:  # while the scheduler is asked: the spec's own errors come first
        work = plans.make(spec, plans.expand(spec), os.getcwd())
    except BaseException:
        choosing.cancel()
        raise
    if target is None:
        target = choosing.result()
        if not dry_run:
            target.check(spec, total)
    root = os.path.abspath(sweep_dir) if sweep_dir else store.default_root(spec)
    _check_path(root)
    indices = list(range(work.total))
    scripts = render.scripts(work, indices, target.max_array_size, root)
    if dry_run:
        result = _unsubmitted(target, root, work.total, indices, scripts, dry_run=True)
        result.scripts[:0] = _stage_shown(spec, target, root)
        return result
    _data_ready(spec, target)
    lock = Lock(root)
    sweep = store.create(work, root, lock=lock)
    recorded: list[bool] = []

    def on_recorded() -> None:
        recorded.append(True)
        lock.release()

    try:
        if on_target is not None:
            on_target(target, sweep)
        return target.submit(sweep, work, indices, scripts, on_done, on_recorded)
    except (UserError, OSError):
        if not recorded:  # refused, or the disk filled up, before anything was submitted
            store.remove(sweep)
        raise
    finally:
        lock.release()


def resume(
    root: str,
    overrides: Sequence[str] = (),
    *,
    backend: str | None = None,
    dry_run: bool = False,
    on_done: Progress | None = None,
    on_target: OnTarget | None = None,
    unprune: bool = False,
) -> Submission:
    """Submit again the trials that are neither COMPLETED, PRUNED nor still queued or running.

    ``overrides`` may change ``resources.*``, ``max_parallel`` and ``env.*`` (not the trials).
    Running it twice in a row submits nothing the second time. With ``unprune``, the trials
    the sweep's search pruned run again too, to ``max_resource``, judged no more
    (:func:`slurmkit.searchview.unprune`); a sweep without a search has none.
    """
    sweep = store.open_sweep(root)
    config = store.config(sweep)
    spec = spec_mod.resumed(config, overrides, sweep.sweep_json)
    lock = store.locked(sweep, "resume") if not dry_run else Lock(sweep.root)
    try:
        return _resume(
            sweep, config, spec, overrides, backend, dry_run, on_done, on_target, lock, unprune
        )
    finally:
        lock.release()


def _resume(
    sweep: SweepDir,
    config: dict[str, Any],
    spec: spec_mod.SweepSpec,
    overrides: Sequence[str],
    backend: str | None,
    dry_run: bool,
    on_done: Progress | None,
    on_target: OnTarget | None,
    lock: Lock,
    unprune: bool,
) -> Submission:
    """:func:`resume` with the sweep's lock held (not for a dry run)."""
    from . import searchview  # only a resume unprunes (sweepstate imports it too)
    from .sweepstate import collect

    current = collect(sweep.root, with_metrics=False, fresh=True)  # no cached answer
    done = {states.COMPLETED} if unprune else {states.COMPLETED, states.PRUNED}
    skip = done | states.ACTIVE
    todo = [t.index for t in current.trials if t.state not in skip]
    pruned = [t.id for t in current.trials if t.state == states.PRUNED] if unprune else []
    target = choose_backend(backend or backends.for_resume(store.submissions(sweep)))
    if todo and not dry_run:
        target.check(spec, len(todo))
    work = plans.resumed(spec, config, len(current.trials), changed=bool(overrides))
    scripts = render.scripts(work, todo, target.max_array_size, sweep.root) if todo else []
    if dry_run or not todo:
        result = _unsubmitted(target, sweep.root, work.total, todo, scripts, dry_run)
        result.scripts[:0] = _stage_shown(spec, target, sweep.root) if todo else []
    else:
        _data_ready(spec, target)
        if overrides:
            store.update_config(sweep, work)
        for trial_id in pruned:
            searchview.unprune(sweep.trial(trial_id))
        if on_target is not None:
            on_target(target, sweep)
        result = target.submit(sweep, work, todo, scripts, on_done, lock.release)
    result.warnings = current.warnings
    return result


def _unsubmitted(
    target: Backend,
    root: str,
    total: int,
    indices: list[int],
    scripts: Sequence[tuple[Any, str]],
    dry_run: bool,
) -> Submission:
    """What a dry run would submit, or a resume with nothing to submit."""
    return Submission(
        root,
        target.name,
        total,
        indices,
        scripts=[s for _, s in scripts],
        note=target.note,
        dry_run=dry_run,
        ran_here=target.runs_here,
    )


def _data_ready(spec: spec_mod.SweepSpec, target: Backend) -> None:
    """Before ``target`` submits: the spec's data staged here, or its sources looked up for the
    stage job that ``target`` submits (:func:`slurmkit.data.prepare`)."""
    if spec.data:
        from . import data  # the stage module: only specs with data

        data.prepare(spec, target)


def _stage_shown(spec: spec_mod.SweepSpec, target: Backend, root: str) -> list[str]:
    """The stage job's script that a dry run shows before the arrays' (none when every
    dataset is published, or ``target`` stages data on this machine)."""
    if not spec.data or not target.stages_data:
        return []
    from . import data

    text = data.stage_job(spec, root)
    return [text] if text is not None else []


def _check_path(root: str) -> None:
    if any(c.isspace() or c in "\"'%\\" for c in root):
        raise UserError(
            f"{root!r}: sweep directories cannot hold whitespace, quotes, '%' or '\\'",
            key="--sweep-dir",
        )


def render_standalone(spec: spec_mod.SweepSpec, spec_path: str) -> str:
    """A self-contained script for plain ``sbatch`` (the files under ``sbatch/``)."""
    trials = plans.expand(spec)
    return render.standalone(plans.make(spec, trials, os.getcwd()), spec_path)
