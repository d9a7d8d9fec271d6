"""``slurmkit doctor``: will this cluster run slurmkit's jobs as they should? Checks from the
login node, each ok / warn / fail with a one-line hint for the fix.

:func:`gather` asks the cluster (a handful of commands, run at once); :func:`checks` is a
pure function of what it found, so that every case is tested without a cluster that has it.
With ``nodes``, a tiny job also checks the compute nodes: the Python the batch scripts name,
enroot, and that ``output_root`` is the same shared directory there (a token written there
and read back here).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .core import badnodes, fsutil
from .core.release import ENV_PARTITION, GAP, hold_seconds, newer
from .runtime.releaser import off, shape

OK, WARN, FAIL = "ok", "warn", "fail"
# How far back doctor looks for the nodes your sweeps blamed (seconds).
SUSPECTS_SINCE = 7 * 86400


@dataclass(frozen=True)
class Check:
    name: str
    level: str  # ok, warn or fail
    detail: str
    hint: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass
class Facts:
    """What :func:`gather` found (every field may be missing: a command that is absent)."""

    tools: dict[str, bool] = field(default_factory=dict)  # sbatch, squeue, ... on PATH
    version: str | None = None  # sinfo --version
    ping: str | None = None  # scontrol ping's answer; None: it failed
    config: dict[str, str] = field(default_factory=dict)  # scontrol show config
    partitions: list[tuple[str, str, str]] = field(default_factory=list)  # name, GRES, avail
    srun_help: str = ""  # srun --help: pyxis adds its options there
    sacct: bool | None = None  # sacct answers
    submit_limit: str | None = None  # the user's tightest MaxSubmitJobs, in words
    output_root: str = "runs"
    output_writable: bool = False
    user_config: str = ""  # its path
    user_config_error: str | None = None
    profile: str | None = None
    nodes: dict[str, Any] | None = None  # what the tiny job saw (with --nodes)
    conf_missing: str | None = None  # SLURM_CONF names a file that is not there
    suspects: list[dict[str, Any]] = field(default_factory=list)  # nodes your sweeps blamed
    # sbatch --test-only of a releaser job: its exit code and the last line it said
    releaser: tuple[int, str] | None = None


TOOLS = ("sbatch", "squeue", "scontrol", "scancel", "sacct", "sinfo", "srun")


def _releaser_shape(partition: str | None) -> list[str]:
    """The releaser job's options as a job in ``partition`` (doctor's ``--partition``; the
    default partition when None) would submit it (runtime/releaser.py)."""
    return shape(
        {"SLURM_JOB_PARTITION": partition or "", ENV_PARTITION: os.environ.get(ENV_PARTITION, "")}
    )


def _run(argv: Sequence[str], timeout: float = 20) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        return None


def _on_path(tool: str) -> bool:
    from .backends.slurm import available

    return available(tool)


def gather(output_root: str = "runs", nodes: int = 0, partition: str | None = None) -> Facts:
    """Ask the cluster what :func:`checks` needs (and, with ``nodes``, run the tiny job)."""
    from .backends.slurm import read_config, start_config
    from .errors import SchedulerError

    facts = Facts(tools={t: _on_path(t) for t in TOOLS}, output_root=output_root)
    conf = os.environ.get("SLURM_CONF")
    if not facts.tools["sinfo"] or (conf and not os.path.exists(conf)):
        facts.ping = None if facts.tools["sinfo"] else facts.ping
        facts.conf_missing = conf if conf and not os.path.exists(conf) else None
        _local_facts(facts)
        return facts
    procs = {
        "version": ["sinfo", "--version"],
        "ping": ["scontrol", "ping"],
        "partitions": ["sinfo", "--noheader", "--format=%R|%G|%a"],
        "srun": ["srun", "--help"],
        "sacct": ["sacct", "--noheader", "-X", "--starttime=now-1minutes", "--format=JobID"],
        "releaser": ["sbatch", "--test-only", *_releaser_shape(partition), "--wrap=true"],
    }
    started = {
        k: subprocess.Popen(v, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for k, v in procs.items()
        if facts.tools.get(v[0])
    }
    try:
        facts.config = read_config(start_config(20))
    except SchedulerError:
        facts.config = {}
    out = {}
    for key, proc in started.items():
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout = stderr = ""
        out[key] = (proc.returncode, stdout, stderr)
    if out.get("version", (1, ""))[0] == 0:
        facts.version = out["version"][1].strip()
    if out.get("ping", (1, ""))[0] == 0:
        facts.ping = out["ping"][1].strip()
    if out.get("partitions", (1, ""))[0] == 0:
        rows = [line.split("|") for line in out["partitions"][1].splitlines() if line.strip()]
        facts.partitions = sorted({(r[0], r[1], r[2]) for r in rows if len(r) == 3})
    facts.srun_help = out.get("srun", (1, ""))[1]
    facts.sacct = out["sacct"][0] == 0 if "sacct" in out else None
    if "releaser" in out:  # sbatch --test-only says what it would do on stderr
        rc, _, said = out["releaser"]
        facts.releaser = (rc, (said.strip().splitlines() or [""])[-1])
    if "slurmdbd" in facts.config.get("AccountingStorageType", ""):
        from .backends.slurm import headroom

        room = headroom(None, None)
        if room is not None:
            facts.submit_limit = f"{room[0].jobs} jobs ({room[0].source}); {room[1]} queued now"
    _local_facts(facts)
    if nodes and facts.ping:
        facts.nodes = _node_job(facts.output_root, nodes, partition)
    return facts


def _local_facts(facts: Facts) -> None:
    from .spec.layers import user_config, user_config_path

    facts.output_writable = _writable(facts.output_root)
    facts.suspects = badnodes.recent(facts.output_root, time.time() - SUSPECTS_SINCE)
    facts.user_config = user_config_path()
    try:
        data, _ = user_config()
        profile = data.get("profile") if isinstance(data, dict) else None
        facts.profile = profile if isinstance(profile, str) else None
    except Exception as exc:  # a damaged user config: say so, do not crash the doctor
        facts.user_config_error = str(exc).splitlines()[0]


def _writable(root: str) -> bool:
    try:
        os.makedirs(root, exist_ok=True)
        path = os.path.join(root, f".slurmkit-doctor-{os.getpid()}")
        fsutil.atomic_write_bytes(path, b"ok\n", fsync=False)
        os.unlink(path)
        return True
    except OSError:
        return False


# The tiny job: each node says which Python it has, whether enroot is there, and writes the token
_NODE_SCRIPT = r"""
tok="$1"; root="$2"; py="$3"
host=$(hostname)
pyok=no; [ -x "$py" ] && "$py" -c 'import slurmkit.runtime' 2>/dev/null && pyok=yes
en=no; command -v enroot >/dev/null 2>&1 && en=yes
printf '%s\n' "$tok" > "$root/.slurmkit-doctor-$tok-$host" 2>/dev/null && wr=yes || wr=no
echo "node=$host python=$pyok enroot=$en wrote=$wr"
"""


def _node_job(root: str, nodes: int, partition: str | None) -> dict[str, Any]:
    token = os.urandom(6).hex()
    root = os.path.abspath(root)
    python = os.environ.get("SLURMKIT_PYTHON") or sys.executable
    argv = [
        "srun",
        f"--nodes={nodes}",
        "--ntasks-per-node=1",
        "--time=2",
        "--job-name=slurmkit-doctor",
    ]
    if partition:
        argv.append(f"--partition={partition}")
    proc = _run([*argv, "sh", "-c", _NODE_SCRIPT, "doctor", token, root, python], timeout=180)
    seen: list[dict[str, str]] = []
    if proc is not None and proc.returncode == 0:
        for line in proc.stdout.splitlines():
            seen.append(dict(re.findall(r"(\w+)=(\S+)", line)))
    read_back = []
    for entry in seen:
        path = os.path.join(root, f".slurmkit-doctor-{token}-{entry.get('node', '')}")
        try:
            with open(path, encoding="utf-8") as fh:
                read_back.append(fh.read().strip() == token)
            os.unlink(path)
        except OSError:
            read_back.append(False)
    return {
        "asked": nodes,
        "python": python,
        "seen": seen,
        "shared": bool(seen) and all(read_back),
        "error": ""
        if proc is not None and proc.returncode == 0
        else (
            (proc.stderr.strip().splitlines() or ["srun failed"])[-1]
            if proc
            else "srun did not finish"
        ),
    }


def checks(f: Facts) -> list[Check]:
    """Every check, from what :func:`gather` found (pure): the controller's first (the rest need
    one that answers), then the cluster's, the configuration's, the nodes' and this machine's."""
    out = _controller_checks(f)
    if out[-1].level == FAIL:
        return out + _local_checks(f)
    out += _cluster_checks(f)
    out += [_preemption(f.config), _requeue(f.config), requeue_hold(f.config, f.version)]
    if f.releaser is not None:
        out.append(releaser_job(f.releaser))
    out += [_accounting(f), _pyxis(f.srun_help)]
    if f.nodes is not None:
        out += _node_checks(f.nodes)
    return out + _local_checks(f)


def _controller_checks(f: Facts) -> list[Check]:
    """Slurm's commands and the controller: a failed one ends the list (the last one FAIL)."""
    missing = [t for t in TOOLS if not f.tools.get(t)]
    if "sbatch" in missing or "squeue" in missing:
        return [
            Check(
                "slurm commands",
                FAIL,
                f"missing: {', '.join(missing)}",
                "run on a Slurm login node (or use --backend local)",
            )
        ]
    out = [
        Check(
            "slurm commands",
            WARN if missing else OK,
            f"{f.version or 'version unknown'}"
            + (f"; missing: {', '.join(missing)}" if missing else ""),
            "install Slurm's client tools" if missing else "",
        )
    ]
    if f.conf_missing:
        out.append(
            Check(
                "controller",
                FAIL,
                f"SLURM_CONF={f.conf_missing} does not exist",
                "point SLURM_CONF at the cluster's slurm.conf, or unset it",
            )
        )
    elif f.ping is None or "DOWN" in f.ping:
        out.append(
            Check(
                "controller",
                FAIL,
                f.ping or "scontrol ping failed",
                "is slurmctld up? check SLURM_CONF",
            )
        )
    else:
        out.append(Check("controller", OK, f.ping.splitlines()[0]))
    return out


def _cluster_checks(f: Facts) -> list[Check]:
    """Partitions, GRES and the limits of arrays and jobs."""
    up = [p for p in f.partitions if p[2] == "up"]
    gres = sorted({g for _, g, _ in f.partitions if g not in ("(null)", "")})
    c = f.config
    limits = ", ".join(f"{k}={c[k]}" for k in ("MaxArraySize", "MaxJobCount") if k in c)
    return [
        Check(
            "partitions",
            OK if up else FAIL,
            ", ".join(p[0] for p in f.partitions) or "none",
            "" if up else "no partition is up: ask the admins",
        ),
        Check(
            "GRES",
            OK if gres else WARN,
            ", ".join(gres) or "no GRES (no GPUs to ask for)",
            "" if gres else "gpus_per_node needs GresTypes=gpu and Gres= on the nodes",
        ),
        Check("limits", OK, limits + (f"; you: {f.submit_limit}" if f.submit_limit else "")),
    ]


def _preemption(c: dict[str, str]) -> Check:
    """Whether a preempted job is requeued, and signalled first (so that it checkpoints)."""
    mode = c.get("PreemptMode", "")
    signals = "preempt_send_user_signal" in c.get("SlurmctldParameters", "")
    preempt = c.get("PreemptType", "preempt/none")
    if preempt.endswith("none") or mode.upper() in ("OFF", ""):
        return Check("preemption", OK, "none configured")
    if "CANCEL" in mode.upper():
        return Check(
            "preemption",
            WARN,
            f"PreemptMode={mode}: preempted jobs are cancelled",
            "requeue is moot there: ask for PreemptMode=REQUEUE",
        )
    if not signals:
        return Check(
            "preemption",
            WARN,
            f"PreemptMode={mode} without preempt_send_user_signal",
            "preempted jobs get no USR2, so nothing checkpoints: ask for "
            "SlurmctldParameters=preempt_send_user_signal",
        )
    return Check("preemption", OK, f"PreemptMode={mode}, the job is signalled first")


def _requeue(c: dict[str, str]) -> Check:
    """Whether the cluster requeues jobs (JobRequeue)."""
    requeue = c.get("JobRequeue")
    return Check(
        "requeue",
        OK if requeue != "0" else WARN,
        f"JobRequeue={requeue or '?'}"
        + (" (slurmkit's scripts pass --requeue)" if requeue == "0" else ""),
        "" if requeue != "0" else "plain sbatch scripts without --requeue are not requeued",
    )


def requeue_hold(c: dict[str, str], version: str | None) -> Check:
    """How long a requeued job waits before it may start again: ``requeue_delay`` where Slurm
    has it (25.11+), else ``cred_expire`` + 1 s (``batch_requeue_fini``), and the admin's fix.
    slurmkit's releasers start its own jobs again ~2 s after a requeue whatever it is."""
    hold, why = hold_seconds(c, version)
    fix = (
        "an admin can shorten it: SchedulerParameters=requeue_delay=2"
        if newer(c.get("SLURM_VERSION") or version or "")
        else "Slurm before 25.11 sets it from AuthInfo cred_expire (at least 5 s; it also "
        "bounds how long a step's launch credential is good); 25.11 adds "
        "SchedulerParameters=requeue_delay"
    )
    released = (
        "; slurmkit releases its own requeued jobs from it ~2 s after they stop"
        if hold > GAP and not off()
        else ""
    )
    return Check(
        "requeue hold",
        OK,
        f"a requeued job waits {hold} s before it may start again ({why}){released}",
        fix if hold > 10 else "",
    )


def releaser_job(test: tuple[int, str]) -> Check:
    """Whether sbatch takes the releaser (1 CPU, a few minutes) that starts a requeued job again
    within seconds; where it refuses, requeued jobs wait out Slurm's hold."""
    code, said = test
    if code == 0 or off():
        why = "off (SLURMKIT_NO_RELEASE)" if off() else "sbatch takes it"
        return Check("releaser", OK, f"the releaser job of a requeue (1 CPU, minutes): {why}")
    where = os.environ.get(ENV_PARTITION)
    return Check(
        "releaser",
        WARN,
        "sbatch refuses the releaser job of a requeue (1 CPU, minutes"
        + (f", {ENV_PARTITION}={where}" if where else "")
        + f"): {said or f'exit {code}'}; requeued jobs wait out Slurm's hold",
        f"set {ENV_PARTITION}=PARTITION (one that takes 1-CPU jobs) in the environment you "
        "submit from",
    )


def _accounting(f: Facts) -> Check:
    """Whether sacct answers (exit codes of jobs gone from the queue, ``slurmkit report``)."""
    acct = f.config.get("AccountingStorageType", "")
    if f.sacct:
        return Check("accounting", OK, acct or "sacct answers")
    return Check(
        "accounting",
        WARN,
        f"{acct or 'none'}: sacct does not answer",
        "exit codes of jobs gone from the queue (MinJobAge) are unknown; "
        "`slurmkit report` needs accounting",
    )


def _pyxis(help_text: str) -> Check:
    from .pyxis import OPTIONS, PYXIS_VERSION

    have = [name for name in OPTIONS if f"--{name}" in help_text]
    if not have:
        return Check(
            "pyxis",
            WARN,
            "srun has no --container-image: no pyxis",
            "container jobs need NVIDIA's pyxis SPANK plugin on the cluster",
        )
    missing = [n for n in OPTIONS if n not in have]
    since = max((OPTIONS[n].since for n in have), key=lambda v: tuple(map(int, v.split("."))))
    detail = f"{len(have)} of {len(OPTIONS)} options (pyxis >= {since})"
    if missing:
        detail += f"; missing: {', '.join('--' + n for n in missing)}"
    return Check(
        "pyxis",
        OK if not missing else WARN,
        detail,
        "" if not missing else f"slurmkit knows pyxis up to {PYXIS_VERSION}",
    )


def _node_checks(n: dict[str, Any]) -> list[Check]:
    seen = n.get("seen") or []
    if not seen:
        return [
            Check(
                "compute nodes",
                FAIL,
                n.get("error") or "the tiny job saw no node",
                "check the partition and your limits; `srun -N1 hostname` should work",
            )
        ]
    out = []
    nopy = [s.get("node", "?") for s in seen if s.get("python") != "yes"]
    out.append(
        Check(
            "node python",
            FAIL if nopy else OK,
            f"{n['python']} runs slurmkit.runtime on {len(seen) - len(nopy)} of {len(seen)} nodes"
            + (f"; not on {', '.join(nopy)}" if nopy else ""),
            "set SLURMKIT_PYTHON to a Python with slurmkit on the nodes" if nopy else "",
        )
    )
    noen = [s.get("node", "?") for s in seen if s.get("enroot") != "yes"]
    out.append(
        Check(
            "node enroot",
            WARN if noen else OK,
            f"enroot on {len(seen) - len(noen)} of {len(seen)} nodes",
            "container jobs need enroot on every node" if noen else "",
        )
    )
    out.append(
        Check(
            "shared output_root",
            OK if n.get("shared") else FAIL,
            "the nodes' token was read back here"
            if n.get("shared")
            else "a token the nodes wrote is not here",
            "" if n.get("shared") else "output_root must be on the shared filesystem",
        )
    )
    return out


def _local_checks(f: Facts) -> list[Check]:
    out = [
        Check(
            "output_root",
            OK if f.output_writable else FAIL,
            f"{os.path.abspath(f.output_root)} "
            + ("is writable" if f.output_writable else "is not writable"),
            "" if f.output_writable else "set output_root to a shared directory you can write",
        )
    ]
    if f.user_config_error:
        out.append(Check("user config", FAIL, f.user_config_error, f"fix {f.user_config}"))
    else:
        there = os.path.isfile(f.user_config)
        out.append(
            Check(
                "user config",
                OK,
                (f.user_config if there else "none")
                + (f"; profile {f.profile}" if f.profile else ""),
            )
        )
    return out + _suspects(f.suspects)


def _suspects(rows: Sequence[dict[str, Any]]) -> list[Check]:
    """The nodes your recent sweeps blamed for failures (none: no line)."""
    if not rows:
        return []
    shown = "; ".join(
        f"{r['node']}: {r['failures']} failure(s) in {len(r['sweeps'])} sweep(s)"
        + (f", excluded in {r['excluded_in']}" if r["excluded_in"] else "")
        + f" ({r.get('evidence', '')[:80]})"
        for r in rows[:5]
    )
    more = f"; and {len(rows) - 5} more" if len(rows) > 5 else ""
    return [
        Check(
            "suspect nodes",
            WARN,
            f"your sweeps of the last 7 days blamed {shown}{more}",
            "tell your admins (the evidence is in each sweep's `slurmkit status`); your sweeps "
            "avoid a node once it is excluded",
        )
    ]


def run(output_root: str = "runs", nodes: int = 0, partition: str | None = None) -> list[Check]:
    """Gather, then check."""
    return checks(gather(output_root, nodes, partition))
