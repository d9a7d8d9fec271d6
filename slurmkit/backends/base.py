"""The backend interface: what every backend does, and the records it returns."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple

from ..core.arrays import DEFAULT_MAX_ARRAY_SIZE
from ..core.record import record
from ..errors import UserError

if TYPE_CHECKING:
    from ..core.layout import SweepDir
    from ..plan import Chunk, Plan
    from ..runtime.trial import TrialRun
    from ..spec import SweepSpec

Progress = Callable[["TrialRun", int], None]  # called as each trial that runs here ends


class TaskState(NamedTuple):
    """What the scheduler says about one task."""

    state: str  # Slurm's state word, e.g. PENDING, RUNNING, COMPLETED, CANCELLED
    reason: str = ""
    exit_code: int | None = None


class LiveTask(NamedTuple):
    """Who runs a trial now, from its latest submission: ``job`` is the scheduler's name for
    the task (``1234_5``; ``None`` when it runs on this machine), ``task`` the scheduler's
    answer (``None`` when it no longer knows the job), ``here`` a live process of this machine
    runs it."""

    job: str | None
    task: TaskState | None
    here: bool


class Stopped(NamedTuple):
    """One thing :meth:`Backend.cancel` stopped (or would stop): ``key`` groups it in the
    ``--json`` output, ``text`` shows it to people."""

    key: str
    value: Any
    text: str


@record(frozen=False)
class Submission:
    """What one ``sweep`` or ``--resume`` did (or, with ``dry_run``, would do)."""

    sweep_dir: str
    backend: str
    trials: int
    indices: list[int]
    scripts: list[str] = field(default_factory=list)  # rendered script texts
    jobs: list[dict[str, Any]] = field(default_factory=list)
    exit_codes: dict[int, int] = field(default_factory=dict)  # trials that ran here
    note: str = ""
    dry_run: bool = False
    ran_here: bool = field(default=False, repr=False)  # the trials ran (and ended) here
    described: str = field(default="", repr=False)  # how they were submitted, for people
    warnings: list[str] = field(default_factory=list, repr=False)  # damaged files seen

    def as_dict(self) -> dict[str, Any]:
        hidden = ("scripts", "ran_here", "described", "warnings")
        out = {k: v for k, v in self.__dict__.items() if k not in hidden}
        out["submitted"] = len(self.indices)
        return out


class Probe:
    """A backend being asked whether it can run trials now (e.g. its controller answers);
    this one has nothing to ask."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def result(self) -> Backend:
        """The backend, ready; SchedulerError when it cannot run trials now."""
        return self.backend

    def cancel(self) -> None:
        """Stop asking: the answer is no longer wanted."""


class Backend(ABC):
    """One place trials run. Instances come from :func:`choose` (probed: ready to submit) or
    :func:`get` (unprobed: reading and cancelling what records say needs no probe)."""

    name: ClassVar[str]
    needs: ClassVar[str]  # what it needs to be chosen, in words
    where: ClassVar[str]  # where its trials run, in words ("on this machine")
    cancel_key: ClassVar[str]  # the --json key of what cancel stops
    runs_here: ClassVar[bool]  # trials run (and end) within the submit call
    sticky: ClassVar[bool]  # a resume without --backend comes back here (else: auto)
    stages_data: ClassVar[bool] = False  # submits a stage job for the spec's data (else: staged
    # on this machine before it submits; slurmkit.data)

    def __init__(
        self,
        *,
        max_array_size: int = DEFAULT_MAX_ARRAY_SIZE,
        max_jobs: int | None = None,
        note: str = "",
    ) -> None:
        self.max_array_size = max_array_size  # array task ids stay below it
        self.max_jobs = max_jobs  # how many jobs (array tasks) the scheduler holds at once
        self.note = note  # why it was chosen, for people
        self.hint = ""  # what to check when ``note`` says why a fallback runs the sweep

    @classmethod
    def absent(cls) -> str:
        """Why it cannot be chosen without asking (e.g. no ``sbatch`` on PATH); "" if it can."""
        return ""

    @classmethod
    def probe(cls, timeout: float) -> Probe:
        """Start asking whether it can run trials now (SchedulerError when it cannot even ask)."""
        return Probe(cls())

    def check(self, spec: SweepSpec, trials: int) -> None:
        """Raise UserError when it cannot run ``trials`` trials of ``spec`` (before anything is
        created): by default, when they do not fit what the scheduler holds."""
        if self.max_jobs is not None and trials > self.max_jobs:
            raise UserError(
                f"{trials} trials do not fit: this cluster holds at most {self.max_jobs} jobs "
                "at once (MaxJobCount; every array task is a job)",
                file=spec.source,
                key="params",
                hint="split the search space over several sweeps, or ask the admins",
            )

    @abstractmethod
    def submit(
        self,
        sweep: SweepDir,
        plan: Plan,
        indices: list[int],
        scripts: Sequence[tuple[Chunk, str]],
        on_done: Progress | None,
        recorded: Callable[[], None],
    ) -> Submission:
        """Submit trials ``indices`` of ``plan`` (``scripts``: the rendered script of each
        chunk), record the submission in the sweep directory, and say what was done. Call
        ``recorded()`` as soon as the record is complete: the sweep's lock is released then
        (trials that run here run after it)."""

    @abstractmethod
    def indices(self, record: dict[str, Any]) -> list[int]:
        """The trial indices that one of its submission records submitted."""

    @abstractmethod
    def live(
        self,
        records: Sequence[dict[str, Any]],
        owned: Callable[[int], bool] | None,
        ask: Callable[[int], bool],
        *,
        fresh: bool = False,
    ) -> dict[int, LiveTask]:
        """``{index: LiveTask}`` for the trials its ``records`` (oldest first) submitted that it
        ``owned`` (their latest submission is its; None: all), from ONE query that asks the
        scheduler about those for which ``ask(index)`` is true. The answer may be a few seconds
        old (a poll cache shared by the user's callers), unless ``fresh``."""

    @abstractmethod
    def cancel(
        self, records: Sequence[dict[str, Any]], live_jobs: set[str], dry_run: bool
    ) -> list[Stopped]:
        """Stop what still runs or waits for the sweep (``live_jobs``: the
        :attr:`LiveTask.job` of its trials that are queued or running). Returns what was (or,
        with ``dry_run``, would be) stopped."""
