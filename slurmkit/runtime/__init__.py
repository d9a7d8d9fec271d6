"""Code that runs inside jobs: stdlib only at import, nothing from the login-node side.

Training code uses :func:`params` and :func:`report`; Slurm runs ``python -m slurmkit.runtime``.
"""

from .report import params, report, trial_dir

__all__ = ["params", "report", "trial_dir"]
