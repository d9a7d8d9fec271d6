"""A full disk and a read-only filesystem are clear errors (exit 1, one line, no traceback),
and a sweep that could not be written leaves nothing behind. Needs root for tmpfs mounts."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import PAYLOAD, run_cli


def _mount(path: Path, *options: str) -> None:
    path.mkdir(exist_ok=True)
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", ",".join(options), "tmpfs", str(path)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")


@pytest.fixture
def small(tmp_path):
    where = tmp_path / "small"
    _mount(where, "size=256k")
    yield where
    subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(directory: Path) -> None:
    """Leave no free block (ENOSPC on the next write of any size)."""
    try:
        with open(directory / "filler", "wb", buffering=0) as fh:
            while True:
                fh.write(b"x" * 4096)
    except OSError:  # ENOSPC: full
        pass


def test_a_full_disk_is_a_clear_error_and_leaves_no_sweep_behind(small, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(f"command: [python, {PAYLOAD}]\nparams: {{x: 'range(0,50)'}}\n")
    _fill(small)
    for args in ([], ["--json"]):
        proc = run_cli(
            "sweep", str(spec), f"output_root={small / 'runs'}", "--backend", "local", *args
        )
        assert proc.returncode == 1, proc.stderr
        assert "No space left on device" in proc.stderr and "Traceback" not in proc.stderr
        assert "filesystem is full" in proc.stderr
        if args:
            assert json.loads(proc.stderr)["exit_code"] == 1
    leftovers = list((small / "runs").rglob("*")) if (small / "runs").exists() else []
    assert leftovers == []


@pytest.mark.slow
def test_a_read_only_sweep_directory_is_a_clear_error(tmp_path):
    where = tmp_path / "ro"
    _mount(where, "size=4m")
    try:
        spec = tmp_path / "s.yaml"
        spec.write_text(f"command: [python, {PAYLOAD}]\nparams: {{x: [1, 2]}}\n")
        made = run_cli("sweep", str(spec), f"output_root={where}", "--backend", "local", "--json")
        root = json.loads(made.stdout)["sweep_dir"]
        subprocess.run(["mount", "-o", "remount,ro", str(where)], check=True)
        assert run_cli("status", root).returncode == 0  # reading still works
        for args in (["cancel", root], ["sweep", "--resume", root, "--backend", "local"]):
            proc = run_cli(*args)
            assert proc.returncode == 1, (args, proc.stderr)
            assert "Read-only file system" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        os.sync()
