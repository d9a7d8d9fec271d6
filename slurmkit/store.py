"""Creating and reading sweep directories (login-node side). Layout: :mod:`slurmkit.layout`."""

from __future__ import annotations

import json
import os
import time
from typing import TYPE_CHECKING, Any, Iterable

from . import __version__
from .errors import UserError
from .core.fsutil import atomic_write_json, make_temp_dir, read_json
from .core.layout import SweepDir

if TYPE_CHECKING:
    from .plan import Trials
    from .spec import SweepSpec


def default_root(spec: SweepSpec) -> str:
    """``OUTPUT_ROOT/NAME-YYYYmmdd-HHMMSS`` (absolute), with a suffix when taken."""
    base = os.path.abspath(os.path.join(spec.output_root, f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"))
    root, n = base, 1
    while os.path.exists(root):
        n += 1
        root = f"{base}-{n}"
    return root


def sweep_config(spec: SweepSpec, submit_dir: str,
                 launch: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """What ``sweep.json`` holds: the resolved spec, how trials are launched, and where and by
    what it was made."""
    if launch is None:
        from .launch import plan

        launch = plan(spec, submit_dir)
    return {**spec.to_dict(), "source": spec.source, "submit_dir": submit_dir,
            "launch": launch, "created": time.time(), "slurmkit_version": __version__}


def create(spec: SweepSpec, trials: Trials, root: str,
           submission: dict[str, Any] | None = None,
           launch: dict[str, list[str]] | None = None) -> SweepDir:
    """Write the sweep directory in a temporary sibling and rename it into place.

    Either the whole directory appears, or nothing does. Raises UserError if ``root`` exists.
    ``submission``, when given, is recorded as submission 0 (a script submitted by hand).
    """
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
        atomic_write_json(staging.sweep_json, sweep_config(spec, os.getcwd(), launch),
                          fsync=False)
        with open(staging.spec_yaml, "w", encoding="utf-8") as fh:
            fh.write(to_yaml(spec))
        with open(staging.manifest, "w", encoding="utf-8") as fh:
            fh.writelines(row + "\n" for row in trials.rows)
        if submission is not None:
            record_submission(staging, submission)
        os.rename(tmp, root)
    except BaseException:
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return SweepDir(root)


def to_yaml(spec: SweepSpec) -> str:
    """The resolved spec as YAML (what ``slurmkit sweep`` would need to rebuild the sweep)."""
    import yaml

    return yaml.dump(spec.to_dict(), Dumper=getattr(yaml, "CSafeDumper", yaml.SafeDumper),
                     sort_keys=False, allow_unicode=True)


def init_from_spec(spec_path: str, root: str, array_job_id: str, offset: int) -> SweepDir:
    """Build ``root`` for a script submitted with plain ``sbatch`` (array ``array_job_id``),
    tolerating concurrent array tasks doing the same."""
    from . import plan, spec as spec_mod
    from .core import arrays

    sweep_spec = spec_mod.load(spec_path)
    trials = plan.expand(sweep_spec)
    job = {"job_id": array_job_id, "offset": offset, "array": arrays.compress(range(len(trials))),
           "script": None}
    try:
        return create(sweep_spec, trials, root,
                      submission={"backend": "slurm", "state": "submitted", "jobs": [job]})
    except (UserError, OSError):
        sweep = SweepDir(root)
        if sweep.exists():  # another task of the array won the race
            return sweep
        raise


def open_sweep(root: str) -> SweepDir:
    """A sweep directory that exists, or a UserError."""
    sweep = SweepDir(os.path.abspath(root))
    if not sweep.exists():
        raise UserError(f"{root} is not a sweep directory (no trials.jsonl / sweep.json)")
    return sweep


def record_submission(sweep: SweepDir, record: dict[str, Any]) -> int:
    """Store one submission under the next free number (safe against concurrent writers)."""
    os.makedirs(sweep.submissions, exist_ok=True)
    number = len(os.listdir(sweep.submissions))
    while True:
        path = os.path.join(sweep.submissions, f"{number:04d}.json")
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            number += 1
            continue
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"number": number, "time": time.time(), **record}, fh, indent=2)
        return number


def submissions(sweep: SweepDir) -> list[dict[str, Any]]:
    """All submissions, oldest first."""
    try:
        names = sorted(n for n in os.listdir(sweep.submissions) if n.endswith(".json"))
    except FileNotFoundError:
        return []
    return [read_json(os.path.join(sweep.submissions, n)) for n in names]


def read_statuses(sweep: SweepDir, ids: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """``{trial_id: status}`` for the trials that have started (one directory listing first)."""
    try:
        started = set(os.listdir(sweep.trials))
    except FileNotFoundError:
        return {}
    wanted = started if ids is None else started.intersection(ids)
    out = {}
    for tid in wanted:
        status = read_json(sweep.status(tid))
        if status is not None:
            out[tid] = status
    return out
