"""`slurmkit report`'s goodput split and ETTR over synthetic accounting rows and attempt records:
each kind of lost time exact, the kinds summing to the wall time, records without the newer keys
(first_progress, last_checkpoint, hang, blamed) said unknown, and the JSON, CSV and Prometheus
outputs carrying the same numbers (tests/test_cluster_report.py checks them on the cluster)."""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict

import pytest

from slurmkit import accounting, goodput, usageout
from slurmkit import usage as rep

T0 = 1_800_000_000.0
H = 4 / 3600  # unit-hours of one second of a 4-GPU attempt


def row(**kw) -> accounting.Row:
    base = accounting.Row(
        job="10", task=0, raw="11", state="COMPLETED", exit_code=0, submit=T0, start=T0,
        end=T0 + 1000, partition="gpu", account="ml", user="alice", gpus=4, cpus=8, comment="",
        eligible=T0,
    )  # fmt: skip
    return base._replace(**kw)


def record(n=1, **kw) -> dict:
    base = {"n": n, "state": "COMPLETED", "job_id": "11", "restart_count": str(n - 1)}
    return {**base, **kw}


def join(rows, records, commits=(), state="COMPLETED", reports=(), now=T0 + 100_000):
    return rep.join_trial(
        rows, records, state, lambda: list(commits), {}, now, None, lambda: list(reports)
    )


def seconds(a) -> dict[str, float]:
    """The attempt's split in seconds of its 4 GPUs, the kinds that are not zero."""
    out = {k: round(getattr(a, f"{k}_hours") / H, 6) for k in goodput.KINDS}
    return {k: v for k, v in out.items() if v}


# A time-limit requeue: attempt 1 checkpoints at +590 and ends at +600; Slurm holds the job
# until +725 (its Eligible), it starts at +730, takes its first step at +745 and completes.
TIMEOUT_ROWS = [
    row(state="REQUEUED", end=T0 + 600),
    row(submit=T0 + 604, eligible=T0 + 725, start=T0 + 730, end=T0 + 1730),
]
TIMEOUT_RECORDS = [
    record(state="REQUEUED", cause="timeout", start=T0 + 1, end=T0 + 600),
    record(2, start=T0 + 731, end=T0 + 1730, first_progress=T0 + 745),
]


def test_queued_is_from_eligible_to_start_and_the_rest_productive():
    [a] = join([row(submit=T0 - 50, eligible=T0 + 10, start=T0 + 100, end=T0 + 1100)], [])
    # before Eligible (a user's hold, --begin, a dependency) is the user's: not counted
    assert seconds(a) == {"queued": 90, "productive": 1000}
    split = goodput.summary([a], "gpu")
    assert split["ettr"] == pytest.approx(1000 / 1090) and split["ettr_allocated"] == 1.0
    assert split["lost"] == pytest.approx(90 * H) and split["unknown"] == {}


def test_hold_restart_and_work_lost_since_the_last_checkpoint():
    a, b = join(TIMEOUT_ROWS, TIMEOUT_RECORDS, commits=[T0 + 300, T0 + 590])
    assert (a.outcome, b.outcome) == ("interrupted", "completed")
    assert seconds(a) == {"productive": 590, "lost_work": 10}
    # the hold: from the last attempt's end to Eligible (the old job's epilog included)
    assert seconds(b) == {"hold": 125, "queued": 5, "restart": 15, "productive": 985}
    assert (b.eligible, b.first_step, b.unknown) == (T0 + 725, T0 + 745, ())
    split = goodput.summary([a, b], "gpu")
    lost = 10 + 125 + 5 + 15
    assert split["lost"] == pytest.approx(lost * H)
    assert split["ettr"] == pytest.approx(1575 / (1575 + lost))
    assert split["ettr_allocated"] == pytest.approx(1575 / 1600)
    # without a journal, the runtime's last_checkpoint; without either, all of it lost
    records = [{**TIMEOUT_RECORDS[0], "last_checkpoint": T0 + 580}, TIMEOUT_RECORDS[1]]
    assert seconds(join(TIMEOUT_ROWS, records)[0]) == {"productive": 580, "lost_work": 20}
    assert seconds(join(TIMEOUT_ROWS, TIMEOUT_RECORDS)[0]) == {"lost_work": 600}


def test_the_first_step_comes_from_the_metrics_where_the_record_has_none():
    bare = [TIMEOUT_RECORDS[0], {k: v for k, v in TIMEOUT_RECORDS[1].items() if k != "end"}]
    del bare[1]["first_progress"]
    read = []

    def reports():
        read.append(1)
        return [T0 + 100, T0 + 742.5, T0 + 800]

    _, b = rep.join_trial(TIMEOUT_ROWS, bare, "COMPLETED", list, {}, T0 + 1e5, None, reports)
    assert seconds(b)["restart"] == 12.5 and b.first_step == T0 + 742.5 and read == [1]
    # neither: the restart is unknown (zero, and said so), its time counted productive
    _, b = join(TIMEOUT_ROWS, bare)
    assert seconds(b) == {"hold": 125, "queued": 5, "productive": 1000}
    assert b.unknown == ("restart",) and b.first_step is None
    assert goodput.summary([b], "gpu")["unknown"] == {"restart": 1}
    # a record that has it: no metrics read
    read.clear()
    rep.join_trial(TIMEOUT_ROWS, TIMEOUT_RECORDS, "COMPLETED", list, {}, T0 + 1e5, None, reports)
    assert read == []


def test_a_hang_costs_from_its_last_progress_to_its_end():
    hung = {"last_progress": T0 + 400, "declared": T0 + 580, "timeout": 180, "file": "hang-1.txt"}
    records = [
        record(state="REQUEUED", cause="hang", start=T0 + 1, end=T0 + 600, hang=hung,
               last_checkpoint=T0 + 300),
        TIMEOUT_RECORDS[1],
    ]  # fmt: skip
    a, _ = join(TIMEOUT_ROWS, records)
    assert (a.cause, a.outcome) == ("hang", "interrupted")
    assert seconds(a) == {"productive": 300, "lost_work": 100, "hang": 200}
    # no hang block: the record's last_progress; neither: unknown, all of it lost work
    records[0] = {**records[0], "hang": None, "last_progress": T0 + 450}
    assert seconds(join(TIMEOUT_ROWS, records)[0])["hang"] == 150
    records[0] = {**records[0], "last_progress": None}
    a, _ = join(TIMEOUT_ROWS, records)
    assert seconds(a) == {"productive": 300, "lost_work": 300} and a.unknown == ("hang",)


@pytest.mark.parametrize(
    ("recorded", "slurm"),
    [
        ({"state": "REQUEUED", "cause": "node", "blamed": ["n3"]}, "REQUEUED"),
        ({"state": "REQUEUED", "cause": "error", "blamed": ["n3"]}, "REQUEUED"),
        ({"state": "NODE_FAIL", "cause": "node_failure"}, "NODE_FAIL"),
        (None, "NODE_FAIL"),  # no record: Slurm's state says it
    ],
)
def test_a_node_attributed_failure_is_bad_node_time_from_its_last_checkpoint(recorded, slurm):
    records = [record(start=T0 + 1, end=T0 + 600, **(recorded or {})), TIMEOUT_RECORDS[1]]
    a, _ = join([TIMEOUT_ROWS[0]._replace(state=slurm), TIMEOUT_ROWS[1]],
                records if recorded else [], commits=[T0 + 200])  # fmt: skip
    if a.cause == "error":  # a failure the trial went on from, not an interruption
        assert seconds(a) == {"bad_node": 600}
    else:
        assert seconds(a) == {"productive": 200, "bad_node": 400}
    assert a.blamed == tuple((recorded or {}).get("blamed", ()))


def test_the_nodes_blamed_are_counted_per_sweep(capsys):
    blamed = {"state": "REQUEUED", "cause": "node", "blamed": ["n3"]}
    records = [record(start=T0 + 1, end=T0 + 600, **blamed), TIMEOUT_RECORDS[1]]
    trials = [rep.TrialReport(i, str(i), "COMPLETED", join(TIMEOUT_ROWS, records)) for i in (0, 1)]
    sweep = rep.SweepReport("/r/s", "s", {}, trials, rep.figures(trials))
    report = rep.Report([sweep], {}, ["sacct"])
    assert report.as_dict()["sweeps"][0]["blamed"] == {"n3": 2} == report.totals["blamed"]
    assert re.search(r'^slurmkit_report_blamed_attempts\{.*node="n3"\} 2$',
                     usageout.prometheus(report), re.M)  # fmt: skip
    usageout.print_tables(report, show_trials=False)
    assert "n3 (2)" in capsys.readouterr().err


def test_a_failed_attempt_is_lost_after_its_restart_and_a_running_one_not_split():
    first, failed = join(
        TIMEOUT_ROWS,
        [TIMEOUT_RECORDS[0], {**TIMEOUT_RECORDS[1], "state": "FAILED", "cause": "error"}],
        state="FAILED",
        commits=[T0 + 590, T0 + 1700],
    )
    assert (failed.outcome, seconds(failed)) == (
        "failed", {"hold": 125, "queued": 5, "restart": 15, "failed": 985},
    )  # fmt: skip
    assert seconds(first) == {"productive": 590, "lost_work": 10}
    [alone] = join([row(state="FAILED")], [record(state="FAILED", cause="error", start=T0 + 1)])
    assert seconds(alone) == {"failed": 1000} and goodput.summary([alone], "gpu")["ettr"] == 0
    running = row(state="RUNNING", end=None, eligible=T0 - 20, submit=T0 - 30)
    [live] = join([running], [record(state="RUNNING", start=T0 + 1)], state="RUNNING", now=T0 + 300)
    assert seconds(live) == {"queued": 20, "running": 300}
    assert goodput.summary([live], "gpu")["ettr"] == 0.0  # running: in neither side


def test_waits_without_eligible_and_a_resubmission_are_not_a_hold():
    rows = [TIMEOUT_ROWS[0], TIMEOUT_ROWS[1]._replace(eligible=None)]
    _, b = join(rows, TIMEOUT_RECORDS)
    assert seconds(b) == {"hold": 4, "queued": 126, "restart": 15, "productive": 985}
    assert b.unknown == ("hold",)
    # a trial resumed as a new job (slurmkit resume): its wait is queue time, from Eligible
    again = TIMEOUT_ROWS[1]._replace(job="20", raw="21", submit=T0 + 5000, eligible=T0 + 5000,
                                     start=T0 + 5030, end=T0 + 6030)  # fmt: skip
    records = [TIMEOUT_RECORDS[0], {**TIMEOUT_RECORDS[1], "job_id": "21", "restart_count": "0",
               "start": T0 + 5031, "end": T0 + 6030, "first_progress": T0 + 5040}]  # fmt: skip
    _, b = join([TIMEOUT_ROWS[0], again], records, commits=[T0 + 590])
    assert seconds(b) == {"queued": 30, "restart": 10, "productive": 990}


def test_the_kinds_sum_to_the_wall_time_and_refine_useful_and_lost():
    attempts = [
        *join(TIMEOUT_ROWS, TIMEOUT_RECORDS, commits=[T0 + 590]),
        *join(TIMEOUT_ROWS, TIMEOUT_RECORDS),
        *join([row(state="FAILED")], [record(state="FAILED", cause="error", start=T0)]),
    ]
    for a in attempts:
        allocated = sum(getattr(a, f"{k}_hours") for k in goodput.KINDS if k not in goodput.WAITING)
        assert allocated == pytest.approx(a.useful_hours + a.lost_hours + a.running_hours)
    split = goodput.summary(attempts, "gpu")
    wall = sum(split[k] for k in goodput.KINDS)
    assert wall == pytest.approx(split["productive"] + split["lost"] + split["running"])
    # per trial: queued + hold + allocated = from first Eligible to the last end
    assert sum(getattr(a, f"{k}_hours") for a in attempts[:2] for k in goodput.KINDS) == (
        pytest.approx(1730 * H)
    )
    assert goodput.summary(attempts, "cpu") is None


def _report() -> rep.Report:
    cpu = row(gpus=0, cpus=2, raw="31", job="30", eligible=T0 - 5, submit=T0 - 9)
    no_first = {k: v for k, v in TIMEOUT_RECORDS[1].items() if k != "first_progress"}
    trials = [
        rep.TrialReport(0, "a", "COMPLETED", join(TIMEOUT_ROWS, TIMEOUT_RECORDS, [T0 + 590])),
        rep.TrialReport(1, "b", "COMPLETED", join(TIMEOUT_ROWS, [TIMEOUT_RECORDS[0], no_first])),
        rep.TrialReport(2, "c", "COMPLETED", join([cpu], [])),
    ]
    sweep = rep.SweepReport("/r/s", "s", {}, trials, rep.figures(trials))
    return rep.Report([sweep], {}, ["sacct"])


def test_json_csv_and_prometheus_carry_the_same_figures():
    report = _report()
    doc = report.as_dict()["sweeps"][0]
    gpu, cpu = doc["gpu_goodput"], doc["cpu_goodput"]
    assert doc["ettr"] == gpu["ettr"] and gpu["unknown"] == {"restart": 1}
    assert cpu["productive"] == pytest.approx(2000 / 3600) and cpu["queued"] == pytest.approx(
        10 / 3600
    )
    buffer = io.StringIO()
    usageout.write_csv(report, buffer)
    summed: dict[tuple[str, str], float] = defaultdict(float)
    unknown: dict[str, int] = defaultdict(int)
    for r in csv.DictReader(io.StringIO(buffer.getvalue())):
        for kind in goodput.KINDS:
            summed[r["unit"], kind] += float(r[f"{kind}_hours"])
        for figure in r["unknown"].split():
            unknown[figure] += 1
    text = usageout.prometheus(report)
    series = re.compile(
        r'^slurmkit_report_goodput_hours\{.*unit="(\w+)",kind="(\w+)"\} (\S+)$', re.M
    )
    prom = {(m[1], m[2]): float(m[3]) for m in series.finditer(text)}
    for unit, split in (("gpu", gpu), ("cpu", cpu)):
        for kind in goodput.KINDS:
            assert summed[unit, kind] == pytest.approx(split[kind]), (unit, kind)
            assert prom[unit, kind] == pytest.approx(split[kind]), (unit, kind)
        ettr = re.search(rf'^slurmkit_report_ettr\{{.*unit="{unit}"\}} (\S+)$', text, re.M)
        assert float(ettr[1]) == pytest.approx(split["ettr"])
    assert dict(unknown) == gpu["unknown"]
    assert re.search(r'goodput_unknown_attempts\{.*unit="gpu",figure="restart"\} 1$', text, re.M)


def test_the_table_says_where_the_hours_went(capsys):
    usageout.print_tables(_report(), show_trials=False)
    shown = capsys.readouterr().out
    assert "where the hours went" in shown and "lost work" in shown and "1 restart" in shown
    ettr = goodput.summary([a for t in _report().sweeps[0].trials for a in t.attempts], "gpu")
    assert usageout.percent(ettr["ettr"]) in shown


def test_a_pruned_trial_ran_productively_to_its_end():
    """A trial its search pruned did what it was asked (issue 25): its run is productive, as a
    completed one's, in its first attempt and in an attempt after a requeue alike."""
    one = join([row()], [record(state="PRUNED", start=T0 + 1, end=T0 + 1000)], state="PRUNED")
    assert one[0].outcome == "pruned"
    assert seconds(one[0]) == {"productive": 1000}
    two = join(TIMEOUT_ROWS, [TIMEOUT_RECORDS[0], {**TIMEOUT_RECORDS[1], "state": "PRUNED"}],
               [T0 + 590], state="PRUNED")  # fmt: skip
    assert two[1].outcome == "pruned"
    assert seconds(two[1]) == {"hold": 125, "queued": 5, "restart": 15, "productive": 985}
