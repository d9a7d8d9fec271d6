"""``python -m slurmkit.runtime.submitit_trial FOLDER``: an array task of the submitit backend.

The submitit backend (:mod:`slurmkit.backends.submitit`) submits a sweep's trials with
submitit's ``map_array(trial, [sweep_dir] * n, indices)``: array task ``t`` holds the pickled
call ``trial(sweep_dir, indices[t])`` in ``FOLDER``. The batch shell runs this module on the
host; it runs submitit's own job code (``process_job``: load the pickle, call it, keep its
result). submitit installs its signal handlers (which would run ``scontrol requeue`` from here)
just before it calls :func:`trial`; the call puts the runtime's in their place (the start-up
hold of :mod:`slurmkit.runtime.early`, then the trial runtime's own handlers, as for ``python
-m slurmkit.runtime task``), through ``signal.signal`` alone: nothing of submitit is changed.

Exit codes are that runtime's: 0 done (submitit keeps the result), REQUEUE_EXIT asks the batch
shell to requeue this array task on the host, anything else is the trial's failure.
"""

from __future__ import annotations

import signal
import sys

from . import early

if __name__ == "__main__":
    early.hold()  # before the imports below and submitit's: a signal now is kept, not fatal

from .__main__ import run_trial


def trial(sweep_dir: str, index: int) -> int:
    """Run trial ``index`` of ``sweep_dir`` as this array task: what submitit calls. A
    non-zero exit code leaves as SystemExit (not an Exception: submitit writes no result for
    it, and the process exits with that code for the batch shell). submitit's signal handlers,
    installed just before this call, give way to the runtime's: the requeue signals and TERM
    are kept until the trial runtime takes them, SIGCONT acts as it does without submitit."""
    early.hold()
    signal.signal(signal.SIGCONT, signal.SIG_DFL)
    code = run_trial(sweep_dir, index)
    if code:
        raise SystemExit(code)
    return code


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m slurmkit.runtime.submitit_trial FOLDER", file=sys.stderr)
        return 2
    try:  # the batch host's Python needs submitit to read the pickles
        from submitit.core import submission
    except ImportError as exc:
        print(
            f"slurmkit.runtime.submitit_trial: {exc}: the batch host's Python ({sys.executable}) "
            "needs submitit (pip install 'slurmkit[submitit]'), or set SLURMKIT_PYTHON",
            file=sys.stderr,
        )
        return 2
    submission.process_job(args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
