"""Test payloads: functions that tests/test_cluster_executor.py submits through slurmkit.executor
(a module of its own: the job imports it by name, from PYTHONPATH=tests/payloads)."""

from __future__ import annotations

import os
import shutil
import socket
import time
from pathlib import Path

import submitit


def square(x: int) -> int:
    return x * x


def timed(i: int, folder: str) -> dict:
    """Sleeps a moment; records when it ran (to count how many ran at once)."""
    start = time.time()
    time.sleep(0.5)
    return {"i": i, "start": start, "end": time.time(), "host": socket.gethostname()}


def allreduce() -> dict:
    """torch.distributed all_reduce (gloo, CPU) through slurmkit.runtime.distributed."""
    import torch
    import torch.distributed as dist

    from slurmkit.runtime import distributed

    info = distributed.init()
    value = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(value)
    dist.destroy_process_group()
    return {
        "rank": info.rank,
        "world_size": info.world_size,
        "local_rank": info.local_rank,
        "sum": value.item(),
        "host": socket.gethostname(),
        "master": f"{info.master_addr}:{info.master_port}",
    }


class SumOfSquares(submitit.helpers.Checkpointable):
    """Adds i*i for i < n, one step every ``pause`` s; resumes from its checkpointed state.

    ``progress`` (a file) tells the test how far it got; ``starts`` records where each attempt
    began (a resumed run does not begin at 0)."""

    def __init__(self, progress: str, pause: float = 0.05) -> None:
        self.progress = progress
        self.pause = pause
        self.state = (0, 0)  # (next i, sum so far): one assignment, never half-updated
        self.starts: list[int] = []

    def __call__(self, n: int) -> dict:
        self.starts = [*self.starts, self.state[0]]
        while self.state[0] < n:
            i, total = self.state
            time.sleep(self.pause)
            self.state = (i + 1, total + i * i)
            Path(self.progress).write_text(f"{self.state[0]} {os.environ.get('SLURM_JOB_ID')}")
        return {"sum": self.state[1], "starts": self.starts, "scontrol": shutil.which("scontrol")}


def sleeper(seconds: float) -> str:
    """Not checkpointable: sleeps, then returns."""
    time.sleep(seconds)
    return "slept"


def env_of(*names: str) -> dict:
    """The job's values of the environment variables ``names`` (None when unset)."""
    return {name: os.environ.get(name) for name in names}
