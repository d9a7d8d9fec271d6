"""Steering a sweep after submission: results, a trial's logs, cancel."""

from __future__ import annotations

import math
import os
import pwd
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import backends, searchview, store
from .backends.base import Stopped
from .core import lock, states
from .core.fsutil import Damaged
from .core.layout import SweepDir, slurm_log_name
from .core.search import Search
from .errors import UserError
from .sweepstate import collect

_FIXED = ("index", "id", "state")  # the columns of every results row, before its params


def results_table(
    root: str, sort_key: str | None = None, desc: bool = False
) -> tuple[list[dict[str, Any]], list[str], list[str]]:
    """One row per trial (index, id, state, params, metrics), the column order, and what is
    damaged in the sweep directory (one line each).

    A metric named like a parameter or a fixed column is the column ``metrics.NAME``. With
    ``sort_key``, NaN and then missing values come last, whatever the direction. A sweep with a
    search adds ``rung`` (the last rung the trial reached) and the metric at each rung
    (``val_loss@1``, ``val_loss@3``...), and without ``sort_key`` is sorted by its metric, best
    first.
    """
    current = collect(root)
    param_cols: dict[str, None] = {}  # ordered sets: first seen first
    metric_names: dict[str, None] = {}
    for t in current.trials:
        param_cols.update(dict.fromkeys(t.params))
        metric_names.update(dict.fromkeys(t.metrics))
    taken = {*_FIXED, *param_cols, *metric_names}
    metric_cols = {
        m: _renamed(m, taken) if m in _FIXED or m in param_cols else m for m in metric_names
    }
    rung_cols = _rung_columns(current.search, taken) if current.search is not None else {}
    rows = [
        {
            "index": t.index,
            "id": t.id,
            "state": t.state,
            **t.params,
            **{metric_cols[k]: v for k, v in t.metrics.items()},
            **_rung_cells(t.rungs or [], rung_cols),
        }
        for t in current.trials
    ]
    columns = [*_FIXED, *param_cols, *metric_cols.values(), *rung_cols.values()]
    if sort_key is None and current.search is not None and current.search.metric in metric_cols:
        sort_key, desc = metric_cols[current.search.metric], current.search.mode == "max"
    if sort_key:
        if sort_key not in columns:
            raise UserError(
                f"no metric or parameter named {sort_key!r}",
                key="--sort",
                hint=f"known: {', '.join(columns[len(_FIXED) :]) or '(no metrics reported yet)'}",
            )
        groups: tuple[list[dict[str, Any]], ...] = ([], [], [])
        for r in rows:
            groups[_rank(r.get(sort_key))].append(r)
        groups[0].sort(key=lambda r: (isinstance(r[sort_key], str), r[sort_key]), reverse=desc)
        rows = [r for group in groups for r in group]
    return rows, columns, current.warnings


def _rung_columns(search: Search, taken: set[str]) -> dict[Any, str]:
    """The search's columns: ``searchview.RUNG`` -> ``rung``, and each rung's resource ->
    ``METRIC@RESOURCE`` (``search.NAME`` where a parameter or metric has that name)."""
    names: dict[Any, str] = {searchview.RUNG: searchview.RUNG}
    names.update({r: searchview.column(search, r) for r in search.rungs()})
    out = {}
    for key, name in names.items():
        while name in taken:
            name = f"search.{name}"
        taken.add(name)
        out[key] = name
    return out


def _rung_cells(rungs: list[dict[str, Any]], names: dict[Any, str]) -> dict[str, Any]:
    """A trial's cells of the search's columns (none without a search)."""
    if not names:
        return {}
    cells: dict[str, Any] = {names[searchview.RUNG]: rungs[-1]["rung"] if rungs else None}
    cells.update({names[r["resource"]]: r["value"] for r in rungs})
    return cells


def _renamed(metric: str, taken: set[str]) -> str:
    """The column, now taken too, of a metric whose name is taken: ``metrics.NAME`` (prefixed
    again while that is taken as well)."""
    column = f"metrics.{metric}"
    while column in taken:
        column = f"metrics.{column}"
    taken.add(column)
    return column


def _rank(value: Any) -> int:
    """Where a sort puts a value: 0 sorted (numbers, then strings), 1 NaN, 2 missing or other."""
    if isinstance(value, float) and math.isnan(value):
        return 1
    return 0 if isinstance(value, (int, float, str)) else 2


def find_trial(root: str, ref: str) -> dict[str, Any]:
    """The manifest row of a trial given by index or by a unique prefix of its id.

    Digits are an index. Digits past the last index that begin some trial's id are an error
    naming both readings (never silently that trial), unless they are a whole id."""
    sweep = store.open_sweep(root)
    rows = store.manifest(sweep)
    index = ref.isascii() and ref.isdigit()
    if index and int(ref) < len(rows):
        row = rows[int(ref)]
        if row is None:
            raise UserError(f"trial {ref}'s line of {sweep.manifest} is damaged", key="TRIAL")
        return row
    matches = [r for r in rows if r is not None and r["id"].startswith(ref)]
    if index and matches and not (len(matches) == 1 and matches[0]["id"] == ref):
        ids = ", ".join(r["id"] for r in matches[:3]) + (", ..." if len(matches) > 3 else "")
        raise UserError(
            f"no trial {ref}: the sweep's indexes are 0..{len(rows) - 1}, and digits are an "
            f"index, though the id of {ids} starts with {ref!r}",
            key="TRIAL",
            hint="for a trial by its id, give its id up to a letter, or the whole id",
        )
    if len(matches) == 1:
        return matches[0]
    raise UserError(
        f"{'several trials match' if matches else 'no trial matches'} {ref!r}",
        key="TRIAL",
        hint=f"an index 0..{len(rows) - 1} or a unique id prefix"
        if rows
        else f"{sweep.manifest} lists no trials",
    )


def log_path(root: str, ref: str, slurm_log: bool = False, stderr: bool = False) -> str:
    """The trial's output log, or with ``slurm_log`` Slurm's log of its latest array task;
    with ``stderr``, the stderr file beside it (``logs.stderr: separate``)."""
    sweep = store.open_sweep(root)
    row = find_trial(root, ref)
    logs = store.config(sweep, warnings=[]).get("logs")
    logs = logs if isinstance(logs, dict) else {}
    if stderr and logs.get("stderr") != "separate":
        raise UserError(
            "this sweep keeps stderr in the output (logs.stderr: merged)",
            key="--stderr",
            hint="leave out --stderr; set logs: {stderr: separate} in the spec to keep it apart",
        )
    if not slurm_log:
        return sweep.errors(row["id"]) if stderr else sweep.output(row["id"])
    try:
        attempts = (store.load_record(sweep.status(row["id"]), default={}) or {}).get(
            "attempts", []
        )
    except Damaged as exc:
        raise UserError(f"{exc}", hint="`slurmkit logs` without --slurm shows its output") from None
    for attempt in reversed(attempts if isinstance(attempts, list) else []):
        if not isinstance(attempt, dict):
            continue
        if "array_job_id" in attempt and "array_task_id" in attempt:
            path = _slurm_log(sweep, attempt, logs.get("name"))
            return path + (".err" if stderr else ".out")
    raise UserError(f"trial {row['id']} has not run on Slurm yet")


def hang_files(root: str, ref: str) -> list[str]:
    """The trial's hang files (``hang-ATTEMPT.txt``, the watchdog's stacks of each attempt that
    hung), oldest attempt first; a UserError when it has none."""
    sweep = store.open_sweep(root)
    row = find_trial(root, ref)
    directory = sweep.trial(row["id"])
    try:
        names = [n for n in os.listdir(directory) if re.fullmatch(r"hang-\d+\.txt", n)]
    except OSError:
        names = []
    if not names:
        raise UserError(
            f"trial {row['id']} has no hang file: no attempt of it was declared hung",
            key="--hang",
            hint="`slurmkit logs` without --hang shows its output",
        )
    return [os.path.join(directory, n) for n in sorted(names, key=lambda n: int(n[5:-4]))]


def log_name(pattern: str, values: dict[str, str]) -> str:
    """An sbatch file-name pattern filled in (``%A``, ``%a``, ``%j``, ``%x``, ``%u``, ``%%``)."""
    return re.sub(r"%([%Aajxu])", lambda m: "%" if m[1] == "%" else values.get(m[1], m[0]), pattern)


def _owner(path: str) -> str:
    """The name of the user who owns ``path`` (its uid when no name is known)."""
    uid = os.stat(path).st_uid
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _slurm_log(sweep: SweepDir, attempt: dict[str, Any], pattern: Any) -> str:
    """Where Slurm wrote an array task's output, without ``.out``: the sweep's ``logs/`` for the
    scripts that ``slurmkit sweep`` submits; for a standalone script (submitted with plain
    sbatch, its record has no script), the directory it was submitted from."""
    config = store.config(sweep, warnings=[])
    array = str(attempt["array_job_id"])
    name = config.get("name")
    values: dict[str, str] = {
        "A": array,
        "a": str(attempt["array_task_id"]),
        "j": str(attempt.get("job_id", "")),
        "x": name if isinstance(name, str) else "",
        "u": _owner(sweep.root),
    }
    given = pattern if isinstance(pattern, str) else None
    for record in store.submissions(sweep):
        for job in record.get("jobs", []):
            if job.get("job_id") == array and job.get("script") is None:
                submit_dir = config.get("submit_dir")
                if not isinstance(submit_dir, str) or not submit_dir:
                    submit_dir = os.path.dirname(sweep.root)
                file = log_name(slurm_log_name(given, values["x"], standalone=True), values)
                return os.path.join(submit_dir, file)
    return os.path.join(sweep.logs, log_name(slurm_log_name(given, "", standalone=False), values))


def trial_ended(root: str, ref: str) -> Callable[[], bool]:
    """A check that the trial's record says it has ended (and will not run again by itself):
    what ``logs --follow`` waits for."""
    sweep = store.open_sweep(root)
    path = sweep.status(find_trial(root, ref)["id"])

    def ended() -> bool:
        try:
            status = store.load_record(path, default={}) or {}
        except Damaged:
            return True
        return status.get("state") in states.FINAL

    return ended


@dataclass
class Cancelled:
    """What :func:`cancel` stopped (or, with ``dry_run``, would stop), by backend."""

    sweep_dir: str
    stopped: dict[str, list[Stopped]]  # by each backend's cancel_key
    dry_run: bool
    warnings: list[str] = field(default_factory=list)  # damaged files: what cancel could miss

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
        current = collect(root, with_metrics=False, fresh=True)
        live_jobs = {t.job for t in current.trials if t.job and t.state in states.ACTIVE}
        stopped = backends.cancel_all(store.submissions(sweep), live_jobs, dry_run)
        warnings = current.warnings
    finally:
        if lock is not None:
            lock.release()
    return Cancelled(sweep.root, stopped, dry_run, warnings)


def unlock(root: str) -> dict[str, Any] | None:
    """Break the sweep directory's lock by hand (its holder is gone); who held it, if anyone."""
    return lock.unlock(store.open_sweep(root).root)
