"""Issue 11, "Real SUNK jobs port as written": the public sbatch scripts we ported, as job specs
under ``tests/sunk/`` (one YAML per script, named after it), rendered with ``slurmkit render``
and compared with ``tests/sunk/NAME.sbatch.golden``.

Regenerate the goldens after an intended change of the rendered scripts with::

    SLURMKIT_UPDATE_GOLDEN=1 .venv/bin/pytest tests/test_sunk_ports.py

The goldens are normalised (:func:`normalise`): the submit directory (a tmp dir) is
``/submit``, the sweep directory's time stamp is ``STAMP``, the interpreter is ``PYTHON`` and
slurmkit's version is ``VERSION``. The specs were written from the option names of Slurm, pyxis,
torchrun and slurmkit, with the originals read for their facts (which options, which values):

- coreweave/reference-architecture ``training/slurm/torch-allreduce/allreduce.sbatch`` and
  ``allreduce-torchrun.sbatch``: 8d7a23a was current on 2026-12-04; the stored copies hold both
  only at 116a8fd5, and ``allreduce.py`` at 69c2beb3 (one rank per GPU, see below);
- coreweave/nccl-tests ``slurm/nccl-test-distributed-h100-64-enroot.slurm``,
  ``...-gb200-nvl72-enroot.slurm`` and ``...-gb300-roce-nvl72-enroot.slurm``: cb86553 was
  current; read at 1c7afce4 (h100, plus its ``NCCL_NET_PLUGIN=none`` at cb86553) and 3e725c9a
  (gb200, gb300-roce), the newest stored copies;
- aws-samples/awsome-distributed-training ``3.test_cases/pytorch/FSDP/slurm/
  llama3_1_8b-training.sbatch`` and ``3.test_cases/megatron/megatron-lm/slurm/gpt3/
  2.distributed-training.sbatch``: 7217859 was current; read at acb59e42 (the same text as
  04865bcd) and 46f8bf7d, the newest stored copies.

Every port names its profile (``profile: none`` where the script sets its own values): a
profile in the user config applies to every spec that names none.

Lines every port shares, mapped once here:

- ``#SBATCH --output=...`` (and FSDP's ``--error``): Slurm's log goes to the sweep directory's
  ``logs/``, the trial's output to ``trials/ID/output.log``; FSDP's ``%x_%j`` names and its
  separate stderr file are ``logs: {name: '%x_%j', stderr: separate}``.
- ``srun ... --kill-on-bad-exit=1``: always on the step.
- ``set -e...``, ``echo``: none (no shell runs the command).
- ``MASTER_ADDR=$(scontrol show hostnames ... | head -n1)``: the runtime's (the first node);
  ``MASTER_PORT=$((20000 + SLURM_JOB_ID % 10000))``: the runtime derives its own port from the
  job id instead. Only the rendezvous reads it, so any free port does (a fixed one would be
  ``env: {MASTER_PORT: ...}``).
- No requeue in the originals: the benchmarks say ``requeue: {enabled: false}``
  (``--no-requeue``); the two training scripts keep slurmkit's requeue (``--requeue``,
  ``--signal=B:USR2@120``), which they gain.
- Container ports gain the self-check and a mount of the submit directory (slurmkit always
  mounts it); with ``workdir: image`` they keep the image's WORKDIR as the originals do.

Per script, original line -> spec key:

allreduce.sbatch (``allreduce.yaml``)
    ``--job-name`` -> ``name``; ``--nodes=16``, ``--exclusive``, ``--time=00:10:00`` ->
    ``resources``; one task per GPU on 8 GPUs a node (``allreduce.py`` pins rank ``SLURM_LOCALID``
    to that GPU; 128 ranks) -> ``gpus_per_node: 8`` and ``launcher: srun`` (``tasks_per_node``
    defaults to the GPUs); eight ``export``s -> ``env`` (the script's own set, ``profile: none``: it
    has UCX on ``ibp*`` devices and SHARP settings, and lacks UCX_TLS and others of ``sunk``);
    ``CONTAINER_IMAGE=${CONTAINER_IMAGE:-ghcr.io#...}`` -> ``container.image:
    ${oc.env:CONTAINER_IMAGE,ghcr.io/...}`` (docker form; the submitter's ``CONTAINER_IMAGE`` wins,
    as there; :func:`test_image_comes_from_the_environment`); ``--container-mounts=/mnt:/mnt`` ->
    ``container.mounts``; ``srun python ${SCRIPT_DIR}/allreduce.py`` -> ``command: [python,
    allreduce.py]`` in the submit directory (``BASH_SOURCE`` under sbatch is Slurm's spool copy).
allreduce-torchrun.sbatch (``allreduce-torchrun.yaml``, as at 116a8fd5)
    one task per node (``--ntasks-per-node=1``, no GPUs asked for); the ``export``s and the image as
    above; ``srun bash -c "torchrun --nproc_per_node=$SLURM_NTASKS_PER_NODE
    --nnodes=$SLURM_JOB_NUM_NODES --node_rank=$SLURM_NODEID --master_addr --master_port
    allreduce_torch.py"`` -> ``launcher: torchrun`` (``--nproc-per-node=1``, the tasks per node;
    ``--nnodes`` filled in) and ``command: [python, allreduce_torch.py]`` (the file name as the
    original writes it). The static rendezvous (node rank + master address) becomes torchrun's c10d
    rendezvous at the first node: the same meeting point, no node rank needed.
nccl-test-distributed-h100-64-enroot.slurm
    ``--nodes=8``, ``--ntasks-per-node=8``, ``--gpus-per-node=8``, ``--cpus-per-task=8``,
    ``--mem=128GB``, ``--time=20:00``, ``--exclusive`` -> ``resources``; its seven ``export``s (with
    ``NCCL_NET_PLUGIN=none``) are exactly ``profile: sunk``; ``enroot import -o
    images/nccl_VERSION.sqsh docker://ghcr.io#...`` -> ``container.image`` (pyxis imports it), or
    ``slurmkit image import URI --to DIR`` and ``container.image=DIR/FILE.sqsh``
    (:func:`test_image_knobs_are_overrides`); the NFS check of that directory -> the self-check
    (shared filesystem mounted and writable); ``$cflag`` -> ``container.remap_root: false`` (the
    non-root branch; root would pass ``container.remap_root=true``); ``--no-container-mount-home``
    -> ``mount_home: false``; ``--mpi=pmix`` -> ``mpi: pmix``; ``all_reduce_perf -b 16M -e 8G -f 2
    -g 1`` -> ``command``.
nccl-test-distributed-gb200-nvl72-enroot.slurm
    as h100, with ``--nodes=16``, ``--ntasks-per-node=4``, ``--gpus-per-node=4``; ``--segment=16``,
    ``--distribution=block:block`` -> ``resources.extra``; its twelve ``export``s are exactly
    ``profile: sunk-gb200``.
nccl-test-distributed-gb300-roce-nvl72-enroot.slurm
    as gb200, but ``profile: sunk`` (no multi-node NVLink exports); ``NCCL_NET_PLUGIN=spcx`` and
    nine RoCE tuning ``export``s -> ``env`` (over the profile);
    ``LD_LIBRARY_PATH=/opt/hpcx/nccl_spectrum-x_plugin/lib:$LD_LIBRARY_PATH`` -> ``env_prepend``
    (joined with the image's value inside the container; the original's batch shell joined it with
    the host's).
llama3_1_8b-training.sbatch (``llama3_1_8b-training.yaml``; its default path, a virtual
environment: the container lines are commented out there)
    ``--nodes=4``, ``--exclusive`` -> ``resources``; ``--job-name`` -> ``name``; ``GPUS_PER_NODE=8``
    -> ``torchrun: {nproc_per_node: 8}``; the ``export``s -> ``env`` (``profile: none``), except
    ``TORCHRUN`` and ``TRAIN_SCRIPT`` (they only build the srun line: ``launcher`` and ``command``)
    and ``FSX_MOUNT=$(pwd):$DATA_PATH`` (not ported: only the commented-out container branch reads
    it, where it would be ``container.mounts: ['${oc.env:PWD}:/fsx']``); ``srun -l`` -> ``srun:
    {label: true}``; ``torchrun --nproc_per_node --nnodes --rdzv_id=$SLURM_JOB_ID
    --rdzv_backend=c10d --rdzv_endpoint=$(hostname)`` -> ``launcher: torchrun`` (the batch host is
    the first node, the runtime's MASTER_ADDR); ``../src/train.py TRAINING_ARGS`` -> ``command``.
    ``${AUTO_RESUME}`` (``--auto-resume=1`` only where ``/opt/sagemaker_cluster`` exists, i.e. on
    SageMaker HyperPod) has no ``srun`` key; on SUNK it is empty, and slurmkit's requeue covers what
    it is for.
2.distributed-training.sbatch, gpt3 (``gpt3-2.distributed-training.yaml``)
    ``--nodes=2``, ``--exclusive`` -> ``resources``; ``--wait-all-nodes=1`` -> ``resources.extra``;
    ``: "${VAR:=default}"`` knobs -> their defaults written into ``command`` (``IMAGE`` ->
    ``container.image: ./megatron-training.sqsh``, ``FSX_MOUNT`` -> ``container.mounts``,
    ``DATA_PATH`` -> the ``/fsx/...`` arguments; ``GLOBAL_BATCH_SIZE:=$((288 * NODES / 2))`` -> 288,
    its value on the 2 nodes); three ``export``s -> ``env`` (``profile: none``); ``srun -l
    --container-image --container-mounts`` -> ``srun: {label: true}`` and ``container`` (``workdir:
    image``: the original passes no workdir); ``python -m torch.distributed.run --nproc_per_node=8
    ...`` -> ``launcher: torchrun`` (its ``torchrun`` entry point) with ``torchrun: {nproc_per_node:
    8}``; ``${AUTO_RESUME}`` as for FSDP.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from conftest import ROOT, assert_shell_ok, run_cli

from slurmkit import __version__
from slurmkit import spec as spec_mod
from slurmkit.core.profiles import PROFILES
from slurmkit.images import staged_name
from slurmkit.pyxis import enroot_uri, validate_option

SUNK = ROOT / "tests" / "sunk"
UPDATE = os.environ.get("SLURMKIT_UPDATE_GOLDEN") == "1"
SUBMIT = "/submit"  # the submit directory in the goldens

# The script's own exports of the two reference-architecture all-reduce scripts.
TORCH_ALLREDUCE_ENV = {
    "NCCL_SOCKET_IFNAME": "eth0",
    "NCCL_IB_HCA": "ibp",
    "UCX_NET_DEVICES": "ibp0:1,ibp1:1,ibp2:1,ibp3:1",
    "SHARP_COLL_ENABLE_PCI_RELAXED_ORDERING": "1",
    "NCCL_COLLNET_ENABLE": "0",
    "NVIDIA_IMEX_CHANNELS": "0",
    "NCCL_NET_GDR_C2C": "1",
    "PMIX_MCA_gds": "^ds12",
}
TORCH_EXTRAS = (
    "ghcr.io#coreweave/ml-containers/torch-extras:es-cuda-12.9.1-74755e9-nccl-cuda12.9.1-"
    "ubuntu22.04-nccl2.27.5-1-torch2.7.1-vision0.22.1-audio2.7.1-abi1"
)
ALL_REDUCE_PERF = ("/opt/nccl_tests/build/all_reduce_perf", "-b", "16M", "-e", "8G", "-f", "2")
ALL_REDUCE_PERF += ("-g", "1")
NCCL_TESTS_13 = "ghcr.io#coreweave/nccl-tests:13.3.0-devel-ubuntu24.04-nccl2.31.2-1-d08cf2b"
ROCE_ENV = {
    "NCCL_NET_PLUGIN": "spcx",
    "NCCL_IB_NET_LATENCY": "50",
    "NCCL_IB_ADAPTIVE_ROUTING": "1",
    "NCCL_NVLS_NCHANNELS": "24",
    "NCCL_P2P_NET_CHUNKSIZE": "524288",
    "NCCL_NVLSTREE_MAX_CHUNKSIZE": "262144",
    "NCCL_NVLS_CHUNKSIZE": "262144",
    "NCCL_IB_ADDR_FAMILY": "AF_INET6",
    "NCCL_IB_ADDR_RANGE": "fd02::/16",
    "NCCL_IB_TC": "96",
}
NCCL_STEP = ("--mpi=pmix", "--no-container-remap-root", "--no-container-mount-home")
NCCL_SBATCH = (  # what the three nccl-tests scripts share
    "--job-name=nccl_test_allreduce",
    "--time=20:00",
    "--cpus-per-task=8",
    "--mem=128GB",
    "--exclusive",
)


@dataclass(frozen=True)
class Port:
    """A ported script: what its rendered script and loaded spec must say."""

    sbatch: tuple[str, ...]  # every #SBATCH option of the job's resources (in any order):
    # the original's, less --output/--error
    step: tuple[str, ...]  # options of the srun step and the launcher
    env: dict[str, str]  # the original's exports: the spec's env after its profile, exactly
    command: tuple[str, ...]  # the start of the command
    absent: tuple[str, ...] = ()  # options the original does not have, anywhere in the script
    profile: str | None = None
    env_prepend: dict[str, str] = field(default_factory=dict)
    files: tuple[str, ...] = ()  # what the submit directory holds (a relative squashfs)


PORTS: dict[str, Port] = {
    "allreduce": Port(
        sbatch=(
            "--job-name=torch-allreduce",
            "--time=00:10:00",
            "--nodes=16",
            "--exclusive",
            "--gpus-per-node=8",
            "--ntasks-per-node=8",  # the number of GPUs, as allreduce.py says of the sbatch
        ),
        step=(
            "--nodes=16",
            "--ntasks=128",  # one rank per GPU
            "--ntasks-per-node=8",
            f"--container-image={TORCH_EXTRAS}",
            f"--container-mounts=/mnt:/mnt,{SUBMIT}:{SUBMIT}",
            f"--container-workdir={SUBMIT}",
        ),
        env=TORCH_ALLREDUCE_ENV,
        command=("python", "allreduce.py"),
        absent=("--cpus-per-task", "--mpi", "torchrun"),
        profile="none",
    ),
    "allreduce-torchrun": Port(
        sbatch=("--job-name=torch-allreduce", "--time=00:10:00", "--nodes=16", "--exclusive"),
        step=(
            "--ntasks=16",
            "--ntasks-per-node=1",
            f"--container-image={TORCH_EXTRAS}",
            f"--container-mounts=/mnt:/mnt,{SUBMIT}:{SUBMIT}",
            "torchrun",
            "--nnodes=16",
            "--nproc-per-node=1",  # $SLURM_NTASKS_PER_NODE
            "--rdzv-endpoint={master_addr}:{master_port}",
        ),
        env=TORCH_ALLREDUCE_ENV,
        command=("python", "allreduce_torch.py"),
        absent=("--cpus-per-task", "--gpus-per-node", "--mpi"),
        profile="none",
    ),
    "nccl-test-distributed-h100-64-enroot": Port(
        sbatch=(*NCCL_SBATCH, "--nodes=8", "--gpus-per-node=8", "--ntasks-per-node=8"),
        step=(
            "--nodes=8",
            "--ntasks=64",
            "--ntasks-per-node=8",
            *NCCL_STEP,
            "--container-image=ghcr.io#coreweave/nccl-tests:"
            "12.9.1-devel-ubuntu22.04-nccl2.28.3-1-8b67957",
        ),
        env=PROFILES["sunk"],  # with NCCL_NET_PLUGIN=none, as the script at cb86553
        command=ALL_REDUCE_PERF,
        absent=("--container-workdir", "--segment", "torchrun"),
        profile="sunk",
    ),
    "nccl-test-distributed-gb200-nvl72-enroot": Port(
        sbatch=(
            *NCCL_SBATCH,
            "--nodes=16",
            "--gpus-per-node=4",
            "--ntasks-per-node=4",
            "--segment=16",
            "--distribution=block:block",
        ),
        step=(
            "--ntasks=64",
            "--ntasks-per-node=4",
            *NCCL_STEP,
            f"--container-image={NCCL_TESTS_13}",
        ),
        env={
            "NCCL_SOCKET_IFNAME": "eth0",
            "NCCL_IB_HCA": "ibp",
            "NVIDIA_IMEX_CHANNELS": "0",
            "NCCL_NET_GDR_C2C": "1",
            "NCCL_MNNVL_ENABLE": "1",
            "NCCL_CUMEM_ENABLE": "1",
            "NCCL_SHM_DISABLE": "0",
            "UCX_TLS": "tcp",
            "UCX_NET_DEVICES": "eth0",
            "OMPI_MCA_coll_hcoll_enable": "0",
            "PMIX_MCA_gds": "^ds12",
            "NCCL_NET_PLUGIN": "none",
        },
        command=ALL_REDUCE_PERF,
        absent=("--container-workdir", "torchrun"),
        profile="sunk-gb200",
    ),
    "nccl-test-distributed-gb300-roce-nvl72-enroot": Port(
        sbatch=(
            *NCCL_SBATCH,
            "--nodes=16",
            "--gpus-per-node=4",
            "--ntasks-per-node=4",
            "--segment=16",
            "--distribution=block:block",
        ),
        step=(
            "--ntasks=64",
            *NCCL_STEP,
            f"--container-image={NCCL_TESTS_13}",
            "slurmkit-env",
            "/opt/hpcx/nccl_spectrum-x_plugin/lib",
        ),
        env={**PROFILES["sunk"], **ROCE_ENV},
        command=ALL_REDUCE_PERF,
        absent=("--container-workdir", "NCCL_MNNVL_ENABLE", "torchrun"),
        profile="sunk",
        env_prepend={"LD_LIBRARY_PATH": "/opt/hpcx/nccl_spectrum-x_plugin/lib"},
    ),
    "llama3_1_8b-training": Port(
        sbatch=("--job-name=llama3_1_8b-FSDP", "--nodes=4", "--exclusive"),
        step=(
            "--nodes=4",
            "--ntasks=4",
            "--ntasks-per-node=1",
            "--label",
            "torchrun",
            "--nnodes=4",
            "--nproc-per-node=8",
            "--rdzv-backend=c10d",
            "--rdzv-endpoint={master_addr}:{master_port}",
            "--rdzv-id={job_id}",
        ),
        env={
            "DATA_PATH": "/fsx",
            "NCCL_DEBUG": "INFO",
            "FI_PROVIDER": "efa",
            "FI_EFA_USE_HUGE_PAGE": "0",
            "FI_EFA_SET_CUDA_SYNC_MEMOPS": "0",
            "LD_PRELOAD": "/usr/local/cuda-12.8/lib/libnccl.so",
            "NCCL_SOCKET_IFNAME": "^docker,lo,veth,eth",
            "HF_HUB_ETAG_TIMEOUT": "60",
        },
        command=("python", "../src/train.py", "--max_context_width=8192"),
        absent=("--cpus-per-task", "--container", "--mpi", "selfcheck"),
        profile="none",
    ),
    "gpt3-2.distributed-training": Port(
        sbatch=(
            "--job-name=megatron_gpt",
            "--nodes=2",
            "--exclusive",
            "--wait-all-nodes=1",
        ),
        step=(
            "--ntasks=2",
            "--ntasks-per-node=1",
            "--label",
            "--container-image=./megatron-training.sqsh",
            f"--container-mounts=/fsx:/fsx,{SUBMIT}:{SUBMIT}",
            "torchrun",
            "--nnodes=2",
            "--nproc-per-node=8",
            "--rdzv-id={job_id}",
        ),
        env={
            "NCCL_ASYNC_ERROR_HANDLING": "1",
            "NCCL_DEBUG": "INFO",
            "CUDA_DEVICE_MAX_CONNECTIONS": "1",
        },
        command=("python", "/workspace/Megatron-LM/pretrain_gpt.py"),
        absent=("--cpus-per-task", "--container-workdir", "--mpi"),
        profile="none",
        files=("megatron-training.sqsh",),
    ),
}
# The options slurmkit itself puts in every script (not the original's).
OWN = re.compile(r"--(array|output|error|open-mode|requeue|no-requeue|signal|comment)(=|$)")


def normalise(text: str, submit_dir: Path) -> str:
    """The parts of a rendered script that vary between runs, replaced by fixed names."""
    for path in {str(submit_dir), os.path.realpath(submit_dir)}:
        text = text.replace(path, SUBMIT)
    text = re.sub(r"(/runs/[\w.-]+?)-\d{8}-\d{6}(-\d+)?(?=/|\s|$)", r"\1-STAMP", text)
    text = text.replace(
        f"PY=${{SLURMKIT_PYTHON:-{shlex.quote(sys.executable)}}}", "PY=${SLURMKIT_PYTHON:-PYTHON}"
    )
    return text.replace(f"# Rendered by slurmkit {__version__}:", "# Rendered by slurmkit VERSION:")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory):
    """``rendered(name, *overrides)``: the script ``slurmkit render tests/sunk/NAME.yaml``
    prints, run in a fresh submit directory, and that directory."""
    cache: dict[tuple[str, ...], tuple[str, Path]] = {}

    def render(name: str, *overrides: str) -> tuple[str, Path]:
        key = (name, *overrides)
        if key not in cache:
            submit_dir = tmp_path_factory.mktemp(name)
            for file in PORTS[name].files:
                (submit_dir / file).touch()
            with pytest.MonkeyPatch.context() as mp:  # the image default, not the caller's
                mp.delenv("CONTAINER_IMAGE", raising=False)
                proc = run_cli(
                    "render",
                    str(SUNK / f"{name}.yaml"),
                    *overrides,
                    cwd=submit_dir,
                    env={"SLURMKIT_CONFIG": os.devnull},
                )
            assert proc.returncode == 0, proc.stderr
            cache[key] = (proc.stdout, submit_dir)
        return cache[key]

    return render


def sbatch_options(text: str) -> list[str]:
    return [ln.removeprefix("#SBATCH ") for ln in text.splitlines() if ln.startswith("#SBATCH ")]


def step_argv(text: str) -> list[str]:
    """The launch argv the script's comment shows (srun, container options, launcher)."""
    [line] = [ln for ln in text.splitlines() if ln.startswith("#   srun ")]
    return shlex.split(line.removeprefix("#   "))


@pytest.mark.parametrize("name", sorted(PORTS))
def test_port_matches_its_golden_and_parses(rendered, name):
    text, submit_dir = rendered(name)
    assert_shell_ok(text)  # bash -n, and shellcheck -s bash where it is installed
    got = normalise(text, submit_dir)
    golden = SUNK / f"{name}.sbatch.golden"
    if UPDATE:
        golden.write_text(got)
    assert golden.exists(), f"{golden} missing: run SLURMKIT_UPDATE_GOLDEN=1 pytest {__file__}"
    assert got == golden.read_text(), (
        f"{golden} differs: if the change is intended, run "
        f"SLURMKIT_UPDATE_GOLDEN=1 pytest {__file__} and review the diff"
    )
    assert_shell_ok(golden.read_text())


@pytest.mark.parametrize("name", sorted(PORTS))
def test_port_is_faithful(rendered, name, monkeypatch):
    monkeypatch.setenv("SLURMKIT_CONFIG", os.devnull)  # as the render: no user config
    port = PORTS[name]
    text, submit_dir = rendered(name)
    text = normalise(text, submit_dir)
    resources = [o for o in sbatch_options(text) if not OWN.match(o)]
    assert sorted(resources) == sorted(port.sbatch)  # no more and no less than Port.sbatch
    step = step_argv(text)
    assert step[:2] == ["srun", "--kill-on-bad-exit=1"]
    for opt in port.step:
        assert opt in step, opt
    for opt in step:
        if opt.startswith(("--container", "--no-container")):
            validate_option(opt.replace("{job_id}", "1"))  # each one is pyxis's, well formed
    assert not any(o.startswith("--cpus-per-task") for o in step)  # srun inherits it, as there
    for opt in port.absent:
        assert opt not in text, opt
    spec = spec_mod.load(str(SUNK / f"{name}.yaml"), job=True)
    assert spec.profile == port.profile
    assert spec.env == port.env  # the original's exports (as mapped above), nothing more
    assert spec.env_prepend == port.env_prepend
    assert spec.command[: len(port.command)] == port.command
    if spec.container is not None:  # what the script exports reaches the container
        keep = next(o for o in step if o.startswith("--container-env=")).split("=", 1)[1]
        assert set(keep.split(",")) == {"MASTER_ADDR", "MASTER_PORT", *port.env}


def test_profiles_fit_where_the_scripts_match_them():
    """gb200's exports are ``sunk-gb200``; h100's (with ``NCCL_NET_PLUGIN=none`` at cb86553) are
    ``sunk``, so neither spec lists them."""
    gb200 = PORTS["nccl-test-distributed-gb200-nvl72-enroot"]
    assert gb200.env == PROFILES["sunk-gb200"]
    h100 = PORTS["nccl-test-distributed-h100-64-enroot"].env
    assert h100 == PROFILES["sunk"] and h100["NCCL_NET_PLUGIN"] == "none"
    roce = PORTS["nccl-test-distributed-gb300-roce-nvl72-enroot"].env
    assert not (set(PROFILES["sunk-gb200"]) - set(PROFILES["sunk"])) & set(roce)  # no MNNVL


@pytest.mark.parametrize(
    ("name", "image"),
    [
        # CONTAINER_IMAGE=/mnt/vast/images/torch-extras.sqsh sbatch allreduce.sbatch
        ("allreduce", "/mnt/vast/images/torch-extras.sqsh"),
        # the script's `enroot import -o DIR/...sqsh docker://ghcr.io#...` on the head node:
        # `slurmkit image import ghcr.io/coreweave/nccl-tests:TAG --to DIR` on the login node
        (
            "nccl-test-distributed-gb200-nvl72-enroot",
            "/mnt/nfs/images/" + staged_name(NCCL_TESTS_13),
        ),
    ],
)
def test_image_knobs_are_overrides(rendered, name, image):
    text, _ = rendered(name, f"container.image={image}")
    assert f"--container-image={enroot_uri(image)}" in step_argv(text)
    assert_shell_ok(text)


@pytest.mark.parametrize("name", ["allreduce", "allreduce-torchrun"])
def test_image_comes_from_the_environment(tmp_path, name):
    """``CONTAINER_IMAGE=${CONTAINER_IMAGE:-ghcr.io#...}`` is
    ``image: ${oc.env:CONTAINER_IMAGE,ghcr.io/...}``: the submitter's value wins, as there."""
    image = "/mnt/vast/images/torch-extras.sqsh"
    env = {"SLURMKIT_CONFIG": os.devnull, "CONTAINER_IMAGE": image}
    proc = run_cli("render", str(SUNK / f"{name}.yaml"), cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"--container-image={image}" in step_argv(proc.stdout)


def test_a_profile_in_the_user_config_does_not_reach_the_ports(tmp_path, monkeypatch):
    """A user config's ``profile`` applies to every spec that names none: each port names its
    own (``none`` where the script exports its own set), so its environment stays the script's."""
    config = tmp_path / "config.yaml"
    config.write_text("profile: sunk-gb200\n")
    monkeypatch.setenv("SLURMKIT_CONFIG", str(config))
    for name, port in PORTS.items():
        spec = spec_mod.load(str(SUNK / f"{name}.yaml"), job=True)
        assert spec.env == port.env, name


@pytest.mark.parametrize("name", ["llama3_1_8b-training", "gpt3-2.distributed-training"])
def test_torchrun_ports_ask_for_no_gpus(rendered, name):
    """The originals ask Slurm for no GPUs (--exclusive gives the whole node) and pass
    --nproc_per_node=8 to torchrun themselves: `torchrun: {nproc_per_node: 8}`."""
    text, _ = rendered(name)
    assert "--nproc-per-node=8" in step_argv(text)
    assert not any(o.startswith("--gpus-per-node") for o in sbatch_options(text))


def test_fsdp_keeps_its_log_names_and_its_stderr_file(rendered):
    """FSDP writes `--output=logs/%x_%j.out --error=logs/%x_%j.err`: the same names, in the
    sweep directory's logs/ (the only difference: where that directory is)."""
    text, submit_dir = rendered("llama3_1_8b-training")
    options = sbatch_options(normalise(text, submit_dir))
    logs = "/submit/runs/llama3_1_8b-FSDP-STAMP/logs"
    assert f"--output={logs}/%x_%j.out" in options and f"--error={logs}/%x_%j.err" in options
