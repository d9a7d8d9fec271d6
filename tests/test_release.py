"""The requeue-hold release: the guard (slurmkit.core.release) and the releaser's loop
(slurmkit.runtime.releaser.watch) against a scripted scheduler."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from slurmkit.core import release
from slurmkit.core.release import GAP, Held, hold_seconds, plan, releasable, start_time
from slurmkit.runtime import releaser

T0 = 1_780_000_000.0
HOLD = 121


def held(**kw) -> Held:
    base = {"job": "7_0", "state": "PENDING", "reason": "BeginTime", "restarts": 1}
    return Held(**{**base, "begin": T0 + HOLD, "submit": T0, **kw})


def test_a_requeue_hold_is_released_two_seconds_after_the_attempt_ended():
    assert releasable(held(), HOLD) == T0 + GAP
    assert plan([held()], HOLD, T0 + 5) == {"7_0": "now"}
    assert plan([held()], HOLD, T0 + 1) == {"7_0": "now+1"}
    assert plan([held()], HOLD, T0 - 3) == {}  # too early to say: ask again


def test_the_guard_leaves_every_other_pending_job_alone():
    assert releasable(held(restarts=0), HOLD) is None  # never ran: a --begin of the user's
    assert releasable(held(reason="JobHeldUser"), HOLD) is None
    assert releasable(held(reason="Resources"), HOLD) is None
    assert releasable(held(state="RUNNING"), HOLD) is None
    assert releasable(held(begin=T0 + 600), HOLD) is None  # the user moved it later
    assert releasable(held(begin=None), HOLD) is None
    assert releasable(held(submit=None), HOLD) is None
    assert releasable(held(begin=T0 + HOLD + 1), HOLD) == T0 + GAP  # whole seconds
    assert releasable(held(), 31) is None  # another cluster's hold


@given(
    begin=st.floats(0, 10_000),
    submit=st.floats(0, 10_000),
    restarts=st.integers(0, 5),
    hold=st.integers(2, 1300),
    now=st.floats(0, 20_000),
    reason=st.sampled_from(["BeginTime", "Priority", "JobHeldUser", "Dependency"]),
)
def test_a_release_never_comes_early_nor_for_a_users_start(
    begin, submit, restarts, hold, now, reason
):
    job = Held("1_2", "PENDING", reason, begin, submit, restarts)
    out = plan([job], hold, now)
    if out:
        assert reason == "BeginTime" and restarts >= 1
        assert abs(begin - submit - hold) <= release.SLACK
        start = now if out["1_2"] == "now" else now + int(out["1_2"].removeprefix("now+"))
        assert start >= submit + GAP


def test_start_time_waits_at_most_gap_seconds():
    assert start_time(10.0, 10.0) == "now"
    assert start_time(10.0, 8.5) == "now+2"
    assert start_time(10.0, 7.0) is None


def test_the_hold_is_read_from_the_clusters_config():
    assert hold_seconds({}) == (121, "AuthInfo cred_expire=120 s, + 1 s")
    assert hold_seconds({"AuthInfo": "cred_expire=30"})[0] == 31
    delay = {"SchedulerParameters": "requeue_delay=2", "SLURM_VERSION": "25.11.0"}
    assert hold_seconds(delay)[0] == 2
    assert hold_seconds({**delay, "SLURM_VERSION": "25.05.3"})[0] == 121


def test_rows_from_squeue_and_scontrol():
    text = "7_0|PENDING|BeginTime|2026-12-05T07:52:20|2026-12-05T07:50:19|1\nbad\n"
    [row] = release.parse_squeue(text)
    assert row.job == "7_0" and row.restarts == 1
    assert row.begin is not None and row.submit is not None and row.begin - row.submit == 121
    info = {"JobId": "9", "ArrayJobId": "7", "ArrayTaskId": "0", "JobState": "PENDING"}
    info |= {"Reason": "BeginTime", "Restarts": "2", "StartTime": "Unknown"}
    assert release.from_scontrol(info) == Held("7_0", "PENDING", "BeginTime", None, None, 2)


class Scheduler:
    """A scripted ``scontrol``: each look returns the next view of the job."""

    def __init__(self, views: list[dict[str, str]]) -> None:
        self.views = views
        self.now = T0 - 1
        self.updates: list[list[str]] = []

    def show(self, job: str) -> dict[str, str]:
        return self.views.pop(0) if len(self.views) > 1 else self.views[0]

    def act(self, args) -> bool:
        self.updates.append(list(args))
        return True

    def sleep(self, s: float) -> None:
        self.now += s

    def watch(self, **kw):
        return releaser.watch(
            "7_0",
            0,
            HOLD,
            show=self.show,
            act=self.act,
            clock=lambda: self.now,
            sleep=self.sleep,
            **kw,
        )


def view(state: str, reason: str, restarts: int, begin: str = "Unknown") -> dict[str, str]:
    return {
        "JobId": "9",
        "JobState": state,
        "Reason": reason,
        "Restarts": str(restarts),
        "StartTime": begin,
        "SubmitTime": "2026-12-05T07:50:19",
    }


HELD = view("PENDING", "BeginTime", 1, "2026-12-05T07:52:20")


def test_the_releaser_waits_for_the_requeue_then_releases_once_due():
    requeued = view("PENDING", "None", 1)  # its hold not set yet
    s = Scheduler([view("RUNNING", "None", 0), view("COMPLETING", "None", 1), requeued, HELD])
    s.now = release.epoch("2026-12-05T07:50:19") - 1
    what, seen, at = s.watch(exclude=lambda: ["n3"])
    assert what == "released" and seen is not None and seen.job == "7_0"
    assert s.updates == [["JobId=7_0", "StartTime=now", "ExcNodeList=n3"]]
    assert at >= release.epoch("2026-12-05T07:50:19") + GAP


def test_the_releaser_leaves_a_cancelled_or_user_held_job_be():
    for last in (
        view("CANCELLED", "None", 0),  # cancelled before the requeue
        view("CANCELLED", "None", 1),  # cancelled while held
        view("PENDING", "JobHeldUser", 1),
        view("PENDING", "BeginTime", 1, "2026-12-05T08:50:19"),  # moved by hand
        view("RUNNING", "None", 1),  # someone else released it
    ):
        s = Scheduler([last])
        s.now = release.epoch("2026-12-05T07:50:19") + 5
        assert s.watch()[0] != "released"
        assert s.updates == []
    assert Scheduler([{}]).watch()[0] == "gone"


def test_the_releaser_gives_up_after_the_hold_window():
    s = Scheduler([view("RUNNING", "None", 0)])
    assert s.watch()[0] == "timed out"


def test_the_release_record(tmp_path):
    path = tmp_path / "release-1.json"
    releaser.write_record(str(path), "job", held(), T0 + 2.5)
    assert json.loads(path.read_text()) == {
        "by": "job",
        "held_until": T0 + HOLD,
        "released_at": T0 + 2.5,
        "job": "7_0",
    }


def test_sbatch_inside_a_job_gets_none_of_the_jobs_options():
    env = {"SLURM_CONF": "/c", "SLURM_JOB_ID": "9", "SBATCH_TIMELIMIT": "5", "PATH": "/bin"}
    assert releaser.sbatch_env(env) == {"SLURM_CONF": "/c", "PATH": "/bin"}
    assert releaser.job_ref({"SLURM_JOB_ID": "9"}) == "9"
    assert releaser.job_ref({"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "3"}) == "7_3"
    job = {"SLURM_JOB_ID": "9", "SLURM_JOB_NAME": "lr"}
    assert releaser.submit("r", "l", env={**job, "SLURMKIT_NO_RELEASE": "1"}) is None
    assert releaser.submit("r", "l", env={"SLURM_JOB_ID": "9"}) is None  # not a batch job
    assert releaser.submit("r", "l", env={}) is None  # not a Slurm job


def test_one_sibling_of_a_sweep_holds_the_lease_per_interval(tmp_path):
    from slurmkit.runtime.sweeprelease import take_lease

    assert take_lease(str(tmp_path), 100.0, 5.0)
    assert not take_lease(str(tmp_path), 101.0, 5.0)  # the same interval: another sibling
    assert take_lease(str(tmp_path), 105.0, 5.0)
    assert take_lease(str(tmp_path), 120.0, 5.0)
    assert [p.name for p in (tmp_path / ".release").iterdir()] == ["24"]  # older ones removed


def sweep_dir(tmp_path, n: int = 2):
    root = tmp_path / "sweep"
    (root / "submissions").mkdir(parents=True)
    rows = [{"index": i, "id": f"t{i}", "params": {}} for i in range(n)]
    (root / "trials.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    jobs = {"backend": "slurm", "jobs": [{"job_id": "7", "offset": 0, "array": "0-1"}]}
    (root / "submissions" / "0000.json").write_text(json.dumps(jobs))
    (root / "trials" / "t1").mkdir(parents=True)
    ended = {"n": 1, "state": "REQUEUED", "cause": "preemption", "end": T0 - 1}
    write_last(root, ended)
    return root


def write_last(root, attempt: dict) -> None:
    (root / "trials" / "t1" / "status.json").write_text(json.dumps({"attempts": [attempt]}))


def test_a_running_sibling_releases_a_held_task_once_per_interval(tmp_path, monkeypatch):
    from slurmkit.runtime import sweeprelease

    root = sweep_dir(tmp_path)
    asked: list[list[str]] = []
    updates: list[list[str]] = []
    row = held(job="7_1", begin=T0 + HOLD, submit=T0)
    monkeypatch.setattr(sweeprelease, "pending", lambda ids: asked.append(sorted(ids)) or [row])
    monkeypatch.setattr(sweeprelease, "hold", lambda: HOLD)
    monkeypatch.setattr(releaser, "update", lambda args: updates.append(list(args)) or True)
    env = {"SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0"}
    siblings = [sweeprelease.sibling(str(root), 0, True, env) for _ in range(3)]
    assert sweeprelease.sibling(str(root), 0, False, env) is None  # not under the policy
    assert sweeprelease.sibling(str(root), 0, True, {**env, release.ENV_OFF: "1"}) is None
    now = [T0 + 10.0]
    monkeypatch.setattr(sweeprelease.time, "time", lambda: now[0])
    for s in siblings:
        assert s is not None
        s.slot = 0  # started in an earlier interval
        s()
    assert asked == [["7"]]  # one query for the sweep, whichever sibling asked
    assert updates == [["JobId=7_1", "StartTime=now"]]
    record = json.loads((root / "trials" / "t1" / "release-1.json").read_text())
    assert record["by"] == "sibling" and record["job"] == "7_1"
    for s in siblings:
        s()  # the same interval: nobody asks again
    assert len(asked) == 1
    own = sweeprelease.sibling(str(root), 1, True, {**env, "SLURM_ARRAY_TASK_ID": "1"})
    assert own is not None and own.trial_of("7_1", {"7": 0}) is None  # never its own task
    assert own.trial_of("7_0", {"7": 0}) == "t0" and own.trial_of("8_0", {"7": 0}) is None


def test_a_task_whose_node_failed_is_released_only_off_that_node(tmp_path):
    from slurmkit.runtime import sweeprelease

    root = sweep_dir(tmp_path)
    updates: list[list[str]] = []

    def go() -> list[str]:
        row = held(job="7_1")
        act = lambda args: updates.append(list(args)) or True
        return sweeprelease.release(
            str(root), [row], {"7_1": "t1"}.get, "watcher", hold_s=HOLD, now=T0 + 10, act=act
        )

    write_last(root, {"n": 2, "state": "RUNNING"})  # vanished: its nodes unknown
    assert go() == [] and updates == []  # Slurm's hold keeps it off a node that comes back
    write_last(root, {"n": 2, "state": "RUNNING", "nodes": ["n3", "n4"]})
    assert go() == ["7_1"]
    assert updates == [["JobId=7_1", "StartTime=now", "ExcNodeList=n3,n4"]]
    assert json.loads((root / "trials" / "t1" / "release-2.json").read_text())["by"] == "watcher"
    write_last(root, {"n": 2, "state": "REQUEUED", "cause": "error", "end": T0 + 9})
    assert go() == []  # its end recorded a second ago: not yet
    assert (
        sweeprelease.release(
            str(root),
            [held(job="7_1")],
            {}.get,
            "watcher",
            hold_s=HOLD,
            now=T0 + 10,
            act=lambda a: True,
        )
        == []
    )  # not ours


def test_a_watcher_asks_only_when_a_task_shows_the_hold(tmp_path, monkeypatch):
    from slurmkit import sweepstate
    from slurmkit.runtime import sweeprelease

    root = sweep_dir(tmp_path)
    asked: list[list[str]] = []
    monkeypatch.setattr(sweeprelease, "pending", lambda ids: asked.append(sorted(ids)) or [])
    running = sweepstate.TrialStatus(0, "t0", {}, "RUNNING", attempts=1, job="7_0")
    current = sweepstate.SweepStatus(str(root), "s", [running])
    assert sweepstate.release_held(current) == [] and asked == []
    waiting = sweepstate.TrialStatus(1, "t1", {}, "PENDING", attempts=1, job="7_1")
    waiting.reason = "BeginTime"
    current.trials.append(waiting)
    sweepstate.release_held(current)
    assert asked == [["7_1"]]
    never_ran = sweepstate.TrialStatus(1, "t1", {}, "PENDING", attempts=0, job="7_1")
    never_ran.reason = "BeginTime"  # a --begin of the user's: not even asked
    assert sweepstate.release_held(sweepstate.SweepStatus(str(root), "s", [never_ran])) == []
    assert len(asked) == 1


def test_the_runtime_submits_a_releaser_for_its_own_requeue_only(tmp_path, spec_file, monkeypatch):
    """Exit 75 (the trial checkpointed: the batch shell requeues it) submits the releaser, with
    the trial's record paths; a requeue Slurm made itself (76) does not: the watchers' part."""
    from slurmkit import plan, store
    from slurmkit import spec as spec_mod
    from slurmkit.runtime import trial as trial_mod

    asked: list[tuple] = []
    monkeypatch.setattr(releaser, "submit", lambda *a, **kw: asked.append((a, kw)))
    monkeypatch.setenv("SLURM_JOB_ID", "1")
    s = spec_mod.load(
        str(spec_file("command: [sh, -c, 'exit 75']\nargs: none\nparams: {a: [1]}\n"))
    )
    sweep = store.create(plan.make(s, plan.expand(s), str(tmp_path)), str(tmp_path / "sweep"))
    run = trial_mod.TrialRun(sweep, 0, under_slurm=True)
    run.start()
    assert run.wait() == 75
    [(args, kw)] = asked
    assert args[0] == f"{run.dir}/release-1.json" and kw == {"sweep": sweep.root, "trial": run.id}
    monkeypatch.setattr(
        trial_mod.TrialRun,
        "outcome",
        lambda self, *a: (trial_mod.requeue.Outcome("REQUEUED", 75, "preemption"), True),
    )
    run = trial_mod.TrialRun(sweep, 0, under_slurm=True)
    run.start()
    assert run.wait() == 76 and len(asked) == 1


def fake_sbatch(tmp_path, body: str) -> str:
    """A PATH whose ``sbatch`` is the shell script ``body`` (after ``#!/bin/sh``)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\n{body}")
    (bin_dir / "sbatch").chmod(0o755)
    return f"{bin_dir}:/usr/bin:/bin"


def test_the_releaser_job_asks_for_little_and_is_never_requeued(tmp_path, monkeypatch):
    log = tmp_path / "argv"
    env = {
        "PATH": fake_sbatch(tmp_path, f'printf "%s\\n" "$@" > {log}\nenv >> {log}\necho 42\n'),
        "SLURM_JOB_ID": "12",
        "SLURM_ARRAY_JOB_ID": "7",
        "SLURM_ARRAY_TASK_ID": "3",
        "SLURM_JOB_NAME": "lr",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_RESTART_COUNT": "2",
        "SBATCH_COMMENT": "slurmkit:/x",
    }
    assert (
        releaser.submit("/s/release-3.json", "/s/release-3.out", sweep="/s", trial="t", env=env)
        == "42"
    )
    text = log.read_text()
    for option in ("--job-name=lr-release", "--no-requeue", "--partition=gpu", "--ntasks=1"):
        assert option in text.splitlines()
    assert "--job 7_3 --restarts 2 --record /s/release-3.json --sweep /s --trial t" in text
    assert "comment" not in text.lower() and "SLURM_JOB_ID" not in text


def test_show_config_text_reads_as_one_dict_for_both_sides():
    """core.slurmconf.parse: what backends.slurm.read_config and the releaser's hold read."""
    from slurmkit.core import slurmconf

    text = (
        "Configuration data as of 2026-12-05T10:00:00\n"
        "AuthInfo                = cred_expire=30\n"
        "MaxArraySize            = 1001\n\n"
        "Slurmctld(primary) at ctl is UP\n"
    )
    got = slurmconf.parse(text)
    assert got["AuthInfo"] == "cred_expire=30" and got["MaxArraySize"] == "1001"
    assert hold_seconds(got)[0] == 31 and len(got) == 2


def test_the_releaser_goes_to_the_partition_the_user_names(tmp_path):
    """SLURMKIT_RELEASE_PARTITION (a GPU partition that takes no 1-CPU job): the releaser asks
    for that partition; the job's account and qos stay."""
    log = tmp_path / "argv"
    env = {
        "PATH": fake_sbatch(tmp_path, f'printf "%s\\n" "$@" > {log}\necho 43\n'),
        "SLURM_JOB_ID": "12",
        "SLURM_JOB_NAME": "lr",
        "SLURM_JOB_PARTITION": "gpu",
        "SLURM_JOB_ACCOUNT": "team",
        "SLURMKIT_RELEASE_PARTITION": "cpu,debug",
    }
    assert releaser.submit("/s/release-1.json", "/s/release-1.out", env=env) == "43"
    argv = log.read_text().splitlines()
    assert "--partition=cpu,debug" in argv and "--account=team" in argv
    assert not any(a.startswith("--partition=gpu") for a in argv)
    assert releaser.where({**env, "SLURMKIT_RELEASE_PARTITION": ""})["partition"] == "gpu"


def test_a_refused_releaser_says_the_job_waits_and_how_to_send_it_elsewhere(tmp_path, capsys):
    refuse = (
        "echo 'sbatch: error: Batch job submission failed: Requested node configuration is not "
        "available' >&2\nexit 1\n"
    )
    env = {"PATH": fake_sbatch(tmp_path, refuse), "SLURM_JOB_ID": "12", "SLURM_JOB_NAME": "lr"}
    assert releaser.submit("/s/release-1.json", "/s/release-1.out", env=env) is None
    err = capsys.readouterr().err
    assert "no releaser for job 12: sbatch: error: Batch job submission failed" in err
    assert "requeue hold" in err and "SLURMKIT_RELEASE_PARTITION=PARTITION" in err
