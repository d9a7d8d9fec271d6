"""Test payload: a 2-rank gloo loop that checkpoints at step 2; on its first attempt rank 1 stops
at step 3 (it never joins the all_reduce that rank 0 then waits in). A resumed attempt starts
after its checkpoint and completes. Each rank leaves rank-R.json (its attempt and first step)."""

import json
import os
import time

import torch
import torch.distributed as dist

import slurmkit
from slurmkit.runtime import distributed
from slurmkit.runtime.checkpoint import Checkpointer


def stuck_forever() -> None:
    time.sleep(3600)


info = distributed.init(timeout=300)
trial = os.environ["SLURMKIT_TRIAL_DIR"]
attempt = os.environ["SLURMKIT_ATTEMPT"]
checkpoints = Checkpointer(os.path.join(trial, "ckpt"))
found = checkpoints.resume()
first = 0 if found is None else found[1]["step"] + 1
for step in range(first, 6):
    if step == 3 and attempt == "1" and info.rank == 1:
        stuck_forever()
    value = torch.tensor([1.0])
    dist.all_reduce(value)
    slurmkit.heartbeat()
    if step == 2:
        checkpoints.save({"step": step}, step)
    time.sleep(0.3)
with open(os.path.join(trial, f"rank-{info.rank}.json"), "w") as fh:
    json.dump({"attempt": attempt, "first": first, "node": os.environ.get("SLURMD_NODENAME")}, fh)
dist.destroy_process_group()
