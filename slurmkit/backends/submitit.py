"""The submitit backend: a sweep's trials as submitit job arrays, each task running slurmkit's
trial runtime.

One submitit ``map_array`` per chunk of trials (chunks stay under MaxArraySize), with
``array_parallelism`` = ``max_parallel`` (each chunk then waits for the one before it, as on the
slurm backend). submitit pickles ``trial(sweep_dir, index)`` of
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
import functools
import importlib.util
import io
import os
import shlex
import sys
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from .. import store
from ..core.arrays import compress
from ..core.layout import slurm_log_name
from ..errors import SchedulerError
from . import slurm
from .base import Progress, Submission
from .slurm import SlurmBackend, _ConfigProbe

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
                array, script = ex.submit_trials(chunk.indices, after)
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


class _Probe(_ConfigProbe):
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


def script(
    spec: SweepSpec, sweep_dir: str, params: Mapping[str, Any], count: int, command: str
) -> str:
    """The batch script of an array of ``count`` trials: submitit's ``#SBATCH`` header of
    ``params`` with slurmkit's log names and requeue options, and a body that runs ``command``
    (the task) under the batch shell's requeue supervision (:func:`slurmkit.render._supervise`)."""
    from submitit.slurm.slurm import _make_sbatch_string

    from ..render import _supervise

    q = shlex.quote
    policy = spec.requeue
    given = dict(params)
    extra = dict(given.pop("additional_parameters", None) or {})
    logs = os.path.join(sweep_dir, "logs", slurm_log_name(spec.logs.name, spec.name, False))
    separate = spec.logs.stderr == "separate"
    ours: dict[str, Any] = {
        "output": f"{logs}.out",
        **({"error": f"{logs}.err"} if separate else {}),
        **(
            {"requeue": True, "signal": f"B:{policy.signal}@{policy.lead}"}
            if policy.enabled
            else {"no-requeue": True}
        ),
    }
    body = [
        "# slurmkit: each array task runs its trial with slurmkit's runtime (claim, status.json,",
        "# requeue within the budgets); scontrol requeue runs here, on the host",
        "set -u",
        f"export SLURMKIT_SWEEP_DIR={q(sweep_dir)}",
        f"PY=${{SLURMKIT_PYTHON:-{q(sys.executable)}}}",
        'command -v "$PY" >/dev/null || { echo "slurmkit: no Python $PY on $(hostname): set'
        ' SLURMKIT_PYTHON to one with slurmkit and submitit" >&2; exit 2; }',
        *_supervise(
            command,
            policy.signal if policy.enabled else None,
            '"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"',
        ),
    ]
    text: str = _make_sbatch_string(
        command="\n".join(body),
        folder=os.path.join(sweep_dir, FOLDER),
        use_srun=False,
        map_count=count,
        stderr_to_stdout=not separate,
        additional_parameters={**extra, **ours},
        **given,
    )
    if not policy.enabled:  # submitit always asks for its signal; without requeue, none
        text = "\n".join(
            line for line in text.split("\n") if not line.startswith("#SBATCH --signal=")
        )
    return text


def executor(spec: SweepSpec, sweep_dir: str) -> Any:
    """A submitit executor for the trials of the sweep in ``sweep_dir`` (see
    :class:`SweepExecutor <_classes>`); SchedulerError where submitit finds no ``srun``."""
    try:
        return _executor_class()(spec, sweep_dir)
    except RuntimeError as exc:  # SlurmExecutor's "Could not detect srun"
        raise SchedulerError(f"submitit: {exc}", hint="run on a Slurm login node") from None


@functools.cache
def _executor_class() -> type[Any]:
    import submitit
    from submitit.core import utils as sutils

    from ..executors import parameters

    class SweepExecutor(submitit.SlurmExecutor):
        """submitit's SlurmExecutor for one sweep: every ``map_array`` is one array whose task
        runs the trial runtime in the batch shell (no srun around it: the runtime launches the
        trial's step itself, with its pyxis options)."""

        def __init__(self, spec: SweepSpec, sweep_dir: str) -> None:
            super().__init__(os.path.join(sweep_dir, FOLDER))
            self.spec, self.sweep_dir = spec, sweep_dir
            self.count = 0  # tasks of the array being submitted
            self.update_parameters(**parameters(spec))

        @property
        def _submitit_command_str(self) -> str:
            return f'"$PY" -u -m {TASK} {shlex.quote(str(self.folder))}'

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return script(self.spec, self.sweep_dir, self.parameters, self.count, command)

        def _num_tasks(self) -> int:
            return 1  # the batch shell runs the task; the trial's step has its own tasks

        def _internal_process_submissions(self, delayed: list[Any]) -> list[Any]:
            """Every submission as one array (one of a single task too), pickled first."""
            folder = sutils.JobPaths.get_first_id_independent_folder(self.folder)
            folder.mkdir(parents=True, exist_ok=True)
            before = set(folder.glob(".submission_file_*.sh"))
            paths = []
            try:
                for d in delayed:
                    paths.append(folder / f"{uuid.uuid4().hex}.pkl")
                    d.dump(paths[-1])
                self.count = len(delayed)
                first = self._submit_command(self._submitit_command_str)
            except BaseException:  # nothing half-written left: pickles, the unsubmitted script
                for path in [*paths, *(set(folder.glob(".submission_file_*.sh")) - before)]:
                    path.unlink(missing_ok=True)
                raise
            jobs = [
                self.job_class(folder=self.folder, job_id=f"{first.job_id}_{t}", tasks=[0])
                for t in range(len(delayed))
            ]
            for job, path in zip(jobs, paths):
                job.paths.move_temporary_file(path, "submitted_pickle")
            return jobs

        def submit_trials(self, indices: Sequence[int], after: str | None) -> tuple[str, str]:
            """``map_array`` of the trials ``indices`` (``after``: the array it waits for);
            the array's job id and its batch script's path. Slurm's refusal is a UserError."""
            from submitit.core.utils import FailedJobError

            from ..runtime.submitit_trial import trial

            self.parameters.pop("dependency", None)
            if after is not None:
                self.update_parameters(dependency=f"afterany:{after}")
            try:  # submitit prints sbatch's refusal too: it is in the error, said once
                with contextlib.redirect_stderr(io.StringIO()):
                    jobs = self.map_array(trial, [self.sweep_dir] * len(indices), list(indices))
            except FailedJobError as exc:
                code = getattr(exc.__cause__, "returncode", 1)
                raise slurm.refused(str(exc), code) from None
            array = jobs[0].job_id.split("_")[0]
            return array, str(sutils.JobPaths(self.folder, job_id=array).submission_file)

    SweepExecutor.__module__, SweepExecutor.__qualname__ = __name__, "SweepExecutor"
    return SweepExecutor
