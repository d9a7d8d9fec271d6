"""The worked ports in docs/porting-sbatch.md render, with the options the guide says; and what
the guide says of spec keys no worked port shows holds (each test names the guide's words)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, assert_shell_ok, run_cli

from slurmkit import launch
from slurmkit import spec as spec_mod
from slurmkit.core.profiles import PROFILES

DOC = ROOT / "docs" / "porting-sbatch.md"
PORTS = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)


def test_the_guide_has_its_three_worked_ports():
    assert len(PORTS) == 3


@pytest.mark.parametrize(
    ("index", "wanted", "unwanted"),
    [
        (0, ["--ntasks-per-node=8", "--cpu-bind=none", "--container-image=nvcr.io#nvidia"], []),
        (
            1,
            ["torchrun", "--nproc-per-node=8", "--wait-all-nodes=1", "slurmkit-env"],
            ["--cpus-per-task"],
        ),
        (
            2,
            ["--mpi=pmix", "--label", "--ntasks=16", "--segment=2", "--no-requeue"],
            ["--container-workdir"],
        ),
    ],
)
def test_each_port_renders(tmp_path: Path, index: int, wanted: list[str], unwanted: list[str]):
    spec = tmp_path / "job.yaml"
    spec.write_text(PORTS[index])
    proc = run_cli("render", str(spec), cwd=tmp_path, env={"SLURMKIT_CONFIG": "/dev/null"})
    assert proc.returncode == 0, proc.stderr
    assert_shell_ok(proc.stdout)
    for text in wanted:
        assert text in proc.stdout, text
    for text in unwanted:
        assert text not in proc.stdout, text


GUIDE = DOC.read_text()


def _load(tmp_path: Path, body: str, *overrides: str):
    path = tmp_path / "job.yaml"
    path.write_text(body)
    return spec_mod.load(str(path), list(overrides), job=True)


def test_shell_defaults_are_oc_env(tmp_path, monkeypatch):
    """``${X:-default}`` -> ``${oc.env:X,default}``, read when you submit; a set but empty X
    stays empty (where ``:-`` takes the default); ``$(pwd)`` -> ``${oc.env:PWD}``."""
    assert "`${oc.env:X,default}`" in GUIDE and "set but empty stays empty" in GUIDE
    assert "`${oc.env:PWD}`" in GUIDE
    monkeypatch.setenv("SLURMKIT_CONFIG", os.devnull)
    monkeypatch.setenv("PWD", "/home/me/proj")
    body = "name: j\ncommand: [train, '${oc.env:X,/fsx/data}', '${oc.env:PWD}:/fsx']\n"
    monkeypatch.delenv("X", raising=False)
    assert _load(tmp_path, body).command[1:] == ("/fsx/data", "/home/me/proj:/fsx")
    monkeypatch.setenv("X", "/scratch")
    assert _load(tmp_path, body).command[1] == "/scratch"
    monkeypatch.setenv("X", "")
    assert _load(tmp_path, body).command[1] == ""


@pytest.mark.parametrize(
    ("mount_home", "flags"),
    [
        ("", ["--no-container-mount-home"]),
        ("true", ["--container-mount-home"]),
        ("null", []),  # neither: the site's pyxis default
    ],
)
def test_mount_home_null_leaves_it_to_the_site(tmp_path, monkeypatch, mount_home, flags):
    """``mount_home: null`` renders neither flag, also under a profile (which says false)."""
    assert "`null` renders neither flag" in GUIDE
    monkeypatch.setenv("SLURMKIT_CONFIG", os.devnull)
    extra = f", mount_home: {mount_home}" if mount_home else ""
    spec = _load(
        tmp_path,
        f"name: j\ncommand: [x]\nprofile: sunk\ncontainer: {{image: /i.sqsh{extra}}}\n",
    )
    step = launch.build(spec, str(tmp_path))["step"]
    assert [o for o in step if o.endswith("container-mount-home")] == flags


def test_a_profile_in_the_user_config_applies_to_specs_that_name_none(tmp_path, monkeypatch):
    assert "applies to every spec that names none" in GUIDE
    config = tmp_path / "config.yaml"
    config.write_text("profile: sunk\n")
    monkeypatch.setenv("SLURMKIT_CONFIG", str(config))
    assert _load(tmp_path, "name: j\ncommand: [x]\n").env == PROFILES["sunk"]
    assert _load(tmp_path, "name: j\ncommand: [x]\nprofile: none\n").env == {}


def test_a_fixed_master_port_is_also_torchruns_rendezvous_port(tmp_path):
    """``env: {MASTER_PORT: "29500"}``: the runtime keeps it, and torchrun's --rdzv-endpoint
    uses it (a local sweep, with an ``srun`` on PATH that writes down its argv)."""
    assert '`env: {MASTER_PORT: "29500"}`' in GUIDE
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    srun = bin_dir / "srun"
    srun.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$SRUN_ARGS"\n')
    srun.chmod(0o755)
    (tmp_path / "job.yaml").write_text(
        "name: j\ncommand: [python3, train.py]\nargs: none\nparams: {a: [1]}\n"
        'launcher: torchrun\nenv: {MASTER_PORT: "29500"}\n'
    )
    env = {
        "SLURMKIT_CONFIG": os.devnull,
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "SRUN_ARGS": str(tmp_path / "argv"),
    }
    with pytest.MonkeyPatch.context() as mp:  # the spec's port, not one of the caller's
        mp.delenv("MASTER_PORT", raising=False)
        proc = run_cli("sweep", "job.yaml", "--backend", "local", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    argv = (tmp_path / "argv").read_text().splitlines()
    assert "torchrun" in argv and "--rdzv-endpoint=localhost:29500" in argv


def test_the_batch_shell_needs_slurmkits_python(tmp_path):
    """The script runs ``$SLURMKIT_PYTHON`` (else the Python that rendered it) on the node, and
    exits 2 with a hint when there is none."""
    assert "`SLURMKIT_PYTHON`" in GUIDE and "`slurmkit doctor --nodes 2" in GUIDE
    spec = tmp_path / "job.yaml"
    spec.write_text("name: j\ncommand: [x]\n")
    proc = run_cli("render", str(spec), cwd=tmp_path, env={"SLURMKIT_CONFIG": os.devnull})
    assert proc.returncode == 0, proc.stderr
    assert "PY=${SLURMKIT_PYTHON:-" in proc.stdout
    script = tmp_path / "job.sbatch"
    script.write_text(proc.stdout)
    env = {**os.environ, "SLURMKIT_PYTHON": str(tmp_path / "no-python")}
    run = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert run.returncode == 2 and "set SLURMKIT_PYTHON" in run.stderr
