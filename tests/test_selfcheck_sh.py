"""The container self-check (``runtime/selfcheck.sh``): it needs only a POSIX shell, so it
passes in images without slurmkit or Python, and says which checks ran."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from slurmkit import launch

BUSYBOX = "/bin/busybox"


def check(
    tmp_path: Path, env: dict[str, str], *, shell: str = "sh", path: str = "/usr/bin:/bin"
) -> subprocess.CompletedProcess[str]:
    """The self-check as the step runs it (``sh -c SCRIPT slurmkit-selfcheck CMD...``)."""
    argv = launch.self_check()
    argv[0] = shell
    return subprocess.run(
        [*argv, "sh", "-c", 'echo "RAN $*"', "cmd", "a b", "c"],
        env={"PATH": path, **env},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )


@pytest.fixture
def shared(tmp_path: Path) -> Path:
    d = tmp_path / "shared"
    d.mkdir()
    return d


@pytest.mark.parametrize("shell", ["sh", "dash", "bash"])
def test_passes_and_execs_the_command_with_its_arguments(tmp_path, shared, shell):
    if not shutil.which(shell):
        pytest.skip(f"no {shell}")
    out = check(tmp_path, {"SLURMKIT_SWEEP_DIR": str(shared)}, shell=shell)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "RAN a b c"
    assert f"path {shared} writable" in out.stdout and "not run: torch" in out.stdout
    assert "no python3 in the image" in out.stderr or "cannot import torch" in out.stderr
    assert list(shared.iterdir()) == []  # its probe file is gone


def test_a_missing_mount_fails_before_the_command(tmp_path):
    out = check(tmp_path, {"SLURMKIT_SWEEP_DIR": str(tmp_path / "not-mounted")})
    assert out.returncode == 3 and "RAN" not in out.stdout
    assert "FAILED" in out.stderr and "not a directory here: is it mounted?" in out.stderr


def fake_nvidia_smi(bin_dir: Path, gpus: int) -> None:
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / "nvidia-smi"
    lines = "".join(f"echo 'GPU {i}: NVIDIA H200 (UUID: GPU-{i})'\n" for i in range(gpus))
    tool.write_text(f"#!/bin/sh\n{lines}")
    tool.chmod(0o755)


def test_gpus_counted_against_the_allocation_and_nccl_only_warns(tmp_path, shared):
    fake_nvidia_smi(tmp_path / "bin", 2)
    env = {"SLURMKIT_SWEEP_DIR": str(shared), "CUDA_VISIBLE_DEVICES": "0,1", "LD_LIBRARY_PATH": ""}
    path = f"{tmp_path / 'bin'}:/usr/bin:/bin"
    out = check(tmp_path, env, path=path)
    if "ldconfig" in out.stdout:  # this machine has NCCL: the warning case needs it absent
        pytest.skip("libnccl.so is installed on this machine")
    assert out.returncode == 0, out.stderr
    assert "2 GPUs (CUDA_VISIBLE_DEVICES=0,1; 2 seen by nvidia-smi)" in out.stdout
    assert "nccl: no libnccl.so found" in out.stderr and "not run: nccl, torch" in out.stdout

    libs = tmp_path / "nccl-lib"
    libs.mkdir()
    (libs / "libnccl.so.2").write_bytes(b"")
    out = check(tmp_path, {**env, "LD_LIBRARY_PATH": f"/nowhere:{libs}"}, path=path)
    assert out.returncode == 0 and f"NCCL ({libs}/libnccl.so.2)" in out.stdout

    out = check(tmp_path, {**env, "CUDA_VISIBLE_DEVICES": "0,1,2,3"}, path=path)
    assert out.returncode == 3 and "RAN" not in out.stdout
    assert "gpus: 2 visible (nvidia-smi), the allocation gives 4" in out.stderr


@pytest.mark.slow
def test_torch_is_checked_when_the_image_has_it(tmp_path, shared):
    pytest.importorskip("torch")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"  # this venv's python, with CPU torch
    python3.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python3.chmod(0o755)
    path = f"{bin_dir}:/usr/bin:/bin"
    out = check(tmp_path, {"SLURMKIT_SWEEP_DIR": str(shared), "SLURM_JOB_ID": "7"}, path=path)
    assert out.returncode == 0, out.stderr
    import torch

    assert f"torch {torch.__version__} (0 GPUs, NCCL -)" in out.stdout
    assert "0 GPUs (a CPU-only allocation" in out.stdout and "not run" not in out.stdout

    fake_nvidia_smi(bin_dir, 1)  # the node has a GPU that torch does not see
    out = check(
        tmp_path, {"SLURMKIT_SWEEP_DIR": str(shared), "CUDA_VISIBLE_DEVICES": "0"}, path=path
    )
    assert out.returncode == 3 and "torch: torch" in out.stderr and "sees 0 GPUs" in out.stderr


@pytest.fixture(scope="module")
def busybox() -> str:
    """Debian's busybox-static, installed as the project's other packages are."""
    if not os.path.exists(BUSYBOX) and shutil.which("apt-get") and os.geteuid() == 0:
        install = "apt-get install -y -q --no-install-recommends busybox-static"
        subprocess.run(
            f"{install} || {{ apt-get update -q && {install}; }}",
            shell=True,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            capture_output=True,
        )
    if not os.path.exists(BUSYBOX):
        pytest.skip("busybox-static is not installed and cannot be (apt-get as root)")
    return BUSYBOX


@pytest.mark.slow
def test_green_in_a_root_filesystem_with_only_busybox(tmp_path, busybox):
    """A stock image at its barest: no Python, no slurmkit, no coreutils; busybox's ash."""
    root = tmp_path / "rootfs"
    (root / "bin").mkdir(parents=True)
    (root / "shared").mkdir()
    (root / "dev").mkdir()
    try:  # enroot gives every container a /dev
        os.mknod(root / "dev" / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("cannot make /dev/null in the root filesystem (not root)")
    shutil.copy(busybox, root / "bin" / "busybox")
    for tool in ("sh", "echo", "rm", "hostname", "cat"):
        (root / "bin" / tool).symlink_to("busybox")
    chroot = shutil.which("chroot", path=f"{os.environ['PATH']}:/usr/sbin:/sbin") or "chroot"
    enter = [chroot, str(root)]
    argv = launch.self_check()
    argv[0] = "/bin/sh"
    out = subprocess.run(
        [*enter, *argv, "/bin/sh", "-c", 'echo "RAN $*"', "cmd", "x"],
        env={"PATH": "/bin", "SLURMKIT_SWEEP_DIR": "/shared", "SLURM_JOB_ID": "9"},
        capture_output=True,
        text=True,
    )
    if out.returncode != 0 and "Operation not permitted" in out.stderr:
        pytest.skip(f"cannot chroot here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[-1] == "RAN x"
    ok = next(line for line in out.stdout.splitlines() if line.startswith("selfcheck OK"))
    assert "path /shared writable" in ok and "0 GPUs (a CPU-only allocation" in ok
    assert ok.endswith("(not run: torch)") and "no python3 in the image" in out.stderr
    assert list((root / "shared").iterdir()) == []
