"""How a checkpoint file's bytes are made: :func:`dump` serializes a state (torch.save,
pickle or bytes as they are) into a :class:`Writer`, which counts and CRC32s every byte on its
way to a storage sink, the checksum of large writes overlapping their I/O where it has a pool.
"""

from __future__ import annotations

import pickle
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import crc
from .storage import LocalSink, RemoteSink

_BIG = 1 << 20  # writes from this size on overlap the CRC with the I/O
_torch_save_lock = threading.Lock()


class Writer:
    """File-like sink for pickle/torch.save: counts and CRC32s every byte on its way out.

    Small writes are buffered; a large one is written by ``pool``'s thread while this thread
    computes its CRC, with ``crc_pool``'s threads where there are spare CPUs (all release the
    GIL), so the checksum costs no extra time. Without ``pool``, one after the other.
    """

    def __init__(
        self,
        sink: LocalSink | RemoteSink,
        pool: ThreadPoolExecutor | None,
        crc_pool: ThreadPoolExecutor | None,
    ) -> None:
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
        if len(view) >= _BIG and self.pool is not None:
            done = self.pool.submit(self.sink.write, view)
            self.crc = crc.crc32(view, self.crc, self.crc_pool)
            done.result()
        else:
            self.sink.write(view)
            self.crc = crc.crc32(view, self.crc, self.crc_pool)
        self.size += len(view)


def dump(state: Any, how: str, fh: Writer) -> None:
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
