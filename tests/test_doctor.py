"""`slurmkit doctor`: the checks are a pure function of what the cluster said (every case
tested here), and on the real test cluster nothing fails."""

from __future__ import annotations

import json
import os
from dataclasses import replace

import pytest
from conftest import run_cli

from slurmkit import doctor
from slurmkit.doctor import FAIL, OK, WARN, Facts, checks

PYXIS_HELP = " ".join(f"--{name}" for name in __import__("slurmkit.pyxis").pyxis.OPTIONS)
HEALTHY = Facts(
    tools=dict.fromkeys(doctor.TOOLS, True),
    version="slurm 24.11.3",
    ping="Slurmctld(primary) at ctl is UP",
    config={
        "MaxArraySize": "1001",
        "MaxJobCount": "10000",
        "PreemptType": "preempt/partition_prio",
        "PreemptMode": "REQUEUE",
        "SlurmctldParameters": "preempt_send_user_signal",
        "JobRequeue": "1",
        "AccountingStorageType": "accounting_storage/slurmdbd",
    },
    partitions=[("gpu", "gpu:8", "up")],
    srun_help=PYXIS_HELP,
    sacct=True,
    output_writable=True,
    user_config=os.devnull,
    releaser=(0, "sbatch: Job 9 to start at 2026-12-05T12:00:00 using 1 processors on nodes n1"),
)


def by_name(found):
    return {c.name: c for c in found}


def test_a_healthy_cluster_is_all_ok():
    found = checks(HEALTHY)
    assert {c.level for c in found} == {OK}, [c for c in found if c.level != OK]


@pytest.mark.parametrize(
    ("change", "name", "level", "words"),
    [
        ({"config": {**HEALTHY.config, "PreemptMode": "CANCEL"}}, "preemption", WARN, "moot"),
        (
            {"config": {**HEALTHY.config, "SlurmctldParameters": ""}},
            "preemption",
            WARN,
            "preempt_send_user_signal",
        ),
        ({"config": {**HEALTHY.config, "PreemptType": "preempt/none"}}, "preemption", OK, "none"),
        ({"config": {**HEALTHY.config, "JobRequeue": "0"}}, "requeue", WARN, "--requeue"),
        ({"sacct": False}, "accounting", WARN, "slurmkit report"),
        ({"srun_help": ""}, "pyxis", WARN, "no pyxis"),
        (
            {"srun_help": "--container-image --container-mounts"},
            "pyxis",
            WARN,
            "missing: --container-workdir",
        ),
        ({"partitions": [("gpu", "(null)", "down")]}, "partitions", FAIL, "no partition is up"),
        ({"partitions": [("cpu", "(null)", "up")]}, "GRES", WARN, "GresTypes=gpu"),
        ({"output_writable": False}, "output_root", FAIL, "not writable"),
        ({"user_config_error": "bad YAML"}, "user config", FAIL, "bad YAML"),
        ({"profile": "sunk"}, "user config", OK, "profile sunk"),
        (
            {"releaser": (1, "sbatch: error: Batch job submission failed: Invalid partition")},
            "releaser",
            WARN,
            "SLURMKIT_RELEASE_PARTITION=PARTITION",
        ),
        (
            {"submit_limit": "50 jobs (QOS normal MaxSubmitJobsPerUser); 3 queued now"},
            "limits",
            OK,
            "50 jobs",
        ),
    ],
)
def test_each_finding(change, name, level, words):
    got = by_name(checks(replace(HEALTHY, **change)))[name]
    assert got.level == level and words in got.detail + got.hint, got


def test_no_slurm_commands_or_controller_fails_early():
    none = checks(replace(HEALTHY, tools=dict.fromkeys(doctor.TOOLS, False)))
    assert (none[0].name, none[0].level) == ("slurm commands", FAIL)
    assert "controller" not in by_name(none) and "output_root" in by_name(none)
    down = by_name(checks(replace(HEALTHY, ping=None)))
    assert down["controller"].level == FAIL and "slurmctld" in down["controller"].hint


def test_compute_node_findings():
    seen = [
        {"node": "n1", "python": "yes", "enroot": "yes", "wrote": "yes"},
        {"node": "n2", "python": "no", "enroot": "no", "wrote": "no"},
    ]
    got = by_name(
        checks(
            replace(
                HEALTHY,
                nodes={
                    "asked": 2,
                    "python": "/v/bin/python",
                    "seen": seen,
                    "shared": False,
                    "error": "",
                },
            )
        )
    )
    assert got["node python"].level == FAIL and "not on n2" in got["node python"].detail
    assert got["node enroot"].level == WARN and got["shared output_root"].level == FAIL
    none = by_name(checks(replace(HEALTHY, nodes={"seen": [], "error": "Invalid partition"})))
    assert (
        none["compute nodes"].level == FAIL and "Invalid partition" in none["compute nodes"].detail
    )


@pytest.mark.cluster
def test_doctor_on_the_test_cluster(slurm_cluster, tmp_path):
    proc = run_cli("doctor", "--json", "--nodes", "2", "--output-root", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    for name in (
        "slurm commands",
        "controller",
        "partitions",
        "GRES",
        "preemption",
        "requeue",
        "node python",
        "shared output_root",
        "output_root",
    ):
        assert found[name]["level"] == "ok", found[name]
    assert found["GRES"]["detail"] == "gpu:4" and "no pyxis" in found["pyxis"]["detail"]
    assert "waits 121 s" in found["requeue hold"]["detail"]  # 22.05, cred_expire's default
    assert found["releaser"]["level"] == "ok", found["releaser"]
    elsewhere = run_cli("doctor", "--json", env={"SLURMKIT_RELEASE_PARTITION": "nope"})
    got = {c["name"]: c for c in json.loads(elsewhere.stdout)["checks"]}["releaser"]
    assert got["level"] == "warn" and "Invalid partition" in got["detail"], got
    assert not list((tmp_path / "runs").glob(".slurmkit-doctor-*"))  # its tokens are gone
    people = run_cli("doctor", "--output-root", "/proc/nope")
    assert people.returncode == 1 and "not writable" in people.stdout


def test_a_wrong_slurm_conf_or_a_stopped_controller_fails_with_a_hint(tmp_path):
    """Through the CLI, at once (scontrol would retry a missing config for a minute). Slurm's
    commands are stand-ins that fail if called: this machine may not have Slurm installed."""
    tools = tmp_path / "bin"
    tools.mkdir()
    for tool in doctor.TOOLS:
        (tools / tool).write_text("#!/bin/sh\necho called >&2\nexit 3\n")
        (tools / tool).chmod(0o755)
    env = {"SLURM_CONF": "/nope", "PATH": f"{tools}:{os.environ['PATH']}"}
    proc = run_cli("doctor", "--json", "--output-root", str(tmp_path), env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "called" not in proc.stderr
    found = {c["name"]: c for c in json.loads(proc.stdout)["checks"]}
    assert found["controller"]["level"] == "fail"
    assert "SLURM_CONF=/nope does not exist" in found["controller"]["detail"]
    down = by_name(checks(replace(HEALTHY, ping=None)))
    assert down["controller"].level == FAIL


@pytest.mark.parametrize(
    ("config", "version", "hold", "fix"),
    [
        ({}, "slurm 22.05.8", 121, "AuthInfo cred_expire"),  # Slurm's default: 120 + 1
        ({"AuthInfo": "socket=/run/m.sock,cred_expire=30"}, "slurm 24.11.3", 31, "25.11 adds"),
        ({"AuthInfo": "cred_expire=5"}, "slurm 23.02.1", 6, ""),  # short: no fix to give
        ({"SchedulerParameters": "bf_interval=1,requeue_delay=2"}, "slurm 25.11.0", 2, ""),
        ({"SchedulerParameters": "requeue_delay=30"}, "slurm 25.11.2", 30, "requeue_delay=2"),
        ({"SchedulerParameters": "requeue_delay=2"}, "slurm 25.05.3", 121, "25.11 adds"),
        ({}, "slurm 26.05.0", 121, "SchedulerParameters=requeue_delay=2"),
    ],
)
def test_doctor_reports_the_requeue_hold_and_the_admins_fix(config, version, hold, fix):
    """Slurm holds a requeued job for cred_expire + 1 s (requeue_delay from 25.11 on)."""
    found = by_name(checks(Facts(**{**HEALTHY.__dict__, "config": config, "version": version})))
    check = found["requeue hold"]
    assert check.level == OK and f"waits {hold} s" in check.detail, check
    assert (fix in check.hint) if fix else not check.hint, check
