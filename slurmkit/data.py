"""The spec's ``data`` block on the login side: datasets staged once to the shared filesystem
before any trial runs (``slurmkit stage``'s copier, :mod:`slurmkit.stage`).

How each backend gets them there:

- **Slurm** (``slurmkit sweep``/``submit``): a *stage job*, submitted before the arrays, which
  wait for it (``--dependency=afterok``) and are cancelled if it fails. It is one task without
  GPUs, so no GPU is held while a dataset is copied, and it copies each dataset once however
  many array tasks or nodes will read it. Before it is submitted, each source that is not
  published yet is looked up from here (a HEAD and a LIST, where credentials allow), so a
  missing source is an error before anything is submitted. A dataset already published at its
  ``dst`` needs no stage job (nor any request to the object store).
- **local** and backends that submit no stage job: staged here, before the sweep directory is
  made.
- **standalone scripts** (plain ``sbatch``): each task stages what is not published yet before
  it runs its trial; the stage lock makes one of them copy while the others wait.

The trials themselves only read the shared filesystem (:mod:`slurmkit.runtime.datacache`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import stage
from .core.fsutil import read_json
from .core.layout import SweepDir
from .errors import UserError
from .spec.model import DataEntry

if TYPE_CHECKING:
    from .backends.base import Backend
    from .spec import SweepSpec


def unstaged(entries: Iterable[DataEntry]) -> list[DataEntry]:
    """The datasets not published at their ``dst`` yet."""
    return [entry for entry in entries if stage.ready(entry.dst) is None]


def stage_job(spec: SweepSpec, sweep_dir: str) -> str | None:
    """The stage job's script for ``sweep_dir``, or None when every dataset is published."""
    from .render import stage_script

    return stage_script(spec, sweep_dir) if unstaged(spec.data) else None


def write_stage_script(sweep: SweepDir, number: int, text: str) -> str:
    """Keep the stage job's script of submission ``number``; its path."""
    path = os.path.join(sweep.scripts, f"{number:04d}-stage.sbatch")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
    return path


def prepare(spec: SweepSpec, target: Backend) -> None:
    """Before ``target`` submits ``spec``: look up each source not staged yet, then stage every
    dataset here unless ``target`` submits a stage job."""
    check_sources(spec)
    if target.stages_data:
        return
    with stage.bar(sys.stderr.isatty()) as reporter:
        for line in stage_all(spec.data, reporter):
            reporter.note(line)


def check_sources(spec: SweepSpec) -> None:
    """UserError (exit 1) naming the first source that is not there, of the datasets not
    published yet. A source that cannot be looked up from here (no credentials on this node, no
    route to the store) is left to the stage job."""
    for index, entry in enumerate(spec.data):
        if stage.ready(entry.dst) is not None:
            continue
        if _missing(entry.src):
            error = UserError(
                f"{stage.public(entry.src)}: no such object or prefix (nothing to stage)",
                file=spec.source,
                key=f"data.{index}.src",
                hint="check the URL (and AWS_ENDPOINT_URL or AWS_PROFILE for non-AWS storage)",
            )
            error.exit_code = 1
            raise error


def _missing(src: str) -> bool:
    """Whether ``src`` surely does not exist (False when it cannot be asked)."""
    protocol = stage.source_protocol(src)
    if protocol == "file":
        return not os.path.exists(src.removeprefix("file://"))
    try:
        fs, root = stage.filesystem(src, protocol, None, 1)
        fs.info(root)
    except FileNotFoundError:
        return True
    except Exception:  # credentials, access, network: the stage job asks again
        return False
    return False


def stage_all(entries: Iterable[DataEntry], reporter: stage.Reporter | None = None) -> list[str]:
    """Stage each dataset not published yet (the stage lock: one copier among many); a line
    on each for people (public URLs only). UserError naming the object on a failure."""
    lines = []
    for entry in entries:
        if stage.ready(entry.dst) is not None:
            lines.append(f"{entry.name}: published at {entry.dst}")
            continue
        result = stage.stage(entry.src, entry.dst, reporter=reporter)
        lines.append(f"{entry.name}: {result.text()}")
    return lines


def stage_sweep(root: str) -> int:
    """Stage the datasets of the sweep directory ``root`` that are not published yet, saying
    what was done on stdout and what failed on stderr; the exit code (0, or UserError's)."""
    try:
        config: dict[str, Any] = read_json(SweepDir(root).sweep_json) or {}
        for line in stage_all(DataEntry(**row) for row in config.get("data") or []):
            print(f"slurmkit.data: {line}", flush=True)
    except UserError as exc:
        print(f"slurmkit.data: {exc}", file=sys.stderr)
        return exc.exit_code
    except (OSError, ValueError) as exc:  # sweep.json unreadable or damaged
        print(f"slurmkit.data: {exc}", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    """``python -m slurmkit.data``: the stage job (its sweep directory in SLURMKIT_SWEEP_DIR)."""
    root = os.environ.get("SLURMKIT_SWEEP_DIR")
    if not root:
        print("slurmkit.data: SLURMKIT_SWEEP_DIR must be set", file=sys.stderr)
        return 2
    return stage_sweep(root)


if __name__ == "__main__":
    sys.exit(main())
