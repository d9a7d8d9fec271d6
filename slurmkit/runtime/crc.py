"""zlib's CRC-32 of large buffers over several threads: pieces in parallel, then combined.

One thread computes CRC-32 at about 2-4 GB/s, no faster than a fast disk writes; zlib releases
the GIL, so pieces can be summed in parallel and joined with :func:`combine` (zlib's
``crc32_combine``, which Python's zlib does not expose).
"""

from __future__ import annotations

import functools
import os
import zlib
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Executor, Future
from io import BufferedIOBase, RawIOBase

PIECE = 16 << 20  # bytes per parallel piece
_POLY = 0xEDB88320  # CRC-32, reflected


def threads() -> int:
    """Threads worth giving to checksums (and to touching pages, see :mod:`.pinned`) here: half
    the usable CPUs, at most 4 (1: serial)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus // 2))


def _times(matrix: tuple[int, ...], vector: int) -> int:
    """The GF(2) matrix (32 column words) times the 32-bit vector."""
    out, i = 0, 0
    while vector:
        if vector & 1:
            out ^= matrix[i]
        vector >>= 1
        i += 1
    return out


def _product(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(_times(a, column) for column in b)


@functools.lru_cache(maxsize=32)
def _zeros(nbytes: int) -> tuple[int, ...]:
    """The operator that feeds ``nbytes`` zero bytes through a CRC-32 register."""
    bit = (_POLY, *(1 << n for n in range(31)))  # one zero bit
    base = _product(bit, bit)
    base = _product(base, base)
    base = _product(base, base)  # one zero byte
    result = tuple(1 << n for n in range(32))  # identity
    while nbytes:
        if nbytes & 1:
            result = _product(base, result)
        base = _product(base, base)
        nbytes >>= 1
    return result


def combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1`` of ``A``, ``crc2`` of ``B`` and ``len(B)``."""
    return _times(_zeros(len2), crc1) ^ crc2 if len2 > 0 else crc1


def crc32(view: memoryview, crc: int = 0, pool: Executor | None = None) -> int:
    """``zlib.crc32(view, crc)``, with ``view``'s pieces summed on ``pool``'s threads."""
    if pool is None or len(view) < 2 * PIECE:
        return zlib.crc32(view, crc)
    pieces = [view[i : i + PIECE] for i in range(0, len(view), PIECE)]
    return join(crc, zip(pool.map(zlib.crc32, pieces), map(len, pieces)))


def join(crc: int, parts: Iterable[tuple[int, int]]) -> int:
    """Extend ``crc`` by consecutive parts given as ``(crc32, length)``."""
    for part, length in parts:
        crc = combine(crc, part, length)
    return crc


def of_stream(
    fh: BufferedIOBase | RawIOBase, pool: Executor | None = None, window: int = 8
) -> tuple[int, int]:
    """``(size, crc32)`` of what ``fh`` reads, pieces summed on ``pool`` (at most ``window``
    pieces in memory)."""
    size, crc = 0, 0
    if pool is None:
        buf = bytearray(PIECE)
        with memoryview(buf) as view:
            while n := fh.readinto(view):
                crc = zlib.crc32(view[:n], crc)
                size += n
        return size, crc
    pending: deque[tuple[Future[int], int]] = deque()
    while data := fh.read(PIECE):
        pending.append((pool.submit(zlib.crc32, data), len(data)))
        size += len(data)
        if len(pending) >= window:
            done, length = pending.popleft()
            crc = combine(crc, done.result(), length)
    return size, join(crc, ((done.result(), length) for done, length in pending))
