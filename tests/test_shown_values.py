"""Values shown as they are, through the real CLI on a local sweep: params and metrics that look
like rich markup, NaN and infinite metrics, metrics named like a parameter or a fixed column."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest
from conftest import PAYLOAD, ROOT, run_cli

PATHS = ["[/tmp/x]", "data/[a-z]*.txt", "[bold]x[/bold]"]
NOTE = ":thumbs_up: [/tmp/x]"  # an emoji code and a closing tag
# what each trial reports besides `score` (per path): loss NaN / inf / -inf / 0.5 / none
REPORTS = [
    '{"loss": NaN, "lr": 5, "state": "[red]bad", "index": 99}',
    json.dumps({"loss": float("inf"), "note": NOTE}),
    '{"loss": -Infinity}',
    '{"loss": 0.5}',
    "{}",
]
# the results columns: each metric in the order first seen (a trial's metrics.json is sorted)
COLUMNS = [
    *("index", "id", "state", "path", "lr", "report"),
    *("metrics.index", "loss", "metrics.lr", "score", "metrics.state", "note"),
]
RENAMED = {"lr": "metrics.lr", "state": "metrics.state", "index": "metrics.index"}
SPELLED = {float("inf"): "Infinity", float("-inf"): "-Infinity"}
WIDE = {"COLUMNS": "300"}  # no cell is cut short


def strict(text: str):
    """``text`` as JSON, refusing the bare NaN / Infinity / -Infinity that RFC 8259 forbids."""

    def refuse(name: str):
        raise AssertionError(f"bare {name} in the JSON output")

    return json.loads(text, parse_constant=refuse)


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    proc = run_cli(*args, env=WIDE)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    """A finished local sweep of 15 trials (3 paths x 5 reports), under a bracketed directory."""
    tmp = tmp_path_factory.mktemp("shown")
    spec = tmp / "s.yaml"
    spec.write_text(
        f"command: [python, {PAYLOAD}]\n"
        f"params: {{path: {json.dumps(PATHS)}, lr: [0.1], report: {json.dumps(REPORTS)}}}\n"
        f"max_parallel: 8\noutput_root: {json.dumps(str(tmp / '[bold]runs'))}\n"
    )
    proc = run_cli("sweep", str(spec), "--backend", "local", "--json", cwd=tmp)
    assert proc.returncode == 0, proc.stderr
    return strict(proc.stdout)["sweep_dir"]


def expected_metrics(report: str) -> dict:
    """What results --json says of a trial's own metrics, given its `report` parameter."""
    shown = {}
    for name, value in {"score": 0.0, **json.loads(report)}.items():
        if isinstance(value, float) and value != value:
            value = "NaN"
        shown[RENAMED.get(name, name)] = SPELLED.get(value, value)
    return shown


@pytest.mark.slow
def test_status_table_shows_params_byte_exact(root):
    lines = cli("status", root).stdout.splitlines()
    rows = strict(cli("status", root, "--json").stdout)["trials"]
    assert len(rows) == 15
    for t in rows:
        line = next(li for li in lines if f" {t['id']} " in li)
        assert f"path={t['params']['path']} lr=0.1 " in line, line
    assert "data/*.txt" not in "\n".join(lines)


def test_status_json_is_strict_and_has_the_metrics(root):
    rows = strict(cli("status", root, "--json").stdout)["trials"]
    for t in rows:
        got = {"score": 0.0, **json.loads(t["params"]["report"])}
        assert set(t["metrics"]) == set(got), t
    by_report = {t["params"]["report"]: t["metrics"] for t in rows}
    assert by_report[REPORTS[0]]["loss"] == "NaN" and by_report[REPORTS[0]]["state"] == "[red]bad"
    assert by_report[REPORTS[1]] == {"loss": "Infinity", "note": NOTE, "score": 0.0}
    assert by_report[REPORTS[2]]["loss"] == "-Infinity"


def test_results_json_keeps_params_and_fixed_columns(root):
    rows = strict(cli("results", root, "--json").stdout)
    assert [r["index"] for r in rows] == list(range(15))
    for r in rows:
        assert r["state"] == "COMPLETED" and r["lr"] == 0.1 and r["path"] in PATHS
        own = {k: v for k, v in r.items() if k not in ("index", "id", "state", "path", "lr")}
        assert own == {"report": r["report"], **expected_metrics(r["report"])}


def test_results_csv_keeps_params_and_fixed_columns(root):
    text = cli("results", root, "--csv").stdout
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == COLUMNS
    for i, r in enumerate(rows):
        assert r["index"] == str(i) and r["state"] == "COMPLETED" and r["lr"] == "0.1"
        assert r["path"] == PATHS[i // 5] and r["report"] == REPORTS[i % 5]
        if r["report"] == REPORTS[0]:
            assert (r["metrics.lr"], r["metrics.state"], r["metrics.index"]) == (
                *("5", "[red]bad", "99"),
            )
            assert r["loss"] == "nan"
        assert r["note"] == (NOTE if r["report"] == REPORTS[1] else "")


def table_rows(text: str) -> dict[int, str]:
    """The lines of a results table by their index (its first column)."""
    return {int(line.split()[0]): line for line in text.splitlines()[1:] if line.strip()}


def test_results_table_shows_values_byte_exact(root):
    text = cli("results", root).stdout
    assert text.splitlines()[0].split() == [c for c in COLUMNS if c != "state"]  # a short id
    lines = table_rows(text)
    assert sorted(lines) == list(range(15))
    for i, line in lines.items():
        assert f"  {PATHS[i // 5]}  " in line, line
        report = i % 5
        if report == 0:
            assert "  99  " in line and "  5  " in line and "  nan  " in line
            assert "  [red]bad  " in line and "COMPLETED" not in line
        if report == 1:
            assert "  inf  " in line and line.rstrip().endswith(f"  {NOTE}")
        if report == 2:
            assert "  -inf  " in line
    assert "data/*.txt" not in text and "👍" not in text


@pytest.mark.parametrize("desc", [False, True])
def test_sort_puts_nan_then_missing_last(root, desc):
    flag = ["--desc"] if desc else []
    rows = strict(cli("results", root, "--sort", "loss", *flag, "--json").stdout)
    numbers = ["Infinity", 0.5, "-Infinity"] if desc else ["-Infinity", 0.5, "Infinity"]
    want = [v for v in [*numbers, "NaN", None] for _ in PATHS]
    assert [r.get("loss") for r in rows] == want
    table = table_rows(cli("results", root, "--sort", "loss", *flag).stdout)
    assert list(table) == [r["index"] for r in rows]
    best = strict(cli("results", root, "--sort", "loss", *flag, "--limit", "1", "--json").stdout)
    assert best[0]["loss"] == ("Infinity" if desc else "-Infinity")


def test_a_renamed_metric_sorts_by_its_column(root):
    rows = strict(cli("results", root, "--sort", "metrics.lr", "--json").stdout)
    assert [r.get("metrics.lr") for r in rows] == [5] * 3 + [None] * 12
    by_param = strict(cli("results", root, "--sort", "lr", "--desc", "--json").stdout)
    assert [r["lr"] for r in by_param] == [0.1] * 15


def test_the_sweep_directory_is_printed_as_it_is(tmp_path):
    spec = tmp_path / "s.yaml"
    out = tmp_path / "[bold]runs"
    spec.write_text(
        f"command: [python, {PAYLOAD}]\nparams: {{x: [1]}}\noutput_root: {json.dumps(str(out))}\n"
    )
    proc = run_cli("sweep", str(spec), "--backend", "local", cwd=tmp_path, env=WIDE)
    assert proc.returncode == 0, proc.stderr
    (made,) = out.iterdir()
    assert f"sweep directory: {made}\n" in proc.stdout
    assert f"next: slurmkit status {made}\n" in proc.stdout


@pytest.mark.parametrize("command", ["status", "results"])
def test_json_output_imports_no_rich(root, command):
    code = (
        "import json, sys\n"
        f"sys.argv = ['slurmkit', {command!r}, {root!r}, '--json']\n"
        "from slurmkit import cli\n"
        "try:\n    cli.main()\nexcept SystemExit:\n    pass\n"
        "print(json.dumps(sorted(sys.modules)), file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    strict(proc.stdout)
    assert not [m for m in json.loads(proc.stderr) if m.split(".")[0] == "rich"]
