"""Bad input for every command, table-driven: files, specs, overrides, options, user configs and
damaged sweep directories. Each case asserts the exit code (2 usage, 1 failed, 0 where a damaged
file only costs a warning), a part of the message that names the file, key or fix, and that no
traceback appears.

The click app runs in this process (``CliRunner``), so a case costs milliseconds; an exception
that escapes a command is formatted into the output, which then holds "Traceback". Nothing here
reaches a Slurm cluster: ``sbatch``, ``squeue``, ``scontrol`` & co. on PATH are stand-ins that
say no controller answers. Damaged sweep directories are copies of one local sweep made once.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import stat
import traceback
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import CliRunner
from conftest import PAYLOAD, local_sweep

from slurmkit.core.lock import Lock

_threshold = gc.get_threshold()
from slurmkit import cli  # noqa: E402  (it raises the gc threshold for its one-shot process)

gc.set_threshold(*_threshold)

SPEC = "<spec>"  # in a needle: the spec file's path
ROOT = "<root>"  # in an argument or needle: the sweep directory
CFG = "<cfg>"  # in a needle: the user config's path
NO_SLURM = "slurm_load_jobs error: Unable to contact slurm controller (connect failure)"


class Ran(NamedTuple):
    code: int
    out: str  # stdout and stderr, as a terminal shows them
    err: str
    stdout: str


def run(*args: str) -> Ran:
    """``slurmkit ARGS`` in this process; an escaped exception is printed as a traceback."""
    result = CliRunner().invoke(cli.main, list(args), prog_name="slurmkit")
    out, err = result.output, result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        text = "".join(traceback.format_exception(result.exception))
        out, err = out + text, err + text
    return Ran(result.exit_code, out, err, result.stdout)


def check(ran: Ran, code: int, *needles: str) -> None:
    assert "Traceback" not in ran.out, ran.out
    assert ran.code == code, ran.out
    for needle in needles:
        assert needle in ran.out, f"{needle!r} not in:\n{ran.out}"


def failing(reason: str, *values: Any) -> Any:
    """A case of a known bug outside the files this suite may fix: it must fail (strict)."""
    return pytest.param(
        *values, id=str(values[0]), marks=pytest.mark.xfail(strict=True, reason=reason)
    )


def cases(table: list[Any]) -> list[Any]:
    """A table's rows as pytest params, each named by its first value."""
    return [row if hasattr(row, "marks") else pytest.param(*row, id=str(row[0])) for row in table]


@pytest.fixture(scope="module", autouse=True)
def no_cluster(tmp_path_factory):
    """Slurm's commands that answer as if no controller ran; short lock waits; no user config."""
    bin_dir = tmp_path_factory.mktemp("fake-slurm")
    for tool in ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "srun", "sacct"):
        path = bin_dir / tool
        path.write_text(f"#!/bin/sh\necho '{NO_SLURM}' >&2\nexit 1\n")
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        mp.setenv("SLURMKIT_LOCK_WAIT", "0.1")
        mp.setenv("SLURMKIT_CONFIG", os.devnull)
        mp.delenv("SLURM_CONF", raising=False)
        yield


@pytest.fixture(scope="module")
def template(tmp_path_factory, no_cluster) -> Path:
    """One finished local sweep of three trials (x = 1, 2, 3), never changed: copied per case."""
    where = tmp_path_factory.mktemp("template")
    proc, result = local_sweep(where, f"command: [python, {PAYLOAD}]\nparams: {{x: [1, 2, 3]}}\n")
    assert proc.returncode == 0 and result is not None, proc.stderr
    return Path(result["sweep_dir"])


def _ids(root: Path) -> list[str]:
    return [json.loads(line)["id"] for line in (root / "trials.jsonl").read_text().splitlines()]


@pytest.fixture
def sweep(template, tmp_path) -> Path:
    """A fresh copy of the template sweep directory."""
    root = tmp_path / "sweep"
    shutil.copytree(template, root)
    return root


def _fill(text: str, **where: str) -> str:
    for mark, value in where.items():
        text = text.replace(mark, value)
    return text


# --------------------------------------------------------------------------- #
# Bad spec files, for every command that reads one.
# --------------------------------------------------------------------------- #

SPEC_COMMANDS = {
    "sweep": ["sweep", SPEC, "--dry-run", "--backend", "local"],
    "submit": ["submit", SPEC, "--dry-run", "--backend", "local"],
    "render": ["render", SPEC],
    "list": ["sweep", SPEC, "--list"],
    "plain": ["sweep", SPEC, "--dry-run", "--plain"],
}
REQUIRED = "command: required: the trial's program and arguments"
TOP = "the top level must be a mapping of keys"
# (id, file contents (None: no file; "DIR": a directory), needles)
FILES = [
    ("missing", None, [f"error: {SPEC}: no such file"]),
    ("empty", b"", [f"error: {SPEC}: {REQUIRED}", "hint: command: python train.py"]),
    ("blank-lines", b"   \n\n", [f"error: {SPEC}: {REQUIRED}"]),
    ("only-comment", b"# nothing here\n", [f"error: {SPEC}: {REQUIRED}"]),
    ("null-document", b"null\n", [f"error: {SPEC}: {REQUIRED}"]),
    ("empty-mapping", b"{}\n", [f"error: {SPEC}: {REQUIRED}"]),
    ("latin-1", b"command: x\nname: caf\xe9\n", [f"error: {SPEC}: name: not UTF-8 text: byte 0xe9",
     "hint: save the file as UTF-8"]),
    ("utf-16", "command: x\n".encode("utf-16"), [f"error: {SPEC}: not UTF-8 text: byte 0xff"]),
    ("png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", [f"error: {SPEC}: not UTF-8 text: byte 0x89"]),
    ("gzip", b"\x1f\x8b\x08\x00\x00\x00", [f"error: {SPEC}: not UTF-8 text: byte 0x8b"]),
    ("nul-byte", b"command: x\x00\n", [f"error: {SPEC}: malformed YAML", "#x0000"]),
    ("control-chars", b"\x01\x02", [f"error: {SPEC}: malformed YAML", "#x0001"]),
    ("top-list", b"- command\n- x\n", [f"error: {SPEC}: {TOP}", "hint: allowed keys: name,"]),
    ("top-scalar", b"42\n", [f"error: {SPEC}: {TOP}"]),
    ("top-string", b"'python train.py'\n", [f"error: {SPEC}: {TOP}"]),
    ("unclosed-flow", b"command: x\nparams: {a: [1, 2\n", [f"error: {SPEC}: malformed YAML",
     "expected ',' or ']'"]),
    ("tab-indent", b"\tcommand: x\n", [f"error: {SPEC}: malformed YAML", "'\\t'"]),
    ("bad-indent", b"command: x\nenv:\n  A: 1\n   B: 2\n", [f"error: {SPEC}: malformed YAML",
     "line 4"]),
    ("duplicate-key", b"command: x\ncommand: y\n", [f"error: {SPEC}: malformed YAML",
     "duplicate key command"]),
    ("python-tag", b"command: !!python/object:os.system [ls]\n", [f"error: {SPEC}: malformed",
     "python/object:os.system"]),
    ("unreadable-tag", b"command: x\nseed: !!int abc\n", [f"error: {SPEC}: malformed YAML",
     "cannot read 'abc' as tag:yaml.org,2002:int", "line 2"]),
    ("bad-timestamp", b"command: x\nseed: !!timestamp 2001-12-114\n", [f"error: {SPEC}: malformed",
     "cannot read '2001-12-114'"]),
    ("two-documents", b"command: x\n---\ncommand: y\n", [f"error: {SPEC}: malformed YAML",
     "expected a single document"]),
    ("undefined-alias", b"command: x\nparams: {a: *nope}\n", [f"error: {SPEC}: malformed YAML",
     "undefined alias 'nope'"]),
    ("bare-document-end", b"...\n", [f"error: {SPEC}: malformed YAML"]),
    ("interpolation-missing", b"command: x\nname: ${nope}\nparams: {a: [1]}\n",
     [f"error: {SPEC}: cannot resolve: Interpolation key 'nope' not found"]),
    ("directory", "DIR", [f"error: {SPEC}: is a directory"]),
]  # fmt: skip


def _write(path: Path, contents: bytes | str | None) -> None:
    if contents == "DIR":
        path.mkdir()
    elif isinstance(contents, bytes):
        path.write_bytes(contents)
    elif isinstance(contents, str):
        path.write_text(contents)


@pytest.mark.parametrize("command", SPEC_COMMANDS)
@pytest.mark.parametrize("name,contents,needles", cases(FILES))
def test_bad_spec_files(tmp_path, command, name, contents, needles):
    path = tmp_path / "spec.yaml"
    _write(path, contents)
    argv = [_fill(a, **{SPEC: str(path)}) for a in SPEC_COMMANDS[command]]
    check(run(*argv), 2, *(_fill(n, **{SPEC: str(path)}) for n in needles))


NO_FILES = [
    ("empty-path", ["sweep", "", "--dry-run"], "error: '': no such file"),
    ("dev-null", ["sweep", os.devnull, "--dry-run"], f"error: {os.devnull}: no such file"),
    ("no-parent", ["render", "/nonexistent/dir/spec.yaml"], "error: /nonexistent/dir/spec.yaml"),
    ("submit-missing", ["submit", "/nonexistent.yaml"], "error: /nonexistent.yaml: no such file"),
]  # fmt: skip


@pytest.mark.parametrize("name,argv,needle", cases(NO_FILES))
def test_spec_paths_that_are_no_file(name, argv, needle):
    check(run(*argv), 2, needle)


# --------------------------------------------------------------------------- #
# Bad values, key by key (sweep --dry-run; the same validation serves submit and render).
# --------------------------------------------------------------------------- #

BASE = "command: [python, t.py]\nparams: {a: [1, 2]}\n"
JOB = "params: {a: [1, 2]}\n"  # a spec whose command the case writes

# (id, spec body, the key named, a part of the message)
KEYS = [
    ("unknown-top", BASE + "wat: 1\n", "wat", "unknown key 'wat'"),
    ("typo-command", "comand: x\n" + JOB, "comand", "(did you mean 'command'?)"),
    ("typo-params", "command: x\nparms: {a: [1]}\n", "parms", "(did you mean 'params'?)"),
    ("typo-resources", BASE + "resouces: {}\n", "resouces", "(did you mean 'resources'?)"),
    ("name-int", BASE + "name: 5\n", "name", "expected str, got int 5"),
    ("name-space", BASE + "name: 'bad name'\n", "name", "'bad name' is not a valid name"),
    ("name-empty", BASE + "name: ''\n", "name", "'' is not a valid name"),
    ("name-list", BASE + "name: [a]\n", "name", "expected str, got list"),
    ("name-slash", BASE + "name: a/b\n", "name", "'a/b' is not a valid name"),
    ("command-int", JOB + "command: 5\n", "command", "required: the trial's program"),
    ("command-empty", JOB + "command: ''\n", "command", "is empty"),
    ("command-empty-list", JOB + "command: []\n", "command", "is empty"),
    ("command-quote", JOB + "command: 'a \"b'\n", "command", "cannot split: No closing quotation"),
    ("command-nested", JOB + "command: [a, [b]]\n", "command", "required: the trial's program"),
    ("command-bool", JOB + "command: [python, true]\n", "command", "an item is a YAML boolean"),
    ("command-mapping", JOB + "command: {a: 1}\n", "command", "required: the trial's program"),
    ("args-int", BASE + "args: 5\n", "args", "expected str, got int 5"),
    ("args-value", BASE + "args: weird\n", "args", "allowed values: hydra, argparse, none"),
    ("num_samples-0", BASE + "num_samples: 0\n", "num_samples", "must be at least 1, got 0"),
    ("num_samples-negative", BASE + "num_samples: -1\n", "num_samples", "must be at least 1"),
    ("num_samples-str", BASE + "num_samples: x\n", "num_samples", "expected int, got str 'x'"),
    ("num_samples-float", BASE + "num_samples: 1.5\n", "num_samples", "expected int, got float"),
    ("num_samples-bool", BASE + "num_samples: true\n", "num_samples", "expected int, got bool"),
    ("num_samples-grid", BASE + "num_samples: 3\n", "num_samples", "needs a random parameter"),
    ("num_samples-huge", "command: x\nparams: {a: 'uniform(0,1)'}\nnum_samples: 10000001\n",
     "num_samples", "must be at most 1,000,000"),
    ("seed-str", BASE + "seed: x\n", "seed", "expected int, got str 'x'"),
    ("seed-float", BASE + "seed: 1.5\n", "seed", "expected int, got float 1.5"),
    ("seed-bool", BASE + "seed: true\n", "seed", "expected int, got bool True"),
    ("max_parallel-0", BASE + "max_parallel: 0\n", "max_parallel", "must be at least 1, got 0"),
    ("max_parallel-str", BASE + "max_parallel: x\n", "max_parallel", "expected int, got str"),
    ("max_parallel-negative", BASE + "max_parallel: -3\n", "max_parallel", "at least 1, got -3"),
    ("output_root-int", BASE + "output_root: 5\n", "output_root", "expected str, got int 5"),
    ("output_root-space", BASE + "output_root: 'a b'\n", "output_root", "not a usable directory"),
    ("output_root-empty", BASE + "output_root: ''\n", "output_root", "not a usable directory"),
    ("output_root-percent", BASE + "output_root: 'a%b'\n", "output_root", "without whitespace"),
    ("workdir-int", BASE + "workdir: 5\n", "workdir", "expected str, got int 5"),
    ("workdir-list", BASE + "workdir: [a]\n", "workdir", "expected str, got list"),
    ("resources-scalar", BASE + "resources: 5\n", "resources", "must be a mapping"),
    ("resources-list", BASE + "resources: [a]\n", "resources", "hint: allowed keys: partition"),
    ("resources-typo", BASE + "resources: {partiton: x}\n", "resources.partiton",
     "did you mean 'partition'?"),
    ("time-word", BASE + "resources: {time: yesterday}\n", "resources.time",
     "'yesterday' is not a Slurm time"),
    ("time-list", BASE + "resources: {time: [1]}\n", "resources.time",
     "expected a Slurm time string"),
    ("time-negative", BASE + "resources: {time: -5}\n", "resources.time", "'-5' is not a Slurm"),
    ("time-float", BASE + "resources: {time: 1.5}\n", "resources.time", "got 1.5"),
    ("time-days", BASE + "resources: {time: '1:2:3:4'}\n", "resources.time", "not a Slurm time"),
    ("nodes-0", BASE + "resources: {nodes: 0}\n", "resources.nodes", "must be at least 1"),
    ("nodes-str", BASE + "resources: {nodes: x}\n", "resources.nodes", "expected int, got str"),
    ("cpus-negative", BASE + "resources: {cpus: -1}\n", "resources.cpus", "must be at least 1"),
    ("cpus-float", BASE + "resources: {cpus: 1.5}\n", "resources.cpus", "expected int, got float"),
    ("cpus-twice", BASE + "resources: {cpus: 2, cpus_per_task: 4}\n", "resources.cpus_per_task",
     "are the same setting"),
    ("gpus-twice", BASE + "resources: {gpus: 1, gpus_per_node: 2}\n", "resources.gpus_per_node",
     "are the same setting"),
    ("mem-unit", BASE + "resources: {mem: 16Q}\n", "resources.mem", "'16Q' is not a memory size"),
    ("mem-list", BASE + "resources: {mem: [1]}\n", "resources.mem", "is not a memory size"),
    ("mem-negative", BASE + "resources: {mem: -1}\n", "resources.mem", "'-1' is not a memory"),
    ("gpus-negative", BASE + "resources: {gpus: -1}\n", "resources.gpus", "not a GPU count"),
    ("gpus-type-count", BASE + "resources: {gpus: 'h100:x'}\n", "resources.gpus",
     "hint: a count per node (8) or TYPE:COUNT"),
    ("gpus-bool", BASE + "resources: {gpus: true}\n", "resources.gpus", "True is not a GPU"),
    ("gpus-float", BASE + "resources: {gpus: 1.5}\n", "resources.gpus", "1.5 is not a GPU count"),
    ("partition-space", BASE + "resources: {partition: 'a b'}\n", "resources.partition",
     "has characters Slurm does not accept"),
    ("partition-int", BASE + "resources: {partition: 5}\n", "resources.partition",
     "expected str, got int 5"),
    ("account-semicolon", BASE + "resources: {account: 'x;y'}\n", "resources.account",
     "'x;y' has characters"),
    ("qos-quote", BASE + "resources: {qos: \"'\"}\n", "resources.qos", "has characters"),
    ("constraint-space", BASE + "resources: {constraint: 'a b'}\n", "resources.constraint",
     "has characters"),
    ("exclusive-word", BASE + "resources: {exclusive: maybe}\n", "resources.exclusive",
     "expected bool, got str 'maybe'"),
    ("exclusive-int", BASE + "resources: {exclusive: 1}\n", "resources.exclusive",
     "expected bool, got int 1"),
    ("switches-space", BASE + "resources: {switches: 'a b'}\n", "resources.switches",
     "has characters"),
    ("switches-bool", BASE + "resources: {switches: true}\n", "resources.switches",
     "expected str, got bool"),
    ("tasks_per_node-0", BASE + "resources: {tasks_per_node: 0}\n", "resources.tasks_per_node",
     "must be at least 1"),
    ("extra-scalar", BASE + "resources: {extra: 5}\n", "resources.extra",
     "must be a mapping of sbatch option names"),
    ("extra-array", BASE + "resources: {extra: {array: 1}}\n", "resources.extra.array",
     "slurmkit sets this option itself"),
    ("extra-output", BASE + "resources: {extra: {output: x}}\n", "resources.extra.output",
     "slurmkit sets this option itself"),
    ("extra-name", BASE + "resources: {extra: {Bad_Name: 1}}\n", "resources.extra.Bad_Name",
     "not an sbatch long option name"),
    ("extra-space", BASE + "resources: {extra: {comment: 'a b'}}\n", "resources.extra.comment",
     "will not put in a batch script"),
    ("extra-list", BASE + "resources: {extra: {comment: [1]}}\n", "resources.extra.comment",
     "must be a string, number or true/false"),
    ("extra-null", BASE + "resources: {extra: {comment: null}}\n", "resources.extra.comment",
     "must be a string, number or true/false"),
    ("extra-twice", BASE + "resources: {extra: {comment: a, --comment: b}}\n",
     "resources.extra.comment", "are the same option"),
    ("env-scalar", BASE + "env: 5\n", "env", "must be a mapping of variable names"),
    ("env-list", BASE + "env: [a]\n", "env", "must be a mapping of variable names"),
    ("env-name-digit", BASE + "env: {'1A': x}\n", "env.1A", "not a valid environment variable"),
    ("env-name-dash", BASE + "env: {'A-B': x}\n", "env.A-B", "not a valid environment variable"),
    ("env-list-value", BASE + "env: {A: [1]}\n", "env.A", "must be a string or number"),
    ("env-null", BASE + "env: {A: null}\n", "env.A", "must be a string or number"),
    ("env-mapping", BASE + "env: {A: {b: 1}}\n", "env.A", "must be a string or number"),
    ("env-float", BASE + "env: {LR: 1e-3}\n", "env.LR", "quote it: LR: '1e-3'"),
    ("env_prepend-scalar", BASE + "env_prepend: 5\n", "env_prepend",
     "must be a mapping of variable names to paths"),
    ("env_prepend-int", BASE + "env_prepend: {PATH: 5}\n", "env_prepend.PATH",
     "must be a path or a list of paths, got 5"),
    ("env_prepend-empty", BASE + "env_prepend: {PATH: []}\n", "env_prepend.PATH",
     "must be a path or a list of paths, got []"),
    ("env_prepend-name", BASE + "env_prepend: {'1X': /a}\n", "env_prepend.1X",
     "not a valid environment variable name"),
    ("env_prepend-empty-path", BASE + "env_prepend: {PATH: ['']}\n", "env_prepend.PATH",
     "got ['']"),
    ("env_append-int", BASE + "env_append: {PATH: [1]}\n", "env_append.PATH", "got [1]"),
    ("env_append-list", BASE + "env_append: [a]\n", "env_append", "must be a mapping"),
    ("env_runtime-scalar", BASE + "env_runtime: 5\n", "env_runtime", "must be a mapping"),
    ("env_runtime-int", BASE + "env_runtime: {T: 5}\n", "env_runtime.T", "must be a string"),
    ("env_runtime-placeholder", BASE + "env_runtime: {T: '{nope}'}\n", "env_runtime.T",
     "{nope} is not a placeholder"),
    ("env_runtime-brace", BASE + "env_runtime: {T: '{job_id'}\n", "env_runtime.T",
     "write {{ and }} for literal braces"),
    ("env_runtime-name", BASE + "env_runtime: {'1T': x}\n", "env_runtime.1T",
     "not a valid environment variable name"),
    ("env_runtime-and-env", BASE + "env: {T: a}\nenv_runtime: {T: '{job_id}'}\n",
     "env_runtime.T", "T is set in env as well"),
    ("requeue-scalar", BASE + "requeue: 5\n", "requeue", "hint: allowed keys: enabled, signal"),
    ("requeue-unknown", BASE + "requeue: {wat: 1}\n", "requeue.wat", "unknown key 'wat'"),
    ("signal-kill", BASE + "requeue: {signal: KILL}\n", "requeue.signal",
     "hint: allowed values: USR2, USR1"),
    ("signal-int", BASE + "requeue: {signal: 5}\n", "requeue.signal", "expected str, got int 5"),
    ("lead-0", BASE + "requeue: {lead: 0}\n", "requeue.lead", "must be at least 1, got 0"),
    ("lead-str", BASE + "requeue: {lead: x}\n", "requeue.lead", "expected int, got str 'x'"),
    ("lead-too-long", BASE + "resources: {time: '0:01:00'}\nrequeue: {lead: 120}\n",
     "requeue.lead", "is not shorter than the time limit"),
    ("enabled-word", BASE + "requeue: {enabled: maybe}\n", "requeue.enabled", "expected bool"),
    ("budgets-scalar", BASE + "requeue: {budgets: 5}\n", "requeue.budgets",
     "must be a mapping of cause to count"),
    ("budgets-cause", BASE + "requeue: {budgets: {wat: 1}}\n", "requeue.budgets.wat",
     "unknown cause 'wat'"),
    ("budgets-negative", BASE + "requeue: {budgets: {timeout: -1}}\n", "requeue.budgets.timeout",
     "expected a count >= 0 or null, got -1"),
    ("budgets-str", BASE + "requeue: {budgets: {timeout: x}}\n", "requeue.budgets.timeout",
     "got 'x'"),
    ("budgets-bool", BASE + "requeue: {budgets: {error: true}}\n", "requeue.budgets.error",
     "got True"),
    ("launcher-value", BASE + "launcher: mpirun\n", "launcher",
     "hint: allowed values: torchrun, srun, none"),
    ("launcher-int", BASE + "launcher: 5\n", "launcher", "5 is not allowed"),
    ("launcher-list", BASE + "launcher: [srun]\n", "launcher", "['srun'] is not allowed"),
    ("self_check-word", BASE + "self_check: maybe\n", "self_check", "expected bool, got str"),
    ("self_check-int", BASE + "self_check: 1\n", "self_check", "expected bool, got int 1"),
    ("srun-scalar", BASE + "srun: 5\n", "srun", "must be a mapping of srun options"),
    ("srun-unknown", BASE + "srun: {wat: 1}\n", "srun.wat", "hint: allowed keys: mpi, label"),
    ("srun-label", BASE + "srun: {label: maybe}\n", "srun.label", "expected true or false"),
    ("srun-mpi-int", BASE + "srun: {mpi: 5}\n", "srun.mpi", "expected a string, got 5"),
    ("srun-mpi-space", BASE + "srun: {mpi: 'a b'}\n", "srun.mpi", "srun does not accept here"),
    ("srun-cpus-0", BASE + "srun: {cpus_per_task: 0}\n", "srun.cpus_per_task", "at least 1"),
    ("srun-cpus-str", BASE + "srun: {cpus_per_task: x}\n", "srun.cpus_per_task",
     "expected int, got str"),
    ("mpi-twice", BASE + "mpi: pmix\nsrun: {mpi: pmi2}\n", "mpi", "set twice, differently"),
    ("mpi-int", BASE + "mpi: 5\n", "mpi", "expected a string, got 5"),
    ("container-scalar", BASE + "container: 5\n", "container", "must be a mapping, got int 5"),
    ("container-unknown", BASE + "container: {image: x, wat: 1}\n", "container.wat",
     "unknown key 'wat'"),
    ("image-empty", BASE + "container: {image: ''}\n", "container.image",
     "required: the image"),
    ("image-int", BASE + "container: {image: 5}\n", "container.image", "required: the image"),
    ("image-missing", BASE + "container: {mounts: [/a]}\n", "container.image",
     "required: the image"),
    ("image-space", BASE + "container: {image: 'a b'}\n", "container.image",
     "is not an image name"),
    ("mounts-scalar", BASE + "container: {image: x, mounts: 5}\n", "container.mounts",
     "must be a list of mounts"),
    ("mounts-relative", BASE + "container: {image: x, mounts: ['rel:/a']}\n",
     "container.mounts[0]", "source 'rel' is not allowed"),
    ("mounts-flag", BASE + "container: {image: x, mounts: ['/a:/b:wat']}\n",
     "container.mounts[0]", "unknown mount flag 'wat'"),
    ("mounts-comma", BASE + "container: {image: x, mounts: ['/a,b:/c']}\n",
     "container.mounts[0]", "source '/a,b' is not allowed"),
    ("container-workdir", BASE + "container: {image: x, workdir: rel}\n", "container.workdir",
     "'rel' is not an absolute path"),
    ("env_keep-scalar", BASE + "container: {image: x, env_keep: 5}\n", "container.env_keep",
     "must be a list of variable names"),
    ("env_keep-name", BASE + "container: {image: x, env_keep: ['1A']}\n",
     "container.env_keep[0]", "'1A' is not a variable name"),
    ("writable-word", BASE + "container: {image: x, writable: maybe}\n", "container.writable",
     "expected true or false"),
    ("container-name", BASE + "container: {image: x, name: 'a b'}\n", "container.name",
     "'a b' is not a container name"),
    ("remap_root-int", BASE + "container: {image: x, remap_root: 3}\n", "container.remap_root",
     "expected true or false, got 3"),
    ("mount_home-word", BASE + "container: {image: x, mount_home: x}\n", "container.mount_home",
     "expected true or false"),
    ("params-scalar", "command: x\nparams: 5\n", "params", "must be a mapping of parameter"),
    ("params-list", "command: x\nparams: [1, 2]\n", "params", "must be a mapping of parameter"),
    ("params-empty", "command: x\nparams: {}\n", "params", "empty search space: no parameters"),
    ("params-missing", "command: x\n", "params", "hint: add at least one parameter"),
    ("params-empty-values", "command: x\nparams: {a: []}\n", "params.a",
     "empty search space: no values"),
    ("params-unreadable", "command: x\nparams: {a: '((('}\n", "params.a",
     "cannot read '((('"),
    ("params-range-str", "command: x\nparams: {a: 'range(a,b)'}\n", "params.a",
     "range(): argument 'start' cannot be str"),
    ("params-range-step", "command: x\nparams: {a: 'range(0,10,0)'}\n", "params.a",
     "step must not be zero"),
    ("params-range-huge", "command: x\nparams: {a: 'range(0,10000000)'}\n", "params.a",
     "more than 1000000 values"),
    ("params-uniform-arity", "command: x\nparams: {a: 'uniform(1)'}\n", "params.a",
     "missing a required argument: 'high'"),
    ("params-uniform-order", "command: x\nparams: {a: 'uniform(2,1)'}\n", "params.a",
     "low must be less than high"),
    ("params-loguniform-0", "command: x\nparams: {a: 'loguniform(0,1)'}\n", "params.a",
     "low must be positive"),
    ("params-randint-empty", "command: x\nparams: {a: 'randint(5,5)'}\n", "params.a",
     "low must be less than high"),
    ("params-choice-empty", "command: x\nparams: {a: 'choice()'}\n", "params.a",
     "empty choice is not legal"),
    ("params-function", "command: x\nparams: {a: 'nosuch(1,2)'}\n", "params.a",
     "unknown function 'nosuch'"),
    ("params-glob", "command: x\nparams: {a: 'glob(*)'}\n", "params.a",
     "Hydra's glob() is not supported"),
    ("params-empty-name", "command: x\nparams: {'': [1]}\n", "params.", "empty parameter name"),
    ("params-dot-name", "command: x\nparams: {'.a': [1]}\n", "params..a", "empty parameter name"),
    ("params-repeated", "command: x\nparams: {a: [1, 1]}\n", "params",
     "trials 0 and 1 have the same parameters"),
    ("params-twice", "command: x\nparams: {a.b: [1], a: {b: [2]}}\n", "params.a.b",
     "both set params.a.b"),
    ("profile-unknown", BASE + "profile: nosuch\n", "profile", "unknown profile 'nosuch'"),
]  # fmt: skip


@pytest.mark.parametrize("name,body,key,needle", cases(KEYS))
def test_bad_values_name_file_and_key(spec_file, name, body, key, needle):
    path = spec_file(body)
    ran = run("sweep", str(path), "--dry-run", "--backend", "local")
    check(ran, 2, f"error: {path}: {key}: ", needle)


# every fifth of them through --json: one JSON object on stderr, nothing on stdout
JSON_KEYS = [k for k in KEYS if not hasattr(k, "marks")][::5]


@pytest.mark.parametrize("name,body,key,needle", cases(JSON_KEYS))
def test_bad_values_as_json(spec_file, name, body, key, needle):
    path = spec_file(body)
    ran = run("sweep", str(path), "--dry-run", "--backend", "local", "--json")
    check(ran, 2)
    err = json.loads(ran.err)
    assert err["exit_code"] == 2 and err["error"]["file"] == str(path)
    assert err["error"]["key"] == key
    assert needle in f"{err['error']['message']}\n  hint: {err['error']['hint']}"
    assert ran.stdout == ""


# --------------------------------------------------------------------------- #
# Bad overrides (Hydra syntax, unknown keys, values), on sweep, submit and render.
# --------------------------------------------------------------------------- #

CLI_FILE = "error: command line: "
READ = "hint: overrides look like key=value"
# (id, override, needles)
OVERRIDES = [
    ("open-paren", "params.a=((", [CLI_FILE + "cannot read 'params.a=(('", READ]),
    ("no-equals", "noequals", [CLI_FILE, "missing '=' after the key"]),
    ("dotted-no-equals", "a.b.c", [CLI_FILE, "missing '=' after the key (column 5)"]),
    ("empty-key", "=1", [CLI_FILE, "empty key (column 0)"]),
    ("only-equals", "=", [CLI_FILE, "empty key"]),
    ("double-equals", "key==", [CLI_FILE, "expected a value but found '='"]),
    ("trailing-comma", "params.a=1,", [CLI_FILE, "expected a value but found end of input"]),
    ("leading-comma", "params.a=,1", [CLI_FILE, "expected a value but found ','"]),
    ("open-list", "params.a=[1,2", [CLI_FILE, "unbalanced '['"]),
    ("open-dict", "params.a={a:", [CLI_FILE, "expected a value but found end of input"]),
    ("open-quote", "params.a='unterminated", [CLI_FILE, "unterminated quoted string"]),
    ("open-range", "params.a=range(1,", [CLI_FILE, "expected a value"]),
    ("open-uniform", "params.a=uniform(0,1", [CLI_FILE, "unbalanced '('"]),
    ("close-paren", "params.a=1)", [CLI_FILE, "found ')'"]),
    ("close-bracket", "params.a=1]", [CLI_FILE, "found ']'"]),
    ("close-brace", "params.a=1}", [CLI_FILE, "found '}'"]),
    ("control-char", "params.a=\x01", [CLI_FILE, "unexpected character '\\x01'"]),
    ("unknown-function", "params.a=nosuch(1)", [CLI_FILE, "unknown function 'nosuch'"]),
    ("empty-choice", "params.a=choice()", [CLI_FILE, "empty choice is not legal"]),
    ("huge-range", "params.a=range(0,2000000)", [CLI_FILE, "more than 1000000 values"]),
    ("hydra-interval", "params.a=interval(0,1)", [CLI_FILE, "interval() is not supported"]),
    ("hydra-tag", "params.a=tag(x,1)", [CLI_FILE, "tag() is not supported"]),
    ("empty-param-name", "params.=1", [CLI_FILE, "unexpected '.' in key"]),
    ("params-itself", "params=5", [CLI_FILE + "params: name a parameter: params.NAME=VALUES"]),
    ("non-ascii-key", "résumé=1", [CLI_FILE, "unexpected 'é' in key"]),
    ("env-name", "env.1A=x", [CLI_FILE, "unexpected 'A' in key"]),
    ("env-float", "env.A=1e-3", [CLI_FILE + "env.A: 1e-3 is a float", "\"env.A='1e-3'\""]),
    ("delete-param", "~params.nope", [CLI_FILE + "params.nope: no such parameter to delete"]),
    ("delete-key", "~resources.nope", [CLI_FILE + "resources.nope: no such key to delete"]),
    ("delete-top", "~nope", [CLI_FILE + "nope: no such key to delete"]),
    ("sweep-a-setting", "resources.time=2:00:00,3:00:00",
     [CLI_FILE + "resources.time: only params.* can be swept"]),
    ("sweep-name", "name=a,b", [CLI_FILE + "name: only params.* can be swept"]),
    ("unknown-top", "wat=1", [f"error: {SPEC}: wat: unknown key 'wat'"]),
    ("add-unknown", "+wat=1", [f"error: {SPEC}: wat: unknown key"]),
    ("force-add-unknown", "++wat=1", [f"error: {SPEC}: wat: unknown key"]),
    ("unknown-resource", "resources.partiton=x", [f"{SPEC}: resources.partiton: unknown key",
     "did you mean 'partition'?"]),
    ("unknown-srun", "srun.wat=1", [f"{SPEC}: srun.wat: unknown key 'wat'"]),
    ("cpus-str", "resources.cpus=x", [f"{SPEC}: resources.cpus: expected int, got str 'x'"]),
    ("cpus-float", "resources.cpus=1.5", [f"{SPEC}: resources.cpus: expected int, got float"]),
    ("mem-word", "resources.mem=lots", [f"{SPEC}: resources.mem: 'lots' is not a memory size"]),
    ("time-empty", "resources.time=", [f"{SPEC}: resources.time: '' is not a Slurm time"]),
    ("resources-scalar", "resources=5", [f"{SPEC}: resources: must be a mapping"]),
    ("env-list", "env.A=[1]", [f"{SPEC}: env.A: must be a string or number"]),
    ("env-scalar", "env=5", [f"{SPEC}: env: must be a mapping"]),
    ("command-empty", "command=", [f"{SPEC}: command: is empty"]),
    ("command-into-list", "command.0.x=1", [f"{SPEC}: command: required"]),
    ("name-empty", "name=", [f"{SPEC}: name: '' is not a valid name"]),
    ("image-empty", "container.image=", [f"{SPEC}: container.image: required: the image"]),
    ("max_parallel-0", "max_parallel=0", [f"{SPEC}: max_parallel: must be at least 1"]),
    ("seed-str", "seed=x", [f"{SPEC}: seed: expected int, got str 'x'"]),
    ("signal", "requeue.signal=KILL", [f"{SPEC}: requeue.signal: 'KILL' is not allowed"]),
    ("launcher", "launcher=mpirun", [f"{SPEC}: launcher: 'mpirun' is not allowed"]),
    ("output_root", "output_root=a b", [f"{SPEC}: output_root: 'a b' is not a usable"]),
    ("extra-array", "resources.extra.array=1", [f"{SPEC}: resources.extra.array: slurmkit sets"]),
    ("deep", "env.X=" + "[" * 100 + "1" + "]" * 100, [CLI_FILE + "env.X: nested more than 64"]),
    ("profile-unknown", "profile=nosuch", [CLI_FILE + "profile: unknown profile"]),
]  # fmt: skip
OVERRIDE_COMMANDS = {
    "sweep": ["sweep", SPEC, "--dry-run", "--backend", "local"],
    "submit": ["submit", SPEC, "--dry-run", "--backend", "local"],
    "render": ["render", SPEC],
}


@pytest.mark.parametrize("name,override,needles", cases(OVERRIDES))
def test_bad_overrides_on_sweep(spec_file, name, override, needles):
    path = spec_file(BASE)
    ran = run("sweep", str(path), override, "--dry-run", "--backend", "local")
    check(ran, 2, *(_fill(n, **{SPEC: str(path)}) for n in needles))


@pytest.mark.parametrize("command", ["submit", "render"])
@pytest.mark.parametrize("name,override,needles", cases(OVERRIDES[:24]))
def test_bad_overrides_on_jobs(spec_file, command, name, override, needles):
    path = spec_file("command: [python, t.py]\nparams: {a: 1}\n")  # one trial: a job
    argv = [_fill(a, **{SPEC: str(path)}) for a in OVERRIDE_COMMANDS[command]]
    ran = run(*argv[:2], override, *argv[2:])
    check(ran, 2, *(_fill(n, **{SPEC: str(path)}) for n in needles))


# --------------------------------------------------------------------------- #
# Bad user configs ($SLURMKIT_CONFIG).
# --------------------------------------------------------------------------- #

CONFIGS = [
    ("top-list", "- a\n", f"error: {CFG}: the top level must be a mapping"),
    ("top-scalar", "42\n", f"error: {CFG}: the top level must be a mapping"),
    ("unknown-key", "wat: 1\n", f"error: {CFG}: wat: unknown key 'wat'"),
    ("spec-key-command", "command: x\n", f"error: {CFG}: command: unknown key"),
    ("spec-key-params", "params: {a: 1}\n", f"error: {CFG}: params: unknown key"),
    ("resources-scalar", "resources: 5\n", f"error: {CFG}: resources: must be a mapping"),
    ("env-list", "env: [a]\n", f"error: {CFG}: env: must be a mapping"),
    ("container-scalar", "container: 5\n", f"error: {CFG}: container: must be a mapping"),
    ("requeue-scalar", "requeue: 5\n", f"error: {CFG}: requeue: must be a mapping"),
    ("env-float", "env: {A: 1.5}\n", f"error: {CFG}: env.A: 1.5 is a YAML float"),
    ("profile", "profile: nosuch\n", f"error: {CFG}: profile: unknown profile 'nosuch'"),
    ("not-utf8", b"env: {A: \xff}\n", f"error: {CFG}: env.A: not UTF-8 text"),
    ("malformed", "resources: {a: [1\n", f"error: {CFG}: malformed"),
    ("nul", "\0", f"error: {CFG}: malformed: unacceptable character #x0000"),
    ("interpolation", "output_root: ${nope}\n", f"error: {CFG}: malformed: Interpolation key"),
    ("alias-twice", "resources: {cpus: 1, cpus_per_task: 2}\n",
     f"error: {CFG}: resources.cpus_per_task: resources.cpus and resources.cpus_per_task"),
    ("deep", "env: {A: " + "[" * 100 + "1" + "]" * 100 + "}\n", f"error: {CFG}: env.A.0"),
    ("bad-resource-key", "resources: {wat: 1}\n", f"error: {CFG}: resources.wat"),
    ("bad-resource-value", "resources: {cpus: x}\n", f"error: {CFG}: resources.cpus"),
]  # fmt: skip


@pytest.mark.parametrize("name,body,needle", cases(CONFIGS))
def test_bad_user_configs(tmp_path, spec_file, monkeypatch, name, body, needle):
    config = tmp_path / "config.yaml"
    _write(config, body if isinstance(body, bytes) else body.encode())
    monkeypatch.setenv("SLURMKIT_CONFIG", str(config))
    path = spec_file(BASE)
    ran = run("sweep", str(path), "--dry-run", "--backend", "local")
    check(ran, 2, _fill(needle, **{CFG: str(config)}))


# --------------------------------------------------------------------------- #
# Bad options and arguments, command by command.
# --------------------------------------------------------------------------- #

USAGE = "Try 'slurmkit"
# (id, argv (SPEC: a valid spec, ROOT: the sweep, <file>: a plain file), exit code, needles)
OPTIONS = [
    ("top-unknown-command", ["nosuchcmd"], 2, ["No such command 'nosuchcmd'", USAGE]),
    ("top-unknown-option", ["--nosuch"], 2, ["No such option '--nosuch'"]),
    ("sweep-nothing", ["sweep"], 2, ["give a SPEC file, or --resume DIR"]),
    ("sweep-backend-name", ["sweep", SPEC, "--backend", "nosuch"], 2,
     ["Invalid value for '--backend': 'nosuch' is not one of 'auto', 'slurm', 'local'"]),
    ("sweep-backend-missing", ["sweep", SPEC, "--backend"], 2,
     ["Option '--backend' requires an argument"]),
    ("sweep-unknown-option", ["sweep", SPEC, "--nosuch"], 2, ["No such option '--nosuch'"]),
    ("sweep-plain-alone", ["sweep", SPEC, "--plain"], 2,
     ["--plain only goes with --dry-run and a SPEC"]),
    ("sweep-plain-resume", ["sweep", "--resume", ROOT, "--plain", "--dry-run"], 2,
     ["--plain only goes with --dry-run and a SPEC"]),
    ("sweep-list-resume", ["sweep", "--resume", ROOT, "--list"], 2,
     ["--list goes with a SPEC (for a sweep: slurmkit status DIR)"]),
    ("sweep-resume-missing", ["sweep", "--resume"], 2, ["Option '--resume' requires an argument"]),
    ("sweep-resume-nowhere", ["sweep", "--resume", "/nonexistent/sweep"], 2,
     ["error: /nonexistent/sweep is not a sweep directory"]),
    ("sweep-resume-a-spec", ["sweep", "--resume", SPEC], 2, [f"error: {SPEC} is not a sweep"]),
    ("sweep-resume-empty", ["sweep", "--resume", ""], 2, ["error: '' is not a sweep directory"]),
    ("sweep-dir-space", ["sweep", SPEC, "--dry-run", "--sweep-dir", "/tmp/a b"], 2,
     ["error: --sweep-dir: '/tmp/a b': sweep directories cannot hold whitespace"]),
    ("sweep-dir-percent", ["sweep", SPEC, "--dry-run", "--sweep-dir", "/tmp/a%b"], 2,
     ["error: --sweep-dir: '/tmp/a%b'"]),
    ("sweep-dir-quote", ["sweep", SPEC, "--dry-run", "--sweep-dir", "/tmp/a'b"], 2,
     ["error: --sweep-dir:", "quotes"]),
    ("sweep-dir-taken", ["sweep", SPEC, "--backend", "local", "--sweep-dir", ROOT], 2,
     [f"error: {ROOT} already exists", "hint: use --resume to continue a sweep"]),
    ("sweep-dir-under-a-file", ["sweep", SPEC, "--backend", "local", "--sweep-dir",
     "<file>/sub"], 2, ["error: output_root: cannot create <file>: File exists"]),
    ("sweep-many-trials", ["sweep", "<big>", "--backend", "local"], 2,
     ["error: <big>: params: 200000 trials: more than 100000 need a confirmation",
      "hint: pass --yes (yes=True) to submit them, or --dry-run to look first"]),
    ("sweep-slurm-unreachable", ["sweep", SPEC, "--backend", "slurm"], 1,
     ["error: no Slurm controller answered", NO_SLURM, "hint: check SLURM_CONF"]),
    ("sweep-slurm-dry-run", ["sweep", SPEC, "--backend", "slurm", "--dry-run"], 1,
     ["error: no Slurm controller answered"]),
    ("sweep-container-local", ["sweep", SPEC, "--backend", "local",
     "container.image=nvcr.io/nvidia/pytorch:24.01-py3"], 2,
     ["error: --backend: container trials need Slurm with pyxis"]),
    ("submit-nothing", ["submit"], 2, ["Missing argument 'JOB [OVERRIDES]...'"]),
    ("submit-backend", ["submit", SPEC, "--backend", "x"], 2, ["Invalid value for '--backend'"]),
    ("submit-unknown-option", ["submit", SPEC, "--wait"], 2, ["No such option '--wait'"]),
    ("submit-a-sweep", ["submit", "<sweep-spec>", "--dry-run"], 2,
     ["error: <sweep-spec>: params: submit runs one job, and this spec makes 2 trials",
      "hint: run them all with: slurmkit sweep <sweep-spec>"]),
    ("submit-container-local", ["submit", SPEC, "--backend", "local",
     "container.image=nvcr.io/nvidia/pytorch:24.01-py3"], 2, ["container trials need Slurm"]),
    ("submit-slurm-unreachable", ["submit", SPEC, "--backend", "slurm"], 1,
     ["error: no Slurm controller answered"]),
    ("render-nothing", ["render"], 2, ["Missing argument 'SPEC [OVERRIDES]...'"]),
    ("render-unknown-option", ["render", SPEC, "--dry-run"], 2, ["No such option '--dry-run'"]),
    ("status-nothing", ["status"], 2, ["Missing argument 'DIR'"]),
    ("status-interval-0", ["status", ROOT, "--interval", "0"], 2,
     ["Invalid value for '--interval': 0.0 is not a number of seconds above 0"]),
    ("status-interval-negative", ["status", ROOT, "--interval", "-1"], 2,
     ["-1.0 is not a number of seconds above 0"]),
    ("status-interval-nan", ["status", ROOT, "--interval", "nan"], 2,
     ["nan is not a number of seconds above 0"]),
    ("status-interval-inf", ["status", ROOT, "--interval", "inf"], 2,
     ["inf is not a number of seconds above 0"]),
    ("status-interval-word", ["status", ROOT, "--interval", "soon"], 2,
     ["'soon' is not a valid float"]),
    ("status-interval-missing", ["status", ROOT, "--interval"], 2,
     ["Option '--interval' requires an argument"]),
    ("status-watch-interval", ["status", ROOT, "--watch", "--interval", "0"], 2,
     ["is not a number of seconds above 0"]),
    ("status-unknown-option", ["status", ROOT, "--sort", "x"], 2, ["No such option '--sort'"]),
    ("status-nowhere", ["status", "/nonexistent/sweep"], 2,
     ["error: /nonexistent/sweep is not a sweep directory (no trials.jsonl / sweep.json)"]),
    ("status-a-file", ["status", "<file>"], 2, ["error: <file> is not a sweep directory"]),
    ("status-empty", ["status", ""], 2, ["error: '' is not a sweep directory"]),
    ("status-json-nowhere", ["status", "/nonexistent/sweep", "--json"], 2,
     ['"message": "/nonexistent/sweep is not a sweep directory', '"exit_code": 2']),
    ("results-nothing", ["results"], 2, ["Missing argument 'DIR'"]),
    ("results-limit-word", ["results", ROOT, "--limit", "abc"], 2,
     ["Invalid value for '--limit': 'abc' is not a valid integer"]),
    ("results-limit-float", ["results", ROOT, "--limit", "1.5"], 2,
     ["'1.5' is not a valid integer"]),
    ("results-limit-negative", ["results", ROOT, "--limit", "-1"], 2,
     ["Invalid value for '--limit': -1 is not in the range x>=0"]),
    ("results-json-and-csv", ["results", ROOT, "--json", "--csv"], 2,
     ["--json and --csv: give one of them"]),
    ("results-sort-unknown", ["results", ROOT, "--sort", "nope"], 2,
     ["error: --sort: no metric or parameter named 'nope'", "hint: known: x, score"]),
    ("results-sort-json", ["results", ROOT, "--sort", "nope", "--json"], 2,
     ['"key": "--sort"', "no metric or parameter named 'nope'"]),
    ("results-sort-missing", ["results", ROOT, "--sort"], 2, ["requires an argument"]),
    ("results-nowhere", ["results", "/nonexistent/sweep"], 2, ["is not a sweep directory"]),
    ("results-a-file", ["results", "<file>"], 2, ["error: <file> is not a sweep directory"]),
    ("logs-nothing", ["logs"], 2, ["Missing argument 'DIR'"]),
    ("logs-no-trial", ["logs", ROOT], 2, ["Missing argument 'TRIAL'"]),
    ("logs-index-past", ["logs", ROOT, "3"], 2,
     ["error: TRIAL: no trial matches '3'", "hint: an index 0..2 or a unique id prefix"]),
    ("logs-index-huge", ["logs", ROOT, "99999999999999999999"], 2, ["no trial matches"]),
    ("logs-negative", ["logs", ROOT, "-1"], 2, ["No such option '-1'"]),
    ("logs-empty", ["logs", ROOT, ""], 2, ["error: TRIAL: several trials match ''"]),
    ("logs-word", ["logs", ROOT, "zzz"], 2, ["error: TRIAL: no trial matches 'zzz'"]),
    ("logs-float", ["logs", ROOT, "1.0"], 2, ["no trial matches '1.0'"]),
    ("logs-space", ["logs", ROOT, " 1"], 2, ["no trial matches ' 1'"]),
    ("logs-arabic-digit", ["logs", ROOT, "\u0663"], 2, ["no trial matches '\u0663'"]),
    ("logs-path", ["logs", ROOT, "../../etc/passwd"], 2, ["no trial matches '../../etc/passwd'"]),
    ("logs-long", ["logs", ROOT, "f" * 300], 2, ["no trial matches 'fff"]),
    ("logs-slurm-local", ["logs", ROOT, "0", "--slurm"], 2, ["has not run on Slurm yet"]),
    ("logs-nowhere", ["logs", "/nonexistent/sweep", "0"], 2, ["is not a sweep directory"]),
    ("logs-unknown-option", ["logs", ROOT, "0", "--tail"], 2, ["No such option '--tail'"]),
    ("cancel-nothing", ["cancel"], 2, ["Missing argument 'DIR'"]),
    ("cancel-nowhere", ["cancel", "/nonexistent/sweep"], 2, ["is not a sweep directory"]),
    ("cancel-a-file", ["cancel", "<file>", "--dry-run"], 2, ["<file> is not a sweep directory"]),
    ("cancel-unknown-option", ["cancel", ROOT, "--all"], 2, ["No such option '--all'"]),
    ("cancel-json-nowhere", ["cancel", "/nonexistent/sweep", "--json"], 2, ['"exit_code": 2']),
    ("unlock-nothing", ["unlock"], 2, ["Missing argument 'DIR'"]),
    ("unlock-nowhere", ["unlock", "/nonexistent/sweep"], 2, ["is not a sweep directory"]),
    ("unlock-a-file", ["unlock", "<file>"], 2, ["<file> is not a sweep directory"]),
    ("unlock-extra", ["unlock", ROOT, "more"], 2, ["Got unexpected extra argument (more)"]),
    ("image-nothing", ["image"], 2, ["Usage: slurmkit image"]),
    ("image-unknown", ["image", "export"], 2, ["No such command 'export'"]),
    ("image-import-nothing", ["image", "import"], 2, ["Missing argument 'URI'"]),
    ("image-import-no-to", ["image", "import", "nvcr.io/x:1"], 2, ["Missing option '--to'"]),
    ("image-import-to-missing", ["image", "import", "x", "--to"], 2, ["requires an argument"]),
    ("image-empty", ["image", "import", "", "--to", "<dir>"], 2,
     ["error: URI: '': '' is not an image name"]),
    ("image-upper", ["image", "import", "UPPER/Case", "--to", "<dir>"], 2,
     ["error: URI: 'UPPER/Case'", "is not an image name (lowercase"]),
    ("image-space", ["image", "import", "a b", "--to", "<dir>"], 2, ["'a b' is not an image"]),
    ("image-bare-scheme", ["image", "import", "docker://", "--to", "<dir>"], 2,
     ["'' is not an image name"]),
    ("image-relative-path", ["image", "import", "./x.sqsh", "--to", "<dir>"], 2,
     ["error: URI: './x.sqsh' is a path, not a registry image"]),
    ("image-absolute-path", ["image", "import", "/data/x.sqsh", "--to", "<dir>"], 2,
     ["'/data/x.sqsh' is a path, not a registry image"]),
    ("image-no-enroot", ["image", "import", "nvcr.io/nvidia/pytorch:24.01-py3", "--to",
     "<dir>"], 2, ["error: enroot is not installed here", "hint: run it on a compute node"]),
    ("image-no-enroot-json", ["image", "import", "nvcr.io/x:1", "--to", "<dir>", "--json"], 2,
     ['"message": "enroot is not installed here', '"exit_code": 2']),
    ("completion-nothing", ["completion"], 2, ["Missing argument '{bash|zsh|fish}'"]),
    ("completion-tcsh", ["completion", "tcsh"], 2,
     ["'tcsh' is not one of 'bash', 'zsh', 'fish'"]),
    ("completion-extra", ["completion", "bash", "zsh"], 2, ["Got unexpected extra argument (zsh)"]),
]  # fmt: skip


@pytest.mark.parametrize("name,argv,code,needles", cases(OPTIONS))
def test_bad_options(template, tmp_path, name, argv, code, needles):
    if name.startswith("image-no-enroot") and shutil.which("enroot"):
        pytest.skip("enroot is installed here")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"command: [python, t.py]\noutput_root: {tmp_path / 'runs'}\n")
    sweep_spec = tmp_path / "sweep.yaml"
    sweep_spec.write_text(f"command: x\nparams: {{a: [1, 2]}}\noutput_root: {tmp_path / 'runs'}\n")
    big = tmp_path / "big.yaml"
    big.write_text(f"command: x\nparams: {{a: 'range(0,200000)'}}\noutput_root: {tmp_path}/runs\n")
    plain = tmp_path / "plain.txt"
    plain.write_text("not a sweep\n")
    marks = {
        SPEC: str(spec),
        ROOT: str(template),
        "<file>": str(plain),
        "<dir>": str(tmp_path / "images"),
        "<sweep-spec>": str(sweep_spec),
        "<big>": str(big),
    }
    if name.startswith("sweep") and SPEC in argv:  # a sweep of two trials, not a job
        marks[SPEC] = str(sweep_spec)
    ran = run(*(_fill(a, **marks) for a in argv))
    check(ran, code, *(_fill(n, **marks) for n in needles))
    assert not (tmp_path / "runs").exists()  # nothing was created
    assert not (tmp_path / "images").exists()


# --------------------------------------------------------------------------- #
# Resume: overrides it refuses.
# --------------------------------------------------------------------------- #

FIXED = "cannot change this when resuming (the trials are fixed)"
RESUME_OVERRIDES = [
    ("params", "params.x=5", [CLI_FILE + "params.x: " + FIXED, "hint: keys that may change"]),
    ("name", "name=y", [CLI_FILE + "name: " + FIXED]),
    ("command", "command=z", [CLI_FILE + "command: " + FIXED]),
    ("command-item", "command.0=z", [CLI_FILE + "command.0: " + FIXED]),
    ("num_samples", "num_samples=2", [CLI_FILE + "num_samples: " + FIXED]),
    ("seed", "seed=3", [CLI_FILE + "seed: " + FIXED]),
    ("output_root", "output_root=x", [CLI_FILE + "output_root: " + FIXED]),
    ("workdir", "workdir=/x", [CLI_FILE + "workdir: " + FIXED]),
    ("launcher", "launcher=srun", [CLI_FILE + "launcher: " + FIXED]),
    ("args", "args=none", [CLI_FILE + "args: " + FIXED]),
    ("profile", "profile=sunk", [CLI_FILE + "profile: " + FIXED]),
    ("srun", "srun.mpi=pmix", [CLI_FILE + "srun.mpi: " + FIXED]),
    ("a-sweep", "resources.time=1:00,2:00", [CLI_FILE + "resources.time: " + FIXED]),
    ("unreadable", "((", [CLI_FILE + "cannot read '(('", READ]),
    ("no-equals", "noeq", [CLI_FILE + "cannot read 'noeq': missing '='"]),
    ("env-float", "env.A=1e-3", [CLI_FILE + "env.A: 1e-3 is a float"]),
    ("env-name", "env.1A=x", [CLI_FILE + "cannot read 'env.1A=x'"]),
    ("cpus-word", "resources.cpus=x", ["resources.cpus: expected int, got str 'x'"]),
    ("cpus-mapping", "resources.cpus.x=1", ["resources.cpus: expected int, got dict"]),
    ("unknown-resource", "resources.wat=1", ["resources.wat: unknown key 'wat'"]),
    ("time-word", "resources.time=soon", ["resources.time: 'soon' is not a Slurm time"]),
    ("max_parallel-0", "max_parallel=0", ["max_parallel: must be at least 1, got 0"]),
    ("signal", "requeue.signal=KILL", ["requeue.signal: 'KILL' is not allowed"]),
    ("image", "container.image=a b", ["container.image: 'a b'"]),
    ("self_check", "self_check=maybe", ["self_check: expected bool, got str 'maybe'"]),
    ("resources-scalar", "resources=5", ["resources: must be a mapping"]),
    ("env-scalar", "env=5", ["env: must be a mapping"]),
    ("container-scalar", "container=5", ["container: must be a mapping"]),
    ("extra-array", "resources.extra.array=1", ["resources.extra.array: slurmkit sets"]),
    ("blamed-file", "resources.cpus=x", [CLI_FILE + "resources.cpus"]),
]  # fmt: skip


@pytest.mark.parametrize("name,override,needles", cases(RESUME_OVERRIDES))
def test_bad_resume_overrides(sweep, name, override, needles):
    before = sorted(p.name for p in (sweep / "submissions").iterdir())
    ran = run("sweep", "--resume", str(sweep), override, "--backend", "local")
    check(ran, 2, *needles)
    assert sorted(p.name for p in (sweep / "submissions").iterdir()) == before  # none made


# --------------------------------------------------------------------------- #
# Damaged sweep directories, for status, results, cancel, resume, logs and unlock.
# --------------------------------------------------------------------------- #

COMMANDS = {
    "status": ["status", ROOT],
    "status-json": ["status", ROOT, "--json"],
    "status-all": ["status", ROOT, "--all"],
    "results": ["results", ROOT, "--sort", "score"],
    "results-json": ["results", ROOT, "--json"],
    "results-csv": ["results", ROOT, "--csv"],
    "cancel-dry": ["cancel", ROOT, "--dry-run"],
    "cancel": ["cancel", ROOT],
    "resume-dry": ["sweep", "--resume", ROOT, "--dry-run", "--backend", "local"],
    "logs": ["logs", ROOT, "0"],
    "logs-slurm": ["logs", ROOT, "1", "--slurm"],
    "unlock": ["unlock", ROOT],
}
_READS = ("status", "status-json", "status-all", "results", "results-json", "results-csv")
_STEERS = ("cancel-dry", "cancel", "resume-dry")
# a damaged trial: status exits 1, the rest goes on (a warning each)
TRIAL = {
    **dict.fromkeys(_READS, 0),
    **dict.fromkeys(_STEERS, 0),
    "status": 1,
    "status-json": 1,
    "status-all": 1,
}
WARNED = {**dict.fromkeys(_READS, 0), **dict.fromkeys(_STEERS, 0)}  # only a warning
METRICS = {"status-json": 0, "results": 0, "results-json": 0, "results-csv": 0}
NO_SWEEP = dict.fromkeys(COMMANDS, 2)  # not a sweep directory any more: every command says so
DIRS = {**dict.fromkeys(_READS, 2), **dict.fromkeys(_STEERS, 2)}  # a folder is a file: refused
REFUSED = {**DIRS, "logs": 2}  # and logs, which finds the trial in trials.jsonl
SWEEP_JSON = {**WARNED, "resume-dry": 2}  # a resume cannot go on without sweep.json
NOT_SWEEP = "is not a sweep directory (no trials.jsonl / sweep.json)"
TRUNC = "<truncated>"  # the file's first half

# (id, file (in ROOT; {id} is trial 1's id), what it becomes (None: removed, "DIR": a directory),
#  {command: exit code}, a part of the message)
DAMAGES = [
    ("sweep.json-truncated", "sweep.json", TRUNC, SWEEP_JSON, "sweep.json: not JSON"),
    ("sweep.json-empty", "sweep.json", b"", SWEEP_JSON, "sweep.json: not JSON (Expecting value"),
    ("sweep.json-garbage", "sweep.json", b"}{", SWEEP_JSON, "sweep.json: not JSON"),
    ("sweep.json-binary", "sweep.json", b"\xff\xfe\x00", SWEEP_JSON, "sweep.json: not JSON"),
    ("sweep.json-list", "sweep.json", b"[]", SWEEP_JSON, "sweep.json: not a JSON object but list"),
    ("sweep.json-string", "sweep.json", b'"x"', SWEEP_JSON, "sweep.json: not a JSON object"),
    ("sweep.json-missing", "sweep.json", None, NO_SWEEP, NOT_SWEEP),
    ("sweep.json-directory", "sweep.json", "DIR", NO_SWEEP, NOT_SWEEP),
    ("trials.jsonl-missing", "trials.jsonl", None, NO_SWEEP, NOT_SWEEP),
    ("trials.jsonl-directory", "trials.jsonl", "DIR", NO_SWEEP, NOT_SWEEP),
    ("line-truncated", "trials.jsonl", "<line:1:truncated>", TRIAL, "trials.jsonl:2: damaged"),
    ("line-garbage", "trials.jsonl", "<line:1:not json>", TRIAL, "trials.jsonl:2: damaged"),
    ("line-binary", "trials.jsonl", "<line:1:\udcff>", TRIAL, "trials.jsonl:2: damaged"),
    ("line-list", "trials.jsonl", "<line:1:[1, 2]>", TRIAL, "trials.jsonl:2: damaged"),
    ("line-index", "trials.jsonl", '<line:1:{"index": 7, "id": "abc", "params": {}}>', TRIAL,
     "trials.jsonl:2: damaged (not an index, id, params row)"),
    ("line-params", "trials.jsonl", '<line:1:{"index": 1, "id": "abc", "params": 5}>', TRIAL,
     "trials.jsonl:2: damaged"),
    ("id-escape", "trials.jsonl", '<line:1:{"index": 1, "id": "../../x", "params": {}}>', REFUSED,
     "trials.jsonl:2: '../../x' is not a trial id"),
    ("id-slash", "trials.jsonl", '<line:1:{"index": 1, "id": "a/b", "params": {}}>', REFUSED,
     "'a/b' is not a trial id"),
    ("id-int", "trials.jsonl", '<line:1:{"index": 1, "id": 5, "params": {}}>', REFUSED,
     "trials.jsonl:2: 5 is not a trial id"),
    ("id-missing", "trials.jsonl", '<line:1:{"index": 1, "params": {}}>', REFUSED,
     "None is not a trial id"),
    ("id-twice", "trials.jsonl", "<line:1:twice>", REFUSED, "comes twice"),
    ("status-truncated", "trials/{id}/status.json", TRUNC, {**TRIAL, "logs-slurm": 2},
     "status.json: not JSON"),
    ("status-garbage", "trials/{id}/status.json", b"}{ not json", {**TRIAL, "logs-slurm": 2},
     "status.json: not JSON"),
    ("status-binary", "trials/{id}/status.json", b"\xff\xfe\x00", {**TRIAL, "logs-slurm": 2},
     "status.json: not JSON"),
    ("status-empty", "trials/{id}/status.json", b"", {**TRIAL, "logs-slurm": 2},
     "status.json: not JSON"),
    ("status-list", "trials/{id}/status.json", b"[1, 2]", {**TRIAL, "logs-slurm": 2},
     "status.json: not a JSON object but list"),
    ("status-attempts-int", "trials/{id}/status.json", b'{"state": "RUNNING", "attempts": 3}',
     TRIAL, "status.json: its attempts are not a list of records"),
    ("status-attempts-items", "trials/{id}/status.json", b'{"attempts": [1]}', TRIAL,
     "its attempts are not a list of records"),
    ("status-state-int", "trials/{id}/status.json", b'{"state": 5}', TRIAL,
     "status.json: its state is not a name: the trial is DAMAGED (resume runs it again)"),
    ("status-directory", "trials/{id}/status.json", "DIR", {**TRIAL, "logs-slurm": 2},
     "status.json: cannot be read (Is a directory)"),
    ("trial-dir-a-file", "trials/{id}", b"not a directory", {**TRIAL, "logs-slurm": 2},
     "status.json: cannot be read (Not a directory)"),
    ("trials-a-file", "trials", b"not a directory", DIRS, "trials is not a directory"),
    ("metrics-truncated", "trials/{id}/metrics.json", TRUNC, METRICS,
     "metrics.json: not JSON"),
    ("metrics-list", "trials/{id}/metrics.json", b"[1]", METRICS,
     "metrics.json: not a JSON object but list: its metrics are not shown"),
    ("metrics-binary", "trials/{id}/metrics.json", b"\x00\xff", METRICS, "metrics.json: not JSON"),
    ("metrics-directory", "trials/{id}/metrics.json", "DIR", METRICS,
     "metrics.json: cannot be read (Is a directory)"),
    ("submission-truncated", "submissions/0000.json", TRUNC, WARNED,
     "0000.json: not JSON"),
    ("submission-garbage", "submissions/0000.json", b"{", WARNED,
     "0000.json: not JSON (Expecting property name"),
    ("submission-list", "submissions/0000.json", b"[]", WARNED,
     "0000.json: not a JSON object but list: its jobs are not shown or cancelled"),
    ("submission-directory", "submissions/0000.json", "DIR", WARNED,
     "0000.json: cannot be read (Is a directory)"),
    ("submission-indices-int", "submissions/0000.json", b'{"backend": "local", "indices": 5}',
     WARNED, "0000.json: its indices 5 are not an array spec"),
    ("submission-indices-word", "submissions/0000.json",
     b'{"backend": "local", "indices": "a-b"}', WARNED, "its indices 'a-b' are not an array"),
    ("submission-indices-step-0", "submissions/0000.json",
     b'{"backend": "local", "indices": "0-2:0"}', WARNED, "are not an array spec"),
    ("submission-backend-list", "submissions/0000.json", b'{"backend": ["local"]}', WARNED,
     "0000.json: its backend is not a name"),
    ("submission-jobs-int", "submissions/0000.json", b'{"backend": "slurm", "jobs": 5}', WARNED,
     "0000.json: its jobs are not a list of {job_id, offset, array} records"),
    ("submission-job-empty", "submissions/0000.json", b'{"backend": "slurm", "jobs": [{}]}',
     WARNED, "its jobs are not a list"),
    ("submission-job-offset", "submissions/0000.json",
     b'{"backend": "slurm", "jobs": [{"job_id": "1", "offset": "x", "array": "0-2"}]}', WARNED,
     "its jobs are not a list"),
    ("submission-job-array", "submissions/0000.json",
     b'{"backend": "slurm", "jobs": [{"job_id": "1", "offset": 0, "array": 7}]}', WARNED,
     "its jobs are not a list"),
    ("submission-job-id", "submissions/0000.json",
     b'{"backend": "slurm", "jobs": [{"job_id": 1, "offset": 0, "array": "0-2"}]}', WARNED,
     "its jobs are not a list"),
    ("submissions-a-file", "submissions", b"not a directory", DIRS,
     "submissions is not a directory"),
]  # fmt: skip


def _damage(root: Path, rel: str, what: Any) -> Path:
    path = root / rel.format(id=_ids(root)[1])
    if isinstance(what, str) and what.startswith("<line:"):  # one line of trials.jsonl
        lines = path.read_text().splitlines()
        number, text = what[6:-1].split(":", 1)
        row = int(number)
        if text == "truncated":
            lines[row] = lines[row][:20]
        elif text == "twice":
            lines[row] = json.dumps({**json.loads(lines[row]), "id": json.loads(lines[0])["id"]})
        else:
            lines[row] = text
        path.write_bytes("\n".join(lines).encode("utf-8", "surrogateescape") + b"\n")
        return path
    if what == TRUNC:
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2])
        return path
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    _write(path, what)
    return path


CELLS = [
    pytest.param(damage, command, code, id=f"{damage[0]}-{command}")
    for damage in DAMAGES
    for command, code in damage[3].items()
]


@pytest.mark.parametrize("damage,command,code", CELLS)
def test_damaged_sweep_directories(sweep, damage, command, code):
    _, rel, what, _, needle = damage
    path = _damage(sweep, rel, what)
    ran = run(*(_fill(a, **{ROOT: str(sweep)}) for a in COMMANDS[command]))
    check(ran, code, needle)
    if code == 0 or (code == 1 and command.startswith("status")):
        assert "warning: " in ran.err and str(path) in ran.err  # the file, named
    if command == "status-json" and code != 2:
        assert any(needle in w for w in json.loads(ran.stdout)["warnings"])


# sweep.json that reads as JSON but not as what a resume needs: resume says so, naming sweep.json
RESUME_DAMAGES = [
    ("name-int", {"name": 5}, "sweep.json: name: expected str, got int 5"),
    ("name-space", {"name": "a b"}, "sweep.json: name: 'a b' is not a valid name"),
    ("command-missing", {"command": None}, "sweep.json: command: required"),
    ("command-empty", {"command": []}, "sweep.json: command: is empty"),
    ("params-int", {"params": 5}, "sweep.json: params: must be a mapping of parameter"),
    ("params-unreadable", {"params": {"x": "(("}}, "sweep.json: params.x: cannot read '(('"),
    ("workdir-int", {"workdir": 5}, "sweep.json: workdir: expected str, got int 5"),
    ("time-word", {"resources": {"time": "bad"}}, "sweep.json: resources.time: 'bad' is not"),
    ("output_root-int", {"output_root": 5}, "sweep.json: output_root: expected str"),
    ("env-float", {"env": {"A": 1.5}}, "sweep.json: env.A: 1.5 is a float"),
    ("max_parallel-0", {"max_parallel": 0}, "sweep.json: max_parallel: must be at least 1"),
    ("signal", {"requeue": {"signal": "KILL"}}, "sweep.json: requeue.signal: 'KILL'"),
    ("image", {"container": {"image": "a b"}}, "sweep.json: container.image: 'a b'"),
    ("submit_dir-missing", {"submit_dir": None}, "sweep.json: its submit_dir is not a path"),
    ("submit_dir-int", {"submit_dir": 5}, "sweep.json: its submit_dir is not a path"),
    ("launch-int", {"launch": 5}, "sweep.json: its launch is not a mapping of argument lists"),
    ("launch-launcher", {"launch": {"launcher": 5, "step": []}}, "its launch is not a mapping"),
    ("launch-items", {"launch": {"launcher": [1], "step": []}}, "its launch is not a mapping"),
]  # fmt: skip


@pytest.mark.parametrize("dry_run", [True, False], ids=["dry-run", "run"])
@pytest.mark.parametrize("name,changes,needle", cases(RESUME_DAMAGES))
def test_resume_of_a_damaged_sweep_json(sweep, dry_run, name, changes, needle):
    config = json.loads((sweep / "sweep.json").read_text())
    config.update(changes)
    config = {k: v for k, v in config.items() if v is not None}
    (sweep / "sweep.json").write_text(json.dumps(config))
    (sweep / "trials" / _ids(sweep)[1] / "status.json").unlink()  # something to resume
    ran = run("sweep", "--resume", str(sweep), "--backend", "local", *(["--dry-run"] * dry_run))
    check(ran, 2, f"error: {sweep / 'sweep.json'}", needle)
    assert len(list((sweep / "submissions").iterdir())) == 1  # nothing submitted


# Odd but readable values are shown as they are.
STATUS = ["status", ROOT, "--all"]
ODD = [
    ("host-int", '{"state": "COMPLETED", "attempts": [{"host": 5}]}', STATUS, 0, " 5 "),
    ("cause-int", '{"state": "FAILED", "cause": 7, "attempts": [{}]}', STATUS, 1, "FAILED"),
    ("exit-code-word", '{"state": "FAILED", "exit_code": "x", "attempts": []}', STATUS, 1,
     "FAILED"),
    ("state-unknown", '{"state": "WEIRD", "attempts": []}', STATUS, 0, "WEIRD"),
    ("slurm-attempt-half", '{"state": "FAILED", "attempts": [{"array_job_id": "9"}]}',
     ["logs", ROOT, "1", "--slurm"], 2, "has not run on Slurm yet"),
]  # fmt: skip


@pytest.mark.parametrize("name,status,argv,code,needle", cases(ODD))
def test_odd_status_values(sweep, name, status, argv, code, needle):
    (sweep / "trials" / _ids(sweep)[1] / "status.json").write_text(status)
    check(run(*(_fill(a, **{ROOT: str(sweep)}) for a in argv)), code, needle)


def test_logs_of_a_sweep_without_trials(sweep):
    (sweep / "trials.jsonl").write_text("")
    check(run("logs", str(sweep), "0"), 2, "no trial matches '0'", "trials.jsonl lists no trials")


@pytest.mark.parametrize(
    "argv",
    [
        ["cancel", ROOT],
        ["cancel", ROOT, "--json"],
        ["sweep", "--resume", ROOT, "--backend", "local"],
    ],
    ids=["cancel", "cancel-json", "resume"],
)
def test_a_held_lock_is_named(sweep, argv):
    held = Lock(str(sweep))
    held.acquire("resume")
    try:
        ran = run(*(_fill(a, **{ROOT: str(sweep)}) for a in argv))
    finally:
        held.release()
    check(ran, 1, f"is locked by resume by pid {os.getpid()}", f"slurmkit unlock {sweep}")


def test_a_garbled_lock_file_is_still_a_lock(sweep):
    (sweep / ".slurmkit.lock").write_text("garbage")
    check(run("cancel", str(sweep)), 1, ".slurmkit.lock is locked by", "slurmkit unlock")
    check(run("unlock", str(sweep)), 0, "unlocked: its lock file was damaged")
    check(run("cancel", str(sweep)), 0, "cancelled: nothing to cancel")
