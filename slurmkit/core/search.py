"""Early stopping without a driver: the search spec, its decision rule and its files (stdlib only:
the trial's runtime, its ``report()`` and the login side's ``status``/``results`` all read them).

The spec's ``search`` block (:class:`Search`) names a metric, a direction and a resource (the
reported ``step``, or another reported key); its rungs lie at ``min_resource *
reduction_factor**k`` below ``max_resource``. A trial is judged once at each rung, at its first
report at or past the rung, by the pure rules :func:`keep_asha` (asynchronous successive halving,
Optuna's ``SuccessiveHalvingPruner`` rule) and :func:`keep_median`.

Files, on the shared filesystem, none of them appended to and no lock held::

    SWEEP/search/rung-K/VALUE~TRIAL_ID   one empty file per trial judged at rung K: the value
                                         (``float.hex``) and the trial in its name, so that a
                                         decision reads one directory listing, no file
    SWEEP/trials/ID/search.json          the trial's decisions, one per rung, written (whole,
                                         atomically) before a decision takes effect

A decision's record is created (a temporary name renamed into place) before the listing it is
judged on is read: each decision is then right for an order of the records it saw in which its
own came last, whatever other trials do at the same time.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

from .fsutil import Damaged, atomic_write_json, read_record
from .record import record as record_type  # `record` below is a rung record

METHODS = ("asha", "median")
MODES = ("min", "max")
SEARCH_DIR = "search"  # under the sweep directory
DECISIONS = "search.json"  # in a trial's directory
CONTINUE, PRUNED = "continue", "pruned"
# method median judges a trial only once this many other trials have a value at the rung
# (Ray Tune's MedianStoppingRule default, min_samples_required=3)
MEDIAN_MIN_OTHERS = 3
_SEP = "~"  # between the value and the trial id in a record's name (never in float.hex)


@record_type
class Search:
    """The spec's ``search`` block, validated (spec/check.py says what each key allows)."""

    metric: str
    max_resource: float
    method: str = "asha"
    mode: str = "min"
    resource: str = "step"
    min_resource: float = 1
    reduction_factor: int = 3

    def rungs(self) -> list[float]:
        """The resources at which a trial is judged: ``min_resource * reduction_factor**k``,
        below ``max_resource`` (a trial that reached ``max_resource`` is not judged again)."""
        out: list[float] = []
        r = self.min_resource
        while r < self.max_resource:
            out.append(r)
            r = self.min_resource * self.reduction_factor ** len(out)
        return out

    def to_dict(self) -> dict[str, Any]:
        """As JSON (the keys :meth:`from_dict` reads)."""
        return {name: getattr(self, name) for name in _KEYS}

    @classmethod
    def from_dict(cls, raw: Any, source: str) -> Search:
        """The search in ``raw`` (read from ``source``); Damaged naming the key otherwise. The
        spec's own check (with the user's file and line) is in slurmkit/spec/check.py."""
        if not isinstance(raw, Mapping):
            raise Damaged(source, f"search: expected a mapping, got {type(raw).__name__}")
        why = problems(raw)
        if why:
            raise Damaged(source, f"search.{why[0][0]}: {why[0][1]}")
        return cls(**{k: raw[k] for k in _KEYS if k in raw})


_KEYS = (
    "method",
    "metric",
    "mode",
    "resource",
    "min_resource",
    "max_resource",
    "reduction_factor",
)
REQUIRED = ("metric", "max_resource")


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def problems(raw: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What is wrong with a ``search`` mapping, as ``(key, what it allows)`` pairs (none: it is
    valid). Used by the spec's check (which adds file and line) and by :meth:`Search.from_dict`."""
    out = [(k, f"unknown key; allowed: {', '.join(_KEYS)}") for k in raw if k not in _KEYS]
    out += [(k, "required") for k in REQUIRED if raw.get(k) is None]
    if raw.get("method", "asha") not in METHODS:
        out.append(("method", f"{raw['method']!r} is not one of {', '.join(METHODS)}"))
    if raw.get("mode", "min") not in MODES:
        out.append(("mode", f"{raw['mode']!r} is not one of {', '.join(MODES)}"))
    for key in ("metric", "resource"):
        if key in raw and not (isinstance(raw[key], str) and raw[key]):
            out.append((key, f"{raw[key]!r}: expected a metric name (a reported key)"))
    low, high = raw.get("min_resource", 1), raw.get("max_resource")
    if not (_number(low) and low > 0):
        out.append(("min_resource", f"{low!r}: expected a number > 0"))
    elif high is not None and not (_number(high) and high > low):
        out.append(("max_resource", f"{high!r}: expected a number > min_resource ({low})"))
    rf = raw.get("reduction_factor", 3)
    if not (isinstance(rf, int) and not isinstance(rf, bool) and rf >= 2):
        out.append(("reduction_factor", f"{rf!r}: expected a whole number >= 2"))
    return out


# --- the rules (pure) ---------------------------------------------------------------------


def kept(n: int, reduction_factor: int) -> int:
    """How many of ``n`` values at a rung continue: ``max(1, n // reduction_factor)``."""
    return max(1, n // reduction_factor)


def _better_or_equal(a: float, b: float, mode: str) -> bool:
    return a <= b if mode == "min" else a >= b


def asha_threshold(values: Sequence[float], reduction_factor: int, mode: str) -> float:
    """The worst value that still continues among ``values`` (non-empty): the
    ``kept(len(values))``-th best."""
    ranked = sorted(values, reverse=mode == "max")
    return ranked[kept(len(ranked), reduction_factor) - 1]


def keep_asha(value: float, values: Sequence[float], reduction_factor: int, mode: str) -> bool:
    """Successive halving's rule: ``value`` continues iff it is within the best
    ``kept(len(values))`` of ``values`` (the rung's values, its own included), ties kept.
    NaN never continues (and is never among ``values``)."""
    if math.isnan(value):
        return False
    return _better_or_equal(value, asha_threshold(values, reduction_factor, mode), mode)


def median(values: Sequence[float]) -> float:
    """The median (the mean of the middle two of an even count)."""
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def keep_median(best: float, others: Sequence[float], mode: str) -> bool:
    """The median stopping rule: a trial whose ``best`` value so far is worse than the median of
    the ``others``' values at the same rung stops; with fewer than :data:`MEDIAN_MIN_OTHERS`
    others it continues. NaN never continues."""
    if math.isnan(best):
        return False
    if len(others) < MEDIAN_MIN_OTHERS:
        return True
    return _better_or_equal(best, median(others), mode)


def decide(
    search: Search,
    k: int,
    trial_id: str,
    value: float,
    reached: float,
    values: Mapping[str, float],
    best: float | None = None,
) -> dict[str, Any]:
    """The decision at rung ``k`` of ``trial_id``, whose report at resource ``reached`` gave
    ``value`` (``best``: its best value so far, for the median rule; ``value`` when None),
    given ``values``: the rung's records it saw (trial id -> value; its own is set to ``value``).

    The result is the rung's entry of ``search.json``: ``rung``, ``resource`` (the rung's),
    ``reached``, ``value`` (null for NaN), ``seen`` (values at the rung, its own included),
    ``kept`` (how many of them continue by the rule: ``kept(seen)`` for asha, those no worse
    than the median for median, itself by its best), ``threshold`` (the value to match; null
    when none applied), ``decision`` (``continue``/``pruned``) and ``at`` (epoch seconds)."""
    nan = math.isnan(value)
    others = [v for t, v in values.items() if v == v and t != trial_id]  # v == v: not NaN
    pool = others if nan else [*others, value]
    limit: float | None = None
    if search.method == "median":
        if len(others) >= MEDIAN_MIN_OTHERS:
            limit = median(others)
        keep = not nan and keep_median(value if best is None else best, others, search.mode)
        n_kept = (
            len(pool)
            if limit is None
            else sum(_better_or_equal(v, limit, search.mode) for v in others) + keep
        )
    else:  # keep_asha, with its threshold kept for the record
        n_kept = kept(len(pool), search.reduction_factor)
        if pool:
            limit = asha_threshold(pool, search.reduction_factor, search.mode)
        keep = not nan and limit is not None and _better_or_equal(value, limit, search.mode)
    return {
        "rung": k,
        "resource": search.rungs()[k],
        "reached": reached,
        "value": None if nan else value,
        "seen": len(pool),
        "kept": n_kept,
        "threshold": limit,
        "decision": CONTINUE if keep else PRUNED,
        "at": time.time(),
    }


# --- rung records ------------------------------------------------------------------------


def rung_dir(sweep_dir: str, k: int) -> str:
    """``SWEEP/search/rung-K``."""
    return os.path.join(sweep_dir, SEARCH_DIR, f"rung-{k}")


def record_name(trial_id: str, value: float) -> str:
    """A record's file name: ``float.hex(value)~trial_id`` (exact, and parsed back without a
    read)."""
    return f"{float(value).hex()}{_SEP}{trial_id}"


def parse_name(name: str) -> tuple[str, float] | None:
    """``(trial_id, value)`` of a record's file name; None for anything else (temporary files)."""
    value, sep, trial_id = name.partition(_SEP)
    if not sep or not trial_id or name.startswith("."):
        return None
    try:
        return trial_id, float.fromhex(value)
    except ValueError:
        return None


def _listing(sweep_dir: str, k: int) -> list[str]:
    try:
        return os.listdir(rung_dir(sweep_dir, k))
    except FileNotFoundError:
        return []


def record(sweep_dir: str, k: int, trial_id: str, value: float) -> None:
    """Record ``value`` of ``trial_id`` at rung ``k``: an empty file created under a temporary
    name and renamed into place (no listing, no read). The same value again (a requeued trial,
    after a bit-exact resume) renames onto the same name: still one record. NaN is not recorded
    (others do not compete with it). A record of this trial with another value (a resume that
    was not bit-exact) is removed by the next :func:`rung_values` that names it as ``own``."""
    if math.isnan(value):
        return
    directory = rung_dir(sweep_dir, k)
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".tmp-{os.urandom(8).hex()}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    os.replace(tmp, os.path.join(directory, record_name(trial_id, value)))


def rung_values(sweep_dir: str, k: int, own: tuple[str, float] | None = None) -> dict[str, float]:
    """Every trial's value recorded at rung ``k``: one directory listing, no file read.
    ``own``: ``(trial_id, value)`` of the caller, just recorded; an older record of that trial
    with another value is removed, and the value returned for it is ``value``. (The loop is
    :func:`parse_name` inlined: at 10,000 records the parsing costs as much as the listing.)"""
    out: dict[str, float] = {}
    fromhex = float.fromhex
    mine = own[0] if own is not None else None
    for name in _listing(sweep_dir, k):
        text, sep, trial_id = name.partition(_SEP)
        if not sep or not trial_id or name[0] == ".":
            continue
        try:
            value = fromhex(text)
        except ValueError:
            continue
        if trial_id == mine and own is not None and name != record_name(*own):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(rung_dir(sweep_dir, k), name))
            continue
        out[trial_id] = value
    return out


# --- a trial's decisions -------------------------------------------------------------------


def decisions(trial_dir: str) -> dict[str, Any] | None:
    """The trial's ``search.json``: ``{"rungs": [...], "pruned": bool}``; None when there is
    none. Damaged when it is not such a record."""
    path = os.path.join(trial_dir, DECISIONS)
    data = read_record(path)
    if data is not None and not isinstance(data.get("rungs"), list):
        raise Damaged(path, "no list of rungs")
    return data


def write_decision(trial_dir: str, rung: Mapping[str, Any]) -> dict[str, Any]:
    """Add ``rung`` (a :func:`decide` entry) to the trial's ``search.json`` (written whole,
    atomically) and return the new record. A rung already decided keeps its decision: the new
    one is not written and the record is returned as it was."""
    current = decisions(trial_dir) or {"rungs": [], "pruned": False}
    if any(r.get("rung") == rung["rung"] for r in current["rungs"]):
        return current
    new = {
        **current,
        "rungs": [*current["rungs"], dict(rung)],
        "pruned": bool(current.get("pruned")) or rung["decision"] == PRUNED,
    }
    # A pruning is flushed to disk before it acts (the trial then ends PRUNED for good); a
    # "continue" lost with its host was never acted on beyond that host's process: the rung is
    # decided again on resume, as for a trial stopped before its decision.
    atomic_write_json(os.path.join(trial_dir, DECISIONS), new, fsync=new["pruned"])
    return new


def unprune(trial_dir: str) -> bool:
    """Let a pruned trial run again to its end (``sweep --resume --unprune``): its
    ``search.json`` keeps its rungs, says ``pruned: false`` and ``exempt: true`` (``report()``
    judges it no more). False when it was not pruned (nothing written). Its status file is the
    caller's: the runtime does not rerun a trial whose status says PRUNED."""
    current = decisions(trial_dir)
    if not current or not current.get("pruned"):
        return False
    new = {**current, "pruned": False, "exempt": True, "unpruned_at": time.time()}
    atomic_write_json(os.path.join(trial_dir, DECISIONS), new)
    return True
