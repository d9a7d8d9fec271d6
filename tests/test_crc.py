"""slurmkit.runtime.crc: parallel CRC-32 equals zlib's, whatever the piece boundaries."""

from __future__ import annotations

import io
import os
import random
import zlib
from concurrent.futures import ThreadPoolExecutor

import pytest

from slurmkit.runtime import crc


@pytest.mark.slow
def test_combine_equals_zlib_over_the_concatenation() -> None:
    rng = random.Random(7)
    for _ in range(300):
        a, b = os.urandom(rng.randrange(0, 5000)), os.urandom(rng.randrange(0, 5000))
        seed = rng.randrange(1 << 32)
        assert crc.combine(zlib.crc32(a, seed), zlib.crc32(b), len(b)) == zlib.crc32(a + b, seed)


@pytest.mark.parametrize("extra", [0, 1, 4095, crc.PIECE - 1])
def test_parallel_buffer_and_stream_equal_zlib(extra: int) -> None:
    data = os.urandom(1 << 20) * 40 + os.urandom(extra)  # 40 MiB + extra: several pieces
    with ThreadPoolExecutor(3) as pool:
        assert crc.crc32(memoryview(data), 99, pool) == zlib.crc32(data, 99)
        assert crc.of_stream(io.BytesIO(data), pool, window=2) == (len(data), zlib.crc32(data))
    assert crc.of_stream(io.BytesIO(data)) == (len(data), zlib.crc32(data))
