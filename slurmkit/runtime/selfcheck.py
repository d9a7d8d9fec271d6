"""``python -m slurmkit.runtime.selfcheck [PATH]``: is this task's environment fit to train?

The by-hand form of the container self-check (container jobs run ``selfcheck.sh``, which
needs only a POSIX shell in the image), for a node or image with slurmkit. Checks:

* ``torch``: it imports;
* ``gpus``: torch sees as many GPUs as the allocation gives this task: ``CUDA_VISIBLE_DEVICES``
  (set by Slurm per task), else ``SLURM_GPUS_ON_NODE``, else ``SLURM_GPUS_PER_NODE``; inside a
  Slurm job with none of them, a CPU-only allocation, so 0;
* ``nccl``: its version, when torch sees GPUs;
* ``path``: the shared filesystem path (PATH, else ``SLURMKIT_SWEEP_DIR``, else
  ``SLURM_SUBMIT_DIR``) is a directory where a file can be written, fsynced, read back and
  deleted.

Exit codes: **0** all passed (one ``selfcheck OK: ...`` line on stdout); **3** a check failed
(one ``selfcheck FAILED: CHECK: ...`` line per failed check on stderr); 2 usage error.
"""

from __future__ import annotations

import argparse
import os
import secrets
import socket
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType

EXIT_FAILED = 3


@dataclass(frozen=True)
class Check:
    """One check's outcome: ``detail`` says what was seen (or what is wrong)."""

    name: str
    ok: bool
    detail: str


def _count_devices(value: str) -> int:
    """Entries of a CUDA_VISIBLE_DEVICES value up to the first one CUDA stops at."""
    count = 0
    for item in value.split(","):
        item = item.strip()
        if not item or item == "NoDevFiles" or item.startswith("-"):
            break
        count += 1
    return count


def expected_gpus(env: Mapping[str, str]) -> tuple[int | None, str]:
    """GPUs this task should see, and the variable that says so; ``None`` outside Slurm
    with no hint."""
    if "CUDA_VISIBLE_DEVICES" in env:
        value = env["CUDA_VISIBLE_DEVICES"]
        return _count_devices(value), f"CUDA_VISIBLE_DEVICES={value}"
    if env.get("SLURM_GPUS_ON_NODE"):
        return int(env["SLURM_GPUS_ON_NODE"]), f"SLURM_GPUS_ON_NODE={env['SLURM_GPUS_ON_NODE']}"
    if env.get("SLURM_GPUS_PER_NODE"):  # "8", "h100:8", "a100:2,v100:1"
        value = env["SLURM_GPUS_PER_NODE"]
        return sum(
            int(p.rsplit(":", 1)[-1]) for p in value.split(",")
        ), f"SLURM_GPUS_PER_NODE={value}"
    if env.get("SLURM_JOB_ID"):
        return 0, "a CPU-only allocation"
    return None, "not in a Slurm job"


def check_torch() -> tuple[Check, ModuleType | None]:
    try:
        with warnings.catch_warnings():  # an image without numpy: torch warns, nothing fails
            warnings.filterwarnings("ignore", message=".*NumPy.*")
            import torch
    except Exception as exc:  # ImportError, or OSError from a missing library
        return Check("torch", False, f"cannot import torch: {exc}"), None
    return Check("torch", True, f"torch {torch.__version__}"), torch


def check_gpus(torch: ModuleType, env: Mapping[str, str]) -> Check:
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    want, why = expected_gpus(env)
    if want is None or seen == want:
        return Check("gpus", True, f"{seen} GPU{'s' if seen != 1 else ''} ({why})")
    hint = (
        "is the image built with NVIDIA_VISIBLE_DEVICES (enroot's GPU hook) and the driver "
        "on the node?"
        if seen < want
        else "the task sees GPUs it was not given"
    )
    return Check(
        "gpus",
        False,
        f"torch sees {seen} GPU{'s' if seen != 1 else ''}, the "
        f"allocation gives {want} ({why}): {hint}",
    )


def check_nccl(torch: ModuleType) -> Check:
    try:
        version = torch.cuda.nccl.version()
    except Exception as exc:  # a build without NCCL, a broken library
        return Check("nccl", False, f"no NCCL: {exc}")
    if isinstance(version, int):  # old torch: 2708 -> 2.7.8
        version = (version // 1000, version // 100 % 10, version % 100)
    return Check("nccl", True, "NCCL " + ".".join(str(v) for v in version))


def check_path(path: str) -> Check:
    """Write, fsync, read back and delete a small file in ``path``."""
    if not os.path.isdir(path):
        return Check("path", False, f"{path}: not a directory here: is it mounted?")
    name = os.path.join(
        path, f".slurmkit-selfcheck-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
    )
    payload = secrets.token_bytes(64)
    action = "create a file in"
    created = False
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        created = True
        try:
            action = "write to"
            os.write(fd, payload)
            action = "fsync a file in"
            os.fsync(fd)
        finally:
            os.close(fd)
        action = "read back a file in"
        with open(name, "rb") as fh:
            if fh.read() != payload:
                return Check(
                    "path", False, f"{path}: a file read back differs from the one written"
                )
        action = "delete a file in"
        os.unlink(name)
        created = False
    except OSError as exc:
        return Check("path", False, f"{path}: cannot {action} it: {exc.strerror or exc}")
    finally:
        if created:
            try:
                os.unlink(name)
            except OSError:
                pass
    return Check("path", True, f"{path} writable")


def run(path: str | None = None, env: Mapping[str, str] | None = None) -> list[Check]:
    """All checks (those that need torch only when it imports)."""
    env = os.environ if env is None else env
    first, torch = check_torch()
    checks = [first]
    if torch is not None:
        checks.append(check_gpus(torch, env))
        if torch.cuda.is_available() and torch.cuda.device_count():
            checks.append(check_nccl(torch))
    path = path or env.get("SLURMKIT_SWEEP_DIR") or env.get("SLURM_SUBMIT_DIR")
    checks.append(check_path(path) if path else Check("path", True, "no shared path given"))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m slurmkit.runtime.selfcheck",
        description="Check torch, GPUs, NCCL and the shared filesystem; exit 3 if one fails.",
    )
    parser.add_argument(
        "path",
        nargs="?",
        help="shared directory to test (default: $SLURMKIT_SWEEP_DIR, else $SLURM_SUBMIT_DIR)",
    )
    args = parser.parse_args(argv)
    checks = run(args.path)
    failed = [c for c in checks if not c.ok]
    for c in failed:
        print(f"selfcheck FAILED: {c.name}: {c.detail}", file=sys.stderr, flush=True)
    if failed:
        return EXIT_FAILED
    where = socket.gethostname() + (
        f" rank {os.environ['SLURM_PROCID']}" if "SLURM_PROCID" in os.environ else ""
    )
    print(f"selfcheck OK: {where}: " + ", ".join(c.detail for c in checks), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
