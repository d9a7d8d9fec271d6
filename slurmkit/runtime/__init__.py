"""Code that runs inside jobs: stdlib only at import, nothing from the login-node side.

Training code uses :func:`params`, :func:`report` (and :class:`Pruned`), :mod:`.preemption`,
:class:`Checkpointer` and :mod:`.torchstate`; Slurm runs ``python -m slurmkit.runtime``.
"""

from __future__ import annotations

import importlib
from typing import Any

from .report import Pruned, params, report, trial_dir

_LAZY = {"Checkpointer": "checkpoint", "CheckpointError": "checkpoint", "agree_step": "checkpoint"}

__all__ = ["Pruned", "params", "report", "trial_dir", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
