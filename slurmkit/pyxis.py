"""pyxis (v0.24) as data, and the ``srun`` options for a job spec's ``container`` block.

pyxis is the SPANK plugin that runs Slurm tasks in enroot containers. :data:`OPTIONS` lists its
options: name, value syntax (``None`` for a flag) and the release that introduced it. Gates at
0.14 and later are from pyxis's changelog; the older ones are the first release known to list
the option (every site runs >= 0.15, so only the later gates decide anything).

:func:`parse` validates a ``container`` block into a :class:`Container`
and :func:`srun_options` renders it::

    container:
      image: nvcr.io/nvidia/pytorch:24.01-py3      # rendered nvcr.io#nvidia/pytorch:24.01-py3
      mounts: ["/mnt/data:/data:ro+rprivate", {src: tmpfs, dst: /scratch, flags: [size=8G]}]
      workdir: /workspace                          # default: the submit directory, mounted;
                                                   # `image`: the image's own WORKDIR
      env_keep: [WANDB_API_KEY]                    # host values win over the image's
      writable: true                               # --container-writable / --container-readonly
      remap_root: false                            # --[no-]container-remap-root
      mount_home: false                            # --[no-]container-mount-home (default: false)
      name: train                                  # --container-name=train-<image digest>[:flag]

The options go on ``srun`` in a host-side batch script (the batch shell keeps ``scontrol``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import SpecError, reject_unknown
from .spec.model import CONTAINER_KEYS

PYXIS_VERSION = "0.24"


@dataclass(frozen=True)
class Option:
    """One pyxis option: ``--NAME`` (a flag) or ``--NAME=VALUE`` with ``value`` its syntax."""

    name: str
    value: str | None
    since: str


OPTIONS: dict[str, Option] = {
    o.name: o
    for o in (
        Option("container-image", "[USER@][REGISTRY#]IMAGE[:TAG]|PATH", "0.1"),
        Option("container-mounts", "SRC[:DST[:FLAGS]][,SRC[:DST[:FLAGS]]...]", "0.1"),
        Option("container-workdir", "PATH", "0.1"),
        Option("container-name", "NAME[:auto|create|exec|no_exec]", "0.1"),
        Option("container-save", "PATH", "0.8"),
        Option("container-mount-home", None, "0.7"),
        Option("no-container-mount-home", None, "0.7"),
        Option("container-remap-root", None, "0.1"),
        Option("no-container-remap-root", None, "0.8"),
        Option("container-writable", None, "0.11"),
        Option("container-readonly", None, "0.11"),
        Option("container-entrypoint", None, "0.12"),
        Option("no-container-entrypoint", None, "0.12"),
        Option("container-env", "NAME[,NAME...]", "0.15"),
        Option("container-entrypoint-log", None, "0.20"),
        Option("container-unshare", "NS[,NS...] (net, ipc, uts)", "0.24"),
    )
}
# --container-name=NAME:FLAG; every flag but no_exec came with the flags themselves.
NAME_FLAGS = {"auto": "0.12", "create": "0.12", "exec": "0.12", "no_exec": "0.14"}
UNSHARE = ("net", "ipc", "uts")
# enroot-mount's options that make sense for a bind or tmpfs mount (pyxis joins them with '+').
MOUNT_FLAGS = (
    "ro",
    "rw",
    "bind",
    "rbind",
    "private",
    "rprivate",
    "shared",
    "rshared",
    "slave",
    "rslave",
    "unbindable",
    "runbindable",
    "nosuid",
    "suid",
    "nodev",
    "dev",
    "noexec",
    "exec",
    "noatime",
    "atime",
    "nodiratime",
    "diratime",
    "relatime",
    "norelatime",
    "strictatime",
    "nostrictatime",
    "lazytime",
    "nolazytime",
    "sync",
    "async",
    "dirsync",
    "nofail",
    "silent",
    "loud",
    "x-create=dir",
    "x-create=file",
    "x-create=auto",
)
_TMPFS_FLAG = re.compile(r"^(size=\d+[kKmMgG%]?|mode=[0-7]{3,4}|nr_inodes=\d+[kKmMgG]?)$")
# Always kept from the host: the PyTorch enroot hook would otherwise set its own.
KEEP_ALWAYS = ("MASTER_ADDR", "MASTER_PORT")

_DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")
_USER = re.compile(r"^[A-Za-z0-9_.+-]+$")
_REGISTRY = re.compile(r"^(localhost|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*)(:\d+)?$")
_REPO = re.compile(r"^[a-z0-9]+([._-]+[a-z0-9]+)*(/[a-z0-9]+([._-]+[a-z0-9]+)*)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
_IMAGE_PATH = re.compile(r"^[/.][^\s'\"$`\\,]*$")
_PATH = re.compile(r"^/[^\s'\"$`\\,:]*$")  # expressible in --container-mounts
IMAGE_WORKDIR = "image"  # container.workdir value: keep the image's WORKDIR
_WORKDIR = re.compile(r"^/[^\s'\"$`\\]*$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_RENDERED_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")  # NAME-DIGEST-JOBID
_UNSAFE_HINT = "an absolute path without whitespace, quotes, '$', '\\', ',' or ':'"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


@dataclass(frozen=True)
class Container:
    """A validated ``container`` block (:func:`parse`): the image and how pyxis runs each task
    in it (:func:`srun_options` renders it). It lives here, not in :mod:`slurmkit.spec.model`,
    so that specs without a container never load pyxis."""

    image: str  # as written; ``uri`` is pyxis's form
    uri: str
    mounts: list[Any] = field(default_factory=list)  # as written (strings or mappings)
    pyxis_mounts: tuple[str, ...] = ()  # the same as SRC:DST[:FLAGS]
    workdir: str | None = None  # None: the submit directory; "image": the image's WORKDIR
    env_keep: tuple[str, ...] = ()
    writable: bool | None = None
    remap_root: bool | None = None
    mount_home: bool | None = False
    name: str | None = None  # the name's base, before the image digest
    name_flag: str = ""  # auto, create, exec or no_exec

    given: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The block as the spec wrote it (sweep.json and spec.yaml keep it so)."""
        return dict(self.given)


# --- the image ------------------------------------------------------------------------------


def enroot_uri(image: str) -> str:
    """A registry reference in pyxis's ``[USER@][REGISTRY#]IMAGE[:TAG]`` form; a path (``/``
    or ``.`` first) stays as it is. ``nvcr.io/nvidia/pytorch:24.01-py3`` becomes
    ``nvcr.io#nvidia/pytorch:24.01-py3``; Docker Hub (enroot's default) loses its registry
    and ``library/``. Raises ValueError with the reason."""
    if image.startswith(("/", ".")):
        if not _IMAGE_PATH.match(image):
            raise ValueError("a squashfs path without whitespace, quotes, '$', '\\' or ','")
        return image
    ref = image.removeprefix("docker://")
    if "@sha256:" in ref or "@sha512:" in ref:
        raise ValueError("enroot URIs take a tag, not a digest")
    user, _, ref = ref.rpartition("@")
    if user and not _USER.match(user):
        raise ValueError(f"{user!r} is not a user name")
    if "#" in ref:
        registry, _, path = ref.partition("#")
    else:
        first, _, rest = ref.partition("/")
        is_registry = rest and ("." in first or ":" in first or first == "localhost")
        registry, path = (first, rest) if is_registry else ("", ref)
    if registry and not _REGISTRY.match(registry):
        raise ValueError(f"{registry!r} is not a registry host")
    if registry in _DOCKER_HUB:
        registry = ""
        if path.startswith("library/") and path.count("/") == 1:
            path = path.removeprefix("library/")
    name, _, tag = path.partition(":")
    if not _REPO.match(name):
        raise ValueError(f"{name!r} is not an image name (lowercase, '/'-separated)")
    if tag and not _TAG.match(tag):
        raise ValueError(f"{tag!r} is not a tag")
    return (f"{user}@" if user else "") + (f"{registry}#" if registry else "") + path


def _image_digest(uri: str, submit_dir: str) -> str:
    """8 hex digits naming this image: its reference, and a squashfs file's size and mtime
    when this machine sees the file (a re-imported file then gets a new container)."""
    key = uri
    if uri.startswith(("/", ".")):
        try:
            st = os.stat(os.path.join(submit_dir, uri))
            key += f"|{st.st_size}|{st.st_mtime_ns}"
        except OSError:
            pass
    return hashlib.sha256(key.encode()).hexdigest()[:8]


# --- mounts -----------------------------------------------------------------------------------


def _mount(raw: Any, key: str, source: str | None) -> str:
    """One ``container.mounts`` entry (``SRC[:DST[:FLAGS]]`` or ``{src, dst, flags}``) rendered."""
    hint = (
        "SRC[:DST[:FLAGS]] with SRC an absolute path, 'tmpfs' or 'umount', e.g. "
        "/mnt/data:/data:ro+rprivate, or {src: /mnt/data, dst: /data, flags: [ro]}"
    )
    src: Any
    dst: Any
    if isinstance(raw, str):
        parts = raw.split(":")
        if len(parts) > 3:
            raise SpecError(
                f"{raw!r}: too many ':' (pyxis cannot mount a path holding ':')",
                file=source,
                key=key,
                hint=hint,
            )
        src, dst, flags = [*parts, None, None][:3]
        if dst == "":
            raise SpecError(f"{raw!r}: empty destination", file=source, key=key, hint=hint)
        flag_list = flags.split("+") if flags else []
    elif isinstance(raw, Mapping):
        reject_unknown(raw, ("src", "dst", "flags"), file=source, prefix=f"{key}.")
        src, dst, flags = raw.get("src"), raw.get("dst"), raw.get("flags")
        flag_list = flags.split("+") if isinstance(flags, str) else flags or []
        if (
            not isinstance(src, str)
            or not isinstance(dst, (str, type(None)))
            or not isinstance(flag_list, list)
        ):
            raise SpecError(
                "src and dst must be strings, flags a list", file=source, key=key, hint=hint
            )
    else:
        raise SpecError(
            f"expected a string or a mapping, got {raw!r}", file=source, key=key, hint=hint
        )
    special = src in ("tmpfs", "umount")
    if not special and not _PATH.match(src):
        raise SpecError(
            f"source {src!r} is not allowed",
            file=source,
            key=key,
            hint=f"{_UNSAFE_HINT}; or 'tmpfs' / 'umount'",
        )
    if not dst:
        if special:
            raise SpecError(f"{src} needs a destination", file=source, key=key, hint=f"{src}:/path")
        dst = src
    if not _PATH.match(dst):
        raise SpecError(
            f"destination {dst!r} is not allowed", file=source, key=key, hint=_UNSAFE_HINT
        )
    for flag in flag_list:
        if flag not in MOUNT_FLAGS and not (src == "tmpfs" and _TMPFS_FLAG.match(str(flag))):
            raise SpecError(
                f"unknown mount flag {flag!r}",
                file=source,
                key=key,
                hint=f"allowed flags: {', '.join(MOUNT_FLAGS)}"
                + ("; for tmpfs also size=N, mode=OCTAL, nr_inodes=N" if src == "tmpfs" else ""),
            )
    return f"{src}:{dst}" + (f":{'+'.join(flag_list)}" if flag_list else "")


def _covers(mount_dst: str, path: str) -> bool:
    return path == mount_dst or path.startswith(mount_dst.rstrip("/") + "/")


# --- the container block --------------------------------------------------------------------


def _fields(container: Any) -> dict[str, Any]:
    if isinstance(container, Mapping):
        return dict(container)
    if dataclasses.is_dataclass(container) and not isinstance(container, type):
        return {f.name: getattr(container, f.name) for f in dataclasses.fields(container)}
    raise TypeError(f"container must be a mapping or a dataclass, not {type(container).__name__}")


def _flag(
    data: Mapping[str, Any], key: str, source: str | None, default: bool | None
) -> bool | None:
    value = data.get(key, default)
    if value is not None and not isinstance(value, bool):
        raise SpecError(
            f"expected true or false, got {value!r}", file=source, key=f"container.{key}"
        )
    return value


def parse(container: Mapping[str, Any] | Any, source: str | None = None) -> Container:
    """Validate a ``container`` block (mapping or dataclass) into a :class:`Container`;
    ``SpecError`` naming ``source`` (the spec file) and the key, e.g. ``container.mounts[1]``."""
    data = _fields(container)
    reject_unknown(data, CONTAINER_KEYS, file=source, prefix="container.")
    image, uri = _image(data.get("image"), source)
    raw_mounts = data.get("mounts") or []
    if not isinstance(raw_mounts, list):
        raise SpecError(
            "must be a list of mounts",
            file=source,
            key="container.mounts",
            hint="mounts: [/mnt/data:/data:ro]",
        )
    rendered = tuple(_mount(m, f"container.mounts[{i}]", source) for i, m in enumerate(raw_mounts))
    workdir = data.get("workdir")
    if workdir not in (None, IMAGE_WORKDIR) and (
        not isinstance(workdir, str) or not _WORKDIR.match(workdir)
    ):
        raise SpecError(
            f"{workdir!r} is not an absolute path",
            file=source,
            key="container.workdir",
            hint=f"a path inside the container, e.g. /workspace, or {IMAGE_WORKDIR!r} to keep "
            "the image's WORKDIR",
        )
    name, flag = _name(data.get("name"), source)
    keep = _env_keep(data.get("env_keep") or [], source)
    return Container(
        image=image,
        uri=uri,
        mounts=list(raw_mounts),
        pyxis_mounts=rendered,
        workdir=workdir,
        env_keep=keep,
        writable=_flag(data, "writable", source, None),
        remap_root=_flag(data, "remap_root", source, None),
        mount_home=_flag(data, "mount_home", source, False),
        name=name,
        name_flag=flag,
        given=data,
    )


def _image(image: Any, source: str | None) -> tuple[str, str]:
    """``container.image`` checked: the image and its enroot URI."""
    if not isinstance(image, str) or not image:
        raise SpecError(
            "required: the image (a registry reference or a squashfs path)",
            file=source,
            key="container.image",
            hint="image: nvcr.io/nvidia/pytorch:24.01-py3 or /mnt/data/images/x.sqsh",
        )
    try:
        uri = enroot_uri(image)
    except ValueError as exc:
        raise SpecError(
            f"{image!r}: {exc}",
            file=source,
            key="container.image",
            hint="[USER@][REGISTRY/]IMAGE[:TAG] (nvcr.io/nvidia/pytorch:24.01-py3), or "
            "a squashfs path from `enroot import -o`",
        ) from None
    return image, uri


def _name(name: Any, source: str | None) -> tuple[str | None, str]:
    """``container.name`` checked: the name (None: none given) and its ``:FLAG`` ('' without)."""
    flag = ""
    if name is not None:
        given = name
        name, _, flag = name.partition(":") if isinstance(name, str) else ("", "", "")
        if not _NAME.match(name):
            raise SpecError(
                f"{given!r} is not a container name",
                file=source,
                key="container.name",
                hint="letters, digits, '_', '.', '-' (64 at most), optionally "
                f"':FLAG' with FLAG one of {', '.join(NAME_FLAGS)}",
            )
        if flag and flag not in NAME_FLAGS:
            raise SpecError(
                f"{flag!r} is not allowed",
                file=source,
                key="container.name",
                hint=f"allowed values after ':': {', '.join(NAME_FLAGS)}",
            )
    return name, flag


def _env_keep(keep: Any, source: str | None) -> tuple[str, ...]:
    """``container.env_keep`` checked: the names of the variables kept."""
    if isinstance(keep, str):
        keep = [keep]
    if not isinstance(keep, list):
        raise SpecError("must be a list of variable names", file=source, key="container.env_keep")
    for i, var in enumerate(keep):
        if not isinstance(var, str) or not _ENV.match(var):
            raise SpecError(
                f"{var!r} is not a variable name", file=source, key=f"container.env_keep[{i}]"
            )
    return tuple(keep)


def check_paths(c: Container, submit_dir: str, source: str | None) -> None:
    """Refuse a squashfs image or a bind-mount source that is missing under the submit
    directory: that directory is shared (the container mounts it), so a path in it that the
    login node lacks is missing on the compute nodes too. Paths elsewhere (node-local storage,
    filesystems only compute nodes mount, images a dependency job makes) are left to the job."""
    if not os.path.isdir(submit_dir):
        return  # not on this machine: nothing here to compare with
    paths = [("container.image", c.uri)] if c.uri.startswith(("/", ".")) else []
    paths += [
        (f"container.mounts[{i}]", m.split(":")[0])
        for i, m in enumerate(c.pyxis_mounts)
        if m.startswith("/")  # not tmpfs or umount
    ]
    inside = submit_dir.rstrip("/") + "/"
    for key, path in paths:
        full = os.path.normpath(os.path.join(submit_dir, path))
        if full.startswith(inside) and not os.path.lexists(full):
            raise SpecError(
                f"{path} does not exist (in the submit directory {submit_dir})",
                file=source,
                key=key,
                hint="a container that cannot start fails every task: check the path"
                + (
                    ", or import the image: slurmkit image import URI --to DIR"
                    if key == "container.image"
                    else ""
                ),
            )


def srun_options(
    c: Container,
    *,
    submit_dir: str | None = None,
    env_names: Iterable[str] = (),
    source: str | None = None,
) -> list[str]:
    """The ``srun`` options of a validated container block.

    ``submit_dir`` (default: the current directory) is mounted at the same path (under an
    explicit ``workdir`` too) and is the default workdir; ``workdir: image`` renders no
    ``--container-workdir``, so tasks start in the image's WORKDIR (benchmark images such as
    nccl-tests expect that). ``env_names``:
    variables the script exports that must win over the image's (a profile's, the spec's
    ``env``); with ``env_keep`` and :data:`KEEP_ALWAYS` they make
    ``--container-env``. ``source`` names the spec file in errors, and so does a squashfs image
    or a mount source that is missing where this machine can see it (:func:`check_paths`).
    """
    check_paths(c, os.path.abspath(submit_dir or os.getcwd()), source)
    opts = [f"--container-image={c.uri}"]
    mounts = list(c.pyxis_mounts)
    submit_dir = os.path.abspath(submit_dir or os.getcwd())
    workdir = c.workdir
    mountable = bool(_PATH.match(submit_dir))
    if workdir in (None, IMAGE_WORKDIR):
        if not mountable:
            raise SpecError(
                f"the submit directory {submit_dir!r} cannot be mounted by pyxis",
                file=source,
                key="container.workdir",
                hint="set container.workdir (and mount your code) explicitly",
            )
        workdir = submit_dir if workdir is None else None
    # the submit directory is mounted whatever the workdir (the self-check and the trial's
    # files need it); only a path pyxis cannot express (',' or ':') is left to the mounts
    if mountable and not any(_covers(m.split(":")[1], submit_dir) for m in mounts):
        mounts.append(f"{submit_dir}:{submit_dir}")
    if mounts:
        opts.append(f"--container-mounts={','.join(mounts)}")
    if workdir is not None:
        opts.append(f"--container-workdir={workdir}")
    if c.name is not None:
        digest = _image_digest(c.uri, submit_dir)
        # the job id (filled in by the runtime) keeps jobs from sharing a container: tasks
        # starting at once on a node raced to create one, and a half-made one stayed broken
        flag = f":{c.name_flag}" if c.name_flag else ""
        opts.append(f"--container-name={c.name}-{digest}-{{job_id}}{flag}")
    names = list(dict.fromkeys([*KEEP_ALWAYS, *c.env_keep, *env_names]))
    opts.append(f"--container-env={','.join(names)}")
    for value, on, off in (
        (c.writable, "container-writable", "container-readonly"),
        (c.remap_root, "container-remap-root", "no-container-remap-root"),
        (c.mount_home, "container-mount-home", "no-container-mount-home"),
    ):
        if value is not None:
            opts.append(f"--{on if value else off}")
    return opts


# --- checking rendered options --------------------------------------------------------------


def _check_value(name: str, value: str) -> None:
    """Raise ValueError if ``value`` is not valid syntax for option ``name``."""
    if name == "container-image":
        if enroot_uri(value) != value:
            raise ValueError(f"not in [USER@][REGISTRY#]IMAGE[:TAG] form: {enroot_uri(value)!r}")
    elif name == "container-mounts":
        for i, entry in enumerate(value.split(",")):
            try:
                _mount(entry, f"entry {i}", None)
            except SpecError as exc:
                raise ValueError(f"entry {i}: {exc.message}") from None
    elif name == "container-workdir":
        if not _WORKDIR.match(value):
            raise ValueError("not an absolute path")
    elif name == "container-save":
        if not _WORKDIR.match(value) or value.endswith("/"):
            raise ValueError("not an absolute file path")
    elif name == "container-name":
        base, _, flag = value.partition(":")
        if not _RENDERED_NAME.match(base) or (flag and flag not in NAME_FLAGS):
            raise ValueError(f"not NAME[:{'|'.join(NAME_FLAGS)}]")
    elif name == "container-env" and not all(_ENV.match(v) for v in value.split(",")):
        raise ValueError("not a comma-separated list of variable names")
    elif name == "container-unshare" and not all(v in UNSHARE for v in value.split(",")):
        raise ValueError(f"namespaces are {', '.join(UNSHARE)}")


def validate_option(opt: str, version: str = PYXIS_VERSION) -> Option:
    """Check one rendered ``--container-*`` option (``--name`` or ``--name=value``) against
    pyxis ``version``: a known option, a value exactly when it takes one, in its syntax.
    Returns the :class:`Option`; raises ValueError saying what is wrong."""
    name, eq, value = opt.removeprefix("--").partition("=")
    option = OPTIONS.get(name)
    if not opt.startswith("--") or option is None:
        raise ValueError(f"{opt!r}: not a pyxis option")
    if _version(option.since) > _version(version):
        raise ValueError(f"{opt!r}: needs pyxis {option.since}, not {version}")
    if option.value is None and eq:
        raise ValueError(f"{opt!r}: --{name} takes no value")
    if option.value is not None and not value:
        raise ValueError(f"{opt!r}: --{name} needs a value: {option.value}")
    if eq:
        try:
            _check_value(name, value)
        except ValueError as exc:
            raise ValueError(f"{opt!r}: {exc}") from None
        flag = value.partition(":")[2] if name == "container-name" else ""
        if flag and _version(NAME_FLAGS[flag]) > _version(version):
            raise ValueError(f"{opt!r}: ':{flag}' needs pyxis {NAME_FLAGS[flag]}, not {version}")
    return option
