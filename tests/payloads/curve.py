"""A synthetic learning curve for search tests: ``loss = q + 1/epoch`` for epoch 1..epochs.

Parameters (Hydra style): q (the trial's quality: lower is better), epochs. It reports every
epoch with ``slurmkit.report(step=epoch, val_loss=...)`` and appends the epoch to
``epochs.txt`` in its trial directory (the tests count the epochs run; a rank > 0, from
``RANK`` or ``SLURM_PROCID`` in a step, to ``epochs-rank{R}.txt``). ``catch=1``: it catches
``slurmkit.Pruned`` and writes ``cleaned`` before it ends. ``nan_at=E``: the loss is NaN from
epoch E on.
"""

import math
import os
import sys

import slurmkit

args = dict(a.split("=", 1) for a in sys.argv[1:])
q, epochs = float(args["q"]), int(args.get("epochs", 9))
nan_at = int(args.get("nan_at", 0))
here = os.environ["SLURMKIT_TRIAL_DIR"]
rank = os.environ.get("RANK") or (
    os.environ.get("SLURM_PROCID", "0") if "SLURM_STEP_ID" in os.environ else "0"
)
log = os.path.join(here, "epochs.txt" if rank == "0" else f"epochs-rank{rank}.txt")
try:
    for epoch in range(1, epochs + 1):
        with open(log, "a") as fh:
            fh.write(f"{epoch}\n")
        loss = math.nan if nan_at and epoch >= nan_at else q + 1 / epoch
        slurmkit.report(step=epoch, val_loss=loss)
except slurmkit.Pruned:
    if args.get("catch") == "1":
        open(os.path.join(here, "cleaned"), "w").close()
    raise
