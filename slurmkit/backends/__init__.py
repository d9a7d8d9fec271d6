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
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..errors import SchedulerError, UserError

if TYPE_CHECKING:
    from .base import Backend, LiveTask, Probe, Stopped

# name -> "module:class"; "auto" picks the first whose probe answers, else the last
REGISTRY = {
    "slurm": "slurmkit.backends.slurm:SlurmBackend",
    "local": "slurmkit.backends.local:LocalBackend",
}
NAMES = ("auto", *REGISTRY)


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
    """:func:`choose` in two steps: the backend is asked at once and :meth:`result` waits for
    its answer, so that the caller can expand trials meanwhile. ``auto`` asks the first
    registered backend that is present and falls back to the last one (which needs nothing)."""

    def __init__(self, name: str) -> None:
        if name not in NAMES:
            raise UserError(
                f"unknown backend {name!r}",
                key="--backend",
                hint=f"allowed values: {', '.join(NAMES)}",
            )
        self.auto = name == "auto"
        self.probe: Probe | None = None
        self.error: SchedulerError | None = None  # raised by result(), after the spec's errors
        self.why = ""  # auto: why the fallback runs the sweep
        for candidate in list(REGISTRY)[:-1] if self.auto else [name]:
            cls = backend_class(candidate)
            self.why = cls.absent() if self.auto else ""
            if self.why:
                continue
            try:
                self.probe = cls.probe(timeout=10 if self.auto else 30)
            except SchedulerError as exc:
                self.error = exc
            break

    def result(self) -> Backend:
        """The chosen backend; SchedulerError when the named one cannot run trials now."""
        try:
            if self.error is not None:
                raise self.error
            if self.probe is not None:
                return self.probe.result()
        except SchedulerError as exc:
            if not self.auto:
                raise
            self.why = exc.message
        fallback = get(list(REGISTRY)[-1])
        if self.auto:
            fallback.note = f"{self.why}: running the sweep {fallback.where}"
        return fallback

    def cancel(self) -> None:
        if self.probe is not None:
            self.probe.cancel()


def choose(name: str) -> Backend:
    """``auto``: Slurm when ``sbatch`` is on PATH and a controller answers; else local."""
    return Choosing(name).result()


def for_resume(records: Sequence[dict[str, Any]]) -> str:
    """The backend a resume without ``--backend`` asks for: the last one used when it is
    sticky, else ``auto``."""
    last = records[-1].get("backend", "auto") if records else "auto"
    return last if last in REGISTRY and backend_class(last).sticky else "auto"


def live_tasks(
    records: Sequence[dict[str, Any]], ask: Callable[[int], bool]
) -> dict[int, LiveTask]:
    """Every submitted trial's :class:`LiveTask`, from its latest submission's backend: one
    query per backend that has records, about the trials for which ``ask(index)`` is true."""
    groups: dict[str, list[dict[str, Any]]] = {}
    owner: dict[int, str] = {}
    backends: dict[str, Backend] = {}
    for rec in records:
        name = rec.get("backend", "slurm")
        backend = backends.get(name) or backends.setdefault(name, get(name))
        groups.setdefault(name, []).append(rec)
        for index in backend.indices(rec):
            owner[index] = name
    out: dict[int, LiveTask] = {}
    for name, recs in groups.items():
        owned = {i for i, n in owner.items() if n == name}
        out.update(backends[name].live(recs, owned, {i for i in owned if ask(i)}))
    return out


def cancel_all(
    records: Sequence[dict[str, Any]], live_jobs: set[str], dry_run: bool
) -> dict[str, list[Stopped]]:
    """What every backend with records stopped, by its ``cancel_key`` (every registered key is
    there, empty when nothing of its kind ran)."""
    out: dict[str, list[Stopped]] = {backend_class(n).cancel_key: [] for n in REGISTRY}
    seen: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        seen.setdefault(rec.get("backend", "slurm"), []).append(rec)
    for name, recs in seen.items():
        for stopped in get(name).cancel(recs, live_jobs, dry_run):
            out.setdefault(stopped.key, []).append(stopped)
    return out
