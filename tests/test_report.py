"""`slurmkit report` without a cluster: sacct's rows parsed, joined with sweep directories,
split into useful and lost hours, priced, grouped and printed (tests/test_cluster_report.py
runs it on the real cluster). The sacct rows below are as the test cluster printed them."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import warnings
from pathlib import Path

import pytest
from conftest import run_cli, write_spec

from slurmkit import accounting, render, usageout
from slurmkit import spec as spec_mod
from slurmkit import usage as rep
from slurmkit.core.layout import SweepDir
from slurmkit.errors import SpecError, UserError

# Real rows of `sacct --parsable2 --duplicates --allocations` (FIELDS order; Eligible, the 6th,
# added when the query gained it): an array whose task 1 was requeued, a failed task, a pending
# array record, a job that is no array.
REAL = """\
2_0|3|COMPLETED|0:0|2026-12-02T03:42:18|2026-12-02T03:42:18|2026-12-02T03:42:18|2026-12-02T03:42:26|low|root|root|billing=1,cpu=1,gres/gpu=1,node=1|slurmkit:/runs/sw
2_1|4|REQUEUED|0:0|2026-12-02T03:42:18|2026-12-02T03:42:18|2026-12-02T03:42:18|2026-12-02T03:42:22|low|root|root|billing=1,cpu=1,gres/gpu=1,node=1|slurmkit:/runs/sw
2_2|2|FAILED|3:0|2026-12-02T03:42:18|2026-12-02T03:42:18|2026-12-02T03:42:18|2026-12-02T03:42:26|low|root|root|billing=1,cpu=1,gres/gpu=1,node=1|slurmkit:/runs/sw
2_1|4|COMPLETED|0:0|2026-12-02T03:42:26|2026-12-02T03:42:27|2026-12-02T03:42:27|2026-12-02T03:42:35|low|root|root|billing=1,cpu=1,gres/gpu=1,node=1|slurmkit:/runs/sw
9_[4-6%2]|9|PENDING|0:0|2026-12-02T04:00:00|Unknown|Unknown|Unknown|high|ml|alice||a|b
7|7|CANCELLED by 0|0:15|2026-12-02T03:42:54|2026-12-02T03:42:54|2026-12-02T03:42:55|2026-12-02T03:42:57|cpu|ml|bob|cpu=4|
not|a|row
"""  # noqa: E501
T0 = 1_800_000_000.0  # an epoch for synthetic rows


def row(**kw) -> accounting.Row:
    base = accounting.Row(
        job="10", task=0, raw="11", state="COMPLETED", exit_code=0, submit=T0, start=T0 + 5,
        end=T0 + 3605, partition="gpu", account="ml", user="alice", gpus=8, cpus=16, comment="",
    )  # fmt: skip
    return base._replace(**kw)


def record(**kw) -> dict:
    base = {"n": 1, "state": "COMPLETED", "start": T0 + 6, "end": T0 + 3600, "job_id": "11"}
    base.update(kw)
    return base


# --------------------------------------------------------------------------- #
# sacct: the query and its rows
# --------------------------------------------------------------------------- #


def test_rows_are_parsed_as_sacct_prints_them():
    rows = accounting.parse(REAL)
    assert [r.ref for r in rows] == ["2_0", "2_1", "2_2", "2_1", "9_4", "9_5", "9_6", "7"]
    first = rows[0]
    assert (first.job, first.task, first.raw, first.state, first.exit_code) == (
        "2", 0, "3", "COMPLETED", 0,
    )  # fmt: skip
    assert first.end - first.start == 8 and first.submit == first.start
    assert (first.gpus, first.cpus, first.partition, first.comment) == (
        1,
        1,
        "low",
        "slurmkit:/runs/sw",
    )
    assert rows[2].exit_code == 3
    pending = rows[4]
    assert (pending.state, pending.start, pending.end, pending.gpus) == ("PENDING", None, None, 0)
    assert pending.comment == "a|b"  # the last field keeps a '|' of its own
    assert (rows[-1].task, rows[-1].state, rows[-1].gpus, rows[-1].cpus) == (
        None,
        "CANCELLED",
        0,
        4,
    )


@pytest.mark.parametrize(
    ("tres", "expected"),
    [
        ("billing=1,cpu=1,gres/gpu=1,node=1", (1, 1)),
        ("cpu=64,gres/gpu:h100=8,gres/gpu=8,mem=1T,node=1", (8, 64)),
        ("cpu=8,gres/gpu:a100=2,gres/gpu:h100=4", (6, 8)),  # typed only: their sum
        ("", (0, 0)),
        ("cpu=x,gres/gpu=", (0, 0)),
    ],
)
def test_tres_counts(tres, expected):
    assert accounting.tres_counts(tres) == expected


def test_the_one_query():
    by_jobs = accounting.argv(jobs=["12", "15"])
    assert by_jobs[:5] == ["sacct", "--noheader", "--parsable2", "--duplicates", "--allocations"]
    assert by_jobs[-1] == "--jobs=12,15" and "--json" not in by_jobs
    assert by_jobs[5].endswith(",AllocTRES,Comment")  # the comment last: it may hold a '|'
    since = accounting.argv(since="2026-11-01T00:00:00", user="alice")
    assert since[-3:] == ["--starttime=2026-11-01T00:00:00", "--endtime=now", "--user=alice"]


def test_since_forms():
    now = 1_800_000_000.0
    assert accounting.since_time("2026-11-01") == "2026-11-01T00:00:00"
    assert accounting.since_time("2026-11-01T08:30") == "2026-11-01T08:30:00"
    local = accounting.since_time("2d", now)
    from datetime import datetime

    assert datetime.fromisoformat(local).timestamp() == now - 2 * 86400
    assert accounting.since_time("90m", now) == accounting.since_time("1h", now - 1800)
    for bad in ("yesterday", "7w", "", "2026-13-01"):
        with pytest.raises(UserError) as err:
            accounting.since_time(bad, now)
        assert err.value.key == "--since" and "7d" in err.value.hint


def test_a_failing_sacct_is_one_clear_error(tmp_path, monkeypatch):
    """Accounting switched off is what a real cluster cannot show on demand: a PATH shim."""
    shim = tmp_path / "sacct"
    shim.write_text(
        "#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n"
    )
    shim.chmod(0o755)
    with pytest.raises(UserError) as err:
        accounting.run([str(shim)])
    assert "accounting storage is disabled" in err.value.message and "doctor" in err.value.hint
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    with pytest.raises(UserError, match="sacct not found"):
        accounting.run(["sacct"])


# --------------------------------------------------------------------------- #
# Attempts: matched, ended, split
# --------------------------------------------------------------------------- #


def test_records_are_matched_by_restart_count_then_by_start():
    first = row(state="REQUEUED", start=T0, end=T0 + 20)
    second = row(submit=T0 + 21, start=T0 + 23, end=T0 + 60)  # close: a released requeue
    one, two = record(start=T0 + 1), record(n=2, start=T0 + 24, restart_count="1")
    assert rep.pair([second, first], [one, two]) == [(first, one), (second, two)]
    # without restart counts (a first run has none), the nearest start wins
    assert rep.pair([second, first], [one, {**two, "restart_count": None}]) == [
        (first, one),
        (second, {**two, "restart_count": None}),
    ]
    # a record of another job, or far outside the allocation, stands alone
    stray = record(start=T0 + 500, job_id="11")
    local = {"state": "COMPLETED", "start": T0 + 2, "end": T0 + 3}
    assert rep.pair([first], [stray, local]) == [(first, None), (None, local), (None, stray)]
    # pending rows are no attempt; a lone record from before --since is left out
    waiting = row(state="PENDING", start=None, end=None)
    assert rep.pair([waiting], [local], since=T0 + 100) == []


def join(rows, records, state="COMPLETED", commits=(), prices=None, now=T0 + 10_000):
    return rep.join_trial(rows, records, state, lambda: list(commits), prices or {}, now)


def test_an_interrupted_attempt_is_useful_up_to_its_last_checkpoint():
    preempted = row(state="PREEMPTED", start=T0, end=T0 + 3600)
    rerun = row(submit=T0 + 3700, start=T0 + 3720, end=T0 + 5520)
    records = [
        record(state="REQUEUED", cause="preemption", start=T0 + 2, end=T0 + 3599),
        record(n=2, start=T0 + 3722, end=T0 + 5519, restart_count="1"),
    ]
    commits = [T0 - 50, T0 + 900, T0 + 2700, T0 + 3700 + 900]  # one before, one after it
    a, b = join([preempted, rerun], records, commits=commits, prices={"gpu": 4.0})
    assert (a.outcome, a.cause, a.checkpoint) == ("interrupted", "preemption", T0 + 2700)
    assert a.useful_hours == pytest.approx(8 * 0.75) and a.lost_hours == pytest.approx(8 * 0.25)
    assert (b.outcome, b.cause, b.useful_hours, b.lost_hours) == ("completed", None, 8 * 0.5, 0)
    assert (a.queue_s, b.queue_s, b.run_s) == (0, 20, 1800)
    assert a.cost + b.cost == pytest.approx(4.0 * 8 * 1.5)
    # sacct's end is cut to the second: a commit within that second is the attempt's own
    late = join([preempted, rerun], records, commits=[T0 + 3600.4])[0]
    assert (late.checkpoint, late.useful_hours, late.lost_hours) == (T0 + 3600.4, 8.0, 0.0)
    # a preempted job runs on for its GraceTime after accounting's end: a commit then, before
    # the runtime's own end, is the attempt's too (its hours stay the allocation's)
    graced = [{**records[0], "end": T0 + 3604.5}, records[1]]
    late = join([preempted, rerun], graced, commits=[T0 + 3603.0])[0]
    assert (late.checkpoint, late.useful_hours, late.lost_hours) == (T0 + 3603.0, 8.0, 0.0)
    assert join([preempted, rerun], records, commits=[T0 + 3603.0])[0].checkpoint is None
    # no journal (the trial checkpoints by itself, or not at all): all of it lost
    a, _ = join([preempted, rerun], records)
    assert (a.checkpoint, a.useful_hours, a.lost_hours) == (None, 0.0, 8.0)


# (the runtime's record: state, cause), sacct's state, another attempt came after it,
# and how the attempt ended: (state, cause, outcome)
ENDINGS = [
    ("FAILED error", "FAILED", False, "FAILED error failed"),
    ("REQUEUED error", "REQUEUED", True, "REQUEUED error failed"),
    ("FAILED container", "FAILED", False, "FAILED container failed"),
    ("TIMEOUT timeout", "TIMEOUT", False, "TIMEOUT timeout failed"),
    ("REQUEUED timeout", "REQUEUED", True, "REQUEUED timeout interrupted"),
    ("FAILED preemption", "PREEMPTED", False, "FAILED preemption failed"),
    ("NODE_FAIL node_failure", "NODE_FAIL", True, "NODE_FAIL node_failure interrupted"),
    ("CANCELLED", "CANCELLED", False, "CANCELLED cancelled cancelled"),
    ("CANCELLED", "CANCELLED", True, "CANCELLED cancelled interrupted"),
    ("TERMINATED", "COMPLETED", False, "TERMINATED cancelled cancelled"),
    ("RUNNING", "NODE_FAIL", True, "NODE_FAIL node_failure interrupted"),
    ("", "OUT_OF_MEMORY", False, "FAILED error failed"),
    ("", "PREEMPTED", True, "PREEMPTED preemption interrupted"),
    ("", "REQUEUED", True, "REQUEUED preemption interrupted"),
    ("", "TIMEOUT", False, "TIMEOUT timeout failed"),
    ("", "COMPLETED", False, "COMPLETED None completed"),
]


@pytest.mark.parametrize(("recorded", "slurm", "later", "expected"), ENDINGS)
def test_how_an_attempt_ended_and_whose_hours_are_lost(recorded, slurm, later, expected):
    rows = [row(state=slurm, start=T0, end=T0 + 3600)]
    words = recorded.split()
    records = (
        [record(start=T0 + 1, state=words[0], cause=(words[1:] or [None])[0])] if words else []
    )
    if later:
        rows.append(row(submit=T0 + 3700, start=T0 + 3800, end=T0 + 4000))
    a = join(rows, records, state="FAILED", commits=[T0 + 1800])[0]
    assert f"{a.state} {a.cause} {a.outcome}" == expected
    useful = {"completed": 8.0, "interrupted": 4.0}.get(a.outcome, 0.0)
    assert (a.useful_hours, a.lost_hours) == pytest.approx((useful, 8.0 - useful))


def test_a_running_attempt_counts_until_now_and_a_requeued_trial_goes_on():
    running = row(state="RUNNING", end=None, start=T0, gpus=2)
    [a] = join([running], [record(state="RUNNING", start=T0 + 1)], state="RUNNING", now=T0 + 1800)
    assert (a.outcome, a.running_hours, a.run_s, a.lost_hours) == ("running", 1.0, 1800, 0)
    # the last attempt was preempted and the task waits again: interrupted, not failed
    preempted = row(state="PREEMPTED", start=T0, end=T0 + 3600)
    waiting = row(state="PENDING", submit=T0 + 3601, start=None, end=None)
    state = rep.trial_state("REQUEUED", [preempted, waiting])
    [a] = join([preempted, waiting], [], state=state, commits=[T0 + 3000])
    assert (state, a.outcome) == ("PENDING", "interrupted")
    assert a.useful_hours == pytest.approx(8 * 3000 / 3600)


def test_trial_states():
    done, failed = row(), row(state="FAILED", exit_code=3)
    assert rep.trial_state("COMPLETED", [row(state="RUNNING", end=None)]) == "COMPLETED"
    rerun = row(state="RUNNING", submit=T0 + 10, end=None)
    assert rep.trial_state("REQUEUED", [rerun, done]) == "RUNNING"  # the latest row's
    assert rep.trial_state("FAILED", [failed]) == "FAILED"
    assert rep.trial_state("RUNNING", [failed]) == "FAILED"  # it vanished: how Slurm saw it end
    assert rep.trial_state(None, [row(state="CANCELLED", start=None)]) == "CANCELLED"
    assert rep.trial_state(None, []) == "NOT_SUBMITTED"


def test_journal_lines():
    text = '{"step": 10, "time": 5.5}\n\n{"step": 20}\nnot json\n{"time": true}\n{"time": 7}\n'
    assert rep.commit_times(text) == ([5.5, 7.0], 3)


# --------------------------------------------------------------------------- #
# Figures, prices, groups
# --------------------------------------------------------------------------- #


def trial(state, *attempts, index=0):
    return rep.TrialReport(index, f"t{index}", state, list(attempts))


def attempt(n=1, cause=None, outcome="completed", **kw):
    a = rep.Attempt(n, "10_0", "COMPLETED" if cause is None else "FAILED", cause, outcome)
    for key, value in kw.items():
        setattr(a, key, value)
    return a


def test_figures_of_trials():
    gpu = {"unit": "gpu", "units": 8, "partition": "h100", "account": "ml", "user": "alice"}
    trials = [
        trial("COMPLETED", attempt(queue_s=10, run_s=100, useful_hours=2.0, cost=8.5, **gpu)),
        trial("COMPLETED",
              attempt(1, "preemption", "interrupted", queue_s=30, useful_hours=1, lost_hours=0.5,
                      cost=6.375, **gpu),
              attempt(2, queue_s=20, useful_hours=1, cost=4.25, **gpu), index=1),
        trial("FAILED", attempt(1, "error", "failed", queue_s=40, lost_hours=0.25, cost=1.0625,
                                **gpu), index=2),
        trial("PENDING", index=3),
    ]  # fmt: skip
    f = rep.figures(trials)
    assert f["states"] == {"COMPLETED": 2, "PENDING": 1, "FAILED": 1}
    assert (f["successful"], f["failed"], f["failure_rate"]) == (2, 1, 1 / 3)
    assert f["causes"] == {"preemption": 1, "error": 1} and f["attempts"] == 4
    assert f["queue_delay_s"] == {"median": 20, "p90": 40, "max": 40, "total": 100}
    assert f["gpu_hours"] == {"useful": 4.0, "lost": 0.75, "running": 0.0}
    assert f["cpu_hours"] is None  # no attempt without GPUs
    assert f["cost"] == pytest.approx(20.1875) and f["unpriced"] == []
    assert f["cost_per_success"] == pytest.approx(20.1875 / 2)
    trials[0].attempts[0].cost = None  # a partition without a price: no total is made up
    f = rep.figures(trials)
    assert (f["cost"], f["cost_per_success"], f["unpriced"]) == (None, None, ["h100"])
    # without accounting (the local backend) nothing is allocated, nothing costs
    local = rep.figures([trial("COMPLETED", attempt(run_s=5, cost=0.0))])
    assert (local["gpu_hours"], local["cost"], local["queue_delay_s"]["median"]) == (
        None,
        None,
        None,
    )


def test_groups_by_account_user_and_label():
    def sweep(name, labels, *trials):
        return rep.SweepReport(f"/r/{name}", name, labels, list(trials), {})

    a = sweep(
        "a",
        {"team": "nlp", "proj": "x"},
        trial(
            "COMPLETED",
            attempt(account="ml", user="alice", unit="gpu", units=1, useful_hours=1.0, cost=1.0),
        ),
    )
    b = sweep("b", {},
              trial("FAILED", attempt(1, "error", "failed", account="cv", user="alice", unit="gpu",
                                      units=1, lost_hours=2.0, cost=2.0)))  # fmt: skip
    keys = lambda by: [k for k, _ in rep.groups([a, b], by)]
    assert keys("account") == ["cv", "ml"] and keys("user") == ["alice"]
    assert keys("label") == ["(none)", "proj=x,team=nlp"]
    assert keys("label.team") == ["(none)", "nlp"]
    [(_, alice)] = rep.groups([a, b], "user")
    assert (alice["trials"], alice["gpu_hours"]["lost"], alice["cost_per_success"]) == (2, 2.0, 3.0)
    rep.check_by("label.team")
    with pytest.raises(UserError, match="cannot group by"):
        rep.check_by("label.")


def test_prices_come_from_the_report_section_of_the_user_config(tmp_path, monkeypatch, spec_file):
    config = tmp_path / "config.yaml"
    config.write_text("resources: {partition: h100}\nreport: {prices: {h100: 4.25, cpu: 0}}\n")
    monkeypatch.setenv("SLURMKIT_CONFIG", str(config))
    assert rep.read_prices() == {"h100": 4.25, "cpu": 0.0}
    # the section is no spec key: specs load as before, with the rest of the file under them
    s = spec_mod.load(str(spec_file("command: x\n")), job=True)
    assert s.resources.partition == "h100"
    for text, key in [
        ("report: {prices: {h100: -1}}", "report.prices.h100"),
        ("report: {prices: {h100: fast}}", "report.prices.h100"),
        ("report: {prices: {h100: .nan}}", "report.prices.h100"),
        ("report: {prices: [1]}", "report.prices"),
        ("report: {price: {h100: 1}}", "report.price"),
        ("report: 5", "report"),
    ]:
        config.write_text(text + "\n")
        with pytest.raises(SpecError) as err:
            rep.read_prices()
        assert (err.value.file, err.value.key) == (str(config), key), text
    with pytest.raises(SpecError) as err:  # a bad section is the file's mistake for specs too
        spec_mod.load(str(spec_file("command: x\n")), job=True)
    assert err.value.key == "report"


# --------------------------------------------------------------------------- #
# Labels and the job comment
# --------------------------------------------------------------------------- #


def test_labels_are_kept_and_the_comment_names_the_sweep_directory(spec_file):
    s = spec_mod.load(str(spec_file("command: x\nparams: {a: [1]}\nlabels: {team: nlp, run: 7}\n")))
    assert s.labels == {"team": "nlp", "run": "7"} and s.to_dict()["labels"] == s.labels
    assert spec_mod.from_dict(s.to_dict(), "sweep.json").labels == s.labels
    assert render.comment_options(s, "/runs/x-1") == ["--comment=slurmkit:/runs/x-1"]
    assert render.comment_options(s, None) == []  # standalone: its directory is made later
    own = spec_mod.load(
        str(spec_file("command: x\nparams: {a: [1]}\nresources: {extra: {comment: mine}}\n"))
    )
    assert render.comment_options(own, "/runs/x-1") == []  # without labels, theirs stays


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        ("labels: {a: b}\nresources: {extra: {comment: c}}", "resources.extra.comment",
         "job comment"),
        ("labels: {1team: nlp}", "labels.1team", "not a label name"),
        ("labels: {team-x: nlp}", "labels.team-x", "not a label name"),
        ("labels: {team: [nlp]}", "labels.team", "must be a text"),
        ("labels: {team: 1.5}", "labels.team", "must be a text"),
        ("labels: {team: ''}", "labels.team", "1 to 200 printable"),
        ('labels: {team: "a\\nb"}', "labels.team", "1 to 200 printable"),
        ("labels: [team]", "labels", "must be a mapping"),
    ],
)  # fmt: skip
def test_bad_labels_name_the_key(spec_file, body, key, words):
    with pytest.raises(SpecError) as err:
        spec_mod.load(str(spec_file(f"command: x\nparams: {{a: [1]}}\n{body}\n")))
    assert err.value.key == key and words in str(err.value)


# --------------------------------------------------------------------------- #
# A sweep directory joined with its rows
# --------------------------------------------------------------------------- #


def make_sweep(root: Path, statuses: dict[int, dict], journal: dict[int, list[float]]) -> None:
    (root / "submissions").mkdir(parents=True)
    (root / "trials").mkdir()
    ids = ["aaa", "bbb", "ccc"]
    (root / "trials.jsonl").write_text(
        "".join(
            json.dumps({"index": i, "id": t, "params": {"i": i}}) + "\n" for i, t in enumerate(ids)
        )
    )
    (root / "sweep.json").write_text(json.dumps({"name": "sw", "labels": {"team": "nlp"}}))
    jobs = [
        {"job_id": "2", "offset": 0, "array": "0-2"},
        {"job_id": "5", "offset": 2, "array": "0"},
    ]
    (root / "submissions" / "0000.json").write_text(
        json.dumps({"backend": "slurm", "state": "submitted", "jobs": jobs, "user": "root"})
    )
    for index, status in statuses.items():
        (root / "trials" / ids[index]).mkdir()
        (root / "trials" / ids[index] / "status.json").write_text(json.dumps(status))
    for index, times in journal.items():
        lines = "".join(json.dumps({"step": 1, "time": t}) + "\n" for t in times)
        (root / "trials" / ids[index] / "checkpoints.jsonl").write_text(lines)


def test_a_sweep_directory_joined_with_its_rows(tmp_path):
    rows = accounting.parse(REAL)
    start = rows[0].start
    statuses = {
        0: {"state": "COMPLETED", "attempts": [record(start=start + 1, end=start + 7, job_id="3")]},
        1: {
            "state": "COMPLETED",
            "attempts": [
                record(state="REQUEUED", cause="preemption", start=start + 1, end=start + 3,
                       job_id="4"),
                record(n=2, start=start + 10, end=start + 16, job_id="4", restart_count="1"),
            ],
        },
    }  # fmt: skip
    make_sweep(tmp_path, statuses, {1: [start + 2]})
    (tmp_path / "trials" / "ccc").mkdir()
    (tmp_path / "trials" / "ccc" / "status.json").write_text("{damaged")
    warned: list[str] = []
    s = rep._read(SweepDir(str(tmp_path)), warned).report(rows, {"low": 3600.0}, start + 100, None)
    assert (s.name, s.labels) == ("sw", {"team": "nlp"})
    # a damaged status file: the trial is DAMAGED (as `slurmkit status` says), its attempt
    # is still there from accounting
    assert [t.state for t in s.trials] == ["COMPLETED", "COMPLETED", "DAMAGED"]
    assert any("ccc" in w and "DAMAGED" in w for w in warned)
    assert [a.job for a in s.trials[1].attempts] == ["2_1", "2_1"]
    first, second = s.trials[1].attempts
    assert (first.cause, first.checkpoint, first.useful_hours * 3600) == (
        "preemption",
        start + 2,
        2,
    )
    assert first.lost_hours * 3600 == pytest.approx(2) and second.queue_s == 1
    # trial 2: job 2's task 2 (job 5, a later submission of it, has no rows): a failure, from sacct
    [failed] = s.trials[2].attempts
    assert (failed.job, failed.cause, failed.lost_hours * 3600) == ("2_2", "error", 8)
    # 8 s of trial 0, 2 s up to trial 1's checkpoint and its 8 s rerun; 2 + 8 s lost
    gpu = s.figures["gpu_hours"]
    assert (gpu["useful"] * 3600, gpu["lost"] * 3600) == pytest.approx((18, 10))
    assert s.figures["cost"] == pytest.approx(28.0)  # 28 GPU-seconds at 3600 an hour


def test_array_tasks_map_to_trials_as_each_record_says(tmp_path):
    """The submitit backend records one entry per run of consecutive trials of an array: job 2
    ran trials 0 and 2 as its tasks 0 and 1 (a resume of those two)."""
    make_sweep(tmp_path, {}, {})
    jobs = [{"job_id": "2", "offset": 0, "array": "0"}, {"job_id": "2", "offset": 1, "array": "1"}]
    (tmp_path / "submissions" / "0000.json").write_text(
        json.dumps({"backend": "submitit", "state": "submitted", "jobs": jobs, "user": "root"})
    )
    rows = accounting.parse(REAL)
    s = rep._read(SweepDir(str(tmp_path)), []).report(rows, {}, rows[0].start + 100, None)
    assert [[a.job for a in t.attempts] for t in s.trials] == [["2_0"], [], ["2_1", "2_1"]]


def test_since_attributes_jobs_by_their_comment(tmp_path):
    make_sweep(tmp_path / "sw", {}, {})
    text = REAL.replace("slurmkit:/runs/sw", f"slurmkit:{tmp_path / 'sw'}")
    text += text.splitlines()[0].replace(str(tmp_path / "sw"), str(tmp_path / "gone")) + "\n"
    warned: list[str] = []
    rows = accounting.parse(text)
    sweeps = rep._from_comments(rows, {}, rows[0].start + 100, rows[0].start - 1, warned)
    by_name = {s.name: s for s in sweeps}
    assert set(by_name) == {"sw", "gone", rep.OTHER_JOBS}
    assert [t.id for t in by_name["sw"].trials] == ["aaa", "bbb", "ccc"]
    assert [t.id for t in by_name["gone"].trials] == ["2_0"]
    assert sorted(t.id for t in by_name[rep.OTHER_JOBS].trials) == ["7", "9_4", "9_5", "9_6"]
    assert any("gone: no sweep directory" in w for w in warned)


# --------------------------------------------------------------------------- #
# Outputs
# --------------------------------------------------------------------------- #


def small_report(**kw) -> rep.Report:
    a = attempt(unit="gpu", units=2, useful_hours=1.5, lost_hours=0.5, cost=8.0, queue_s=12.0,
                run_s=3600.0, partition="h100", account="ml", user="alice", start=T0, end=T0 + 3600,
                submit=T0 - 12)  # fmt: skip
    b = attempt(2, "error", "failed", unit="gpu", units=2, lost_hours=1.0, cost=4.0,
                partition="h100", account="ml", user="alice")  # fmt: skip
    trials = [trial("COMPLETED", a), trial("FAILED", b, index=1)]
    odd = 'we "quote"\\n\nline'
    sweep = rep.SweepReport("/r/x", odd, {"team": odd}, trials, rep.figures(trials))
    return rep.Report([sweep], {"h100": 2.0}, ["sacct"], **kw)


def test_prometheus_text_format():
    text = usageout.prometheus(small_report(by="account"))
    sample = re.compile(r'^slurmkit_report_[a-z_]+(\{([a-z_]+="([^"\\\n]|\\.)*",?)*\})? \S+$')
    names = set()
    for line in text.splitlines():
        if line.startswith("# TYPE"):
            names.add(line.split()[2])
        elif not line.startswith("# HELP"):
            assert sample.match(line), line
    assert "slurmkit_report_queue_delay_seconds" in names and text.endswith("\n")
    assert 'sweep="we \\"quote\\"\\\\n\\nline"' in text  # escaped: ", \ and newline
    assert re.search(r'^slurmkit_report_gpu_hours\{[^}]*kind="lost"\} 1\.5$', text, re.M)
    assert re.search(r'^slurmkit_report_attempts\{[^}]*cause="error"\} 1$', text, re.M)
    assert re.search(
        r'^slurmkit_report_cost_per_successful_trial\{by="account",group="ml"\} 12\.0$', text, re.M
    )


def test_csv_has_one_row_per_attempt():
    buffer = io.StringIO()
    usageout.write_csv(small_report(), buffer)
    rows = list(csv.DictReader(io.StringIO(buffer.getvalue())))
    assert [r["attempt"] for r in rows] == ["1", "2"] and list(rows[0]) == list(
        usageout.CSV_COLUMNS
    )
    assert (rows[1]["cause"], rows[1]["lost_hours"], rows[1]["start"]) == ("error", "1.0", "")
    assert json.loads(rows[0]["labels"])["team"].startswith("we")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d", rows[0]["start"])


def test_json_document_and_table(capsys):
    doc = small_report(by="user").as_dict()
    assert doc["queries"] == 1 and doc["totals"]["cost"] == 12.0
    assert doc["groups"] == [{"group": "alice", **doc["totals"]}]
    assert doc["sweeps"][0]["trials"][1]["attempts"][0]["cause"] == "error"
    json.dumps(doc, allow_nan=False)
    usageout.print_tables(small_report(), show_trials=True)
    shown = capsys.readouterr().out
    assert "1 error" in shown and shown.count("12.00") == 2  # cost, and per success (one)
    assert not any(line.strip().startswith("line") for line in shown.splitlines())  # one line
    assert usageout.duration(3725) == "1h02m" and usageout.duration(None) == "-"
    assert [usageout.amount(v) for v in (0, 0.004234, 0.5, 1234.5, None)] == [
        "0.00", "0.00423", "0.5", "1,234.50", "-",
    ]  # fmt: skip


def test_plot_needs_matplotlib(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    with pytest.raises(UserError) as err:
        usageout.check_plot()
    assert err.value.exit_code == 1 and "slurmkit[plot]" in err.value.hint


@pytest.mark.slow
def test_plot_writes_a_whole_png(tmp_path):
    usageout.plot(small_report(), str(tmp_path / "r.png"))
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG" and os.listdir(tmp_path) == ["r.png"]


def test_the_report_modules_leave_slurmkit_report_to_training_code():
    import slurmkit

    assert callable(slurmkit.report) and slurmkit.report.__module__ == "slurmkit.runtime.report"


# --------------------------------------------------------------------------- #
# The checkpoint journal
# --------------------------------------------------------------------------- #


def test_the_checkpointer_journals_every_commit_inside_a_trial(tmp_path, monkeypatch):
    from slurmkit.runtime.checkpoint import Checkpointer

    trial_dir = tmp_path / "trial"
    trial_dir.mkdir()
    monkeypatch.setenv("SLURMKIT_TRIAL_DIR", str(trial_dir))
    monkeypatch.setenv("SLURMKIT_ATTEMPT", "2")
    ckpt = Checkpointer(tmp_path / "ckpt", keep=1, mirror=False)
    for step in (1, 2, 3):
        ckpt.save({"w": step}, step)
    ckpt.close()
    assert ckpt.steps() == [3]  # pruned ...
    lines = [json.loads(x) for x in (trial_dir / "checkpoints.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2, 3] and {x["attempt"] for x in lines} == {
        "2"
    }  # ... not journaled away
    assert lines[0]["time"] <= lines[1]["time"] <= lines[2]["time"]
    monkeypatch.delenv("SLURMKIT_TRIAL_DIR")  # outside a trial: no journal anywhere
    Checkpointer(tmp_path / "other", mirror=False).save({"w": 0}, 0)
    assert sorted(p.name for p in tmp_path.rglob("checkpoints.jsonl")) == ["checkpoints.jsonl"]


def test_a_journal_that_cannot_be_written_warns_and_the_checkpoint_stands(tmp_path, monkeypatch):
    from slurmkit.runtime.checkpoint import Checkpointer

    monkeypatch.setenv("SLURMKIT_TRIAL_DIR", str(tmp_path / "missing"))
    ckpt = Checkpointer(tmp_path / "ckpt", mirror=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ckpt.save({"w": 1}, 1)
    assert any("not journaled" in str(w.message) for w in caught)
    assert ckpt.latest_step() == 1


# --------------------------------------------------------------------------- #
# The command
# --------------------------------------------------------------------------- #


@pytest.mark.parametrize(
    ("args", "words"),
    [
        ([], "give sweep directories, or --since"),
        (["DIR", "--since", "7d"], "give sweep directories, or --since"),
        (["DIR", "--user", "bob"], "--user goes with --since"),
        (["DIR", "--json", "--csv"], "give one of them"),
        (["DIR", "--by", "team"], "cannot group by"),
        (["--since", "soon"], "is not a time"),
        (["/nonexistent"], "is not a sweep directory"),
    ],
)
def test_usage_errors_are_clear(args, words, tmp_path):
    make_sweep(tmp_path / "sw", {}, {})
    args = [str(tmp_path / "sw") if a == "DIR" else a for a in args]
    proc = run_cli("report", *args)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_report_of_a_local_sweep(tmp_path):
    spec = write_spec(
        tmp_path / "s.yaml",
        "command: [python, -c, 'import sys; sys.exit(int(sys.argv[1][-1]))']\n"
        "params: {code: [0, 3]}\nlabels: {team: nlp}\n",
    )
    proc = run_cli("sweep", str(spec), f"output_root={tmp_path}", "--backend", "local", "--json")
    root = json.loads(proc.stdout)["sweep_dir"]
    assert json.loads(Path(root, "sweep.json").read_text())["labels"] == {"team": "nlp"}
    proc = run_cli("report", root, "--json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["queries"] == 0 and doc["query"] is None  # no Slurm job: no accounting asked
    [s] = doc["sweeps"]
    assert (s["successful"], s["failed"], s["causes"], s["gpu_hours"]) == (1, 1, {"error": 1}, None)
    assert all(
        a["run_s"] is not None and a["queue_s"] is None for t in s["trials"] for a in t["attempts"]
    )
