"""A file's bytes read once, by large ranged reads on several threads, each piece's CRC32 taken
by the thread that read it (while the bytes are still in its cache): :class:`Fetch`, over a
:class:`Source` (a local file: ``preadv``; an fsspec store: ranged ``cat_file``).

The bytes land in an anonymous memory map of the range's size: pages are made as the reads
fill them (on the reading threads), and a consumer that walks the range in order can give back
what it has used (:meth:`Fetch.release`), the readers then staying at most ``window`` bytes
ahead of it. Stdlib only: torch wraps the same memory where it is needed.
"""

from __future__ import annotations

import mmap
import os
import threading
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from .. import crc
from .storage import LocalStore


class Invalid(Exception):
    """A committed checkpoint whose files do not match its record."""


class Source:
    """One file of a checkpoint store, read by ranges from several threads: a local file with
    ``preadv``, an fsspec file with ranged ``cat_file``. :class:`Invalid` when the file is
    missing, or shorter than a read needs. A context manager (closes the local file)."""

    def __init__(self, store: Any, path: str) -> None:
        self.path, self.fd = path, -1
        self.fs = getattr(store, "fs", None)
        self.store = store
        try:
            if isinstance(store, LocalStore):
                self.fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
                self.size = os.fstat(self.fd).st_size
            else:
                self.size = int(store.size(path))
        except FileNotFoundError:
            raise Invalid(f"missing {path}") from None

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def read_into(self, offset: int, view: memoryview) -> None:
        """Fill ``view`` with the bytes from ``offset`` on."""
        if self.fd >= 0:
            while view:
                n = os.preadv(self.fd, [view], offset)
                if n == 0:
                    raise Invalid(f"{self.path} ended at byte {offset} while read")
                view, offset = view[n:], offset + n
            return
        if self.fs is not None:
            data = self.fs.cat_file(self.path, start=offset, end=offset + len(view))
        else:
            with self.store.open(self.path) as fh:
                fh.seek(offset)
                data = fh.read(len(view))
        if len(data) != len(view):
            raise Invalid(f"{self.path} ended at byte {offset + len(data)} while read")
        view[:] = data


class Fetch:
    """Bytes ``[start, end)`` of a file read into :attr:`mem` by ``readers`` threads in pieces
    of ``chunk`` bytes, in order (the pieces in ``first`` before the others).

    :meth:`wait` returns once everything before an offset is there; with a ``window``, the
    readers start no piece that ends more than ``window`` bytes past what the consumer gave
    back with :meth:`release` (pieces in ``first`` excepted). :meth:`finish` waits for all and
    returns ``(size, crc32)`` of the range. Use it as a context manager: leaving it stops and
    joins the readers. A reader's error is raised by the consumer's next call.
    """

    def __init__(
        self,
        read_into: Callable[[int, memoryview], None],
        start: int,
        end: int,
        *,
        chunk: int,
        readers: int,
        window: int | None = None,
        first: Iterable[int] = (),
    ) -> None:
        self.read_into, self.start, self.size, self.chunk = read_into, start, end - start, chunk
        self.mem = mmap.mmap(-1, max(1, self.size), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.view = memoryview(self.mem)[: self.size]
        self.count = -(-self.size // chunk)
        early = [i for i in dict.fromkeys(first) if 0 <= i < self.count]
        self.early = set(early)
        self.order = early + [i for i in range(self.count) if i not in self.early]
        self.window = None if window is None else max(window, 2 * chunk)
        self.crcs: list[int | None] = [None] * self.count
        self.frontier = 0  # pieces [0, frontier) are all read
        self.released = 0  # bytes the consumer gave back, from the start
        self.taken = 0  # pieces of ``order`` handed to readers
        self.error: BaseException | None = None
        self.stopped = False
        self.cond = threading.Condition()
        self.threads = [
            threading.Thread(target=self._run, name="slurmkit-read", daemon=True)
            for _ in range(min(readers, self.count))
        ]
        for thread in self.threads:
            thread.start()

    def __enter__(self) -> Fetch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the readers (after the pieces under way) and wait for them."""
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join()

    def _piece(self, index: int) -> tuple[int, int]:
        begin = index * self.chunk
        return begin, min(begin + self.chunk, self.size)

    def _next(self) -> int | None:
        """The next piece for a reader (``None``: no more), once the window lets it start."""
        with self.cond:
            while True:
                if self.stopped or self.error is not None or self.taken == len(self.order):
                    return None
                index = self.order[self.taken]
                if (
                    self.window is None
                    or index in self.early
                    or self._piece(index)[1] <= self.released + self.window
                ):
                    self.taken += 1
                    return index
                self.cond.wait()

    def _run(self) -> None:
        while (index := self._next()) is not None:
            begin, end = self._piece(index)
            try:
                piece = self.view[begin:end]
                self.read_into(self.start + begin, piece)
                value = zlib.crc32(piece)
            except BaseException as exc:  # handed to the consumer
                with self.cond:
                    self.error = self.error or exc
                    self.cond.notify_all()
                return
            with self.cond:
                self.crcs[index] = value
                while self.frontier < self.count and self.crcs[self.frontier] is not None:
                    self.frontier += 1
                self.cond.notify_all()

    def _until(self, ready: Callable[[], bool]) -> None:
        with self.cond:
            while not ready():
                if self.error is not None:
                    raise self.error
                self.cond.wait()
            if self.error is not None:
                raise self.error

    def wait(self, upto: int) -> None:
        """Wait until bytes ``[0, upto)`` of the range are read."""
        need = min(-(-upto // self.chunk), self.count)
        self._until(lambda: self.frontier >= need)

    def wait_piece(self, index: int) -> None:
        """Wait until piece ``index`` is read (e.g. one asked for in ``first``)."""
        self._until(lambda: self.crcs[index] is not None)

    def release(self, upto: int) -> None:
        """The consumer is done with bytes ``[0, upto)``: their memory goes back to the system
        (whole pages) and the readers may go on."""
        with self.cond:
            if upto <= self.released:
                return
            low = self.released // mmap.PAGESIZE * mmap.PAGESIZE
            high = min(upto, self.size) // mmap.PAGESIZE * mmap.PAGESIZE
            if high > low and self.window is not None:
                self.mem.madvise(mmap.MADV_DONTNEED, low, high - low)
            self.released = upto
            self.cond.notify_all()

    def finish(self) -> tuple[int, int]:
        """Wait for every piece; ``(size, crc32)`` of the range. With a window, the consumer is
        done with the bytes: each piece is given back once read."""
        if self.window is not None:
            for index in range(self.count):
                self.wait((index + 1) * self.chunk)
                self.release((index + 1) * self.chunk)
        self.wait(self.size)
        lengths = (end - begin for begin, end in map(self._piece, range(self.count)))
        return self.size, crc.join(0, zip((c or 0 for c in self.crcs), lengths))
