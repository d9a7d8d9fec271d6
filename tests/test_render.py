"""Rendered batch scripts: shape, no parameter values in the text, and sbatch/ kept fresh."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ROOT, SLURMKIT, assert_shell_ok, run_cli

from slurmkit import plan, render
from slurmkit import spec as spec_mod
from slurmkit import sweep as lib


def scripts(s, indices, max_array_size, sweep_dir):
    return render.scripts(
        plan.make(s, plan.expand(s), os.getcwd()), indices, max_array_size, sweep_dir
    )


def test_script_shape_and_no_values_in_text(spec_file):
    s = spec_mod.load(
        str(
            spec_file("""
name: demo
command: [python, t.py]
params: {text: ["$(rm -rf /)", "`id`", "it's"], n: 'range(0,4)'}
max_parallel: 3
resources: {partition: low, time: "0:05:00", mem: 1G, extra: {exclusive: true}}
""")
        )
    )
    trials = plan.expand(s)
    [(_, text)] = scripts(s, range(len(trials)), 1001, "/shared/runs/demo-1")
    assert text.startswith("#!/bin/bash\n")
    sbatch = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert sbatch == [
        "#SBATCH --job-name=demo",
        "#SBATCH --array=0-11%3",
        "#SBATCH --output=/shared/runs/demo-1/logs/%A_%a.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        "#SBATCH --signal=B:USR2@120",
        "#SBATCH --partition=low",
        "#SBATCH --time=0:05:00",
        "#SBATCH --nodes=1",
        "#SBATCH --mem=1G",
        "#SBATCH --exclusive",
        "#SBATCH --comment=slurmkit:/shared/runs/demo-1",  # accounting leads back here
    ]
    for bad in ("rm -rf", "`id`", "it's", "t.py"):
        assert bad not in text
    assert "-m slurmkit.runtime task --offset 0 &" in text
    assert 'scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in text
    assert_shell_ok(text)


def test_requeue_can_be_switched_off_and_tuned(spec_file):
    off = spec_mod.load(str(spec_file("command: x\nparams: {a: [1]}\nrequeue: {enabled: false}\n")))
    text = scripts(off, [0], 1001, "/r")[0][1]
    assert "#SBATCH --no-requeue" in text and "trap" not in text and "exec " in text
    assert_shell_ok(text)
    tuned = spec_mod.load(
        str(
            spec_file(
                "command: x\nparams: {a: [1]}\nresources: {time: 10}\n"
                "requeue: {signal: SIGURG, lead: 60, budgets: {timeout: 1}}\n"
            )
        )
    )
    text = scripts(tuned, [0], 1001, "/r")[0][1]
    assert "#SBATCH --signal=B:URG@60" in text and "trap 'slurmkit_forward URG' URG" in text
    assert_shell_ok(text)
    assert tuned.requeue.budgets == {
        "preemption": None,
        "timeout": 1,
        "node_failure": 3,
        "container": 0,
        "error": 0,
        "node": 3,
        "hang": 3,
    }


def test_split_under_max_array_size(spec_file):
    s = spec_mod.load(str(spec_file("command: x\nparams: {i: 'range(0,23)'}\n")))
    split = scripts(s, range(23), 10, "/r")
    arrays = [next(ln for ln in t.splitlines() if "--array" in ln) for _, t in split]
    assert arrays == ["#SBATCH --array=0-9", "#SBATCH --array=0-9", "#SBATCH --array=0-2"]
    assert [c.offset for c, _ in split] == [0, 10, 20]


def test_dry_run_prints_and_creates_nothing(tmp_path, spec_file):
    path = spec_file("command: x\nparams: {i: 'range(0,5)'}\nmax_parallel: 2\n")
    proc = run_cli("sweep", str(path), f"output_root={tmp_path / 'runs'}", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --array=0-4%2" in proc.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_large_output_survives_the_quick_exit(tmp_path, spec_file):
    """~200 kB of --json through a pipe (more than its buffer) arrive whole, and a reader that
    stops early does not make the CLI hang."""
    import json

    path = spec_file("command: x\nparams: {i: 'range(0,30000)'}\n")
    proc = run_cli("sweep", str(path), f"output_root={tmp_path / 'runs'}", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["indices"] == list(range(30000))
    head = subprocess.run(
        f"{' '.join(SLURMKIT)} sweep {path} --dry-run --json | head -c 10",
        shell=True,
        capture_output=True,
        text=True,
        timeout=60,
        executable="/bin/bash",
    )
    assert head.stdout == '{"sweep_di'


@pytest.mark.parametrize("spec_path", sorted(glob.glob(str(ROOT / "sweeps" / "*.yaml"))))
def test_committed_sbatch_scripts_are_fresh(spec_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    rel = os.path.relpath(spec_path, ROOT)
    expected = lib.render_standalone(spec_mod.load(rel, job=True), rel)
    committed = ROOT / "sbatch" / (Path(spec_path).stem + ".sbatch")
    assert committed.exists(), f"{committed} missing: run `make sbatch`"
    assert committed.read_text() == expected, f"{committed} is stale: run `make sbatch`"
    assert_shell_ok(expected)


def test_plain_script_is_self_contained(spec_file):
    s = spec_mod.load(str(spec_file("name: p\ncommand: x\nparams: {i: [1, 2]}\n")))
    text = lib.render_standalone(s, "sweeps/p.yaml")
    assert "--spec sweeps/p.yaml" in text
    assert "sbatch-$SLURM_ARRAY_JOB_ID" in text
    assert f"PY=${{SLURMKIT_PYTHON:-{render.STANDALONE_PYTHON}}}" in text
    assert_shell_ok(text)


def test_shellcheck_is_there_when_the_full_suite_runs():
    """`make test` runs `make lint` first, which installs shellcheck: the golden scripts above
    were checked with it. (`make unit` may run without it, and then checks bash -n only.)"""
    if os.environ.get("SLURMKIT_FULL_SUITE") or os.environ.get("CI"):  # make test sets it
        assert shutil.which("shellcheck"), "make lint should have installed shellcheck"
    else:
        pytest.skip("not under make test: shellcheck is optional for make unit")
