"""``env_runtime`` values: text with placeholders that the in-job runtime fills in (stdlib only).

``TMPDIR: /scratch/{job_id}`` becomes ``/scratch/4242`` in the job; ``{{`` and ``}}`` are literal
braces. Only the names in :data:`PLACEHOLDERS` exist, without format specs or conversions:
:func:`problem` says what is wrong with a value at submit, so :func:`fill` cannot fail in the job.
"""

from __future__ import annotations

import string
from collections.abc import Mapping

PLACEHOLDERS = {
    "job_id": "the Slurm job id of the task (SLURM_JOB_ID; 'local-PID-INDEX' on the local backend)",
    "array_task_id": "the array task id (SLURM_ARRAY_TASK_ID; the trial index on local)",
    "node": "the node the batch shell runs on (the first node of a multi-node job)",
    "trial_dir": "the trial's directory in the sweep directory",
}


def problem(value: str) -> str | None:
    """Why ``value`` cannot be filled in, or None when it can."""
    try:
        parts = list(string.Formatter().parse(value))
    except ValueError as exc:
        return f"{exc} (write {{{{ and }}}} for literal braces)"
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in PLACEHOLDERS:
            return f"{{{name}}} is not a placeholder"
        if spec or conversion:
            return f"{{{name}}} takes no format spec or conversion"
    return None


def fill(values: Mapping[str, str], known: Mapping[str, str]) -> dict[str, str]:
    """Each value with its placeholders replaced by ``known`` (one entry per placeholder)."""
    return {name: text.format_map(known) for name, text in values.items()}
