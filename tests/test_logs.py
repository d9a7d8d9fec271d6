"""Where output goes: `logs.name` (Slurm's own log of each array task, inside the sweep
directory) and `logs.stderr: separate` (stderr apart, for the trial and for Slurm)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import assert_shell_ok, local_sweep, run_cli, slurm_submit, wait_sweep

from slurmkit import spec as spec_mod
from slurmkit.errors import SpecError
from slurmkit.steer import log_name

SAYS = "import sys; print('to stdout'); print('to stderr', file=sys.stderr)"


@pytest.mark.parametrize(
    ("logs", "key", "words"),
    [
        ("{name: 'a/%a'}", "logs.name", "no '/'"),
        ("{name: '%N-%a'}", "logs.name", "%a (array task id)"),
        ("{name: '%x-%A'}", "logs.name", "every array task the same file"),
        ("{name: '%%a'}", "logs.name", "every array task the same file"),
        ("{name: '.%a'}", "logs.name", "slurmkit can find again"),
        ("{name: 'a b %a'}", "logs.name", "letters, digits"),
        ("{name: 5}", "logs.name", "expected"),
        ("{stderr: apart}", "logs.stderr", "merged, separate"),
        ("{where: x}", "logs.where", "allowed keys: name, stderr"),
        ("nope", "logs", "must be a mapping"),
    ],
)
def test_bad_logs_name_the_key_and_what_is_allowed(spec_file, logs, key, words):
    with pytest.raises(SpecError) as info:
        spec_mod.load(str(spec_file(f"command: x\nparams: {{a: [1]}}\nlogs: {logs}\n")))
    assert info.value.key == key and words in str(info.value)


def test_log_names_are_filled_as_sbatch_fills_them():
    values = {"A": "41", "a": "3", "j": "44", "x": "lr", "u": "ann"}
    assert log_name("%x-%A_%a", values) == "lr-41_3"
    assert log_name("%u.%j.%%a", values) == "ann.44.%a"


def test_rendered_output_and_error_lines(spec_file, tmp_path):
    from slurmkit.plan import expand, make
    from slurmkit.render import scripts

    body = "command: x\nparams: {a: [1]}\nlogs: {name: '%x-%A_%a', stderr: separate}\n"
    s = spec_mod.load(str(spec_file(body)))
    text = scripts(make(s, expand(s), str(tmp_path)), [0], 1001, "/r")[0][1]
    assert "#SBATCH --output=/r/logs/%x-%A_%a.out" in text
    assert "#SBATCH --error=/r/logs/%x-%A_%a.err" in text
    assert_shell_ok(text)
    merged = spec_mod.load(str(spec_file("command: x\nparams: {a: [1]}\n")))
    text = scripts(make(merged, expand(merged), str(tmp_path)), [0], 1001, "/r")[0][1]
    assert "#SBATCH --output=/r/logs/%A_%a.out" in text and "--error" not in text


@pytest.mark.slow
def test_separate_stderr_on_the_local_backend(tmp_path):
    body = f'command: [python, -c, "{SAYS}"]\nargs: none\nparams: {{a: [1]}}\n'
    proc, result = local_sweep(tmp_path, body + "logs: {stderr: separate}\n")
    assert proc.returncode == 0 and result is not None, proc.stderr
    root = result["sweep_dir"]
    out = run_cli("logs", root, "0")
    err = run_cli("logs", root, "0", "--stderr")
    assert "to stdout" in out.stdout and "to stderr" not in out.stdout
    assert "to stderr" in err.stdout and "to stdout" not in err.stdout
    assert "=== slurmkit: trial" in err.stdout  # each attempt marked in both files
    (tmp_path / "m").mkdir()
    proc, result = local_sweep(tmp_path / "m", body)
    assert result is not None
    merged = run_cli("logs", result["sweep_dir"], "0", "--stderr")
    assert merged.returncode == 2 and "logs.stderr: merged" in merged.stderr
    assert "Traceback" not in merged.stderr


@pytest.mark.cluster
def test_named_and_separate_slurm_logs_are_found_again(slurm_cluster, tmp_path):
    body = (
        f'name: named\ncommand: [python, -c, "{SAYS}"]\nargs: none\nparams: {{a: [1, 2]}}\n'
        "logs: {name: '%x-%u-%A_%a', stderr: separate}\n"
    )
    result = slurm_submit(tmp_path, body)
    root = Path(result["sweep_dir"])
    final = wait_sweep(str(root), timeout=120)
    assert final["counts"] == {"COMPLETED": 2}
    array = result["jobs"][0]["job_id"]
    names = sorted(p.name for p in (root / "logs").iterdir())
    assert names[0].startswith("named-") and names[0].endswith(f"-{array}_0.err"), names
    assert len(names) == 4  # .out and .err of each task
    slurm_err = run_cli("logs", str(root), "1", "--slurm", "--stderr")
    assert slurm_err.returncode == 0, slurm_err.stderr
    trial_err = run_cli("logs", str(root), "1", "--stderr")
    assert "to stderr" in trial_err.stdout and "to stdout" not in trial_err.stdout
    status = json.loads(run_cli("status", str(root), "--json").stdout)
    assert status["counts"] == {"COMPLETED": 2}
