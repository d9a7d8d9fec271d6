"""Bad nodes: attribution (runtime/nodefault.py, pure) and the sweep's node records
(core/badnodes.py): who is suspect, who is excluded, and never too many."""

from __future__ import annotations

import threading

import pytest

from slurmkit.core import badnodes
from slurmkit.runtime import nodefault

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"
NODES = ["n1", "n2", "n3", "n4"]


@pytest.mark.parametrize(
    ("nodelist", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-3]", ["n1", "n2", "n3"]),
        ("gpu-[007-009,012],cpu1", ["gpu-007", "gpu-008", "gpu-009", "gpu-012", "cpu1"]),
        ("a[1-2]b,c", ["a1b", "a2b", "c"]),
        ("", []),
    ],
)
def test_a_slurm_host_list_is_expanded_as_scontrol_does(nodelist, names):
    assert badnodes.expand(nodelist) == names


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        (ECC, "ecc"),
        ("NCCL error in: ProcessGroupNCCL.cpp:1269, unhandled system error, NCCL version", "nccl"),
        ("RuntimeError: No CUDA GPUs are available", "no_gpu"),
        ("OSError: [Errno 30] Read-only file system: '/data/ckpt'", "mount"),
        (
            "selfcheck FAILED: n1 rank 0: path: /shared: not a directory here: is it mounted?",
            "selfcheck",
        ),
        ("slurmstepd: error: pyxis: couldn't start container", "container"),
    ],
)
def test_each_known_signature_on_a_one_node_attempt_blames_that_node(line, kind):
    blame = nodefault.attribute(1, f"step 3\n{line}\nsrun: error: task 0: exited 1\n", ["n2"])
    assert blame == nodefault.Blame(kind, ("n2",), line)


@pytest.mark.parametrize(
    "output",
    [
        "Traceback (most recent call last):\nValueError: bad learning rate\n",
        "error: unrecognized arguments: --lr\n",
        "srun: unrecognized option '--container-image=x'\n",  # the cluster's (no pyxis)
        "pyxis: failed to import docker image\n",  # the job's image, everywhere
    ],
)
def test_a_trials_own_error_blames_no_node(output):
    assert nodefault.attribute(1, output, ["n2"]) is None


def test_success_and_an_unknown_node_list_blame_nothing():
    assert nodefault.attribute(0, ECC, ["n2"]) is None
    assert nodefault.attribute(1, ECC, []) is None


def test_a_labelled_multi_node_output_blames_the_rank_s_node():
    """srun --label: rank 3 of 2 tasks per node is on the second node."""
    out = f"0: step 1\n1: step 1\n3: {ECC}\n2: step 1\n"
    blame = nodefault.attribute(1, out, ["n1", "n2"], tasks_per_node="2(x2)")
    assert blame is not None and blame.nodes == ("n2",) and blame.kind == "ecc"


def test_a_line_that_names_its_node_blames_it():
    out = "n3: NCCL WARN socket: unhandled system error\n"
    blame = nodefault.attribute(1, out, ["n1", "n3"])
    assert blame is not None and blame.nodes == ("n3",)


def test_the_same_signature_on_every_node_is_the_jobs():
    out = f"0: {ECC}\n1: {ECC}\n"
    assert nodefault.attribute(1, out, ["n1", "n2"], tasks_per_node="1(x2)") is None


def test_a_signature_whose_node_is_unknown_is_a_nodes_fault_but_blames_none():
    blame = nodefault.attribute(1, ECC, ["n1", "n2"])
    assert blame is not None and blame.nodes == ()


def test_the_users_own_patterns_and_exit_codes():
    blame = nodefault.attribute(
        1, "kernel: Xid 79 fell off the bus\n", ["n4"], patterns=[r"Xid \d+"]
    )
    assert blame == nodefault.Blame("pattern", ("n4",), "kernel: Xid 79 fell off the bus")
    blame = nodefault.attribute(139, "segfault\n", ["n4"], exit_codes=[139])
    assert blame == nodefault.Blame("exit_code", ("n4",), "exit code 139")
    assert nodefault.attribute(1, "segfault\n", ["n4"], exit_codes=[139]) is None


def test_rank_nodes_reads_slurm_tasks_per_node():
    assert nodefault.rank_nodes(["a", "b", "c"], "2(x2),1") == ["a", "a", "b", "b", "c"]
    assert nodefault.rank_nodes(["a", "b"], "3") == []


def test_a_hang_blames_the_nodes_whose_ranks_stopped_first():
    hang = {
        "timeout": 20,
        "ranks": {
            "0": {"node": "n1", "last_progress": 100.0},
            "1": {"node": "n2", "last_progress": 160.0},
        },
    }
    assert nodefault.hang_nodes(hang, ["n1", "n2"]) == ("n1",)
    assert (
        nodefault.hang_nodes({"timeout": 20, "nodes": {"n1": 150, "n2": 160}}, ["n1", "n2"]) == ()
    )
    assert nodefault.hang_nodes({"timeout": 20}, ["n1"]) == ()


def _failure(trial, n, blamed, kind="ecc", t=0.0, **extra):
    return {
        "trial": trial,
        "attempt": n,
        "time": t,
        "blamed": blamed,
        "kind": kind,
        "evidence": f"{kind} on {blamed}",
        "nodes": blamed,
        **extra,
    }


def test_a_node_is_excluded_after_two_failures_and_a_trial_avoids_its_own(tmp_path):
    root = str(tmp_path)
    badnodes.record(root, _failure("t1", 1, ["n2"], t=1))
    assert badnodes.excluded(root) == []
    assert badnodes.for_trial(root, "t1") == ["n2"] and badnodes.for_trial(root, "t2") == []
    badnodes.record(root, _failure("t2", 1, ["n2"], t=2))
    assert badnodes.excluded(root) == ["n2"]
    assert badnodes.for_trial(root, "t3") == ["n2"]
    [s] = badnodes.suspects(root)
    assert (s.node, s.failures, s.trials, s.excluded) == ("n2", 2, ["t1", "t2"], True)


def test_exclude_after_is_the_sweeps_and_zero_excludes_nothing(tmp_path):
    root = str(tmp_path)
    for n in (1, 2, 3):
        badnodes.record(root, _failure("t1", n, ["n2"], t=n, exclude_after=0))
    assert badnodes.excluded(root) == [] and badnodes.suspects(root)[0].failures == 3
    badnodes.record(root, _failure("t1", 4, ["n2"], t=4, exclude_after=4))
    assert badnodes.excluded(root) == ["n2"]


def test_never_more_than_a_share_of_the_partition_is_excluded():
    records = [
        _failure(f"t{i}", 1, [node], t=i, partition_nodes=8)
        for i, node in enumerate(["n1", "n1", "n2", "n2", "n2", "n3", "n3"])
    ]
    # a quarter of 8 nodes: the two with the most failures (then the earliest)
    assert [s.node for s in badnodes.tally(records) if s.excluded] == ["n2", "n1"]
    assert [s.node for s in badnodes.tally(records[:4]) if s.excluded] == ["n1", "n2"]
    unknown = [{**r, "partition_nodes": None} for r in records]
    assert [s.node for s in badnodes.tally(unknown) if s.excluded] == ["n2"]


def test_a_failure_every_node_shows_is_widespread_not_the_nodes():
    """A container that fails wherever it goes: past the share the sweep may exclude (plus one),
    it is the job's."""
    records = [_failure("t1", 1, ["n1"], "container"), _failure("t2", 1, ["n2"], "container")]
    assert not badnodes.widespread(records[:1], "container", ["n2"])
    assert badnodes.widespread(records, "container", ["n3"])
    assert not badnodes.widespread(records, "container", ["n2"])  # no new node
    assert not badnodes.widespread(records, "ecc", ["n3"])


def test_concurrent_writers_lose_no_failure(tmp_path):
    root = str(tmp_path)
    threads = [
        threading.Thread(target=badnodes.record, args=(root, _failure(f"t{i}", 1, ["n1"], t=i)))
        for i in range(16)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(badnodes.failures(root)) == 16


def test_damaged_records_are_skipped(tmp_path):
    root = str(tmp_path)
    badnodes.record(root, _failure("t1", 1, ["n1"]))
    (tmp_path / "nodes" / "t2-1.json").write_text("{half")
    (tmp_path / "nodes" / "t3-1.json").write_text('{"blamed": "n1"}')
    assert [r["trial"] for r in badnodes.failures(root)] == ["t1"]


def test_merged_joins_host_lists():
    assert badnodes.merged(["n[1-2]"], ["n2", "n4"]) == ["n1", "n2", "n4"]


def test_suspects_across_sweeps_and_the_recent_ones_under_an_output_root(tmp_path):
    for sweep, trial, node, t in (
        ("a", "t1", "n2", 10),
        ("a", "t2", "n2", 11),
        ("b", "t1", "n2", 12),
        ("b", "t2", "n1", 13),
        ("old", "t1", "n3", 1),
    ):
        badnodes.record(str(tmp_path / sweep), _failure(trial, 1, [node], t=t))
    (tmp_path / "not-a-sweep").mkdir()
    rows = badnodes.recent(str(tmp_path), since=5)
    assert [(r["node"], r["failures"], r["sweeps"], r["excluded_in"]) for r in rows] == [
        ("n2", 3, ["a", "b"], 1),
        ("n1", 1, ["b"], 0),
    ]
    assert rows[0]["evidence"] == "ecc on ['n2']" and rows[0]["last"] == 12
    assert badnodes.recent(str(tmp_path / "none"), since=0) == []


def test_an_unlabelled_multi_node_failure_blames_the_node_whose_tasks_exited():
    out = (
        f"{ECC}\nsrun: error: n2: task 1: Exited with exit code 1\n"
        "srun: error: n1: task 0: Killed\n"
    )
    blame = nodefault.attribute(1, out, ["n1", "n2"])
    assert blame is not None and blame.nodes == ("n2",)
    everywhere = out + "srun: error: n1: task 0: Exited with exit code 1\n"
    assert nodefault.attribute(1, everywhere, ["n1", "n2"]).nodes == ()
    code = "srun: error: n3: tasks 4-5: Exited with exit code 7\n"
    assert nodefault.attribute(7, code, ["n1", "n2", "n3"], exit_codes=[7]).nodes == ("n3",)
