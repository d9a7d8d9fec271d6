"""One run's copying: small files fetched whole in batches, large ones in ranged parts
(:mod:`.ranged`), the rest streamed whole, on a pool of threads; each finished file renamed into
the stage directory and journaled at once."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import threading
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from ..errors import UserError
from .planning import part_bytes, parts, plan
from .progress import Reporter
from .ranged import Assembly, fetch_range
from .records import PART, Entry, Failed, Record, crc_text, read_sums, said
from .result import Result
from .urls import url_of
from .workdir import scan


class Copier:
    """One run's fetching: small files in batches and large ones in parts, on ``jobs`` threads;
    each finished file renamed into place and journaled at once."""

    def __init__(
        self,
        fs: Any,
        protocol: str,
        work: str,
        listing: Sequence[Entry],
        jobs: int,
        part_size: int,
        reporter: Reporter,
        result: Result,
    ) -> None:
        self.fs, self.protocol, self.work, self.listing = fs, protocol, work, listing
        self.jobs, self.part_size, self.reporter, self.result = jobs, part_size, reporter, result
        self.part_bytes = part_size  # of this run's ranged parts: part_bytes()
        self.errors: list[str] = []
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.journal_fd = -1

    def run(self) -> None:
        data, journal, present = scan(self.work)
        os.makedirs(data, exist_ok=True)
        big = next((e for e in self.listing if (e.size or 0) > self.part_size), None)
        ranges = big is None or ranges_ok(self.fs, self.protocol, big.url)
        todo = plan(self.listing, journal, present, self.part_size, ranges=ranges)
        self.data = data
        self.journal_fd = os.open(
            os.path.join(self.work, "journal.jsonl"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
        try:
            with ThreadPoolExecutor(self.jobs, thread_name_prefix="slurmkit-stage") as pool:
                again = [
                    e
                    for e, ok in zip(todo.recheck, pool.map(self._recheck, todo.recheck))
                    if not ok
                ]
                if again:  # there but wrong: fetch them again
                    extra = plan(again, {}, {}, self.part_size, ranges=ranges)
                    todo.batches += extra.batches
                    todo.large += extra.large
                    todo.whole += extra.whole
                self.result.skipped = len(self.listing) - len(todo.fetch)
                self.part_bytes = part_bytes(todo.large, self.jobs, self.part_size)
                self.reporter.start(sum(e.size or 0 for e in todo.fetch), len(todo.fetch))
                window = threading.BoundedSemaphore(2 * self.jobs)
                futures: list[Future[None]] = []

                def submit(fn: Callable[..., None], *args: Any) -> bool:
                    window.acquire()
                    if self.stop.is_set():
                        window.release()
                        return False
                    future = pool.submit(self._guarded, fn, *args)
                    future.add_done_callback(lambda _f: window.release())
                    futures.append(future)
                    return True

                for batch in todo.batches:  # small files first: most files done soonest
                    submit(self._batch, batch)
                for e in todo.large:
                    self._large(e, submit)
                for e in todo.whole:
                    submit(self._whole, e)
                for future in futures:
                    future.result()
        finally:
            self.reporter.stop()
            os.close(self.journal_fd)
        if self.errors:
            shown = "; ".join(self.errors[:10])
            more = f" (and {len(self.errors) - 10} more)" if len(self.errors) > 10 else ""
            raise UserError.failure(
                f"{len(self.errors)} object(s) failed: {shown}{more}",
                hint="what was finished is kept: run the same command again to go on",
            )

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        try:
            fn(*args)
        except Failed as exc:
            self._fail(str(exc))
        except Exception as exc:  # a backend's or the filesystem's error: name the object
            self._fail(f"copy failed: {said(exc)}")

    def _fail(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)
        self.stop.set()

    def _where(self, e: Entry) -> str:
        return url_of(self.protocol, e.url)

    def _target(self, e: Entry) -> tuple[str, str]:
        """The final path of ``e`` in the stage directory and a fresh temporary one beside it."""
        path = os.path.join(self.data, *e.path.split("/"))
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        return path, os.path.join(folder, f".{name}{PART}{os.urandom(6).hex()}")

    def _done(self, e: Entry, size: int, crc: int, tmp: str, path: str) -> None:
        """Rename the finished file into place, then journal it."""
        os.rename(tmp, path)
        record = Record(e.path, size, e.version, crc_text(crc))
        os.write(self.journal_fd, (json.dumps(record.row()) + "\n").encode())
        with self.lock:
            self.result.copied += 1
            self.result.bytes += size

    def _check(self, e: Entry, size: int, md5: str | None) -> None:
        if e.size is not None and size != e.size:
            raise Failed(f"{self._where(e)}: got {size} bytes, the listing says {e.size}")
        if e.md5 is not None and md5 is not None and md5 != e.md5 and self._md5_applies(e):
            raise Failed(
                f"{self._where(e)}: checksum mismatch: its bytes have MD5 {md5}, "
                f"its ETag says {e.md5}"
            )

    def _md5_applies(self, e: Entry) -> bool:
        """Whether a mismatch against the ETag is one: asked again (a HEAD), an ETag of an
        object encrypted with SSE-KMS or SSE-C is no MD5; a changed ETag is a changed object."""
        call = getattr(self.fs, "call_s3", None)
        if self.protocol != "s3" or call is None:
            return True
        bucket, key, _ = self.fs.split_path(e.url)
        try:
            head = call("head_object", Bucket=bucket, Key=key)
        except Exception:
            return True
        if head.get("SSECustomerAlgorithm") or str(head.get("ServerSideEncryption", "")).startswith(
            "aws:kms"
        ):
            return False
        if str(head.get("ETag", "")).strip('"') != e.version:
            raise Failed(f"{self._where(e)}: the object changed while it was copied")
        return True

    def _recheck(self, e: Entry) -> bool:
        """A file renamed into place by a run killed before it journaled it: checked here,
        not fetched again."""
        path = os.path.join(self.data, *e.path.split("/"))
        size, crc, md5 = read_sums(path, bool(e.md5))
        if size != e.size or (md5 is not None and md5 != e.md5):
            return False
        record = Record(e.path, size, e.version, crc_text(crc))
        os.write(self.journal_fd, (json.dumps(record.row()) + "\n").encode())
        return True

    def _batch(self, batch: list[Entry]) -> None:
        """Fetch small files whole, several requests at once."""
        for e, got in zip(batch, fetch_many(self.fs, [e.url for e in batch])):
            if self.stop.is_set():
                return
            if isinstance(got, FileNotFoundError):
                raise Failed(f"{self._where(e)}: no such object (it was listed, then gone)")
            if isinstance(got, BaseException):
                raise Failed(f"{self._where(e)}: copy failed: {said(got)}")
            md5 = hashlib.md5(got, usedforsecurity=False).hexdigest() if e.md5 else None
            self._check(e, len(got), md5)
            path, tmp = self._target(e)
            try:
                with open(tmp, "wb") as fh:
                    fh.write(got)
                self._done(e, len(got), zlib.crc32(got), tmp, path)
            except OSError as exc:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise Failed(f"{self._where(e)}: cannot write {path}: {said(exc)}") from None
            self.reporter.advance(len(got))

    def _whole(self, e: Entry) -> None:
        """Stream one file to disk in one GET (no byte ranges, or no size known), then sum it."""
        path, tmp = self._target(e)
        try:
            try:
                self.fs.get_file(e.url, tmp)
            except FileNotFoundError:
                raise Failed(
                    f"{self._where(e)}: no such object (it was listed, then gone)"
                ) from None
            except Exception as exc:
                raise Failed(f"{self._where(e)}: copy failed: {said(exc)}") from None
            size, crc, md5 = read_sums(tmp, bool(e.md5))
            self._check(e, size, md5)
            self._done(e, size, crc, tmp, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
        self.reporter.advance(size)

    def _large(self, e: Entry, submit: Callable[..., bool]) -> None:
        """Fetch one large file in ranged parts on the pool (the thread that settles it last
        finishes it): each part streamed to its offset as it arrives, its CRC summed on the
        way; the MD5 fed in order, each part read back once the parts before it are in."""
        assert e.size is not None
        size = e.size
        path, tmp = self._target(e)
        file = Assembly(tmp, size, parts(size, self.part_bytes), bool(e.md5), self._where(e))

        def part(index: int) -> None:
            start, end = file.ranges[index]
            try:
                if self.stop.is_set():
                    file.settle(index, False)
                    return
                file.crcs[index] = fetch_range(
                    self.fs, self.protocol, e.url, start, end, file.fd, self._where(e)
                )
            except FileNotFoundError:
                file.settle(index, False)
                raise Failed(
                    f"{self._where(e)}: no such object (it was listed, then gone)"
                ) from None
            except Failed:
                file.settle(index, False)
                raise
            except Exception as exc:
                file.settle(index, False)
                raise Failed(f"{self._where(e)}: copy failed: {said(exc)}") from None
            self.reporter.advance(end - start)
            if file.settle(index, True):
                try:
                    self._check(e, size, file.md5())
                    self._done(e, size, file.crc(), tmp, path)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                    raise

        for index in range(len(file.ranges)):
            if not submit(part, index):  # stopped: the parts never sent count as failed
                for _ in range(index, len(file.ranges)):
                    file.settle(None, False)
                return


def ranges_ok(fs: Any, protocol: str, url: str) -> bool:
    """Whether the server answers byte ranges (object stores do; some web servers do not):
    asked of http(s) servers with a one-byte range, the response left unread."""
    if protocol not in ("http", "https"):
        return True
    from fsspec.asyn import sync

    async def probe() -> bool:
        session = await fs.set_session()
        headers = {**fs.kwargs.get("headers", {}), "Range": "bytes=0-0"}
        async with session.get(fs.encode_url(url), headers=headers) as response:
            return bool(response.status == 206)

    try:
        return bool(sync(fs.loop, probe))
    except Exception:
        return False


def fetch_many(fs: Any, urls: list[str]) -> list[Any]:
    """The bytes of each URL (or the exception it raised), concurrently where the backend is
    asynchronous (s3fs, gcsfs, http): one batch of requests on its event loop."""
    if getattr(fs, "async_impl", False):
        import asyncio

        from fsspec.asyn import sync

        async def fetch() -> list[Any]:
            # fsspec's async API: its coroutines are the methods' underscore names (documented)
            reads = (fs._cat_file(u) for u in urls)  # noqa: SLF001
            return await asyncio.gather(*reads, return_exceptions=True)

        return list(sync(fs.loop, fetch))
    out: list[Any] = []
    for url in urls:
        try:
            out.append(fs.cat_file(url))
        except Exception as exc:
            out.append(exc)
    return out
