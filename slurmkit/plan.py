"""From a validated spec to a :class:`Plan`: its trials (stable ids), how each trial is launched,
and array chunks under MaxArraySize."""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from hashlib import sha256
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from . import launch
from .core import arrays
from .core.values import Choice, Distribution
from .errors import SpecError
from .spec import SweepSpec

if TYPE_CHECKING:
    import random

# json.dumps with these options, without building an encoder per call
_CANON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode
_ROW = json.JSONEncoder(ensure_ascii=False).encode
# what both encoders write for an int or a str (their own scalar paths, without the call)
_SCALAR = {int: int.__repr__, str: json.encoder.encode_basestring}


@dataclass(slots=True)
class Trial:
    """One point of the search space."""

    index: int
    id: str
    params: dict[str, Any]


class Trials(Sequence[Trial]):
    """All trials of a sweep, held column by column.

    ``ids`` and ``rows`` (the manifest lines) are built at once; a :class:`Trial` and its
    ``params`` dict only when asked for (a new one each time), since submitting 10,000 trials
    needs neither.
    """

    __slots__ = ("_values", "ids", "keys", "rows")

    def __init__(
        self, keys: list[str], ids: list[str], rows: list[str], values: list[list[Any]]
    ) -> None:
        self.keys, self.ids, self.rows, self._values = keys, ids, rows, values

    def __len__(self) -> int:
        return len(self.ids)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Trials):
            return self.rows == other.rows  # a row holds the index, id and parameters
        return isinstance(other, Sequence) and list(self) == list(other)

    @overload
    def __getitem__(self, index: int) -> Trial: ...
    @overload
    def __getitem__(self, index: slice) -> list[Trial]: ...

    def __getitem__(self, index: int | slice) -> Trial | list[Trial]:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        index = range(len(self))[index]  # IndexError, negative indices
        return Trial(
            index, self.ids[index], {k: column[index] for k, column in zip(self.keys, self._values)}
        )


class Plan(NamedTuple):
    """What one submission decides, once: the spec, its trials (``None`` when resuming: the
    sweep directory holds them), their count, and how each is launched (``sweep.json``'s
    ``launch``, from :func:`slurmkit.launch.build` in ``submit_dir``)."""

    spec: SweepSpec
    total: int
    launch: dict[str, list[str]]
    submit_dir: str
    trials: Trials | None = None


def make(spec: SweepSpec, trials: Trials, submit_dir: str) -> Plan:
    """The plan of a new sweep: its expanded ``trials``, launched from ``submit_dir``."""
    return Plan(spec, len(trials), launch.build(spec, submit_dir), submit_dir, trials)


def resumed(spec: SweepSpec, config: dict[str, Any], total: int, changed: bool) -> Plan:
    """The plan of a resume: the stored launch, or a new one when overrides ``changed`` the
    spec (in the sweep's own submit directory)."""
    submit_dir = config["submit_dir"]
    stored = config.get("launch") or {}
    return Plan(spec, total, launch.build(spec, submit_dir) if changed else stored, submit_dir)


class Chunk(NamedTuple):
    """One ``sbatch --array``: trial index = ``offset`` + array task id."""

    offset: int
    indices: tuple[int, ...]

    def array_spec(self, max_parallel: int | None = None) -> str:
        """``--array`` value, e.g. ``0-9,12%4`` (ranges compressed, relative to ``offset``)."""
        spec = arrays.compress([i - self.offset for i in self.indices])
        return f"{spec}%{max_parallel}" if max_parallel else spec


def count(spec: SweepSpec) -> int:
    """How many trials :func:`expand` makes, without making them."""
    return spec.num_samples * math.prod(
        len(d.values) for d in spec.params.values() if isinstance(d, Choice)
    )


def expand(spec: SweepSpec) -> Trials:
    """All trials: ``num_samples`` x the grid, random parameters drawn from ``seed``.

    The grid is the cartesian product in key order (first key varies slowest), exactly like
    Hydra's basic sweeper. A trial's id is stable: the first 12 hex digits of the SHA-256 of
    its parameters as ``json.dumps(params, sort_keys=True, separators=(",", ":"),
    ensure_ascii=False)``. Its manifest line is ``json.dumps({"index", "id", "params"},
    ensure_ascii=False)``. Trials are built column by column (a key's value in every trial), and
    both texts are joined from pieces encoded once per grid value.
    """
    keys = list(spec.params)
    grid = math.prod(len(d.values) for d in spec.params.values() if isinstance(d, Choice))
    total = spec.num_samples * grid
    rand_keys = [k for k in keys if isinstance(spec.params[k], Distribution)]
    draws: list[int | float] = []
    if rand_keys:
        import random  # ~2 ms: only random searches need it

        rng = random.Random(spec.seed)
        draws = [sample(spec.params[k], rng) for _ in range(total) for k in rand_keys]
    columns: dict[str, tuple[list[Any], list[str], list[str]]] = {}
    run = grid  # how many trials in a row share a value of the current grid key
    for k in keys:
        domain = spec.params[k]
        if isinstance(domain, Choice):
            run //= len(domain.values)
            times = total // (len(domain.values) * run)
            values, canon, row = _column(k, domain.values)
            columns[k] = (
                _tile(values, run, times),
                _tile(canon, run, times),
                _tile(row, run, times),
            )
        elif isinstance(domain, Distribution):
            columns[k] = _column(k, draws[rand_keys.index(k) :: len(rand_keys)])
        else:
            values, canon, row = _column(k, [domain])
            columns[k] = (values * total, canon * total, row * total)

    def per_trial(part: int, order: list[str]) -> Iterable[tuple[Any, ...]]:
        cols = [columns[k][part] for k in order]
        return zip(*cols) if cols else itertools.repeat((), total)

    ids = [
        sha256(("{" + ",".join(c) + "}").encode()).hexdigest()[:12]
        for c in per_trial(1, sorted(keys))
    ]
    rows = [
        f'{{"index": {index}, "id": "{tid}", "params": {{{", ".join(r)}}}}}'
        for index, tid, r in zip(itertools.count(), ids, per_trial(2, keys))
    ]
    trials = Trials(keys, ids, rows, [columns[k][0] for k in keys])
    if len(set(ids)) < total:
        seen: dict[str, int] = {}
        for index, tid in enumerate(ids):
            if tid in seen:
                raise SpecError(
                    f"trials {seen[tid]} and {index} have the same parameters "
                    f"{trials[index].params}",
                    file=spec.source,
                    key="params",
                    hint="remove repeated values from the search space",
                )
            seen[tid] = index
    return trials


def _column(key: str, values: Sequence[Any]) -> tuple[list[Any], list[str], list[str]]:
    """``values`` of ``key``, and their ``"key":value`` pieces of the canonical JSON and of a
    manifest row."""
    name = _ROW(key)
    canon, row = [], []
    for value in values:
        scalar = _SCALAR.get(type(value))
        text = scalar(value) if scalar is not None else None
        canon.append(f"{name}:{_CANON(value) if text is None else text}")
        row.append(f"{name}: {_ROW(value) if text is None else text}")
    return list(values), canon, row


def _tile(column: list[Any], run: int, times: int) -> list[Any]:
    """``column`` with each item ``run`` times in a row, the whole ``times`` times."""
    return (column if run == 1 else [x for x in column for _ in range(run)]) * times


def sample(dist: Distribution, rng: random.Random) -> int | float:
    """One draw: uniform in [low, high), log-uniform in [low, high), or an int in [low, high)."""
    if dist.name == "randint":
        return rng.randrange(int(dist.low), int(dist.high))
    if dist.name == "loguniform":
        return math.exp(rng.uniform(math.log(dist.low), math.log(dist.high)))
    return rng.uniform(dist.low, dist.high)


def chunks(indices: Iterable[int], max_array_size: int) -> list[Chunk]:
    """Group trial indices into arrays whose task ids stay below ``max_array_size``.

    Chunk ``c`` holds trial indices ``[c*M, (c+1)*M)`` with ``offset = c*M``, so a trial keeps
    the same chunk and array task id on every (re)submission.
    """
    if max_array_size < 1:
        raise ValueError("max_array_size must be positive")
    ordered = sorted(set(indices))
    out: list[Chunk] = []
    start = 0
    while start < len(ordered):
        offset = ordered[start] // max_array_size * max_array_size
        end = bisect.bisect_left(ordered, offset + max_array_size, start)
        out.append(Chunk(offset, tuple(ordered[start:end])))
        start = end
    return out
