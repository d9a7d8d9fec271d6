"""Where trials run: one interface (:mod:`.base`), one class per backend (``slurm``, ``local``).

A backend submits the chunks of a sweep and returns a submission record, reads the live tasks
of a sweep from ONE query over its submission records, and cancels them. Commands and the
library never branch on a backend's name: they ask the backend object. A new backend is a
module here with a :class:`~.base.Backend` subclass, and one line in :data:`REGISTRY`.

This module stays light (``slurmkit --help`` imports it for :data:`NAMES`): the interface and
the backends load on first use.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import SchedulerError, UserError

if TYPE_CHECKING:
    from .base import Backend, LiveTask, Probe, Stopped

# name -> "module:class"
REGISTRY = {
    "slurm": "slurmkit.backends.slurm:SlurmBackend",
    "local": "slurmkit.backends.local:LocalBackend",
    "submitit": "slurmkit.backends.submitit:SubmititBackend",
}
NAMES = ("auto", *REGISTRY)
AUTO = ("slurm",)  # what "auto" asks, in order; the first that answers runs the sweep
FALLBACK = "local"  # what "auto" runs on when none answers (it needs nothing)


def backend_class(name: str) -> type[Backend]:
    """The class registered as ``name``, or a UserError naming the allowed ones."""
    if name not in REGISTRY:
        raise UserError(
            f"unknown backend {name!r}", key="--backend", hint=f"allowed values: {', '.join(NAMES)}"
        )
    module, _, attr = REGISTRY[name].partition(":")
    cls: type[Backend] = getattr(importlib.import_module(module), attr)
    return cls


def get(name: str) -> Backend:
    """The backend called ``name``, unprobed."""
    return backend_class(name)()


class Choosing:
    """:func:`choose` in two steps: the backends are asked at once and :meth:`result` waits for
    their answers, so that the caller can expand trials meanwhile. ``auto`` asks those of
    :data:`AUTO` that are present and takes the first that answers, else :data:`FALLBACK`."""

    def __init__(self, name: str) -> None:
        self.auto = name == "auto"
        self.probes: list[tuple[str, Probe | SchedulerError]] = []
        self.why = ""  # auto: why the fallback runs the sweep
        self.asked = False  # auto: a scheduler was there but did not answer
        for candidate in AUTO if self.auto else [name]:
            cls = backend_class(candidate)
            absent = cls.absent() if self.auto else ""
            if absent:
                self.why = self.why or absent
                continue
            try:
                self.probes.append((candidate, cls.probe(timeout=10 if self.auto else 30)))
            except SchedulerError as exc:  # raised by result(), after the spec's errors
                self.probes.append((candidate, exc))

    def result(self) -> Backend:
        """The chosen backend; SchedulerError when the named one cannot run trials now."""
        for _, probe in self.probes:
            try:
                if isinstance(probe, SchedulerError):
                    raise probe
                return probe.result()
            except SchedulerError as exc:
                if not self.auto:
                    raise
                self.asked = self.asked or not self.why
                self.why = self.why or exc.message
        fallback = get(FALLBACK)
        fallback.note = f"{self.why}: running the sweep {fallback.where}"
        if self.asked:
            fallback.hint = unanswered_hint(os.environ.get("SLURM_CONF"))
        return fallback

    def cancel(self) -> None:
        for _, probe in self.probes:
            if not isinstance(probe, SchedulerError):
                probe.cancel()


def unanswered_hint(conf: str | None) -> str:
    """What to check when ``sbatch`` is here but no controller answered."""
    where = f"SLURM_CONF={conf}" if conf else "SLURM_CONF is unset, so /etc/slurm/slurm.conf"
    return (
        f"check which cluster this machine asks ({where}), `scontrol ping`, and "
        "`slurmkit doctor`; --backend slurm fails instead of running here"
    )


def choose(name: str) -> Backend:
    """``auto``: Slurm when ``sbatch`` is on PATH and a controller answers; else local."""
    return Choosing(name).result()


def for_resume(records: Sequence[dict[str, Any]]) -> str:
    """The backend a resume without ``--backend`` asks for: the last one used when it is
    sticky, else ``auto``."""
    last = records[-1].get("backend", "auto") if records else "auto"
    return last if last in REGISTRY and backend_class(last).sticky else "auto"


def live_tasks(
    records: Sequence[dict[str, Any]], ask: Callable[[int], bool], *, fresh: bool = False
) -> dict[int, LiveTask]:
    """Every submitted trial's :class:`LiveTask`, from its latest submission's backend: one
    query per backend that has records, about the trials for which ``ask(index)`` is true
    (``fresh``: asked now, not from the shared poll cache)."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for rec in _known(records):
        groups.setdefault(rec.get("backend", "slurm"), []).append(rec)
    backends = {name: get(name) for name in groups}
    if len(groups) == 1:  # the usual case: its latest records own every trial they name
        [(name, recs)] = groups.items()
        return backends[name].live(recs, None, ask, fresh=fresh)
    owner: dict[int, str] = {}
    for rec in _known(records):
        name = rec.get("backend", "slurm")
        for index in backends[name].indices(rec):
            owner[index] = name
    out: dict[int, LiveTask] = {}
    for name, recs in groups.items():
        mine = {i for i, n in owner.items() if n == name}
        out.update(backends[name].live(recs, mine.__contains__, ask, fresh=fresh))
    return out


def _known(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of registered backends (one written by a newer slurmkit is not ours to read)."""
    return [rec for rec in records if rec.get("backend", "slurm") in REGISTRY]


def cancel_all(
    records: Sequence[dict[str, Any]], live_jobs: set[str], dry_run: bool
) -> dict[str, list[Stopped]]:
    """What every backend with records stopped, by its ``cancel_key`` (every registered key is
    there, empty when nothing of its kind ran)."""
    out: dict[str, list[Stopped]] = {backend_class(n).cancel_key: [] for n in REGISTRY}
    seen: dict[str, list[dict[str, Any]]] = {}
    for rec in _known(records):
        seen.setdefault(rec.get("backend", "slurm"), []).append(rec)
    for name, recs in seen.items():
        for stopped in get(name).cancel(recs, live_jobs, dry_run):
            out.setdefault(stopped.key, []).append(stopped)
    return out
