"""The large-file path: a file fetched in ranged parts on many threads, each part written to
its offset as it arrives (:func:`s3_range` streams it on s3fs's event loop) and its MD5 fed in
order, each part read back once the parts before it are in (:class:`Assembly`)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import zlib
from typing import Any

from ..compat import s3fs as s3compat
from .records import Failed, said

STREAM_CHUNK = 1 << 20  # bytes of a ranged GET's body written at a time
READ_BACK = 8 << 20  # bytes of a part read back at a time for its file's MD5


class Assembly:
    """One large file while its parts arrive: the temporary file ``tmp`` (made here, at its
    full ``size``), each part's CRC-32 and the MD5 (when ``md5``) fed in order. Every part,
    fetched or not, is settled once; the thread that settles it last closes the file."""

    def __init__(
        self, tmp: str, size: int, ranges: list[tuple[int, int]], md5: bool, where: str
    ) -> None:
        self.tmp, self.ranges, self.where = tmp, ranges, where
        self.fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(self.fd, size)
        self.crcs = [0] * len(ranges)
        self.written: set[int] = set()  # parts on disk, not yet fed to the MD5
        self.digest = hashlib.md5(usedforsecurity=False) if md5 else None
        self.left, self.next = len(ranges), 0  # parts not settled; the next part to hash
        self.bad = self.hashing = self.closed = False
        self.guard = threading.Lock()

    def settle(self, index: int | None, ok: bool) -> bool:
        """Count one part in, feed the MD5 what is in order (one thread at a time, outside
        the guard); True for the thread that finds the file whole and hashed: it closes it
        and finishes it. A thread that leaves with work undone leaves it to the one doing
        it (every change is followed by its own thread's look at what is left)."""
        with self.guard:
            self.left -= 1
            if ok and index is not None:
                self.written.add(index)
            else:
                self.bad = True
        failed: BaseException | None = None
        while self.digest is not None:
            with self.guard:
                if self.hashing or self.bad or self.next not in self.written:
                    break
                self.hashing = True
                nxt = self.next
            try:
                digest_range(self.fd, self.digest, *self.ranges[nxt])
            except OSError as exc:
                failed = exc
            with self.guard:
                self.written.discard(nxt)
                self.next += 1
                self.hashing = False
                self.bad = self.bad or failed is not None
        with self.guard:
            # a part still to be hashed is hashed by the thread that wrote it or that
            # hashes now, and that one comes here after
            hashed = self.bad or self.digest is None or self.next == len(self.ranges)
            last = hashed and not (self.left or self.hashing or self.closed)
            if last:
                self.closed = True
                os.close(self.fd)
                if self.bad:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(self.tmp)
            whole = bool(last and not self.bad)
        if failed is not None:
            raise Failed(f"{self.where}: cannot read back {self.tmp}: {said(failed)}")
        return whole

    def md5(self) -> str | None:
        """The MD5 hex digest of the whole file (once every part is settled), if asked for."""
        return self.digest.hexdigest() if self.digest else None

    def crc(self) -> int:
        """The CRC-32 of the whole file, from its parts'."""
        from ..runtime.crc import join  # CRC-32 of parts, combined

        return join(0, zip(self.crcs, (b - a for a, b in self.ranges)))


def digest_range(fd: int, digest: Any, start: int, end: int) -> None:
    """Feed ``digest`` bytes ``[start, end)`` of ``fd``, read back (from the page cache: the
    part was just written) into one reused buffer."""
    buf = bytearray(min(READ_BACK, end - start))
    view = memoryview(buf)
    while start < end:
        n = os.preadv(fd, [view[: min(len(buf), end - start)]], start)
        if n <= 0:
            raise OSError(f"short read at {start}")
        digest.update(view[:n])
        start += n


def fetch_range(fs: Any, protocol: str, url: str, start: int, end: int, fd: int, where: str) -> int:
    """Bytes ``[start, end)`` of ``url`` written at their offset in ``fd``: their CRC-32.
    On S3, streamed to disk as they arrive (memory: a read buffer, whatever the part
    size); elsewhere, read whole and written."""
    if protocol == "s3" and s3compat.can_call(fs):
        return s3_range(fs, url, start, end, fd, where)
    got = fs.cat_file(url, start=start, end=end)
    if len(got) != end - start:
        raise Failed(f"{where}: bytes {start}-{end} came back as {len(got)} bytes")
    os.pwrite(fd, got, start)
    return zlib.crc32(got)


def s3_range(fs: Any, url: str, start: int, end: int, fd: int, where: str) -> int:
    """One ranged GET of ``url`` on s3fs's event loop, its body written to ``fd`` as it
    arrives: the CRC-32 of ``[start, end)``. A read cut short is asked again from where it
    stopped (s3fs's retries); a response of another length is an error."""
    import asyncio

    from fsspec.asyn import sync
    from s3fs.core import S3_RETRYABLE_ERRORS

    bucket, key, version = fs.split_path(url)
    extra = {"VersionId": version} if version else {}

    async def fetch() -> int:
        pos, crc, tries = start, 0, 0
        while True:
            resp = await s3compat.call(
                fs, "get_object", Bucket=bucket, Key=key, Range=f"bytes={pos}-{end - 1}", **extra
            )
            body = resp["Body"]
            try:
                length = resp.get("ContentLength")
                if length is not None and length != end - pos:
                    raise Failed(f"{where}: bytes {pos}-{end} came back as {length} bytes")
                while pos < end:
                    chunk = await body.read(min(STREAM_CHUNK, end - pos))
                    if not chunk:
                        raise Failed(f"{where}: bytes {pos}-{end} ended early")
                    os.pwrite(fd, chunk, pos)
                    crc = zlib.crc32(chunk, crc)
                    pos += len(chunk)
                return crc
            except S3_RETRYABLE_ERRORS:
                tries += 1
                if tries >= max(1, fs.retries):
                    raise
                await asyncio.sleep(min(1.7**tries * 0.1, 15))
            finally:
                body.close()

    return int(sync(fs.loop, fetch))
