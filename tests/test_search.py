"""core/search.py: the search spec, the rules, the rung records and a trial's decisions."""

from __future__ import annotations

import math
import os

import pytest

from slurmkit.core import search, states
from slurmkit.core.fsutil import Damaged
from slurmkit.core.search import Search


def asha(**kw: object) -> Search:
    base: dict[str, object] = {"metric": "val_loss", "max_resource": 27}
    return Search.from_dict({**base, **kw}, "sweep.json")


def test_pruned_is_a_final_state_that_is_no_failure() -> None:
    assert states.PRUNED in states.FINAL
    assert states.PRUNED in states.SUCCESS
    assert states.PRUNED not in states.UNSUCCESSFUL
    assert states.PRUNED in states.ORDER


def test_rungs_lie_below_max_resource() -> None:
    assert asha().rungs() == [1, 3, 9]
    assert asha(min_resource=2, max_resource=100, reduction_factor=4).rungs() == [2, 8, 32]
    assert asha(min_resource=1, max_resource=2, reduction_factor=2).rungs() == [1]
    assert asha(min_resource=0.5, max_resource=4.5, reduction_factor=3).rungs() == [0.5, 1.5]


def test_defaults_and_round_trip() -> None:
    s = asha()
    assert (s.method, s.mode, s.resource, s.min_resource, s.reduction_factor) == (
        "asha",
        "min",
        "step",
        1,
        3,
    )
    assert Search.from_dict(s.to_dict(), "x") == s


@pytest.mark.parametrize(
    ("raw", "key", "words"),
    [
        ({"max_resource": 9}, "metric", "required"),
        ({"metric": "loss"}, "max_resource", "required"),
        ({"metric": "loss", "max_resource": 9, "method": "hyperband"}, "method", "asha, median"),
        ({"metric": "loss", "max_resource": 9, "mode": "up"}, "mode", "min, max"),
        ({"metric": "loss", "max_resource": 9, "reduction_factor": 1}, "reduction_factor", ">= 2"),
        ({"metric": "loss", "max_resource": 9, "reduction_factor": 2.5}, "reduction_factor", ""),
        ({"metric": "loss", "max_resource": 9, "min_resource": 0}, "min_resource", "> 0"),
        ({"metric": "loss", "max_resource": 1, "min_resource": 3}, "max_resource", "> min"),
        ({"metric": "", "max_resource": 9}, "metric", "metric name"),
        ({"metric": "loss", "max_resource": 9, "eta": 3}, "eta", "allowed: method"),
    ],
)
def test_problems_name_the_key_and_what_it_allows(raw: dict, key: str, words: str) -> None:
    found = dict(search.problems(raw))
    assert key in found and words in found[key]
    with pytest.raises(Damaged, match=f"search.{key}"):
        Search.from_dict(raw, "sweep.json")


def test_keep_asha_keeps_the_best_share_ties_included() -> None:
    # 9 values, rf 3: the best 3 continue
    values = [float(v) for v in range(9)]
    assert [search.keep_asha(v, values, 3, "min") for v in values] == [True] * 3 + [False] * 6
    assert [search.keep_asha(v, values, 3, "max") for v in values] == [False] * 6 + [True] * 3
    # fewer than rf values: only the best continues
    assert search.keep_asha(1.0, [1.0, 2.0], 3, "min")
    assert not search.keep_asha(2.0, [1.0, 2.0], 3, "min")
    # ties with the last kept value are kept
    assert search.keep_asha(2.0, [1.0, 2.0, 2.0, 2.0, 5.0, 6.0], 3, "min")
    assert not search.keep_asha(math.nan, [1.0], 3, "min")


def test_keep_median() -> None:
    assert search.keep_median(5.0, [1.0, 2.0], "min")  # too few others: continue
    assert not search.keep_median(5.0, [1.0, 2.0, 3.0], "min")
    assert search.keep_median(2.0, [1.0, 2.0, 3.0], "min")
    assert search.keep_median(2.5, [1.0, 2.0, 3.0, 4.0], "min")
    assert not search.keep_median(2.4, [1.0, 2.0, 3.0, 4.0], "max")
    assert not search.keep_median(math.nan, [1.0, 2.0, 3.0], "min")


def test_decide_entry() -> None:
    s = asha()
    e = search.decide(s, 1, "t4", 4.0, 3, {f"t{i}": float(i) for i in range(9)})
    assert e["rung"] == 1 and e["resource"] == 3 and e["reached"] == 3
    assert (e["seen"], e["kept"], e["threshold"], e["decision"]) == (9, 3, 2.0, "pruned")
    e = search.decide(s, 0, "t0", 0.0, 1.5, {"t1": 1.0})
    assert (e["seen"], e["kept"], e["decision"]) == (2, 1, "continue")
    e = search.decide(s, 0, "t0", math.nan, 1, {"t1": 1.0})
    assert (e["value"], e["seen"], e["decision"]) == (None, 1, "pruned")
    m = asha(method="median")
    e = search.decide(m, 0, "t9", 9.0, 1, {f"t{i}": float(i) for i in range(4)}, best=0.5)
    assert (e["threshold"], e["kept"], e["decision"]) == (1.5, 3, "continue")


def test_record_names_round_trip_exactly() -> None:
    for v in (0.1, -0.0, 1e-300, 123456.789, math.inf, -math.inf):
        assert search.parse_name(search.record_name("ab~c", v)) == ("ab~c", v)
    assert search.parse_name(".tmp-0123") is None
    assert search.parse_name("garbage") is None
    assert search.parse_name("zz~t") is None


def test_record_and_rung_values(tmp_path) -> None:
    root = str(tmp_path)
    assert search.rung_values(root, 0) == {}
    search.record(root, 0, "a", 0.5)
    search.record(root, 0, "b", 0.25)
    search.record(root, 0, "a", 0.5)  # again (a requeued trial): one record
    search.record(root, 0, "c", math.nan)  # NaN competes with no one
    assert search.rung_values(root, 0) == {"a": 0.5, "b": 0.25}
    assert len(os.listdir(search.rung_dir(root, 0))) == 2
    search.record(root, 0, "a", 0.75)  # a resume that was not bit-exact: two records a while
    assert search.rung_values(root, 0, ("a", 0.75)) == {"a": 0.75, "b": 0.25}
    assert len(os.listdir(search.rung_dir(root, 0))) == 2  # its listing removed the older one
    open(os.path.join(search.rung_dir(root, 0), ".tmp-x"), "w").close()  # a rename to come
    assert search.rung_values(root, 0) == {"a": 0.75, "b": 0.25}


def test_decisions_are_written_once_per_rung(tmp_path) -> None:
    trial = str(tmp_path)
    assert search.decisions(trial) is None
    s = asha()
    first = search.decide(s, 0, "t", 1.0, 1, {})
    assert search.write_decision(trial, first) == {"rungs": [first], "pruned": False}
    again = {**search.decide(s, 0, "t", 9.0, 1, {"u": 1.0}), "decision": "pruned"}
    assert search.write_decision(trial, again)["rungs"] == [first]  # never re-decided
    pruned = search.decide(s, 1, "t", 9.0, 3, {"u": 1.0})
    out = search.write_decision(trial, pruned)
    assert out == {"rungs": [first, pruned], "pruned": True}
    assert search.decisions(trial) == out
    (tmp_path / "search.json").write_text("[]")
    with pytest.raises(Damaged):
        search.decisions(trial)


def test_pruned_is_exported_and_exits_zero() -> None:
    import slurmkit
    from slurmkit.runtime.report import Pruned

    assert slurmkit.Pruned is Pruned
    err = Pruned("pruned at rung 0")
    assert isinstance(err, SystemExit) and not isinstance(err, Exception)
    assert err.code == 0 and str(err) == "pruned at rung 0"


SPEC = "command: [python, x.py]\nparams: {q: [1, 2]}\n"


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        ("search: {max_resource: 9}", "search.metric", "required"),
        ("search: {metric: loss}", "search.max_resource", "required"),
        ("search: {metric: loss, max_resource: 9, method: pbt}", "search.method", "asha, median"),
        ("search: {metric: loss, max_resource: 9, mode: up}", "search.mode", "min, max"),
        ("search: {metric: loss, max_resource: 9, eta: 2}", "search", "allowed keys"),
        ("search: {metric: loss, max_resource: 9, reduction_factor: 1}", "search.reduction", ">="),
        ("search: {metric: loss, max_resource: 0.5}", "search.max_resource", "> min_resource"),
        ("search: asha", "search", "mapping"),
    ],
)
def test_the_spec_names_file_key_and_allowed_values(spec_file, body, key, words) -> None:
    from slurmkit import spec as spec_mod
    from slurmkit.errors import SpecError

    path = spec_file(SPEC + body + "\n")
    with pytest.raises(SpecError) as err:
        spec_mod.load(str(path))
    text = str(err.value)
    assert str(path) in text and key in text and words in text, text


def test_the_spec_carries_the_search_to_sweep_json(spec_file) -> None:
    from slurmkit import spec as spec_mod

    body = SPEC + "search: {metric: val_loss, max_resource: 27, mode: max}\n"
    loaded = spec_mod.load(str(spec_file(body)))
    assert loaded.search == Search(metric="val_loss", max_resource=27, mode="max")
    again = spec_mod.from_dict(loaded.to_dict(), "sweep.json")
    assert again.search == loaded.search
    assert spec_mod.load(str(spec_file(SPEC))).search is None
