"""bench/asha_replay.py: the replay of a search on a finished grid's curves, on curves whose
outcome is known (the trials' own decision function, asynchronous arrival order)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from slurmkit.core import search

spec = importlib.util.spec_from_file_location(
    "asha_replay", Path(__file__).resolve().parent.parent / "bench" / "asha_replay.py"
)
assert spec is not None and spec.loader is not None
replay_mod = importlib.util.module_from_spec(spec)
sys.modules["asha_replay"] = replay_mod  # its dataclasses look their module up
spec.loader.exec_module(replay_mod)

SEARCH = search.Search.from_dict(
    {"metric": "val_loss", "min_resource": 1, "max_resource": 9, "reduction_factor": 3}, "test"
)


def curves() -> list:
    """9 trials, ``q + 1/k``: trial q is the q-th best at every step; 1 s epochs."""
    return [
        replay_mod.Curve(f"t{q}", {k: q + 1 / k for k in range(1, 10)}, 0.0, 0.5, 1.0)
        for q in range(9)
    ]


def test_best_first_prunes_every_later_trial_at_the_first_rung():
    out = replay_mod.replay(curves(), SEARCH, 1, list(range(9)))
    assert out.completed == {"t0": 1 / 9}
    assert out.epochs == 9 + 8  # the best runs to the end, every other one epoch
    assert out.run_s == 9 * 0.5 + out.epochs * 1.0


def test_worst_first_keeps_every_trial_that_beats_those_before_it():
    out = replay_mod.replay(curves(), SEARCH, 1, list(range(8, -1, -1)))
    assert sorted(out.completed) == [f"t{q}" for q in range(9)]
    assert out.epochs == 81


def test_parallel_slots_judge_against_the_records_made_so_far():
    # two slots, best first: t0 and t1 report epoch 1 together (t0 first by the heap's order:
    # same time, lower index); t1 is then judged against t0 and pruned
    out = replay_mod.replay(curves(), SEARCH, 2, list(range(9)))
    assert out.completed == {"t0": 1 / 9}
    assert out.epochs == 9 + 8
