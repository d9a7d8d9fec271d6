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

import atexit
import contextlib
import copy
import json
import os
import pickle
import re
import secrets
import shutil
import sys
import threading
import time
import warnings
import weakref
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Iterator

from . import crc, memory, pinned

COMMIT = "COMMIT.json"
_TMP = ".tmp-"
_STEP_DIR = re.compile(r"step-(\d+)")
_BIG = 1 << 20  # writes from this size on overlap the CRC with the I/O
_WRITEBACK = 64 << 20  # start writeback every this many bytes
_ALIGN = 1 << 20  # ... of whole MiBs: the partial last page is still being written
_torch_save_lock = threading.Lock()


class CheckpointError(OSError):
    """A checkpoint could not be written or read; the message names the path and the reason."""

    def __init__(self, message: str, *, errno: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.path = path


class _Invalid(Exception):
    """A committed checkpoint whose files do not match its record."""


def _failure(exc: BaseException, action: str, path: str) -> CheckpointError:
    reason = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or repr(exc)
    return CheckpointError(f"{action}: {path}: {reason}", errno=getattr(exc, "errno", None),
                           path=path)


# --- storage: a local directory (os, with fsync) or an fsspec filesystem ----------------------

class _LocalSink:
    """A new file written with early writeback: every ``_WRITEBACK`` bytes, the kernel is told to
    start writing them out and to drop them from the page cache once clean. The final fsync then
    has little left to do, and a large checkpoint neither waits behind nor crowds the cache."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        self.written = 0
        self.kicked = 0

    def write(self, view: memoryview) -> None:
        while view:
            n = os.write(self.fd, view[:_WRITEBACK])
            view = view[n:]
            self.written += n
            if self.written - self.kicked >= _WRITEBACK and hasattr(os, "posix_fadvise"):
                start = max(0, self.kicked - _WRITEBACK)  # the window before: clean by now
                end = self.written & ~(_ALIGN - 1)
                os.posix_fadvise(self.fd, start, end - start, os.POSIX_FADV_DONTNEED)
                self.kicked = end

    def commit(self) -> None:
        os.fsync(self.fd)
        os.close(self.fd)

    def abort(self) -> None:
        os.close(self.fd)


class _Local:
    sep = os.sep

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)

    def url(self, path: str) -> str:
        return path

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def listdir(self, path: str) -> list[str]:
        try:
            return os.listdir(path)
        except FileNotFoundError:
            return []

    def sink(self, path: str) -> _LocalSink:
        return _LocalSink(path)

    def replace(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def open(self, path: str) -> Any:
        return open(path, "rb")

    def size(self, path: str) -> int:
        return os.stat(path).st_size

    def walk(self, path: str) -> dict[str, int]:
        return {os.path.relpath(os.path.join(d, f), path): os.stat(os.path.join(d, f)).st_size
                for d, _, files in os.walk(path) for f in files}

    def remove(self, path: str) -> None:
        """Remove a file or a whole directory."""
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


class _RemoteSink:
    def __init__(self, fs: Any, path: str) -> None:
        self.fh = fs.open(path, "wb")

    def write(self, view: memoryview) -> None:
        self.fh.write(view)

    def commit(self) -> None:
        self.fh.close()

    def abort(self) -> None:
        discard = getattr(self.fh, "discard", None)  # multipart uploads: drop the parts
        if discard is not None:
            discard()
        self.fh.close()


class _Remote:
    """Any fsspec filesystem. ``mv`` may be copy+delete there: the commit record keeps it safe."""

    sep = "/"

    def __init__(self, fs: Any, root: str) -> None:
        self.fs, self.root = fs, root.rstrip("/")

    def url(self, path: str) -> str:
        return self.fs.unstrip_protocol(path)

    def makedirs(self, path: str) -> None:
        self.fs.makedirs(path, exist_ok=True)

    def listdir(self, path: str) -> list[str]:
        self.fs.invalidate_cache(path)
        try:
            return [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(path, detail=False)]
        except FileNotFoundError:
            return []

    def sink(self, path: str) -> _RemoteSink:
        return _RemoteSink(self.fs, path)

    def replace(self, src: str, dst: str) -> None:
        self.fs.mv(src, dst)

    def sync_dir(self, path: str) -> None:
        pass

    def open(self, path: str) -> Any:
        return self.fs.open(path, "rb")

    def size(self, path: str) -> int:
        return int(self.fs.size(path))

    def walk(self, path: str) -> dict[str, int]:
        found = self.fs.find(path, detail=True)
        return {name[len(path):].lstrip("/"): int(info["size"]) for name, info in found.items()}

    def remove(self, path: str) -> None:
        self.fs.rm(path, recursive=True)


def _storage(root: str | os.PathLike[str]) -> _Local | _Remote:
    root = os.fspath(root)
    if "://" not in root and "::" not in root:
        return _Local(root)
    from fsspec.core import url_to_fs
    from fsspec.implementations.local import LocalFileSystem

    fs, path = url_to_fs(root)
    return _Local(path) if isinstance(fs, LocalFileSystem) else _Remote(fs, path)


# --- writing ----------------------------------------------------------------------------------

class _Writer:
    """File-like sink for pickle/torch.save: counts and CRC32s every byte on its way out.

    Small writes are buffered; a large one is written by ``pool``'s thread while this thread
    computes its CRC, with ``crc_pool``'s threads where there are spare CPUs (all release the
    GIL), so the checksum costs no extra time.
    """

    def __init__(self, sink: _LocalSink | _RemoteSink, pool: ThreadPoolExecutor,
                 crc_pool: ThreadPoolExecutor | None) -> None:
        self.sink, self.pool, self.crc_pool = sink, pool, crc_pool
        self.buf = bytearray()
        self.size = 0
        self.crc = 0

    def write(self, data: Any) -> int:
        with memoryview(data) as raw, raw.cast("B") as view:
            n = len(view)
            if n < _BIG:
                self.buf += view
                if len(self.buf) >= _BIG:
                    self.flush()
            else:
                self.flush()
                self._out(view)
        return n

    def flush(self) -> None:
        if self.buf:
            with memoryview(self.buf) as view:
                self._out(view)
            self.buf.clear()

    def _out(self, view: memoryview) -> None:
        if len(view) >= _BIG:
            done = self.pool.submit(self.sink.write, view)
            self.crc = crc.crc32(view, self.crc, self.crc_pool)
            done.result()
        else:
            self.sink.write(view)
            self.crc = zlib.crc32(view, self.crc)
        self.size += len(view)


def _dump(state: Any, how: str, fh: _Writer) -> None:
    """Serialize ``state`` into ``fh``: ``how`` is ``"torch"``, ``"pickle"`` or ``"bytes"`` (as is).

    torch.save runs without torch's own per-record CRC32 (the commit record's CRC covers the whole
    file); that option is global in torch, so it is switched off only for the save's duration.
    """
    if how == "bytes":
        fh.write(state)
    elif how == "pickle":
        pickle.dump(state, fh, protocol=5)
    else:
        import torch

        with _torch_save_lock:
            compute = torch.serialization.get_crc32_options()
            torch.serialization.set_crc32_options(False)
            try:
                torch.save(state, fh)  # type: ignore[arg-type]  # a file-like writer
            finally:
                torch.serialization.set_crc32_options(compute)


# --- async snapshots ----------------------------------------------------------------------------

_Key = tuple[int, str]


def _key(t: Any) -> _Key:
    """Identifies a tensor's storage: tensors sharing one are snapshotted once."""
    return (t.untyped_storage().data_ptr(), str(t.device))


def _dense(t: Any) -> bool:
    """A plain strided tensor with real memory: what a snapshot copies into its buffers (other
    tensors, e.g. sparse or subclasses, go through ``.to("cpu")``)."""
    torch = sys.modules["torch"]
    return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.layout == torch.strided
            and not t.is_quantized and t.device.type != "meta")


def _owned_by(optimizers: Any) -> frozenset[_Key]:
    """The storages an optimizer's ``step()`` changes: its parameters and its state's tensors."""
    import torch

    found = set()
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"overlap: expected torch optimizers, got {type(opt).__name__}")
        tensors = [p for group in opt.param_groups for p in group["params"]]
        tensors += [v for st in opt.state.values() for v in st.values()
                    if isinstance(v, torch.Tensor)]
        found.update(_key(t) for t in tensors)
    return frozenset(found)


class _Copies:
    """A snapshot's copies still under way: CPU copies the writer thread makes, CUDA copies
    queued on side streams (see :meth:`_Snapshot.take`)."""

    def __init__(self) -> None:
        self.cpu: list[tuple[Any, Any]] = []  # (destination, source) uint8 tensors
        self.events: list[tuple[Any, Any]] = []  # (device, CUDA event after the last copy)
        self.cpu_done = threading.Event()
        self.guarded = False

    def finish(self) -> None:
        """In the writer thread: make the CPU copies, wait for the CUDA ones."""
        try:
            for dst, src in self.cpu:
                dst.copy_(src)  # releases the GIL: the training loop runs meanwhile
        finally:
            self.cpu_done.set()
        for _, event in self.events:
            event.synchronize()

    def guard(self, *_: Any) -> None:
        """An optimizer step-pre-hook: the step must not change a tensor before its copy. The
        host waits for CPU copies; CUDA streams wait for CUDA copies (the host does not)."""
        if self.guarded:
            return
        self.guarded = True
        self.cpu_done.wait()
        import torch

        for device, event in self.events:
            torch.cuda.current_stream(device).wait_event(event)


class _Snapshot:
    """Copies a state's tensors into host buffers reused from one save to the next.

    CUDA tensors go into page-locked buffers (:mod:`.pinned`), copied on a side stream that
    first waits for the work already queued. Tensors sharing a storage still share one
    afterwards; containers are rebuilt, other objects deep-copied. Storages in ``deferred`` (those only an optimizer's
    step changes) are copied after :meth:`take` returns: see :class:`_Copies`.
    """

    def __init__(self, small_pinned: bool = True) -> None:
        import torch

        self.torch = torch
        self.small_pinned = small_pinned  # False: small CUDA tensors go into pageable memory
        # (storage, its pinned.HostBuffer or None when pageable) by order of first use
        self.buffers: list[tuple[Any, pinned.HostBuffer | None]] = []
        self.fresh: list[pinned.HostBuffer] = []  # pinned buffers made by this save
        self.memo: dict[_Key, Any] = {}  # this save's storages -> their buffers
        self.todo: list[tuple[Any, Any, bool]] = []  # (buffer, source storage, deferred)
        self.deferred: frozenset[_Key] = frozenset()
        self.streams: dict[Any, Any] = {}  # CUDA device -> side stream

    def take(self, state: Any,
             deferred: frozenset[_Key] = frozenset()) -> tuple[Any, _Copies | None]:
        """``(copy of state, copies still under way)``; without ``deferred``, the copies are
        done on return (``None``)."""
        self.deferred = deferred
        try:
            out = self._copy(state)
            del self.buffers[len(self.memo):]  # the state shrank: drop what it no longer uses
            pinned.lock(self.fresh)
            copies = self._start()
        except BaseException:
            self.drain()
            raise
        finally:
            self.memo.clear()
            self.todo = []
            self.fresh = []
        if deferred:
            return out, copies
        copies.finish()
        return out, None

    def drain(self) -> None:
        """Wait for the copies queued on the side streams (before buffers may be dropped)."""
        for side in self.streams.values():
            side.synchronize()

    def _start(self) -> _Copies:
        torch = self.torch
        copies = _Copies()
        cuda: dict[Any, list[tuple[Any, Any, bool]]] = {}
        for buf, src, later in self.todo:
            if src.device.type == "cuda":
                cuda.setdefault(src.device, []).append((buf, src, later))
            elif later:
                copies.cpu.append((self._bytes(buf), self._bytes(src)))
            else:
                buf.copy_(src)
        for device, todo in cuda.items():
            current = torch.cuda.current_stream(device)
            side = self.streams.get(device) or torch.cuda.Stream(device)
            self.streams[device] = side
            side.wait_stream(current)
            with torch.cuda.stream(side):
                for later in (False, True):  # what the next kernels may change goes first
                    for buf, src, deferred in todo:
                        if deferred == later:
                            buf.copy_(src, non_blocking=True)
                    if not later and self.deferred:
                        current.wait_event(side.record_event())
            for _, src, _ in todo:
                self._bytes(src).record_stream(side)  # its memory is not reused before the copy
            copies.events.append((device, side.record_event()))
        return copies

    def _bytes(self, storage: Any) -> Any:
        return self.torch.empty(0, dtype=self.torch.uint8, device=storage.device).set_(storage)

    def _copy(self, obj: Any) -> Any:
        torch = self.torch
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if isinstance(obj, dict):
            out = copy.copy(obj)  # keeps the type and attributes such as a state dict's _metadata
            for key, value in obj.items():
                out[key] = self._copy(value)
            return out
        if type(obj) is list:
            return [self._copy(v) for v in obj]
        if isinstance(obj, tuple):
            items = [self._copy(v) for v in obj]
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        return copy.deepcopy(obj)

    def _tensor(self, t: Any) -> Any:
        torch = self.torch
        if not _dense(t):
            return t.detach().to("cpu", copy=True)
        storage = t.untyped_storage()
        key = _key(t)
        buf = self.memo.get(key)
        if buf is None:
            buf = self._buffer(len(self.memo), storage.nbytes(), t.device.type == "cuda")
            self.todo.append((buf, storage, key in self.deferred))
            self.memo[key] = buf
        out = torch.empty(0, dtype=t.dtype).set_(buf, t.storage_offset(), t.size(), t.stride())
        if isinstance(t, torch.nn.Parameter):
            return torch.nn.Parameter(out, t.requires_grad)
        return out

    def _buffer(self, index: int, nbytes: int, cuda: bool) -> Any:
        """The host buffer for the ``index``-th storage of the state (page-locked for CUDA)."""
        locked = cuda and (self.small_pinned or nbytes >= pinned.REGISTER_FROM)
        if index < len(self.buffers):
            buf, host = self.buffers[index]
            if buf.nbytes() == nbytes and (host is not None) == locked:
                return buf
        host = None
        if locked:
            host = pinned.HostBuffer(nbytes)
            self.fresh.append(host)
            buf = host.storage
        else:
            buf = self.torch.empty(nbytes, dtype=self.torch.uint8).untyped_storage()
        if index < len(self.buffers):
            self.buffers[index] = (buf, host)
        else:
            self.buffers.append((buf, host))
        return buf


# --- the checkpointer ---------------------------------------------------------------------------

_open: weakref.WeakSet[Checkpointer] = weakref.WeakSet()


@atexit.register
def _wait_all() -> None:
    for ckpt in list(_open):
        try:
            ckpt.wait()
        except BaseException as exc:  # noqa: BLE001 - nothing left to raise it to
            print(f"slurmkit.checkpoint: last checkpoint not saved: {exc}", file=sys.stderr)


def _skipping(step: int, why: Exception) -> None:
    warnings.warn(f"slurmkit.checkpoint: skipping step {step}: {why}", RuntimeWarning, stacklevel=4)


def _plain_tensor_bytes(state: Any) -> tuple[int, int] | None:
    """Bytes of the tensor storages in ``state`` (each counted once): all, and on CUDA; None
    unless ``state`` is dicts, lists and tuples of dense tensors and plain values, all that a
    snapshot copies without a deep copy."""
    torch = sys.modules["torch"]
    seen: dict[_Key, int] = {}

    def plain(obj: Any) -> bool:
        if isinstance(obj, torch.Tensor):
            if not _dense(obj):
                return False
            seen[_key(obj)] = obj.untyped_storage().nbytes()
            return True
        if isinstance(obj, dict):
            return all(plain(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return all(plain(v) for v in obj)
        return obj is None or isinstance(obj, (bool, int, float, complex, str, bytes))

    if not plain(state):
        return None
    return sum(seen.values()), sum(n for (_, device), n in seen.items() if device.startswith("cuda"))


def _rank() -> int:
    if _distributed():
        return int(sys.modules["torch.distributed"].get_rank())
    return int(os.environ.get("RANK") or 0)


def agree_step(step: int | None) -> int | None:
    """The step every rank can resume from: the minimum of ``step`` over all ranks.

    ``None`` (no checkpoint) on any rank gives ``None``. Without an initialized
    ``torch.distributed`` this returns ``step`` itself.
    """
    if not _distributed():
        return step
    agreed = _collective(-1 if step is None else step, "min")
    return None if agreed < 0 else agreed


def _distributed() -> bool:
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def _collective(value: int, op: str) -> int:
    """``value`` reduced over all ranks (``"min"``), or rank 0's (``"broadcast"``)."""
    import torch
    import torch.distributed as dist

    device = (torch.device("cuda", torch.cuda.current_device())
              if dist.get_backend() == "nccl" else torch.device("cpu"))
    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    if op == "min":
        dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    else:
        dist.broadcast(tensor, src=0)
    return int(tensor.item())


class Checkpointer:
    """Saves and loads checkpoints under ``root`` (a directory or an fsspec URL).

    ``keep``: committed checkpoints kept (the newest by step). ``async_save``: ``save`` takes a
    snapshot and returns; one background thread writes it. ``rank``: only rank 0 writes in
    :meth:`save` (replicated state, e.g. DDP); default: torch.distributed's rank once it is
    initialized, else ``RANK`` (torchrun), else 0. :meth:`save_sharded` is for sharded state
    (every rank writes). One writing process per ``root``.
    """

    def __init__(self, root: str | os.PathLike[str], *, keep: int = 3, async_save: bool = False,
                 rank: int | None = None) -> None:
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
        self._hooks: list[Any] = []  # optimizer step-pre-hooks of an overlapped snapshot
        self._verified: dict[int, dict[str, Any]] = {}
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
        may still take: see :mod:`.memory`).
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
            optimizers = [] if overlap is None else (
                list(overlap) if isinstance(overlap, (list, tuple)) else [overlap])
            self._snapshot = self._snapshot or _Snapshot()
            snap, copies = self._snapshot.take(state, _owned_by(optimizers))
            if copies is not None:
                self._hooks = [opt.register_step_pre_hook(copies.guard) for opt in optimizers]
        else:
            snap, how = pickle.dumps(state, protocol=5), "bytes"
        self._thread = threading.Thread(target=self._background, args=(snap, step, how, copies),
                                        name=f"slurmkit-checkpoint-{step}")
        self._thread.start()

    @staticmethod
    def _staged(state: Any) -> Any:
        """What a sync save writes: for CUDA state, a copy in host memory, page-locked where
        large and released after the write (``torch.save`` would copy each storage through
        pageable memory, ~1.7x slower), when it fits in half of what this process may still
        take; otherwise ``state`` itself."""
        sizes = _plain_tensor_bytes(state)
        if sizes is None or not sizes[1] or sizes[0] > memory.available() // 2:
            return state
        try:
            return _Snapshot(small_pinned=False).take(state)[0]
        except (RuntimeError, MemoryError):  # out of host or lockable memory: torch.save's way
            return state

    def _background(self, snap: Any, step: int, how: str, copies: _Copies | None) -> None:
        try:
            if copies is not None:
                copies.finish()
            self._write(snap, step, how)
        except BaseException as exc:  # noqa: BLE001 - re-raised by the next save/wait/close
            self._error = exc

    @property
    def writing(self) -> bool:
        """Whether an asynchronous save (or the pruning after a save) is still under way."""
        return ((self._thread is not None and self._thread.is_alive())
                or (self._pruning is not None and not self._pruning.done()))

    def wait(self) -> None:
        """Wait for the pending asynchronous write and pruning; raise the write's error, if any."""
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

    def close(self) -> None:
        """Wait for the pending write and pruning; release the I/O thread and snapshot buffers."""
        try:
            self.wait()
        finally:
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
                record = {"format": 1, "step": step, "kind": kind, "time": time.time(),
                          "files": files}
                self._commit(directory, record)
            except BaseException:
                self._remove(directory if fresh else self.store.sep.join([directory, data]))
                raise
            self.store.sync_dir(directory)
        except OSError as exc:
            raise _failure(exc, f"checkpoint step {step} not saved", directory) from exc
        self._verified[step] = record
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

    def _remove(self, path: str) -> None:
        with contextlib.suppress(OSError):
            self.store.remove(path)

    def _prune(self, current: int) -> None:
        """Keep the newest ``keep`` committed checkpoints (and ``current``); remove the rest."""
        try:
            dirs = self._dirs()
            records = {step: self._record_or_none(name) for step, name in dirs.items()}
            committed = sorted(step for step, rec in records.items() if rec is not None)
            kept = set(committed[-self.keep:]) | {current}
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
            warnings.warn(f"slurmkit.checkpoint: pruning {self.root} failed: {exc}",
                          RuntimeWarning, stacklevel=2)

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
            ok = (record["step"] == int(name[5:]) and isinstance(record["files"], dict)
                  and all(isinstance(v["size"], int) for v in record["files"].values()))
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
            self._verify(step, record)
            return self._deserialize(step, record, map_location)
        except _Invalid as exc:
            raise CheckpointError(f"checkpoint step {step}: {self._join(name)}: {exc}") from None
        except OSError as exc:
            raise _failure(exc, f"cannot read checkpoint step {step}", self._join(name)) from exc

    def load_latest(self, *, map_location: Any = "cpu") -> tuple[int, Any] | None:
        """``(step, state)`` of the newest valid checkpoint, or ``None``.

        Torn, corrupt or half-written checkpoints are skipped with a warning; an error in
        unpickling a checkpoint that checks out is raised.
        """
        try:
            for step, record in self._valid(("torch", "pickle")):
                return step, self._deserialize(step, record, map_location)
        except OSError as exc:
            raise _failure(exc, "cannot read checkpoints", self.root) from exc
        return None

    def resume(self, *, map_location: Any = "cpu") -> tuple[int, Any] | None:
        """Like :meth:`load_latest`, at the newest step valid on every rank (:func:`agree_step`)."""
        step = agree_step(self._newest(("torch", "pickle")))
        return None if step is None else (step, self.load(step, map_location=map_location))

    def _deserialize(self, step: int, record: dict[str, Any], map_location: Any) -> Any:
        (name,) = record["files"]
        path = self._join(self._dirname(step), name)
        if record["kind"] == "pickle":
            with self.store.open(path) as fh:
                return pickle.load(fh)
        import torch

        if isinstance(self.store, _Local):
            return torch.load(path, map_location=map_location, weights_only=False)
        with self.store.open(path) as fh:
            return torch.load(fh, map_location=map_location, weights_only=False)

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
                files = {f"{sub}/{rel.replace(os.sep, '/')}": {"size": size}
                         for rel, size in self.store.walk(self._join(name, sub)).items()}
                record = {"format": 1, "step": step, "kind": "dcp", "time": time.time(),
                          "files": files}
                self._commit(directory, record)
                self.store.sync_dir(directory)
                self._verified[step] = record
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
        dcp.load(state_dict, checkpoint_id=self.store.url(self._join(self._dirname(step), sub)))
        return step
