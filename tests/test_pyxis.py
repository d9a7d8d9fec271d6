"""pyxis options: image references, mounts, workdir, names, env; validation errors; every
rendered option passes validate_option."""

from __future__ import annotations

import dataclasses

import pytest

from slurmkit import pyxis
from slurmkit.core.profiles import PROFILES
from slurmkit.core.rendezvous import fill
from slurmkit.errors import SpecError
from slurmkit.pyxis import enroot_uri, validate_option
from slurmkit.spec.model import CONTAINER_KEYS


def container_options(container, *, submit_dir=None, env_names=(), source=None) -> list[str]:
    """Validate a container block, then render its srun options."""
    return pyxis.srun_options(
        pyxis.parse(container, source), submit_dir=submit_dir, env_names=env_names, source=source
    )


def render(submit_dir: str = "/mnt/home/me/proj", **container) -> list[str]:
    """The options as the runtime passes them to srun (the job id filled in), each checked."""
    opts = container_options(container, submit_dir=submit_dir, source="job.yaml")
    filled = fill({"step": opts}, {"MASTER_ADDR": "n1", "MASTER_PORT": "1", "SLURM_JOB_ID": "4242"})
    for opt in filled:
        validate_option(opt)
    return filled


def option(opts: list[str], name: str) -> str | None:
    found = [o.partition("=")[2] for o in opts if o.partition("=")[0] == f"--{name}"]
    assert len(found) <= 1, opts
    return found[0] if found else None


def spec_error(match: str, **container) -> SpecError:
    with pytest.raises(SpecError, match=match) as info:
        container_options(container, submit_dir="/mnt/home/me/proj", source="job.yaml")
    assert info.value.file == "job.yaml"
    return info.value


@pytest.mark.parametrize(
    "image, uri",
    [
        ("nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
        ("nvcr.io#nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
        ("docker://nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io#nvidia/pytorch:24.01-py3"),
        ("alice@nvcr.io/nvidia/pytorch:24.01-py3", "alice@nvcr.io#nvidia/pytorch:24.01-py3"),
        ("ubuntu:22.04", "ubuntu:22.04"),
        ("ubuntu", "ubuntu"),
        ("docker.io/library/ubuntu:22.04", "ubuntu:22.04"),
        ("index.docker.io/pytorch/pytorch:2.3.0", "pytorch/pytorch:2.3.0"),
        ("docker.io#pytorch/pytorch", "pytorch/pytorch"),
        ("ghcr.io/org/team/trainer:v1.2", "ghcr.io#org/team/trainer:v1.2"),
        ("localhost:5000/trainer:dev", "localhost:5000#trainer:dev"),
        ("registry.internal:5000/a/b", "registry.internal:5000#a/b"),
        ("/mnt/data/images/pytorch+24.01.sqsh", "/mnt/data/images/pytorch+24.01.sqsh"),
        ("./images/train.sqsh", "./images/train.sqsh"),
    ],
)
def test_image_references(image, uri):
    assert enroot_uri(image) == uri
    assert option(render(image=image), "container-image") == uri


@pytest.mark.parametrize(
    "image, reason",
    [
        ("nvcr.io/nvidia/pytorch@sha256:" + "a" * 64, "digest"),
        ("nvcr.io/NVIDIA/PyTorch:24.01", "not an image name"),
        ("ubuntu:bad tag", "not a tag"),
        ("/images/my image.sqsh", "squashfs path"),
        ("ba$d@nvcr.io/x", "not a user name"),
    ],
)
def test_bad_images(image, reason):
    err = spec_error(reason, image=image)
    assert err.key == "container.image"
    assert "nvcr.io/nvidia/pytorch" in err.hint


def test_image_required():
    assert spec_error("required", mounts=[]).key == "container.image"


def test_full_block_renders_in_order():
    opts = render(
        image="nvcr.io/nvidia/pytorch:24.01-py3",
        mounts=[
            "/mnt/data:/data:ro+rprivate",
            {"src": "tmpfs", "dst": "/scratch", "flags": ["size=8G", "mode=1777"]},
            "/mnt/home:/mnt/home",
            "umount:/opt/unwanted",
        ],
        workdir="/workspace",
        env_keep=["WANDB_API_KEY", "MASTER_PORT"],
        writable=True,
        remap_root=False,
        mount_home=True,
        name="train:exec",
    )
    digest = opts[3].split("-")[-2]
    assert opts == [
        "--container-image=nvcr.io#nvidia/pytorch:24.01-py3",
        "--container-mounts=/mnt/data:/data:ro+rprivate,tmpfs:/scratch:size=8G+mode=1777,"
        "/mnt/home:/mnt/home,umount:/opt/unwanted",
        "--container-workdir=/workspace",
        f"--container-name=train-{digest}-4242:exec",
        "--container-env=MASTER_ADDR,MASTER_PORT,WANDB_API_KEY",
        "--container-writable",
        "--no-container-remap-root",
        "--container-mount-home",
    ]


def test_defaults_mount_and_enter_the_submit_dir_without_home():
    opts = render(image="ubuntu:22.04")
    assert opts == [
        "--container-image=ubuntu:22.04",
        "--container-mounts=/mnt/home/me/proj:/mnt/home/me/proj",
        "--container-workdir=/mnt/home/me/proj",
        "--container-env=MASTER_ADDR,MASTER_PORT",
        "--no-container-mount-home",
    ]


def test_an_explicit_workdir_still_mounts_the_submit_dir():
    """The docs say the submit directory is always mounted; with ``workdir: /w`` it was not,
    and only the job's self-check found out (exit 3). Papercut 23.19."""
    opts = render(image="ubuntu", workdir="/w")
    assert option(opts, "container-mounts") == "/mnt/home/me/proj:/mnt/home/me/proj"
    assert option(opts, "container-workdir") == "/w"
    odd = render("/mnt/a,b", image="ubuntu", workdir="/w")  # pyxis cannot mount it: left out
    assert option(odd, "container-mounts") is None and option(odd, "container-workdir") == "/w"


def test_submit_dir_already_under_a_mount_is_not_mounted_twice():
    opts = render(image="ubuntu", mounts=["/mnt/home"])
    assert option(opts, "container-mounts") == "/mnt/home:/mnt/home"
    assert option(opts, "container-workdir") == "/mnt/home/me/proj"
    opts = render(image="ubuntu", mounts=["/mnt/home2"])
    assert (
        option(opts, "container-mounts")
        == "/mnt/home2:/mnt/home2,/mnt/home/me/proj:/mnt/home/me/proj"
    )


def test_workdir_image_keeps_the_image_workdir_and_still_mounts_the_submit_dir():
    opts = render(image="ghcr.io/coreweave/nccl-tests:latest", workdir="image")
    assert option(opts, "container-workdir") is None
    assert option(opts, "container-mounts") == "/mnt/home/me/proj:/mnt/home/me/proj"
    # a path named "image" is still a path when it is one
    assert option(render(image="ubuntu", workdir="/image"), "container-workdir") == "/image"
    assert spec_error("not an absolute path", image="ubuntu", workdir="Image").key == (
        "container.workdir"
    )


def test_submit_dir_default_is_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    opts = container_options({"image": "ubuntu"})
    assert option(opts, "container-workdir") == str(tmp_path)


def test_unmountable_submit_dir_asks_for_a_workdir():
    with pytest.raises(SpecError, match="cannot be mounted") as info:
        container_options({"image": "ubuntu"}, submit_dir="/mnt/a:b")
    assert info.value.key == "container.workdir"
    assert (
        option(
            container_options({"image": "ubuntu", "workdir": "/w"}, submit_dir="/mnt/a:b"),
            "container-workdir",
        )
        == "/w"
    )


def test_env_names_from_the_script_are_kept_once():
    opts = container_options(
        {"image": "ubuntu", "env_keep": ["A"]}, submit_dir="/x", env_names=[*PROFILES["sunk"], "A"]
    )
    assert option(opts, "container-env") == "MASTER_ADDR,MASTER_PORT,A," + ",".join(
        PROFILES["sunk"]
    )


def test_sunk_profile():
    sunk = PROFILES["sunk"]
    assert sunk["NCCL_SOCKET_IFNAME"] == "eth0" and sunk["NCCL_IB_HCA"] == "ibp"
    assert sunk["UCX_TLS"] == "tcp" and sunk["PMIX_MCA_gds"] == "^ds12"
    assert PROFILES["sunk-gb200"]["NCCL_MNNVL_ENABLE"] == "1"
    assert set(sunk) < set(PROFILES["sunk-gb200"])


def test_name_digest_follows_the_image_not_its_spelling(tmp_path):
    def name(image: str, submit_dir: str = "/x") -> str:
        return option(
            container_options({"image": image, "name": "train"}, submit_dir=submit_dir),
            "container-name",
        )

    a = name("nvcr.io/nvidia/pytorch:24.01-py3")
    assert a == name("nvcr.io#nvidia/pytorch:24.01-py3")
    assert a != name("nvcr.io/nvidia/pytorch:24.02-py3")
    assert a.startswith("train-") and a.endswith("-{job_id}")
    assert len(a) == len("train-") + 8 + len("-{job_id}")
    image = tmp_path / "train.sqsh"
    image.write_bytes(b"v1")
    first = name("./train.sqsh", str(tmp_path))
    assert first == name("./train.sqsh", str(tmp_path))
    image.write_bytes(b"v2, re-imported")
    assert name("./train.sqsh", str(tmp_path)) != first


def test_named_containers_are_never_shared_across_jobs():
    """Every job gets its own container: tasks of one array start on one node at once, and a
    shared name let them race to create it (pyxis's container_scope=global, its default)."""
    one = render(image="ubuntu", name="train")
    other = fill(
        {"step": container_options({"image": "ubuntu", "name": "train"})},
        {"MASTER_ADDR": "n1", "MASTER_PORT": "1", "SLURM_JOB_ID": "4243"},
    )
    names = [option(one, "container-name"), option(other, "container-name")]
    assert names[0].endswith("-4242") and names[1].endswith("-4243")
    assert names[0][: -len("4242")] == names[1][: -len("4243")]  # same image, same base


@pytest.mark.parametrize(
    "name, match",
    [
        ("train:reuse", "'reuse' is not allowed"),
        ("-x", "is not a container name"),
        ("a b", "is not a container name"),
        (3, "is not a container name"),
    ],
)
def test_bad_names(name, match):
    err = spec_error(match, image="ubuntu", name=name)
    assert err.key == "container.name"
    assert "no_exec" in err.hint


@pytest.mark.parametrize(
    "mount, match",
    [
        ("data:/data", "source 'data' is not allowed"),
        ("/a:/b:/c:ro", "too many ':'"),
        ("/a,b:/c", "source '/a,b' is not allowed"),
        ("/a:rel", "destination 'rel' is not allowed"),
        ("/a::ro", "empty destination"),
        ("/a:/b:ro+bogus", "unknown mount flag 'bogus'"),
        ("/a:/b:size=1G", "unknown mount flag 'size=1G'"),
        ("tmpfs", "tmpfs needs a destination"),
        ("umount", "umount needs a destination"),
        ({"src": "/a", "to": "/b"}, "unknown key 'to'"),
        ({"src": "/a", "flags": 3}, "flags a list"),
        (7, "expected a string or a mapping"),
    ],
)
def test_bad_mounts_name_their_index(mount, match):
    err = spec_error(match, image="ubuntu", mounts=["/ok:/ok", mount])
    assert err.key.startswith("container.mounts[1]")


def test_bad_mount_flag_lists_allowed_flags():
    err = spec_error("bogus", image="ubuntu", mounts=["/a:/b:bogus"])
    assert "ro" in err.hint and "rprivate" in err.hint and "x-create=dir" in err.hint


@pytest.mark.parametrize(
    "block, key, match",
    [
        ({"image": "ubuntu", "mounts": "/a:/b"}, "container.mounts", "must be a list"),
        ({"image": "ubuntu", "workdir": "rel/dir"}, "container.workdir", "not an absolute path"),
        (
            {"image": "ubuntu", "env_keep": ["OK", "1BAD"]},
            "container.env_keep[1]",
            "not a variable",
        ),
        ({"image": "ubuntu", "writable": "yes"}, "container.writable", "true or false"),
        ({"image": "ubuntu", "mount_home": 1}, "container.mount_home", "true or false"),
        ({"image": "ubuntu", "entrypoint": True}, "container.entrypoint", "unknown key"),
    ],
)
def test_bad_keys(block, key, match):
    err = spec_error(match, **block)
    assert err.key == key


def test_unknown_key_lists_allowed_keys():
    err = spec_error("unknown key", image="ubuntu", mount=[])
    assert err.hint == "allowed keys: " + ", ".join(CONTAINER_KEYS)
    assert str(err).startswith("job.yaml: container.mount: unknown key 'mount'")


def test_dataclass_block():
    @dataclasses.dataclass
    class Container:
        image: str = "nvcr.io/nvidia/pytorch:24.01-py3"
        mounts: list = dataclasses.field(default_factory=list)
        workdir: str | None = None
        env_keep: list = dataclasses.field(default_factory=list)
        writable: bool | None = None
        remap_root: bool | None = True
        mount_home: bool = False
        name: str | None = None

    opts = container_options(Container(), submit_dir="/x")
    assert "--container-remap-root" in opts
    assert option(opts, "container-image") == "nvcr.io#nvidia/pytorch:24.01-py3"
    with pytest.raises(TypeError):
        container_options(["image"])


@pytest.mark.parametrize(
    "opt",
    [
        "--container-image=nvcr.io#nvidia/pytorch:24.01-py3",
        "--container-image=/images/a.sqsh",
        "--container-mounts=/a:/b:ro+rprivate,tmpfs:/t,/c",
        "--container-workdir=/w",
        "--container-name=x-1234abcd:no_exec",
        "--container-save=/images/out.sqsh",
        "--container-env=A,B_2",
        "--container-unshare=net,uts",
        "--container-entrypoint-log",
        "--no-container-entrypoint",
        "--container-readonly",
    ],
)
def test_validate_option_accepts(opt):
    assert validate_option(opt).name == opt[2:].partition("=")[0]


@pytest.mark.parametrize(
    "opt, match",
    [
        ("--container-bogus=1", "not a pyxis option"),
        ("container-image=ubuntu", "not a pyxis option"),
        ("--container-image", "needs a value"),
        ("--container-image=", "needs a value"),
        ("--container-writable=1", "takes no value"),
        ("--container-image=nvcr.io/nvidia/pytorch:24.01-py3", "nvcr.io#nvidia"),
        ("--container-mounts=/a:/b:ro+bogus", "entry 0: unknown mount flag"),
        ("--container-name=x:reuse", "NAME"),
        ("--container-env=A,,B", "variable names"),
        ("--container-unshare=pid", "net, ipc, uts"),
        ("--container-save=/images/", "file path"),
        ("--container-workdir=rel", "absolute"),
    ],
)
def test_validate_option_rejects(opt, match):
    with pytest.raises(ValueError, match=match):
        validate_option(opt)


def test_validate_option_version_gates():
    validate_option("--container-env=A", "0.15")
    with pytest.raises(ValueError, match="needs pyxis 0.15"):
        validate_option("--container-env=A", "0.14")
    with pytest.raises(ValueError, match="needs pyxis 0.24"):
        validate_option("--container-unshare=net", "0.23")
    validate_option("--container-name=x:exec", "0.13")
    with pytest.raises(ValueError, match="':no_exec' needs pyxis 0.14"):
        validate_option("--container-name=x:no_exec", "0.13")


def test_option_table_shape():
    for name, opt in pyxis.OPTIONS.items():
        assert name == opt.name and name.startswith(("container-", "no-container-"))
        assert all(part.isdigit() for part in opt.since.split("."))
        assert pyxis._version(opt.since) <= pyxis._version(pyxis.PYXIS_VERSION)
    for name in ("mount-home", "remap-root", "entrypoint"):
        assert f"container-{name}" in pyxis.OPTIONS and f"no-container-{name}" in pyxis.OPTIONS


def test_missing_squashfs_and_mount_sources_are_refused_where_visible(tmp_path):
    """Under the submit directory (shared: the container mounts it), a missing squashfs or
    bind-mount source is refused at submit, naming it; a path elsewhere is left to the job."""
    (tmp_path / "images").mkdir()
    (tmp_path / "images" / "ok.sqsh").write_bytes(b"x")
    (tmp_path / "data").mkdir()
    with pytest.raises(SpecError) as info:
        container_options({"image": "./images/missing.sqsh"}, submit_dir=str(tmp_path))
    assert (
        info.value.key == "container.image" and "missing.sqsh does not exist" in info.value.message
    )
    assert "slurmkit image import" in info.value.hint
    with pytest.raises(SpecError) as info:
        container_options(
            {"image": "ubuntu", "mounts": [f"{tmp_path}/gone:/gone"]}, submit_dir=str(tmp_path)
        )
    assert info.value.key == "container.mounts[0]"
    ok = {"image": "./images/ok.sqsh", "mounts": [f"{tmp_path / 'data'}:/data"]}
    container_options(ok, submit_dir=str(tmp_path))  # both exist
    # elsewhere (node-local storage, a mount only compute nodes have): not refused
    container_options(
        {"image": "/nonexistent-root/x.sqsh", "mounts": ["/tmp/no-such-node-local:/x"]},
        submit_dir=str(tmp_path),
    )
