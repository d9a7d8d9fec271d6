"""slurmkit: sweeps, container jobs and resumable checkpoints for Slurm GPU clusters.

Imports stay light: the login-node API (:mod:`slurmkit.sweep`, :mod:`slurmkit.sweepstate`) and
the in-job runtime (:mod:`slurmkit.runtime`) load on first use.
"""

from __future__ import annotations

import importlib
import os as _os
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "report": ("slurmkit.runtime.report", "report"),
    "params": ("slurmkit.runtime.report", "params"),
    "heartbeat": ("slurmkit.runtime.progress", "heartbeat"),
    "Pruned": ("slurmkit.runtime.report", "Pruned"),
    "load": ("slurmkit.spec", "load"),
    "submit": ("slurmkit.sweep", "submit"),
    "resume": ("slurmkit.sweep", "resume"),
    "status": ("slurmkit.sweepstate", "collect"),
    "Sweep": ("slurmkit.handle", "Sweep"),
    "sweep_fn": ("slurmkit.functions", "sweep_fn"),
    "executor": ("slurmkit.executors", "executor"),
    "UserError": ("slurmkit.errors", "UserError"),
}

__all__ = ["__version__", *_LAZY]

if _os.environ.get("SLURMKIT_TRIAL_DIR"):  # in a trial: its stacks can be dumped on a hang
    importlib.import_module("slurmkit.runtime.progress").arm()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'slurmkit' has no attribute {name!r}")
