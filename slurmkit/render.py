"""The one renderer of batch scripts. Trial parameters never enter the script text: each array
task reads its row from the sweep directory through ``python -m slurmkit.runtime``."""

from __future__ import annotations

import shlex
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

from . import __version__
from .core.arrays import DEFAULT_MAX_ARRAY_SIZE
from .core.contract import ENV_DATA, LEFT_TO_CLUSTER, REQUEUE_EXIT
from .core.layout import COMMENT_PREFIX, slurm_log_name
from .core.rendezvous import fill
from .errors import UserError
from .launch import SELF_CHECK_NAME, data_step
from .plan import Chunk, Plan, chunks

if TYPE_CHECKING:
    from .spec import Requeue, Resources, SweepSpec

# The interpreter of a standalone script (submitted with plain sbatch): SLURMKIT_PYTHON wins.
STANDALONE_PYTHON = "python3"
# Placeholders shown for the rendezvous values that the runtime fills in on the first node.
_SHOWN = {
    "MASTER_ADDR": "{master_addr}",
    "MASTER_PORT": "{master_port}",
    "SLURM_JOB_ID": "{job_id}",
}
# How a batch script names its job to ``scontrol requeue``: an array task, or a job.
ARRAY_TASK = '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"'
JOB = '"$SLURM_JOB_ID"'
# spec.resources field -> sbatch option, in the order they are rendered
_RESOURCE_OPTIONS = (
    ("partition", "partition"),
    ("time", "time"),
    ("nodes", "nodes"),
    ("cpus", "cpus-per-task"),
    ("gpus", "gpus-per-node"),
    ("mem", "mem"),
    ("account", "account"),
    ("qos", "qos"),
    ("constraint", "constraint"),
    ("switches", "switches"),
)


def scripts(
    plan: Plan,
    indices: Sequence[int],
    max_array_size: int,
    sweep_dir: str,
    python: str = sys.executable,
) -> list[tuple[Chunk, str]]:
    """One script per array chunk of the given trial indices, for the prepared ``sweep_dir``."""
    step = fill(plan.launch, {**_SHOWN, "SLURM_NNODES": str(plan.spec.resources.nodes)})
    return [
        (c, render_array(plan.spec, c, sweep_dir=sweep_dir, python=python, step=step))
        for c in chunks(indices, max_array_size)
    ]


def standalone(plan: Plan, spec_path: str) -> str:
    """A self-contained script for plain ``sbatch`` (the files under ``sbatch/``): its first
    task builds the sweep directory from ``spec_path``."""
    parts = chunks(range(plan.total), DEFAULT_MAX_ARRAY_SIZE)
    if len(parts) > 1:
        raise UserError(
            f"{plan.total} trials do not fit one array of a default cluster",
            file=spec_path,
            hint="submit it with `slurmkit sweep`, which splits arrays",
        )
    return render_array(
        plan.spec, parts[0], sweep_dir=None, python=STANDALONE_PYTHON, spec_path=spec_path
    )


def render_array(
    spec: SweepSpec,
    chunk: Chunk,
    *,
    sweep_dir: str | None,
    python: str,
    spec_path: str | None = None,
    step: list[str] | None = None,
) -> str:
    """The ``sbatch`` script for one array chunk of a sweep.

    ``sweep_dir`` is the prepared sweep directory (absolute). With ``sweep_dir=None`` the script
    is standalone, for plain ``sbatch``: the first task builds ``OUTPUT_ROOT/NAME/ARRAYJOBID``
    from ``spec_path`` (relative to the submit directory) with ``python -m slurmkit.standalone``.
    """
    q = shlex.quote
    if sweep_dir is None:
        if spec_path is None:
            raise ValueError("a standalone script needs spec_path")
        logs = slurm_log_name(spec.logs.name, spec.name, standalone=True)
        sweep_line = (
            f"export SLURMKIT_SWEEP_DIR=${{SLURMKIT_SWEEP_DIR:-{q(spec.output_root)}/"
            f"{q(spec.name)}/sbatch-$SLURM_ARRAY_JOB_ID}}"
        )
        task = f'"$PY" -m slurmkit.standalone --offset {chunk.offset} --spec {q(spec_path)}'
    else:
        logs = f"{sweep_dir}/logs/{slurm_log_name(spec.logs.name, spec.name, standalone=False)}"
        sweep_line = f"export SLURMKIT_SWEEP_DIR={q(sweep_dir)}"
        task = f'"$PY" -m slurmkit.runtime task --offset {chunk.offset}'
    contract = supervised(spec.requeue, task, ARRAY_TASK)
    sbatch = [
        f"--job-name={spec.name}",
        f"--array={chunk.array_spec(spec.max_parallel)}",
        f"--output={logs}.out",
        *([f"--error={logs}.err"] if spec.logs.stderr == "separate" else []),
        "--open-mode=append",
        *contract.sbatch,
        *resource_options(spec.resources),
        *comment_options(spec, sweep_dir),
        # the stage job failed (its afterok dependency never holds): cancelled, not left pending
        *(["--kill-on-invalid-dep=yes"] if spec.data and sweep_dir is not None else []),
    ]
    lines = [
        "#!/bin/bash",
        f"# Rendered by slurmkit {__version__}: sweep {spec.name!r}, "
        f"{len(chunk.indices)} trials from index {chunk.indices[0]}.",
        "# Parameters live in the sweep directory (trials.jsonl), never in this script.",
        *_describe(step),
        *_data_lines(spec, standalone=sweep_dir is None),
        *(f"#SBATCH {opt}" for opt in sbatch),
        "set -u",
        sweep_line,
        f"PY=${{SLURMKIT_PYTHON:-{q(python)}}}",
        # the runtime runs here, on the batch host, never in a container: it needs this Python
        'command -v "$PY" >/dev/null || { echo "slurmkit: no Python $PY on $(hostname):'
        ' set SLURMKIT_PYTHON to one with slurmkit installed" >&2; exit 2; }',
        *contract.body,
        "",
    ]
    return "\n".join(lines)


def stage_script(spec: SweepSpec, sweep_dir: str, python: str = sys.executable) -> str:
    """The batch script of a sweep's stage job: one task without GPUs (the trials' partition,
    account, qos and time limit) runs ``python -m slurmkit.data``, which stages the datasets
    that ``sweep.json`` names (never this script) from the job's own credentials (AWS's
    chain). The sweep's arrays wait for it (``afterok``) and are cancelled if it fails."""
    q = shlex.quote
    r = spec.resources
    asked = (("partition", r.partition), ("time", r.time), ("account", r.account), ("qos", r.qos))
    options = [
        f"--job-name={spec.name}-stage",
        f"--output={sweep_dir}/logs/stage-%j.out",
        "--open-mode=append",
        "--requeue",  # preempted: it runs again and goes on from what it copied
        "--ntasks=1",
        *(f"--{flag}={value}" for flag, value in asked if value is not None),
    ]
    return "\n".join(
        [
            "#!/bin/bash",
            f"# Rendered by slurmkit {__version__}: the stage job of sweep {spec.name!r} "
            f"(datasets: {', '.join(entry.name for entry in spec.data)}).",
            "# It stages them once, before the sweep's arrays start: they wait for it (afterok)",
            "# and are cancelled if it fails. Sources and destinations are read from sweep.json,",
            "# never written here; credentials come from the job's environment (AWS's chain).",
            *(f"#SBATCH {opt}" for opt in options),
            "set -u",
            f"export SLURMKIT_SWEEP_DIR={q(sweep_dir)}",
            f"PY=${{SLURMKIT_PYTHON:-{q(python)}}}",
            'exec "$PY" -m slurmkit.data',
            "",
        ]
    )


def _data_lines(spec: SweepSpec, standalone: bool) -> list[str]:
    """Comment lines on the spec's datasets (names only: sources and paths stay in sweep.json)."""
    if not spec.data:
        return []
    if standalone:
        lines = [
            "# Data: each task first stages what is not published yet (one copies, the others",
            "# wait); each trial finds its path in:",
        ]
    else:
        lines = [
            "# Data, published before this array starts (by the stage job it depends on, when",
            "# one is needed); each trial finds its path in:",
        ]
    for entry in spec.data:
        var = f"${ENV_DATA}_{entry.name.upper()}"
        var += f" (${ENV_DATA})" if len(spec.data) == 1 else ""
        cached = "each node copies it to local disk first, one task per node"
        lines.append(f"#   {var}" + (f": {cached}" if entry.cache == "node" else ""))
    copy = data_step(spec)
    if copy:
        lines.append(f"# The node copies: {shlex.join(copy)} PYTHON -m slurmkit.runtime.datacache")
    return lines


def comment_options(spec: SweepSpec, sweep_dir: str | None) -> list[str]:
    """``--comment=slurmkit:SWEEP_DIR``: accounting keeps it (``AccountingStoreFlags=
    job_comment``), and ``slurmkit report --since`` finds each job's sweep directory by it.
    Not in a standalone script (its directory is named when it runs), nor over the spec's own
    comment (``resources.extra``; refused with ``labels``)."""
    if sweep_dir is None or "comment" in spec.resources.extra:
        return []
    return [f"--comment={COMMENT_PREFIX}{sweep_dir}"]


def resource_options(r: Resources) -> list[str]:
    """``--key=value`` options of what every task asks for, in a stable order (values are
    validated: no whitespace)."""
    opts = [
        f"--{flag}={getattr(r, key)}"
        for key, flag in _RESOURCE_OPTIONS
        if getattr(r, key) is not None
    ]
    if r.tasks_per_node > 1:
        opts.append(f"--ntasks-per-node={r.tasks_per_node}")
    if r.exclusive:
        opts.append("--exclusive")
    for key, value in r.extra.items():
        if value is True:
            opts.append(f"--{key}")
        elif value is not False:
            opts.append(f"--{key}={value}")
    return opts


def requeue_options(policy: Requeue) -> list[str]:
    """Requeue on, and the signal that asks the batch shell to checkpoint ``lead`` s before the
    time limit; or requeue off; or, left to the cluster, neither (the ``#SBATCH`` part of
    :func:`supervised`)."""
    if policy.enabled == LEFT_TO_CLUSTER:
        return []
    if not policy.enabled:
        return ["--no-requeue"]
    return ["--requeue", f"--signal=B:{policy.signal}@{policy.lead}"]


def _describe(step: list[str] | None) -> list[str]:
    """Comment lines showing how the runtime launches each trial (argv; validated values)."""
    if not step:
        return []
    shown = [  # the self-check's script text, shown by name (it spans many lines)
        "<selfcheck.sh>" if i + 1 < len(step) and step[i + 1] == SELF_CHECK_NAME else arg
        for i, arg in enumerate(step)
    ]
    return [
        "# The runtime launches each trial as (no shell; {...} filled in on the first node):",
        f"#   {shlex.join(shown)} COMMAND [PARAMETERS]",
    ]


class Supervised(NamedTuple):
    """The requeue contract of one batch script (:func:`supervised`)."""

    sbatch: list[str]  # its #SBATCH options (without "#SBATCH "): requeue and signal, or none
    body: list[str]  # the batch shell's lines that run the work


def supervised(
    policy: Requeue,
    command: str,
    job_ref: str,
    teardown: Sequence[str] = (),
    quoted: bool = False,
) -> Supervised:
    """The batch shell's part of the requeue contract, for every batch script slurmkit writes
    (the sbatch path's arrays and both submitit executors'): the ``#SBATCH`` options (requeue
    on, and Slurm sends ``policy.signal`` to the batch shell ``policy.lead`` s before the time
    limit; or requeue off) and the lines that run ``command``.

    The work runs in the background; the shell forwards the signal (sent by Slurm before the
    time limit or on preemption) and TERM to it, waits for it to checkpoint and exit, and on
    exit code REQUEUE_EXIT requeues ``job_ref`` (this job or array task) from the host, where
    ``scontrol`` exists even when the work runs in a container. ``teardown``: lines run after
    the work, before the shell exits with its code; ``quoted``: ``command`` holds script text
    in single quotes on purpose (shellcheck is told).
    """
    if policy.enabled is not True:  # off, or left to the cluster: nothing to forward
        lines = [command, "rc=$?"] if teardown else [f"exec {command}"]
    else:
        lines = [
            "slurmkit_pid=",
            "# shellcheck disable=SC2317  # called by the traps below",
            'slurmkit_forward() { [ -n "$slurmkit_pid" ] && kill -s "$1" "$slurmkit_pid" 2>/dev/null; }',  # noqa: E501
            f"trap 'slurmkit_forward {policy.signal}' {policy.signal}",
            "trap 'slurmkit_forward TERM' TERM",
            f"{command} &",
            "slurmkit_pid=$!",
            'while :; do wait "$slurmkit_pid"; rc=$?; kill -0 "$slurmkit_pid" 2>/dev/null || break; done',  # noqa: E501
            f'if [ "$rc" -eq {REQUEUE_EXIT} ]; then',
            f'  scontrol requeue {job_ref} || echo "slurmkit: scontrol requeue failed" >&2',
            "fi",
        ]
    if quoted:
        at = next(i for i, line in enumerate(lines) if command in line)
        lines.insert(at, "# shellcheck disable=SC2016  # script text for sh -c, quoted on purpose")
    if teardown:
        lines += ["", "# teardown", *teardown]
    if teardown or policy.enabled is True:
        lines.append('exit "$rc"')
    return Supervised(requeue_options(policy), lines)
