"""The submitit backend: a sweep's trials as submitit job arrays, each task running slurmkit's
trial runtime.

One submitit ``map_array`` per chunk of trials (chunks stay under MaxArraySize), with
``array_parallelism`` = ``max_parallel`` (each chunk then waits for the one before it, as on the
slurm backend). The executor is slurmkit's one submitit adapter
(:mod:`slurmkit.submitit_adapter`, shared with ``slurmkit.executor``), its jobs running
:class:`Trials`: submitit pickles ``trial(sweep_dir, index)`` of
:mod:`slurmkit.runtime.submitit_trial` for each array task into ``SWEEP_DIR/submitit`` and
writes the batch script's ``#SBATCH`` header from the spec's resources. The script's body is
slurmkit's: the batch shell runs ``python -m slurmkit.runtime.submitit_trial`` (submitit's job
code calling the trial runtime, which takes the trial's claim, launches the step, writes
``status.json`` and decides requeues within the budgets) under the same supervision as the
slurm backend's scripts, so ``scontrol requeue`` runs on the host, never in a container.

Its jobs are Slurm jobs: reading (one query, through the poll cache) and cancelling them is the
slurm backend's, from submission records of the same shape (trial = ``offset`` + array task).
submitit is imported when a sweep is submitted, never for reading or cancelling one.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from .. import store
from .. import submitit_adapter as adapter
from ..core.arrays import compress
from ..core.layout import slurm_log_name
from ..errors import SchedulerError
from . import slurm
from .base import Progress, Submission
from .slurm import ConfigProbe, SlurmBackend

if TYPE_CHECKING:
    from ..core.layout import SweepDir
    from ..plan import Chunk, Plan
    from ..spec import SweepSpec

FOLDER = "submitit"  # submitit's folder in the sweep directory: pickles, results, scripts
TASK = "slurmkit.runtime.submitit_trial"  # what the batch shell runs


class SubmititBackend(SlurmBackend):
    """Trials as submitit job arrays (``map_array``), one per chunk of trials."""

    name = "submitit"
    needs = "submitit installed, sbatch on PATH and a Slurm controller that answers"
    where = "on the Slurm cluster, through submitit"
    stages_data = False  # the spec's data is staged on this machine before it submits

    @classmethod
    def absent(cls) -> str:
        return _no_submitit() or super().absent()

    @classmethod
    def probe(cls, timeout: float) -> _Probe:
        missing = _no_submitit()
        if missing:
            raise SchedulerError(
                missing, hint="pip install 'slurmkit[submitit]', or use --backend slurm"
            )
        return _Probe(slurm.start_config(timeout))

    def submit(
        self,
        sweep: SweepDir,
        plan: Plan,
        indices: list[int],
        scripts: Sequence[tuple[Chunk, str]],
        on_done: Progress | None,
        recorded: Callable[[], None],
    ) -> Submission:
        """One ``map_array`` per chunk; on a refusal, the arrays already submitted are
        cancelled and the submission record is removed."""
        result = Submission(sweep.root, self.name, plan.total, indices, note=self.note)
        ex = executor(plan.spec, sweep.root)
        number = store.record_submission(
            sweep,
            {"backend": self.name, "state": "submitting", "jobs": [], "user": slurm.user()},
        )
        arrays: list[str] = []
        shown: list[str] = []
        jobs: list[dict[str, Any]] = []
        try:
            for chunk, _ in scripts:
                after = arrays[-1] if arrays and plan.spec.max_parallel else None
                array, script = submit_trials(ex, chunk.indices, after)
                arrays.append(array)
                shown.append(f"{array} ({len(chunk.indices)} tasks)")
                jobs += task_records(array, chunk.indices, script)
                with open(script, encoding="utf-8") as fh:
                    result.scripts.append(fh.read())
        except BaseException:  # refused, a full disk, Ctrl-C: no array left queued unrecorded
            if arrays:
                slurm.cancel(arrays)
            store.drop_submission(sweep, number)
            raise
        store.update_submission(sweep, number, state="submitted", jobs=jobs)
        recorded()
        result.jobs = jobs
        result.described = f"through submitit as job array {', '.join(shown)}"
        return result


class _Probe(ConfigProbe):
    """The slurm backend's probe (MaxArraySize, MaxJobCount, accounting), for this backend."""

    def result(self) -> SubmititBackend:
        found = super().result()
        return SubmititBackend(
            max_array_size=found.max_array_size,
            max_jobs=found.max_jobs,
            accounting=found.accounting,
        )


def _no_submitit() -> str:
    """Why submitit cannot be used here ("" when it can), without importing it."""
    if importlib.util.find_spec("submitit") is None:
        return f"submitit is not installed in this Python ({sys.executable})"
    return ""


def task_records(job_id: str, indices: Sequence[int], script: str) -> list[dict[str, Any]]:
    """The submission record's entries for array ``job_id`` whose task ``t`` runs trial
    ``indices[t]``: one per run of consecutive indices, in the slurm backend's form (trial =
    ``offset`` + array task), so that its reading and cancelling apply as they are."""
    out: list[dict[str, Any]] = []
    start = 0
    for t in range(1, len(indices) + 1):
        if t == len(indices) or indices[t] != indices[t - 1] + 1:
            out.append(
                {
                    "job_id": job_id,
                    "offset": indices[start] - start,
                    "array": compress(range(start, t)),
                    "script": script,
                }
            )
            start = t
    return out


@dataclass(frozen=True)
class Trials:
    """The adapter's :class:`~slurmkit.submitit_adapter.Task` of a sweep's trials: each array
    task runs the trial runtime in the batch shell (no srun around it: the runtime launches the
    trial's step itself, with its pyxis options), its logs where the slurm backend's are."""

    one_array: ClassVar[bool] = True  # trial = offset + array task, one trial too
    throttle_s: ClassVar[float] = 0.0  # a sweep's arrays go one after the other

    spec: SweepSpec
    sweep_dir: str

    @property
    def folder(self) -> str:
        return os.path.join(self.sweep_dir, FOLDER)

    @property
    def python(self) -> str:
        return shlex.quote(sys.executable)

    @property
    def srun_args(self) -> list[str]:
        return []

    @property
    def parameters(self) -> dict[str, Any]:
        return self.logs({**adapter.parameters(self.spec), "use_srun": False})

    def logs(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """``params`` with the sweep's log names: ``logs/%A_%a.out`` (``.err``), as the slurm
        backend's arrays have them."""
        name = slurm_log_name(self.spec.logs.name, self.spec.name, False)
        logs = os.path.join(self.sweep_dir, "logs", name)
        separate = self.spec.logs.stderr == "separate"
        avoid = slurm.exclude_option(self.sweep_dir, self.spec.resources.extra)
        extra = {
            **(params.get("additional_parameters") or {}),
            "output": f"{logs}.out",
            **({"error": f"{logs}.err"} if separate else {}),
            # the nodes the sweep excludes (a resume), beside the spec's own
            **({"exclude": avoid[0].partition("=")[2]} if avoid else {}),
        }
        return {**params, "stderr_to_stdout": not separate, "additional_parameters": extra}

    def command(self, python: str | None = None, folder: str | None = None) -> str:
        return f'"$PY" -u -m {TASK} {shlex.quote(folder or self.folder)}'

    def body(self, params: Mapping[str, Any], command: str, folder: str) -> adapter.Body:
        preamble = [
            "# slurmkit: each array task runs its trial with slurmkit's runtime (claim, "
            "status.json,",
            "# requeue within the budgets); scontrol requeue runs here, on the host",
            "set -u",
            f"export SLURMKIT_SWEEP_DIR={shlex.quote(self.sweep_dir)}",
        ]
        return adapter.Body(preamble, command)


def script(
    spec: SweepSpec, sweep_dir: str, params: Mapping[str, Any], count: int, command: str
) -> str:
    """The batch script of an array of ``count`` trials: submitit's ``#SBATCH`` header of
    ``params`` with slurmkit's log names and requeue options, and a body that runs ``command``
    (the task) under the batch shell's requeue supervision (:func:`slurmkit.render.supervised`)."""
    trials = Trials(spec, sweep_dir)
    params = {**trials.logs(params), "map_count": count}
    return adapter.script(trials, params, command, trials.folder)


def executor(spec: SweepSpec, sweep_dir: str) -> Any:
    """The adapter's submitit executor for the trials of the sweep in ``sweep_dir``;
    SchedulerError where submitit finds no ``srun``."""
    try:
        return adapter.executor_class()(Trials(spec, sweep_dir))
    except RuntimeError as exc:  # SlurmExecutor's "Could not detect srun"
        raise SchedulerError(f"submitit: {exc}", hint="run on a Slurm login node") from None


def submit_trials(ex: Any, indices: Sequence[int], after: str | None) -> tuple[str, str]:
    """``map_array`` of the trials ``indices`` through ``ex`` (:func:`executor`; ``after``: the
    array it waits for); the array's job id and its batch script's path. Slurm's refusal is a
    UserError."""
    from submitit.core.utils import FailedJobError, JobPaths

    from ..runtime.submitit_trial import trial

    ex.parameters.pop("dependency", None)
    if after is not None:
        ex.update_parameters(dependency=f"afterany:{after}")
    sweep_dir = ex.task.sweep_dir
    try:  # submitit prints sbatch's refusal too: it is in the error, said once
        with contextlib.redirect_stderr(io.StringIO()):
            jobs = ex.map_array(trial, [sweep_dir] * len(indices), list(indices))
    except FailedJobError as exc:
        code = getattr(exc.__cause__, "returncode", 1)
        raise slurm.refused(str(exc), code) from None
    array = jobs[0].job_id.split("_")[0]
    return array, str(JobPaths(ex.folder, job_id=array).submission_file)
