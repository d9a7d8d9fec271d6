"""What a staging run does with each source file (pure): skip, check again, fetch in
batches, in ranged parts or whole; and how a published manifest differs from the source."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .records import Entry, Record

PART_SIZE = 16 << 20  # smaller files are fetched whole, in batches; larger ones in ranged parts
MAX_PART = 64 << 20  # of at most this size (see part_bytes)
BATCH_FILES = 32  # small files per batch
JOBS = 16  # threads of a run


@dataclass
class Plan:
    """What a run does with each source file."""

    skip: list[Entry] = field(default_factory=list)  # finished and journaled
    recheck: list[Entry] = field(default_factory=list)  # there, not journaled: checked locally
    batches: list[list[Entry]] = field(default_factory=list)  # small files, fetched whole
    large: list[Entry] = field(default_factory=list)  # fetched in ranged parts
    whole: list[Entry] = field(default_factory=list)  # streamed to disk in one GET

    @property
    def fetch(self) -> list[Entry]:
        return [e for batch in self.batches for e in batch] + self.large + self.whole


def plan(
    source: Sequence[Entry],
    journal: Mapping[str, Record],
    present: Mapping[str, int],
    part_size: int = PART_SIZE,
    batch_files: int = BATCH_FILES,
    ranges: bool = True,
) -> Plan:
    """What to do with each source file, given the journal of finished files and the sizes of
    the files already in the stage directory: skip a journaled file of the same size and
    version, check again locally one that is there at its size but not journaled, and fetch
    the rest (smaller than ``part_size``: in batches of at most ``batch_files`` files and
    ``part_size`` bytes; others in ranged parts, or streamed whole where the server takes no
    byte ranges, as is a file of unknown size)."""
    out = Plan()
    batch: list[Entry] = []
    batch_bytes = 0
    for e in source:
        done = journal.get(e.path)
        have = present.get(e.path)
        kept = done is not None and (done.size, done.version) == (have, e.version)
        if kept and have is not None and e.size in (None, have):
            out.skip.append(e)
            continue
        if have is not None and done is None and e.size is not None and e.size == have:
            out.recheck.append(e)
            continue
        if e.size is None or (e.size > part_size and not ranges):
            out.whole.append(e)
            continue
        if e.size > part_size:
            out.large.append(e)
            continue
        size = e.size
        if batch and (len(batch) >= batch_files or batch_bytes + size > part_size):
            out.batches.append(batch)
            batch, batch_bytes = [], 0
        batch.append(e)
        batch_bytes += size
    if batch:
        out.batches.append(batch)
    return out


def parts(size: int, part_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges of at most ``part_size`` bytes covering ``size`` bytes."""
    return [(start, min(start + part_size, size)) for start in range(0, size, part_size)]


def part_bytes(large: Sequence[Entry], jobs: int, part_size: int) -> int:
    """The size of the ranged parts of this run's large files: their bytes shared among the
    ``jobs`` threads (one part each, so every thread has one and no more requests are made
    than the threads can send at once), at least ``part_size``, at most ``MAX_PART`` (or
    ``part_size`` where that is larger), in whole MiB."""
    total = sum(e.size or 0 for e in large)
    share = -(-total // max(1, jobs))
    share = -(-share // (1 << 20)) << 20
    return max(part_size, min(share, MAX_PART))


def differences(source: Sequence[Entry], manifest: Mapping[str, Any]) -> list[str]:
    """How a published manifest differs from the source listing (empty: DST is up to date)."""
    rows = {row["path"]: row for row in manifest.get("files", [])}
    out = []
    for e in source:
        row = rows.pop(e.path, None)
        if row is None:
            out.append(f"{e.path}: new at the source")
        elif (row.get("size"), row.get("version")) != (e.size, e.version):
            out.append(f"{e.path}: changed at the source")
    out += [f"{path}: gone from the source" for path in sorted(rows)]
    return out
