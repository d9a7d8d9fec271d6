"""The URLs of ``slurmkit stage``: which SRC it reads, which DST it writes, and each shown
without what may be a credential."""

from __future__ import annotations

import os
import re

from ..errors import UserError

# URL scheme -> fsspec protocol; no scheme: a local path
SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "https"}
INSTALL = {"s3": "pip install 'slurmkit[s3]' (s3fs)", "gcs": "pip install gcsfs"}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def public(url: str) -> str:
    """``url`` without what may be a credential: user and password, query, fragment."""
    m = _SCHEME.match(url)
    if not m:
        return url
    rest = url[m.end() :].split("#", 1)[0].split("?", 1)[0]
    host, sep, path = rest.partition("/")
    return f"{m.group(1)}://{host.rpartition('@')[2]}{sep}{path}"


def source_protocol(src: str) -> str:
    """The fsspec protocol of SRC ('file' for a local path); UserError (usage) otherwise."""
    m = _SCHEME.match(src)
    if not src:
        raise UserError("SRC is empty", key="SRC", hint="give s3://BUCKET/PREFIX or a path")
    if m is None:
        if "::" in src or "://" in src:
            raise UserError(
                f"{public(src)!r} is not a URL slurmkit stages from",
                key="SRC",
                hint="give s3://, gs://, https:// or a local path",
            )
        return "file"
    scheme = m.group(1).lower()
    if scheme == "file":
        return "file"
    if scheme not in SCHEMES:
        raise UserError(
            f"unsupported URL scheme {scheme + '://'!r} in {public(src)!r}",
            key="SRC",
            hint="slurmkit stage reads s3://, gs://, https://, http:// and local paths",
        )
    if not src[m.end() :].split("/", 1)[0].rpartition("@")[2]:
        raise UserError(f"{public(src)!r} names no bucket or host", key="SRC")
    return SCHEMES[scheme]


def local_dst(dst: str) -> str:
    """DST as an absolute local path; UserError (usage) for a URL or an empty path."""
    m = _SCHEME.match(dst)
    if m is not None:
        if m.group(1).lower() != "file":
            raise UserError(
                f"must be a path on this machine's filesystem, not {public(dst)!r}",
                key="DST",
                hint="stage to the shared filesystem, e.g. /mnt/data/DATASET",
            )
        dst = dst[m.end() :]
    if not dst.strip("/"):
        raise UserError("must name a directory to create (not / or nothing)", key="DST")
    return os.path.abspath(dst)


def url_of(protocol: str, name: str) -> str:
    """A backend path as the user wrote it (``s3://bucket/key``)."""
    if protocol == "file" or "://" in name:
        return public(name)
    return f"{'gs' if protocol == 'gcs' else protocol}://{name}"
