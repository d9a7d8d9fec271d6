"""What a staging run is made of: a source file (:class:`Entry`), a finished file
(:class:`Record`), the names slurmkit writes beside the data, and a file's sums."""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from typing import Any

MANIFEST = ".slurmkit-manifest.json"
PART = ".slurmkit-part-"  # in the name of a file still being written
FORMAT = 1


@dataclass(frozen=True)
class Entry:
    """One file of the source: ``path`` relative to SRC ('/'-separated), ``url`` as the backend
    names it, ``version`` its identity there (ETag, generation, mtime) and ``md5`` the MD5
    the backend promises for its bytes, when it does (a plain S3 ETag, GCS's md5Hash)."""

    path: str
    url: str
    size: int | None
    version: str | None = None
    md5: str | None = None


@dataclass(frozen=True)
class Record:
    """A finished file at DST: a journal line, a manifest row."""

    path: str
    size: int
    version: str | None
    checksum: str

    def row(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "size": self.size,
            "version": self.version,
            "checksum": self.checksum,
        }


class Failed(Exception):
    """One object could not be copied (the message names it)."""


def crc_text(crc: int) -> str:
    """A CRC-32 as a manifest's checksum."""
    return f"crc32:{crc:08x}"


def read_sums(path: str, md5: bool) -> tuple[int, int, str | None]:
    """A file's size, CRC-32 and (when ``md5``) MD5 hex digest, in one read."""
    digest = hashlib.md5(usedforsecurity=False) if md5 else None
    size, crc = 0, 0
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
            if digest is not None:
                digest.update(chunk)
    return size, crc, digest.hexdigest() if digest is not None else None


def said(exc: BaseException) -> str:
    """An exception's text for a one-line message (at most 300 characters and '...')."""
    text = str(exc) or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "..."
