"""The checkpoint journal of a trial: one JSON line per committed checkpoint (stdlib only).

Inside a trial (``SLURMKIT_TRIAL_DIR`` set), every commit appends ``{"step", "time", "dir",
"attempt", "job_id"}`` to ``trials/ID/checkpoints.jsonl``. Pruning removes checkpoints, never
lines, so ``slurmkit report`` can tell afterwards how much of an interrupted attempt's work
its last checkpoint kept.
"""

from __future__ import annotations

import json
import os
import warnings

from ...core.layout import CHECKPOINT_JOURNAL


def record(step: int, when: float, directory: str) -> None:
    """Append a commit of checkpoint ``step`` (at ``when``, into ``directory``) to the journal
    of the trial this process runs in; nothing outside a trial. A failed append warns: the
    checkpoint itself is committed."""
    trial = os.environ.get("SLURMKIT_TRIAL_DIR")
    if not trial:
        return
    entry = {
        "step": step,
        "time": when,
        "dir": directory,
        "attempt": os.environ.get("SLURMKIT_ATTEMPT"),
        "job_id": os.environ.get("SLURM_JOB_ID"),
    }
    line = (json.dumps(entry) + "\n").encode()
    try:  # one write of one short line with O_APPEND: a reader sees whole lines
        fd = os.open(
            os.path.join(trial, CHECKPOINT_JOURNAL), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
    except OSError as exc:
        warnings.warn(
            f"slurmkit.checkpoint: step {step} not journaled in {trial}: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )
