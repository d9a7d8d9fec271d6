"""Hot data: copy a dataset from object storage (any fsspec URL) to the shared filesystem, once.

``stage(src, dst)`` lists SRC, fetches what DST lacks (small files in batches, large ones in
ranged parts, on a pool of threads) and publishes DST whole::

    PARENT/.NAME.slurmkit-stage/    while staging: the lock, data/ (the dataset so far) and
                                    journal.jsonl (one line per finished file)
    DST/                            data/ renamed into place once every file is there
    DST/.slurmkit-manifest.json     path, size, checksum and source version of every file,
                                    written last, before the rename

A reader trusts DST only when :func:`ready` finds its manifest: the rename of a whole
directory is atomic, so DST is absent or complete. A finished file is renamed into data/ from a
temporary name and then journaled, so a killed stager's rerun keeps it (a file renamed but not
yet journaled is checked again locally, never fetched again). Stagers of one DST take the
stage directory's lock (:mod:`slurmkit.core.lock`): one copies, the others wait and then find
DST published. Only public parts of URLs (no user, password or query) reach files and output;
credentials come from the backend's own chain (for S3: AWS's environment, config and profile).

The package, one job a module: :mod:`.urls` (which SRC and DST), :mod:`.listing` (the source's
files), :mod:`.planning` (what to do with each, pure), :mod:`.workdir` (the stage directory, its
journal and lock), :mod:`.copier` (the threads that fetch), :mod:`.ranged` (a large file in
ranged parts), :mod:`.publish` (the manifest: written, read, verified), :mod:`.progress` and
:mod:`.result` (what a run shows and says); :func:`stage` here puts them together.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence

from ..errors import UserError
from .copier import Copier
from .listing import entries, filesystem, list_source
from .planning import (
    BATCH_FILES,
    JOBS,
    MAX_PART,
    PART_SIZE,
    Plan,
    differences,
    part_bytes,
    parts,
    plan,
)
from .progress import Reporter, bar
from .publish import manifest, publish, ready, verify
from .records import MANIFEST, PART, Entry, Record
from .result import Result
from .urls import local_dst, public, source_protocol
from .workdir import locked, scan, stage_dir

__all__ = [
    "BATCH_FILES",
    "JOBS",
    "MANIFEST",
    "MAX_PART",
    "PART",
    "PART_SIZE",
    "Entry",
    "Plan",
    "Record",
    "Reporter",
    "Result",
    "bar",
    "differences",
    "entries",
    "filesystem",
    "local_dst",
    "manifest",
    "part_bytes",
    "parts",
    "plan",
    "public",
    "ready",
    "source_protocol",
    "stage",
    "stage_dir",
    "verify",
]


def stage(
    src: str,
    dst: str,
    *,
    verify_after: bool = False,
    dry_run: bool = False,
    endpoint_url: str | None = None,
    jobs: int = JOBS,
    part_size: int = PART_SIZE,
    reporter: Reporter | None = None,
) -> Result:
    """Stage SRC at DST (see the module's docstring) and say what was done.

    UserError: exit 2 for a bad SRC or DST, exit 1 for a missing source object, a checksum
    mismatch or a failed copy (each names the object; what is finished is kept for a rerun).
    """
    started = time.monotonic()
    protocol = source_protocol(src)
    dst = local_dst(dst)
    reporter = reporter or Reporter()
    fs, root = filesystem(src, protocol, endpoint_url, jobs)
    result = Result(public(src), dst, dry_run=dry_run)
    listing = list_source(fs, root, src, protocol)
    result.files, result.total_bytes = len(listing), sum(e.size or 0 for e in listing)

    def finish() -> Result:
        if verify_after:
            result.verified, problems = verify(dst, jobs)
            if problems:
                raise UserError.failure(
                    f"{len(problems)} file(s) at {dst} differ from its manifest: "
                    + "; ".join(problems[:10]),
                    hint=f"remove {dst} and stage it again",
                )
        result.seconds = time.monotonic() - started
        return result

    if _up_to_date(dst, listing, result):
        return finish()
    _refuse_taken(dst)
    work = stage_dir(dst)
    if dry_run:
        _, journal, present = scan(work, keep=True)
        todo = plan(listing, journal, present, part_size)
        result.skipped = len(todo.skip) + len(todo.recheck)
        result.to_copy = [(e.path, e.size) for e in todo.fetch]
        result.seconds = time.monotonic() - started
        return result
    with locked(work, reporter) as (lock, waited):
        result.waited = waited
        if not _up_to_date(dst, listing, result):  # else: the stager we waited for did it
            _refuse_taken(dst)
            Copier(fs, protocol, work, listing, jobs, part_size, reporter, result).run()
            publish(src, dst, work, listing, lock)
            result.published = True
    with contextlib.suppress(OSError):  # a waiter's lock file may be in it: then it stays
        os.rmdir(work)
    return finish()


def _refuse_taken(dst: str) -> None:
    """UserError (usage) when DST is something other than nothing or an empty directory."""
    if os.path.lexists(dst) and not (os.path.isdir(dst) and not os.listdir(dst)):
        raise UserError(
            f"{dst} exists and is not a dataset slurmkit staged (it has no {MANIFEST})",
            key="DST",
            hint="stage to a new path, or remove it",
        )


def _up_to_date(dst: str, listing: Sequence[Entry], result: Result) -> bool:
    """True when DST is published from this very listing; UserError when it is published
    from another (a published dataset is never changed under its readers)."""
    found = ready(dst)
    if found is None:
        return False
    diff = differences(listing, found)
    if diff:
        raise UserError.failure(
            f"{dst} holds another version of {result.source} ({len(diff)} difference(s): "
            + "; ".join(diff[:5])
            + ")",
            hint="stage it to a new path (a published dataset is never changed in place), "
            "or remove it first",
        )
    result.skipped = len(listing)
    return True
