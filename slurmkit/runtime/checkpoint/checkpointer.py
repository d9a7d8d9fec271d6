"""Atomic, checksummed checkpoints on a local directory or any fsspec URL (stdlib only at import).

Layout under ``root``::

    step-000000001200/
        COMMIT.json          the commit record: the checkpoint exists only once this file does
        state-1f2e3d4c.pt    torch.save output (``.pkl``: plain pickle; ``dcp-<token>/``: sharded)
        .tmp-...             a write in progress, or a crash's leftover: never read, removed later

A save writes each file under a ``.tmp-`` name, flushes and fsyncs it, renames it into place,
fsyncs the directory, then writes ``COMMIT.json`` (step, files, sizes, CRC32s, time) the same
way. Readers trust only committed checkpoints whose files match their record, so a kill at any
point leaves the previous checkpoint loadable. Older checkpoints are pruned (``keep``) only
after the new commit is durable.

The state is written with ``torch.save`` when torch is imported (tensors, state dicts, anything
picklable), else with pickle; checkpoints are trusted like code (``weights_only=False``).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import secrets
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal

from .. import crc, memory
from .collectives import _collective, _distributed, _rank, agree_step
from .dcpread import storage_reader
from .fetch import Invalid as _Invalid
from .journal import record as journal
from .reader import read
from .snapshot import _Copies, _dense_tree_bytes, _owned_by, _Snapshot
from .storage import CheckpointError, _failure, _storage
from .writer import _dump, _Writer

if TYPE_CHECKING:
    from .mirror import Mirror, MirrorStatus

COMMIT = "COMMIT.json"
_TMP = ".tmp-"
_STEP_DIR = re.compile(r"step-(\d+)")


_open: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


def _wait_all() -> None:
    for ckpt in list(_open):
        try:
            ckpt.wait_mirrored(ckpt.mirror_wait)
        except BaseException as exc:  # nothing left to raise it to
            print(f"slurmkit.checkpoint: last checkpoint not saved: {exc}", file=sys.stderr)


# At exit, before concurrent.futures stops taking work (an atexit hook would run after that,
# and a pending asynchronous save could then not write nor prune)
threading._register_atexit(_wait_all)  # type: ignore[attr-defined]


def _skipping(step: int, why: Exception) -> None:
    warnings.warn(f"slurmkit.checkpoint: skipping step {step}: {why}", RuntimeWarning, stacklevel=4)


class Checkpointer:
    """Saves and loads checkpoints under ``root`` (a directory or an fsspec URL).

    ``keep``: committed checkpoints kept (the newest by step). ``async_save``: ``save`` takes a
    snapshot and returns; one background thread writes it. ``rank``: only rank 0 writes in
    :meth:`save` (replicated state, e.g. DDP); default: torch.distributed's rank once it is
    initialized, else ``RANK`` (torchrun), else 0. :meth:`save_sharded` is for sharded state
    (every rank writes). One writing process per ``root``.

    ``mirror``: a second root (e.g. ``s3://bucket/run``) that a background thread copies each
    committed checkpoint to, keeping ``mirror_keep`` (default: ``keep``); :meth:`load_latest`
    restores the newest checkpoint valid on either. Default: ``SLURMKIT_CHECKPOINT_MIRROR``
    (see :func:`.mirror.from_environment`); ``False``: none. ``close()`` and the interpreter's
    exit wait ``mirror_wait`` seconds at most for the uploads left.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        keep: int = 3,
        async_save: bool = False,
        rank: int | None = None,
        mirror: str | os.PathLike[str] | Literal[False] | None = None,
        mirror_keep: int | None = None,
        mirror_wait: float = 60.0,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be >= 1")
        self.store = _storage(root)
        self.root = self.store.root
        self.keep = keep
        self.async_save = async_save
        self._rank = rank
        self._pool: ThreadPoolExecutor | None = None
        self._crcs: ThreadPoolExecutor | None = None
        self._pruning: Future[None] | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._snapshot: _Snapshot | None = None
        self._preparing: threading.Thread | None = None  # prepare() making the snapshot's buffers
        self._unprepared: BaseException | None = None  # why it failed
        self._hooks: list[Any] = []  # optimizer step-pre-hooks of an overlapped snapshot
        self._verified: dict[int, dict[str, Any]] = {}
        from .mirror import attach  # the mirror module builds on this one

        self.mirror: Mirror | None = attach(self, mirror, mirror_keep)
        self.mirror_wait = mirror_wait
        _open.add(self)

    @property
    def rank(self) -> int:
        return _rank() if self._rank is None else self._rank

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _join(self, *parts: str) -> str:
        return self.store.sep.join([self.root, *parts])

    @staticmethod
    def _dirname(step: int) -> str:
        return f"step-{step:012d}"

    # -- saving --

    def save(self, state: Any, step: int, *, overlap: Any = None) -> None:
        """Save ``state`` as checkpoint ``step``; a no-op on ranks other than 0.

        Synchronous: returns once the checkpoint is committed (CUDA tensors go through a
        page-locked host copy released afterwards, when it fits in half the memory this process
        may still take: see :mod:`slurmkit.runtime.memory`).
        Asynchronous: waits for the previous write, snapshots ``state`` (tensors to host
        memory) and returns.

        ``overlap`` (asynchronous saves of torch state): the optimizer, or a list of them, whose
        ``step()`` alone changes the state's parameters and optimizer state in place. Those
        tensors are then copied while the loop runs the next forward and backward pass, and the
        optimizer's next ``step()`` waits for their copy (on CUDA the stream waits, the host does
        not); other tensors are copied before ``save`` returns.
        """
        if step < 0:
            raise ValueError(f"step must be >= 0, not {step}")
        self.wait()
        if self.rank != 0:
            return
        how = "torch" if "torch" in sys.modules else "pickle"
        if not self.async_save:
            self._write(self._staged(state) if how == "torch" else state, step, how)
            return
        copies = None
        if how == "torch":
            optimizers = (
                []
                if overlap is None
                else (list(overlap) if isinstance(overlap, (list, tuple)) else [overlap])
            )
            self._snapshot = self._snapshot or _Snapshot()
            snap, copies = self._snapshot.take(state, _owned_by(optimizers))
            if copies is not None:
                self._hooks = [opt.register_step_pre_hook(copies.guard) for opt in optimizers]
        else:
            snap, how = pickle.dumps(state, protocol=5), "bytes"
        self._thread = threading.Thread(
            target=self._background,
            args=(snap, step, how, copies),
            name=f"slurmkit-checkpoint-{step}",
        )
        self._thread.start()

    @staticmethod
    def _staged(state: Any) -> Any:
        """What a sync save writes: for CUDA state, a copy in host memory, page-locked where
        large and released after the write (``torch.save`` would copy each storage through
        pageable memory, ~1.7x slower), when it fits in half of what this process may still
        take; otherwise ``state`` itself."""
        sizes = _dense_tree_bytes(state)
        if sizes is None or not sizes[1] or sizes[0] > memory.available() // 2:
            return state
        try:
            return _Snapshot(small_pinned=False).take(state)[0]
        except (RuntimeError, MemoryError):  # out of host or lockable memory: torch.save's way
            return state

    def prepare(self, state: Any) -> None:
        """Asynchronous saves of torch state: make the host buffers that a save of ``state``
        copies into (page-locked for CUDA tensors) in a background thread, so that the first
        :meth:`save` blocks no longer than the later ones.

        ``state``: what the saves will pass, or one with the same structure and tensor sizes
        (an optimizer's state exists once it has stepped). Returns at once; a save that comes
        before the buffers are made waits for them. A no-op for synchronous saves, without
        torch, on ranks other than 0, and once a save or a prepare was made.
        """
        if (
            not self.async_save
            or "torch" not in sys.modules
            or self._snapshot is not None
            or self.rank != 0
        ):
            return
        import torch

        snap = _Snapshot()
        plan = snap.plan(state)
        device = torch.cuda.current_device() if any(cuda for _, cuda in plan) else None
        thread = threading.Thread(
            target=self._reserve,
            args=(snap, plan, device),
            name="slurmkit-checkpoint-prepare",
            daemon=True,
        )
        thread.start()
        self._preparing, self._snapshot = thread, snap

    def _reserve(self, snap: _Snapshot, plan: list[tuple[int, bool]], device: int | None) -> None:
        try:
            if device is not None:
                import torch

                torch.cuda.set_device(device)  # a new thread's device is 0
            snap.reserve(plan)
        except BaseException as exc:  # the first save makes its buffers itself
            self._unprepared = exc

    def _prepared(self) -> None:
        """Wait for :meth:`prepare`'s thread (a thread's own lock: safe in a signal handler)."""
        if self._preparing is None:
            return
        self._preparing.join()
        self._preparing = None
        if self._unprepared is not None:
            warnings.warn(
                f"slurmkit.checkpoint: preparing the snapshot buffers failed "
                f"({self._unprepared!r}); the first save makes them",
                RuntimeWarning,
                stacklevel=3,
            )
            self._unprepared = self._snapshot = None

    def _background(self, snap: Any, step: int, how: str, copies: _Copies | None) -> None:
        try:
            if copies is not None:
                copies.finish()
            self._write(snap, step, how)
        except BaseException as exc:  # re-raised by the next save/wait/close
            self._error = exc

    @property
    def writing(self) -> bool:
        """Whether an asynchronous save (or the pruning after a save) is still under way."""
        return (self._thread is not None and self._thread.is_alive()) or (
            self._pruning is not None and not self._pruning.done()
        )

    def wait(self) -> None:
        """Wait for the pending asynchronous write and pruning; raise the write's error, if any."""
        self._prepared()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        error, self._error = self._error, None
        if error is not None:
            raise error
        self._pruned()

    def _pruned(self) -> None:
        if self._pruning is not None:
            self._pruning.result()
            self._pruning = None

    def wait_mirrored(self, timeout: float | None = None) -> bool:
        """Wait for the pending write, then up to ``timeout`` seconds for the mirror's uploads;
        True when the last committed checkpoint is on the mirror (or there is no mirror)."""
        self.wait()
        return self.mirror is None or self.mirror.wait(timeout)

    def mirror_status(self) -> MirrorStatus | None:
        """What the mirror's uploader is doing (``None`` without a mirror)."""
        return None if self.mirror is None else self.mirror.status

    def close(self) -> None:
        """Wait for the pending write and pruning, and up to ``mirror_wait`` seconds for the
        mirror; release the I/O and upload threads and the snapshot buffers."""
        try:
            self.wait_mirrored(self.mirror_wait)
        finally:
            if self.mirror is not None:
                self.mirror.stop()
            for pool in (self._pool, self._crcs):
                if pool is not None:
                    pool.shutdown()
            self._pool = self._crcs = None
            self._pruning = None
            if self._snapshot is not None:
                self._snapshot.drain()
            self._snapshot = None
            _open.discard(self)

    def _crc_pool(self) -> ThreadPoolExecutor | None:
        """Threads for checksums of large files; ``None`` where one thread is all there is."""
        if self._crcs is None and crc.threads() > 1:
            self._crcs = ThreadPoolExecutor(crc.threads(), thread_name_prefix="slurmkit-crc")
        return self._crcs

    def _io(self) -> ThreadPoolExecutor:
        """The helper thread: file writes overlapping the CRC, then pruning after a commit."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="slurmkit-checkpoint-io")
        return self._pool

    def _write(self, state: Any, step: int, how: str) -> None:
        self._pruned()  # pruning must not see this save's uncommitted directory
        name = self._dirname(step)
        directory = self._join(name)
        kind = "torch" if how == "torch" else "pickle"
        data = f"state-{secrets.token_hex(4)}.{'pt' if kind == 'torch' else 'pkl'}"
        try:
            fresh = self._record_or_none(name) is None
            try:
                self.store.makedirs(directory)
                if fresh:
                    self.store.sync_dir(self.root)
                files = {data: self._write_file(directory, data, state, how)}
                record = {
                    "format": 1,
                    "step": step,
                    "kind": kind,
                    "time": time.time(),
                    "files": files,
                }
                self._commit(directory, record)
            except BaseException:
                self._remove(directory if fresh else self.store.sep.join([directory, data]))
                raise
            self.store.sync_dir(directory)
        except OSError as exc:
            raise _failure(exc, f"checkpoint step {step} not saved", directory) from exc
        self._verified[step] = record
        if self.mirror is not None:
            self.mirror.put(step, record)
        self._pruning = self._io().submit(self._prune, step)

    def _write_file(self, directory: str, name: str, state: Any, how: str) -> dict[str, int]:
        """Write ``directory/name`` through a temporary file; its size and CRC32."""
        tmp = self.store.sep.join([directory, f"{_TMP}{name}.{secrets.token_hex(4)}"])
        sink = self.store.sink(tmp)
        try:
            fh = _Writer(sink, self._io(), self._crc_pool())
            _dump(state, how, fh)
            fh.flush()
            sink.commit()
        except BaseException:
            with contextlib.suppress(Exception):  # the first error is the one to report
                sink.abort()
            self._remove(tmp)
            raise
        try:
            self.store.replace(tmp, self.store.sep.join([directory, name]))
        except BaseException:
            self._remove(tmp)
            raise
        return {"size": fh.size, "crc32": fh.crc}

    def _commit(self, directory: str, record: dict[str, Any]) -> None:
        """Make the renamed data files durable, then write the commit record (the caller syncs
        the directory once more for the record's own rename)."""
        self.store.sync_dir(directory)
        body = (json.dumps(record, indent=1, sort_keys=True) + "\n").encode()
        self._write_file(directory, COMMIT, body, "bytes")
        journal(record["step"], record["time"], directory)  # trials/ID/checkpoints.jsonl

    def _remove(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.store.remove(path)

    def _prune(self, current: int) -> None:
        """Keep the newest ``keep`` committed checkpoints (and ``current``); remove the rest."""
        try:
            dirs = self._dirs()
            records = {step: self._record_or_none(name) for step, name in dirs.items()}
            committed = sorted(step for step, rec in records.items() if rec is not None)
            kept = set(committed[-self.keep :]) | {current}
            for step, name in dirs.items():
                record = records[step]
                if step not in kept:
                    if record is not None:
                        self.store.remove(self._join(name, COMMIT))
                    self.store.remove(self._join(name))
                    self._verified.pop(step, None)
                elif record is not None:
                    used = {f.split("/")[0] for f in record["files"]} | {COMMIT}
                    for entry in self.store.listdir(self._join(name)):
                        if entry not in used:
                            self.store.remove(self._join(name, entry))
        except OSError as exc:
            warnings.warn(
                f"slurmkit.checkpoint: pruning {self.root} failed: {exc}",
                RuntimeWarning,
                stacklevel=2,
            )

    # -- reading --

    def _dirs(self) -> dict[int, str]:
        found = {}
        for entry in self.store.listdir(self.root):
            match = _STEP_DIR.fullmatch(entry)
            if match:
                found[int(match.group(1))] = entry
        return found

    def _record(self, name: str) -> dict[str, Any] | None:
        """The commit record of step directory ``name``; ``None`` if it has none (yet).

        Raises :class:`_Invalid` for a damaged record."""
        try:
            with self.store.open(self._join(name, COMMIT)) as fh:
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
            raise _Invalid(f"damaged commit record {self._join(name, COMMIT)}")
        return record

    def _record_or_none(self, name: str) -> dict[str, Any] | None:
        try:
            return self._record(name)
        except _Invalid:
            return None

    def _committed(self, kinds: tuple[str, ...]) -> list[tuple[int, dict[str, Any]]]:
        """Committed checkpoints of these kinds, newest first (files not yet verified)."""
        out = []
        for step, name in sorted(self._dirs().items(), reverse=True):
            try:
                record = self._record(name)
            except _Invalid as exc:
                _skipping(step, exc)
                continue
            if record is not None and record.get("kind") in kinds:
                out.append((step, record))
        return out

    def steps(self) -> list[int]:
        """Steps of the committed checkpoints, oldest first (files not verified)."""
        return [step for step, _ in reversed(self._committed(("torch", "pickle", "dcp")))]

    def _verify(self, step: int, record: dict[str, Any]) -> None:
        if self._verified.get(step) == record:
            return
        directory = self._join(self._dirname(step))
        for rel, info in record["files"].items():
            path = self.store.sep.join([directory, rel])
            try:
                if "crc32" in info:
                    size, crc = self._checksum(path)
                else:
                    size, crc = self.store.size(path), None
            except FileNotFoundError:
                raise _Invalid(f"missing {path}") from None
            if size != info["size"]:
                raise _Invalid(f"{path} has {size} bytes, its record says {info['size']}")
            if crc != info.get("crc32"):
                raise _Invalid(f"checksum mismatch in {path}")
        self._verified[step] = record

    def _checksum(self, path: str) -> tuple[int, int]:
        with self.store.open(path) as fh:
            return crc.of_stream(fh, self._crc_pool())

    def _valid(self, kinds: tuple[str, ...]) -> Iterator[tuple[int, dict[str, Any]]]:
        """Committed checkpoints whose files check out, newest first; warns about the others."""
        for step, record in self._committed(kinds):
            try:
                self._verify(step, record)
            except _Invalid as exc:
                _skipping(step, exc)
                continue
            yield step, record

    def _newest(self, kinds: tuple[str, ...]) -> int | None:
        try:
            return next((step for step, _ in self._valid(kinds)), None)
        except OSError as exc:
            raise _failure(exc, "cannot read checkpoints", self.root) from exc

    def latest_step(self) -> int | None:
        """The newest step whose checkpoint is committed and checks out, or ``None``."""
        return self._newest(("torch", "pickle", "dcp"))

    def load(self, step: int, *, map_location: Any = "cpu") -> Any:
        """The state saved as ``step``; :class:`CheckpointError` if it is missing or damaged."""
        name = self._dirname(step)
        try:
            record = self._record(name)
            if record is None or record.get("kind") not in ("torch", "pickle"):
                raise _Invalid("no committed torch/pickle checkpoint there")
            return self._deserialize(step, record, map_location)
        except _Invalid as exc:
            raise CheckpointError(f"checkpoint step {step}: {self._join(name)}: {exc}") from None
        except OSError as exc:
            raise _failure(exc, f"cannot read checkpoint step {step}", self._join(name)) from exc

    def load_latest(self, *, map_location: Any = "cpu") -> tuple[int, Any] | None:
        """``(step, state)`` of the newest valid checkpoint, or ``None``.

        Torn, corrupt or half-written checkpoints are skipped with a warning; an error in
        unpickling a checkpoint that checks out is raised. With a mirror, the newest checkpoint
        valid on either tier (for one step, the fast path's copy first).
        """
        if self.mirror is not None:
            return self.mirror.load_newest(self, map_location)
        try:
            for step, record in self._committed(("torch", "pickle")):
                try:
                    return step, self._deserialize(step, record, map_location)
                except _Invalid as exc:
                    _skipping(step, exc)
        except OSError as exc:
            raise _failure(exc, "cannot read checkpoints", self.root) from exc
        return None

    def resume(self, *, map_location: Any = "cpu") -> tuple[int, Any] | None:
        """Like :meth:`load_latest`, at the newest step valid on every rank (:func:`agree_step`)."""
        if self.mirror is not None:  # one read, usually the agreed step
            found = self.mirror.load_newest(self, map_location)
            step = agree_step(None if found is None else found[0])
            if step is None or (found is not None and found[0] == step):
                return found
            return step, self.mirror.load(self, step, map_location)
        found = self.load_latest(map_location=map_location)  # one read, usually the agreed step
        step = agree_step(None if found is None else found[0])
        if step is None:
            return None
        if found is not None and found[0] == step:
            return found
        found = None  # another rank lacks this step: free the state before loading the agreed one
        return step, self.load(step, map_location=map_location)

    def _deserialize(self, step: int, record: dict[str, Any], map_location: Any) -> Any:
        """The state of checkpoint ``step``, its file checked while read (:func:`.reader.read`);
        :class:`_Invalid` when it does not match ``record``."""
        state = read(self.store, self._join(self._dirname(step)), record, map_location=map_location)
        self._verified[step] = record
        return state

    # -- sharded state: torch.distributed.checkpoint --

    def save_sharded(self, state_dict: dict[str, Any], step: int) -> None:
        """Every rank: save sharded ``state_dict`` with torch.distributed.checkpoint, then commit.

        DCP writes (and fsyncs) each rank's shards into ``step-N/dcp-<token>/``; rank 0 then
        writes the commit record (file sizes; DCP keeps its own metadata) and prunes.
        """
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        self.wait()
        name = self._dirname(step)
        token = secrets.randbits(32)
        sub = f"dcp-{_collective(token, 'broadcast') if _distributed() else token:08x}"
        directory = self._join(name)
        try:
            dcp.save(state_dict, checkpoint_id=self.store.url(self._join(name, sub)))
            if _distributed():
                dist.barrier()
            if self.rank == 0:
                self.store.sync_dir(self.root)
                files = {
                    f"{sub}/{rel.replace(os.sep, '/')}": {"size": size}
                    for rel, size in self.store.walk(self._join(name, sub)).items()
                }
                record = {
                    "format": 1,
                    "step": step,
                    "kind": "dcp",
                    "time": time.time(),
                    "files": files,
                }
                self._commit(directory, record)
                self.store.sync_dir(directory)
                self._verified[step] = record
                if self.mirror is not None:
                    self.mirror.put(step, record)
        except OSError as exc:
            raise _failure(exc, f"checkpoint step {step} not saved", directory) from exc
        if self.rank == 0:
            self._prune(step)
        if _distributed():
            dist.barrier()

    def load_sharded(self, state_dict: dict[str, Any]) -> int | None:
        """Every rank: load the newest sharded checkpoint valid on all ranks into ``state_dict``
        in place (DCP reshards as needed); returns its step, or ``None`` when there is none."""
        import torch.distributed.checkpoint as dcp

        step = agree_step(self._newest(("dcp",)))
        if step is None:
            return None
        record = self._record_or_none(self._dirname(step))
        if record is None:
            raise CheckpointError(f"checkpoint step {step} vanished while loading: {self.root}")
        sub = next(iter(record["files"])).split("/")[0]
        directory = self._join(self._dirname(step), sub)
        dcp.load(state_dict, storage_reader=storage_reader(self.store, directory))
        return step
