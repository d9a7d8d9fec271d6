"""The cluster ASHA proof's trial (tests/test_cluster_asha.py): a learning curve whose ranking
is known, ``val_loss = q / 81 + 1 / epoch`` with ``q = 37 * i mod 81`` (the trials' order is
not their rank), ``epochs`` epochs of ``epoch_time`` s each.

It resumes bit-exactly: after each epoch's report it keeps the epoch in ``epoch.json`` (its
checkpoint) and, when Slurm asked it to stop (``scontrol requeue``: TERM), exits for requeue at
that epoch boundary; the next attempt starts at the epoch after. Every epoch it runs is
appended to ``epochs.txt`` in its trial directory (the test counts them).
"""

import json
import os
import sys
import time

import slurmkit
from slurmkit.runtime import preemption

args = dict(a.split("=", 1) for a in sys.argv[1:])
i, epochs, pause = int(args["i"]), int(args["epochs"]), float(args["epoch_time"])
q = 37 * i % 81
here = os.environ["SLURMKIT_TRIAL_DIR"]
checkpoint = os.path.join(here, "epoch.json")
preemption.install()
try:
    with open(checkpoint) as fh:
        done = json.load(fh)["epoch"]
except FileNotFoundError:
    done = 0
for epoch in range(done + 1, epochs + 1):
    time.sleep(pause)
    with open(os.path.join(here, "epochs.txt"), "a") as fh:
        fh.write(f"{epoch}\n")
    slurmkit.report(step=epoch, val_loss=q / 81 + 1 / epoch)  # raises Pruned at a lost rung
    with open(checkpoint + ".tmp", "w") as fh:
        json.dump({"epoch": epoch}, fh)
    os.replace(checkpoint + ".tmp", checkpoint)
    if preemption.should_stop():
        preemption.exit_for_requeue()
