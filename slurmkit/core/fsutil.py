"""Atomic file writes for the shared filesystem (stdlib only: used inside jobs too)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def _unique(directory: str, prefix: str, create: Callable[[str], T]) -> tuple[str, T]:
    """``create(path)`` at a fresh path in ``directory``: random, since on a shared filesystem
    a pid is not unique (what ``tempfile`` does, without its imports)."""
    while True:
        path = os.path.join(directory, f"{prefix}{os.urandom(8).hex()}")
        try:
            return path, create(path)
        except FileExistsError:
            continue


def make_temp_dir(directory: str, prefix: str) -> str:
    """A new empty directory, like ``tempfile.mkdtemp`` but with the mode the user's umask gives
    (it is renamed into place on a shared filesystem, where teammates read it)."""
    return _unique(directory, prefix, lambda path: os.mkdir(path, 0o777))[0]


def atomic_write_bytes(path: str, data: bytes, *, fsync: bool = True) -> None:
    """Write ``data`` to ``path`` so that readers see the old file or the new one, never a mix.
    The file gets the mode the user's umask gives, as ``open(path, "w")`` would."""
    tmp, fd = _unique(
        os.path.dirname(path) or ".",
        ".tmp-",
        lambda p: os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666),
    )
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


def atomic_write_json(path: str, obj: Any, *, fsync: bool = True, indent: int | None = 2) -> None:
    """Atomically write ``obj`` as JSON, keys sorted; pretty unless ``indent`` is None (one
    line, from json's C encoder: several times faster, for a file written every step)."""
    atomic_write_bytes(
        path, (json.dumps(obj, indent=indent, sort_keys=True) + "\n").encode(), fsync=fsync
    )


class Damaged(ValueError):
    """A file that exists but cannot be read as what it should be (truncated, garbage)."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path, self.why = path, why


def read_json(path: str, default: Any = None) -> Any:
    """Read JSON from ``path``; ``default`` when the file does not exist; Damaged when it is
    not JSON."""
    try:
        with open(path, "rb") as fh:
            return json.load(fh)
    except FileNotFoundError:
        return default
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise Damaged(path, f"not JSON ({exc})") from None


def read_record(path: str, default: Any = None) -> Any:
    """:func:`read_json` of a file that must hold a JSON object (Damaged otherwise)."""
    data = read_json(path, default)
    if data is not default and not isinstance(data, dict):
        raise Damaged(path, f"not a JSON object but {type(data).__name__}")
    return data
