"""In-job data: the spec's ``data`` block as the trial sees it (stdlib only).

Before a trial runs, each dataset must be published on the shared filesystem (its manifest,
``DST/.slurmkit-manifest.json``, written last by ``slurmkit stage``); a dataset with
``cache: node`` is also copied once to each node's local disk, checked against that manifest::

    ROOT/slurmkit-data/NODE/KEY/          the node's copy, its manifest written last
    ROOT/slurmkit-data/NODE/.KEY.tmp-*    while it is copied, under the lock of NODE/

``ROOT`` is ``cache_dir``, else the trial's ``$TMPDIR``, else ``/tmp``; the node name is in
the path, so nodes that share one filesystem keep their copies apart. The copy is made under
the lock of the node's folder (:mod:`slurmkit.core.lock`): array tasks that start on one node
at once copy it once; the others wait, then find it whole. A multi-node trial copies it in
one ``srun`` step with one task per node (``python -m slurmkit.runtime.datacache``) and gives
each node's tasks their own node's path (:func:`wrapper`).
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

from ..core.contract import ENV_DATA
from ..core.fsutil import Damaged, atomic_write_json, make_temp_dir, read_record
from ..core.jobcontract import JobContract
from ..core.layout import SweepDir
from ..core.lock import Lock

MANIFEST = ".slurmkit-manifest.json"  # what `slurmkit stage` publishes last
FOLDER = "slurmkit-data"
COPY_THREADS = 8
CHUNK = 8 << 20
# Each node's tasks of a multi-node step get their own node's path: VAR ROOT KEY triples, "--".
_EXPORT = (
    'n="${SLURMD_NODENAME:-$(hostname)}"; '
    'while [ "$1" != -- ]; do export "$1=$2/$n/$3"; shift 3; done; shift; exec "$@"'
)


class DataError(Exception):
    """A dataset the trial needs is not published, or its node copy cannot be made whole
    (the message names it)."""


@dataclass(frozen=True)
class Item:
    """One dataset of the spec, as this job places it."""

    name: str  # SLURMKIT_DATA_<NAME upper-cased>
    dst: str  # on the shared filesystem
    root: str | None  # ROOT/slurmkit-data of its node copies; None: read from dst
    key: str  # its folder under ROOT/slurmkit-data/NODE/

    @property
    def var(self) -> str:
        return f"{ENV_DATA}_{self.name.upper()}"

    def path(self, node: str) -> str:
        """Where the trial reads it on ``node``."""
        return self.dst if self.root is None else os.path.join(self.root, node, self.key)


def items(data: Sequence[Mapping[str, Any]], env: Mapping[str, str]) -> list[Item]:
    """The ``data`` rows of ``sweep.json`` placed for a trial whose environment is ``env``."""
    out = []
    for row in data:
        root = None
        if row.get("cache") == "node":
            base = row.get("cache_dir") or env.get("TMPDIR") or "/tmp"
            root = os.path.join(base, FOLDER)
        tag = hashlib.sha256(row["dst"].encode()).hexdigest()[:12]
        plain = re.sub(r"[^A-Za-z0-9_.-]", "_", os.path.basename(row["dst"]))[:64].lstrip(".")
        out.append(Item(row["name"], row["dst"], root, f"{plain or 'data'}-{tag}"))
    return out


def variables(found: Sequence[Item], node: str) -> dict[str, str]:
    """``SLURMKIT_DATA_<NAME>`` for each dataset, and ``SLURMKIT_DATA`` when there is one."""
    out = {item.var: item.path(node) for item in found}
    if len(found) == 1:
        out[ENV_DATA] = found[0].path(node)
    return out


def wrapper(found: Sequence[Item]) -> list[str]:
    """``sh -c`` that gives each node's tasks of a multi-node step the paths of that node's
    copies, then execs the rest of the argv (values as arguments, never script text); empty
    when no dataset is cached on the nodes."""
    cached = [item for item in found if item.root is not None]
    args: list[str] = []
    for item in cached:
        args += [item.var, item.root or "", item.key]
        if len(found) == 1:
            args += [ENV_DATA, item.root or "", item.key]
    return ["sh", "-c", _EXPORT, "slurmkit-data", *args, "--"] if cached else []


def published(item: Item) -> dict[str, Any]:
    """The manifest of ``item``'s dataset on the shared filesystem; DataError when it is not
    published there."""
    path = os.path.join(item.dst, MANIFEST)
    try:
        found = read_record(path)
    except (Damaged, OSError) as exc:
        raise DataError(f"{item.dst}: its manifest cannot be read ({exc})") from None
    if not isinstance(found, dict) or not isinstance(found.get("files"), list):
        raise DataError(
            f"{item.dst}: not staged (no {MANIFEST}): its stage job did not finish, or the "
            "dataset was removed; `slurmkit stage SRC DST` publishes it"
        )
    return found


def cache(item: Item, node: str, manifest: Mapping[str, Any], stop: Callable[[], bool]) -> bool:
    """Make ``item``'s copy on ``node`` match ``manifest`` (copied under the node's lock, each
    file checked against its CRC-32); True when this call copied it, False when it was whole."""
    target = item.path(node)
    base = os.path.dirname(target)
    os.makedirs(base, exist_ok=True)
    if _whole(target, manifest):
        return False
    lock = Lock(base)
    lock.acquire("data cache", wait=math.inf)  # a dead holder on this node is broken at once
    try:
        if _whole(target, manifest):  # the task we waited for copied it
            return False
        for name in os.listdir(base):  # left by a copier that was killed
            if name.startswith(f".{item.key}.tmp-"):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        tmp = make_temp_dir(base, f".{item.key}.tmp-")
        try:
            _copy(item.dst, tmp, manifest["files"], stop)
            atomic_write_json(os.path.join(tmp, MANIFEST), manifest)
            if os.path.lexists(target):  # an older or broken copy
                aside = f"{tmp}-old"
                os.rename(target, aside)
                shutil.rmtree(aside, ignore_errors=True)
            os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return True
    finally:
        lock.release()


def _whole(target: str, manifest: Mapping[str, Any]) -> bool:
    """The copy at ``target`` holds the manifest's files at their sizes."""
    try:
        mine = read_record(os.path.join(target, MANIFEST))
    except (Damaged, OSError):
        return False
    if not isinstance(mine, dict) or mine.get("files") != manifest["files"]:
        return False
    try:
        return all(
            os.stat(os.path.join(target, row["path"])).st_size == row["size"]
            for row in manifest["files"]
        )
    except OSError:
        return False


def _copy(src: str, dst: str, rows: Iterable[Mapping[str, Any]], stop: Callable[[], bool]) -> None:
    """Copy each manifest row's file from ``src`` to ``dst``, reading it once: its CRC-32 and
    size are checked against the row as it is written. The first failure stops the rest."""
    failed = threading.Event()

    def one(row: Mapping[str, Any]) -> None:
        rel = str(row["path"])
        if os.path.isabs(rel) or any(p in ("", ".", "..") for p in rel.split("/")):
            raise DataError(f"{src}: its manifest names {rel!r}, which is no file under it")
        if stop() or failed.is_set():
            raise DataError("stopped before it was copied whole")
        try:
            _copy_file(src, dst, rel, row)
        except BaseException:
            failed.set()
            raise

    with ThreadPoolExecutor(COPY_THREADS, thread_name_prefix="slurmkit-cache") as pool:
        for _ in pool.map(one, rows):
            pass


def _copy_file(src: str, dst: str, rel: str, row: Mapping[str, Any]) -> None:
    """Copy ``src/rel`` to ``dst/rel`` in one read, checking it against its manifest ``row``."""
    source, target = os.path.join(src, rel), os.path.join(dst, rel)
    os.makedirs(os.path.dirname(target), exist_ok=True)
    crc, size = 0, 0
    try:
        with open(source, "rb") as fin, open(target, "wb") as fout:
            while chunk := fin.read(CHUNK):
                crc = zlib.crc32(chunk, crc)
                size += len(chunk)
                fout.write(chunk)
    except OSError as exc:
        raise DataError(f"{source}: cannot copy it to {target}: {exc.strerror}") from None
    if size != row["size"] or f"crc32:{crc:08x}" != row["checksum"]:
        raise DataError(
            f"{source}: {size} bytes with crc32:{crc:08x}, its manifest says "
            f"{row['size']} bytes with {row['checksum']}: the shared copy is damaged"
        )


def prepare(
    data: Sequence[Mapping[str, Any]],
    env: Mapping[str, str],
    node: str,
    copy_step: Sequence[str],
    stop: Callable[[], bool],
    log: IO[bytes],
) -> tuple[dict[str, str], list[str]]:
    """Check every dataset is published and make the node copies: here (one node), or in
    ``copy_step`` (the ``srun`` prefix of one task per node) when it is given. The trial's
    variables and the :func:`wrapper` its step needs; DataError naming what is missing."""
    found = items(data, env)
    manifests = {item.name: published(item) for item in found}
    cached = [item for item in found if item.root is not None]
    if cached and copy_step:
        argv = [*copy_step, sys.executable, "-m", "slurmkit.runtime.datacache"]
        log.flush()
        code = subprocess.run(argv, env=dict(env), stdout=log, stderr=log).returncode
        if code:
            raise DataError(f"the node copy step exited {code} (its output is above)")
        return variables(found, node), wrapper(found)
    for item in cached:
        copied = cache(item, node, manifests[item.name], stop)
        _say(log, item, node, copied)
    return variables(found, node), []


def _say(log: IO[bytes], item: Item, node: str, copied: bool) -> None:
    what = "copied to" if copied else "already whole at"
    log.write(f"slurmkit.data: {item.name} {what} {item.path(node)} on {node}\n".encode())
    log.flush()


def node_name() -> str:
    """The Slurm node this runs on (the host's name outside Slurm)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname()


def main() -> int:
    """One task per node of a multi-node trial: copy its cached datasets to this node."""
    root = os.environ.get("SLURMKIT_SWEEP_DIR")
    if not root:
        print("slurmkit.runtime.datacache: SLURMKIT_SWEEP_DIR must be set", file=sys.stderr)
        return 2
    try:
        data = JobContract.read(SweepDir(root).sweep_json).data
    except (OSError, ValueError) as exc:
        print(f"slurmkit.runtime.datacache: {exc}", file=sys.stderr)
        return 2
    node = node_name()
    log = sys.stdout.buffer
    try:
        for item in items(data, os.environ):
            if item.root is not None:
                _say(log, item, node, cache(item, node, published(item), lambda: False))
    except DataError as exc:
        print(f"slurmkit.data: on {node}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
