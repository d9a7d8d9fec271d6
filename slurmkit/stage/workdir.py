"""The stage directory, ``PARENT/.NAME.slurmkit-stage/``: where it is, what a killed run left
in it (its journal of finished files, the files there) and its lock."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Iterator

from ..core.lock import Lock, LockBusy, describe
from .progress import Reporter
from .records import MANIFEST, PART, Record


def stage_dir(dst: str) -> str:
    """Where DST is built: a hidden sibling on the same filesystem."""
    parent, name = os.path.split(dst.rstrip("/"))
    return os.path.join(parent, f".{name}.slurmkit-stage")


def scan(work: str, keep: bool = False) -> tuple[str, dict[str, Record], dict[str, int]]:
    """The stage directory's data folder, its journal and the sizes of the finished files
    there; left-over partial files (and a manifest not yet published) are removed unless
    ``keep`` (a dry run)."""
    data = os.path.join(work, "data")
    journal: dict[str, Record] = {}
    try:
        with open(os.path.join(work, "journal.jsonl"), encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                    journal[row["path"]] = Record(
                        row["path"], row["size"], row["version"], row["checksum"]
                    )
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a kill
    except FileNotFoundError:
        pass
    present: dict[str, int] = {}
    for folder, _dirs, files in os.walk(data):
        for name in files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, data).replace(os.sep, "/")
            if PART in name or rel == MANIFEST:
                if not keep:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                continue
            with contextlib.suppress(FileNotFoundError):
                present[rel] = os.stat(path).st_size
    return data, journal, present


@contextlib.contextmanager
def locked(work: str, reporter: Reporter) -> Iterator[tuple[Lock, bool]]:
    """Hold the lock of the stage directory ``work`` (made if need be), waiting for another
    stager as long as it lives; yields the lock and whether this one waited."""
    waited = False
    while True:
        os.makedirs(work, exist_ok=True)
        lock = Lock(work)
        try:
            try:
                lock.acquire("stage", wait=0)
            except LockBusy as busy:
                waited = True
                reporter.note(f"waiting: {work} is being staged ({describe(busy.holder)})")
                lock.acquire("stage", wait=math.inf)
        except FileNotFoundError:  # the holder published and removed the directory just now
            continue
        break
    try:
        yield lock, waited
    finally:
        lock.release()
