"""Named containers are kept to their attempt (papercuts 23.16 and 23.17): each attempt names its
own, removes it on every node when it ends, and removes what earlier attempts left. pyxis and
enroot are stand-ins here (the test cluster has neither): a fake ``srun`` that records which
container each step asks for, and a fake ``enroot`` that records its removals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from slurmkit.core.contract import ENV_CONTAINER
from slurmkit.core.rendezvous import fill
from slurmkit.runtime import containers

ENROOT = """#!/bin/sh
state=$FAKE_STATE
case $1 in
  list) ls "$state" ;;
  remove) name=$3; [ -e "$state/$name" ] || exit 1; rm -f "$state/$name"
          echo "remove $name" >>"$FAKE_LOG" ;;
  *) exit 2 ;;
esac
"""

SRUN = """#!/usr/bin/env python3
import os, subprocess, sys
args = sys.argv[1:]
if "--job-name=slurmkit-container-cleanup" in args:
    fail = os.path.join(os.environ["FAKE_STATE"], "..", "cleanup-fails")
    if os.path.exists(fail):
        os.remove(fail)
        sys.exit(1)
    at = args.index("sh")
    sys.exit(subprocess.call(args[at:]))
name = next(a for a in args if a.startswith("--container-name=")).split("=", 1)[1]
name = name.partition(":")[0]
path = os.path.join(os.environ["FAKE_STATE"], "pyxis_" + name)
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(("reuse " if os.path.exists(path) else "create ") + name + "\\n")
open(path, "a").close()
sys.exit(int(os.environ.get("FAKE_RC", "0")))
"""


def test_the_attempts_instance_names_the_container():
    launch = {"step": ["srun", "--container-name=train-abcd-{job_id}:exec", "x-{job_id}"]}
    env = {"MASTER_ADDR": "n1", "MASTER_PORT": "1", "SLURM_JOB_ID": "77"}
    assert fill(launch, env)[1:] == ["--container-name=train-abcd-77:exec", "x-{job_id}"]
    argv = fill(launch, {**env, ENV_CONTAINER: "77.2.abc123"})
    assert argv[1] == "--container-name=train-abcd-77.2.abc123:exec"
    assert containers.named(argv) == "train-abcd-77.2.abc123"
    assert containers.named(["srun", "x"]) is None
    one, two = containers.instance("77", 2), containers.instance("77", 2)
    assert one.startswith("77.2.") and one != two  # a job id seen again never meets it


def test_the_removal_takes_only_the_named_container(tmp_path):
    state, log = tmp_path / "state", tmp_path / "log"
    state.mkdir()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "enroot").write_text(ENROOT)
    (bin_dir / "enroot").chmod(0o755)
    keep = ["pyxis_t-1.1.a-more", "pyxis_xt-1.1.a", "pyxis_t-1.1.ab", "other"]
    for name in ["pyxis_t-1.1.a", "pyxis_4242_t-1.1.a", *keep]:
        (state / name).touch()
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "FAKE_STATE": str(state),
           "FAKE_LOG": str(log)}  # fmt: skip
    argv = containers.remove_argv("t-1.1.a", "2")
    assert argv[:6] == ["srun", "--overlap", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1",
                        "--kill-on-bad-exit=0"]  # fmt: skip
    ran = subprocess.run(argv[argv.index("sh") :], env=env, capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr
    assert sorted(p.name for p in state.iterdir()) == sorted(keep)
    missing = subprocess.run(["/bin/sh", *argv[argv.index("sh") + 1 :]], env={"PATH": "/bin"})
    assert missing.returncode == 0  # no enroot on the node: nothing to remove


@pytest.fixture
def fake_slurm(tmp_path):
    state, bin_dir = tmp_path / "state", tmp_path / "bin"
    state.mkdir()
    bin_dir.mkdir()
    for name, text in (("enroot", ENROOT), ("srun", SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    return {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "FAKE_STATE": str(state),
        "FAKE_LOG": str(tmp_path / "log"),
    }


def _task(root: str, env: dict[str, str], restarts: int, rc: int) -> int:
    job = {"SLURM_JOB_ID": "77", "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "0",
           "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1",
           "SLURMD_NODENAME": "n1", "SLURM_RESTART_COUNT": str(restarts)}  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "slurmkit.runtime", "task"],
        env={**os.environ, **env, **job, "SLURMKIT_SWEEP_DIR": root, "FAKE_RC": str(rc)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode


def test_each_attempt_runs_in_its_own_container_and_removes_it(tmp_path, spec_file, fake_slurm):
    from slurmkit import plan, store
    from slurmkit import spec as spec_mod

    s = spec_mod.load(
        str(
            spec_file(
                "command: [x]\nargs: none\nparams: {a: [1]}\n"
                "container: {image: ubuntu, name: train}\n"
            )
        )
    )
    root = store.create(plan.make(s, plan.expand(s), str(tmp_path)), str(tmp_path / "sw")).root
    state, log = Path(fake_slurm["FAKE_STATE"]), Path(fake_slurm["FAKE_LOG"])
    (state / ".." / "cleanup-fails").touch()  # the first attempt cannot remove its container
    assert _task(root, fake_slurm, 0, 75) == 75  # it asks for a requeue (a time limit, say)
    assert len(list(state.iterdir())) == 1  # left behind
    assert _task(root, fake_slurm, 1, 0) == 0  # the requeued attempt
    lines = log.read_text().splitlines()
    first, second = (ln.split()[1] for ln in lines if ln.startswith("create "))
    assert first != second and first.startswith("train-") and ".1." in first and ".2." in second
    assert not any(ln.startswith("reuse ") for ln in lines)  # never a half-made one
    assert f"remove pyxis_{first}" in lines and f"remove pyxis_{second}" in lines
    assert lines.index(f"remove pyxis_{first}") < lines.index(f"create {second}")
    assert not list(state.iterdir())  # nothing outlives the trial
    [status] = [json.loads(p.read_text()) for p in Path(root).glob("trials/*/status.json")]
    assert [(a["container_name"], a.get("removed")) for a in status["attempts"]] == [
        (first, True),
        (second, True),
    ]


def test_adopt_and_release_keep_the_record_for_both_supervisors(fake_slurm):
    """The function supervisor (fnjob) and TrialRun share adopt/release: the last attempt's
    name recorded, earlier leftovers removed, its own removed at the end."""
    state = Path(fake_slurm["FAKE_STATE"])
    (state / "pyxis_t-7.1.aaa").touch()  # attempt 1's, never removed
    env = {**os.environ, **fake_slurm, "SLURM_JOB_ID": "7", "SLURM_NNODES": "1"}
    attempts = [{"n": 1, "container_name": "t-7.1.aaa"}, {"n": 2}]
    step = ["srun", "--container-name=t-{job_id}"]
    named = containers.named_env(step, env, 2)
    argv = fill({"step": step}, {**named, "MASTER_ADDR": "x", "MASTER_PORT": "1"})
    assert containers.adopt(argv, attempts, env)
    assert attempts[0]["removed"] and not list(state.iterdir())
    (state / f"pyxis_{attempts[1]['container_name']}").touch()  # the step made it
    assert containers.release(attempts[1], env) and attempts[1]["removed"]
    assert not list(state.iterdir())
    assert not containers.adopt(["srun", "x"], [{"n": 1}], env)  # no name: nothing recorded
    assert containers.named_env(["srun", "x"], env, 1) is env
