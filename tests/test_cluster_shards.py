"""tests/suite.sh splits the cluster tests between clusters (tests/cluster_shards.py): every
cluster test runs in exactly one shard, files stay whole, and the shards weigh about the same."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import cluster_shards
import pytest
from cluster_shards import SECONDS, assign, parse

TESTS = Path(__file__).resolve().parent


def cluster_files() -> set[str]:
    """The test files that mark tests ``cluster`` (by their text: no collection)."""
    marked = re.compile(r"\bpytest\.mark\.cluster\b")
    return {p.name for p in TESTS.glob("test_*.py") if marked.search(p.read_text())}


def test_every_file_with_cluster_tests_has_a_weight_and_every_weight_a_file():
    files = cluster_files()
    assert files, "no cluster tests found"
    missing = sorted(files - set(SECONDS))
    assert not missing, f"add their seconds (pytest --durations=0 -m cluster) to SECONDS: {missing}"
    assert sorted(set(SECONDS) - files) == []


@pytest.mark.parametrize("n", [1, 2, 3])
def test_each_file_lands_in_exactly_one_shard_and_the_shards_weigh_about_the_same(n):
    files = cluster_files()
    owner = assign(files, n)
    assert set(owner) == files and set(owner.values()) <= set(range(1, n + 1))
    load = [sum(SECONDS[f] for f in files if owner[f] == k) for k in range(1, n + 1)]
    assert max(load) - min(load) <= max(SECONDS.values())  # greedy, heaviest first


def test_a_files_shard_does_not_depend_on_the_other_files_selected_or_their_order():
    files = sorted(cluster_files())
    whole = assign(files, 2)
    for name in files:
        assert assign([name], 2) == {name: whole[name]}
    assert assign(list(reversed(files)), 2) == whole


def test_a_file_without_a_weight_still_lands_in_one_shard(monkeypatch):
    monkeypatch.setattr(cluster_shards, "SECONDS", {"test_a.py": 30.0, "test_b.py": 10.0})
    assert cluster_shards.assign({"test_a.py", "test_b.py", "test_new.py"}, 2) == {
        "test_a.py": 1,
        "test_b.py": 2,
        "test_new.py": 2,
    }


@pytest.mark.parametrize("spec", ["", "2", "0/2", "3/2", "1/0", "a/b", "1/2/3"])
def test_a_bad_shard_is_a_usage_error(spec):
    with pytest.raises(pytest.UsageError, match="SLURMKIT_TEST_SHARD"):
        parse(spec)


def collected(shard: str | None) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if k != cluster_shards.ENV}
    if shard:
        env[cluster_shards.ENV] = shard
    files = sorted(str(TESTS / f) for f in cluster_files())
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pytest",
            "--collect-only",
            "-q",
            "-p",
            "no:cacheprovider",
            "-m",
            "cluster",
            *files,
        ],
        env=env,
        cwd=TESTS.parent,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow  # three pytest collections (the twin above checks the assignment itself)
def test_the_shards_of_a_collection_partition_its_cluster_tests():
    runs = {shard: collected(shard) for shard in (None, "1/2", "2/2")}
    ids = {}
    for shard, proc in runs.items():
        out = proc.communicate(timeout=300)[0]
        assert proc.returncode == 0, out
        ids[shard] = {line for line in out.splitlines() if "::" in line}
    one, two = ids["1/2"], ids["2/2"]
    assert one and two and not one & two
    assert one | two == ids[None]
    files = {nodeid.split("::")[0].rpartition("/")[2] for nodeid in ids[None]}
    assert files == cluster_files()
    owner = assign(files, 2)
    assert all(owner[i.split("::")[0].rpartition("/")[2]] == 1 for i in one)
