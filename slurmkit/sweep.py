"""Submitting and resuming sweeps: the library behind ``slurmkit sweep`` (and the Python API).

The flow: spec -> trials -> sweep directory -> one rendered script per array chunk -> backend.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, NamedTuple, Sequence

from . import plan, render, spec as spec_mod, store
from .core import arrays, states
from .backends import slurm
from .errors import SchedulerError, UserError
from .core.fsutil import atomic_write_json, read_json
from .core.layout import SweepDir

if TYPE_CHECKING:
    from .backends import local  # imported when trials run here: it loads the runtime

BACKENDS = ("auto", "slurm", "local")


@dataclass
class Submission:
    """What one ``sweep`` or ``--resume`` did (or, with ``dry_run``, would do)."""

    sweep_dir: str
    backend: str
    trials: int
    indices: list[int]
    scripts: list[str] = field(default_factory=list)      # rendered script texts
    jobs: list[dict[str, Any]] = field(default_factory=list)
    exit_codes: dict[int, int] = field(default_factory=dict)  # local backend only
    note: str = ""
    dry_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "scripts"}
        out["submitted"] = len(self.indices)
        return out


class Target(NamedTuple):
    """Where trials go: the chosen backend and, for Slurm, its MaxArraySize."""

    backend: str
    max_array_size: int = slurm.DEFAULT_MAX_ARRAY_SIZE
    note: str = ""


def choose_backend(name: str) -> Target:
    """``auto``: Slurm when ``sbatch`` is on PATH and a controller answers; else local."""
    return _TargetQuery(name).result()


class _TargetQuery:
    """:func:`choose_backend` in two steps: the controller is asked at once, and
    :meth:`result` waits for its answer, so that trials expand meanwhile."""

    def __init__(self, name: str) -> None:
        if name not in BACKENDS:
            raise UserError(f"unknown backend {name!r}", key="--backend",
                            hint=f"allowed values: {', '.join(BACKENDS)}")
        self.name = name
        self.target: Target | None = None
        self.command: slurm.Command | None = None
        self.error: SchedulerError | None = None  # raised by result(), after the spec's errors
        if name == "local":
            self.target = Target("local")
        elif name == "auto" and not slurm.available():
            self.target = Target("local", note="no sbatch on PATH: running the sweep on this machine")
        else:
            try:
                self.command = slurm.start_config(timeout=10 if name == "auto" else 30)
            except SchedulerError as exc:
                self.error = exc

    def result(self) -> Target:
        if self.target is None:
            try:
                if self.error is not None:
                    raise self.error
                assert self.command is not None
                self.target = Target("slurm", slurm.max_array_size(slurm.read_config(self.command)))
            except SchedulerError as exc:
                self.target = self._fallback(exc)
        return self.target

    def cancel(self) -> None:
        if self.command is not None:
            self.command.kill()

    def _fallback(self, exc: SchedulerError) -> Target:
        if self.name == "slurm":
            raise exc
        return Target("local", note=f"{exc.message}: running the sweep on this machine")


def render_scripts(spec: spec_mod.SweepSpec, indices: Sequence[int], max_array_size: int,
                   sweep_dir: str, python: str = sys.executable,
                   launch: dict[str, list[str]] | None = None) -> list[tuple[plan.Chunk, str]]:
    """One script per array chunk for the given trial indices (``launch``: the plan stored in
    sweep.json, shown in the scripts; computed from ``spec`` when not given)."""
    from .launch import fill, plan as launch_plan

    rdzv = {"MASTER_ADDR": "{master_addr}", "MASTER_PORT": "{master_port}"}
    step = fill(launch if launch is not None else launch_plan(spec, os.getcwd()),
                {**rdzv, "SLURM_NNODES": str(spec.resources.nodes), "SLURM_JOB_ID": "{job_id}"})
    return [(c, render.render_array(spec, c, sweep_dir=sweep_dir, python=python, step=step))
            for c in plan.chunks(indices, max_array_size)]


def _check_target(spec: spec_mod.SweepSpec, target: Target, dry_run: bool) -> None:
    """Container trials need Slurm with pyxis: refuse before anything is created."""
    if not spec.container or dry_run:
        return
    if target.backend == "local":
        raise UserError("container trials need Slurm with pyxis; the local backend runs none",
                        key="--backend", hint="submit from a login node of the cluster")
    if not slurm.has_pyxis():
        raise UserError("this cluster has no pyxis: srun does not know --container-image",
                        file=spec.source, key="container",
                        hint="pyxis (NVIDIA's SPANK plugin for enroot) must be installed on the "
                             "cluster, or leave out the container block")


def submit(spec: spec_mod.SweepSpec, *, backend: str = "auto", sweep_dir: str | None = None,
           dry_run: bool = False, on_done: local.Progress | None = None,
           on_target: Callable[[Target, SweepDir], None] | None = None) -> Submission:
    """Create the sweep directory and submit every trial.

    Nothing is left behind when the spec is invalid or the scheduler refuses the first array.
    """
    from .launch import plan as launch_plan

    query = _TargetQuery(backend)
    try:
        trials = plan.expand(spec)
    except BaseException:
        query.cancel()
        raise
    target = query.result()
    _check_target(spec, target, dry_run)
    root = os.path.abspath(sweep_dir) if sweep_dir else store.default_root(spec)
    _check_path(root)
    launch = launch_plan(spec, os.getcwd())
    if dry_run:
        scripts = [s for _, s in render_scripts(spec, range(len(trials)), target.max_array_size,
                                                root, launch=launch)]
        return Submission(root, target.backend, len(trials), list(range(len(trials))),
                          scripts=scripts, note=target.note, dry_run=True)
    sweep = store.create(spec, trials, root, launch=launch)
    try:
        if on_target is not None:
            on_target(target, sweep)
        return _dispatch(spec, sweep, target, list(range(len(trials))), len(trials), on_done,
                         launch)
    except UserError:
        import shutil

        shutil.rmtree(sweep.root, ignore_errors=True)
        raise


def resume(root: str, overrides: Sequence[str] = (), *, backend: str | None = None,
           dry_run: bool = False, on_done: local.Progress | None = None,
           on_target: Callable[[Target, SweepDir], None] | None = None) -> Submission:
    """Submit again the trials that are neither COMPLETED nor still queued or running.

    ``overrides`` may change ``resources.*``, ``max_parallel`` and ``env.*`` (not the trials).
    Running it twice in a row submits nothing the second time.
    """
    from .status import collect

    sweep = store.open_sweep(root)
    config = read_json(sweep.sweep_json)
    spec = spec_mod.resumed(config, overrides, sweep.sweep_json)
    current = collect(sweep.root)
    todo = [t.index for t in current.trials
            if t.state not in (states.COMPLETED, states.PENDING, states.RUNNING, states.REQUEUED)]
    last = (store.submissions(sweep) or [{}])[-1].get("backend", "auto")
    target = choose_backend(backend or ("auto" if last == "local" else last))
    total = len(current.trials)
    _check_target(spec, target, dry_run or not todo)
    launch = config.get("launch") or {}
    if overrides:
        from .launch import plan as launch_plan

        launch = launch_plan(spec, config["submit_dir"])
    if dry_run or not todo:
        scripts = [s for _, s in render_scripts(spec, todo, target.max_array_size, sweep.root,
                                                launch=launch)] if todo else []
        return Submission(sweep.root, target.backend, total, todo, scripts=scripts,
                          note=target.note, dry_run=dry_run)
    if overrides:
        atomic_write_json(sweep.sweep_json, {**config, **spec.to_dict(), "launch": launch})
    if on_target is not None:
        on_target(target, sweep)
    return _dispatch(spec, sweep, target, todo, total, on_done, launch)


def _check_path(root: str) -> None:
    if any(c.isspace() or c in "\"'%\\" for c in root):
        raise UserError(f"{root!r}: sweep directories cannot hold whitespace, quotes, '%' or '\\'",
                        key="--sweep-dir")


def _dispatch(spec: spec_mod.SweepSpec, sweep: SweepDir, target: Target, indices: list[int],
              total: int, on_done: local.Progress | None,
              launch: dict[str, list[str]]) -> Submission:
    result = Submission(sweep.root, target.backend, total, indices, note=target.note)
    if target.backend == "local":
        from .backends import local

        store.record_submission(sweep, {"backend": "local", "pid": os.getpid(),
                                        "indices": arrays.compress(indices)})
        result.exit_codes = local.run(sweep, indices, max_parallel=spec.max_parallel,
                                      on_done=on_done)
        return result
    number = store.record_submission(sweep, {"backend": "slurm", "state": "submitting",
                                             "jobs": []})
    record_path = os.path.join(sweep.submissions, f"{number:04d}.json")
    jobs: list[dict[str, Any]] = []
    try:
        for c, (chunk, text) in enumerate(render_scripts(spec, indices, target.max_array_size,
                                                         sweep.root, launch=launch)):
            path = os.path.join(sweep.scripts, f"{number:04d}-{c}.sbatch")
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(text)
            dependency = f"afterany:{jobs[-1]['job_id']}" if jobs and spec.max_parallel else None
            job_id = slurm.sbatch(path, dependency=dependency)
            jobs.append({"job_id": job_id, "offset": chunk.offset,
                         "array": chunk.array_spec(), "script": path})
            result.scripts.append(text)
    except UserError:
        if jobs:
            slurm.cancel(j["job_id"] for j in jobs)
        os.unlink(record_path)
        raise
    record = read_json(record_path)
    record.update(state="submitted", jobs=jobs)
    atomic_write_json(record_path, record)
    result.jobs = jobs
    return result


def render_plain(spec: spec_mod.SweepSpec, spec_path: str) -> str:
    """A self-contained script for plain ``sbatch`` (the files under ``sbatch/``)."""
    trials = plan.expand(spec)
    chunk_list = plan.chunks(range(len(trials)), slurm.DEFAULT_MAX_ARRAY_SIZE)
    if len(chunk_list) > 1:
        raise UserError(f"{len(trials)} trials do not fit one array of a default cluster",
                        file=spec_path, hint="submit it with `slurmkit sweep`, which splits arrays")
    return render.render_array(spec, chunk_list[0], sweep_dir=None, python=render.PLAIN_PYTHON,
                               spec_path=spec_path)
