"""Slurm array specs (``0-9,12,20-30:2%4``) to and from index lists (stdlib only)."""

from __future__ import annotations

import itertools
from typing import Sequence


def compress(indices: Sequence[int]) -> str:
    """``[0,1,2,5,7,8]`` -> ``"0-2,5,7-8"``."""
    parts: list[str] = []
    for _, run in itertools.groupby(enumerate(sorted(indices)), lambda p: p[1] - p[0]):
        run_list = [v for _, v in run]
        lo, hi = run_list[0], run_list[-1]
        parts.append(str(lo) if lo == hi else f"{lo}-{hi}")
    return ",".join(parts)


def expand_array_spec(spec: str) -> list[int]:
    """Inverse of :func:`compress` (ignores a ``%N`` throttle and ``:step``)."""
    out: list[int] = []
    for part in spec.split("%")[0].split(","):
        rng, _, step = part.partition(":")
        lo, _, hi = rng.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1, int(step or 1)))
    return out
