"""The durable tier: committed checkpoints mirrored to a second root (an object store URL) by a
background thread, and the choice of the checkpoint, and the tier, that a resume loads.

The mirror has the fast path's layout (``step-N/`` with its files and ``COMMIT.json``): both
are a :class:`~.directory.CheckpointDir`, and a ``Checkpointer`` reads either. The uploader writes
a checkpoint's files first (checking their sizes and CRC32s against the commit record on the
way), then its commit record: a kill at any point leaves no commit record without its data.
It uploads the newest checkpoint handed to it (older ones still queued are superseded), retries
failures with exponential backoff, keeps its own retention, and reports through a log line on
stderr and :class:`MirrorStatus`. Saving only queues the commit record (no lock, no I/O).
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import sys
import threading
import time
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

from .directory import WHOLE, CheckpointDir, Record, dirname
from .fetch import Invalid
from .storage import CheckpointError, LocalStore
from .writer import Writer

ENV_MIRROR = "SLURMKIT_CHECKPOINT_MIRROR"
ENV_MIRROR_KEEP = "SLURMKIT_CHECKPOINT_MIRROR_KEEP"
BACKOFF = (1.0, 60.0)  # first and longest wait before a retry, seconds
CHUNK = 16 << 20  # bytes per read from the fast path
FAST, MIRROR = "fast", "mirror"
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


def public(url: str) -> str:
    """``url`` without what may be a credential (user and password, query, fragment)."""
    m = _SCHEME.match(url)
    if m is None:
        return url
    host, sep, path = url[m.end() :].split("#", 1)[0].split("?", 1)[0].partition("/")
    return f"{m.group(0)}{host.rpartition('@')[2]}{sep}{path}"


def from_environment(root: str, environ: Mapping[str, str]) -> str | None:
    """The mirror ``SLURMKIT_CHECKPOINT_MIRROR`` asks for, for checkpoints under ``root``.

    In a trial it is ``URL/SWEEP/trials/ID/REL`` (SWEEP the sweep directory's name, ID the
    trial's id, REL ``root`` under the trial directory, or its last part when it lies
    elsewhere), so the trials of a sweep, and sweeps, never share one; outside a trial, URL.
    """
    url = environ.get(ENV_MIRROR, "").strip().rstrip("/")
    trial = environ.get("SLURMKIT_TRIAL_ID")
    if not url or not trial:
        return url or None
    sweep = os.path.basename(os.path.normpath(environ.get("SLURMKIT_SWEEP_DIR") or "sweep"))
    tdir = environ.get("SLURMKIT_TRIAL_DIR")
    rel = os.path.relpath(root, tdir) if tdir else ".."
    if rel == "." or rel.startswith(".."):
        rel = os.path.basename(root.rstrip("/")) or "checkpoints"
    return "/".join([url, sweep, "trials", trial, *rel.split(os.sep)])


def keep_from_environment(environ: Mapping[str, str]) -> int | None:
    """``SLURMKIT_CHECKPOINT_MIRROR_KEEP`` as a number, or ``None`` when unset."""
    text = environ.get(ENV_MIRROR_KEEP, "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{ENV_MIRROR_KEEP}={text!r}: not a whole number") from None


def backoff(attempt: int, first: float, longest: float) -> float:
    """The wait before retry ``attempt`` (1, 2, ...): ``first``, doubled each time, capped."""
    return min(longest, first * 2 ** (attempt - 1))


def order(fast: Iterable[int], mirror: Iterable[int]) -> list[tuple[int, str]]:
    """Where to look for a checkpoint to restore, best first: newest step first, and for one
    step the fast path before the mirror."""
    both = {(step, FAST) for step in fast} | {(step, MIRROR) for step in mirror}
    return sorted(both, key=lambda found: (-found[0], found[1] != FAST))


def attach(
    source: CheckpointDir,
    url: str | os.PathLike[str] | Literal[False] | None,
    keep: int | None,
    source_keep: int,
) -> Mirror | None:
    """The mirror of ``source``'s checkpoints: at ``url`` (``None``: the one
    ``SLURMKIT_CHECKPOINT_MIRROR`` asks for, if any; ``False``: none), keeping ``keep``
    checkpoints (``None``: ``SLURMKIT_CHECKPOINT_MIRROR_KEEP``, else ``source_keep``)."""
    if url is False:
        return None
    if url is None:
        url = from_environment(source.root, os.environ)
        if url is None:
            return None
        keep = keep_from_environment(os.environ) if keep is None else keep
    keep = source_keep if keep is None else keep
    if keep < 1:
        raise ValueError("mirror_keep must be >= 1")
    try:
        tier = CheckpointDir(url, threads=False)  # the uploader is a daemon: no helper threads
    except ImportError as exc:  # fsspec's "Install s3fs to access S3", say
        raise CheckpointError(f"checkpoint mirror {public(os.fspath(url))}: {exc}") from None
    if tier.url() == source.url():
        raise ValueError(f"the checkpoint mirror {public(os.fspath(url))} is the root itself")
    return Mirror(source, tier, keep)


@dataclass(frozen=True)
class MirrorStatus:
    """What the uploader is doing; ``Checkpointer.mirror_status()`` returns a snapshot."""

    url: str  # the mirror, without credentials
    state: str  # idle | uploading | retrying | failed | closed
    mirrored: int | None = None  # the step of the last checkpoint uploaded whole
    pending: int | None = None  # the step being uploaded or waiting for a retry
    attempts: int = 0  # failed attempts in a row (the backoff grows with them)
    backoff: float | None = None  # the wait before its next attempt (state retrying)
    error: str | None = None  # the last failure, if any
    uploaded: int = 0  # checkpoints uploaded by this process
    superseded: int = 0  # checkpoints a newer one replaced before they were uploaded
    failures: int = 0  # failed attempts in all


class _Gone(Exception):
    """The checkpoint cannot be uploaded as it is on the fast path: retrying will not help."""


_Item = tuple[int, int, Record]  # hand-off number, step, commit record
_STOP: _Item = (-1, -1, {})


class Mirror:
    """Uploads the checkpoints of ``source`` (committed there) to ``tier``, another root that
    keeps ``keep`` of them; restores from the newest copy valid on either."""

    def __init__(self, source: CheckpointDir, tier: CheckpointDir, keep: int) -> None:
        self.source, self.tier, self.keep = source, tier, keep
        self.local = isinstance(tier.store, LocalStore)  # through temporary names and renames
        self.url = public(tier.url())
        self._queue: queue.SimpleQueue[_Item] = queue.SimpleQueue()
        self._handed = 0  # hand-offs so far (each numbered)
        self._done = 0  # the number of the last hand-off dealt with
        self._ok = True  # whether that one was uploaded
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._ended = False  # the uploader has stopped
        self._status = MirrorStatus(self.url, "idle")

    @property
    def status(self) -> MirrorStatus:
        """What the uploader is doing (``closed`` once stopped, an upload under way or not)."""
        return replace(self._status, state="closed") if self._stopping else self._status

    # -- the training side: no lock, no I/O --

    def put(self, step: int, record: Record) -> None:
        """Queue committed checkpoint ``step`` (its commit record) for upload."""
        if self._stopping:
            return
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="slurmkit-checkpoint-mirror", daemon=True
            )
            self._thread.start()
        self._handed += 1
        self._queue.put((self._handed, step, record))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until every checkpoint queued so far is dealt with, ``timeout`` seconds at
        most (saying so when that is not enough); True when the last one is on the mirror."""
        target = self._handed
        with self._cond:
            self._cond.wait_for(lambda: self._done >= target or self._ended, timeout)
            done, ok = self._done >= target, self._ok
        if not done:
            late = "closed" if self._ended else f"not done after {timeout:g} s"
            _log(f"step {self._status.pending} not yet mirrored to {self.url} ({late})")
        return done and ok

    def stop(self) -> None:
        """No more uploads: the uploader ends after the one under way, if any."""
        if not self._stopping:
            self._stopping = True
            self._queue.put(_STOP)

    # -- the uploader thread --

    def _run(self) -> None:
        item: _Item | None = None
        while True:
            item = self._newest(item or self._queue.get())
            if item is _STOP:
                with self._cond:
                    self._ended = True
                    self._cond.notify_all()
                return
            seq, step, record = item
            self._status = replace(self._status, state="uploading", pending=step, backoff=None)
            try:
                self._upload(step, record)
            except _Gone as exc:
                if self._queue.empty():
                    self._finish(seq, False, f"step {step} not mirrored: {exc}")
                else:  # pruned from the fast path after a newer save, say
                    self._status = replace(self._status, superseded=self._status.superseded + 1)
                item = None
                continue
            except Exception as exc:  # any failure of the store: retried
                item = self._retry(item, exc)
                continue
            if self._status.attempts:
                _log(f"step {step} mirrored to {self.url} after {self._status.attempts} failures")
            try:
                self.tier.prune(self.keep, step)
            except Exception as exc:  # the next upload prunes again
                _log(f"pruning {self.url} failed: {_reason(exc)}")
            self._status = replace(self._status, mirrored=step, uploaded=self._status.uploaded + 1)
            self._finish(seq, True)
            item = None

    def _newest(self, item: _Item) -> _Item:
        """``item`` or the last one queued after it; the ones in between are superseded."""
        while True:
            try:
                later = self._queue.get_nowait()
            except queue.Empty:
                return item
            if later is _STOP:
                return later
            self._status = replace(self._status, superseded=self._status.superseded + 1)
            item = later

    def _retry(self, item: _Item, exc: Exception) -> _Item:
        """Report a failed attempt and wait before the next (longer after each failure in a
        row); a newer checkpoint queued meanwhile replaces ``item``."""
        attempts = self._status.attempts + 1
        delay = backoff(attempts, *BACKOFF)
        reason = _reason(exc)
        self._status = replace(
            self._status,
            state="retrying",
            attempts=attempts,
            backoff=delay,
            error=reason,
            failures=self._status.failures + 1,
        )
        _log(
            f"mirroring step {item[1]} to {self.url} failed (attempt {attempts}): {reason}; "
            f"retrying in {delay:g} s"
        )
        deadline = time.monotonic() + delay
        while (left := deadline - time.monotonic()) > 0:
            try:
                later = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if later is _STOP:
                return later
            self._status = replace(self._status, superseded=self._status.superseded + 1)
            item = later
        return item

    def _finish(self, seq: int, ok: bool, failed: str | None = None) -> None:
        if failed is not None:
            _log(failed)
        state, error = ("idle", self._status.error) if ok else ("failed", failed)
        self._status = replace(
            self._status, state=state, pending=None, attempts=0, backoff=None, error=error
        )
        with self._cond:
            self._done, self._ok = seq, ok
            self._cond.notify_all()

    def _upload(self, step: int, record: Record) -> None:
        """Upload checkpoint ``step``: its files, checked against ``record``, then the record.

        The fast path's files are opened first: on a local disk they stay readable when the
        fast path's retention removes them meanwhile."""
        tier = self.tier
        with contextlib.ExitStack() as files:
            sources = {rel: files.enter_context(self._open(step, rel)) for rel in record["files"]}
            there = tier.record_or_none(step)
            if there == record:
                return
            if there is not None:  # saved again since: no record may stand beside other data
                tier.uncommit(step)
            tier.store.makedirs(tier.step_path(step))
            for rel, info in record["files"].items():
                parts = rel.split("/")
                if len(parts) > 1:
                    tier.store.makedirs(tier.step_path(step, *parts[:-1]))
                tier.put(
                    tier.step_path(step, *parts),
                    _copier(sources[rel]),
                    rename=self.local,
                    check=_matching(info, f"{dirname(step)}/{rel}"),
                )
        tier.commit(step, record, rename=self.local)

    def _open(self, step: int, rel: str) -> Any:
        path = self.source.step_path(step, *rel.split("/"))
        try:
            return self.source.store.open(path)
        except FileNotFoundError:
            raise _Gone(f"{path} is gone from the fast path") from None

    # -- restoring: which checkpoint, from which tier --

    def load_newest(self, map_location: Any) -> tuple[int, Any] | None:
        """``(step, state)`` of the newest checkpoint valid on the fast path or the mirror.

        A copy that does not check out is skipped with a warning (for one step, the fast
        path's copy is tried first, then the mirror's); a mirror copy without its commit record
        is no checkpoint. A tier that cannot be listed is warned about, and makes this raise
        only when the other holds nothing valid either.
        """
        fast = self.source
        problems: list[str] = []
        local = _listed(problems, fast.root, lambda: [s for s, _ in fast.committed(WHOLE)])
        remote = _listed(problems, self.url, lambda: list(self.tier.listing()))
        for step, where in order(local, remote):
            tier = fast if where == FAST else self.tier
            try:
                if where == MIRROR and not _committed(tier, step):
                    continue  # an upload under way, or cut short
                state = tier.load(step, map_location=map_location)
            except Exception as exc:
                if not isinstance(exc, CheckpointError) and not _transport(exc):
                    raise  # unpickling a copy that checks out
                _skipping(step, where, exc)
                continue
            if where == MIRROR:
                _log(f"restored step {step} from the mirror {self.url}")
            return step, state
        if problems:
            raise CheckpointError("cannot read checkpoints: " + "; ".join(problems))
        return None

    def load(self, step: int, map_location: Any) -> Any:
        """The state of checkpoint ``step``: the fast path's copy, or else the mirror's."""
        try:
            return self.source.load(step, map_location=map_location)
        except CheckpointError as exc:
            try:
                there = _committed(self.tier, step)
            except CheckpointError:
                there = False
            if not there:
                raise
            _skipping(step, FAST, exc)
        state = self.tier.load(step, map_location=map_location)
        _log(f"restored step {step} from the mirror {self.url}")
        return state


def _copier(fh: Any) -> Any:
    """What writes ``fh``'s bytes into a :class:`~.writer.Writer`, in ``CHUNK``-byte reads."""

    def fill(out: Writer) -> None:
        buf = bytearray(CHUNK)
        with memoryview(buf) as view:
            while n := fh.readinto(view):
                out.write(view[:n])

    return fill


def _matching(info: dict[str, Any], where: str) -> Any:
    """A check that refuses bytes without ``info``'s size and CRC32 (the fast path's copy
    changed since its commit)."""

    def check(size: int, crc: int) -> None:
        if size != info["size"] or ("crc32" in info and crc != info["crc32"]):
            raise _Gone(f"{where} on the fast path does not match its commit record")

    return check


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}"[:300]


def _log(message: str) -> None:
    print(f"slurmkit.checkpoint: {message}", file=sys.stderr, flush=True)


def _committed(tier: CheckpointDir, step: int) -> bool:
    """Whether ``tier`` holds a committed torch/pickle checkpoint ``step`` (files unchecked);
    :class:`CheckpointError` when it cannot tell or the commit record is damaged."""
    try:
        record = tier.record(step)
    except Invalid as exc:
        raise CheckpointError(f"checkpoint step {step}: {exc}") from None
    except Exception as exc:  # the store failed
        raise CheckpointError(f"checkpoint step {step}: {tier.root}: {_reason(exc)}") from exc
    return record is not None and record.get("kind") in WHOLE


_TRANSPORTS = ("aiobotocore", "aiohttp", "botocore", "fsspec", "gcsfs", "google", "s3fs", "urllib3")


def _transport(exc: BaseException) -> bool:
    """Whether ``exc`` comes from an object store's client library (a checksum of the
    transport's own that failed, say) rather than from unpickling the checkpoint."""
    return type(exc).__module__.split(".")[0] in _TRANSPORTS


def _skipping(step: int, where: str, why: Exception) -> None:
    warnings.warn(
        f"slurmkit.checkpoint: skipping step {step} ({where}): {why}", RuntimeWarning, stacklevel=4
    )


def _listed(problems: list[str], where: str, listing: Any) -> list[int]:
    try:
        return list(listing())
    except Exception as exc:  # a store that cannot be reached: the other tier may do
        problems.append(f"{where}: {_reason(exc)}")
        warnings.warn(
            f"slurmkit.checkpoint: cannot read {where}: {_reason(exc)}", RuntimeWarning, 3
        )
        return []
