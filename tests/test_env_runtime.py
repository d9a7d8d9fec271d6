"""``env_runtime``: values with placeholders that the in-job runtime fills in."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import local_sweep
from spec_examples import JOB

from slurmkit import launch
from slurmkit import spec as spec_mod
from slurmkit.core import placeholders
from slurmkit.errors import SpecError

KNOWN = {"job_id": "42", "array_task_id": "3", "node": "n1", "trial_dir": "/runs/s/trials/t"}


@pytest.mark.parametrize(
    ("value", "filled"),
    [
        ("/scratch/{job_id}", "/scratch/42"),
        ("{node}:{array_task_id}:{trial_dir}/tmp", "n1:3:/runs/s/trials/t/tmp"),
        ("{{job_id}} and }} and {{", "{job_id} and } and {"),
        ("$SLURM_JOB_ID 'as written'", "$SLURM_JOB_ID 'as written'"),
    ],
)
def test_placeholders_fill_and_double_braces_stay_literal(value, filled):
    assert placeholders.problem(value) is None
    assert placeholders.fill({"X": value}, KNOWN) == {"X": filled}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("/scratch/{jobid}", "{jobid} is not a placeholder"),
        ("{job_id:>8}", "no format spec"),
        ("{job_id!r}", "no format spec or conversion"),
        ("a { b", "literal braces"),
        ("a } b", "literal braces"),
        ("{0}", "{0} is not a placeholder"),
        ("{}", "{} is not a placeholder"),
    ],
)
def test_a_value_that_cannot_be_filled_is_refused_at_load(spec_file, value, message):
    path = spec_file(
        f"command: [python, x.py]\nparams: {{a: [1]}}\nenv_runtime: {{T: {json.dumps(value)}}}\n"
    )
    with pytest.raises(SpecError, match=re.escape(message)) as info:
        spec_mod.load(str(path))
    assert info.value.key == "env_runtime.T" and info.value.file == str(path)
    assert "{trial_dir}" in (info.value.hint or "")


def test_a_variable_set_in_env_too_is_refused(spec_file):
    path = spec_file(
        "command: [python, x.py]\nparams: {a: [1]}\nenv: {T: a}\nenv_runtime: {T: '{node}'}\n"
    )
    with pytest.raises(SpecError, match="set in env as well") as info:
        spec_mod.load(str(path))
    assert info.value.key == "env_runtime.T"


def test_container_jobs_let_them_win_over_the_image(spec_file):
    s = spec_mod.load(str(spec_file(JOB + "env_runtime: {TMPDIR: '/tmp/{job_id}'}\n")), job=True)
    env = next(o for o in launch.build(s, "/p")["step"] if o.startswith("--container-env="))
    assert "TMPDIR" in env.split("=", 1)[1].split(",")


def test_a_local_trial_sees_them_filled_in(tmp_path):
    code = "import os; print('T=' + os.environ['T'])"
    proc, result = local_sweep(
        tmp_path,
        f"command: [python3, -c, {json.dumps(code)}]\nargs: none\nparams: {{a: [1, 2]}}\n"
        "env_runtime: {T: '{trial_dir}|{array_task_id}|{job_id}|{{lit}}'}\n",
    )
    assert proc.returncode == 0, proc.stderr
    root = Path(result["sweep_dir"])
    jobs = set()
    for log in sorted(root.glob("trials/*/output.log")):
        line = next(x for x in log.read_text().splitlines() if x.startswith("T="))
        trial_dir, index, job, lit = line[2:].split("|")
        assert trial_dir == str(log.parent) and lit == "{lit}"
        assert job.startswith("local-") and job.endswith(f"-{index}")
        jobs.add(job)
    assert len(jobs) == 2  # one per trial: TMPDIR=/tmp/{job_id} does not collide
