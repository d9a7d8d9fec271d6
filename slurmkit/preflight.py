"""``slurmkit preflight``: will this cluster run a big job? A short job on N nodes measures the
shared filesystem, a checkpoint round trip, the GPUs against the allocation, an all_reduce
across every rank, and whether the requeue signal reaches the job.

:func:`job` builds the job as a spec file's would be (profile < user config < this job <
overrides), so containers, accounts and the requeue signal come the usual way; :func:`run`
submits it through the renderer and the Slurm backend, waits until every rank of
``python -m slurmkit.runtime.preflight`` is ready, sends the requeue signal to the batch shell
(``scancel --batch --signal``), waits for the end and reads the ranks' files. :func:`judge` is
a pure function of those files: ok / warn / fail rows, as ``slurmkit doctor`` prints them.
Everything stays in ``OUTPUT_ROOT/preflight-TIME/`` (``preflight.json``: the verdict).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .core import states
from .core.fsutil import atomic_write_json, read_json
from .doctor import FAIL, OK, WARN, Check
from .errors import UserError
from .runtime.preflight import rank_file, ready_file

if TYPE_CHECKING:
    from .spec import SweepSpec

NAME = "preflight"
SOURCE = "slurmkit preflight"  # the "file" of errors in what the command itself sets
SIGNAL_WAIT = 120  # seconds each rank waits for the requeue signal once it is ready
READY = "ready"  # every rank is waiting for the signal
_CAUSES = ("preemption", "timeout", "node_failure", "container", "error")


@dataclass(frozen=True)
class Thresholds:
    """What the user asked for: GB/s (10^9 bytes per second); None: not judged."""

    min_fs_gbps: float | None = None
    min_busbw: float | None = None


@dataclass(frozen=True)
class Expect:
    """What the job should show: its ranks, nodes, GPUs per node and requeue signal."""

    nodes: int
    ranks: int
    gpus_per_node: int
    signal: str


@dataclass
class Result:
    """One preflight: where it ran, what each rank wrote and the verdict."""

    sweep_dir: str
    job_id: str
    state: str
    expect: Expect
    thresholds: Thresholds
    ranks: list[dict[str, Any]]
    checks: list[Check]
    sent: dict[str, Any] = field(default_factory=dict)

    @property
    def failed(self) -> bool:
        return any(c.level == FAIL for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        first = next((r for r in self.ranks if "allreduce" in r), {})
        return {
            "sweep_dir": self.sweep_dir,
            "job_id": self.job_id,
            "state": self.state,
            "ok": not self.failed,
            "checks": [c.as_dict() for c in self.checks],
            "nodes": nodes(self.ranks),
            "allreduce": first.get("allreduce"),
            "expect": dataclasses.asdict(self.expect),
            "thresholds": dataclasses.asdict(self.thresholds),
            "signal_sent": self.sent,
            "ranks": self.ranks,
        }


def job(
    nodes: int = 2,
    *,
    partition: str | None = None,
    gpus_per_node: int | None = None,
    output_root: str | None = None,
    overrides: Sequence[str] = (),
    fs_mib: int = 1024,
    files: int = 1000,
    checkpoint_mib: int = 256,
    sizes: str | None = None,
) -> SweepSpec:
    """The preflight job: one task per GPU (or per node), ``srun``-launched, run once (no
    requeue budget: an interruption is a finding, not something to retry)."""
    from . import spec as spec_mod

    command = [
        "python",
        "-m",
        "slurmkit.runtime.preflight",
        f"--fs-mib={fs_mib}",
        f"--files={files}",
        f"--checkpoint-mib={checkpoint_mib}",
        f"--signal-wait={SIGNAL_WAIT}",
        *([f"--sizes={sizes}"] if sizes else []),
    ]
    resources: dict[str, Any] = {"nodes": nodes, "time": "0:15:00"}
    if partition is not None:
        resources["partition"] = partition
    if gpus_per_node is not None:
        resources["gpus"] = gpus_per_node
    data: dict[str, Any] = {
        "name": NAME,
        "command": command,
        "args": "none",
        "launcher": "srun",
        "resources": resources,
        "requeue": {"budgets": dict.fromkeys(_CAUSES, 0)},
    }
    if output_root is not None:
        data["output_root"] = output_root
    with tempfile.TemporaryDirectory(prefix="slurmkit-preflight-") as tmp:
        path = os.path.join(tmp, "preflight.yaml")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(data))  # JSON is YAML: the loader of spec files
        try:
            loaded = spec_mod.load(path, overrides, job=True)
        except UserError as exc:
            if exc.file == path:
                exc.file = SOURCE
            raise
    return dataclasses.replace(loaded, source=SOURCE)


def expectation(spec: SweepSpec) -> Expect:
    """What :func:`job`'s spec (with the user's layers) should show in the ranks' files."""
    r = spec.resources
    per_node = r.gpu_count or r.tasks_per_node
    return Expect(r.nodes, r.nodes * per_node, r.gpu_count, spec.requeue.signal)


def dry_run(spec: SweepSpec) -> list[str]:
    """The batch script the preflight would submit; nothing is created, no cluster asked
    (without one, the script is rendered all the same)."""
    from . import sweep

    return sweep.submit(spec, backend="auto", dry_run=True).scripts


def run(
    spec: SweepSpec,
    thresholds: Thresholds,
    *,
    timeout: float = 3600,
    say: Callable[[str], None] = lambda _text: None,
) -> Result:
    """Submit the preflight job, send it the requeue signal once every rank is ready, wait for
    its end (cancelling it after ``timeout`` s, queue time included), judge, and store the
    verdict as ``SWEEP_DIR/preflight.json``."""
    from . import sweep
    from .errors import SchedulerError

    try:
        submitted = sweep.submit(spec, backend="slurm")
    except SchedulerError as exc:  # no --backend here: a preflight is of a Slurm cluster
        exc.hint = (exc.hint or "").replace(", or use --backend local", "") or None
        raise
    root = submitted.sweep_dir
    job_id = f"{submitted.jobs[0]['job_id']}_0"  # one array of one task
    expect = expectation(spec)
    out = os.path.join(root, "ranks")
    say(f"job {job_id} submitted: {expect.ranks} rank(s) on {expect.nodes} node(s); {root}")
    deadline = time.monotonic() + timeout
    sent: dict[str, Any] = {}
    try:
        state = _wait(root, lambda: _ready(out, expect.ranks), deadline)
        if state == READY:
            say(f"every rank is ready: sending {expect.signal} to the batch shell")
            sent = send_signal(job_id, expect.signal)
            state = _wait(root, lambda: False, deadline)
    except BaseException:  # Ctrl-C included: leave no job behind
        _cancel(root)
        raise
    if state is None:
        _cancel(root)
        state = f"not finished after {timeout:g} s (cancelled)"
    ranks = read_ranks(out, expect.ranks)
    result = Result(
        root,
        job_id,
        state,
        expect,
        thresholds,
        ranks,
        judge(ranks, expect, thresholds, state, sent, root),
        sent,
    )
    atomic_write_json(os.path.join(root, "preflight.json"), result.as_dict())
    return result


def _ready(out: str, ranks: int) -> bool:
    return all(os.path.exists(ready_file(out, r)) for r in range(ranks))


def _wait(root: str, ready: Callable[[], bool], deadline: float) -> str | None:
    """READY once ``ready()`` holds; the trial's state once it has ended; None at the
    deadline."""
    from .errors import SchedulerError
    from .sweepstate import collect

    while time.monotonic() < deadline:
        if ready():
            return READY
        try:
            trial = collect(root, with_metrics=False).trials[0]
        except SchedulerError:  # the controller is briefly away: ask again
            trial = None
        if trial is not None and trial.state in states.FINAL:
            return trial.state
        time.sleep(1)
    return None


def _cancel(root: str) -> None:
    from .steer import cancel

    try:
        cancel(root)
    except UserError:  # it ended meanwhile, or the controller is away: nothing more to do
        pass


def send_signal(job_id: str, signal: str) -> dict[str, Any]:
    """``scancel --batch --signal=SIGNAL JOB``: the batch shell gets it, as from ``--signal=B:``."""
    argv = ["scancel", "--batch", f"--signal={signal}", job_id]
    at = time.time()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60)
        error = proc.stderr.strip() if proc.returncode else ""
    except (OSError, subprocess.TimeoutExpired) as exc:
        error = str(exc)
    return {"signal": signal, "job": job_id, "at": at, "error": error}


def read_ranks(out: str, ranks: int) -> list[dict[str, Any]]:
    """The ranks' files that are there and readable, by rank."""
    found = []
    for rank in range(ranks):
        try:
            data = read_json(rank_file(out, rank))
        except ValueError:  # damaged: as good as missing
            data = None
        if isinstance(data, dict):
            found.append(data)
    return found


# -- the verdict: pure functions of the ranks' files --


def judge(
    ranks: Sequence[dict[str, Any]],
    expect: Expect,
    limits: Thresholds,
    state: str,
    sent: dict[str, Any],
    where: str = "the preflight directory",
) -> list[Check]:
    """Every row of the verdict."""
    return [
        _job(ranks, expect, state, where),
        _gpus(ranks, expect),
        _filesystem(ranks, expect, limits),
        _checkpoint(ranks, expect),
        _allreduce(ranks, expect, limits),
        _signal(ranks, expect, sent),
    ]


def _gb(value: float) -> str:
    return f"{value:.3g} GB/s"


def _job(ranks: Sequence[dict[str, Any]], expect: Expect, state: str, where: str) -> Check:
    hosts = sorted({r.get("host", "?") for r in ranks})
    if state == states.COMPLETED and len(ranks) == expect.ranks:
        return Check("job", OK, f"{expect.ranks} rank(s) on {', '.join(hosts)}")
    hint = f"its output: {where}/trials/*/output.log and {where}/logs/"
    if state == states.COMPLETED and not ranks:  # the nodes wrote them where this host sees none
        hint = "is output_root on a filesystem the nodes and this host share? " + hint
    return Check("job", FAIL, f"{state}: {len(ranks)} of {expect.ranks} rank(s) reported", hint)


def _seen(view: dict[str, Any]) -> tuple[int | None, str]:
    """GPUs a task sees, and by whom: torch, else nvidia-smi; None when neither is there."""
    if view.get("torch") is not None:
        return view["torch"], "torch"
    if view.get("nvidia_smi") is not None:
        return len(view["nvidia_smi"]), "nvidia-smi"
    return None, "nothing (no torch, no nvidia-smi)"


def _gpus(ranks: Sequence[dict[str, Any]], expect: Expect) -> Check:
    problems: dict[str, str] = {}
    unknown = []
    counts = set()
    for r in ranks:
        host = r.get("host", "?")
        if "gpus" in r.get("errors", {}):
            problems[host] = r["errors"]["gpus"]
            continue
        view = r.get("gpus")
        if view is None:
            continue
        allocated = view.get("allocated")
        seen, by = _seen(view)
        smi = view.get("nvidia_smi")
        counts.add(seen)
        if expect.gpus_per_node and allocated != expect.gpus_per_node:
            problems[host] = f"{host}: asked {expect.gpus_per_node}, allocated {allocated}"
        elif allocated and seen is None:
            unknown.append(host)
        elif allocated and seen != allocated:
            problems[host] = (
                f"{host}: {allocated} allocated ({view.get('allocated_from')}), "
                f"{seen} seen by {by}" + ("; no nvidia-smi" if smi is None else "")
            )
        elif smi is not None and view.get("torch") is not None and len(smi) < view["torch"]:
            problems[host] = f"{host}: torch sees {view['torch']}, nvidia-smi lists {len(smi)}"
    if problems:
        return Check(
            "gpus",
            FAIL,
            "; ".join(sorted(set(problems.values()))),
            "the allocated GPUs are not usable in the job: check gres.conf (File=) and the "
            "driver and CUDA the job sees (its container)",
        )
    if unknown:
        return Check(
            "gpus",
            WARN,
            f"{', '.join(sorted(set(unknown)))}: GPUs allocated, but neither torch nor "
            "nvidia-smi is there to see them",
            "run the preflight with a Python that has torch (SLURMKIT_PYTHON, or a container)",
        )
    if not expect.gpus_per_node:
        extra = sorted(c for c in counts if c)
        return Check(
            "gpus",
            OK,
            "none asked (the CPU path)" + (f"; the tasks see {extra[-1]}" if extra else ""),
        )
    return Check(
        "gpus", OK, f"{expect.gpus_per_node} per node, all seen, on {expect.nodes} node(s)"
    )


def _node_errors(ranks: Sequence[dict[str, Any]], key: str) -> list[str]:
    return [
        f"{r.get('host', '?')}: {r['errors'][key]}" for r in ranks if key in r.get("errors", {})
    ]


def _filesystem(ranks: Sequence[dict[str, Any]], expect: Expect, limits: Thresholds) -> Check:
    found = [r for r in ranks if "fs" in r]
    errors = _node_errors(ranks, "fs")
    errors += [f"{r['host']}: the data read back differs" for r in found if not r["fs"]["intact"]]
    if errors:
        return Check("shared filesystem", FAIL, "; ".join(errors), "check the mount on those nodes")
    if not found:
        return Check("shared filesystem", FAIL, "not measured", "see the job's output")
    write = min(found, key=lambda r: r["fs"]["write_gbps"])["fs"]
    read = min(found, key=lambda r: r["fs"]["read_gbps"])["fs"]
    creates = min(r["fs"]["creates_per_s"] or 0.0 for r in found)
    detail = (
        f"write {_gb(write['write_gbps'])}, read {_gb(read['read_gbps'])}, "
        f"{creates:,.0f} creates/s (the slowest of {len(found)} node(s), "
        f"{write['bytes'] >> 20} MiB each"
        + ("" if all(r["fs"]["cache_dropped"] for r in found) else "; page cache NOT dropped")
        + ")"
    )
    if len(found) < expect.nodes:
        return Check(
            "shared filesystem", FAIL, f"{detail}; measured on {len(found)} of {expect.nodes}"
        )
    slowest = min(write["write_gbps"], read["read_gbps"])
    if limits.min_fs_gbps is not None and slowest < limits.min_fs_gbps:
        return Check(
            "shared filesystem",
            FAIL,
            detail,
            f"below --min-fs-gbps {limits.min_fs_gbps:g}: data loading and checkpoints "
            "will wait on storage",
        )
    return Check("shared filesystem", OK, detail)


def _checkpoint(ranks: Sequence[dict[str, Any]], expect: Expect) -> Check:
    found = [r for r in ranks if "checkpoint" in r]
    errors = _node_errors(ranks, "checkpoint")
    errors += [
        f"{r['host']}: the restored state's checksum differs"
        for r in found
        if not r["checkpoint"]["match"]
    ]
    if errors:
        return Check(
            "checkpoint",
            FAIL,
            "; ".join(errors),
            "a requeued job would not resume from what it saved: check the filesystem",
        )
    if len(found) < expect.nodes:
        return Check("checkpoint", FAIL, f"measured on {len(found)} of {expect.nodes} node(s)")
    save = max(r["checkpoint"]["save_s"] for r in found)
    restore = max(r["checkpoint"]["restore_s"] for r in found)
    first = found[0]["checkpoint"]
    return Check(
        "checkpoint",
        OK,
        f"save {save:.3g} s, restore {restore:.3g} s of {first['bytes'] >> 20} MiB "
        f"({first['kind']}); checksums equal on {len(found)} node(s)",
    )


def _allreduce(ranks: Sequence[dict[str, Any]], expect: Expect, limits: Thresholds) -> Check:
    name = "all_reduce"
    errors = _node_errors(ranks, "allreduce")
    first = next((r["allreduce"] for r in ranks if "allreduce" in r), None)
    if first is None:
        skipped = [r["skipped"]["allreduce"] for r in ranks if "allreduce" in r.get("skipped", {})]
        level = FAIL if errors or not skipped or limits.min_busbw is not None else WARN
        return Check(
            name,
            level,
            "; ".join(errors) or (f"not measured: {skipped[0]}" if skipped else "not measured"),
            "it needs torch in the job's Python (SLURMKIT_PYTHON, or a container)",
        )
    peak = first["peak_busbw_gbps"]
    rows = first["sizes"]
    best = max(rows, key=lambda s: s["busbw_gbps"] or s["algbw_gbps"])
    detail = f"{first['backend']}, {first['world_size']} rank(s): " + (
        f"peak busbw {_gb(peak)} at {best['bytes'] >> 10} KiB"
        if peak is not None
        else f"busbw undefined for 1 rank (algbw {_gb(first['peak_algbw_gbps'])})"
    )
    if not first["sum_ok"]:
        return Check(name, FAIL, f"{detail}; the sum came out wrong", "check NCCL / the network")
    if limits.min_busbw is not None and (peak is None or peak < limits.min_busbw):
        hint = (
            "bus bandwidth needs 2 or more ranks: more nodes or GPUs per node"
            if peak is None
            else f"below --min-busbw {limits.min_busbw:g}: check NCCL_* settings, the "
            "InfiniBand / NVLink fabric and the topology"
        )
        return Check(name, FAIL, detail, hint)
    if expect.gpus_per_node and first["backend"] != "nccl":
        return Check(
            name, WARN, f"{detail}; not over the GPUs", "no GPU was seen: see the gpus row"
        )
    return Check(name, OK, detail)


def _signal(ranks: Sequence[dict[str, Any]], expect: Expect, sent: dict[str, Any]) -> Check:
    name = f"requeue signal ({expect.signal})"
    if not sent:
        return Check(name, FAIL, "not sent: the ranks were never all ready", "see the job row")
    if sent.get("error"):
        return Check(name, FAIL, f"scancel failed: {sent['error']}", "is the job still running?")
    got = [r for r in ranks if expect.signal in (r.get("signal") or {}).get("received", [])]
    if len(got) == expect.ranks:
        late = max(r["signal"]["at"] for r in got) - sent["at"]
        return Check(
            name,
            OK,
            f"sent to the batch shell, it reached all {len(got)} rank(s)"
            + (f" within {late:.2g} s" if late >= 0 else ""),  # node clocks may disagree
        )
    other = sorted(
        {s for r in ranks for s in (r.get("signal") or {}).get("received", [])} - {expect.signal}
    )
    return Check(
        name,
        FAIL,
        f"reached {len(got)} of {expect.ranks} rank(s)"
        + (f"; they got {', '.join(other)} instead" if other else ""),
        "the batch shell forwards it to the runtime, which forwards it to srun and the "
        "tasks: a wrapper that does not pass signals on breaks checkpoint-on-preemption",
    )


def nodes(ranks: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per node: its ranks, GPUs, filesystem and checkpoint figures, signals seen."""
    rows: dict[str, dict[str, Any]] = {}
    for r in sorted(ranks, key=lambda r: (r.get("node_rank", 0), r.get("rank", 0))):
        row = rows.setdefault(
            r.get("host", "?"), {"node": r.get("host", "?"), "ranks": 0, "signalled": 0}
        )
        row["ranks"] += 1
        row["signalled"] += bool((r.get("signal") or {}).get("received"))
        view = r.get("gpus") or {}
        row.setdefault("gpus_allocated", view.get("allocated"))
        row.setdefault("gpus_seen", _seen(view)[0] if view else None)
        if "fs" in r:
            row.update({k: r["fs"][k] for k in ("write_gbps", "read_gbps", "creates_per_s")})
        if "checkpoint" in r:
            row.update({k: r["checkpoint"][k] for k in ("save_s", "restore_s", "match")})
    return list(rows.values())


def _or_unknown(value: Any) -> str:
    return "?" if value is None else str(value)


def print_report(result: Result) -> None:
    """The verdict (doctor's table), then a row per node and the all_reduce sizes."""
    from rich.table import Table
    from rich.text import Text

    from .ui import out, print_checks

    print_checks(result.checks)
    table = Table(box=None, header_style="bold", title=None)
    heads = ("node", "ranks", "GPUs alloc/seen", "write GB/s", "read GB/s", "creates/s")
    for head in (*heads, "ckpt save s", "restore s", "signalled"):
        table.add_column(Text(head), justify="left" if head == "node" else "right")

    def num(value: Any, fmt: str) -> Text:
        return Text("-" if value is None else format(value, fmt))

    for row in nodes(result.ranks):
        table.add_row(
            Text(row["node"]),
            Text(str(row["ranks"])),
            Text(f"{row['gpus_allocated'] or 0}/{_or_unknown(row['gpus_seen'])}"),
            num(row.get("write_gbps"), ".3g"),
            num(row.get("read_gbps"), ".3g"),
            num(row.get("creates_per_s"), ",.0f"),
            num(row.get("save_s"), ".3g"),
            num(row.get("restore_s"), ".3g"),
            Text(f"{row['signalled']}/{row['ranks']}"),
        )
    out.print()
    out.print(table)
    first = next((r["allreduce"] for r in result.ranks if "allreduce" in r), None)
    if first:
        sizes = Table(box=None, header_style="bold")
        for head in ("all_reduce bytes", "time us", "algbw GB/s", "busbw GB/s"):
            sizes.add_column(Text(head), justify="right")
        for s in first["sizes"]:
            sizes.add_row(
                Text(f"{s['bytes']:,}"),
                Text(f"{s['time_s'] * 1e6:.1f}"),
                Text(f"{s['algbw_gbps']:.3g}"),
                num(s["busbw_gbps"], ".3g"),
            )
        out.print()
        out.print(sizes)
    out.print(Text(f"\nstored in {result.sweep_dir}/preflight.json", style="dim"))
