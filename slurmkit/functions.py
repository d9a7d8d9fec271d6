"""Function sweeps: a Python callable run once per trial, with the same sweep directory, job
arrays, containers, requeue and budgets as a command sweep.

The callable is pickled (cloudpickle when installed: notebooks' functions and closures need
it) into ``SWEEP_DIR/function.pkl``; each trial's command is ``python -m
slurmkit.runtime.fncall``, which calls it with the trial's parameters as keyword arguments.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import tempfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import UserError
from .handle import Sweep
from .runtime.fncall import FUNCTION, RESULT, dumps

SOURCE = "sweep_fn()"  # the "file" of errors in its arguments
COMMAND = ["python", "-m", "slurmkit.runtime.fncall"]


def pickled(fn: Callable[..., Any]) -> bytes:
    """``fn`` as bytes that a job's Python loads back; UserError when it cannot be pickled."""
    if not callable(fn):
        raise UserError(f"{fn!r} is not callable", file=SOURCE, key="fn")
    try:
        return dumps(fn)
    except Exception as exc:  # what pickling raises varies: TypeError, PicklingError, ...
        raise UserError(
            f"{getattr(fn, '__name__', fn)!r} cannot be sent to a job: {exc}",
            file=SOURCE,
            key="fn",
            hint="a function that holds an open file, a lock or a connection cannot be "
            "pickled: open it inside the function",
        ) from None


def spec(
    fn: Callable[..., Any],
    params: Mapping[str, Any] | None = None,
    overrides: Sequence[str] = (),
    **spec_keys: Any,
) -> Any:
    """The sweep spec of a function sweep: ``spec_keys`` are spec keys (resources, container,
    requeue, name, ...) over the profile and user config, as a spec file's would be."""
    from . import spec as spec_mod

    for key in ("command", "args"):
        if key in spec_keys:
            raise UserError(f"a function sweep sets {key} itself", file=SOURCE, key=key)
    space = dict(params or {})
    for name in space:
        if not (isinstance(name, str) and name.isidentifier()):
            raise UserError(
                f"{name!r} cannot be a keyword argument",
                file=SOURCE,
                key=f"params.{name}",
                hint="function sweeps pass parameters as keyword arguments: name them so",
            )
    name = spec_keys.pop("name", None) or _name(fn)
    data = {"name": name, "command": COMMAND, "args": "none", "params": space, **spec_keys}
    with tempfile.TemporaryDirectory(prefix="slurmkit-fn-") as tmp:
        path = os.path.join(tmp, "spec.yaml")
        try:
            text = json.dumps(data)  # JSON is YAML: the same loader as spec files
        except (TypeError, ValueError) as exc:
            raise UserError(f"a spec value is not plain data: {exc}", file=SOURCE) from None
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text)
        try:
            loaded = spec_mod.load(path, overrides)
        except UserError as exc:
            if exc.file == path:
                exc.file = SOURCE
            raise
    return dataclasses.replace(loaded, source=SOURCE)


def _name(fn: Callable[..., Any]) -> str:
    raw = getattr(fn, "__name__", "") or type(fn).__name__
    clean = "".join(c if c.isalnum() or c in "_.-" else "-" for c in raw).strip("-_.")
    return clean or "fn"


def sweep_fn(
    fn: Callable[..., Any],
    params: Mapping[str, Any] | None = None,
    *,
    backend: str = "auto",
    sweep_dir: str | None = None,
    overrides: Sequence[str] = (),
    progress: bool = True,
    **spec_keys: Any,
) -> Sweep:
    """Run ``fn(**trial_params)`` once per trial of ``params`` (a spec's ``params`` block:
    lists, ``range(...)``, distributions with ``num_samples``) and return the :class:`Sweep`.

    ``slurmkit.report()`` works inside ``fn``; its return value is the trial's result
    (:func:`result`). On the local backend the trials run here and the call returns when they
    have ended, with a progress bar (``progress``) and a note when no cluster answered; on
    Slurm it returns once the array is queued (``.wait()`` follows it).
    """
    from .handle import submit_reported

    blob = pickled(fn)  # before anything is created
    handle = Sweep(spec(fn, params, overrides, **spec_keys))

    def keep_function(_target: Any, sweep_dir_: Any) -> None:
        with open(os.path.join(sweep_dir_.root, FUNCTION), "wb") as fh:
            fh.write(blob)

    assert handle.spec is not None
    return handle.submitted_as(
        submit_reported(handle.spec, backend, sweep_dir, progress, then=keep_function)
    )


def result(sweep_dir: str, trial: int | str) -> Any:
    """A function trial's return value (``trial``: index or id prefix); UserError when it has
    none (yet)."""
    from .steer import find_trial

    row = find_trial(sweep_dir, str(trial))
    path = os.path.join(sweep_dir, "trials", row["id"], RESULT)
    try:
        with open(path, "rb") as fh:
            return pickle.load(fh)
    except FileNotFoundError:
        raise UserError(
            f"trial {row['id']} has no result", hint="it has not finished, or it failed"
        ) from None
