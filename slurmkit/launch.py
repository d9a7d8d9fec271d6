"""How a trial's command is launched inside its allocation: directly, or through ``srun``
(several tasks or nodes, pyxis container options, the self-check, a ``torchrun`` launcher).

The result is argv (no shell, no user value in a script): ``sweep.json`` stores it and the
runtime puts it before the command, after filling in the rendezvous values it knows on the
first node (:func:`slurmkit.core.rendezvous.fill`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .spec import SweepSpec

SELF_CHECK_NAME = "slurmkit-selfcheck"  # the $0 of the check: the rendered script shows this


def self_check() -> list[str]:
    """``sh -c SCRIPT slurmkit-selfcheck``: ``runtime/selfcheck.sh``, which needs only a POSIX
    shell in the image, checks the task's environment and execs the rest of the argv."""
    # os.path, not pathlib: pathlib (and urllib.parse, ipaddress with it) costs ~6 ms at submit
    with open(
        os.path.join(os.path.dirname(__file__), "runtime", "selfcheck.sh"), encoding="utf-8"
    ) as fh:
        text = fh.read()
    return ["sh", "-c", text, SELF_CHECK_NAME]


def srun_options(options: dict[str, str | int | bool]) -> list[str]:
    """The spec's ``srun`` block as options (validated values: no shell ever sees them)."""
    flags = {key: key.replace("_", "-") for key in options}
    return [f"--{flags[k]}" if v is True else f"--{flags[k]}={v}" for k, v in options.items()]


def env_wrapper(prepend: Mapping[str, str], append: Mapping[str, str]) -> list[str]:
    """``sh -c`` that joins path-like values before (``prepend``) or after (``append``) the
    value the task would see (inside a container, the image's own), then execs the rest of the
    argv. The values travel as arguments, never as script text; the names in the fixed script
    are validated identifiers. Empty when there is nothing to join."""
    lines, values = [], []
    for name, value in prepend.items():
        values.append(value)
        lines.append(f'export {name}="${{{len(values)}}}${{{name}:+:${name}}}"')
    for name, value in append.items():
        values.append(value)
        lines.append(f'export {name}="${{{name}:+${name}:}}${{{len(values)}}}"')
    if not values:
        return []
    script = "; ".join([*lines, f"shift {len(values)}", 'exec "$@"'])
    return ["sh", "-c", script, "slurmkit-env", *values]


def torchrun_signals(requeue_signal: str, lead: int) -> list[str]:
    """``env`` settings that make torchrun (torch >= 2.9) pass the requeue signal on to its
    workers, and give them ``lead`` seconds to checkpoint before it kills them; without them
    torchrun dies of the signal and its workers never see it. Older torchrun ignores them."""
    handled = ",".join(f"SIG{name}" for name in ("TERM", "INT", "HUP", "QUIT", requeue_signal))
    return ["env", f"PET_SIGNALS_TO_HANDLE={handled}", f"PET_SHUTDOWN_TIMEOUT={lead}"]


def build(spec: SweepSpec, submit_dir: str) -> dict[str, list[str]]:
    """``{"step": [...srun + container options + self-check], "launcher": [...torchrun]}``,
    with ``"env"`` (:func:`env_wrapper`) between them when the spec prepends or appends
    values, and ``"data"`` (:func:`data_step`) when a multi-node trial caches data on its
    nodes; step and launcher are empty when the command runs as it is (one task on one
    node, no container)."""
    wrap = env_wrapper(spec.env_prepend, spec.env_append)
    r = spec.resources
    if not (spec.container or spec.launcher or spec.srun or r.nodes > 1 or r.tasks_per_node > 1):
        return {"step": [], "launcher": [], **({"env": wrap} if wrap else {})}
    per_node = r.gpu_count or r.tasks_per_node
    tasks = (
        1
        if spec.launcher == "torchrun"
        else (per_node if spec.launcher == "srun" else r.tasks_per_node)
    )
    step = [
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={r.nodes}",
        f"--ntasks={r.nodes * tasks}",
        f"--ntasks-per-node={tasks}",
        *srun_options(spec.srun),
    ]
    if spec.container:
        from . import pyxis  # ~3 ms (its regexes, hashlib): only container jobs need it

        step += pyxis.srun_options(
            spec.container,
            submit_dir=spec.workdir or submit_dir,
            env_names=[*spec.env, *spec.env_runtime],
            source=spec.source,
        )
        if spec.self_check:
            step += self_check()
    launcher = []
    if spec.launcher == "torchrun":
        launcher = [
            *torchrun_signals(spec.requeue.signal, spec.requeue.lead),
            "torchrun",
            "--no-python",
            "--nnodes={nnodes}",
            f"--nproc-per-node={spec.torchrun.get('nproc_per_node') or per_node}",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint={master_addr}:{master_port}",
            "--rdzv-id={job_id}",
        ]
    return {
        "step": step,
        "launcher": launcher,
        **({"env": wrap} if wrap else {}),
        **({"data": copy} if (copy := data_step(spec)) else {}),
    }


def data_step(spec: SweepSpec) -> list[str]:
    """The ``srun`` prefix of the step that copies a multi-node trial's ``cache: node``
    datasets, one task per node, on the host (``python -m slurmkit.runtime.datacache`` follows
    it), before the trial's own step; empty when there is none (one node copies in the runtime's
    own process)."""
    nodes = spec.resources.nodes
    if nodes < 2 or not any(entry.cache == "node" for entry in spec.data):
        return []
    return [
        "srun",
        "--kill-on-bad-exit=1",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
    ]
