"""Page-locked host buffers for snapshots of CUDA state, locked quickly.

torch's ``pin_memory=True`` (``cudaHostAlloc``) locked 12 GiB in 4.8 s on an H200 host, once
per process: the first asynchronous save of a large model stalled that long. Ordinary memory
whose pages several threads touch first, then registered with ``cudaHostRegister``, was locked
in 0.7 s, and copies into it run as fast (bench/RESULTS.md). Small buffers still come from
torch's pinned allocator, which caches them. (torch can do the same for every pinned
allocation, ``PYTORCH_CUDA_ALLOC_CONF=pinned_use_cuda_host_register:True``, but only as a
process-wide setting made before CUDA starts; this leaves the process's allocator alone.)

torch is imported where it is used: importing the checkpoint package must not load it.
"""

from __future__ import annotations

import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor

from . import crc

REGISTER_FROM = 16 << 20  # bytes; smaller buffers come from torch's pinned allocator
_CHUNK = 64 << 20  # pages touched per task
_PORTABLE = 1  # cudaHostRegisterPortable: page-locked for every device's context


class HostBuffer:
    """``nbytes`` of host memory for copies from a GPU. Small ones are pinned at once; large
    ones are ordinary memory until :func:`lock` registers them. A registered buffer is
    unregistered when this object is dropped: no copy into it may be under way by then."""

    def __init__(self, nbytes: int) -> None:
        import torch

        self.nbytes = nbytes
        self.locked = nbytes < REGISTER_FROM
        self.tensor = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.locked)
        self.storage = self.tensor.untyped_storage()

    def _register(self, device: int) -> int:
        import torch

        torch.cuda.set_device(device)  # a new thread's device is 0: do not make a context there
        cudart = torch.cuda.cudart()
        ptr = self.tensor.data_ptr()
        error = int(cudart.cudaHostRegister(ptr, self.nbytes, _PORTABLE))
        if error == 0:
            self.locked = True
            done = weakref.finalize(self, cudart.cudaHostUnregister, ptr)
            done.atexit = False  # the process is ending: nothing to give back
        return error


def lock(buffers: list[HostBuffer]) -> None:
    """Page-lock the buffers not locked yet: touch their pages from several threads, then
    register them with CUDA. A buffer that cannot be registered stays ordinary memory (copies
    into it are then synchronous) and a warning says so."""
    todo = [b for b in buffers if not b.locked]
    if not todo:
        return
    import torch

    device = torch.cuda.current_device()
    pieces = [b.tensor[i : i + _CHUNK] for b in todo for i in range(0, b.nbytes, _CHUNK)]
    with ThreadPoolExecutor(crc.threads(), thread_name_prefix="slurmkit-pin") as pool:
        list(pool.map(torch.Tensor.zero_, pieces))  # the page faults, in parallel
        errors = list(pool.map(lambda b: b._register(device), todo))  # noqa: SLF001  # its module's
    failed = [e for e in errors if e]
    if failed:
        warnings.warn(
            f"cudaHostRegister failed (CUDA error {failed[0]}) for {len(failed)} "
            "snapshot buffer(s): their copies from the GPU block",
            RuntimeWarning,
            stacklevel=3,
        )
