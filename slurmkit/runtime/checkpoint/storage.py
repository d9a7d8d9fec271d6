"""Where checkpoints are stored: a local directory (os calls, with fsync and early writeback)
or any fsspec filesystem, behind one small interface (:class:`LocalStore`, :class:`RemoteStore` and
their write sinks); :class:`CheckpointError`, the error that failures to write or read become.
"""

from __future__ import annotations

import os
import shutil
from typing import Any

_WRITEBACK = 64 << 20  # start writeback every this many bytes
_ALIGN = 1 << 20  # ... of whole MiBs: the partial last page is still being written


class CheckpointError(OSError):
    """A checkpoint could not be written or read; the message names the path and the reason."""

    def __init__(self, message: str, *, errno: int | None = None, path: str | None = None) -> None:
        super().__init__(message)
        self.errno = errno
        self.path = path


def failure(exc: BaseException, action: str, path: str) -> CheckpointError:
    """``exc`` as a :class:`CheckpointError` saying ``action: path: reason``."""
    reason = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)) or repr(exc)
    return CheckpointError(
        f"{action}: {path}: {reason}", errno=getattr(exc, "errno", None), path=path
    )


class LocalSink:
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


class LocalStore:
    """A local directory: os calls, fsync, renames."""

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

    def sink(self, path: str) -> LocalSink:
        return LocalSink(path)

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
        return {
            os.path.relpath(os.path.join(d, f), path): os.stat(os.path.join(d, f)).st_size
            for d, _, files in os.walk(path)
            for f in files
        }

    def remove(self, path: str) -> None:
        """Remove a file or a whole directory."""
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


class RemoteSink:
    """A new object (or file) of an fsspec filesystem, visible once committed."""

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


class RemoteStore:
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

    def sink(self, path: str) -> RemoteSink:
        return RemoteSink(self.fs, path)

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
        return {name[len(path) :].lstrip("/"): int(info["size"]) for name, info in found.items()}

    def remove(self, path: str) -> None:
        self.fs.rm(path, recursive=True)


Store = LocalStore | RemoteStore  # where a checkpoint root lives


def open_store(root: str | os.PathLike[str]) -> Store:
    """The store of ``root``: a local directory (a path or a ``file://`` URL), else fsspec's."""
    root = os.fspath(root)
    if "://" not in root and "::" not in root:
        return LocalStore(root)
    from fsspec.core import url_to_fs
    from fsspec.implementations.local import LocalFileSystem

    fs, path = url_to_fs(root)
    return LocalStore(path) if isinstance(fs, LocalFileSystem) else RemoteStore(fs, path)
