"""The user's submit limits (association and QOS MaxSubmitJobs, from Slurm's accounting): a
sweep that would go over them is refused before anything is created, naming the limit.

`sacctmgr` is a PATH shim printing what sacctmgr prints (`-nP`: no header, `|`-separated), so
that each test sets the limits it needs; squeue is the real one when the cluster is up.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from slurmkit import spec as spec_mod
from slurmkit import sweep
from slurmkit.backends import slurm
from slurmkit.backends.submit_limits import Limit, limit
from slurmkit.errors import UserError

ASSOCS = "ml|||normal\nml|gpu|40|normal\nvision||100|high\n"
QOS = "normal|50\nhigh|\nlow|5\n"


@pytest.mark.parametrize(
    ("account", "qos", "default", "want"),
    [
        ("ml", None, "", Limit(40, "account ml partition gpu MaxSubmitJobs")),
        ("vision", None, "", Limit(100, "account vision MaxSubmitJobs")),  # QOS high: no limit
        ("vision", "low", "", Limit(5, "QOS low MaxSubmitJobsPerUser")),
        (None, None, "vision\n", Limit(100, "account vision MaxSubmitJobs")),  # default account
        ("other", None, "", Limit(50, "QOS normal MaxSubmitJobsPerUser")),  # no such assoc
    ],
)
def test_the_tightest_limit_that_applies(account, qos, default, want):
    assert limit(ASSOCS, QOS, default, account, qos) == want


def test_no_limit_anywhere_is_none():
    assert limit("ml|||\n", "normal|\n", "ml", None, None) is None
    assert limit("", "", "", None, None) is None


def _shim(directory: Path, name: str, script: str) -> None:
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _sacctmgr(directory: Path, assocs: str, qos: str, default: str = "ml") -> None:
    _shim(
        directory,
        "sacctmgr",
        f"""case "$3" in
assoc) printf '{assocs}' ;;
qos) printf '{qos}' ;;
user) printf '{default}\\n' ;;
esac
""",
    )


def _spec(spec_file, tmp_path: Path, trials: int, extra: str = ""):
    body = f"command: x\nparams: {{a: 'range(0,{trials})'}}\noutput_root: {tmp_path / 'runs'}\n"
    return spec_mod.load(str(spec_file(body + extra)))


@pytest.mark.cluster
def test_over_the_qos_limit_is_refused_before_anything_exists(
    slurm_cluster, monkeypatch, spec_file, tmp_path
):
    """Real squeue (the user's queued jobs count: here none of this test's), shimmed sacctmgr."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _sacctmgr(bin_dir, "ml|||normal\\n", "normal|6\\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    queued = len(
        slurm._run(["squeue", "-h", "-r", "-u", os.environ.get("USER", "root")]).stdout.splitlines()
    )
    backend = slurm.SlurmBackend(accounting=True)
    backend.check(_spec(spec_file, tmp_path, 6 - queued), 6 - queued)  # fits exactly
    s = _spec(spec_file, tmp_path, 7 - queued)
    with pytest.raises(UserError) as info:
        backend.check(s, 7 - queued)
    assert info.value.message == (
        f"{7 - queued} trials do not fit: you may have at most 6 jobs queued "
        f"(QOS normal MaxSubmitJobsPerUser) and have {queued} already"
    )
    assert info.value.key == "params" and info.value.exit_code == 2


def test_a_sweep_over_the_limit_creates_nothing(monkeypatch, spec_file, tmp_path):
    class Answer:
        def result(self) -> slurm.SlurmBackend:
            return slurm.SlurmBackend(accounting=True)

        def cancel(self) -> None:
            pass

    monkeypatch.setattr(slurm.SlurmBackend, "probe", classmethod(lambda cls, timeout: Answer()))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _sacctmgr(bin_dir, "ml||3|normal\\n", "normal|\\n")
    _shim(bin_dir, "squeue", "echo 101; echo 102\n")  # two jobs queued already
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(UserError) as info:
        sweep.submit(_spec(spec_file, tmp_path, 2, "resources: {account: ml}\n"), backend="slurm")
    assert "at most 3 jobs queued (account ml MaxSubmitJobs) and have 2 already" in str(info.value)
    assert not (tmp_path / "runs").exists()


def test_accounting_that_does_not_answer_holds_nothing_back(monkeypatch, spec_file, tmp_path):
    """sacctmgr fails as it does without slurmdbd: the check is skipped (Slurm still refuses
    what is over a limit when it is submitted)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _shim(
        bin_dir,
        "sacctmgr",
        "echo 'sacctmgr: error: Problem talking to the database: Connection refused' >&2\nexit 1\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert slurm.headroom(None, None) is None
    slurm.SlurmBackend(accounting=True).check(_spec(spec_file, tmp_path, 10), 10)


def test_a_limit_is_asked_once_per_ttl_and_a_failure_never_kept(monkeypatch, tmp_path):
    """slurmdbd costs several round trips per sacctmgr: the answer (a limit, or none) is kept
    for SLURMKIT_LIMITS_TTL seconds; what accounting failed to answer is asked again."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    _shim(bin_dir, "sacctmgr", f'echo "$3" >> {calls}\nexit 1\n')
    _shim(bin_dir, "squeue", "echo 7\n")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("SLURMKIT_LIMITS_TTL", "600")
    asked = lambda: calls.read_text().split() if calls.exists() else []
    assert slurm.headroom("ml", None) is None and slurm.headroom("ml", None) is None
    assert len(asked()) == 6  # failed both times: asked both times

    calls.unlink()
    _sacctmgr(bin_dir, "ml||3|normal\\n", "normal|\\n")
    counting = (bin_dir / "sacctmgr").read_text().replace("#!/bin/sh\n", "")
    _shim(bin_dir, "sacctmgr", f'echo "$3" >> {calls}\n{counting}')
    want = (Limit(3, "account ml MaxSubmitJobs"), 1)
    assert slurm.headroom("ml", None) == want
    assert slurm.headroom("ml", None) == want  # from the cache; the queue counted again
    assert sorted(asked()) == ["assoc", "qos", "user"]
    assert slurm.headroom("other", None) is None  # another account: asked, no limit
    assert slurm.headroom("other", None) is None  # "no limit" is kept too
    assert len(asked()) == 6

    monkeypatch.setenv("SLURMKIT_LIMITS_TTL", "0")
    assert slurm.headroom("ml", None) == want
    assert len(asked()) == 9
