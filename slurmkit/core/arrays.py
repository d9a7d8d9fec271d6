"""Slurm array specs (``0-9,12,20-30:2%4``) to and from index lists (stdlib only)."""

from __future__ import annotations

from collections.abc import Iterable
from itertools import pairwise

# Slurm's default MaxArraySize: array task ids stay below it.
DEFAULT_MAX_ARRAY_SIZE = 1001


def compress(indices: Iterable[int]) -> str:
    """``[0,1,2,5,7,8]`` -> ``"0-2,5,7-8"`` (repeats dropped)."""
    ordered = sorted(set(indices))
    if not ordered:
        return ""
    if ordered[-1] - ordered[0] == len(ordered) - 1:  # one run: the common case
        runs = [(ordered[0], ordered[-1])]
    else:
        breaks = [(a, b) for a, b in pairwise(ordered) if b != a + 1]
        starts = [ordered[0], *(b for _, b in breaks)]
        ends = [*(a for a, _ in breaks), ordered[-1]]
        runs = list(zip(starts, ends))
    return ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in runs)


def array_bounds(spec: str) -> tuple[int, int]:
    """``(count, largest)`` of what :func:`expand_array_spec` would give, without building it:
    a number read from a damaged file must not cost memory in proportion to it."""
    count, largest = 0, -1
    for part in spec.split("%")[0].split(","):
        rng, _, step = part.partition(":")
        lo, _, hi = rng.partition("-")
        span = range(int(lo), int(hi or lo) + 1, int(step or 1))
        if span:
            count, largest = count + len(span), max(largest, span[-1])
    return count, largest


def expand_array_spec(spec: str) -> list[int]:
    """Inverse of :func:`compress` (ignores a ``%N`` throttle and ``:step``)."""
    out: list[int] = []
    for part in spec.split("%")[0].split(","):
        rng, _, step = part.partition(":")
        lo, _, hi = rng.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1, int(step or 1)))
    return out
