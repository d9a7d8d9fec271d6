"""The trial's side of the sweep's search: ``report()`` judges the trial at each rung it reaches.

The runtime gives the trial its sweep's search (:class:`~slurmkit.core.search.Search`, from the
job contract) as ``SLURMKIT_SEARCH`` (JSON). :meth:`TrialSearch.check` runs in each
``report()``: between rungs it compares one number; at the first report at or past a rung not
yet decided it judges the trial (:func:`~slurmkit.core.search.decide` over the rung's
records), writes the decision in the trial's ``search.json`` and, when pruned, raises
:class:`~slurmkit.runtime.report.Pruned`.

Several processes (torchrun, srun tasks): rank 0 (``RANK``, else ``SLURM_PROCID`` in a step)
decides from its own value; every other rank, at the same report, waits for that rung's
decision in ``search.json`` (up to ``SLURMKIT_SEARCH_WAIT`` s, default 600) and follows it, so
all ranks stop at the same step. Every rank must therefore call ``report()`` at the same steps
with the same keys (another rank's value of the metric may be anything, ``None`` included).

State kept in the process (the decided rungs, the best value so far for ``median``) is read
back from ``search.json`` when the process starts: a requeued trial resuming past a decided
rung keeps its decision; one preempted before its decision was written decides on resume
(its rung record, same value after a bit-exact resume, is not created twice).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

from ..core import search as core
from ..core.search import Search

ENV = "SLURMKIT_SEARCH"  # the sweep's search, JSON (set by the runtime: trial.step)
ENV_WAIT = "SLURMKIT_SEARCH_WAIT"  # how long ranks > 0 wait for rank 0's decision
WAIT = 600.0


class TrialSearch:
    """One trial's search state in this process."""

    def __init__(self, search: Search, trial_dir: str, rank: int) -> None:
        self.search = search
        self.rungs = search.rungs()
        self.dir = trial_dir
        self.sweep = os.path.dirname(os.path.dirname(trial_dir))
        self.id = os.path.basename(trial_dir)
        self.rank = rank
        known = core.decisions(trial_dir) or {"rungs": []}
        self.decided = {int(r["rung"]): r for r in known["rungs"]}
        self.exempt = bool(known.get("exempt"))  # resumed with --unprune: never judged again
        self.pruned = bool(known.get("pruned")) and not self.exempt
        self.next = 0
        self._skip_decided()
        values = [r["value"] for r in known["rungs"] if isinstance(r.get("value"), (int, float))]
        self.best: float | None = _best(values, search.mode)

    def _skip_decided(self) -> None:
        while self.next in self.decided:
            self.next += 1

    def check(self, step: int | None, values: dict[str, Any]) -> None:
        """Judge this report (see the module's docstring); raise Pruned when pruned."""
        value: Any = values.get(self.search.metric)
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        if number and not math.isnan(value):
            self.best = _best([value] if self.best is None else [self.best, value], self.mode)
        if self.pruned:
            raise self._pruned(self._pruning_entry())
        if self.exempt or self.next >= len(self.rungs):
            return
        reached = step if self.search.resource == "step" else values.get(self.search.resource)
        if not isinstance(reached, (int, float)) or reached < self.rungs[self.next]:
            return  # between rungs: the whole cost of a report
        # judged at the first report that has the metric (rank 0: a number; another rank's
        # value is not used, the key is enough: it then waits for rank 0's decision)
        if not number and (self.rank == 0 or self.search.metric not in values):
            return
        while self.next < len(self.rungs) and reached >= self.rungs[self.next]:
            entry = self._decide(self.next, float(value) if number else math.nan, reached)
            self.decided[self.next] = entry
            self._skip_decided()
            if entry["decision"] == core.PRUNED:
                self.pruned = True
                raise self._pruned(entry)

    @property
    def mode(self) -> str:
        return self.search.mode

    def _decide(self, k: int, value: float, reached: float) -> dict[str, Any]:
        """Rung ``k``'s decision: rank 0 records, decides and writes it; other ranks wait."""
        if self.rank != 0:
            return self._await(k)
        core.record(self.sweep, k, self.id, value)
        seen = core.rung_values(self.sweep, k, (self.id, value))
        entry = core.decide(self.search, k, self.id, value, reached, seen, self.best)
        written = core.write_decision(self.dir, entry)
        return next(r for r in written["rungs"] if r["rung"] == k)  # an earlier one stands

    def _await(self, k: int) -> dict[str, Any]:
        wait = float(os.environ.get(ENV_WAIT) or WAIT)
        deadline = time.monotonic() + wait
        pause = 0.01
        while True:
            known = core.decisions(self.dir) or {"rungs": []}
            for r in known["rungs"]:
                if r.get("rung") == k:
                    return dict(r)
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"slurmkit: rank {self.rank} waited {wait:g} s ({ENV_WAIT}) in vain for "
                    f"rank 0's decision at rung {k} in {os.path.join(self.dir, core.DECISIONS)}"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.5)

    def _pruning_entry(self) -> dict[str, Any]:
        pruned = [r for r in self.decided.values() if r.get("decision") == core.PRUNED]
        return pruned[0] if pruned else {"rung": "?", "resource": "?"}

    def _pruned(self, entry: dict[str, Any]) -> BaseException:
        from .report import Pruned

        text = (
            f"slurmkit: trial pruned at rung {entry['rung']} (resource {entry['resource']}): "
            f"{self.search.metric} {entry.get('value')} not within the best {entry.get('kept')} "
            f"of {entry.get('seen')} (threshold {entry.get('threshold')})"
        )
        print(text, file=sys.stderr, flush=True)
        return Pruned(text)


def _best(values: list[float], mode: str) -> float | None:
    if not values:
        return None
    return min(values) if mode == "min" else max(values)


def rank_of(env: Mapping[str, str]) -> int:
    """This process's rank in the trial's step (0 when alone)."""
    if env.get("RANK"):
        return int(env["RANK"])
    if "SLURM_PROCID" in env and "SLURM_STEP_ID" in env:
        return int(env["SLURM_PROCID"] or 0)
    return 0


_STATE: dict[tuple[str, str], TrialSearch] = {}


def trial(trial_dir: str) -> TrialSearch | None:
    """This process's search state of ``trial_dir``; None when its sweep has no search."""
    raw = os.environ.get(ENV)
    if not raw:
        return None
    key = (raw, trial_dir)
    state = _STATE.get(key)
    if state is None:
        search = Search.from_dict(json.loads(raw), ENV)
        state = _STATE[key] = TrialSearch(search, trial_dir, rank_of(os.environ))
    return state


def forget() -> None:
    """Drop this process's search state (tests: a new process reads search.json again)."""
    _STATE.clear()
