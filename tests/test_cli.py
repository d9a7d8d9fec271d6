"""The CLI as a demanding user expects it: JSON errors with --json, --list, shell completion,
"did you mean", plain untruncated tables when piped, short ids in results."""

from __future__ import annotations

import json
import os

import pytest
from conftest import PAYLOAD, local_sweep, run_cli


def test_json_errors_are_json_on_stderr(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text("command: x\nparams: {a: [1]}\nresources: {partiton: low}\n")
    proc = run_cli("sweep", str(spec), "--dry-run", "--json")
    assert proc.returncode == 2 and proc.stdout == ""
    err = json.loads(proc.stderr)
    assert err["exit_code"] == 2
    assert err["error"]["key"] == "resources.partiton" and err["error"]["file"] == str(spec)
    assert "did you mean 'partition'?" in err["error"]["message"]
    plain = run_cli("sweep", str(spec), "--dry-run")
    assert plain.stderr.startswith("error: ") and "did you mean 'partition'?" in plain.stderr


def test_list_shows_the_trials_and_submits_nothing(tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(f"command: x\nparams: {{a: [1, 2], b: [x, y]}}\noutput_root: {tmp_path}/r\n")
    proc = run_cli("sweep", str(spec), "--list", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [(r["index"], r["params"]) for r in rows] == [
        (0, {"a": 1, "b": "x"}),
        (1, {"a": 1, "b": "y"}),
        (2, {"a": 2, "b": "x"}),
        (3, {"a": 2, "b": "y"}),
    ]
    table = run_cli("sweep", str(spec), "--list")
    assert table.returncode == 0 and rows[3]["id"][:8] in table.stdout
    assert "4 trial(s)" in table.stderr and not (tmp_path / "r").exists()


def test_completion_scripts_and_completing_commands():
    for shell, needle in (
        ("bash", "complete -o"),
        ("zsh", "compdef"),
        ("fish", "complete --no-files --command slurmkit"),
    ):
        proc = run_cli("completion", shell)
        assert (
            proc.returncode == 0 and needle in proc.stdout and "_SLURMKIT_COMPLETE" in proc.stdout
        )
    import subprocess
    import sys

    def complete(words: str, cword: str) -> list[str]:
        """What bash's completion gets from the program named slurmkit."""
        env = {"COMP_WORDS": words, "COMP_CWORD": cword, "_SLURMKIT_COMPLETE": "bash_complete"}
        return subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; sys.argv[0] = 'slurmkit'; from slurmkit import cli; cli.run()",
            ],
            env={**os.environ, **env},
            capture_output=True,
            text=True,
        ).stdout.splitlines()

    assert "plain,status" in complete("slurmkit sta", "1")
    assert complete("slurmkit status ", "2")[0].startswith("dir,")  # the shell completes dirs


@pytest.mark.slow
def test_piped_tables_are_plain_and_whole(tmp_path):
    long = "a-long-value-" * 12
    body = f"command: [python, {PAYLOAD}]\nparams: {{x: [1], tag: ['{long}']}}\n"
    root = local_sweep(tmp_path, body)[1]["sweep_dir"]
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    import subprocess
    import sys

    for command in (["status", root], ["results", root]):
        proc = subprocess.run(
            [sys.executable, "-m", "slurmkit.cli", *command],
            env=env,
            capture_output=True,
            text=True,
        )  # stdout is a pipe
        assert proc.returncode == 0, proc.stderr
        assert long in proc.stdout, proc.stdout  # never cut
        assert not set("┏┃━┡│└┗╇") & set(proc.stdout)  # no box drawing
    row = json.loads(run_cli("results", root, "--json").stdout)[0]
    assert (
        row["id"][:8]
        in subprocess.run(
            [sys.executable, "-m", "slurmkit.cli", "results", root],
            env=env,
            capture_output=True,
            text=True,
        ).stdout
    )
