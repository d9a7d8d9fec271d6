"""Host memory a job may still take: MemAvailable capped by its cgroups (v2 and v1)."""

from __future__ import annotations

from pathlib import Path

from slurmkit.runtime import memory

GiB = 1 << 30


def _tree(
    tmp_path: Path, cgroup_line: str, files: dict[str, str], available_kib: int
) -> tuple[str, str]:
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(f"MemTotal: 1 kB\nMemAvailable: {available_kib} kB\n")
    (proc / "self" / "cgroup").write_text(cgroup_line + "\n")
    for rel, text in files.items():
        (cgroups / rel).parent.mkdir(parents=True, exist_ok=True)
        (cgroups / rel).write_text(text + "\n")
    return str(proc), str(cgroups)


def test_v2_the_tightest_ancestor_limit_wins_counting_inactive_cache_as_free(tmp_path):
    proc, cgroups = _tree(
        tmp_path,
        "0::/slurm/job_7/step_batch",
        {
            "slurm/job_7/memory.max": str(10 * GiB),
            "slurm/job_7/memory.current": str(5 * GiB),
            "slurm/job_7/memory.stat": f"anon {3 * GiB}\ninactive_file {GiB}\nactive_file 7\n",
            "slurm/job_7/step_batch/memory.max": "max",
            "slurm/job_7/step_batch/memory.current": str(3 * GiB),
            "slurm/memory.max": str(100 * GiB),
            "slurm/memory.current": str(50 * GiB),
        },
        available_kib=64 * 1024 * 1024,
    )
    assert memory.available(proc, cgroups) == 6 * GiB


def test_v1_memory_controller_and_unlimited_levels(tmp_path):
    proc, cgroups = _tree(
        tmp_path,
        "4:memory:/pod/ctr\n0::/",
        {
            "memory/pod/ctr/memory.limit_in_bytes": "9223372036854771712",
            "memory/pod/ctr/memory.usage_in_bytes": str(GiB),
            "memory/pod/memory.limit_in_bytes": str(8 * GiB),
            "memory/pod/memory.usage_in_bytes": str(5 * GiB),
        },
        available_kib=64 * 1024 * 1024,
    )
    assert memory.available(proc, cgroups) == 3 * GiB


def test_no_limits_gives_memavailable_and_nothing_readable_gives_zero(tmp_path):
    proc, cgroups = _tree(tmp_path, "0::/", {}, available_kib=2 * 1024 * 1024)
    assert memory.available(proc, cgroups) == 2 * GiB
    assert memory.available(str(tmp_path / "none"), str(tmp_path / "none")) == 0
    assert memory.available() > 0  # this (Linux) machine: /proc/meminfo at least
