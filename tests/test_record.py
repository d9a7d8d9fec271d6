"""core.record against the library it replaces: each record class here has a twin made by
``dataclasses.dataclass`` from the same body, and both must behave alike."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import FrozenInstanceError, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from slurmkit.core.record import record


def body() -> dict:
    """The class body both twins are made from: every field option records support."""
    return {
        "__annotations__": {
            "name": "str",
            "size": "int",
            "tags": "list[str]",
            "note": "str",
            "cache": "dict",
            "weight": "float",
            "later": "int",
        },
        "__doc__": "A twin.",
        "size": 1,
        "tags": field(default_factory=list),
        "note": field(default="", compare=False, repr=False),
        "cache": field(default_factory=dict, hash=False),
        "weight": field(default=0.5, repr=False),
        "later": field(default=7, init=False),
    }


def twins(frozen: bool = True) -> tuple[type, type]:
    ours = record(frozen=frozen)(type("Twin", (), body()))
    theirs = dataclasses.dataclass(frozen=frozen)(type("Twin", (), body()))
    return ours, theirs


OURS, THEIRS = twins()
MUT_OURS, MUT_THEIRS = twins(frozen=False)
CALLS = [
    (("a",), {}),
    (("a", 2), {}),
    (("a",), {"size": 3, "tags": ["x"]}),
    ((), {"name": "b", "note": "n", "cache": {"k": 1}, "weight": 2.0}),
    (("a", 2, ["t"], "n", {}, 1.5), {}),
]
BAD_CALLS = [
    ((), {}),  # missing name
    (("a",), {"name": "b"}),  # twice
    (("a",), {"later": 3}),  # not an init field
    (("a",), {"nope": 1}),
    (("a", 2, [], "", {}, 1.0, 9), {}),  # too many
]


def state(obj: object) -> dict:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}  # type: ignore[arg-type]


@pytest.mark.parametrize(("args", "kwargs"), CALLS)
def test_construction_repr_and_fields_match_dataclass(args, kwargs):
    ours, theirs = OURS(*args, **kwargs), THEIRS(*args, **kwargs)
    assert state(ours) == state(theirs)
    assert repr(ours) == repr(theirs)
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)
    assert [f.name for f in dataclasses.fields(ours)] == [
        f.name for f in dataclasses.fields(theirs)
    ]
    assert OURS.__match_args__ == THEIRS.__match_args__
    assert dataclasses.is_dataclass(ours)


@pytest.mark.parametrize(("args", "kwargs"), BAD_CALLS)
def test_bad_calls_are_type_errors_as_for_dataclass(args, kwargs):
    with pytest.raises(TypeError):
        THEIRS(*args, **kwargs)
    with pytest.raises(TypeError):
        OURS(*args, **kwargs)


def test_default_factories_give_each_instance_its_own_value():
    a, b = OURS("a"), OURS("b")
    assert a.tags == [] and a.tags is not b.tags and a.cache is not b.cache


@given(
    st.tuples(st.text(max_size=3), st.integers(-2, 2), st.text(max_size=2), st.floats(0, 1)),
    st.tuples(st.text(max_size=3), st.integers(-2, 2), st.text(max_size=2), st.floats(0, 1)),
)
def test_equality_and_hash_match_dataclass(x, y):
    def pair(cls):
        return [cls(n, s, ["t"], note, {}, w) for n, s, note, w in (x, y)]

    (o1, o2), (t1, t2) = pair(OURS), pair(THEIRS)
    assert (o1 == o2) == (t1 == t2)  # note is compare=False
    assert (o1 != o2) == (t1 != t2)
    assert o1 != t1  # another class: never equal
    assert (o1.__eq__(t1), t1.__eq__(o1)) == (NotImplemented, NotImplemented)


def test_hash_follows_the_hash_and_compare_options():
    unhashable_cache = {"k": [1]}  # hash=False: its field is left out of the hash
    ours = OURS("a", 2, ["t"], "n", unhashable_cache, 1.0)
    theirs = THEIRS("a", 2, ["t"], "n", unhashable_cache, 1.0)
    with pytest.raises(TypeError):  # the list in tags is still hashed, as by dataclass
        hash(theirs)
    with pytest.raises(TypeError):
        hash(ours)
    assert hash(OURS("a", 2, (), "x", {}, 1.0)) == hash(OURS("a", 2, (), "y", {}, 1.0))
    assert hash(OURS("a", 2, (), "", {}, 1.0)) == hash(("a", 2, (), 1.0, 7))


def test_frozen_records_refuse_assignment_and_deletion():
    for obj in (OURS("a"), THEIRS("a")):
        with pytest.raises(FrozenInstanceError):
            obj.name = "b"
        with pytest.raises(FrozenInstanceError):
            del obj.name


def test_mutable_records_assign_and_are_unhashable_like_dataclass():
    ours, theirs = MUT_OURS("a"), MUT_THEIRS("a")
    ours.size = theirs.size = 5
    assert state(ours) == state(theirs)
    assert MUT_OURS.__hash__ is None and MUT_THEIRS.__hash__ is None


@record
class Picklable:
    """Pickle finds classes by module and name: this one is at module level."""

    name: str
    tags: list[str] = field(default_factory=list)


def test_replace_pickle_and_copy_keep_the_values():
    ours = OURS("a", 2, ["t"], "n", {"k": 1}, 1.5)
    changed = dataclasses.replace(ours, size=9)
    assert changed.size == 9 and state(changed) == {**state(ours), "size": 9}
    kept = Picklable("a", ["t"])
    assert pickle.loads(pickle.dumps(kept)) == kept
    deep = copy.deepcopy(ours)
    assert deep == ours and deep.tags is not ours.tags


def test_what_records_do_not_support_is_refused_at_once():
    with pytest.raises(TypeError, match="__post_init__"):
        record(type("P", (), {"__annotations__": {"a": "int"}, "__post_init__": lambda s: None}))
    with pytest.raises(TypeError, match="no record base"):
        record(type("Child", (OURS,), {"__annotations__": {"extra": "int"}, "extra": 0}))
    with pytest.raises(TypeError, match="keyword-only"):
        record(type("K", (), {"__annotations__": {"a": "int"}, "a": field(kw_only=True)}))
