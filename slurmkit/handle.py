"""A sweep as a Python object (``slurmkit.Sweep``): one handle on one sweep directory.

A thin layer over the library the CLI uses (``sweep.submit/resume``, ``sweepstate.collect``,
``steer``): a sweep started from the CLI can be opened and steered here, and the reverse. The
sweep directory is the only state; a handle keeps nothing the directory does not say.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import UserError

if TYPE_CHECKING:
    from .backends.base import Submission
    from .spec import SweepSpec
    from .steer import Cancelled
    from .sweepstate import SweepStatus


def submit_reported(
    spec: SweepSpec,
    backend: str,
    sweep_dir: str | None,
    progress: bool,
    then: Callable[[Any, Any], None] | None = None,
    yes: bool = False,
) -> Submission:
    """``sweep.submit`` as the CLI reports it: the note when the backend was a fallback, and a
    progress bar over trials that run here (with ``progress``). ``then(backend, sweep_dir)``
    runs once the sweep directory exists, before anything is submitted."""
    from . import sweep, ui

    reporter = ui.Reporter() if progress else None

    def on_target(target: Any, where: Any) -> None:
        if then is not None:
            then(target, where)
        if reporter is not None:
            reporter.start(target, where)
        elif target.note:
            print(f"slurmkit: {target.note}", file=sys.stderr)
            if target.hint:
                print(f"  hint: {target.hint}", file=sys.stderr)

    try:
        return sweep.submit(
            spec,
            backend=backend,
            sweep_dir=sweep_dir,
            yes=yes,
            on_target=on_target,
            on_done=reporter.trial_done if reporter is not None else None,
        )
    finally:
        if reporter is not None:
            reporter.stop()


class Sweep:
    """A sweep before submission (:meth:`load`) or after (:meth:`open`, :meth:`submit`).

    ::

        sw = slurmkit.Sweep.load("sweeps/lr.yaml", ["params.optim.lr=0.1,0.01"])
        sw.submit()                       # the same sweep directory as `slurmkit sweep`
        sw.wait()                         # a progress bar until every trial has ended
        sw.results(sort="loss")           # one dict per trial: index, id, state, params, metrics
    """

    def __init__(self, spec: SweepSpec | None = None, sweep_dir: str | None = None) -> None:
        if spec is None and sweep_dir is None:
            raise UserError("a Sweep needs a spec or a sweep directory", hint="Sweep.load/open")
        self.spec = spec
        self._root = os.path.abspath(sweep_dir) if sweep_dir else None
        self.submission: Submission | None = None  # what the last submit/resume did

    @classmethod
    def load(cls, path: str, overrides: Sequence[str] = ()) -> Sweep:
        """The sweep that ``slurmkit sweep PATH OVERRIDES...`` would submit (nothing is created)."""
        from .spec import load  # spec: PyYAML and the override parser

        return cls(load(path, overrides))

    @classmethod
    def open(cls, sweep_dir: str) -> Sweep:
        """A sweep that was submitted already, from the CLI or from Python."""
        from . import store

        store.open_sweep(sweep_dir)  # a clear error when it is no sweep directory
        return cls(sweep_dir=sweep_dir)

    @property
    def sweep_dir(self) -> str:
        if self._root is None:
            raise UserError("this sweep has not been submitted yet", hint="call .submit() first")
        return self._root

    @property
    def submitted(self) -> bool:
        return self._root is not None

    @property
    def trials(self) -> list[dict[str, Any]]:
        """Its trials as ``{"index", "id", "params"}``: the manifest once submitted, else what
        a submit would write."""
        if self._root is None:
            import json

            from . import plan  # the expansion of the search space

            assert self.spec is not None
            return [json.loads(row) for row in plan.expand(self.spec).rows]
        from . import store

        return [row for row in store.manifest(store.open_sweep(self._root)) if row is not None]

    def submit(
        self,
        backend: str = "auto",
        *,
        sweep_dir: str | None = None,
        yes: bool = False,
        progress: bool = True,
    ) -> Sweep:
        """Create the sweep directory and submit every trial (on the local backend, run them
        here and return when they have ended: with ``progress``, a progress bar, and a note
        when no cluster answered). Once only: a submitted sweep is resumed."""
        if self._root is not None:
            raise UserError(
                f"this sweep was submitted already ({self._root})",
                hint="call .resume() to run what is left",
            )
        assert self.spec is not None
        return self.submitted_as(submit_reported(self.spec, backend, sweep_dir, progress, yes=yes))

    def submitted_as(self, submission: Submission) -> Sweep:
        """This sweep, now submitted as ``submission`` says."""
        self.submission = submission
        self._root = submission.sweep_dir
        return self

    def resume(
        self, overrides: Sequence[str] = (), backend: str | None = None, *, unprune: bool = False
    ) -> Submission:
        """Submit again what is neither COMPLETED, PRUNED nor queued or running (``overrides``
        may change resources, max_parallel and env); with ``unprune``, the pruned trials too,
        to ``max_resource`` (``slurmkit sweep --resume DIR --unprune``)."""
        from . import sweep

        self.submission = sweep.resume(self.sweep_dir, overrides, backend=backend, unprune=unprune)
        return self.submission

    def status(self) -> SweepStatus:
        """Every trial's state, from its status file and one scheduler query."""
        from .sweepstate import collect

        return collect(self.sweep_dir)

    def results(
        self, sort: str | None = None, desc: bool = False, *, as_frame: bool = False
    ) -> Any:
        """One dict per trial (index, id, state, params, metrics), as ``slurmkit results``
        shows them; with ``as_frame``, a pandas DataFrame of the same rows and columns."""
        from .steer import results_table

        rows, columns, _damaged = results_table(self.sweep_dir, sort, desc)
        if not as_frame:
            return rows
        try:
            import pandas as pd
        except ImportError:
            raise UserError(
                "as_frame=True needs pandas", hint="pip install pandas, or use the list of dicts"
            ) from None
        return pd.DataFrame(rows, columns=columns)

    def wait(self, progress: bool = True, interval: float | None = None) -> SweepStatus:
        """Until every trial has ended (one scheduler query per ``interval`` seconds; default
        ``SLURMKIT_POLL_INTERVAL``, else 10, at least 1); with ``progress``, a progress bar
        (rich draws it in notebooks too)."""
        from .backends import pollcache
        from .sweepstate import add_metrics, collect
        from .sweepstate import wait as until_done

        if interval is None:
            interval = max(1.0, pollcache.interval())
        if not (interval > 0):
            raise UserError(f"interval must be > 0 seconds, not {interval!r}", key="interval")
        root = self.sweep_dir

        def poll() -> SweepStatus:  # the loop shows no metrics: the last answer has them
            return collect(root, with_metrics=False)

        if not progress:
            return add_metrics(until_done(poll, interval))
        from . import ui  # rich

        return add_metrics(ui.follow(poll, interval))

    def cancel(self) -> Cancelled:
        """Cancel every queued and running trial (one scancel)."""
        from .steer import cancel

        return cancel(self.sweep_dir)

    def result(self, trial: int | str) -> Any:
        """A function trial's return value (``slurmkit.sweep_fn``)."""
        from .functions import result

        return result(self.sweep_dir, trial)

    def logs(self, trial: int | str, *, slurm: bool = False) -> str:
        """A trial's output (``trial``: its index or a prefix of its id); with ``slurm``,
        Slurm's own log of its latest array task."""
        from .steer import log_path

        path = log_path(self.sweep_dir, str(trial), slurm)
        try:
            with open(path, encoding="utf-8", errors="replace") as fh:
                return fh.read()
        except FileNotFoundError:
            return ""

    def __repr__(self) -> str:
        if self._root is None:
            name = self.spec.name if self.spec is not None else "?"
            return f"<Sweep {name!r}: not submitted>"
        return f"<Sweep {self._root}>"
