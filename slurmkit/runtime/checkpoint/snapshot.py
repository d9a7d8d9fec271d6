"""Host copies of a state's tensors, for asynchronous saves and staged synchronous ones:
:class:`Snapshot` copies CPU and CUDA storages into buffers reused from one save to the next,
:class:`Copies` tracks the copies still under way; :func:`_key`, :func:`_dense` and
:func:`dense_tree_bytes` say which storages a state holds, :func:`owned_by` which of them an
optimizer's step changes.
"""

from __future__ import annotations

import copy
import sys
import threading
from typing import Any

from .. import pinned

_Key = tuple[int, str]


def _key(t: Any) -> _Key:
    """Identifies a tensor's storage: tensors sharing one are snapshotted once."""
    return (t.untyped_storage().data_ptr(), str(t.device))


def _dense(t: Any) -> bool:
    """A strided tensor of torch's own types with real memory: what a snapshot copies into its
    buffers (other tensors, e.g. sparse or subclasses, go through ``.to("cpu")``)."""
    torch = sys.modules["torch"]
    return (
        type(t) in (torch.Tensor, torch.nn.Parameter)
        and t.layout == torch.strided
        and not t.is_quantized
        and t.device.type != "meta"
    )


def owned_by(optimizers: Any) -> frozenset[_Key]:
    """The storages an optimizer's ``step()`` changes: its parameters and its state's tensors."""
    import torch

    found: set[_Key] = set()
    for opt in optimizers:
        if not isinstance(opt, torch.optim.Optimizer):
            raise TypeError(f"overlap: expected torch optimizers, got {type(opt).__name__}")
        tensors = [p for group in opt.param_groups for p in group["params"]]
        tensors += [
            v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)
        ]
        found.update(_key(t) for t in tensors)
    return frozenset(found)


def dense_tree_bytes(state: Any) -> tuple[int, int] | None:
    """Bytes of the tensor storages in ``state`` (each counted once): all, and on CUDA; None
    unless ``state`` is dicts, lists and tuples of dense tensors, numbers, strings, bytes and
    None, all that a snapshot copies without a deep copy."""
    torch = sys.modules["torch"]
    seen: dict[_Key, int] = {}

    def tree(obj: Any) -> bool:
        if isinstance(obj, torch.Tensor):
            if not _dense(obj):
                return False
            seen[_key(obj)] = obj.untyped_storage().nbytes()
            return True
        if isinstance(obj, dict):
            return all(tree(v) for v in obj.values())
        if isinstance(obj, (list, tuple)):
            return all(tree(v) for v in obj)
        return obj is None or isinstance(obj, (bool, int, float, complex, str, bytes))

    if not tree(state):
        return None
    cuda = sum(n for (_, device), n in seen.items() if device.startswith("cuda"))
    return sum(seen.values()), cuda


class Copies:
    """A snapshot's copies still under way: CPU copies the writer thread makes, CUDA copies
    queued on side streams (see :meth:`Snapshot.take`)."""

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


class Snapshot:
    """Copies a state's tensors into host buffers reused from one save to the next.

    CUDA tensors go into page-locked buffers (:mod:`~slurmkit.runtime.pinned`), copied on a
    side stream that first waits for the work already queued. Tensors sharing a storage still
    share one afterwards; containers are rebuilt, other objects deep-copied. Storages in
    ``deferred`` (those only an optimizer's step changes) are copied after :meth:`take`
    returns: see :class:`Copies`.
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

    def take(
        self, state: Any, deferred: frozenset[_Key] = frozenset()
    ) -> tuple[Any, Copies | None]:
        """``(copy of state, copies still under way)``; without ``deferred``, the copies are
        done on return (``None``)."""
        self.deferred = deferred
        try:
            out = self._copy(state)
            del self.buffers[len(self.memo) :]  # the state shrank: drop what it no longer uses
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

    @staticmethod
    def plan(state: Any) -> list[tuple[int, bool]]:
        """``(bytes, on CUDA)`` of each storage that :meth:`take` copies into a buffer, in the
        order it meets them (what :meth:`reserve` makes ahead of a first save)."""
        torch = sys.modules["torch"]
        seen: set[_Key] = set()
        out: list[tuple[int, bool]] = []

        def walk(obj: Any) -> None:
            if isinstance(obj, torch.Tensor):
                if _dense(obj) and _key(obj) not in seen:
                    seen.add(_key(obj))
                    out.append((obj.untyped_storage().nbytes(), obj.device.type == "cuda"))
            elif isinstance(obj, dict):
                for value in obj.values():
                    walk(value)
            elif type(obj) is list or isinstance(obj, tuple):
                for value in obj:
                    walk(value)

        walk(state)
        return out

    def reserve(self, plan: list[tuple[int, bool]]) -> None:
        """Make the buffers that a :meth:`take` of a state with this :meth:`plan` copies into,
        page-locked where they will be (other new ones have their pages touched): that take
        then allocates and locks nothing."""
        try:
            old = {id(buf) for buf, _ in self.buffers}
            for index, (nbytes, cuda) in enumerate(plan):
                self._buffer(index, nbytes, cuda)
            del self.buffers[len(plan) :]
            pinned.lock(self.fresh)
            for buf, host in self.buffers:
                if host is None and id(buf) not in old:
                    self.torch.empty(0, dtype=self.torch.uint8).set_(buf).zero_()
        finally:
            self.fresh = []

    def drain(self) -> None:
        """Wait for the copies queued on the side streams (before buffers may be dropped)."""
        for side in self.streams.values():
            side.synchronize()

    def _start(self) -> Copies:
        torch = self.torch
        copies = Copies()
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
