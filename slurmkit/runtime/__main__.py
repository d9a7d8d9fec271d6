"""``python -m slurmkit.runtime task``: what each array task of a rendered script runs.

Exit codes: 0 = COMPLETED; REQUEUE_EXIT (75) = checkpointed, requeue me (the batch shell
runs ``scontrol requeue``); otherwise the trial command's own code, 128+N when it died of
signal N; 2 when the task cannot find its trial; 0 as well when another live job runs this
trial (it holds the trial's claim): this task leaves it be.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from . import early

if __name__ == "__main__":
    early.hold()  # before the imports below, which are most of the runtime's start-up

from ..core import states
from ..core.layout import SweepDir
from .trial import TrialRun


def _task(args: argparse.Namespace) -> int:
    root = os.environ.get("SLURMKIT_SWEEP_DIR")
    task_id = os.environ.get("SLURM_ARRAY_TASK_ID")
    if not root or task_id is None:
        print(
            "slurmkit.runtime: SLURMKIT_SWEEP_DIR and SLURM_ARRAY_TASK_ID must be set",
            file=sys.stderr,
        )
        return 2
    return run_trial(os.path.abspath(root), args.offset + int(task_id))


def run_trial(root: str, index: int) -> int:
    """Run trial ``index`` of the sweep directory ``root`` as this task; the exit code for the
    batch shell (see the module's docstring). The submitit backend's tasks call it too."""
    sweep = SweepDir(root)
    try:
        run = TrialRun(sweep, index, under_slurm="SLURM_JOB_ID" in os.environ)
    except (OSError, LookupError, ValueError) as exc:  # ValueError: a damaged file
        print(f"slurmkit.runtime: {exc}", file=sys.stderr)
        return 2
    holder = run.claim()
    if holder is not None:
        print(
            f"slurmkit.runtime: trial {run.id} is running in {holder}; this task leaves it be",
            file=sys.stderr,
        )
        return 0
    try:
        if run.already_completed():
            ended = run.status.get("state", states.COMPLETED)
            print(f"slurmkit.runtime: trial {run.id} already {ended}; not running it again")
            return 0
        stop_signals = {signal.SIGTERM, signal.SIGINT, getattr(signal, "SIG" + run.policy.signal)}
        early.release(run.terminate, stop_signals)
        run.start()
        return run.wait()
    finally:
        run.release()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m slurmkit.runtime")
    sub = parser.add_subparsers(dest="cmd", required=True)
    task = sub.add_parser("task", help="run the trial of this array task")
    task.add_argument("--offset", type=int, default=0, help="trial index of array task 0")
    task.add_argument("--spec", help=argparse.SUPPRESS)  # scripts rendered by slurmkit < 0.2
    args = parser.parse_args(argv)
    if args.spec:  # an older standalone script: the login-side bootstrap, in this process
        os.execv(
            sys.executable,
            [
                sys.executable,
                "-m",
                "slurmkit.standalone",
                "--offset",
                str(args.offset),
                "--spec",
                args.spec,
            ],
        )
    return _task(args)


if __name__ == "__main__":
    sys.exit(main())
