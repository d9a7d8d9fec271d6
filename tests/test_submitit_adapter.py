"""The one submitit adapter: every batch script slurmkit writes (the sbatch path's arrays and
both submitit executors') takes its requeue options and supervised body from one function of
render; submitit's private names are used in the adapter alone; the submitit backend's task
takes its signals from submitit through signal.signal, without changing submitit."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from slurmkit import executors, plan, render
from slurmkit import spec as spec_mod
from slurmkit.backends import submitit as backend

ADAPTER = ROOT / "slurmkit" / "submitit_adapter.py"
MARK = "echo marked-by-supervised"


def test_every_batch_script_takes_its_requeue_lines_and_body_from_render(spec_file, monkeypatch):
    """render.supervised marked: the sbatch path's array, the function executor's script and
    the submitit backend's all carry its #SBATCH option and its body, and none other."""
    real = render.supervised

    def marked(policy, command, job_ref, teardown=(), quoted=False):
        got = real(policy, command, job_ref, teardown, quoted)
        return render.Supervised([*got.sbatch, "--comment=marked"], [MARK, *got.body])

    monkeypatch.setattr(render, "supervised", marked)
    spec = spec_mod.load(spec_file("command: [x]\nparams: {i: [1, 2]}\n"))
    [(_, on_sbatch)] = render.scripts(plan.make(spec, plan.expand(spec), "/w"), [0, 1], 1001, "/s")
    s = executors.setup(executors.load(None), None, None)
    on_executor = executors.script(s, s.parameters, s.command(), s.folder)
    params = executors.parameters(spec)
    on_backend = backend.script(spec, "/s", params, 2, '"$PY" -m task /s/submitit')
    for text in (on_sbatch, on_executor, on_backend):
        lines = text.splitlines()
        assert "#SBATCH --comment=marked" in lines and MARK in lines
        assert sum(line.startswith("#SBATCH --signal=") for line in lines) == 1
        assert lines.index(MARK) + 1 == lines.index("slurmkit_pid=")  # the body follows it


def _strings(path: Path) -> list[str]:
    """The string constants of ``path``'s code (f-strings' literal parts too), not docstrings."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
    }
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
    ]


def test_the_requeue_options_and_body_are_spelled_once():
    """`--signal=B:SIG@LEAD` and the signal traps are written in render.py alone."""
    for path in sorted((ROOT / "slurmkit").rglob("*.py")):
        spelled = [s for s in _strings(path) if "--signal=B:" in s or s == "B:" or "_forward" in s]
        assert bool(spelled) == (path.name == "render.py"), (path, spelled)


def _submitit_private_names() -> set[str]:
    """Every single-underscore name of the submitit classes and modules slurmkit touches."""
    from submitit.core import core, job_environment, submission, utils
    from submitit.local import local
    from submitit.slurm import slurm

    owners: list[object] = [core, job_environment, submission, utils, local, slurm]
    owners += [core.Executor, core.PicklingExecutor, core.Job, core.InfoWatcher, utils.JobPaths]
    owners += [slurm.SlurmExecutor, slurm.SlurmJob, slurm.SlurmInfoWatcher, local.LocalExecutor]
    owners += [utils.DelayedSubmission, job_environment.JobEnvironment]
    owners += [slurm.SlurmInfoWatcher(), utils.DelayedSubmission(print)]
    names = {n for o in owners for n in [*dir(o), *getattr(o, "__dict__", {})]}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _used(path: Path, names: set[str]) -> set[str]:
    """The names among ``names`` that ``path`` reads as an attribute, imports or defines."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.add(node.name)
        elif isinstance(node, ast.ImportFrom):
            found.update(alias.name for alias in node.names)
    return found & names


def test_submitits_private_names_are_in_the_adapter_alone_and_its_docstring_lists_them():
    private = _submitit_private_names()
    in_adapter = _used(ADAPTER, private)
    assert "_internal_process_submissions" in in_adapter and "_make_sbatch_string" in in_adapter
    doc = ast.get_docstring(ast.parse(ADAPTER.read_text())) or ""
    assert not [n for n in in_adapter if f"{n}``" not in doc], doc
    assert "Tested with submitit 1.5.4" in doc
    for path in sorted((ROOT / "slurmkit").rglob("*.py")):
        if path == ADAPTER:
            continue
        text = path.read_text()
        if "submitit" not in text:
            continue
        own = {  # our own underscore names are ours, whatever submitit calls its own
            node.name
            for node in ast.walk(ast.parse(text))
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name.startswith("_")
        }
        used = _used(path, private) - own
        assert not used, (path, used)


def test_the_adapter_imports_nothing_above_it():
    tree = ast.parse(ADAPTER.read_text())
    modules = {
        node.module or ""
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level > 0
    }
    assert not [m for m in modules if m.split(".")[0] in ("backends", "executors", "cli")], modules
    text = (ROOT / "slurmkit" / "backends" / "submitit.py").read_text()
    assert "executors" not in text


TASK_SIGNALS = """
import json, os, signal, sys
from submitit.core import job_environment
from submitit.core.utils import DelayedSubmission
from slurmkit.runtime import early, submitit_trial

original = job_environment.JobEnvironment._handle_signals
seen = {}

def run_trial(root, index):  # the trial runtime, as a preemption reaches it
    seen["handler"] = signal.getsignal(signal.SIGUSR2).__qualname__
    os.kill(os.getpid(), signal.SIGUSR2)
    seen["kept"] = early.handover()
    seen["SIGCONT"] = signal.getsignal(signal.SIGCONT) == signal.SIG_DFL
    return 0

submitit_trial.run_trial = run_trial
DelayedSubmission(submitit_trial.trial, "/sweep", 3).dump(sys.argv[1] + "/4242_submitted.pkl")
code = submitit_trial.main([sys.argv[1]])
seen["unchanged"] = job_environment.JobEnvironment._handle_signals is original
print(json.dumps([code, seen]))
"""


@pytest.mark.slow
def test_the_trial_task_takes_the_signals_from_submitit_without_changing_it(tmp_path):
    """submitit's process_job installs its handlers, then calls trial(): from there a requeue
    signal is kept for the trial runtime (not submitit's scontrol requeue), and submitit's
    JobEnvironment is as submitit wrote it."""
    env = {
        **os.environ,
        "SUBMITIT_EXECUTOR": "slurm",
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "1",
        "PATH": str(tmp_path),  # no scontrol: submitit's handler could not requeue
    }
    proc = subprocess.run(
        [sys.executable, "-c", TASK_SIGNALS, str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    code, seen = json.loads(proc.stdout.splitlines()[-1])
    assert code == 0 and seen["kept"] == str(int(__import__("signal").SIGUSR2)), seen
    assert "checkpoint_and_try_requeue" not in seen["handler"] and seen["SIGCONT"], seen
    assert seen["unchanged"], seen


# --- one executor class, two tasks (no cluster: sbatch faked) ---------------------------------


@pytest.fixture
def sbatch(monkeypatch):
    """submitit finds srun; sbatch answers job 4242 (or refuses, with ``sbatch.refuse``) and
    keeps each script it was given; submissions follow each other without a pause."""
    import submitit

    class Fake:
        scripts: list[str]
        refuse = False

    fake = Fake()
    fake.scripts = []

    def submission_command(ex, path):
        fake.scripts.append(Path(path).read_text())
        return ["false"] if fake.refuse else ["echo", "Submitted batch job 4242"]

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 2))
    monkeypatch.setattr(submitit.SlurmExecutor, "_make_submission_command", submission_command)
    monkeypatch.setattr(executors.Setup, "throttle_s", 0.0)  # no pause between submissions
    return fake


def _function_executor(tmp_path, spec=None):
    from slurmkit.submitit_adapter import executor_class

    s = executors.setup(executors.load(spec, [f"output_root={tmp_path}"]), None, None)
    return executor_class()(s)


def test_a_job_run_in_the_batch_shell_has_one_task(tmp_path, sbatch):
    ex = _function_executor(tmp_path, {"resources": {"nodes": 2, "tasks_per_node": 2}})
    assert ex.submit(print, 1).num_tasks == 4  # srun: nodes x tasks per node
    ex.update_parameters(use_srun=False)
    assert ex.submit(print, 1).num_tasks == 1
    assert [j.num_tasks for j in ex.map_array(print, [1, 2])] == [1, 1]
    assert "srun" not in sbatch.scripts[-1].split("-- ")[-1]


def test_the_trials_task_submits_every_call_as_one_array(spec_file, tmp_path, sbatch):
    spec = spec_mod.load(spec_file("command: [x]\nparams: {i: [1, 2, 3]}\nmax_parallel: 2\n"))
    ex = backend.executor(spec, str(tmp_path))
    [one] = ex.map_array(print, [0])
    assert one.job_id == "4242_0" and one.num_tasks == 1  # one trial is an array too
    jobs = ex.map_array(print, [0, 1, 2])
    assert [(j.job_id, j.num_tasks) for j in jobs] == [(f"4242_{i}", 1) for i in range(3)]
    text = sbatch.scripts[-1]
    assert "#SBATCH --array=0-2%2" in text and f"#SBATCH --output={tmp_path}/logs/%A_%a.out" in text
    assert '"$PY" -u -m slurmkit.runtime.submitit_trial ' in text and "srun" not in text
    assert text == backend.script(spec, str(tmp_path), ex.parameters, 3, ex.task.command())


@pytest.mark.parametrize("which", ["function", "trials"])
def test_a_refused_submission_leaves_no_pickle_and_no_script(spec_file, tmp_path, sbatch, which):
    from submitit.core.utils import FailedJobError

    if which == "function":
        ex = _function_executor(tmp_path)
    else:
        spec = spec_mod.load(spec_file("command: [x]\nparams: {i: [1]}\n"))
        ex = backend.executor(spec, str(tmp_path))
    sbatch.refuse = True
    for calls in ([1], [1, 2]):
        with pytest.raises(FailedJobError):
            ex.map_array(print, calls)
    assert len(sbatch.scripts) == 2
    assert not [p for p in Path(ex.folder).rglob("*") if p.is_file()]
