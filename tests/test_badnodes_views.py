"""Bad nodes as people see them: `slurmkit status` (table and --json), `slurmkit report`
across sweeps, and `doctor`'s recent suspects."""

from __future__ import annotations

import json
import os

from click.testing import CliRunner

from slurmkit import cli
from slurmkit.core import badnodes

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


def _sweep(tmp_path, spec_file, name: str):
    from slurmkit import plan, store
    from slurmkit import spec as spec_mod

    s = spec_mod.load(
        str(spec_file(f"name: {name}\ncommand: [/bin/true]\nargs: none\nparams: {{a: [1, 2]}}\n"))
    )
    rows = plan.expand(s)
    sweep = store.create(plan.make(s, rows, os.getcwd()), str(tmp_path / name))
    return sweep.root, [r.id for r in rows]


def _blame(root, trial, n, node, t):
    badnodes.record(
        root,
        {"trial": trial, "attempt": n, "time": t, "blamed": [node], "nodes": [node],
         "kind": "ecc", "evidence": ECC, "exclude_after": 2},
    )  # fmt: skip


def test_status_shows_suspect_and_excluded_nodes_with_their_evidence(tmp_path, spec_file):
    root, ids = _sweep(tmp_path, spec_file, "lr")
    _blame(root, ids[0], 1, "n2", 100.0)
    _blame(root, ids[1], 1, "n2", 101.0)
    _blame(root, ids[1], 2, "n3", 102.0)
    runner = CliRunner()
    doc = json.loads(runner.invoke(cli.main, ["status", root, "--json"]).stdout)
    assert [(n["node"], n["failures"], n["excluded"]) for n in doc["nodes"]] == [
        ("n2", 2, True),
        ("n3", 1, False),
    ]
    assert doc["nodes"][0]["evidence"] == ECC and doc["nodes"][0]["trials"] == ids
    text = runner.invoke(cli.main, ["status", root]).stdout
    assert "suspect nodes" in text and "n2" in text and "uncorrectable ECC" in text


def test_status_of_a_sweep_without_suspects_says_nothing_of_nodes(tmp_path, spec_file):
    root, _ = _sweep(tmp_path, spec_file, "lr")
    runner = CliRunner()
    assert "nodes" not in json.loads(runner.invoke(cli.main, ["status", root, "--json"]).stdout)
    assert "suspect" not in runner.invoke(cli.main, ["status", root]).stdout


def test_report_lists_suspects_across_sweeps(tmp_path, spec_file):
    a, ids_a = _sweep(tmp_path, spec_file, "a")
    b, ids_b = _sweep(tmp_path, spec_file, "b")
    _blame(a, ids_a[0], 1, "n2", 100.0)
    _blame(a, ids_a[1], 1, "n2", 101.0)
    _blame(b, ids_b[0], 1, "n2", 102.0)
    runner = CliRunner()
    doc = json.loads(runner.invoke(cli.main, ["report", a, b, "--json"]).stdout)
    assert doc["nodes"] == [
        {"node": "n2", "failures": 3, "sweeps": ["a", "b"], "excluded_in": 1, "last": 102.0,
         "evidence": ECC},
    ]  # fmt: skip
    assert [s["nodes"][0]["failures"] for s in doc["sweeps"]] == [2, 1]
    text = runner.invoke(cli.main, ["report", a, b]).stdout
    assert "suspect nodes" in text and "n2" in text


def test_doctor_shows_your_recent_suspects(tmp_path):
    from slurmkit import doctor

    assert doctor.checks(doctor.Facts(output_root=str(tmp_path)))[-1].name != "suspect nodes"
    rows = badnodes.across([("a", [{"node": "n2", "failures": 2, "excluded": True,
                                    "last": 5.0, "evidence": ECC}])])  # fmt: skip
    [check] = [c for c in doctor.checks(doctor.Facts(suspects=rows))
               if c.name == "suspect nodes"]  # fmt: skip
    assert check.level == doctor.WARN
    assert "n2: 2 failure(s) in 1 sweep(s), excluded in 1" in check.detail and "ECC" in check.detail
