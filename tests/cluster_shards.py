"""Pytest plugin: split the ``cluster`` tests between independent test clusters.

``SLURMKIT_TEST_SHARD=K/N`` keeps, of the tests marked ``cluster``, those whose file is in shard K
of N (1 <= K <= N); the other tests are left alone. ``tests/suite.sh`` runs one pytest process per
shard, each on a cluster of its own, side by side: the cluster tests mostly wait on Slurm's timers,
not on the CPU.

A test file is the unit: a module's fixtures (a sweep run once for several tests, a cluster
reconfigured for a while) and its tests' order stay on one cluster. Files are assigned by their
weight in ``SECONDS``, heaviest first (ties: by name), each to the lightest shard so far (ties:
the lower K), so the shards take about the same time. The assignment does not depend on which
tests were selected: a file runs in the same shard whatever the arguments.
"""

from __future__ import annotations

import os
import re

import pytest

ENV = "SLURMKIT_TEST_SHARD"
# Seconds each file's cluster tests took on the 2-core machine (pytest --durations=0 -m cluster,
# setup + call + teardown summed per file; the mean of a one-process run and a two-shard run, both
# beside other work: CPU-bound tests vary by up to 2x). A new file with cluster tests gets its line
# here (tests/test_cluster_shards.py fails without one); a figure off by a few seconds only moves
# the balance.
SECONDS: dict[str, float] = {
    "test_cluster_requeue.py": 448,
    "test_cluster_hang.py": 190,
    "test_cluster_report.py": 122,
    "test_cluster_executor.py": 108,
    "test_cluster_sweeps.py": 106,
    "test_cluster_executor_limits.py": 90,
    "test_cluster_jobs.py": 74,
    "test_cluster_release.py": 76,
    "test_cluster_asha.py": 35,
    "test_backend_submitit.py": 59,
    "test_cluster_search.py": 40,
    "test_readme.py": 54,
    "test_checkpoint_mirror.py": 42,
    "test_functions.py": 42,
    "test_notebook.py": 40,
    "test_distributed.py": 33,
    "test_data_block.py": 19,
    "test_cluster_nodes.py": 20,
    "test_cluster_preflight.py": 15,
    "test_pollcache.py": 4,
    "test_papercuts.py": 2,
    "test_sweep_api.py": 4,
    "test_logs.py": 3,
    "test_doctor.py": 1,
    "test_submit_limits.py": 1,
}


def parse(spec: str) -> tuple[int, int]:
    """``"K/N"`` as (K, N); UsageError when it is not one of N shards."""
    m = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", spec)
    if not m or not 1 <= int(m[1]) <= int(m[2]):
        raise pytest.UsageError(f"{ENV}={spec!r}: want K/N with 1 <= K <= N, e.g. 1/2")
    return int(m[1]), int(m[2])


def assign(files: set[str] | list[str], shards: int) -> dict[str, int]:
    """Each file (a ``tests/`` file name, its weight from ``SECONDS``) to a shard in 1..shards.

    Every file in ``SECONDS`` takes part, so that a file's shard does not depend on the other
    files given; a file without a weight counts as an average one."""
    default = sum(SECONDS.values()) / len(SECONDS) if SECONDS else 60.0
    pool = set(SECONDS) | set(files)
    load = [0.0] * shards
    owner: dict[str, int] = {}
    for name in sorted(pool, key=lambda f: (-SECONDS.get(f, default), f)):
        k = min(range(shards), key=lambda i: (load[i], i))
        load[k] += SECONDS.get(name, default)
        owner[name] = k + 1
    return {name: owner[name] for name in files}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    spec = os.environ.get(ENV, "")
    if not spec:
        return
    k, n = parse(spec)
    cluster = [item for item in items if item.get_closest_marker("cluster") is not None]
    owner = assign({item.path.name for item in cluster}, n)
    drop = {id(item) for item in cluster if owner[item.path.name] != k}
    if drop:
        config.hook.pytest_deselected(items=[item for item in items if id(item) in drop])
        items[:] = [item for item in items if id(item) not in drop]
