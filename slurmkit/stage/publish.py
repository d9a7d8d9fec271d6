"""A staged dataset's manifest: written last, then the stage directory renamed to DST
(:func:`publish`); read back by :func:`ready`, and every file read again by :func:`verify`."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..core import fsutil
from ..core.lock import Lock
from ..core.lock import read as read_lock
from ..errors import UserError
from .planning import JOBS
from .records import FORMAT, MANIFEST, Entry, Record, crc_text, read_sums
from .urls import public, url_of
from .workdir import scan


def manifest(source: str, records: Iterable[Record]) -> dict[str, Any]:
    """The manifest of a dataset staged from ``source`` (its public URL)."""
    rows = sorted((r.row() for r in records), key=lambda r: r["path"])
    return {
        "format": FORMAT,
        "source": public(source),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": rows,
        "count": len(rows),
        "bytes": sum(r["size"] for r in rows),
    }


def ready(dst: str) -> dict[str, Any] | None:
    """The manifest of the dataset published at ``dst`` (``files``: path, size, checksum,
    version), or None while it is not there (absent, being staged, or not slurmkit's)."""
    try:
        found = fsutil.read_record(os.path.join(dst, MANIFEST))
    except (fsutil.Damaged, OSError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("files"), list):
        return None
    return found


def verify(dst: str, jobs: int = JOBS) -> tuple[int, list[str]]:
    """Read every file of the published ``dst`` again: (files checked, problems found)."""
    found = ready(dst)
    if found is None:
        raise UserError.failure(
            f"{dst}: no staged dataset here (no {MANIFEST})", hint="stage it first: slurmkit stage"
        )

    def check(row: dict[str, Any]) -> str | None:
        path = os.path.join(dst, row["path"])
        try:
            size, crc, _ = read_sums(path, False)
        except FileNotFoundError:
            return f"{path}: missing"
        if size != row["size"]:
            return f"{path}: {size} bytes, the manifest says {row['size']}"
        if crc_text(crc) != row["checksum"]:
            return (
                f"{path}: checksum mismatch ({crc_text(crc)}, the manifest says {row['checksum']})"
            )
        return None

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        problems = [p for p in pool.map(check, found["files"]) if p]
    return len(found["files"]), problems


def publish(src: str, dst: str, work: str, listing: Sequence[Entry], lock: Lock) -> None:
    """Check the stage directory holds exactly the listing, write the manifest last and
    rename the directory to DST (only while this stager still holds the lock)."""
    data, journal, present = scan(work)
    wanted = {e.path for e in listing}
    for rel in sorted(set(present) - wanted):  # left by an earlier version of the source
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(data, *rel.split("/")))
    records = []
    for e in listing:
        done = journal.get(e.path)
        if done is None or present.get(e.path) != done.size or done.version != e.version:
            raise UserError.failure(f"{url_of('file', e.path)}: not staged (internal error)")
        records.append(done)
    found = read_lock(lock.path)
    if found is None or found[0].get("token") != lock.token:
        raise UserError.failure(
            f"{work}: another stager took the lock (this one's heartbeat stopped): "
            "it publishes, this one does not"
        )
    fsutil.atomic_write_json(os.path.join(data, MANIFEST), manifest(src, records))
    os.rename(data, dst)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(work, "journal.jsonl"))
