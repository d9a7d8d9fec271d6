"""Hot data: copy a dataset from object storage (any fsspec URL) to the shared filesystem, once.

``stage(src, dst)`` lists SRC, fetches what DST lacks (small files in batches, large ones in
ranged parts, on a pool of threads) and publishes DST whole::

    PARENT/.NAME.slurmkit-stage/    while staging: the lock, data/ (the dataset so far) and
                                    journal.jsonl (one line per finished file)
    DST/                            data/ renamed into place once every file is there
    DST/.slurmkit-manifest.json     path, size, checksum and source version of every file,
                                    written last, before the rename

A reader trusts DST only when :func:`ready` finds its manifest: the rename of a whole
directory is atomic, so DST is absent or complete. A finished file is renamed into data/ from a
temporary name and then journaled, so a killed stager's rerun keeps it (a file renamed but not
yet journaled is checked again locally, never fetched again). Stagers of one DST take the
stage directory's lock (:mod:`slurmkit.core.lock`): one copies, the others wait and then find
DST published. Only public parts of URLs (no user, password or query) reach files and output;
credentials come from the backend's own chain (for S3: AWS's environment, config and profile).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from .compat import s3fs as s3compat
from .core import fsutil
from .core.lock import Lock, LockBusy, describe
from .core.lock import read as read_lock
from .errors import UserError

MANIFEST = ".slurmkit-manifest.json"
PART = ".slurmkit-part-"  # in the name of a file still being written
FORMAT = 1
PART_SIZE = 16 << 20  # smaller files are fetched whole, in batches; larger ones in ranged parts
MAX_PART = 64 << 20  # of at most this size (see part_bytes)
STREAM_CHUNK = 1 << 20  # bytes of a ranged GET's body written at a time
READ_BACK = 8 << 20  # bytes of a part read back at a time for its file's MD5
BATCH_FILES = 32  # small files per batch
JOBS = 16
# URL scheme -> fsspec protocol; no scheme: a local path
SCHEMES = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "https"}
INSTALL = {"s3": "pip install 'slurmkit[s3]' (s3fs)", "gcs": "pip install gcsfs"}
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_MD5 = re.compile(r"^[0-9a-f]{32}$")


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


@dataclass
class Plan:
    """What a run does with each source file."""

    skip: list[Entry] = field(default_factory=list)  # finished and journaled
    recheck: list[Entry] = field(default_factory=list)  # there, not journaled: checked locally
    batches: list[list[Entry]] = field(default_factory=list)  # small files, fetched whole
    large: list[Entry] = field(default_factory=list)  # fetched in ranged parts
    whole: list[Entry] = field(default_factory=list)  # streamed to disk in one GET

    @property
    def fetch(self) -> list[Entry]:
        return [e for batch in self.batches for e in batch] + self.large + self.whole


@dataclass
class Result:
    """What :func:`stage` did (or, with ``dry_run``, would do)."""

    source: str
    destination: str
    files: int = 0  # in the dataset
    total_bytes: int = 0
    copied: int = 0  # files fetched by this run
    bytes: int = 0  # bytes fetched by this run
    skipped: int = 0  # files already complete at DST
    seconds: float = 0.0
    published: bool = False  # this run published DST
    waited: bool = False  # another stager held the lock first
    verified: int | None = None  # files whose checksum --verify read again
    dry_run: bool = False
    to_copy: list[tuple[str, int | None]] = field(default_factory=list)  # dry run: what and size

    def as_dict(self) -> dict[str, Any]:
        out = {
            k: getattr(self, k)
            for k in ("source", "destination", "files", "total_bytes", "copied", "bytes")
        }
        out |= {"skipped": self.skipped, "seconds": round(self.seconds, 3)}
        out |= {"published": self.published, "waited": self.waited, "verified": self.verified}
        if self.dry_run:
            out |= {"dry_run": True, "to_copy": [{"path": p, "size": s} for p, s in self.to_copy]}
        return out

    def text(self) -> str:
        if self.dry_run:
            size = sum(s or 0 for _, s in self.to_copy)
            lines = [
                f"dry run: would copy {len(self.to_copy)} of {self.files} file(s), "
                f"{_human(size)}, to {self.destination}; {self.skipped} already complete; "
                "nothing was written"
            ]
            lines += [f"  {p}  {_human(s or 0)}" for p, s in self.to_copy[:20]]
            if len(self.to_copy) > 20:
                lines.append(f"  ... and {len(self.to_copy) - 20} more (--json lists them all)")
            return "\n".join(lines)
        rate = self.bytes / self.seconds if self.seconds > 0 else 0.0
        what = (
            f"staged {self.files} file(s), {_human(self.total_bytes)}, at {self.destination}: "
            f"copied {self.copied} ({_human(self.bytes)}, {_human(rate)}/s), "
            f"{self.skipped} already complete"
        )
        if self.waited and not self.published:
            what += " (another stager copied it; this one waited)"
        if self.verified is not None:
            what += f"; verified {self.verified} checksum(s)"
        return what


class Reporter:
    """Progress callbacks (this one is silent); :func:`bar` draws them."""

    def start(self, total_bytes: int, files: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def note(self, text: str) -> None:
        import sys

        print(text, file=sys.stderr, flush=True)

    def stop(self) -> None:
        pass


# ---- pure decisions ------------------------------------------------------------------------


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
                f"{_url(protocol, name)}: the name {rel!r} cannot be a file under DST",
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


def plan(
    source: Sequence[Entry],
    journal: Mapping[str, Record],
    present: Mapping[str, int],
    part_size: int = PART_SIZE,
    batch_files: int = BATCH_FILES,
    ranges: bool = True,
) -> Plan:
    """What to do with each source file, given the journal of finished files and the sizes of
    the files already in the stage directory: skip a journaled file of the same size and
    version, check again locally one that is there at its size but not journaled, and fetch
    the rest (smaller than ``part_size``: in batches of at most ``batch_files`` files and
    ``part_size`` bytes; others in ranged parts, or streamed whole where the server takes no
    byte ranges, as is a file of unknown size)."""
    out = Plan()
    batch: list[Entry] = []
    batch_bytes = 0
    for e in source:
        done = journal.get(e.path)
        have = present.get(e.path)
        kept = done is not None and (done.size, done.version) == (have, e.version)
        if kept and have is not None and e.size in (None, have):
            out.skip.append(e)
            continue
        if have is not None and done is None and e.size is not None and e.size == have:
            out.recheck.append(e)
            continue
        if e.size is None or (e.size > part_size and not ranges):
            out.whole.append(e)
            continue
        if e.size > part_size:
            out.large.append(e)
            continue
        size = e.size
        if batch and (len(batch) >= batch_files or batch_bytes + size > part_size):
            out.batches.append(batch)
            batch, batch_bytes = [], 0
        batch.append(e)
        batch_bytes += size
    if batch:
        out.batches.append(batch)
    return out


def parts(size: int, part_size: int) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges of at most ``part_size`` bytes covering ``size`` bytes."""
    return [(start, min(start + part_size, size)) for start in range(0, size, part_size)]


def differences(source: Sequence[Entry], manifest: Mapping[str, Any]) -> list[str]:
    """How a published manifest differs from the source listing (empty: DST is up to date)."""
    rows = {row["path"]: row for row in manifest.get("files", [])}
    out = []
    for e in source:
        row = rows.pop(e.path, None)
        if row is None:
            out.append(f"{e.path}: new at the source")
        elif (row.get("size"), row.get("version")) != (e.size, e.version):
            out.append(f"{e.path}: changed at the source")
    out += [f"{path}: gone from the source" for path in sorted(rows)]
    return out


def manifest(source: str, records: Iterable[Record]) -> dict[str, Any]:
    """The manifest of a dataset staged from ``source`` (its public URL)."""
    rows = sorted((r.row() for r in records), key=lambda r: r["path"])
    return {
        "format": FORMAT,
        "source": public(source),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "files": rows,
        "count": len(rows),
        "bytes": sum(r["size"] for r in rows),
    }


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


def _url(protocol: str, name: str) -> str:
    """A backend path as the user wrote it (``s3://bucket/key``)."""
    if protocol == "file" or "://" in name:
        return public(name)
    return f"{'gs' if protocol == 'gcs' else protocol}://{name}"


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


# ---- readers -------------------------------------------------------------------------------


def ready(dst: str) -> dict[str, Any] | None:
    """The manifest of the dataset published at ``dst`` (``files``: path, size, checksum,
    version), or None while it is not there (absent, being staged, or not slurmkit's)."""
    try:
        found = fsutil.read_record(os.path.join(dst, MANIFEST))
    except (fsutil.Damaged, OSError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("files"), list):
        return None
    return found


def verify(dst: str, jobs: int = JOBS) -> tuple[int, list[str]]:
    """Read every file of the published ``dst`` again: (files checked, problems found)."""
    found = ready(dst)
    if found is None:
        raise UserError.failure(
            f"{dst}: no staged dataset here (no {MANIFEST})", hint="stage it first: slurmkit stage"
        )

    def check(row: dict[str, Any]) -> str | None:
        path = os.path.join(dst, row["path"])
        try:
            size, crc = _file_crc(path)
        except FileNotFoundError:
            return f"{path}: missing"
        if size != row["size"]:
            return f"{path}: {size} bytes, the manifest says {row['size']}"
        if _crc_text(crc) != row["checksum"]:
            return (
                f"{path}: checksum mismatch ({_crc_text(crc)}, the manifest says {row['checksum']})"
            )
        return None

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        problems = [p for p in pool.map(check, found["files"]) if p]
    return len(found["files"]), problems


def _file_crc(path: str) -> tuple[int, int]:
    size, crc = 0, 0
    with open(path, "rb") as fh:
        while chunk := fh.read(8 << 20):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, crc


def _crc_text(crc: int) -> str:
    return f"crc32:{crc:08x}"


# ---- the stager ----------------------------------------------------------------------------


def stage_dir(dst: str) -> str:
    """Where DST is built: a hidden sibling on the same filesystem."""
    parent, name = os.path.split(dst.rstrip("/"))
    return os.path.join(parent, f".{name}.slurmkit-stage")


def stage(
    src: str,
    dst: str,
    *,
    verify_after: bool = False,
    dry_run: bool = False,
    endpoint_url: str | None = None,
    jobs: int = JOBS,
    part_size: int = PART_SIZE,
    reporter: Reporter | None = None,
) -> Result:
    """Stage SRC at DST (see the module's docstring) and say what was done.

    UserError: exit 2 for a bad SRC or DST, exit 1 for a missing source object, a checksum
    mismatch or a failed copy (each names the object; what is finished is kept for a rerun).
    """
    started = time.monotonic()
    protocol = source_protocol(src)
    dst = local_dst(dst)
    reporter = reporter or Reporter()
    fs, root = filesystem(src, protocol, endpoint_url, jobs)
    result = Result(public(src), dst, dry_run=dry_run)
    listing = _list(fs, root, src, protocol)
    result.files, result.total_bytes = len(listing), sum(e.size or 0 for e in listing)

    def finish() -> Result:
        if verify_after:
            result.verified, problems = verify(dst, jobs)
            if problems:
                raise UserError.failure(
                    f"{len(problems)} file(s) at {dst} differ from its manifest: "
                    + "; ".join(problems[:10]),
                    hint=f"remove {dst} and stage it again",
                )
        result.seconds = time.monotonic() - started
        return result

    if _up_to_date(dst, listing, result):
        return finish()
    _refuse_taken(dst)
    work = stage_dir(dst)
    if dry_run:
        _, journal, present = _scan(work, keep=True)
        todo = plan(listing, journal, present, part_size)
        result.skipped = len(todo.skip) + len(todo.recheck)
        result.to_copy = [(e.path, e.size) for e in todo.fetch]
        result.seconds = time.monotonic() - started
        return result
    with _locked(work, reporter) as (lock, waited):
        result.waited = waited
        if not _up_to_date(dst, listing, result):  # else: the stager we waited for did it
            _refuse_taken(dst)
            _Copy(fs, protocol, work, listing, jobs, part_size, reporter, result).run()
            _publish(src, dst, work, listing, lock)
            result.published = True
    with contextlib.suppress(OSError):  # a waiter's lock file may be in it: then it stays
        os.rmdir(work)
    return finish()


def _refuse_taken(dst: str) -> None:
    """UserError (usage) when DST is something other than nothing or an empty directory."""
    if os.path.lexists(dst) and not (os.path.isdir(dst) and not os.listdir(dst)):
        raise UserError(
            f"{dst} exists and is not a dataset slurmkit staged (it has no {MANIFEST})",
            key="DST",
            hint="stage to a new path, or remove it",
        )


def _up_to_date(dst: str, listing: Sequence[Entry], result: Result) -> bool:
    """True when DST is published from this very listing; UserError when it is published
    from another (a published dataset is never changed under its readers)."""
    found = ready(dst)
    if found is None:
        return False
    diff = differences(listing, found)
    if diff:
        raise UserError.failure(
            f"{dst} holds another version of {result.source} ({len(diff)} difference(s): "
            + "; ".join(diff[:5])
            + ")",
            hint="stage it to a new path (a published dataset is never changed in place), "
            "or remove it first",
        )
    result.skipped = len(listing)
    return True


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


def _list(fs: Any, root: str, src: str, protocol: str) -> list[Entry]:
    """The source's files (one LIST per 1,000 keys on S3); a single URL on http(s)."""
    try:
        if protocol in ("http", "https"):
            found = {root: {**fs.info(root), "type": "file"}}
        else:
            found = fs.find(root, detail=True)
    except FileNotFoundError:
        found = {}
    except Exception as exc:  # the backend's own errors (credentials, access, network)
        raise UserError.failure(f"{public(src)}: cannot list it: {_said(exc)}") from None
    listing = entries(found, root, protocol)
    if not listing:
        raise UserError.failure(
            f"{public(src)}: no such object or prefix (nothing to stage)",
            hint="check the URL (and --endpoint-url or AWS_ENDPOINT_URL for non-AWS storage)",
        )
    return listing


def _read_sums(path: str, md5: bool) -> tuple[int, int, str | None]:
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


def _said(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) < 300 else text[:300] + "..."


def _scan(work: str, keep: bool = False) -> tuple[str, dict[str, Record], dict[str, int]]:
    """The stage directory's data folder, its journal and the sizes of the finished files
    there; left-over partial files (and a manifest not yet published) are removed unless
    ``keep`` (a dry run)."""
    data = os.path.join(work, "data")
    journal: dict[str, Record] = {}
    try:
        with open(os.path.join(work, "journal.jsonl"), encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                    journal[row["path"]] = Record(
                        row["path"], row["size"], row["version"], row["checksum"]
                    )
                except (ValueError, KeyError, TypeError):
                    continue  # a line cut by a kill
    except FileNotFoundError:
        pass
    present: dict[str, int] = {}
    for folder, _dirs, files in os.walk(data):
        for name in files:
            path = os.path.join(folder, name)
            rel = os.path.relpath(path, data).replace(os.sep, "/")
            if PART in name or rel == MANIFEST:
                if not keep:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                continue
            with contextlib.suppress(FileNotFoundError):
                present[rel] = os.stat(path).st_size
    return data, journal, present


@contextlib.contextmanager
def _locked(work: str, reporter: Reporter) -> Iterator[tuple[Lock, bool]]:
    """Hold the lock of the stage directory ``work`` (made if need be), waiting for another
    stager as long as it lives; yields the lock and whether this one waited."""
    waited = False
    while True:
        os.makedirs(work, exist_ok=True)
        lock = Lock(work)
        try:
            try:
                lock.acquire("stage", wait=0)
            except LockBusy as busy:
                waited = True
                reporter.note(f"waiting: {work} is being staged ({describe(busy.holder)})")
                lock.acquire("stage", wait=math.inf)
        except FileNotFoundError:  # the holder published and removed the directory just now
            continue
        break
    try:
        yield lock, waited
    finally:
        lock.release()


class _Failed(Exception):
    """One object could not be copied (the message names it)."""


class _Copy:
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
        data, journal, present = _scan(self.work)
        os.makedirs(data, exist_ok=True)
        big = next((e for e in self.listing if (e.size or 0) > self.part_size), None)
        ranges = big is None or _ranges_ok(self.fs, self.protocol, big.url)
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
        except _Failed as exc:
            self._fail(str(exc))
        except Exception as exc:  # a backend's or the filesystem's error: name the object
            self._fail(f"copy failed: {_said(exc)}")

    def _fail(self, text: str) -> None:
        with self.lock:
            self.errors.append(text)
        self.stop.set()

    def _where(self, e: Entry) -> str:
        return _url(self.protocol, e.url)

    def _target(self, e: Entry) -> tuple[str, str]:
        """The final path of ``e`` in the stage directory and a fresh temporary one beside it."""
        path = os.path.join(self.data, *e.path.split("/"))
        folder, name = os.path.split(path)
        os.makedirs(folder, exist_ok=True)
        return path, os.path.join(folder, f".{name}{PART}{os.urandom(6).hex()}")

    def _done(self, e: Entry, size: int, crc: int, tmp: str, path: str) -> None:
        """Rename the finished file into place, then journal it."""
        os.rename(tmp, path)
        record = Record(e.path, size, e.version, _crc_text(crc))
        os.write(self.journal_fd, (json.dumps(record.row()) + "\n").encode())
        with self.lock:
            self.result.copied += 1
            self.result.bytes += size

    def _check(self, e: Entry, size: int, md5: str | None) -> None:
        if e.size is not None and size != e.size:
            raise _Failed(f"{self._where(e)}: got {size} bytes, the listing says {e.size}")
        if e.md5 is not None and md5 is not None and md5 != e.md5 and self._md5_applies(e):
            raise _Failed(
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
            raise _Failed(f"{self._where(e)}: the object changed while it was copied")
        return True

    def _recheck(self, e: Entry) -> bool:
        """A file renamed into place by a run killed before it journaled it: checked here,
        not fetched again."""
        path = os.path.join(self.data, *e.path.split("/"))
        size, crc, md5 = _read_sums(path, bool(e.md5))
        if size != e.size or (md5 is not None and md5 != e.md5):
            return False
        record = Record(e.path, size, e.version, _crc_text(crc))
        os.write(self.journal_fd, (json.dumps(record.row()) + "\n").encode())
        return True

    def _batch(self, batch: list[Entry]) -> None:
        """Fetch small files whole, several requests at once."""
        for e, got in zip(batch, _fetch_many(self.fs, [e.url for e in batch])):
            if self.stop.is_set():
                return
            if isinstance(got, FileNotFoundError):
                raise _Failed(f"{self._where(e)}: no such object (it was listed, then gone)")
            if isinstance(got, BaseException):
                raise _Failed(f"{self._where(e)}: copy failed: {_said(got)}")
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
                raise _Failed(f"{self._where(e)}: cannot write {path}: {_said(exc)}") from None
            self.reporter.advance(len(got))

    def _whole(self, e: Entry) -> None:
        """Stream one file to disk in one GET (no byte ranges, or no size known), then sum it."""
        path, tmp = self._target(e)
        try:
            try:
                self.fs.get_file(e.url, tmp)
            except FileNotFoundError:
                raise _Failed(
                    f"{self._where(e)}: no such object (it was listed, then gone)"
                ) from None
            except Exception as exc:
                raise _Failed(f"{self._where(e)}: copy failed: {_said(exc)}") from None
            size, crc, md5 = _read_sums(tmp, bool(e.md5))
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
        from .runtime.crc import join  # CRC-32 of parts, combined

        assert e.size is not None
        size, ranges = e.size, parts(e.size, self.part_bytes)
        path, tmp = self._target(e)
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        os.ftruncate(fd, size)
        crcs = [0] * len(ranges)
        written: set[int] = set()  # parts on disk, not yet fed to the MD5
        digest = hashlib.md5(usedforsecurity=False) if e.md5 else None
        state = {"left": len(ranges), "next": 0, "bad": False, "hashing": False, "closed": False}
        guard = threading.Lock()

        def settle(index: int | None, ok: bool) -> bool:
            """Count one part in, feed the MD5 what is in order (one thread at a time, outside
            the guard); True for the thread that finds the file whole and hashed: it closes it
            and finishes it. A thread that leaves with work undone leaves it to the one doing
            it (every change is followed by its own thread's look at what is left)."""
            with guard:
                state["left"] -= 1
                if ok and index is not None:
                    written.add(index)
                else:
                    state["bad"] = True
            failed: BaseException | None = None
            while digest is not None:
                with guard:
                    if state["hashing"] or state["bad"] or state["next"] not in written:
                        break
                    state["hashing"] = True
                    nxt = state["next"]
                try:
                    _digest_range(fd, digest, *ranges[nxt])
                except OSError as exc:
                    failed = exc
                with guard:
                    written.discard(nxt)
                    state["next"] += 1
                    state["hashing"] = False
                    state["bad"] = state["bad"] or failed is not None
            with guard:
                # a part still to be hashed is hashed by the thread that wrote it or that
                # hashes now, and that one comes here after
                hashed = state["bad"] or digest is None or state["next"] == len(ranges)
                last = hashed and not (state["left"] or state["hashing"] or state["closed"])
                if last:
                    state["closed"] = True
                    os.close(fd)
                    if state["bad"]:
                        with contextlib.suppress(FileNotFoundError):
                            os.unlink(tmp)
                whole = bool(last and not state["bad"])
            if failed is not None:
                raise _Failed(f"{self._where(e)}: cannot read back {tmp}: {_said(failed)}")
            return whole

        def part(index: int) -> None:
            start, end = ranges[index]
            try:
                if self.stop.is_set():
                    settle(index, False)
                    return
                crcs[index] = self._fetch_range(e, start, end, fd)
            except FileNotFoundError:
                settle(index, False)
                raise _Failed(
                    f"{self._where(e)}: no such object (it was listed, then gone)"
                ) from None
            except _Failed:
                settle(index, False)
                raise
            except Exception as exc:
                settle(index, False)
                raise _Failed(f"{self._where(e)}: copy failed: {_said(exc)}") from None
            self.reporter.advance(end - start)
            if settle(index, True):
                try:
                    self._check(e, size, digest.hexdigest() if digest else None)
                    crc = join(0, zip(crcs, (b - a for a, b in ranges)))
                    self._done(e, size, crc, tmp, path)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                    raise

        for index in range(len(ranges)):
            if not submit(part, index):  # stopped: the parts never sent count as failed
                for _ in range(index, len(ranges)):
                    settle(None, False)
                return

    def _fetch_range(self, e: Entry, start: int, end: int, fd: int) -> int:
        """Bytes ``[start, end)`` of ``e`` written at their offset in ``fd``: their CRC-32.
        On S3, streamed to disk as they arrive (memory: a read buffer, whatever the part
        size); elsewhere, read whole and written."""
        if self.protocol == "s3" and s3compat.can_call(self.fs):
            return _s3_range(self.fs, e.url, start, end, fd, self._where(e))
        got = self.fs.cat_file(e.url, start=start, end=end)
        if len(got) != end - start:
            raise _Failed(f"{self._where(e)}: bytes {start}-{end} came back as {len(got)} bytes")
        os.pwrite(fd, got, start)
        return zlib.crc32(got)


def part_bytes(large: Sequence[Entry], jobs: int, part_size: int) -> int:
    """The size of the ranged parts of this run's large files: their bytes shared among the
    ``jobs`` threads (one part each, so every thread has one and no more requests are made
    than the threads can send at once), at least ``part_size``, at most ``MAX_PART`` (or
    ``part_size`` where that is larger), in whole MiB."""
    total = sum(e.size or 0 for e in large)
    share = -(-total // max(1, jobs))
    share = -(-share // (1 << 20)) << 20
    return max(part_size, min(share, MAX_PART))


def _digest_range(fd: int, digest: Any, start: int, end: int) -> None:
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


def _s3_range(fs: Any, url: str, start: int, end: int, fd: int, where: str) -> int:
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
                    raise _Failed(f"{where}: bytes {pos}-{end} came back as {length} bytes")
                while pos < end:
                    chunk = await body.read(min(STREAM_CHUNK, end - pos))
                    if not chunk:
                        raise _Failed(f"{where}: bytes {pos}-{end} ended early")
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


def _ranges_ok(fs: Any, protocol: str, url: str) -> bool:
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


def _fetch_many(fs: Any, urls: list[str]) -> list[Any]:
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


def _publish(src: str, dst: str, work: str, listing: Sequence[Entry], lock: Lock) -> None:
    """Check the stage directory holds exactly the listing, write the manifest last and
    rename the directory to DST (only while this stager still holds the lock)."""
    data, journal, present = _scan(work)
    wanted = {e.path for e in listing}
    for rel in sorted(set(present) - wanted):  # left by an earlier version of the source
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(data, *rel.split("/")))
    records = []
    for e in listing:
        done = journal.get(e.path)
        if done is None or present.get(e.path) != done.size or done.version != e.version:
            raise UserError.failure(f"{_url('file', e.path)}: not staged (internal error)")
        records.append(done)
    found = read_lock(lock.path)
    if found is None or found[0].get("token") != lock.token:
        raise UserError.failure(
            f"{work}: another stager took the lock (this one's heartbeat stopped): "
            "it publishes, this one does not"
        )
    fsutil.atomic_write_json(os.path.join(data, MANIFEST), manifest(src, records))
    os.rename(data, dst)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(work, "journal.jsonl"))


@contextlib.contextmanager
def bar(enabled: bool) -> Iterator[Reporter]:
    """A reporter that draws a progress bar (bytes, bytes/s, ETA) on stderr when ``enabled``
    (stderr a terminal); else the plain one."""
    if not enabled:
        yield Reporter()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    progress = Progress(
        TextColumn("[bold]staging"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[files]}"),
        console=Console(stderr=True),
    )

    class Drawn(Reporter):
        task: Any = None

        def start(self, total_bytes: int, files: int) -> None:
            self.task = progress.add_task("stage", total=total_bytes, files=f"{files} file(s)")
            progress.start()

        def advance(self, nbytes: int) -> None:
            if self.task is not None:
                progress.update(self.task, advance=nbytes)

        def note(self, text: str) -> None:
            from rich.text import Text

            progress.console.print(Text(text, style="dim"))

        def stop(self) -> None:
            progress.stop()

    try:
        yield Drawn()
    finally:
        progress.stop()
