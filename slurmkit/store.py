"""Creating and reading sweep directories (login-node side). Layout: :mod:`slurmkit.core.layout`."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import __version__
from .core.arrays import array_bounds
from .core.fsutil import Damaged, atomic_write_json, make_temp_dir, read_json, read_record
from .core.layout import SweepDir
from .core.lock import Lock, LockBusy
from .errors import Busy, UserError

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")  # a directory name, never '..' or '/'
_ARRAY = re.compile(r"^\d+(-\d+)?(:[1-9]\d*)?(,\d+(-\d+)?(:[1-9]\d*)?)*(%\d+)?$")  # 0-9,12%4

if TYPE_CHECKING:
    from .plan import Plan
    from .spec import SweepSpec


def default_root(spec: SweepSpec) -> str:
    """``OUTPUT_ROOT/NAME-YYYYmmdd-HHMMSS`` (absolute), with a suffix when taken."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.abspath(os.path.join(spec.output_root, f"{spec.name}-{stamp}"))
    root, n = base, 1
    while os.path.exists(root):
        n += 1
        root = f"{base}-{n}"
    return root


def sweep_config(plan: Plan) -> dict[str, Any]:
    """What ``sweep.json`` holds: the resolved spec, how trials are launched, and where and by
    what it was made."""
    spec = plan.spec
    return {
        **spec.to_dict(),
        "source": spec.source,
        "submit_dir": plan.submit_dir,
        "launch": plan.launch,
        "created": time.time(),
        "slurmkit_version": __version__,
    }


def create(
    plan: Plan, root: str, submission: dict[str, Any] | None = None, lock: Lock | None = None
) -> SweepDir:
    """Write the sweep directory of ``plan`` in a temporary sibling and rename it into place.

    Either the whole directory appears, or nothing does. Raises UserError if ``root`` exists.
    ``submission``, when given, is recorded as submission 0 (a script submitted by hand).
    ``lock`` (unheld) is taken in the new directory before it appears: nobody else can resume
    or cancel the sweep before its first submission is recorded.
    """
    assert plan.trials is not None, "a new sweep directory needs the expanded trials"
    root = os.path.abspath(root)
    parent = os.path.dirname(root)
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create {parent}: {exc.strerror}", key="output_root") from None
    if os.path.exists(root):
        raise UserError(f"{root} already exists", hint="use --resume to continue a sweep")
    tmp = make_temp_dir(parent, f".{os.path.basename(root)}.tmp-")
    try:
        staging = SweepDir(tmp)
        for sub in (staging.submissions, staging.scripts, staging.logs, staging.trials):
            os.mkdir(sub)
        atomic_write_json(staging.sweep_json, sweep_config(plan), fsync=False)
        with open(staging.spec_yaml, "w", encoding="utf-8") as fh:
            fh.write(to_yaml(plan.spec))
        with open(staging.manifest, "w", encoding="utf-8") as fh:
            fh.writelines(row + "\n" for row in plan.trials.rows)
        if submission is not None:
            record_submission(staging, submission)
        if lock is not None:
            lock.moved(tmp)
            lock.acquire("submit", wait=0)
        os.rename(tmp, root)
        if lock is not None:
            lock.moved(root)
    except BaseException:
        if lock is not None:
            lock.release()
        remove(SweepDir(tmp))
        raise
    return SweepDir(root)


def remove(sweep: SweepDir) -> None:
    """Delete a sweep directory that was just created (its submission was refused)."""
    # shutil imports bz2 and lzma (~3 ms of every submit): only this failure path needs it
    import shutil

    shutil.rmtree(sweep.root, ignore_errors=True)


def update_config(sweep: SweepDir, plan: Plan) -> None:
    """Store a resumed plan's changed spec and launch in ``sweep.json``."""
    config = read_json(sweep.sweep_json)
    atomic_write_json(sweep.sweep_json, {**config, **plan.spec.to_dict(), "launch": plan.launch})


def to_yaml(spec: SweepSpec) -> str:
    """The resolved spec as YAML (what ``slurmkit sweep`` would need to rebuild the sweep)."""
    # PyYAML costs ~10 ms to import: only commands that write a sweep directory pay for it
    import yaml

    return yaml.dump(
        spec.to_dict(),
        Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
        sort_keys=False,
        allow_unicode=True,
    )


def locked(sweep: SweepDir, purpose: str) -> Lock:
    """The sweep directory's lock, held for ``purpose`` (resume, cancel); Busy naming the holder
    when another command keeps it longer than ``$SLURMKIT_LOCK_WAIT`` seconds (default 10)."""
    try:
        wait = max(0.0, float(os.environ.get("SLURMKIT_LOCK_WAIT", "10")))
    except ValueError:
        wait = 10.0
    lock = Lock(sweep.root)
    try:
        lock.acquire(purpose, wait)
    except LockBusy as exc:
        raise Busy(
            str(exc), hint=f"wait for it, or if it is gone: slurmkit unlock {sweep.root}"
        ) from None
    return lock


def open_sweep(root: str) -> SweepDir:
    """A sweep directory that exists, or a UserError."""
    sweep = SweepDir(os.path.abspath(root))
    if not sweep.exists():
        raise UserError(
            f"{root or repr(root)} is not a sweep directory (no trials.jsonl / sweep.json)"
        )
    return sweep


def record_submission(sweep: SweepDir, record: dict[str, Any]) -> int:
    """Store one submission under the next free number (safe against concurrent writers)."""
    os.makedirs(sweep.submissions, exist_ok=True)
    number = len(os.listdir(sweep.submissions))
    while True:
        path = _submission_path(sweep, number)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            number += 1
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"number": number, "time": time.time(), **record}, fh, indent=2)
        return number


def update_submission(sweep: SweepDir, number: int, **changes: Any) -> None:
    """Change fields of submission ``number`` (e.g. its state and job ids once submitted)."""
    path = _submission_path(sweep, number)
    atomic_write_json(path, {**read_json(path), **changes})


def drop_submission(sweep: SweepDir, number: int) -> None:
    """Forget submission ``number`` (the scheduler refused it)."""
    os.unlink(_submission_path(sweep, number))


def write_script(sweep: SweepDir, number: int, chunk: int, text: str) -> str:
    """Keep the batch script of submission ``number``'s ``chunk``; its path."""
    path = os.path.join(sweep.scripts, f"{number:04d}-{chunk}.sbatch")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def _submission_path(sweep: SweepDir, number: int) -> str:
    return os.path.join(sweep.submissions, f"{number:04d}.json")


def submissions(sweep: SweepDir, warnings: list[str] | None = None) -> list[dict[str, Any]]:
    """All submissions, oldest first; a damaged record is left out (and said in ``warnings``)."""
    names = sorted(n for n in _entries(sweep.submissions) if n.endswith(".json"))
    out: list[dict[str, Any]] = []
    trials = _trial_count(sweep) if names else 0
    for name in names:
        path = os.path.join(sweep.submissions, name)
        try:
            record = load_record(path)
            why = _malformed(record, trials) if record is not None else None
            if why:
                raise Damaged(path, why)
        except Damaged as exc:
            _warn(warnings, f"{exc}: its jobs are not shown or cancelled")
            continue
        if record is not None:
            out.append(record)
    return out


def read_statuses(
    sweep: SweepDir, ids: Iterable[str] | None = None, warnings: list[str] | None = None
) -> dict[str, dict[str, Any] | None]:
    """``{trial_id: status}`` for the trials that have started (one directory listing first);
    ``None`` for a damaged status file (said in ``warnings``)."""
    started = set(_entries(sweep.trials))
    wanted = started if ids is None else started.intersection(ids)
    out: dict[str, dict[str, Any] | None] = {}
    for tid in wanted:
        try:
            status = load_record(sweep.status(tid))
            attempts = status.get("attempts", []) if status is not None else []
            if not isinstance(attempts, list) or not all(isinstance(a, dict) for a in attempts):
                raise Damaged(sweep.status(tid), "its attempts are not a list of records")
            if status is not None and not isinstance(status.get("state", ""), str):
                raise Damaged(sweep.status(tid), "its state is not a name")
        except Damaged as exc:
            _warn(warnings, f"{exc}: the trial is DAMAGED (resume runs it again)")
            out[tid] = None
            continue
        if status is not None:
            out[tid] = status
    return out


_DAMAGED = object()  # what _decoded gives for a line that is not JSON


def _decoded(lines: list[bytes]) -> list[Any]:
    """Each line's JSON value (``_DAMAGED`` where it is none): one decode of the whole file
    when every line reads, else line by line."""
    try:
        values = json.loads(b"[" + b",".join(lines) + b"]")
        if len(values) == len(lines):  # a line of two values ("1, 2") is damaged too
            return list(values)
    except (ValueError, UnicodeDecodeError):  # JSONDecodeError is a ValueError
        pass
    out: list[Any] = []
    for line in lines:
        try:
            out.append(json.loads(line.decode("utf-8")))
        except (ValueError, UnicodeDecodeError):
            out.append(_DAMAGED)
    return out


def manifest(sweep: SweepDir, warnings: list[str] | None = None) -> list[dict[str, Any] | None]:
    """The trials of ``trials.jsonl`` in index order; ``None`` for a damaged line (said in
    ``warnings``). A trial id that is not a plain name, or one that comes twice, is refused:
    ids name directories, and nothing may reach outside the sweep directory."""
    rows: list[dict[str, Any] | None] = []
    with open(sweep.manifest, "rb") as fh:
        lines = fh.read().split(b"\n")
    if lines and not lines[-1]:
        del lines[-1]  # the file ends with a newline
    match = _ID.match
    for number, (line, row) in enumerate(zip(lines, _decoded(lines)), 1):
        if row is _DAMAGED and not line.strip():
            continue
        if not (
            type(row) is dict and type(row.get("params")) is dict and row.get("index") == len(rows)
        ):
            _warn(warnings, f"{sweep.manifest}:{number}: damaged (not an index, id, params row)")
            rows.append(None)
            continue
        tid = row.get("id")
        if type(tid) is not str or not (tid.isalnum() or match(tid)):
            raise UserError(
                f"{sweep.manifest}:{number}: {tid!r} is not a trial id",
                hint="trials.jsonl is written by slurmkit: restore it",
            )
        rows.append(row)
    ids = [row["id"] for row in rows if row is not None]
    if len(set(ids)) != len(ids):
        seen: set[str] = set()
        for tid in ids:
            if tid in seen:
                raise UserError(
                    f"{sweep.manifest}: trial id {tid!r} comes twice",
                    hint="trials.jsonl is written by slurmkit: restore it",
                )
            seen.add(tid)
    return rows


def config(sweep: SweepDir, warnings: list[str] | None = None) -> dict[str, Any]:
    """``sweep.json``; with ``warnings``, a damaged one reads as ``{}`` (and is said there),
    without, it is a UserError (a resume cannot go on without it)."""
    try:
        data = load_record(sweep.sweep_json, default={})
        if warnings is None:  # a resume: it needs where the sweep was made, and how it launches
            _check_launch(sweep.sweep_json, data)
        return data
    except Damaged as exc:
        if warnings is None:
            raise UserError(
                f"{exc}",
                hint="sweep.json is written by slurmkit: restore it, "
                "or start a new sweep from spec.yaml",
            ) from None
        _warn(warnings, str(exc))
        return {}


def metrics(sweep: SweepDir, trial_id: str, warnings: list[str] | None = None) -> dict[str, Any]:
    """A trial's latest metrics (``{}`` when none, or damaged: said in ``warnings``)."""
    try:
        return load_record(sweep.metrics(trial_id), default={})
    except Damaged as exc:
        _warn(warnings, f"{exc}: its metrics are not shown")
        return {}


def load_record(path: str, default: Any = None) -> Any:
    """:func:`~.core.fsutil.read_record`; a directory where the file should be, or a file where
    a directory on its way should be, is a damaged file too."""
    try:
        return read_record(path, default)
    except (IsADirectoryError, NotADirectoryError) as exc:
        raise Damaged(path, f"cannot be read ({exc.strerror})") from None


def _entries(directory: str) -> list[str]:
    """The names in one of the sweep directory's folders (none when it is missing); a
    UserError when a file stands in its place."""
    try:
        return os.listdir(directory)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise UserError(
            f"{directory} is not a directory",
            hint="slurmkit keeps a directory there: move the file away, then run it again",
        ) from None


def _trial_count(sweep: SweepDir) -> int:
    """How many lines ``trials.jsonl`` has (the trials a submission may name), read as bytes."""
    try:
        with open(sweep.manifest, "rb") as fh:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: fh.read(1 << 20), b""))
    except OSError:
        return 0


def _beyond(spec: str, offset: int, trials: int) -> bool:
    """Whether array ``spec`` (task ``t`` runs trial ``offset + t``) names a trial past the last."""
    count, largest = array_bounds(spec)
    return count > trials or offset + largest >= trials


def _malformed(record: dict[str, Any], trials: int) -> str | None:
    """Why a submission record cannot be what a backend wrote (None: it can): the fields the
    backends read (``backend``, local ``indices``, Slurm ``jobs``) have other types, or name
    trials past the ``trials`` the manifest lists."""
    if not isinstance(record.get("backend", ""), str):
        return "its backend is not a name"
    indices = record.get("indices")
    if indices and not (isinstance(indices, str) and _ARRAY.match(indices)):
        return f"its indices {indices!r} are not an array spec"
    if indices and _beyond(indices, 0, trials):
        return f"its indices {indices!r} name trials past the {trials} of the sweep"
    jobs = record.get("jobs", [])
    if not isinstance(jobs, list) or not all(
        isinstance(job, dict)
        and isinstance(job.get("job_id"), str)
        and type(job.get("offset")) is int
        and isinstance(job.get("array"), str)
        and _ARRAY.match(job["array"])
        for job in jobs
    ):
        return "its jobs are not a list of {job_id, offset, array} records"
    if any(_beyond(job["array"], job["offset"], trials) for job in jobs):
        return f"its jobs name array tasks past the {trials} trials of the sweep"
    return None


def _check_launch(path: str, config: dict[str, Any]) -> None:
    """Damaged when ``sweep.json`` lacks what a resume reads besides the spec: ``submit_dir``
    and ``launch`` (argv lists)."""
    launch = config.get("launch") or {}
    if not isinstance(config.get("submit_dir"), str):
        raise Damaged(path, "its submit_dir is not a path")
    if not isinstance(launch, dict) or not all(
        isinstance(v, list) and all(isinstance(a, str) for a in v) for v in launch.values()
    ):
        raise Damaged(path, "its launch is not a mapping of argument lists")


def _warn(warnings: list[str] | None, text: str) -> None:
    if warnings is not None:
        warnings.append(text)
