"""From a validated spec to trials (stable ids) and to array chunks under MaxArraySize."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import random
from dataclasses import dataclass
from typing import Any, Iterable

from . import arrays
from .errors import SpecError
from .overrides import Distribution, Sweep
from .spec import SweepSpec


@dataclass(frozen=True)
class Trial:
    """One point of the search space."""

    index: int
    id: str
    params: dict[str, Any]

    def row(self) -> dict[str, Any]:
        return {"index": self.index, "id": self.id, "params": self.params}


@dataclass(frozen=True)
class Chunk:
    """One ``sbatch --array``: trial index = ``offset`` + array task id."""

    offset: int
    indices: tuple[int, ...]

    def array_spec(self, max_parallel: int | None = None) -> str:
        """``--array`` value, e.g. ``0-9,12%4`` (ranges compressed, relative to ``offset``)."""
        spec = arrays.compress([i - self.offset for i in self.indices])
        return f"{spec}%{max_parallel}" if max_parallel else spec


def trial_id(params: dict[str, Any]) -> str:
    """A stable id: the same parameters always give the same id."""
    canon = json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canon.encode()).hexdigest()[:12]


def expand(spec: SweepSpec) -> list[Trial]:
    """All trials: ``num_samples`` x the grid, random parameters drawn from ``seed``.

    The grid is the cartesian product in key order (first key varies slowest), exactly like
    Hydra's basic sweeper.
    """
    keys = list(spec.params)
    grid_keys = [k for k in keys if isinstance(spec.params[k], Sweep)]
    rand_keys = [k for k in keys if isinstance(spec.params[k], Distribution)]
    fixed = {k: v for k, v in spec.params.items() if k not in grid_keys and k not in rand_keys}
    rng = random.Random(spec.seed)
    trials: list[Trial] = []
    seen: dict[str, int] = {}
    for _ in range(spec.num_samples):
        for combo in itertools.product(*(spec.params[k].values for k in grid_keys)):
            point = dict(fixed)
            point.update(zip(grid_keys, combo))
            for k in rand_keys:
                point[k] = sample(spec.params[k], rng)
            params = {k: point[k] for k in keys}
            tid = trial_id(params)
            if tid in seen:
                raise SpecError(f"trials {seen[tid]} and {len(trials)} have the same parameters "
                                f"{params}", file=spec.source, key="params",
                                hint="remove repeated values from the search space")
            seen[tid] = len(trials)
            trials.append(Trial(len(trials), tid, params))
    return trials


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
    groups: dict[int, list[int]] = {}
    for i in sorted(set(indices)):
        groups.setdefault(i // max_array_size, []).append(i)
    return [Chunk(c * max_array_size, tuple(ix)) for c, ix in sorted(groups.items())]
