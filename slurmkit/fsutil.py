"""Atomic file writes for the shared filesystem (stdlib only: used inside jobs too)."""

from __future__ import annotations

import json
import os
from typing import Any


def temp_name(directory: str, prefix: str) -> str:
    """A path in ``directory`` that no one else picks (random, unlike a pid on a shared FS)."""
    return os.path.join(directory, f"{prefix}{os.urandom(8).hex()}")


def make_temp_dir(directory: str, prefix: str) -> str:
    """A new empty directory (``tempfile.mkdtemp`` without importing tempfile)."""
    while True:
        path = temp_name(directory, prefix)
        try:
            os.mkdir(path, 0o700)
            return path
        except FileExistsError:
            continue


def atomic_write_bytes(path: str, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a mix."""
    directory = os.path.dirname(path) or "."
    while True:
        tmp = temp_name(directory, ".tmp-")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


def atomic_write_json(path: str, obj: Any, *, fsync: bool = True) -> None:
    """Atomically write ``obj`` as pretty JSON."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), fsync=fsync)


def read_json(path: str, default: Any = None) -> Any:
    """Read JSON from ``path``; ``default`` when the file does not exist."""
    try:
        with open(path, "rb") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return default
