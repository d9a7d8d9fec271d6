"""``slurmkit report``: where a sweep's time and money went, per sweep, trial and attempt.
(Not named ``report``: ``slurmkit.report`` is the metrics call of training code.)

ONE accounting query (:mod:`.accounting`: every attempt's submit, start, end, partition,
account, user and allocated GPUs or CPUs) joined with the sweep directories: the submission
records map array tasks to trials, each trial's ``status.json`` says why each attempt ended,
and its checkpoint journal (``checkpoints.jsonl``) how much of an interrupted attempt its last
checkpoint kept. An attempt's GPU-hours (CPU-hours where it had no GPU) are

- useful: it completed, or its work up to its last checkpoint when it was interrupted
  (preemption, time limit, node failure, a cancel) and the trial went on;
- lost: the rest of an interrupted attempt, and the whole of a failed one (an error, a
  container that did not start, a time limit or cancel that ended the trial, a budget spent);
- running: still allocated now.

Where they went, and each sweep's ETTR, is :mod:`.goodput`'s split: queued, requeue hold,
restart, productive, work lost since the last checkpoint, hang, bad node, failed, running
(sacct's ``Eligible`` for the waits; the runtime's records, and the trial's metrics times, for
each attempt's first step, last checkpoint and hang).

A trial that the sweep's search PRUNED used its hours (useful); what the search saved is
estimated per pruned trial as its hours (and run time) times ``(max_resource - reached) /
reached``, ``reached`` the resource of the report it was pruned at (its ``search.json``): as if
each further unit of resource cost what its units so far did on average (start-up included).

Costs come from the user config's ``report: {prices: {PARTITION: PRICE}}`` (per GPU-hour, or per
CPU-hour for attempts without GPUs). :func:`collect` does the I/O; everything after it
(:func:`join_trial` in :mod:`.usagejoin`, :func:`figures`, :func:`groups`) is a pure function of
what it read.
"""

from __future__ import annotations

import math
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any

from . import accounting, goodput, store
from .accounting import Row
from .core import badnodes, states
from .core.arrays import expand_array_spec
from .core.fsutil import Damaged
from .core.layout import COMMENT_PREFIX, SweepDir
from .core.search import Search
from .core.search import decisions as search_decisions
from .errors import SpecError, UserError
from .searchview import of_config
from .usagejoin import CAUSES, Attempt, commit_times, done_once, join_trial, number, trial_state
from .usagejoin import pair as pair  # re-exported: tests/test_report.py reads it here

BY = ("account", "user", "label")  # --by; also label.KEY
OTHER_JOBS = "(jobs of no sweep)"  # --since: jobs without slurmkit's comment


@dataclass
class TrialReport:
    index: int | None  # None: a job of no trial (--since)
    id: str
    state: str
    attempts: list[Attempt] = field(default_factory=list)
    # under a search: what running it on to max_resource would have cost, as a multiple of
    # what it cost (0.0 when not pruned; None: no search, or a pruned trial's reach unknown)
    unrun: float | None = None
    searched: bool = False  # its sweep has a search

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "id": self.id,
            "state": self.state,
            "attempts": [a.as_dict() for a in self.attempts],
            **({"unrun": self.unrun} if self.searched else {}),
        }


@dataclass
class SweepReport:
    sweep_dir: str  # "" for the jobs of no sweep
    name: str
    labels: dict[str, str]
    trials: list[TrialReport]
    figures: dict[str, Any]
    nodes: list[dict[str, Any]] = field(default_factory=list)  # suspects (core/badnodes.py)

    def as_dict(self) -> dict[str, Any]:
        return {
            "sweep_dir": self.sweep_dir,
            "name": self.name,
            "labels": self.labels,
            **self.figures,
            "trials": [t.as_dict() for t in self.trials],
            **({"nodes": self.nodes} if self.nodes else {}),
        }


@dataclass
class Report:
    sweeps: list[SweepReport]
    prices: dict[str, float]
    query: list[str] | None  # the one sacct command (None: no sweep had Slurm jobs)
    by: str | None = None
    since: str | None = None
    warnings: list[str] = field(default_factory=list)

    @cached_property
    def totals(self) -> dict[str, Any]:
        return figures([t for s in self.sweeps for t in s.trials])

    def groups(self) -> list[tuple[str, dict[str, Any]]]:
        return groups(self.sweeps, self.by) if self.by else []

    @cached_property
    def nodes(self) -> list[dict[str, Any]]:
        """The suspect nodes across the sweeps (core/badnodes.py)."""
        return badnodes.across([(s.name, s.nodes) for s in self.sweeps if s.nodes])

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "query": self.query,
            "queries": int(self.query is not None),
            "since": self.since,
            "prices": self.prices,
            "totals": self.totals,
        }
        if self.by:
            out["by"] = self.by
            out["groups"] = [{"group": key, **figs} for key, figs in self.groups()]
        out["sweeps"] = [s.as_dict() for s in self.sweeps]
        if self.nodes:
            out["nodes"] = self.nodes
        if self.warnings:
            out["warnings"] = self.warnings
        return out


# --------------------------------------------------------------------------- #
# Reading: the one query and the sweep directories
# --------------------------------------------------------------------------- #


def collect(
    dirs: Sequence[str] = (),
    *,
    since: str | None = None,
    user: str | None = None,
    by: str | None = None,
    now: float | None = None,
) -> Report:
    """The report of the sweep directories ``dirs``, or of every job of ``user`` since
    ``since`` (their sweep directories found by the job comment ``slurmkit:SWEEP_DIR``)."""
    check_by(by)
    now = time.time() if now is None else now
    prices = read_prices()
    warnings: list[str] = []
    if since is not None:
        when = accounting.since_time(since, now)
        asked = accounting.argv(since=when, user=user)
        found = accounting.parse(accounting.run(asked))
        sweeps = _from_comments(found, prices, now, _epoch(when), warnings)
        return Report(sweeps, prices, asked, by, when, warnings)
    read = [_read(store.open_sweep(d), warnings) for d in dict.fromkeys(map(os.path.abspath, dirs))]
    jobs = sorted({job for sweep in read for job in sweep.jobs})
    command = accounting.argv(jobs=jobs) if jobs else None
    rows: list[Row] = []
    if command is not None:
        try:
            rows = accounting.parse(accounting.run(command))
        except UserError as exc:
            warnings.append(
                f"{exc.message}: no queue delay or GPU-hours; attempts and run times "
                "come from the status files"
            )
    by_job: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_job[row.job].append(row)
    sweeps = [
        sweep.report([r for job in sweep.jobs for r in by_job.get(job, ())], prices, now, None)
        for sweep in read
    ]
    return Report(sweeps, prices, command, by, None, warnings)


def check_by(by: str | None) -> None:
    if by is None or by in BY or (by.startswith("label.") and len(by) > len("label.")):
        return
    raise UserError(f"cannot group by {by!r}", key="--by", hint="account, user, label or label.KEY")


def read_prices() -> dict[str, float]:
    """``report.prices`` of the user config: partition -> price per GPU-hour (CPU-hour)."""
    from .spec.layers import user_section  # PyYAML: only when a report is made

    section, where = user_section("report")
    return prices_from(section, where)


def prices_from(section: Any, where: str) -> dict[str, float]:
    """The ``report`` section's prices, checked: each a number >= 0 per partition name."""
    from .errors import reject_unknown

    reject_unknown(section, ("prices",), file=where, prefix="report.")
    raw = section.get("prices") or {}
    hint = "report: {prices: {h100: 4.25, cpu: 0.05}} (per GPU-hour; per CPU-hour without GPUs)"
    if not isinstance(raw, dict):
        raise SpecError(
            "must be a mapping of partition to price", file=where, key="report.prices", hint=hint
        )
    out: dict[str, float] = {}
    for name, price in raw.items():
        key = f"report.prices.{name}"
        if isinstance(price, bool) or not isinstance(price, (int, float)):
            raise SpecError(f"expected a number, got {price!r}", file=where, key=key, hint=hint)
        if not math.isfinite(price) or price < 0:
            raise SpecError(f"must be a number >= 0, got {price!r}", file=where, key=key)
        out[str(name)] = float(price)
    return out


@dataclass
class _Sweep:
    """What one sweep directory holds, read once."""

    dir: SweepDir
    name: str
    labels: dict[str, str]
    rows: list[dict[str, Any] | None]  # trials.jsonl
    tasks: dict[tuple[str, int], int]  # (array job id, task id) -> trial index
    warnings: list[str]
    search: Search | None = None

    @property
    def jobs(self) -> list[str]:
        return list(dict.fromkeys(job for job, _ in self.tasks))

    def report(
        self, rows: Iterable[Row], prices: dict[str, float], now: float, since: float | None
    ) -> SweepReport:
        by_index: dict[int, list[Row]] = defaultdict(list)
        for row in rows:
            index = self.tasks.get((row.job, row.task)) if row.task is not None else None
            if index is not None:
                by_index[index].append(row)
        # status files only where accounting leaves the story open: a trial whose one attempt
        # accounting saw complete needs none (most trials of most sweeps; not under a search,
        # where a pruned trial's task completes too)
        needed = [
            row["id"]
            for index, row in enumerate(self.rows)
            if row is not None
            and (self.search is not None or not done_once(by_index.get(index, ())))
        ]
        statuses = store.read_statuses(self.dir, needed, self.warnings) if needed else {}
        trials = []
        for index, manifest_row in enumerate(self.rows):
            if manifest_row is None:
                trials.append(TrialReport(index, "", states.DAMAGED))
                continue
            tid = manifest_row["id"]
            status = statuses.get(tid)
            records = status.get("attempts", []) if status else []
            found = by_index.get(index, [])
            if (
                since is not None
                and not found
                and not any((number(r.get("start")) or 0) >= since for r in records)
            ):
                continue  # nothing of it in the window
            recorded = status.get("state") if status else None
            if tid in statuses and status is None:
                recorded = states.DAMAGED
            state = trial_state(recorded, found)
            attempts = join_trial(
                found,
                records,
                state,
                partial(self.commits, tid),
                prices,
                now,
                since,
                partial(self.reports, tid),
            )
            trials.append(TrialReport(index, tid, state, attempts))
            if self.search is not None:
                trials[-1].searched = True
                trials[-1].unrun = self.unrun(tid) if state == states.PRUNED else 0.0
        suspects = [s.to_dict() for s in badnodes.suspects(self.dir.root)]
        return SweepReport(self.dir.root, self.name, self.labels, trials, figures(trials), suspects)

    def unrun(self, trial_id: str) -> float | None:
        """A pruned trial's ``(max_resource - reached) / reached`` (None when its
        ``search.json`` does not say how far it got)."""
        assert self.search is not None
        try:
            known = search_decisions(self.dir.trial(trial_id)) or {}
        except Damaged as exc:
            self.warnings.append(f"{exc}: what its pruning saved is not counted")
            return None
        last = (known.get("rungs") or [{}])[-1]
        reached = number(last.get("reached")) if isinstance(last, dict) else None
        if reached is None or reached <= 0:
            return None
        return max(0.0, self.search.max_resource - reached) / reached

    def commits(self, trial_id: str) -> list[float]:
        """When each checkpoint of the trial was committed (its journal; [] without one)."""
        return self._times(self.dir.checkpoint_journal(trial_id))

    def reports(self, trial_id: str) -> list[float]:
        """When the trial reported metrics (``metrics.jsonl``; [] without one)."""
        return self._times(os.path.join(self.dir.trial(trial_id), "metrics.jsonl"))

    def _times(self, path: str) -> list[float]:
        """The ``time`` of each line of a JSON-lines file; damaged lines warned of."""
        try:
            with open(path, "rb") as fh:
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return []
        out, bad = commit_times(text)
        if bad:
            self.warnings.append(f"{path}: {bad} damaged line(s) left out")
        return out


def _read(sweep: SweepDir, warnings: list[str]) -> _Sweep:
    config = store.config(sweep, warnings)
    # the records of every backend that submits Slurm arrays (slurm, submitit) have this shape
    tasks = {
        (job["job_id"], task): job["offset"] + task
        for record in store.submissions(sweep, warnings)
        for job in record.get("jobs", [])
        for task in expand_array_spec(job["array"])
    }
    labels = config.get("labels")
    labels = labels if isinstance(labels, dict) else {}
    name = config.get("name") if isinstance(config.get("name"), str) else None
    return _Sweep(
        sweep,
        name or os.path.basename(sweep.root),
        {str(k): str(v) for k, v in labels.items()},
        store.manifest(sweep, warnings),
        tasks,
        warnings,
        of_config(config, sweep.sweep_json, warnings),
    )


def _from_comments(
    rows: list[Row], prices: dict[str, float], now: float, since: float | None, warnings: list[str]
) -> list[SweepReport]:
    """--since: the jobs' sweep directories, from their comments; jobs of a directory that is
    gone, and jobs without slurmkit's comment, from accounting alone."""
    by_dir: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        where = row.comment[len(COMMENT_PREFIX) :] if row.comment.startswith(COMMENT_PREFIX) else ""
        by_dir[where].append(row)
    out = []
    for where, found in by_dir.items():
        if not where:
            continue
        sweep = SweepDir(where)
        if sweep.exists():
            read = _read(sweep, warnings)
            out.append(read.report(found, prices, now, since))
            known = set(read.jobs)
            strays = sorted({r.job for r in found if r.job not in known})
            if strays:
                warnings.append(
                    f"{where}: jobs {', '.join(strays)} name it but no submission record "
                    "holds them: left out"
                )
        else:
            warnings.append(
                f"{where}: no sweep directory there now: its jobs from accounting alone"
            )
            out.append(_jobs_only(where, os.path.basename(where), found, prices, now))
    if by_dir.get(""):
        out.append(_jobs_only("", OTHER_JOBS, by_dir[""], prices, now))
    return out


def _jobs_only(
    where: str, name: str, rows: list[Row], prices: dict[str, float], now: float
) -> SweepReport:
    """A "sweep" of jobs known to accounting alone: one trial per job (array task)."""
    by_ref: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        by_ref[row.ref].append(row)
    trials = []
    for ref, found in by_ref.items():
        state = trial_state(None, found)
        trials.append(
            TrialReport(None, ref, state, join_trial(found, [], state, list, prices, now))
        )
    return SweepReport(where, name, {}, trials, figures(trials))


# --------------------------------------------------------------------------- #
# Figures: pure functions of the joined trials
# --------------------------------------------------------------------------- #


def figures(trials: Sequence[TrialReport]) -> dict[str, Any]:
    """The numbers of a set of trials: states, failure rate, attempts by cause, queue delay,
    run time, unit-hours useful / lost / running and where they went (with the ETTR), cost
    and cost per successful trial."""
    attempts = [a for t in trials for a in t.attempts]
    counts = Counter(t.state for t in trials)
    successful = counts[states.COMPLETED]
    pruned = counts[states.PRUNED]  # ended as the search asked: neither success nor failure
    failed = sum(n for s, n in counts.items() if s in states.UNSUCCESSFUL)
    causes = Counter(a.cause for a in attempts if a.cause)
    queue = sorted(a.queue_s for a in attempts if a.queue_s is not None)
    spend: dict[str, dict[str, float] | None] = {}
    for unit in ("gpu", "cpu"):  # None: no attempt had an allocation of them (no accounting)
        mine = [a for a in attempts if a.unit == unit and a.units]
        spend[f"{unit}_hours"] = (
            {
                "useful": sum(a.useful_hours for a in mine),
                "lost": sum(a.lost_hours for a in mine),
                "running": sum(a.running_hours for a in mine),
            }
            if mine
            else None
        )
    split = {f"{unit}_goodput": goodput.summary(attempts, unit) for unit in ("gpu", "cpu")}
    main = split["gpu_goodput"] or split["cpu_goodput"]
    ettr = main["ettr"] if main else None
    unpriced = sorted({a.partition for a in attempts if a.cost is None})
    accounted = any(a.units for a in attempts)
    cost = sum(a.cost or 0.0 for a in attempts) if accounted and not unpriced else None
    return {
        "trials": len(trials),
        "states": {s: counts[s] for s in states.ORDER if counts[s]},
        "successful": successful,
        "failed": failed,
        "failure_rate": failed / (successful + pruned + failed)
        if successful + pruned + failed
        else None,
        "attempts": len(attempts),
        "causes": {c: causes[c] for c in CAUSES if causes[c]},
        "outcomes": dict(Counter(a.outcome for a in attempts)),
        "queue_delay_s": {
            "median": _quantile(queue, 0.5),
            "p90": _quantile(queue, 0.9),
            "max": queue[-1] if queue else None,
            "total": sum(queue),
        },
        "run_s": sum(a.run_s or 0.0 for a in attempts),
        **spend,
        **split,
        "ettr": ettr,
        "cost": cost,
        "cost_per_success": cost / successful if cost is not None and successful else None,
        "unpriced": unpriced,
        "blamed": dict(Counter(node for a in attempts for node in a.blamed).most_common()),
        **({"search": saved(trials)} if any(t.searched for t in trials) else {}),
    }


def saved(trials: Sequence[TrialReport]) -> dict[str, Any]:
    """What the search saved against running every trial of a search sweep to max_resource:
    per pruned trial, its run time and unit-hours times its ``unrun``. ``spent`` is what the
    search sweeps' trials used; ``share`` the saved part of spent + saved."""
    searched = [t for t in trials if t.searched]
    pruned = [t for t in searched if t.state == states.PRUNED]
    out: dict[str, Any] = {
        "pruned": len(pruned),
        "unestimated": sum(1 for t in pruned if t.unrun is None),
    }
    for key, spend in (
        ("run_s", lambda a: a.run_s or 0.0),
        ("gpu_hours", lambda a: _total(a) if a.unit == "gpu" else 0.0),
        ("cpu_hours", lambda a: _total(a) if a.unit == "cpu" else 0.0),
    ):
        spent = sum(spend(a) for t in searched for a in t.attempts)
        gain = sum((t.unrun or 0.0) * sum(spend(a) for a in t.attempts) for t in pruned)
        if key == "run_s" or spent:
            share = gain / (spent + gain) if spent + gain else None
            out[key] = {"saved": gain, "spent": spent, "share": share}
        else:
            out[key] = None  # no allocation of that unit (no accounting)
    return out


def _total(a: Attempt) -> float:
    return a.useful_hours + a.lost_hours + a.running_hours


def groups(sweeps: Sequence[SweepReport], by: str) -> list[tuple[str, dict[str, Any]]]:
    """The figures per account or user (of each trial's last attempt) or per label."""
    members: dict[str, list[TrialReport]] = defaultdict(list)
    for sweep in sweeps:
        for trial in sweep.trials:
            members[group_key(sweep, trial, by)].append(trial)
    return [(key, figures(members[key])) for key in sorted(members)]


def group_key(sweep: SweepReport, trial: TrialReport, by: str) -> str:
    if by == "label":
        return ",".join(f"{k}={v}" for k, v in sorted(sweep.labels.items())) or "(none)"
    if by.startswith("label."):
        return sweep.labels.get(by[len("label.") :], "(none)")
    last = next((a for a in reversed(trial.attempts) if a.job), None)
    value = getattr(last, by) if last is not None else ""
    return value or "(unknown)"


def _quantile(ordered: Sequence[float], q: float) -> float | None:
    """The nearest-rank quantile of sorted values."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def _epoch(local: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(local).timestamp()
