"""Job specs: launch plans (golden), pyxis options checked against pyxis's option set,
profiles and the user config's precedence, image pre-staging."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from conftest import assert_shell_ok, run_cli
from spec_examples import JOB

from slurmkit import launch, pyxis, render
from slurmkit import spec as spec_mod
from slurmkit.core import rendezvous
from slurmkit.errors import SpecError, UserError
from slurmkit.images import import_image, staged_name


def test_torchrun_container_job_golden(spec_file, monkeypatch, tmp_path):
    monkeypatch.setenv("SLURMKIT_CONFIG", str(tmp_path / "none.yaml"))
    s = spec_mod.load(str(spec_file(JOB)), job=True)
    plan = launch.build(s, "/mnt/home/me/proj")
    step = plan["step"]
    assert step[:5] == [
        "srun",
        "--kill-on-bad-exit=1",
        "--nodes=16",
        "--ntasks=16",
        "--ntasks-per-node=1",
    ]
    container = [o for o in step if o.startswith(("--container", "--no-container"))]
    for opt in container:
        pyxis.validate_option(opt)  # every option exists in pyxis, with valid syntax
    assert "--container-image=nvcr.io#nvidia/pytorch:24.01-py3" in container
    assert "--container-workdir=/mnt/home/me/proj" in container
    assert "--no-container-mount-home" in container  # the sunk profile
    env = next(o for o in container if o.startswith("--container-env="))
    assert {"MASTER_ADDR", "MASTER_PORT", "WANDB_API_KEY", "NCCL_SOCKET_IFNAME"} <= set(
        env.split("=", 1)[1].split(",")
    )
    assert step[-4:] == launch.self_check()
    # torchrun passes the requeue signal on to its workers and waits `lead` s for them
    assert plan["launcher"][:6] == [
        "env",
        "PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR2",
        f"PET_SHUTDOWN_TIMEOUT={s.requeue.lead}",
        "torchrun",
        "--no-python",
        "--nnodes={nnodes}",
    ]
    assert "--nproc-per-node=8" in plan["launcher"]
    filled = rendezvous.fill(
        plan,
        {
            "MASTER_ADDR": "gpu-001",
            "MASTER_PORT": "12345",
            "SLURM_NNODES": "16",
            "SLURM_JOB_ID": "77",
        },
    )
    assert "--rdzv-endpoint=gpu-001:12345" in filled and "--nnodes=16" in filled
    assert s.env["NCCL_IB_HCA"] == "ibp"
    assert render.resource_options(s.resources)[:4] == [  # no --cpus-per-task: not asked for
        "--partition=h100",
        "--time=2-00:00:00",
        "--nodes=16",
        "--gpus-per-node=8",
    ]


def test_srun_launcher_one_task_per_gpu_and_no_self_check(spec_file):
    s = spec_mod.load(
        str(spec_file(JOB.replace("launcher: torchrun", "launcher: srun"))),
        ["self_check=false"],
        job=True,
    )
    step = launch.build(s, "/w")["step"]
    assert "--ntasks-per-node=8" in step and "--ntasks=128" in step
    assert launch.self_check()[2] not in step


def test_plain_single_task_needs_no_step(spec_file):
    s = spec_mod.load(str(spec_file("command: x\nparams: {a: [1]}\n")))
    assert launch.build(s, "/w") == {"step": [], "launcher": []}


def test_rendezvous_from_slurm_env():
    env = rendezvous.rendezvous({"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "gpu-[007-009]"})
    assert env["MASTER_ADDR"] == "gpu-007" and int(env["MASTER_PORT"]) == 10000 + 4242
    assert rendezvous.rendezvous({"MASTER_ADDR": "x", "MASTER_PORT": "1"}) == {
        "MASTER_ADDR": "x",
        "MASTER_PORT": "1",
    }


@pytest.mark.parametrize(
    "patch,key",
    [
        ("  mounts: [/mnt/da:ta:/data]", "container.mounts[0]"),
        ("  mounts: [relative:/data]", "container.mounts[0]"),
        ("  image: ''", "container.image"),
    ],
)
def test_bad_container_blocks(spec_file, patch, key):
    body = (
        JOB.replace("  mounts: [/mnt/data:/data:ro, /mnt/home]", patch)
        if "mounts" in patch
        else JOB.replace("  image: nvcr.io/nvidia/pytorch:24.01-py3", patch)
    )
    with pytest.raises(SpecError) as info:
        spec_mod.load(str(spec_file(body)), job=True)
    assert info.value.key == key


def test_precedence_profile_user_config_file_cli(spec_file, tmp_path, monkeypatch):
    cfg = tmp_path / "config.yaml"
    cfg.write_text(
        "resources: {partition: gpu, account: ml, time: '1:00:00'}\n"
        "output_root: /shared/runs\nprofile: sunk\nenv: {NCCL_IB_HCA: mlx5}\n"
        "container: {mounts: [/mnt/data]}\n"
    )
    monkeypatch.setenv("SLURMKIT_CONFIG", str(cfg))
    path = str(spec_file("command: x\nparams: {a: [1]}\nresources: {account: team}\n"))
    s = spec_mod.load(path, ["resources.time=2:00:00"])
    assert (s.resources.partition, s.resources.account, s.resources.time) == (
        "gpu",
        "team",
        "2:00:00",
    )
    assert s.output_root == "/shared/runs"
    assert s.env["NCCL_IB_HCA"] == "mlx5" and s.env["UCX_TLS"] == "tcp"  # user > profile
    assert s.container is None  # container defaults apply only to specs naming an image
    boxed = spec_mod.load(path, ["container.image=/images/pt.sqsh"])
    assert boxed.container.mounts == ["/mnt/data"] and boxed.container.mount_home is False
    assert spec_mod.load(path, ["profile=none"]).env == {"NCCL_IB_HCA": "mlx5"}


def test_bad_user_config_names_its_file(spec_file, tmp_path, monkeypatch):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("partition: gpu\n")
    monkeypatch.setenv("SLURMKIT_CONFIG", str(cfg))
    with pytest.raises(SpecError) as info:
        spec_mod.load(str(spec_file("command: x\nparams: {a: [1]}\n")))
    assert info.value.file == str(cfg) and info.value.key == "partition"


def test_job_needs_no_params_and_renders(tmp_path, spec_file):
    path = spec_file(
        "name: one\ncommand: [python, train.py]\nresources: {nodes: 2, tasks_per_node: 2}\n"
    )
    proc = run_cli("render", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --nodes=2" in proc.stdout and "#SBATCH --ntasks-per-node=2" in proc.stdout
    assert_shell_ok(proc.stdout)
    proc = run_cli("submit", str(path), "--dry-run", f"output_root={tmp_path / 'runs'}")
    assert proc.returncode == 0 and not (tmp_path / "runs").exists()


def _fake_enroot(bin_dir: Path, fail: bool = False) -> None:
    script = bin_dir / "enroot"
    body = (
        'echo "[ERROR] URL https://nvcr.io returned error code: 401 Unauthorized" >&2; exit 1'
        if fail
        else 'echo squashfs > "$3"'
    )
    script.write_text(
        f"#!/bin/sh\n# stand-in for enroot (not installed here): import -o OUT URI\n{body}\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_image_import_is_atomic_and_idempotent(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_enroot(bin_dir)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    first = import_image("nvcr.io/nvidia/pytorch:24.01-py3", str(tmp_path / "images"))
    assert first.created and Path(first.path).name == staged_name(
        "nvcr.io#nvidia/pytorch:24.01-py3"
    )
    again = import_image("nvcr.io/nvidia/pytorch:24.01-py3", str(tmp_path / "images"))
    assert not again.created and again.path == first.path
    assert os.listdir(tmp_path / "images") == [Path(first.path).name]


def test_image_import_errors(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    proc_env = {"PATH": f"{bin_dir}:{os.path.dirname(os.sys.executable)}"}
    proc = run_cli(
        "image",
        "import",
        "nvcr.io/nvidia/pytorch:24.01-py3",
        "--to",
        str(tmp_path / "images"),
        env=proc_env,
    )
    assert proc.returncode == 2 and "enroot is not installed" in proc.stderr
    _fake_enroot(bin_dir, fail=True)
    with pytest.raises(UserError, match="401 Unauthorized"):
        import_image("nvcr.io/nvidia/pytorch:24.01-py3", str(tmp_path / "images"))
    assert os.listdir(tmp_path / "images") == []  # nothing half-written left behind


def test_only_the_resources_asked_for_are_rendered(spec_file):
    """srun >= 23.11 steps inherit --cpus-per-task: a torchrun agent and its workers would be
    pinned to one CPU by a default nobody asked for. Memory takes Slurm's unit forms."""
    s = spec_mod.load(
        str(spec_file("command: x\nresources: {nodes: 2, exclusive: true}\n")), job=True
    )
    opts = render.resource_options(s.resources)
    assert opts == ["--nodes=2", "--exclusive"] and s.resources.cpus is None
    for mem in ("128GB", "128G", "128gb", "512M", "16384", "1T", "0"):
        body = f"command: x\nresources: {{mem: '{mem}', cpus_per_task: 4}}\n"
        opts = render.resource_options(spec_mod.load(str(spec_file(body)), job=True).resources)
        assert f"--mem={mem}" in opts and "--cpus-per-task=4" in opts
    with pytest.raises(SpecError, match="not a memory size"):
        spec_mod.load(str(spec_file("command: x\nresources: {mem: 12 GB}\n")), job=True)


@pytest.mark.parametrize("profile", ["sunk", "sunk-gb200"])
def test_each_profile_renders_with_its_sources(spec_file, profile):
    """Every profile value names the script it comes from, and reaches the job's environment
    and --container-env (the container sees the host's value, not the image's)."""
    from slurmkit.core.profiles import PROFILES, SOURCES

    assert all(src for _, src in SOURCES[profile].values())
    assert PROFILES[profile]["NCCL_NET_PLUGIN"] == "none"
    if profile == "sunk-gb200":
        assert PROFILES[profile]["NCCL_NET_GDR_C2C"] == "1"
        assert PROFILES[profile]["NCCL_SHM_DISABLE"] == "0"
    body = f"command: x\nprofile: {profile}\ncontainer: {{image: ubuntu, workdir: /w}}\n"
    s = spec_mod.load(str(spec_file(body)), job=True)
    assert {k: s.env[k] for k in PROFILES[profile]} == PROFILES[profile]
    step = launch.build(s, "/w")["step"]
    env = next(o for o in step if o.startswith("--container-env=")).split("=", 1)[1].split(",")
    assert set(PROFILES[profile]) <= set(env)


# The job shapes of the public scripts the SUNK issue ported, written from their option names.
NCCL_TESTS = """
name: nccl
command: [/opt/nccl_tests/build/all_reduce_perf, -b, 8, -e, 8G, -f, 2, -g, 1]
mpi: pmix
srun: {label: true, cpu_bind: cores, gpu_bind: closest, exact: true}
resources: {nodes: 2, tasks_per_node: 8, gpus_per_node: 8, exclusive: true, mem: 0}
container: {image: ghcr.io/coreweave/nccl-tests:latest, workdir: /w}
self_check: false
"""


def test_nccl_tests_shape_renders_mpi_bind_and_label(spec_file):
    s = spec_mod.load(str(spec_file(NCCL_TESTS)), job=True)
    step = launch.build(s, "/w")["step"]
    assert step[:5] == [
        "srun",
        "--kill-on-bad-exit=1",
        "--nodes=2",
        "--ntasks=16",
        "--ntasks-per-node=8",
    ]
    assert step[5:10] == [
        "--mpi=pmix",
        "--label",
        "--cpu-bind=cores",
        "--gpu-bind=closest",
        "--exact",
    ]
    opts = render.resource_options(s.resources)
    assert opts == [
        "--nodes=2",
        "--gpus-per-node=8",
        "--mem=0",
        "--ntasks-per-node=8",
        "--exclusive",
    ]  # exactly what was asked for
    again = spec_mod.from_dict(s.to_dict(), "sweep.json")
    assert (
        again.srun
        == s.srun
        == {"mpi": "pmix", "label": True, "cpu_bind": "cores", "gpu_bind": "closest", "exact": True}
    )


def test_launcher_none_forces_the_srun_step_and_srun_launcher_derives_tasks(spec_file):
    one = spec_mod.load(str(spec_file("command: x\nlauncher: none\nmpi: pmi2\n")), job=True)
    assert launch.build(one, "/w")["step"] == [
        "srun",
        "--kill-on-bad-exit=1",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        "--mpi=pmi2",
    ]
    gpus = spec_mod.load(
        str(spec_file("command: x\nlauncher: srun\nresources: {gpus: 4}\n")), job=True
    )
    assert "--ntasks-per-node=4" in render.resource_options(gpus.resources)  # the allocation
    assert "--ntasks-per-node=4" in launch.build(gpus, "/w")["step"]  # holds the step's tasks


@pytest.mark.parametrize(
    "body, key",
    [
        ("srun: {mpi: 'pm ix'}\n", "srun.mpi"),
        ("srun: {bogus: 1}\n", "srun.bogus"),
        ("srun: {label: 'yes'}\n", "srun.label"),
        ("mpi: true\n", "mpi"),
        ("srun: [mpi]\n", "srun"),
        ("mpi: pmix\nsrun: {mpi: pmi2}\n", "mpi"),
    ],
)
def test_bad_srun_options_name_the_key(spec_file, body, key):
    with pytest.raises(SpecError) as info:
        spec_mod.load(str(spec_file("command: x\n" + body)), job=True)
    assert info.value.key == key


@pytest.mark.parametrize(
    ("body", "key", "words"),
    [
        ("torchrun: {nproc_per_node: 8}\n", "torchrun", "only for launcher: torchrun"),
        (
            "launcher: torchrun\ntorchrun: {nproc_per_node: 0}\n",
            "torchrun.nproc_per_node",
            "at least 1",
        ),
        ("launcher: torchrun\ntorchrun: {nnodes: 2}\n", "torchrun.nnodes", "nproc_per_node"),
        ("launcher: torchrun\ntorchrun: 8\n", "torchrun", "must be a mapping"),
    ],
)
def test_bad_torchrun_options_name_the_key(spec_file, body, key, words):
    from slurmkit.errors import SpecError

    with pytest.raises(SpecError) as info:
        spec_mod.load(str(spec_file("command: x\n" + body)), job=True)
    assert info.value.key == key and words in str(info.value)


def test_torchrun_workers_without_asking_slurm_for_gpus(spec_file):
    """`torchrun: {nproc_per_node: 8}` on an exclusive node: 8 workers, no GPUs asked of Slurm,
    one srun task per node (the agent)."""
    from slurmkit.launch import build

    s = spec_mod.load(
        str(
            spec_file(
                "command: x\nlauncher: torchrun\ntorchrun: {nproc_per_node: 8}\n"
                "resources: {nodes: 2, exclusive: true}\n"
            )
        ),
        job=True,
    )
    plan = build(s, "/submit")
    assert "--nproc-per-node=8" in plan["launcher"] and "--ntasks-per-node=1" in plan["step"]
    assert not any("gpus" in a for a in plan["step"])
