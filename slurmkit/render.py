"""The one renderer of batch scripts. Trial parameters never enter the script text: each array
task reads its row from the sweep directory through ``python -m slurmkit.runtime``."""

from __future__ import annotations

import shlex

from . import __version__
from .plan import Chunk
from .core.contract import REQUEUE_EXIT
from .spec import SweepSpec

PLAIN_PYTHON = "python3"


def render_array(spec: SweepSpec, chunk: Chunk, *, sweep_dir: str | None, python: str,
                 spec_path: str | None = None, step: list[str] | None = None) -> str:
    """The ``sbatch`` script for one array chunk of a sweep.

    ``sweep_dir`` is the prepared sweep directory (absolute). With ``sweep_dir=None`` the script
    is self-contained for plain ``sbatch``: the first task builds ``OUTPUT_ROOT/NAME/ARRAYJOBID``
    from ``spec_path`` (relative to the submit directory).
    """
    q = shlex.quote
    if sweep_dir is None:
        if spec_path is None:
            raise ValueError("a plain-sbatch script needs spec_path")
        output = f"{spec.name}-%A_%a.out"
        sweep_line = (f"export SLURMKIT_SWEEP_DIR=${{SLURMKIT_SWEEP_DIR:-{q(spec.output_root)}/"
                      f"{q(spec.name)}/sbatch-$SLURM_ARRAY_JOB_ID}}")
        runtime_args = f"--offset {chunk.offset} --spec {q(spec_path)}"
    else:
        output = f"{sweep_dir}/logs/%A_%a.out"
        sweep_line = f"export SLURMKIT_SWEEP_DIR={q(sweep_dir)}"
        runtime_args = f"--offset {chunk.offset}"
    sbatch = [
        f"--job-name={spec.name}",
        f"--array={chunk.array_spec(spec.max_parallel)}",
        f"--output={output}",
        "--open-mode=append",
        *spec.requeue.sbatch_options(),
        *spec.resources.sbatch_options(),
    ]
    lines = [
        "#!/bin/bash",
        f"# Rendered by slurmkit {__version__}: sweep {spec.name!r}, "
        f"{len(chunk.indices)} trials from index {chunk.indices[0]}.",
        "# Parameters live in the sweep directory (trials.jsonl), never in this script.",
        *_describe(step),
        *(f"#SBATCH {opt}" for opt in sbatch),
        "set -u",
        sweep_line,
        f"PY=${{SLURMKIT_PYTHON:-{q(python)}}}",
        *_supervise(f'"$PY" -m slurmkit.runtime task {runtime_args}',
                    spec.requeue.signal if spec.requeue.enabled else None,
                    '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'),
        "",
    ]
    return "\n".join(lines)


def _describe(step: list[str] | None) -> list[str]:
    """Comment lines showing how the runtime launches each trial (argv; validated values)."""
    if not step:
        return []
    return ["# The runtime launches each trial as (no shell; {...} filled in on the first node):",
            f"#   {shlex.join(step)} COMMAND [PARAMETERS]"]


def _supervise(command: str, signal: str | None, job_ref: str) -> list[str]:
    """The batch shell's part of the requeue contract.

    The work runs in the background; the shell forwards ``signal`` (sent by Slurm ``--signal=B:``
    before the time limit or on preemption) and TERM to it, waits for it to checkpoint and exit,
    and on exit code REQUEUE_EXIT requeues this job (array task) from the host, where
    ``scontrol`` exists even when the work runs in a container.
    """
    if signal is None:
        return [f"exec {command}"]
    return [
        "slurmkit_pid=",
        'slurmkit_forward() { [ -n "$slurmkit_pid" ] && kill -s "$1" "$slurmkit_pid" 2>/dev/null; }',
        f"trap 'slurmkit_forward {signal}' {signal}",
        "trap 'slurmkit_forward TERM' TERM",
        f"{command} &",
        "slurmkit_pid=$!",
        'while :; do wait "$slurmkit_pid"; rc=$?; kill -0 "$slurmkit_pid" 2>/dev/null || break; done',
        f'if [ "$rc" -eq {REQUEUE_EXIT} ]; then',
        f"  scontrol requeue {job_ref} || echo \"slurmkit: scontrol requeue failed\" >&2",
        "fi",
        'exit "$rc"',
    ]
