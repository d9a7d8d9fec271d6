"""``env_prepend``/``env_append``: path-like values joined with the task's own value (inside a
container, the image's) by a fixed ``sh -c`` wrapper that gets the values as arguments."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import assert_shell_ok, local_sweep, run_cli
from spec_examples import JOB, TRICKY

from slurmkit import launch
from slurmkit import spec as spec_mod
from slurmkit.core import rendezvous
from slurmkit.errors import SpecError
from slurmkit.spec.model import RESUMABLE

SHOW = ["sh", "-c", 'printf "%s|%s" "${A-unset}" "${B-unset}"']


def joined(prepend: dict, append: dict, **env: str) -> str:
    """What a task sees after the wrapper, started with ``env`` (the image's values)."""
    wrapper = launch.env_wrapper(prepend, append)
    clean = {k: v for k, v in os.environ.items() if k not in ("A", "B")}
    out = subprocess.run([*wrapper, *SHOW], env={**clean, **env}, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_values_join_the_existing_value_without_stray_colons():
    assert joined({"A": "/opt/a"}, {"B": "/opt/b"}, A="/img/a", B="/img/b") == (
        "/opt/a:/img/a|/img/b:/opt/b"
    )
    assert joined({"A": "/opt/a"}, {"B": "/opt/b"}) == "/opt/a|/opt/b"  # unset: no ':'
    assert joined({"A": "/opt/a"}, {"B": "/opt/b"}, A="", B="") == "/opt/a|/opt/b"
    assert joined({"A": "/p"}, {"A": "/q"}, A="/img") == "/p:/img:/q|unset"
    assert launch.env_wrapper({}, {}) == []


def test_values_arrive_byte_exact_and_never_run(tmp_path):
    values = [v for v in TRICKY if "\n" not in v]  # newlines are refused at validation
    prepend = {f"V{i}": v for i, v in enumerate(values)}  # more than 9 positional values
    wrapper = launch.env_wrapper(prepend, {})
    assert all(v not in wrapper[2] for v in values)  # the script text holds no value
    code = "import json, os; print(json.dumps([os.environ[f'V{i}'] for i in range(%d)]))"
    out = subprocess.run(
        [*wrapper, "python3", "-c", code % len(values)],
        env={k: v for k, v in os.environ.items() if not k.startswith("V")},
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert json.loads(out.stdout) == values
    assert not Path("/tmp/pwned-slurmkit").exists()


def test_wrapper_runs_inside_the_container_before_torchrun(spec_file):
    body = JOB + "env_prepend: {LD_LIBRARY_PATH: [/opt/hpcx/lib, /usr/local/lib]}\n"
    s = spec_mod.load(str(spec_file(body)), job=True)
    plan = launch.build(s, "/mnt/home/me/proj")
    assert plan["env"] == launch.env_wrapper(
        {"LD_LIBRARY_PATH": "/opt/hpcx/lib:/usr/local/lib"}, {}
    )
    argv = rendezvous.fill(plan, {"MASTER_ADDR": "n1", "MASTER_PORT": "1", "SLURM_JOB_ID": "7"})
    wrap = argv.index("slurmkit-env") - 3  # sh -c SCRIPT slurmkit-env
    assert argv[wrap - len(launch.self_check()) : wrap] == launch.self_check()  # after pyxis's
    signals = launch.torchrun_signals(s.requeue.signal, s.requeue.lead)
    assert argv[wrap + len(plan["env"]) :][: len(signals) + 1] == [*signals, "torchrun"]
    assert "env" not in launch.build(spec_mod.load(str(spec_file(JOB)), job=True), "/p")


@pytest.mark.parametrize(
    ("body", "key", "message"),
    [
        ("env_prepend: [/opt]", "env_prepend", "mapping"),
        ("env_prepend: {1BAD: /opt}", "env_prepend.1BAD", "variable name"),
        ("env_append: {PATH: 3}", "env_append.PATH", "path or a list"),
        ("env_append: {PATH: []}", "env_append.PATH", "path or a list"),
        ('env_append: {PATH: "/a\\n/b"}', "env_append.PATH", "newline"),
    ],
)
def test_bad_values_name_file_and_key(spec_file, body, key, message):
    path = spec_file(f"command: [python, x.py]\nparams: {{a: [1]}}\n{body}\n")
    with pytest.raises(SpecError, match=message) as info:
        spec_mod.load(str(path))
    assert info.value.key == key and info.value.file == str(path)


def test_env_prepend_reaches_a_local_trial_joined_with_its_value(tmp_path, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", "/image/lib")  # what the task would see without it
    code = "import os; print('LD=' + os.environ['LD_LIBRARY_PATH'])"
    proc, result = local_sweep(
        tmp_path,
        f"command: [python3, -c, {json.dumps(code)}]\nargs: none\nparams: {{a: [1]}}\n"
        "env_prepend: {LD_LIBRARY_PATH: /opt/hpcx/lib}\n"
        "env_append: {LD_LIBRARY_PATH: /usr/local/lib}\n",
    )
    assert proc.returncode == 0, proc.stderr
    logs = list(Path(result["sweep_dir"]).glob("trials/*/output.log"))
    assert "LD=/opt/hpcx/lib:/image/lib:/usr/local/lib\n" in logs[0].read_text()


def test_a_resume_may_change_them_and_the_spec_reads_back(spec_file, tmp_path):
    s = spec_mod.load(
        str(spec_file("command: [python, x.py]\nparams: {a: [1]}\nenv_append: {P: [/a, /b]}\n"))
    )
    assert s.env_append == {"P": "/a:/b"}
    assert spec_mod.from_dict(s.to_dict(), s.source) == s
    assert {"env_prepend", "env_append"} <= set(RESUMABLE)


def test_the_rendered_script_shows_the_wrapper_and_stays_valid_bash(spec_file, tmp_path):
    body = JOB + 'env_prepend: {LD_LIBRARY_PATH: "/opt/it\'s lib"}\nself_check: false\n'
    proc = run_cli("render", str(spec_file(body)), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert_shell_ok(proc.stdout)
    shown = next(line for line in proc.stdout.splitlines() if "slurmkit-env" in line)
    assert shown.startswith("#   srun ") and "torchrun" in shown.split("slurmkit-env")[1]
