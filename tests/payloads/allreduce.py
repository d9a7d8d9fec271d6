"""Test payload: torch.distributed all_reduce (gloo, CPU) through slurmkit.runtime.distributed."""

import json
import os
import socket

import torch
import torch.distributed as dist

from slurmkit.runtime import distributed

info = distributed.init()
value = torch.tensor([float(info.rank + 1)])
dist.all_reduce(value)
record = {
    "rank": info.rank,
    "world_size": info.world_size,
    "local_rank": info.local_rank,
    "node_rank": info.node_rank,
    "sum": value.item(),
    "host": socket.gethostname(),
    "master": f"{info.master_addr}:{info.master_port}",
    "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "SLURM_CPUS_PER_TASK")},
}
with open(os.path.join(os.environ["SLURMKIT_TRIAL_DIR"], f"rank-{info.rank}.json"), "w") as fh:
    json.dump(record, fh)
dist.destroy_process_group()
