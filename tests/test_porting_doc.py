"""The worked ports in docs/porting-sbatch.md render, with the options the guide says."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import ROOT, assert_shell_ok, run_cli

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
