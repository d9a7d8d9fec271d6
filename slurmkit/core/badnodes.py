"""A sweep's bad nodes: the failures attributed to nodes, and the nodes the sweep avoids.

Each attributed failure is one small JSON file, ``SWEEP/nodes/TRIAL-N.json`` (N: the attempt
that failed), written atomically by the trial's runtime: many trials fail at once without a lock
and without a lost update; everything else is aggregated on read (:func:`tally`).

A record: ``trial``, ``attempt``, ``time``, ``job``, ``nodes`` (the attempt's), ``blamed`` (the
nodes it was attributed to), ``kind`` (``ecc``, ``nccl``, ``no_gpu``, ``mount``, ``container``,
``selfcheck``, ``node_failure``, ``hang``, ``pattern``, ``exit_code``), ``evidence`` (the
matched line or the reason), ``exclude_after`` (the sweep's ``requeue.exclude_after``) and
``partition_nodes`` (how many nodes the partition had; None: unknown).

A node blamed by ``exclude_after`` failures is excluded from the sweep, but never more than
:data:`MAX_SHARE` of the partition (at least one node): a failure that every node shows is the
job's, not the nodes'. Of more candidates, those with the most failures (then the earliest) are
excluded. ``exclude_after: 0`` excludes nothing (the failures are still recorded and shown).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from .fsutil import atomic_write_json, read_json
from .jobcontract import DEFAULT_EXCLUDE_AFTER

DIR = "nodes"
# The share of the partition's nodes one sweep may exclude (at least one node).
MAX_SHARE = 0.25


def path(sweep_dir: str) -> str:
    """The directory of a sweep's node-failure records."""
    return os.path.join(sweep_dir, DIR)


def expand(nodelist: str) -> list[str]:
    """A Slurm host list as ``scontrol show hostnames`` lists it:
    ``gpu-[007-008,012],cpu1`` -> ``gpu-007 gpu-008 gpu-012 cpu1``."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]*(?:\[[^\]]*\][^,\[]*)*", nodelist):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            out.append(part)
            continue
        prefix, ranges, rest = m.groups()
        for item in ranges.split(","):
            lo, _, hi = item.partition("-")
            width = len(lo)
            for n in range(int(lo), int(hi or lo) + 1):
                out.extend(prefix + str(n).zfill(width) + tail for tail in expand(rest) or [""])
    return out


def record(sweep_dir: str, failure: dict[str, Any]) -> str:
    """Write one attributed failure (``failure["trial"]``, ``failure["attempt"]``); its path."""
    name = f"{failure['trial']}-{int(failure['attempt'])}.json"
    target = os.path.join(path(sweep_dir), name)
    os.makedirs(path(sweep_dir), exist_ok=True)
    atomic_write_json(target, failure, fsync=False)
    return target


def failures(sweep_dir: str) -> list[dict[str, Any]]:
    """The sweep's failure records, oldest first (a damaged or half-written one is skipped)."""
    try:
        names = sorted(os.listdir(path(sweep_dir)))
    except OSError:
        return []
    out = []
    for name in names:
        if not name.endswith(".json") or name.startswith("."):
            continue
        try:
            rec = read_json(os.path.join(path(sweep_dir), name))
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and isinstance(rec.get("blamed"), list):
            out.append(rec)
    return sorted(out, key=lambda r: float(r.get("time") or 0))


@dataclass
class Suspect:
    """A node blamed for at least one failure in a sweep."""

    node: str
    failures: int = 0
    trials: list[str] = field(default_factory=list)
    evidence: str = ""  # the latest failure's
    first: float = 0.0
    last: float = 0.0
    excluded: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "failures": self.failures,
            "trials": list(self.trials),
            "evidence": self.evidence,
            "first": self.first,
            "last": self.last,
            "excluded": self.excluded,
        }


def limit(records: Sequence[dict[str, Any]]) -> int:
    """How many nodes the sweep may exclude: MAX_SHARE of the largest partition size its
    records saw (at least one); one when none is known."""
    sizes = [int(r["partition_nodes"]) for r in records if r.get("partition_nodes")]
    return max(1, math.floor(max(sizes) * MAX_SHARE)) if sizes else 1


def tally(records: Sequence[dict[str, Any]]) -> list[Suspect]:
    """The suspects of a sweep's ``records`` (oldest first), each with its failure count and
    whether it is excluded; most failures first."""
    found: dict[str, Suspect] = {}
    for rec in records:
        when = float(rec.get("time") or 0)
        for node in dict.fromkeys(rec.get("blamed") or []):
            s = found.setdefault(node, Suspect(node, first=when))
            s.failures += 1
            s.last, s.evidence = when, str(rec.get("evidence") or "")
            if rec.get("trial") and rec["trial"] not in s.trials:
                s.trials.append(str(rec["trial"]))
    ranked = sorted(found.values(), key=lambda s: (-s.failures, s.first, s.node))
    after = _exclude_after(records)
    if after:
        for s in [s for s in ranked if s.failures >= after][: limit(records)]:
            s.excluded = True
    return ranked


def _exclude_after(records: Sequence[dict[str, Any]]) -> int:
    """The sweep's threshold: its latest record's (a resume may change it)."""
    for rec in reversed(records):
        value = rec.get("exclude_after")
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return DEFAULT_EXCLUDE_AFTER


def suspects(sweep_dir: str) -> list[Suspect]:
    """The sweep's suspect nodes (:func:`tally` of its records)."""
    return tally(failures(sweep_dir))


def excluded(sweep_dir: str) -> list[str]:
    """The node names excluded from this sweep (sorted)."""
    return sorted(s.node for s in suspects(sweep_dir) if s.excluded)


def for_trial(sweep_dir: str, trial_id: str) -> list[str]:
    """The nodes this trial's next attempt must avoid: the sweep's excluded nodes plus the
    nodes blamed for this trial's own earlier failures (sorted)."""
    return avoid(failures(sweep_dir), trial_id)


def avoid(records: Sequence[dict[str, Any]], trial_id: str) -> list[str]:
    """:func:`for_trial` of a sweep's ``records`` (pure)."""
    own = {n for r in records if r.get("trial") == trial_id for n in r.get("blamed") or []}
    return sorted(own | {s.node for s in tally(records) if s.excluded})


def widespread(records: Iterable[dict[str, Any]], kind: str, nodes: Sequence[str]) -> bool:
    """Whether failures of ``kind`` are the job's, not its nodes': blamed on more distinct nodes
    (with ``nodes``, this attempt's) than the sweep may exclude. A container or self-check that
    fails everywhere then fails the trial instead of excluding the cluster."""
    records = list(records)
    seen = {n for r in records if r.get("kind") == kind for n in r.get("blamed") or []}
    return len(seen | set(nodes)) > limit(records) + 1


def merged(*lists: Iterable[str]) -> list[str]:
    """Node names from several lists (each may hold Slurm host lists), once each, sorted."""
    return sorted({n for names in lists for item in names for n in expand(item)})


def across(sweeps: Sequence[tuple[str, Sequence[dict[str, Any]]]]) -> list[dict[str, Any]]:
    """Suspects across sweeps: ``(sweep name, its suspects as dicts)`` in; per node its
    failures, the sweeps that blamed it, how many of them exclude it, and the latest evidence
    (most failures first)."""
    found: dict[str, dict[str, Any]] = {}
    for name, rows in sweeps:
        for s in rows:
            row = found.setdefault(
                s["node"],
                {"node": s["node"], "failures": 0, "sweeps": [], "excluded_in": 0, "last": 0.0},
            )
            row["failures"] += int(s.get("failures") or 0)
            row["excluded_in"] += bool(s.get("excluded"))
            if name not in row["sweeps"]:
                row["sweeps"].append(name)
            if float(s.get("last") or 0) >= row["last"]:
                row["last"], row["evidence"] = float(s.get("last") or 0), s.get("evidence", "")
    return sorted(found.values(), key=lambda r: (-r["failures"], r["node"]))


def recent(output_root: str, since: float) -> list[dict[str, Any]]:
    """The suspects of the sweeps under ``output_root`` (its sweep directories, one level
    down) blamed since ``since`` (epoch seconds), across those sweeps (:func:`across`)."""
    try:
        names = sorted(os.listdir(output_root))
    except OSError:
        return []
    per_sweep = []
    for name in names:
        root = os.path.join(output_root, name)
        if not os.path.isdir(path(root)):
            continue
        records = failures(root)
        if any(float(r.get("time") or 0) >= since for r in records):
            per_sweep.append((name, [s.to_dict() for s in tally(records) if s.last >= since]))
    return across(per_sweep)
