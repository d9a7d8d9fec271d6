"""Steering a sweep after submission: results, a trial's logs, cancel."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from . import backends, store
from .backends.base import Stopped
from .core import lock, states
from .core.fsutil import read_json
from .errors import UserError
from .status import collect


def results_table(
    root: str, sort_key: str | None = None, desc: bool = False
) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per trial (index, id, state, params, metrics) and the column order."""
    current = collect(root, with_metrics=True)
    param_cols: list[str] = []
    metric_cols: list[str] = []
    rows = []
    for t in current.trials:
        for k in t.params:
            if k not in param_cols:
                param_cols.append(k)
        for k in t.metrics:
            if k not in metric_cols:
                metric_cols.append(k)
        rows.append({"index": t.index, "id": t.id, "state": t.state, **t.params, **t.metrics})
    columns = [
        "index",
        "id",
        "state",
        *param_cols,
        *(m for m in metric_cols if m not in param_cols),
    ]
    if sort_key:
        if sort_key not in columns:
            raise UserError(
                f"no metric or parameter named {sort_key!r}",
                key="--sort",
                hint=f"known: {', '.join(columns[3:]) or '(no metrics reported yet)'}",
            )
        have = [r for r in rows if isinstance(r.get(sort_key), (int, float, str))]
        have.sort(key=lambda r: (isinstance(r[sort_key], str), r[sort_key]), reverse=desc)
        rows = have + [r for r in rows if r not in have]
    return rows, columns


def find_trial(root: str, ref: str) -> dict[str, Any]:
    """The manifest row of a trial given by index or by a unique prefix of its id."""
    sweep = store.open_sweep(root)
    rows = list(sweep.iter_manifest())
    if ref.isdigit() and int(ref) < len(rows):
        return rows[int(ref)]
    matches = [r for r in rows if r["id"].startswith(ref)]
    if len(matches) == 1:
        return matches[0]
    raise UserError(
        f"{'several trials match' if matches else 'no trial matches'} {ref!r}",
        key="TRIAL",
        hint=f"an index 0..{len(rows) - 1} or a unique id prefix",
    )


def log_path(root: str, ref: str, slurm_log: bool = False) -> str:
    """The trial's output log, or with ``slurm_log`` Slurm's log of its latest array task."""
    sweep = store.open_sweep(root)
    row = find_trial(root, ref)
    if not slurm_log:
        return sweep.output(row["id"])
    attempts = (read_json(sweep.status(row["id"]), default={}) or {}).get("attempts", [])
    for attempt in reversed(attempts):
        if "array_job_id" in attempt:
            return os.path.join(
                sweep.logs, f"{attempt['array_job_id']}_{attempt['array_task_id']}.out"
            )
    raise UserError(f"trial {row['id']} has not run on Slurm yet")


@dataclass
class Cancelled:
    """What :func:`cancel` stopped (or, with ``dry_run``, would stop), by backend."""

    sweep_dir: str
    stopped: dict[str, list[Stopped]]  # by each backend's cancel_key
    dry_run: bool

    @property
    def texts(self) -> list[str]:
        """What was stopped, for people (``1234``, ``local pid 4321``)."""
        return [s.text for group in self.stopped.values() for s in group]

    def as_dict(self) -> dict[str, Any]:
        return {
            "sweep_dir": self.sweep_dir,
            **{key: [s.value for s in group] for key, group in self.stopped.items()},
            "dry_run": self.dry_run,
        }


def cancel(root: str, dry_run: bool = False) -> Cancelled:
    """Cancel what still runs or waits for the sweep: every backend that submitted some of its
    trials stops them (Slurm: one scancel). With ``dry_run``, only say what would be cancelled."""
    sweep = store.open_sweep(root)
    lock = store.locked(sweep, "cancel") if not dry_run else None
    try:
        current = collect(root)
        live_jobs = {t.job for t in current.trials if t.job and t.state in states.ACTIVE}
        stopped = backends.cancel_all(store.submissions(sweep), live_jobs, dry_run)
    finally:
        if lock is not None:
            lock.release()
    return Cancelled(sweep.root, stopped, dry_run)


def unlock(root: str) -> dict[str, Any] | None:
    """Break the sweep directory's lock by hand (its holder is gone); who held it, if anyone."""
    return lock.unlock(store.open_sweep(root).root)
