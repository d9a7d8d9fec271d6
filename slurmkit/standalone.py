"""``python -m slurmkit.standalone --offset N --spec SPEC``: what each array task of a standalone
script (one submitted with plain ``sbatch``, like those under ``sbatch/``) runs first.

The first task to get here builds the sweep directory ``$SLURMKIT_SWEEP_DIR`` from the spec
(the others find it built, or wait out the race); then each task becomes
``python -m slurmkit.runtime task`` (the same process, so the batch shell's signals reach it).
This is login-side code (spec loading, trial expansion) kept out of the in-job runtime.
"""

from __future__ import annotations

import argparse
import os
import sys

from .runtime import early

if __name__ == "__main__":
    early.hold()  # before the imports below: a signal now would kill the job unrecorded

from . import plan, store
from . import spec as spec_mod
from .backends.slurm import SlurmBackend
from .core.arrays import compress
from .core.jobcontract import JobContract
from .core.layout import SweepDir
from .errors import UserError


def init_from_spec(spec_path: str, root: str, array_job_id: str, offset: int) -> SweepDir:
    """Build ``root`` for array ``array_job_id`` from ``spec_path``, tolerating concurrent array
    tasks doing the same."""
    sweep_spec = spec_mod.load(spec_path)
    trials = plan.expand(sweep_spec)
    record = SlurmBackend.standalone_record(array_job_id, offset, compress(range(len(trials))))
    try:
        return store.create(plan.make(sweep_spec, trials, os.getcwd()), root, submission=record)
    except (UserError, OSError):
        sweep = SweepDir(root)
        if sweep.exists():  # another task of the array won the race
            return sweep
        raise


def _has_data(root: str) -> bool:
    try:
        return bool(JobContract.read(SweepDir(root).sweep_json).data)
    except (OSError, ValueError):
        return False  # the runtime says what is wrong with sweep.json


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.standalone")
    parser.add_argument("--offset", type=int, default=0, help="trial index of array task 0")
    parser.add_argument("--spec", required=True, help="build the sweep directory from this spec")
    args = parser.parse_args(argv)
    root = os.environ.get("SLURMKIT_SWEEP_DIR")
    if not root:
        print("slurmkit.standalone: SLURMKIT_SWEEP_DIR must be set", file=sys.stderr)
        return 2
    root = os.path.abspath(root)
    if not SweepDir(root).exists():
        try:
            init_from_spec(args.spec, root, os.environ.get("SLURM_ARRAY_JOB_ID", ""), args.offset)
        except UserError as exc:
            print(f"slurmkit.standalone: {exc}", file=sys.stderr)
            return exc.exit_code
    if _has_data(root):  # no stage job here: each task stages what is not published yet
        from . import data

        code = data.stage_sweep(root)
        if code:
            return code
    runtime = [sys.executable, "-m", "slurmkit.runtime", "task", "--offset", str(args.offset)]
    sys.stdout.flush()
    os.environ[early.ENV_HELD] = early.handover()  # the runtime keeps those that came so far
    os.execv(sys.executable, runtime)


if __name__ == "__main__":
    sys.exit(main())
