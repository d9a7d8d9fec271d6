"""What a new user trips over (issue 23): each fixed, each held here."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from conftest import run_cli

from slurmkit import spec as spec_mod
from slurmkit import steer, store
from slurmkit.errors import UserError
from slurmkit.plan import expand, make


def _sweep(tmp_path: Path, count: int) -> Path:
    """A sweep directory of ``count`` trials, written as a submit writes it (nothing runs)."""
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(f"command: x\nparams: {{a: 'range(0,{count})'}}\n")
    s = spec_mod.load(str(spec_path))
    return Path(store.create(make(s, expand(s), str(tmp_path)), str(tmp_path / "runs" / "s")).root)


def _modes(root: Path) -> dict[str, int]:
    found = {str(root): stat.S_IMODE(root.stat().st_mode)}
    for base, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(base, name)
            found[path] = stat.S_IMODE(os.lstat(path).st_mode)
    return found


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_a_sweep_directory_follows_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        root = _sweep(tmp_path, 2)
        store.record_submission(store.open_sweep(str(root)), {"backend": "local"})
    finally:
        os.umask(old)
    modes = _modes(root)
    assert len(modes) > 6
    for path, mode in modes.items():
        want = (0o777 if os.path.isdir(path) else 0o666) & ~umask
        assert mode == want, f"{path}: {oct(mode)}, want {oct(want)} under umask {oct(umask)}"


def _ids(root: Path) -> list[str]:
    return [json.loads(line)["id"] for line in (root / "trials.jsonl").read_text().splitlines()]


def test_digits_past_the_last_index_are_never_silently_an_id_prefix(tmp_path):
    root = _sweep(tmp_path, 40)
    ids = _ids(root)
    assert steer.find_trial(str(root), "7")["id"] == ids[7]
    # a digit that begins some id, past the last index (40..99 as two digits, or 1-9 with ids)
    taken = {i[:2] for i in ids if i[:2].isdigit() and int(i[:2]) >= 40}
    assert taken, "40 random ids: some begin with two digits >= 40"
    ref = sorted(taken)[0]
    with pytest.raises(UserError) as info:
        steer.find_trial(str(root), ref)
    text = str(info.value)
    assert f"no trial {ref}" in text and "0..39" in text and "starts with" in text
    whole = next(i for i in ids if i.startswith(ref))
    assert steer.find_trial(str(root), whole)["id"] == whole  # the whole id always works
    letter = next(i for i in ids if not i[:1].isdigit())
    assert steer.find_trial(str(root), letter[:3])["id"] == letter  # an id prefix with a letter


def test_logs_of_an_index_past_the_end_names_both_readings(tmp_path):
    root = _sweep(tmp_path, 40)
    ref = sorted({i[:2] for i in _ids(root) if i[:2].isdigit() and int(i[:2]) >= 40})[0]
    ran = run_cli("logs", str(root), ref)
    assert ran.returncode == 2, ran.stderr
    assert f"no trial {ref}" in ran.stderr and "Traceback" not in ran.stderr


def test_image_import_to_a_file_is_a_clear_error(tmp_path):
    plain = tmp_path / "plain.txt"
    plain.write_text("x\n")
    ran = run_cli("image", "import", "nvcr.io/x:1", "--to", str(plain))
    assert ran.returncode == 2, ran.stderr
    assert f"{plain} exists and is not a directory" in ran.stderr
    assert "Traceback" not in ran.stderr and plain.read_text() == "x\n"


def test_the_submit_message_shows_the_scripts_own_array_option(tmp_path):
    from slurmkit.backends.slurm import described
    from slurmkit.render import scripts

    spec_path = tmp_path / "s.yaml"
    spec_path.write_text("command: x\nparams: {a: 'range(0,12)'}\nmax_parallel: 4\n")
    s = spec_mod.load(str(spec_path))
    plan = make(s, expand(s), str(tmp_path))
    rendered = scripts(plan, list(range(12)), 5, "/r")
    jobs = [{"job_id": str(412 + n), "array": c.array_spec()} for n, (c, _) in enumerate(rendered)]
    said = described(jobs, s.max_parallel)
    for job, (_, text) in zip(jobs, rendered):
        option = next(ln for ln in text.splitlines() if ln.startswith("#SBATCH --array="))
        assert f"{job['job_id']} ({option.removeprefix('#SBATCH ')})" in said
    assert said.startswith("as job array 412 (--array=0-4%4)")


@pytest.mark.parametrize("array", ["0-99999999999999", "0-3,5-4000000000:1", "0-1%2"])
def test_a_submission_record_naming_huge_arrays_is_damaged_not_a_memory_error(tmp_path, array):
    root = _sweep(tmp_path, 3)
    sweep = store.open_sweep(str(root))
    store.record_submission(
        sweep, {"backend": "slurm", "jobs": [{"job_id": "7", "offset": 2, "array": array}]}
    )
    warnings: list[str] = []
    assert store.submissions(sweep, warnings) == []
    assert "past the 3 trials" in warnings[0]
    for argv in (
        ["status", str(root)],
        ["results", str(root)],
        ["cancel", str(root), "--dry-run"],
        ["sweep", "--resume", str(root), "--backend", "local", "--dry-run"],
    ):
        ran = run_cli(*argv)
        assert "MemoryError" not in ran.stderr and "Traceback" not in ran.stderr, (argv, ran)
        assert "past the 3 trials" in ran.stderr, (argv, ran.stderr)


def test_a_submission_record_within_the_trials_is_kept(tmp_path):
    root = _sweep(tmp_path, 3)
    sweep = store.open_sweep(str(root))
    store.record_submission(sweep, {"backend": "local", "indices": "0-2"})
    store.record_submission(
        sweep, {"backend": "slurm", "jobs": [{"job_id": "7", "offset": 1, "array": "0-1%1"}]}
    )
    warnings: list[str] = []
    assert len(store.submissions(sweep, warnings)) == 2 and warnings == []


def test_the_fallback_to_this_machine_says_what_to_check(tmp_path):
    """sbatch on PATH, no controller answering (as a login node whose slurm.conf is not found):
    the sweep runs here, and says where to look. Slurm's commands are stand-ins: a real cluster
    that answers cannot also not answer."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sbatch", "squeue", "sacct"):
        (bin_dir / tool).write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "scontrol").write_text(
        "#!/bin/sh\necho 'scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error' >&2\n"
        "exit 1\n"
    )
    for tool in bin_dir.iterdir():
        tool.chmod(0o755)
    spec = tmp_path / "s.yaml"
    spec.write_text(f"command: ['true']\nargs: none\nparams: {{a: [1]}}\noutput_root: {tmp_path}\n")
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_CONF": ""}
    ran = run_cli("sweep", str(spec), "--wait", env=env)
    assert ran.returncode == 0, ran.stderr
    said = " ".join(ran.stderr.split())
    assert "no Slurm controller answered" in said and "running the sweep on this machine" in said
    assert "hint: check which cluster this machine asks (SLURM_CONF is unset" in said
    assert "slurmkit doctor" in said and "--backend slurm fails instead" in said


@pytest.mark.parametrize(
    ("ephemeral", "span"),
    [
        ((32768, 60999), (10000, 22768)),  # Linux's default: 10000-32767
        ((49152, 65535), (10000, 39152)),  # IANA's dynamic range
        ((15000, 61000), (10000, 5000)),  # more room below than above (61001-65535)
        ((12000, 40000), (40001, 25535)),  # more room above
        ((1024, 65535), (10000, 50000)),  # no room: the old formula
    ],
)
def test_master_port_stays_out_of_the_ephemeral_range(ephemeral, span):
    from slurmkit.core.rendezvous import job_port, port_span

    assert port_span(ephemeral) == span
    first, count = span
    lo, hi = ephemeral
    ports = {job_port(str(job), ephemeral) for job in range(0, 2_000_000, 997)}
    assert min(ports) >= first and max(ports) < first + count <= 65536
    if count != 50000:
        assert not any(lo <= p <= hi for p in ports)
    assert job_port("7", ephemeral) == first + 7


def test_the_ephemeral_range_is_read_from_the_node(tmp_path):
    from slurmkit.core.rendezvous import LINUX_EPHEMERAL, local_port_range

    ranged = tmp_path / "range"
    ranged.write_text("49152\t65535\n")
    assert local_port_range(str(ranged)) == (49152, 65535)
    for bad in ("", "x y", "70000 80000", "9"):
        ranged.write_text(bad)
        assert local_port_range(str(ranged)) == LINUX_EPHEMERAL
    assert local_port_range(str(tmp_path / "missing")) == LINUX_EPHEMERAL


def test_metrics_are_the_same_whichever_way_the_status_is_reached(tmp_path):
    from conftest import PAYLOAD, local_sweep

    import slurmkit

    proc, result = local_sweep(tmp_path, f"command: [python, {PAYLOAD}]\nparams: {{x: [1, 2]}}\n")
    assert proc.returncode == 0 and result is not None, proc.stderr
    root = result["sweep_dir"]
    sw = slurmkit.Sweep.open(root)
    ways = {
        "slurmkit.status": slurmkit.status(root),
        "Sweep.status": sw.status(),
        "Sweep.wait": sw.wait(progress=False, interval=1),
        "Sweep.wait(progress)": sw.wait(progress=True, interval=1),
    }
    seen = {way: [t.metrics for t in got.trials] for way, got in ways.items()}
    assert all(m and "score" in m for m in seen["Sweep.status"]), seen
    assert all(metrics == seen["Sweep.status"] for metrics in seen.values()), seen
    cheap = slurmkit.status(root, with_metrics=False)
    assert [t.metrics for t in cheap.trials] == [{}, {}]  # the opt-out


def _table_rows() -> dict[int, str]:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    table = readme.split("<!-- exit-codes -->")[1].split("<!-- /exit-codes -->")[0]
    rows = [ln.split("|")[1:-1] for ln in table.strip().splitlines()[2:]]
    return {
        int(code): " ".join(f"{meaning} {examples}".split()) for code, meaning, examples in rows
    }


def _stand_ins(tmp_path: Path, scontrol: str, sbatch: str = "exit 1") -> dict[str, str]:
    """Slurm's commands as stand-ins (only for what a real cluster cannot do on demand)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for tool, body in {"scontrol": scontrol, "sbatch": sbatch, "squeue": "exit 0"}.items():
        (bin_dir / tool).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / tool).chmod(0o755)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_CONF": ""}


def _spec(tmp_path: Path, command: str, extra: str = "") -> str:
    path = tmp_path / "s.yaml"
    path.write_text(f"command: {command}\nargs: none\nparams: {{a: [1, 2]}}\n{extra}")
    return str(path)


def _done(tmp_path: Path, command: str) -> tuple[int, str]:
    """A local sweep run to its end: its exit code and its directory."""
    runs = tmp_path / "runs"
    ran = run_cli("sweep", _spec(tmp_path, command, f"output_root: {runs}\n"), "--backend", "local")
    return ran.returncode, str(next(runs.iterdir()))


def _cancelled(tmp_path: Path) -> str:
    import subprocess
    import sys
    import time

    runs = tmp_path / "runs"
    spec = _spec(tmp_path, "[sleep, '60']", f"output_root: {runs}\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmkit.cli", "sweep", spec, "--backend", "local"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while not list(runs.glob("*/trials/*/status.json")) and time.monotonic() < deadline:
        time.sleep(0.1)
    root = str(next(runs.iterdir()))
    assert run_cli("cancel", root).returncode == 0
    proc.wait(timeout=60)
    return root


ROWS = [
    (0, "sweep --wait whose trials all COMPLETED"),
    (0, "status of a sweep with no trial ended unsuccessfully"),
    (1, "status or sweep --wait with a trial FAILED"),
    (1, "status after your own cancel"),
    (1, "--backend slurm with no controller answering"),
    pytest.param(1, "Slurm refusing a job for what the cluster lacks", marks=pytest.mark.cluster),
    (2, "a bad spec key"),
    pytest.param(2, "a partition Slurm refuses", marks=pytest.mark.cluster),
    (2, "a path that is not a sweep directory"),
]


@pytest.mark.slow
@pytest.mark.parametrize(("code", "row"), ROWS)
def test_every_row_of_the_exit_code_table(request, tmp_path, code, row):
    assert row.replace("`", "") in _table_rows()[code].replace("`", "")
    codes: list[int] = []
    if row.startswith("sweep --wait"):
        codes.append(_done(tmp_path, "['true']")[0])
    elif row.startswith("status of a sweep"):
        codes.append(run_cli("status", _done(tmp_path, "['true']")[1]).returncode)
    elif "FAILED" in row:
        failed, root = _done(tmp_path, "['false']")
        codes += [failed, run_cli("status", root).returncode]
    elif "cancel" in row:
        root = _cancelled(tmp_path)
        status = run_cli("status", root, "--json")
        assert {t["state"] for t in json.loads(status.stdout)["trials"]} <= {
            "CANCELLED",
            "TERMINATED",
        }, status.stdout
        codes.append(status.returncode)
    elif "no controller" in row:
        env = _stand_ins(tmp_path, "echo 'scontrol: error: resolve_ctls_from_dns_srv' >&2; exit 1")
        spec = _spec(tmp_path, "['true']", f"output_root: {tmp_path}/runs\n")
        codes.append(run_cli("sweep", spec, "--backend", "slurm", env=env).returncode)
    elif "lacks" in row or "partition" in row:
        request.getfixturevalue("slurm_cluster")
        key = "resources.mem=100G" if "lacks" in row else "resources.partition=nosuch"
        spec = _spec(tmp_path, "['true']", f"output_root: {tmp_path}/runs\n")
        ran = run_cli("sweep", spec, key, "--backend", "slurm")
        assert "Slurm refused the job" in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
        codes.append(ran.returncode)
    elif "spec key" in row:
        codes.append(run_cli("sweep", _spec(tmp_path, "['true']", "nope: 1\n")).returncode)
    else:
        codes.append(run_cli("status", str(tmp_path)).returncode)
    assert codes and set(codes) == {code}, (row, codes)
    assert sorted(_table_rows()) == [0, 1, 2]


@pytest.mark.parametrize(
    ("name", "text", "key"),
    [
        ("s.yaml", 'command: [echo]\nparams: {a: ["\\ud83d"]}\n', "params.a.0"),
        ("s.yaml", 'command: [echo]\nenv: {X: "a\\udc00b"}\n', "env.X"),
        ("s.json", '{"command": ["echo"], "params": {"a": ["ok", "\\ud83d x"]}}', "params.a.1"),
        ("s.yaml", 'command: [echo, "\\ude80\\ud83d"]\n', "command.1"),  # a pair backwards
    ],
)
def test_a_lone_surrogate_in_a_spec_is_a_clear_error(tmp_path, name, text, key):
    path = tmp_path / name
    path.write_text(text)
    ran = run_cli("sweep", str(path), "--list")
    assert ran.returncode == 2, ran.stderr
    assert f"{path}: {key}: a lone UTF-16 surrogate (U+D" in ran.stderr
    assert "Traceback" not in ran.stderr


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("s.json", '{"command": ["echo"], "params": {"a": ["\\ud83d\\ude80"]}}'),
        ("s.yaml", 'command: [echo]\nparams: {a: ["\\ud83d\\ude80"]}\n'),
        ("s.yaml", 'command: [echo]\nparams: {a: ["\\U0001F680"]}\n'),
    ],
)
def test_an_escaped_surrogate_pair_is_its_character_as_json_reads_it(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    assert spec_mod.load(str(path)).params == {"a": "\U0001f680"}


def test_the_plain_bar_draws_where_rich_cannot(monkeypatch):
    import io

    from slurmkit import ui

    monkeypatch.setattr(ui.err, "is_jupyter", True)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)  # no ipywidgets
    assert not ui.live_bars() and isinstance(ui._trial_bar(), ui.PlainBar)
    stream = io.StringIO()
    bar = ui.PlainBar(stream, width=10)
    with bar:
        task = bar.add_task("trials", total=4, extra="")
        bar.update(task, advance=1)
        bar.update(task, advance=1)
        bar.update(task, completed=3, extra="[red]failed 1[/]")
    drawn = stream.getvalue()
    assert drawn.endswith("\n") and drawn.count("\r") == 4  # start, then three changes
    last = drawn.split("\r")[-1]
    assert last.startswith("trials ━━━━━━━    3/4 failed 1 0:00:0"), last


def test_a_path_in_env_is_what_the_trial_sees(tmp_path):
    """``env: {PATH: ...}`` reached the trial as the batch shell's PATH (papercut 23.18): env
    values are exact, PATH too (inside a container, through --container-env, over the image's)."""
    from conftest import local_sweep

    out = tmp_path / "path.txt"
    body = (
        f"command: [/bin/sh, -c, 'echo \"$PATH\" > {out}']\nargs: none\nparams: {{a: [1]}}\n"
        "env: {PATH: '/opt/venv/bin:/usr/bin:/bin'}\n"
    )
    proc, result = local_sweep(tmp_path, body)
    assert proc.returncode == 0 and result is not None, proc.stderr
    assert out.read_text().strip() == "/opt/venv/bin:/usr/bin:/bin"
    plain = tmp_path / "plain.txt"
    body = f"command: [/bin/sh, -c, 'echo \"$PATH\" > {plain}']\nargs: none\nparams: {{a: [2]}}\n"
    local_sweep(tmp_path, body)  # without it: this Python's directory first, then the caller's
    assert plain.read_text().split(":")[0] == os.path.dirname(__import__("sys").executable)


def test_render_exact_shows_the_runtimes_argv_and_variables(tmp_path):
    """``render --exact``: what the runtime hands to srun for trial N (papercut 23.14), from
    the runtime's own ``step``: the srun options with the rendezvous filled in for the example
    job, the launcher, the command with its parameters, and the variables it sets."""
    from slurmkit.core.rendezvous import job_port

    spec = tmp_path / "ddp.yaml"
    spec.write_text(
        "command: [python, train.py]\nparams: {lr: [0.1, 0.01]}\nlauncher: torchrun\n"
        "resources: {nodes: 2, gpus_per_node: 4}\n"
        "container: {image: 'nvcr.io/nvidia/pytorch:24.01-py3', name: train}\n"
        "env: {NCCL_DEBUG: INFO, PATH: '/opt/venv/bin:/usr/bin'}\n"
        "env_runtime: {TMPDIR: '/scratch/{job_id}'}\n"
    )
    ran = run_cli("render", str(spec), "--exact", "--trial", "1", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    got = json.loads(ran.stdout)
    argv, env = got["argv"], got["env"]
    assert argv[0] == "srun" and "--nodes=2" in argv
    assert "--rdzv-endpoint=node-001:" + str(job_port("4242")) in argv
    assert any(a.startswith("--container-name=train-") and "-4242" in a for a in argv)
    assert argv[-3:] == ["python", "train.py", "lr=0.01"]
    assert env["MASTER_ADDR"] == "node-001" and env["MASTER_PORT"] == str(job_port("4242"))
    assert env["NCCL_DEBUG"] == "INFO" and env["PATH"] == "/opt/venv/bin:/usr/bin"
    assert env["TMPDIR"] == "/scratch/4242" and env["SLURMKIT_TRIAL_INDEX"] == "1"
    people = run_cli("render", str(spec), "--exact", cwd=tmp_path)
    assert people.returncode == 0 and people.stdout.startswith("# trial 0, as job 4242")
    assert "\nNCCL_DEBUG=INFO\n" in people.stdout and "lr=0.1" in people.stdout
    for bad in (["--trial", "2"], ["--plain"], ["--submitit"]):
        refused = run_cli("render", str(spec), "--exact", *bad, cwd=tmp_path)
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert run_cli("render", str(spec), "--json", cwd=tmp_path).returncode == 2


@pytest.mark.parametrize(
    ("enabled", "options", "trap"),
    [
        ("true", ["--requeue", "--signal=B:USR2@120"], True),
        ("false", ["--no-requeue"], False),
        ("cluster", [], False),  # neither: the cluster's JobRequeue decides (papercut 23.13)
    ],
)
def test_requeue_has_three_states(tmp_path, enabled, options, trap):
    from conftest import assert_shell_ok

    from slurmkit.core.jobcontract import JobContract
    from slurmkit.render import scripts
    from slurmkit.store import sweep_config

    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(f"command: [echo]\nparams: {{a: [1]}}\nrequeue: {{enabled: {enabled}}}\n")
    s = spec_mod.load(str(spec_path))
    plan = make(s, expand(s), str(tmp_path))
    text = scripts(plan, [0], 1001, "/r")[0][1]
    shown = [ln.removeprefix("#SBATCH ") for ln in text.splitlines() if ln.startswith("#SBATCH")]
    asked = [o for o in shown if o.split("=")[0] in ("--requeue", "--no-requeue", "--signal")]
    assert asked == options
    assert ("trap " in text) is trap and ("scontrol requeue" in text) is trap
    assert_shell_ok(text)
    contract = JobContract.from_dict(sweep_config(plan), "sweep.json")
    assert contract.requeue.enabled is (enabled == "true")  # the runtime asks for none itself


def test_a_function_executor_leaves_requeue_to_the_cluster_too(tmp_path):
    pytest.importorskip("submitit")
    from slurmkit.executors import executor_config

    spec = tmp_path / "job.yaml"
    spec.write_text("command: x\nrequeue: {enabled: cluster}\n")
    config = executor_config(str(spec), ["~command"])
    text = json.dumps(config)
    assert "--requeue" not in text and "--no-requeue" not in text and "--signal" not in text


@pytest.mark.cluster
def test_a_job_that_leaves_requeue_to_the_cluster_gets_the_clusters(slurm_cluster, tmp_path):
    """The test cluster has JobRequeue=1: a job rendered with ``enabled: cluster`` is requeueable
    (Requeue=1), one with ``enabled: false`` is not (Requeue=0)."""
    import subprocess

    seen = {}
    for enabled in ("cluster", "false"):
        spec = tmp_path / f"{enabled}.yaml"
        spec.write_text(
            f"name: rq-{enabled}\ncommand: [sleep, '30']\nargs: none\nparams: {{a: [1]}}\n"
            f"requeue: {{enabled: {enabled}}}\noutput_root: {tmp_path}/runs\n"
        )
        ran = run_cli("sweep", str(spec), "--backend", "slurm", "--json")
        assert ran.returncode == 0, ran.stderr
        job = json.loads(ran.stdout)["jobs"][0]["job_id"]
        shown = subprocess.run(
            ["scontrol", "show", "job", f"{job}_0"], capture_output=True, text=True
        ).stdout
        subprocess.run(["scancel", job], check=False)
        seen[enabled] = next(w for w in shown.split() if w.startswith("Requeue="))
    assert seen == {"cluster": "Requeue=1", "false": "Requeue=0"}


def test_env_default_gives_a_value_only_where_nothing_else_does(tmp_path):
    """``env_default`` (papercut 23.11): outside a container the job's environment wins over it;
    in one the image's does (the name is not forced through --container-env, as ``env`` is)."""

    out = tmp_path / "env.txt"
    body = (
        f"command: [/bin/sh, -c, 'echo \"$A $B $C\" > {out}']\nargs: none\nparams: {{a: [1]}}\n"
        "env: {C: forced}\nenv_default: {A: fallback, B: fallback}\n"
    )
    spec = tmp_path / "s.yaml"
    spec.write_text(body)
    ran = run_cli("sweep", str(spec), "--backend", "local", env={"B": "mine", "C": "mine"})
    assert ran.returncode == 0, ran.stderr
    assert out.read_text().split() == ["fallback", "mine", "forced"]
    container = tmp_path / "c.yaml"
    container.write_text(
        "command: [x]\nparams: {a: [1]}\ncontainer: {image: ubuntu}\n"
        "env: {NCCL_DEBUG: INFO}\nenv_default: {LD_PRELOAD: /opt/lib.so}\n"
    )
    exact = run_cli("render", str(container), "--exact", "--json", cwd=tmp_path)
    assert exact.returncode == 0, exact.stderr
    got = json.loads(exact.stdout)
    (keep,) = [a for a in got["argv"] if a.startswith("--container-env=")]
    assert "NCCL_DEBUG" in keep and "LD_PRELOAD" not in keep
    assert got["env"]["LD_PRELOAD"] == "/opt/lib.so"  # set on the host: the image's wins


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        ("env: {A: x}\nenv_default: {A: y}\n", "env_default.A", "A is set in env as well"),
        ("env_default: {A: y}\nenv_runtime: {A: '{job_id}'}\n", "env_runtime.A", "env_default"),
        ("env_default: {A: 1.50}\n", "env_default.A", "is a float"),
        ("env_default: {1A: y}\n", "env_default", "1A"),
        ("env_default: [A]\n", "env_default", "must be a mapping"),
    ],
)
def test_bad_env_default_names_the_key(spec_file, body, key, words):
    from slurmkit.errors import SpecError

    with pytest.raises(SpecError) as info:
        spec_mod.load(str(spec_file(f"command: x\nparams: {{a: [1]}}\n{body}")))
    assert info.value.key.startswith(key) and words in str(info.value), str(info.value)


def test_make_test_tells_the_tests_the_full_suite_runs():
    """The shellcheck test ran only under CI=true, and skipped under a developer's `make test`
    (its other sign, SLURM_CONF, is unset in the process without the cluster): make test says
    so itself now (papercut 23.9)."""
    import re

    makefile = (Path(__file__).resolve().parent.parent / "Makefile").read_text()
    recipe = re.search(r"^test: lint\n((?:\t.*\n)+)", makefile, re.M)
    assert recipe and "SLURMKIT_FULL_SUITE=1" in recipe[1] and "tests/suite.sh" in recipe[1]


@pytest.mark.slow
def test_the_shellcheck_test_runs_when_make_test_says_so():
    import subprocess
    import sys

    ran = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs",
         f"{Path(__file__).parent / 'test_render.py'}::"
         "test_shellcheck_is_there_when_the_full_suite_runs"],
        env={**os.environ, "SLURMKIT_FULL_SUITE": "1", "CI": "", "SLURM_CONF": ""},
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert "skipped" not in ran.stdout, ran.stdout
