"""The fast path's checkpoints: :class:`Checkpointer` saves (synchronously, or in the
background from a snapshot of the state), loads and resumes them, on one root (a local
directory or any fsspec URL; its layout and commit protocol: :mod:`.directory`), and hands each
commit to the mirror (:mod:`.mirror`) and the trial's journal (:mod:`.journal`). Stdlib only at
import.

The state is written with ``torch.save`` when torch is imported (tensors, state dicts, anything
picklable), else with pickle; checkpoints are trusted like code (``weights_only=False``).
"""

from __future__ import annotations

import os
import pickle
import secrets
import sys
import threading
import warnings
import weakref
from typing import Any, Literal

from .. import memory, pycompat
from .collectives import agree_step, collective, distributed
from .collectives import rank as default_rank
from .dcpread import storage_reader
from .directory import KINDS, WHOLE, CheckpointDir, Record, dirname, new_record, warn_skipping
from .fetch import Invalid
from .journal import record as journal
from .mirror import Mirror, MirrorStatus, attach
from .snapshot import Copies, Snapshot, dense_tree_bytes, owned_by
from .storage import CheckpointError, failure

_open: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


def _wait_all() -> None:
    for ckpt in list(_open):
        try:
            ckpt.wait_mirrored(ckpt.mirror_wait)
        except BaseException as exc:  # nothing left to raise it to
            print(f"slurmkit.checkpoint: last checkpoint not saved: {exc}", file=sys.stderr)


# A pending asynchronous save, its pruning and the mirror's uploads are waited for at exit while
# concurrent.futures still takes work (see slurmkit.runtime.pycompat for why atexit is too late)
pycompat.before_thread_shutdown(_wait_all)


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
        self.dir = CheckpointDir(root)
        self.store, self.root = self.dir.store, self.dir.root
        self.keep = keep
        self.async_save = async_save
        self._rank = rank
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._snapshot: Snapshot | None = None
        self._preparing: threading.Thread | None = None  # prepare() making the snapshot's buffers
        self._unprepared: BaseException | None = None  # why it failed
        self._hooks: list[Any] = []  # optimizer step-pre-hooks of an overlapped snapshot
        self.mirror: Mirror | None = attach(self.dir, mirror, mirror_keep, keep)
        if self.mirror is not None:
            weakref.finalize(self, self.mirror.stop).atexit = False  # a dropped Checkpointer
        self.mirror_wait = mirror_wait
        _open.add(self)

    @property
    def rank(self) -> int:
        return default_rank() if self._rank is None else self._rank

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the step directory's name and path, and its commit record (tests read them)
    _dirname = staticmethod(dirname)

    def _join(self, *parts: str) -> str:
        return self.dir.path(*parts)

    def _record(self, name: str) -> Record | None:
        return self.dir.record(int(name[5:]))

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
            self._snapshot = self._snapshot or Snapshot()
            snap, copies = self._snapshot.take(state, owned_by(optimizers))
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
        sizes = dense_tree_bytes(state)
        if sizes is None or not sizes[1] or sizes[0] > memory.available() // 2:
            return state
        try:
            return Snapshot(small_pinned=False).take(state)[0]
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

        snap = Snapshot()
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

    def _reserve(self, snap: Snapshot, plan: list[tuple[int, bool]], device: int | None) -> None:
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

    def _background(self, snap: Any, step: int, how: str, copies: Copies | None) -> None:
        try:
            if copies is not None:
                copies.finish()
            self._write(snap, step, how)
        except BaseException as exc:  # re-raised by the next save/wait/close
            self._error = exc

    @property
    def writing(self) -> bool:
        """Whether an asynchronous save (or the pruning after a save) is still under way."""
        return (self._thread is not None and self._thread.is_alive()) or self.dir.pruning

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
        self.dir.join()

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
            self.dir.close()
            if self._snapshot is not None:
                self._snapshot.drain()
            self._snapshot = None
            _open.discard(self)

    def _crc_pool(self) -> Any:
        """The checksum threads (see :meth:`.directory.CheckpointDir.crc_pool`)."""
        return self.dir.crc_pool()

    def _write(self, state: Any, step: int, how: str) -> None:
        self.dir.join()  # pruning must not see this save's uncommitted directory
        self._committed(self.dir.save(step, state, how))
        self.dir.prune_later(self.keep, step)

    def _committed(self, record: Record) -> None:
        """Tell the trial's journal and the mirror of a new commit."""
        step = record["step"]
        journal(step, record["time"], self.dir.step_path(step))  # trials/ID/checkpoints.jsonl
        if self.mirror is not None:
            self.mirror.put(step, record)

    # -- reading --

    def steps(self) -> list[int]:
        """Steps of the committed checkpoints, oldest first (files not verified)."""
        return self.dir.steps()

    def latest_step(self) -> int | None:
        """The newest step whose checkpoint is committed and checks out, or ``None``."""
        return self.dir.newest(KINDS)

    def load(self, step: int, *, map_location: Any = "cpu") -> Any:
        """The state saved as ``step``; :class:`CheckpointError` if it is missing or damaged."""
        return self.dir.load(step, map_location=map_location)

    def load_latest(self, *, map_location: Any = "cpu") -> tuple[int, Any] | None:
        """``(step, state)`` of the newest valid checkpoint, or ``None``.

        Torn, corrupt or half-written checkpoints are skipped with a warning; an error in
        unpickling a checkpoint that checks out is raised. With a mirror, the newest checkpoint
        valid on either tier (for one step, the fast path's copy first).
        """
        if self.mirror is not None:
            return self.mirror.load_newest(map_location)
        try:
            for step, record in self.dir.committed(WHOLE):
                try:
                    return step, self.dir.read(step, record, map_location=map_location)
                except Invalid as exc:
                    warn_skipping(step, exc)
        except OSError as exc:
            raise failure(exc, "cannot read checkpoints", self.root) from exc
        return None

    def resume(self, *, map_location: Any = "cpu") -> tuple[int, Any] | None:
        """Like :meth:`load_latest`, at the newest step valid on every rank (:func:`agree_step`)."""
        if self.mirror is not None:  # one read, usually the agreed step
            found = self.mirror.load_newest(map_location)
            step = agree_step(None if found is None else found[0])
            if step is None or (found is not None and found[0] == step):
                return found
            return step, self.mirror.load(step, map_location)
        found = self.load_latest(map_location=map_location)  # one read, usually the agreed step
        step = agree_step(None if found is None else found[0])
        if step is None:
            return None
        if found is not None and found[0] == step:
            return found
        found = None  # another rank lacks this step: free the state before loading the agreed one
        return step, self.load(step, map_location=map_location)

    # -- sharded state: torch.distributed.checkpoint --

    def save_sharded(self, state_dict: dict[str, Any], step: int) -> None:
        """Every rank: save sharded ``state_dict`` with torch.distributed.checkpoint, then commit.

        DCP writes (and fsyncs) each rank's shards into ``step-N/dcp-<token>/``; rank 0 then
        writes the commit record (file sizes; DCP keeps its own metadata) and prunes.
        """
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        self.wait()
        token = secrets.randbits(32)
        sub = f"dcp-{collective(token, 'broadcast') if distributed() else token:08x}"
        directory = self.dir.step_path(step)
        try:
            dcp.save(state_dict, checkpoint_id=self.store.url(self.dir.step_path(step, sub)))
            if distributed():
                dist.barrier()
            if self.rank == 0:
                self.store.sync_dir(self.root)
                files = {
                    f"{sub}/{rel.replace(os.sep, '/')}": {"size": size}
                    for rel, size in self.store.walk(self.dir.step_path(step, sub)).items()
                }
                record = new_record(step, "dcp", files)
                self.dir.commit(step, record)
                self._committed(record)
        except OSError as exc:
            raise failure(exc, f"checkpoint step {step} not saved", directory) from exc
        if self.rank == 0:
            self.dir.prune_later(self.keep, step)
            self.dir.join()
        if distributed():
            dist.barrier()

    def load_sharded(self, state_dict: dict[str, Any]) -> int | None:
        """Every rank: load the newest sharded checkpoint valid on all ranks into ``state_dict``
        in place (DCP reshards as needed); returns its step, or ``None`` when there is none."""
        import torch.distributed.checkpoint as dcp

        step = agree_step(self.dir.newest(("dcp",)))
        if step is None:
            return None
        record = self.dir.record_or_none(step)
        if record is None:
            raise CheckpointError(f"checkpoint step {step} vanished while loading: {self.root}")
        sub = next(iter(record["files"])).split("/")[0]
        reading = storage_reader(self.store, self.dir.step_path(step, sub))
        dcp.load(state_dict, storage_reader=reading)
        return step
