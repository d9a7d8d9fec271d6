"""Expansion order (Hydra's basic sweeper as the oracle), stable ids, random search, chunking."""

from __future__ import annotations

import hashlib
import json

import pytest

from slurmkit import plan
from slurmkit import spec as spec_mod
from slurmkit.core import arrays
from slurmkit.errors import SpecError
from slurmkit.overrides import Choice, Distribution


def _load(spec_file, body, overrides=()):
    return spec_mod.load(str(spec_file(body)), list(overrides))


def test_grid_order_matches_hydra_basic_sweeper(spec_file):
    hydra_sweeper = pytest.importorskip("hydra._internal.core_plugins.basic_sweeper")
    overrides = ["a=1,2", "b=range(0,6,2)", "c=x,'y z'", "d=3"]
    s = _load(spec_file, "command: x\nparams: {}\n", [f"params.{o}" for o in overrides])
    ours = [t.params for t in plan.expand(s)]
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    batches = hydra_sweeper.BasicSweeper.split_arguments(
        parser.parse_overrides(overrides), max_batch_size=None
    )
    theirs = []
    for batch in batches[0]:
        parsed = parser.parse_overrides(list(batch))
        theirs.append({o.key_or_group: o.value() for o in parsed})
    assert ours == theirs
    assert len(ours) == 2 * 3 * 2


def test_ids_are_stable_and_distinct(spec_file):
    body = "command: x\nparams: {lr: [0.1, 0.01], n: 'range(1,4)'}\n"
    first = plan.expand(_load(spec_file, body))
    again = plan.expand(_load(spec_file, body))
    assert [t.id for t in first] == [t.id for t in again]
    assert len({t.id for t in first}) == 6
    # the id depends on the parameters only, not on their position in the sweep
    reordered = plan.expand(
        _load(spec_file, "command: x\nparams: {n: 'range(1,4)', lr: [0.1, 0.01]}\n")
    )
    assert {t.id for t in reordered} == {t.id for t in first}


def test_random_search_is_reproducible_and_in_bounds(spec_file):
    body = """
    command: x
    params: {lr: 'loguniform(1e-4, 1e-1)', n: 'randint(2, 5)', u: 'uniform(-1, 1)', g: [a, b]}
    num_samples: 50
    seed: 11
    """
    a = plan.expand(_load(spec_file, body))
    b = plan.expand(_load(spec_file, body))
    assert [t.params for t in a] == [t.params for t in b]
    assert len(a) == 100
    assert all(1e-4 <= t.params["lr"] < 1e-1 for t in a)
    assert {t.params["n"] for t in a} == {2, 3, 4}
    assert all(-1 <= t.params["u"] < 1 for t in a)
    c = plan.expand(_load(spec_file, body.replace("seed: 11", "seed: 12")))
    assert [t.params for t in c] != [t.params for t in a]


def trial_id(params):
    """The definition of a trial's stable id."""
    canon = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def _reference_expand(s):
    """expand() written plainly: trial by trial, json.dumps for ids and rows."""
    import itertools
    import random

    keys = list(s.params)
    grid = [k for k in keys if isinstance(s.params[k], Choice)]
    rng = random.Random(s.seed)
    out = []
    for _ in range(s.num_samples):
        for combo in itertools.product(*(s.params[k].values for k in grid)):
            point = dict(zip(grid, combo))
            params = {
                k: point[k]
                if k in point
                else plan.sample(s.params[k], rng)
                if isinstance(s.params[k], Distribution)
                else s.params[k]
                for k in keys
            }
            tid = trial_id(params)
            out.append(
                (
                    len(out),
                    tid,
                    params,
                    json.dumps(
                        {"index": len(out), "id": tid, "params": params}, ensure_ascii=False
                    ),
                )
            )
    return out


def test_expand_is_the_plain_definition():
    """expand() joins per-value JSON pieces, column by column: the same trials, ids and
    manifest rows as the trial-by-trial definition with json.dumps."""
    nested = {"b": [1, {"z": None, "a": 'q"x'}], "a": {"y": 2.5, "x": [True]}}
    params = {
        "lr": Choice((1e-5, 0.1, 1.0, -0.0, 3, -7, 10**20, float("inf"), float("nan"))),
        "optim.beta": Choice((True, False, None)),
        "name": Choice(("plain", "ünï", "日本", 'quo"te', "new\nline", "tab\t", "back\\", "")),
        "u": Distribution("uniform", 0.0, 1.0),
        "Zed": Choice((nested, [nested, []], {})),
        "fixed": {"k": ["v", 2]},
        "a.b.c": "ß",
        "r": Distribution("randint", 1, 10**6),
    }
    for keys, samples in [
        (list(params), 2),
        (["lr", "fixed"], 1),
        (["u", "a.b.c"], 5),
        ([], 1),
        (["name", "r", "optim.beta"], 3),
    ]:
        s = spec_mod.SweepSpec(
            name="t",
            command=("x",),
            params={k: params[k] for k in keys},
            num_samples=samples,
            seed=5,
        )
        trials = plan.expand(s)
        ours = [(t.index, t.id, t.params, row) for t, row in zip(trials, trials.rows)]
        assert repr(ours) == repr(_reference_expand(s))  # repr: nan == nan, -0.0 != 0.0
        assert all(t.id == trial_id(t.params) for t in trials)
        assert [t.index for t in trials[-2:]] == list(range(len(trials)))[-2:]


def test_trials_compare_like_lists(spec_file):
    a = plan.expand(_load(spec_file, "command: x\nparams: {a: [1, 2], b: 'range(0,3)'}\n"))
    again = plan.expand(_load(spec_file, "command: x\nparams: {a: [1, 2], b: 'range(0,3)'}\n"))
    other = plan.expand(_load(spec_file, "command: x\nparams: {a: [1, 3], b: 'range(0,3)'}\n"))
    assert a == again and a == list(again) and list(a) == again
    assert a != other and a != list(other) and a != a[:-1]


def test_duplicate_points_are_rejected(spec_file):
    with pytest.raises(SpecError, match="same parameters"):
        plan.expand(_load(spec_file, "command: x\nparams: {a: [1, 1]}\n"))


def test_chunks_keep_task_ids_under_max_array_size():
    chunks = plan.chunks(range(10), 4)
    assert [(c.offset, c.indices) for c in chunks] == [
        (0, (0, 1, 2, 3)),
        (4, (4, 5, 6, 7)),
        (8, (8, 9)),
    ]
    assert [c.array_spec(2) for c in chunks] == ["0-3%2", "0-3%2", "0-1%2"]
    sparse = plan.chunks([1, 2, 3, 9, 13], 5)
    assert [(c.offset, c.array_spec()) for c in sparse] == [(0, "1-3"), (5, "4"), (10, "3")]
    assert all(max(arrays.expand_array_spec(c.array_spec())) < 5 for c in sparse)


@pytest.mark.parametrize(
    "indices", [[0], [0, 1, 2], [0, 2, 4], [5, 6, 7, 10, 11, 20], list(range(1000))]
)
def test_compress_round_trips(indices):
    assert arrays.expand_array_spec(arrays.compress(indices)) == indices
    assert arrays.compress(reversed(indices)) == arrays.compress(indices + indices[:1])


def test_compress_sorts_and_drops_repeats():
    assert arrays.compress([9, 3, 1, 2, 2, 7, 8]) == "1-3,7-9"
    assert arrays.compress([]) == ""
