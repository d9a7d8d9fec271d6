"""The source of a staging run: its fsspec filesystem and its files as :class:`Entry` rows
(one LIST per 1,000 keys on S3; a single URL on http(s))."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

from ..errors import UserError
from .records import MANIFEST, PART, Entry, said
from .urls import INSTALL, public, url_of

_MD5 = re.compile(r"^[0-9a-f]{32}$")


def entries(found: Mapping[str, Mapping[str, Any]], root: str, protocol: str) -> list[Entry]:
    """The files of a listing (``fs.find(root, detail=True)``) as entries, paths relative to
    ``root`` (a listing of the root object alone: its base name). UserError (failure) for a
    name that cannot be a file under DST ('..', empty parts) or is the manifest's."""
    base = root.rstrip("/")
    out = []
    for name, info in found.items():
        if info.get("type", "file") != "file" or name.endswith("/"):
            continue  # a directory, or an S3 "folder" marker
        if name.rstrip("/") == base:
            rel = public(base).rsplit("/", 1)[-1]
        elif name.startswith(base + "/"):
            rel = name[len(base) + 1 :]
        else:
            continue
        parts = rel.split("/")
        if any(p in ("", ".", "..") for p in parts) or rel == MANIFEST or PART in rel:
            raise UserError.failure(
                f"{url_of(protocol, name)}: the name {rel!r} cannot be a file under DST",
                hint="rename the object, or stage a prefix without it",
            )
        size = info.get("size")
        out.append(
            Entry(
                rel,
                name,
                int(size) if size is not None else None,
                _version(info),
                _md5(info, protocol),
            )
        )
    return sorted(out, key=lambda e: e.path)


def _version(info: Mapping[str, Any]) -> str | None:
    for key in ("ETag", "etag", "generation", "mtime", "LastModified", "Last-Modified"):
        value = info.get(key)
        if value is not None:
            return str(value).strip('"') if key.lower() == "etag" else f"{key}={value}"
    return None


def _md5(info: Mapping[str, Any], protocol: str) -> str | None:
    """The MD5 the backend promises: a plain (single-part) S3 ETag, GCS's md5Hash, HTTP's
    Content-MD5. Multipart ETags and other servers' ETags are no MD5."""
    import base64
    import binascii

    etag = str(info.get("ETag", "")).strip('"').lower()
    if protocol == "s3" and _MD5.match(etag):
        return etag
    for key in ("md5Hash", "Content-MD5"):
        if info.get(key):
            try:
                return base64.b64decode(info[key]).hex()
            except (binascii.Error, ValueError):
                return None
    return None


def filesystem(src: str, protocol: str, endpoint_url: str | None, jobs: int) -> tuple[Any, str]:
    """The fsspec filesystem of SRC and its root path there."""
    try:
        import fsspec
    except ImportError:  # pragma: no cover - a dependency of slurmkit
        raise UserError("slurmkit stage needs fsspec", hint="pip install fsspec") from None
    options: dict[str, Any] = {}
    if protocol == "s3":
        endpoint = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint:
            options["endpoint_url"] = endpoint
        options["config_kwargs"] = {"max_pool_connections": max(10, jobs)}
    try:
        fs, root = fsspec.core.url_to_fs(src, **options)
    except ImportError:
        raise UserError(
            f"{protocol}:// needs a backend that is not installed",
            key="SRC",
            hint=INSTALL.get(protocol, f"install fsspec's {protocol} backend"),
        ) from None
    return fs, root


def list_source(fs: Any, root: str, src: str, protocol: str) -> list[Entry]:
    """The source's files (one LIST per 1,000 keys on S3); a single URL on http(s)."""
    try:
        if protocol in ("http", "https"):
            found = {root: {**fs.info(root), "type": "file"}}
        else:
            found = fs.find(root, detail=True)
    except FileNotFoundError:
        found = {}
    except Exception as exc:  # the backend's own errors (credentials, access, network)
        raise UserError.failure(f"{public(src)}: cannot list it: {said(exc)}") from None
    listing = entries(found, root, protocol)
    if not listing:
        raise UserError.failure(
            f"{public(src)}: no such object or prefix (nothing to stage)",
            hint="check the URL (and --endpoint-url or AWS_ENDPOINT_URL for non-AWS storage)",
        )
    return listing
