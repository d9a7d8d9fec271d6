"""Whose failure was it: a node's or the trial's. :func:`attribute` is pure (an attempt's exit
code, its output, its nodes and the user's own signatures in; the blamed nodes and the evidence
out); the rest is the thin I/O around it (this job's nodes, the pending tasks' ExcNodeList).

The evidence that points at a node: output matching a known hardware or driver signature
(:data:`SIGNATURES`: CUDA ECC errors, NCCL's ``unhandled system error``, ``No CUDA GPUs are
available``, a read-only or missing mount, a container or the self-check failing to start), the
user's ``requeue.node_fault`` patterns and exit codes, a node failure (the attempt vanished), and
a hang where one node's ranks stopped (:func:`hang_nodes`). Which node: a line's srun
``--label`` rank prefix (``3: ...``, mapped to its node through ``SLURM_TASKS_PER_NODE``), a node
named in the line, or the attempt's only node. The same signature on every node of a multi-node
attempt is the trial's own (its code, its data, its image), and so is a plain error: no node is
blamed for it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core import badnodes
from ..core.fsutil import read_json
from ..core.layout import SweepDir
from . import releaser

# (kind, pattern): what a failing node prints. The container failures are pyxis's own start
# errors on the node (not a missing plugin, which is the cluster's, nor an image that cannot be
# pulled, which is the job's).
SIGNATURES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (kind, re.compile(pattern))
    for kind, pattern in (
        ("ecc", r"(?i)uncorrectable ECC error|CUDA_ERROR_ECC_UNCORRECTABLE"),
        ("nccl", r"NCCL\b.*\bunhandled system error"),
        ("no_gpu", r"No CUDA GPUs are available|no CUDA-capable device is detected"),
        ("mount", r"Read-only file system|Transport endpoint is not connected|Stale file handle"),
        ("selfcheck", r"selfcheck FAILED: "),
        (
            "container",
            r"pyxis: (?:couldn't start container|container start failed"
            r"|failed to create container filesystem)"
            r"|spank: required plugin \S*pyxis\S*: \w+\(\) failed",
        ),
    )
)
# srun --label's prefix of a task's line: "3: ..." (after a possible "slurmstepd: error: ")
_LABEL = re.compile(r"^\s*(\d+): ")
# the self-check names its host: "selfcheck FAILED: HOST rank N: ..."
_SELFCHECK_HOST = re.compile(r"selfcheck FAILED: (\S+)")
# srun's line for a node whose tasks exited non-zero (not those it killed afterwards)
_EXITED = re.compile(r"srun: error: (\S+): tasks? [\d,\-\[\]]+: Exited with exit code", re.M)
MAX_EVIDENCE = 300  # characters of the matched line kept


@dataclass(frozen=True)
class Blame:
    """An attempt's failure attributed to nodes: ``kind`` of evidence, the ``nodes`` blamed
    (empty: a node's, but which one the output does not say) and the ``evidence`` line."""

    kind: str
    nodes: tuple[str, ...]
    evidence: str


def rank_nodes(nodes: Sequence[str], tasks_per_node: str) -> list[str]:
    """The node of each rank under srun's block distribution: ``SLURM_TASKS_PER_NODE``
    (``2(x3),1``) over the job's ``nodes``; [] when it does not fit them."""
    counts: list[int] = []
    for part in filter(None, tasks_per_node.split(",")):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            return []
        counts += [int(m[1])] * int(m[2] or 1)
    if len(counts) != len(nodes):
        return []
    return [node for node, count in zip(nodes, counts, strict=True) for _ in range(count)]


def _node_of(line: str, nodes: Sequence[str], ranks: Sequence[str]) -> str | None:
    """The node a line is about: the self-check's host, its rank label, a node it names, or the
    attempt's only node."""
    m = _SELFCHECK_HOST.search(line)
    if m and m[1] in nodes:
        return m[1]
    m = _LABEL.match(line)
    if m and int(m[1]) < len(ranks):
        return ranks[int(m[1])]
    named = [n for n in nodes if re.search(rf"(?<![\w.-]){re.escape(n)}(?![\w-])", line)]
    if len(named) == 1:
        return named[0]
    return nodes[0] if len(nodes) == 1 else None


def _matches(output: str, patterns: Sequence[str]) -> list[tuple[str, str]]:
    """(kind, line) of each output line matching a signature or one of the user's patterns."""
    users = [re.compile(p) for p in patterns]
    found = []
    for line in output.splitlines():
        kind = next((k for k, rx in SIGNATURES if rx.search(line)), None)
        if kind is None and any(rx.search(line) for rx in users):
            kind = "pattern"
        if kind is not None:
            found.append((kind, line.strip()))
    return found


def attribute(
    code: int,
    output: str,
    nodes: Sequence[str],
    *,
    tasks_per_node: str = "",
    patterns: Sequence[str] = (),
    exit_codes: Sequence[int] = (),
) -> Blame | None:
    """Whose failure an attempt that exited ``code`` was: a :class:`Blame` when the evidence in
    its ``output`` (or the user's ``exit_codes``) points at its ``nodes``; None when it is the
    trial's own (a success, no evidence, or the same evidence on every node of several)."""
    if code == 0 or not nodes:
        return None
    ranks = rank_nodes(nodes, tasks_per_node)
    hits = _matches(output, patterns)
    if hits:
        blamed: dict[str, str] = {}
        for kind, line in hits:
            node = _node_of(line, nodes, ranks)
            if node is not None:
                blamed.setdefault(node, kind)
        if len(nodes) > 1 and set(blamed) == set(nodes):
            return None  # every node says it: the job's, not a node's
        kind, line = next(((k, ln) for k, ln in hits if _node_of(ln, nodes, ranks)), hits[0])
        return Blame(kind, tuple(sorted(blamed) or _exited(output, nodes)), line[:MAX_EVIDENCE])
    if code in exit_codes:
        who = tuple(nodes) if len(nodes) == 1 else _exited(output, nodes)
        return Blame("exit_code", who, f"exit code {code}")
    return None


def _exited(output: str, nodes: Sequence[str]) -> tuple[str, ...]:
    """The nodes whose tasks srun saw exit non-zero (``srun: error: NODE: task 3: Exited with
    exit code 1``), when they are some of the attempt's nodes but not all; else ()."""
    seen = {m[1] for m in _EXITED.finditer(output)} & set(nodes)
    return tuple(sorted(seen)) if len(seen) < len(nodes) else ()


def hang_nodes(hang: Mapping[str, Any], nodes: Sequence[str]) -> tuple[str, ...]:
    """The nodes whose ranks stopped in a hang (the hang watchdog's record): those whose last
    progress (``hang["nodes"]``: node -> time, or ``hang["ranks"]``: rank -> ``{node,
    last_progress}``) is a timeout older than the others'; () when all stopped alike."""
    last: dict[str, float] = {}
    per_node = hang.get("nodes")
    if isinstance(per_node, Mapping):
        last = {str(n): float(t) for n, t in per_node.items() if isinstance(t, (int, float))}
    ranks = hang.get("ranks")
    if isinstance(ranks, Mapping):
        for info in ranks.values():
            if isinstance(info, Mapping) and isinstance(info.get("last_progress"), (int, float)):
                node = str(info.get("node"))
                last[node] = max(last.get(node, 0.0), float(info["last_progress"]))
    last = {n: t for n, t in last.items() if n in nodes}
    timeout = float(hang.get("timeout") or 0)
    if len(last) < 2 or not timeout:
        return ()
    newest = max(last.values())
    stopped = tuple(sorted(n for n, t in last.items() if newest - t >= timeout))
    return stopped if len(stopped) < len(last) else ()


def job_nodes(env: Mapping[str, str] = os.environ) -> list[str]:
    """This job's nodes (SLURM_JOB_NODELIST expanded); [] outside Slurm."""
    return badnodes.expand(env.get("SLURM_JOB_NODELIST", ""))


def partition_nodes(env: Mapping[str, str] = os.environ) -> int | None:
    """How many nodes this job's partition has (``sinfo``); None when unknown."""
    part = env.get("SLURM_JOB_PARTITION")
    if not part:
        return None
    try:
        proc = subprocess.run(
            ["sinfo", "-h", "-N", "-p", part, "-o", "%N"],
            capture_output=True,
            text=True,
            timeout=20,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    names = set(proc.stdout.split()) if proc.returncode == 0 else set()
    return len(names) or None


def exclude_pending(job_ids: Sequence[str], nodes_of: Callable[[str], Sequence[str]]) -> None:
    """Give each pending task (``ARRAY_TASK``) of the arrays ``job_ids`` ``ExcNodeList=``
    ``nodes_of(task)`` (a pending job is the only one whose ExcNodeList may change)."""
    if not job_ids:
        return
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-r", "-t", "PD", "-j", ",".join(job_ids), "-o", "%i"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        for task in proc.stdout.split() if proc.returncode == 0 else []:
            nodes = nodes_of(task)
            if nodes:
                releaser.update([f"JobId={task}", f"ExcNodeList={','.join(nodes)}"])
    except (OSError, subprocess.TimeoutExpired):
        return


def unless_widespread(sweep_dir: str, blame: Blame | None) -> Blame | None:
    """``blame``, unless failures of its kind are the job's (:func:`badnodes.widespread`)."""
    if blame is None or not blame.nodes:
        return blame
    return (
        None
        if badnodes.widespread(badnodes.failures(sweep_dir), blame.kind, blame.nodes)
        else blame
    )


def note(
    sweep_dir: str,
    trial_id: str,
    attempt: dict[str, Any],
    exclude_after: int,
    kind: str | None = None,
) -> None:
    """Record ``attempt``'s failure in the sweep's node records when nodes were blamed for it
    (a hang's stopped nodes too, from its ``hang`` record), once; when that excludes a node
    that was not before, give the sweep's pending tasks their new ExcNodeList."""
    if not attempt.get("blamed") and isinstance(attempt.get("hang"), Mapping):
        stopped = hang_nodes(attempt["hang"], attempt.get("nodes") or [])
        if stopped:
            attempt.update(blamed=list(stopped), evidence="its ranks stopped first (hang)")
    if not attempt.get("blamed"):
        return
    if os.path.exists(os.path.join(badnodes.path(sweep_dir), f"{trial_id}-{attempt['n']}.json")):
        return
    before = badnodes.excluded(sweep_dir)
    kind = kind or ("hang" if "hang" in attempt else str(attempt.get("cause") or "node"))
    badnodes.record(
        sweep_dir,
        {
            "trial": trial_id,
            "attempt": attempt["n"],
            "time": attempt.get("end") or attempt.get("start"),
            "job": attempt.get("job_id"),
            "nodes": attempt.get("nodes") or [],
            "blamed": list(attempt["blamed"]),
            "kind": kind,
            "evidence": attempt.get("evidence", ""),
            "exclude_after": exclude_after,
            "partition_nodes": partition_nodes(),
        },
    )
    records = badnodes.failures(sweep_dir)
    if {s.node for s in badnodes.tally(records) if s.excluded} - set(before):
        jobs = _sweep_jobs(sweep_dir)
        trials = _trial_ids(sweep_dir)

        def nodes_of(task: str) -> list[str]:
            job, _, index = task.partition("_")
            trial = trials.get(jobs.get(job, 0) + int(index)) if index.isdigit() else None
            return badnodes.avoid(records, trial or "")

        exclude_pending(list(jobs), nodes_of)


def _sweep_jobs(sweep_dir: str) -> dict[str, int]:
    """The array job ids the sweep's submission records name, each with its offset."""
    found: dict[str, int] = {}
    folder = SweepDir(sweep_dir).submissions
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        try:
            rec = read_json(os.path.join(folder, name))
        except (OSError, ValueError):
            continue
        for job in (rec.get("jobs") if isinstance(rec, dict) else None) or []:
            if isinstance(job, dict) and job.get("job_id"):
                found[str(job["job_id"])] = int(job.get("offset") or 0)
    return found


def _trial_ids(sweep_dir: str) -> dict[int, str]:
    """Trial index -> id, from the sweep's manifest (trials.jsonl)."""
    out: dict[int, str] = {}
    try:
        with open(SweepDir(sweep_dir).manifest, encoding="utf-8") as fh:
            for line in fh:
                try:
                    row = json.loads(line)
                    out[int(row["index"])] = str(row["id"])
                except (ValueError, KeyError, TypeError):
                    continue
    except OSError:
        pass
    return out
