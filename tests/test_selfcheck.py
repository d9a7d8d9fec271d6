"""The in-container self-check: torch, GPUs against the allocation, NCCL, the shared path."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest
import torch

from slurmkit.runtime import selfcheck
from slurmkit.runtime.selfcheck import EXIT_FAILED, expected_gpus


def fake_torch(gpus: int, nccl: object = (2, 21, 5)) -> types.SimpleNamespace:
    def version() -> object:
        if isinstance(nccl, Exception):
            raise nccl
        return nccl

    cuda = types.SimpleNamespace(
        is_available=lambda: gpus > 0,
        device_count=lambda: gpus,
        nccl=types.SimpleNamespace(version=version),
    )
    return types.SimpleNamespace(__version__="2.13.0", cuda=cuda)


@pytest.fixture
def gpus(monkeypatch):
    """``gpus(n)``: torch as this process imports it now sees ``n`` GPUs."""

    def set_count(n: int, nccl: object = (2, 21, 5)) -> None:
        monkeypatch.setitem(sys.modules, "torch", fake_torch(n, nccl))

    return set_count


@pytest.mark.parametrize(
    "env, want",
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4),
        ({"CUDA_VISIBLE_DEVICES": "GPU-8a1b,GPU-77ce"}, 2),
        ({"CUDA_VISIBLE_DEVICES": ""}, 0),
        ({"CUDA_VISIBLE_DEVICES": "NoDevFiles"}, 0),
        ({"CUDA_VISIBLE_DEVICES": "0,-1,2"}, 1),
        ({"CUDA_VISIBLE_DEVICES": "3", "SLURM_GPUS_ON_NODE": "8"}, 1),  # --gpus-per-task=1
        ({"SLURM_GPUS_ON_NODE": "8", "SLURM_GPUS_PER_NODE": "4"}, 8),
        ({"SLURM_GPUS_PER_NODE": "h100:8"}, 8),
        ({"SLURM_GPUS_PER_NODE": "a100:2,v100:1"}, 3),
        ({"SLURM_JOB_ID": "7"}, 0),  # a CPU-only allocation
        ({}, None),
    ],
)
def test_expected_gpus(env, want):
    assert expected_gpus(env)[0] == want


def test_all_ok_on_a_cpu_allocation(gpus, tmp_path):
    gpus(0)
    checks = selfcheck.run(str(tmp_path), {"SLURM_JOB_ID": "7"})
    assert [(c.name, c.ok) for c in checks] == [("torch", True), ("gpus", True), ("path", True)]
    assert checks[1].detail == "0 GPUs (a CPU-only allocation)"
    assert os.listdir(tmp_path) == []  # the probe file is gone


def test_gpus_missing_in_the_container(gpus, tmp_path):
    gpus(0)
    checks = selfcheck.run(str(tmp_path), {"SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "0,1"})
    [bad] = [c for c in checks if not c.ok]
    assert bad.name == "gpus"
    assert bad.detail.startswith(
        "torch sees 0 GPUs, the allocation gives 2 (CUDA_VISIBLE_DEVICES=0,1)"
    )
    assert "NVIDIA_VISIBLE_DEVICES" in bad.detail


def test_gpus_seen_on_a_cpu_allocation(gpus, tmp_path):
    gpus(8)
    [bad] = [c for c in selfcheck.run(str(tmp_path), {"SLURM_JOB_ID": "7"}) if not c.ok]
    assert bad.name == "gpus" and "not given" in bad.detail


def test_gpus_and_nccl_ok(gpus, tmp_path):
    gpus(8)
    checks = selfcheck.run(str(tmp_path), {"SLURM_GPUS_ON_NODE": "8"})
    assert all(c.ok for c in checks)
    assert [c.detail for c in checks][1:3] == ["8 GPUs (SLURM_GPUS_ON_NODE=8)", "NCCL 2.21.5"]


def test_nccl_old_style_and_missing(gpus, tmp_path):
    gpus(1, nccl=2708)
    assert selfcheck.run(str(tmp_path), {})[2].detail == "NCCL 2.7.8"
    gpus(1, nccl=RuntimeError("NCCL not built"))
    nccl = selfcheck.run(str(tmp_path), {})[2]
    assert not nccl.ok and nccl.detail == "no NCCL: NCCL not built"


def test_torch_missing(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "torch", None)
    checks = selfcheck.run(str(tmp_path), {"SLURM_GPUS_ON_NODE": "8"})
    assert [(c.name, c.ok) for c in checks] == [("torch", False), ("path", True)]
    assert checks[0].detail.startswith("cannot import torch:")


@pytest.mark.parametrize(
    "path, reason",
    [
        ("/proc/self", "cannot create a file in it"),  # no file can be created under /proc
        ("/nonexistent/shared", "not a directory here: is it mounted?"),
    ],
)
def test_path_fails(path, reason):
    check = selfcheck.check_path(path)
    assert not check.ok and check.detail.startswith(f"{path}: {reason}")


def test_path_from_the_environment(tmp_path):
    sweep, submit = tmp_path / "sweep", tmp_path / "submit"
    sweep.mkdir()
    submit.mkdir()
    env = {"SLURMKIT_SWEEP_DIR": str(sweep), "SLURM_SUBMIT_DIR": str(submit)}
    assert selfcheck.run(None, env)[-1].detail == f"{sweep} writable"
    assert selfcheck.run(None, {"SLURM_SUBMIT_DIR": str(submit)})[-1].detail == f"{submit} writable"
    assert selfcheck.run(None, {})[-1].detail == "no shared path given"


def cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "SLURMKIT_", "CUDA_VISIBLE"))
    }
    return subprocess.run(
        [sys.executable, "-m", "slurmkit.runtime.selfcheck", *args],
        capture_output=True,
        text=True,
        env={**base, **env},
        timeout=120,
    )


@pytest.mark.slow
def test_cli_ok(tmp_path):
    out = cli(str(tmp_path), SLURM_JOB_ID="7", SLURM_PROCID="3")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("selfcheck OK: ") and " rank 3: torch " in out.stdout
    assert out.stdout.rstrip().endswith(f"0 GPUs (a CPU-only allocation), {tmp_path} writable")
    assert out.stdout.count("\n") == 1


@pytest.mark.slow
def test_cli_fails_with_one_line_per_failed_check(tmp_path):
    seen = torch.cuda.device_count()
    out = cli(
        "/proc/self", CUDA_VISIBLE_DEVICES=",".join(map(str, range(seen + 2))), SLURM_JOB_ID="7"
    )
    assert out.returncode == EXIT_FAILED == 3
    assert out.stdout == ""
    lines = out.stderr.splitlines()
    assert [ln.split(":")[0:2] for ln in lines] == [
        ["selfcheck FAILED", " gpus"],
        ["selfcheck FAILED", " path"],
    ]


def test_cli_usage_error():
    assert cli("a", "b").returncode == 2


@pytest.mark.slow
def test_torch_without_numpy_is_checked_without_its_warning(tmp_path):
    """torch warns "Failed to initialize NumPy" on images without numpy: the self-check's
    output stays one line."""
    import subprocess
    import sys

    blocker = tmp_path / "numpy.py"
    blocker.write_text("raise ModuleNotFoundError(\"No module named 'numpy'\", name='numpy')\n")
    env = {**__import__("os").environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run(
        [sys.executable, "-m", "slurmkit.runtime.selfcheck", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "NumPy" not in proc.stderr and "torch" in proc.stdout
