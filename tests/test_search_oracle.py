"""The search's rule against Optuna's SuccessiveHalvingPruner itself (optuna 5.0.0, pinned in
the dev extra), on random interleavings of random learning curves (hypothesis).

Ours is the whole trial side (runtime/pruning.py's per-trial state over core/search.py's records
and decision, on a real directory); Optuna's is an in-memory study with
``SuccessiveHalvingPruner(min_resource, reduction_factor, min_early_stopping_rate=0,
bootstrap_count=0)``, one ``trial.report(value, step)`` then ``trial.should_prune()`` per
report. The oracle is wrapped for the one difference we chose:

- no rung at or past ``max_resource`` (Optuna has no maximum: its rungs go on). A prune that
  Optuna decides at such a rung counts as "continue" (read from the rung keys Optuna records in
  the trial's system attributes).

Everything else is Optuna's: the best ``max(1, n // reduction_factor)`` of the n values at the
rung continue, its own included, ties kept; a trial is judged at each report at or past a rung
not yet judged, once per rung passed (with that report's value); NaN is pruned at a rung and is
not recorded. A pruned trial reports no more (ours raises Pruned; the caller stops).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import tempfile
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import slurmkit
from slurmkit.core import search
from slurmkit.runtime import pruning

SCRATCH = "/dev/shm" if os.path.isdir("/dev/shm") else None  # many small writes: no disk


def _optuna():  # imported when a test runs (~0.6 s: not in every xdist worker's collection)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


VALUES = st.one_of(
    st.integers(-3, 3).map(float),  # ties
    st.floats(allow_nan=False, allow_infinity=False, width=64),
    st.sampled_from([math.nan, math.inf, -math.inf]),
)


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    rf = draw(st.integers(2, 4))
    low = draw(st.integers(1, 3))
    high = draw(st.integers(low + 1, low * rf**3 + 2))
    n = draw(st.integers(1, 12))
    curves = []
    for _ in range(n):
        step = draw(st.integers(0, 2))
        curve = []
        for _ in range(draw(st.integers(1, 7))):
            curve.append((step, draw(VALUES)))
            step += draw(st.integers(1, 5))
        curves.append(curve)
    order = draw(st.permutations([i for i, c in enumerate(curves) for _ in c]))
    return {
        "search": search.Search(
            metric="loss",
            max_resource=high,
            mode=draw(st.sampled_from(["min", "max"])),
            min_resource=low,
            reduction_factor=rf,
        ),
        "curves": curves,
        "order": order,
    }


class Oracle:
    """Optuna's pruner, wrapped for max_resource."""

    def __init__(self, s: search.Search, n: int) -> None:
        optuna = _optuna()
        self.s = s
        pruner = optuna.pruners.SuccessiveHalvingPruner(
            min_resource=s.min_resource,
            reduction_factor=s.reduction_factor,
            min_early_stopping_rate=0,
            bootstrap_count=0,
        )
        direction = "minimize" if s.mode == "min" else "maximize"
        self.study = optuna.create_study(direction=direction, pruner=pruner)
        self.trials = [self.study.ask() for _ in range(n)]

    def _rungs_done(self, i: int) -> int:
        attrs = self.study._storage.get_trial(self.trials[i]._trial_id).system_attrs
        return sum(1 for k in attrs if k.startswith("completed_rung_"))

    def report(self, i: int, step: int, value: float) -> bool:
        """Whether trial ``i`` is pruned by this report (at a rung below max_resource)."""
        trial = self.trials[i]
        trial.report(value, step)
        if not trial.should_prune():
            return False
        rung = self._rungs_done(i) - (0 if math.isnan(value) else 1)
        return self.s.min_resource * self.s.reduction_factor**rung < self.s.max_resource

    def rung_values(self, k: int) -> dict[str, float]:
        out = {}
        for i, t in enumerate(self.trials):
            attrs = self.study._storage.get_trial(t._trial_id).system_attrs
            if f"completed_rung_{k}" in attrs:
                out[f"t{i}"] = attrs[f"completed_rung_{k}"]
        return out


def ours(s: search.Search, root: str, i: int, step: int, value: float, states: dict) -> bool:
    state = states.get(i)
    if state is None:
        state = states[i] = pruning.TrialSearch(s, f"{root}/trials/t{i}", 0)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            state.check(step, {"loss": value})
    except slurmkit.Pruned:
        return True
    return False


def same_as_optuna(case: dict) -> None:
    s, curves = case["search"], case["curves"]
    oracle = Oracle(s, len(curves))
    with tempfile.TemporaryDirectory(prefix="slurmkit-oracle-", dir=SCRATCH) as root:
        for i in range(len(curves)):
            os.makedirs(f"{root}/trials/t{i}")
        states: dict = {}
        done: set[int] = set()
        seen = [0] * len(curves)
        for i in case["order"]:
            step, value = curves[i][seen[i]]
            seen[i] += 1
            if i in done:
                continue  # pruned: it reports no more
            expected = oracle.report(i, step, value)
            got = ours(s, root, i, step, value, states)
            assert got == expected, (i, step, value)
            if got:
                done.add(i)
        for k in range(len(s.rungs())):
            assert search.rung_values(root, k) == pytest.approx(oracle.rung_values(k), nan_ok=True)


FAST = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(scenarios())
def test_the_rule_is_optunas(case: dict) -> None:
    same_as_optuna(case)


@pytest.mark.slow
@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_the_rule_is_optunas_on_many_more(case: dict) -> None:
    same_as_optuna(case)


def test_the_oracle_is_the_pinned_optuna() -> None:
    assert _optuna().__version__ == "5.0.0"  # the version the wrapper above was read against
