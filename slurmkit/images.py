"""Pre-staging container images as squashfs files on the shared filesystem (``enroot import``)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from .errors import SchedulerError, UserError
from .pyxis import enroot_uri


@dataclass(frozen=True)
class Staged:
    path: str
    created: bool  # False: it was already there


def staged_name(uri: str) -> str:
    """enroot's file name for an image: ``nvcr.io#nvidia/pytorch:24.01-py3`` ->
    ``nvcr.io+nvidia+pytorch+24.01-py3.sqsh``."""
    return re.sub(r"[#/:@]", "+", uri.removeprefix("docker://")) + ".sqsh"


def import_image(image: str, directory: str) -> Staged:
    """``enroot import -o`` into ``directory``, atomically; skip an image already staged."""
    try:
        uri = enroot_uri(image)
    except ValueError as exc:
        raise UserError(f"{image!r}: {exc}", key="URI") from None
    if uri.startswith(("/", ".")):
        raise UserError(f"{image!r} is a path, not a registry image", key="URI")
    directory = os.path.abspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise UserError(f"{directory} exists and is not a directory", key="--to")
    target = os.path.join(directory, staged_name(uri))
    if os.path.isfile(target):
        return Staged(target, created=False)
    if shutil.which("enroot") is None:
        raise UserError(
            "enroot is not installed here; it is needed to import images",
            hint="run it on a compute node: srun -N1 slurmkit image import ...",
        )
    os.makedirs(os.path.dirname(target), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".import-", suffix=".sqsh", dir=os.path.dirname(target))
    os.close(fd)
    os.unlink(tmp)  # enroot refuses to overwrite
    try:
        proc = subprocess.run(
            ["enroot", "import", "-o", tmp, f"docker://{uri}"], capture_output=True, text=True
        )
        if proc.returncode != 0:
            lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
            raise SchedulerError(f"enroot import failed: {lines[-1] if lines else proc.returncode}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return Staged(target, created=True)
