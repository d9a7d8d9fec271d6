"""One checkpoint root and its on-disk layout: :class:`CheckpointDir` (stdlib only at import).

Layout under ``root`` (a local directory or any fsspec URL)::

    step-000000001200/
        COMMIT.json          the commit record: the checkpoint exists only once this file does
        state-1f2e3d4c.pt    torch.save output (``.pkl``: plain pickle; ``dcp-<token>/``: sharded)
        .tmp-...             a write in progress, or a crash's leftover: never read, removed later

The commit protocol: each file is written under a ``.tmp-`` name, flushed, fsynced and renamed
into place; the directories holding the files are fsynced; then ``COMMIT.json`` (step, kind,
files with their sizes and CRC32s, time) is written the same way. Readers trust only committed
checkpoints whose files match their record, so a kill at any point leaves the previous
checkpoint loadable. Pruning removes old checkpoints only after a newer commit is durable.

Both the :class:`~.checkpointer.Checkpointer` (the fast path) and the
:class:`~.mirror.Mirror` (the durable tier) read and write their roots through this class.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import time
import warnings
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from .. import crc, progress
from . import reader
from .fetch import Invalid
from .storage import CheckpointError, failure, open_store
from .writer import Writer, dump

COMMIT = "COMMIT.json"
TMP = ".tmp-"
KINDS = ("torch", "pickle", "dcp")  # every kind of checkpoint
WHOLE = ("torch", "pickle")  # the kinds :meth:`CheckpointDir.load` reads (one file each)
_STEP_DIR = re.compile(r"step-(\d+)")

Record = dict[str, Any]  # a commit record, as COMMIT.json holds it


def dirname(step: int) -> str:
    """The name of checkpoint ``step``'s directory."""
    return f"step-{step:012d}"


def new_record(step: int, kind: str, files: dict[str, dict[str, int]]) -> Record:
    """The commit record of checkpoint ``step``: its kind and its files (``{"size", "crc32"}``
    each, the CRC32 optional), stamped with the time now."""
    return {"format": 1, "step": step, "kind": kind, "time": time.time(), "files": files}


def warn_skipping(step: int, why: Exception) -> None:
    """Warn that checkpoint ``step`` is passed over, and why."""
    warnings.warn(f"slurmkit.checkpoint: skipping step {step}: {why}", RuntimeWarning, stacklevel=4)


class CheckpointDir:
    """One checkpoint root: its committed steps, a step's commit record, writing and committing
    a step, pruning, and reading a step back.

    ``threads``: whether file writes overlap their I/O with the checksum on helper threads and
    :meth:`prune_later` prunes on one; ``False``: all in the calling thread (an uploader that the
    interpreter's exit must not wait for). Store failures raise ``OSError`` unless a method
    says otherwise. One writing process per root.
    """

    def __init__(self, root: str | os.PathLike[str], *, threads: bool = True) -> None:
        self.store = open_store(root)
        self.root = self.store.root
        self.threads = threads
        self._io: ThreadPoolExecutor | None = None
        self._crcs: ThreadPoolExecutor | None = None
        self._pruning: Future[None] | None = None
        self._verified: dict[int, Record] = {}  # steps whose files were checked or written

    def path(self, *parts: str) -> str:
        """``parts`` joined under the root."""
        return self.store.sep.join([self.root, *parts])

    def step_path(self, step: int, *parts: str) -> str:
        """Checkpoint ``step``'s directory, or ``parts`` under it."""
        return self.path(dirname(step), *parts)

    def url(self) -> str:
        """The root as a URL (a local path as it is)."""
        return self.store.url(self.root)

    # -- reading --

    def listing(self) -> dict[int, str]:
        """The step directories there, committed or not: ``{step: directory name}``."""
        found = {}
        for entry in self.store.listdir(self.root):
            match = _STEP_DIR.fullmatch(entry)
            if match:
                found[int(match.group(1))] = entry
        return found

    def record(self, step: int) -> Record | None:
        """Checkpoint ``step``'s commit record; ``None`` if it has none (yet).
        :class:`~.fetch.Invalid` for a damaged one."""
        return self._record(dirname(step))

    def record_or_none(self, step: int) -> Record | None:
        """Like :meth:`record`, ``None`` for a damaged record too."""
        try:
            return self.record(step)
        except Invalid:
            return None

    def _record(self, name: str) -> Record | None:
        path = self.path(name, COMMIT)
        try:
            with self.store.open(path) as fh:
                record = json.loads(fh.read())
            ok = (
                record["step"] == int(name[5:])
                and isinstance(record["files"], dict)
                and all(isinstance(v["size"], int) for v in record["files"].values())
            )
        except FileNotFoundError:
            return None
        except (ValueError, KeyError, TypeError, AttributeError):
            ok = False
        if not ok:
            raise Invalid(f"damaged commit record {path}")
        return record

    def committed(self, kinds: tuple[str, ...] = KINDS) -> list[tuple[int, Record]]:
        """``(step, record)`` of the committed checkpoints of these kinds, newest first (files
        not verified); a damaged record is warned about and passed over."""
        out = []
        for step, name in sorted(self.listing().items(), reverse=True):
            try:
                record = self._record(name)
            except Invalid as exc:
                warn_skipping(step, exc)
                continue
            if record is not None and record.get("kind") in kinds:
                out.append((step, record))
        return out

    def steps(self, kinds: tuple[str, ...] = KINDS) -> list[int]:
        """Steps of the committed checkpoints, oldest first (files not verified)."""
        return [step for step, _ in reversed(self.committed(kinds))]

    def verify(self, step: int, record: Record) -> None:
        """Check that checkpoint ``step``'s files have the sizes and CRC32s of ``record``
        (once per record); :class:`~.fetch.Invalid` when one does not."""
        if self._verified.get(step) == record:
            return
        for rel, info in record["files"].items():
            path = self.step_path(step, *rel.split("/"))
            try:
                if "crc32" in info:
                    with self.store.open(path) as fh:
                        size, check = crc.of_stream(fh, self.crc_pool())
                else:
                    size, check = self.store.size(path), None
            except FileNotFoundError:
                raise Invalid(f"missing {path}") from None
            if size != info["size"]:
                raise Invalid(f"{path} has {size} bytes, its record says {info['size']}")
            if check != info.get("crc32"):
                raise Invalid(f"checksum mismatch in {path}")
        self._verified[step] = record

    def newest(self, kinds: tuple[str, ...] = KINDS) -> int | None:
        """The newest step of these kinds whose checkpoint is committed and checks out, or
        ``None``; the others are warned about. :class:`CheckpointError` when the root cannot
        be read."""
        try:
            for step, record in self.committed(kinds):
                try:
                    self.verify(step, record)
                except Invalid as exc:
                    warn_skipping(step, exc)
                    continue
                return step
        except OSError as exc:
            raise failure(exc, "cannot read checkpoints", self.root) from exc
        return None

    def read(self, step: int, record: Record, *, map_location: Any = "cpu") -> Any:
        """The state of torch/pickle checkpoint ``step``, its file checked while read (see
        :func:`.reader.read`); :class:`~.fetch.Invalid` when it does not match ``record``."""
        state = reader.read(self.store, self.step_path(step), record, map_location=map_location)
        self._verified[step] = record
        return state

    def load(self, step: int, *, map_location: Any = "cpu") -> Any:
        """The state saved as ``step``; :class:`CheckpointError` if it is missing or damaged."""
        try:
            record = self.record(step)
            if record is None or record.get("kind") not in WHOLE:
                raise Invalid("no committed torch/pickle checkpoint there")
            return self.read(step, record, map_location=map_location)
        except Invalid as exc:
            raise CheckpointError(
                f"checkpoint step {step}: {self.step_path(step)}: {exc}"
            ) from None
        except OSError as exc:
            raise failure(exc, f"cannot read checkpoint step {step}", self.step_path(step)) from exc

    # -- writing --

    def save(self, step: int, state: Any, how: str) -> Record:
        """Write ``state`` (``how``: see :func:`.writer.dump`) as checkpoint ``step`` and commit
        it; its commit record. On failure the write is undone (the step's directory when it
        was new) and :class:`CheckpointError` raised."""
        kind = "torch" if how == "torch" else "pickle"
        name = f"state-{secrets.token_hex(4)}.{'pt' if kind == 'torch' else 'pkl'}"
        directory = self.step_path(step)
        try:
            fresh = self.record_or_none(step) is None
            try:
                self.store.makedirs(directory)
                if fresh:
                    self.store.sync_dir(self.root)
                info = self.put(self.step_path(step, name), lambda fh: dump(state, how, fh))
                record = new_record(step, kind, {name: info})
                self.commit(step, record)
            except BaseException:
                self.remove(directory if fresh else self.step_path(step, name))
                raise
        except OSError as exc:
            raise failure(exc, f"checkpoint step {step} not saved", directory) from exc
        return record

    def put(
        self,
        path: str,
        fill: Callable[[Writer], object],
        *,
        rename: bool = True,
        check: Callable[[int, int], None] | None = None,
    ) -> dict[str, int]:
        """Write the file ``path`` with what ``fill`` writes into the :class:`~.writer.Writer`
        it is given; its ``{"size", "crc32"}``. ``rename``: through a temporary name, renamed
        once flushed and fsynced (else in place: an object store shows an object whole).
        ``check(size, crc32)`` may refuse the bytes (by raising) before they are committed.
        On failure nothing is left behind."""
        head, _, tail = path.rpartition(self.store.sep)
        tmp = f"{head}{self.store.sep}{TMP}{tail}.{secrets.token_hex(4)}" if rename else path
        sink = self.store.sink(tmp)
        try:
            fh = Writer(sink, self.io_pool(), self.crc_pool())
            fill(fh)
            fh.flush()
            if check is not None:
                check(fh.size, fh.crc)
            sink.commit()
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one to report
                sink.abort()
            if rename:
                self.remove(tmp)
            raise
        if rename:
            try:
                self.store.replace(tmp, path)
            except BaseException:
                self.remove(tmp)
                raise
        return {"size": fh.size, "crc32": fh.crc}

    def commit(self, step: int, record: Record, *, rename: bool = True) -> None:
        """Commit checkpoint ``step``, whose files are written: make them durable, then write
        ``record`` as its ``COMMIT.json`` (``rename``: as in :meth:`put`) and make that durable."""
        directory = self.step_path(step)
        subdirs = {rel.rpartition("/")[0] for rel in record["files"]} - {""}
        for sub in sorted(subdirs):
            self.store.sync_dir(self.step_path(step, *sub.split("/")))
        self.store.sync_dir(directory)
        body = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
        self.put(self.step_path(step, COMMIT), lambda fh: fh.write(body), rename=rename)
        self.store.sync_dir(directory)
        self._verified[step] = record
        progress.checkpointed()  # for the hang watchdog (nothing outside a trial)

    def uncommit(self, step: int) -> None:
        """Remove checkpoint ``step``'s commit record (its files stay, to be overwritten)."""
        self._verified.pop(step, None)
        self.store.remove(self.step_path(step, COMMIT))

    def remove(self, path: str) -> None:
        """Remove a file or a directory, if the store lets it."""
        with contextlib.suppress(OSError):
            self.store.remove(path)

    # -- pruning --

    def prune(self, keep: int, current: int) -> None:
        """Keep the newest ``keep`` committed checkpoints and ``current``; remove the other step
        directories, and in the ones kept, what their record does not name."""
        dirs = self.listing()
        records = {step: self._record_or_none(name) for step, name in dirs.items()}
        committed = sorted(step for step, rec in records.items() if rec is not None)
        kept = set(committed[-keep:]) | {current}
        for step, name in dirs.items():
            record = records[step]
            if step not in kept:
                if record is not None:
                    self.store.remove(self.path(name, COMMIT))
                self.store.remove(self.path(name))
                self._verified.pop(step, None)
            elif record is not None:
                used = {f.split("/")[0] for f in record["files"]} | {COMMIT}
                for entry in self.store.listdir(self.path(name)):
                    if entry not in used:
                        self.store.remove(self.path(name, entry))

    def _record_or_none(self, name: str) -> Record | None:
        try:
            return self._record(name)
        except Invalid:
            return None

    def prune_later(self, keep: int, current: int) -> None:
        """:meth:`prune` on the helper thread (in this one without ``threads``); a failure is
        warned about. :meth:`join` waits for it."""
        pool = self.io_pool()
        if pool is not None:
            self._pruning = pool.submit(self._prune_or_warn, keep, current)
        else:
            self._prune_or_warn(keep, current)

    def _prune_or_warn(self, keep: int, current: int) -> None:
        try:
            self.prune(keep, current)
        except OSError as exc:
            warnings.warn(
                f"slurmkit.checkpoint: pruning {self.root} failed: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )

    @property
    def pruning(self) -> bool:
        """Whether a :meth:`prune_later` is under way."""
        return self._pruning is not None and not self._pruning.done()

    def join(self) -> None:
        """Wait for the pending :meth:`prune_later`, if any (its error, if any, raised)."""
        if self._pruning is not None:
            self._pruning.result()
            self._pruning = None

    # -- helper threads --

    def io_pool(self) -> ThreadPoolExecutor | None:
        """The helper thread: file writes overlapping the CRC, pruning after a commit."""
        if self._io is None and self.threads:
            self._io = ThreadPoolExecutor(1, thread_name_prefix="slurmkit-checkpoint-io")
        return self._io

    def crc_pool(self) -> ThreadPoolExecutor | None:
        """Threads for checksums of large files; ``None`` where one thread is all there is."""
        if self._crcs is None and self.threads and crc.threads() > 1:
            self._crcs = ThreadPoolExecutor(crc.threads(), thread_name_prefix="slurmkit-crc")
        return self._crcs

    def close(self) -> None:
        """Release the helper threads (after the work they have)."""
        for pool in (self._io, self._crcs):
            if pool is not None:
                pool.shutdown()
        self._io = self._crcs = None
        self._pruning = None
