"""``slurmkit report``'s outputs: the rich tables, CSV (one row per attempt), Prometheus's
text format and the plot (matplotlib, imported only for ``--plot``)."""

from __future__ import annotations

import csv
import io
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

from .errors import UserError
from .goodput import KINDS
from .usage import Report, SweepReport

CSV_COLUMNS = (
    "sweep_dir",
    "sweep",
    "labels",
    "trial_index",
    "trial_id",
    "trial_state",
    "attempt",
    "job",
    "partition",
    "account",
    "user",
    "state",
    "cause",
    "outcome",
    "submit",
    "start",
    "end",
    "queue_s",
    "run_s",
    "unit",
    "units",
    "useful_hours",
    "lost_hours",
    "running_hours",
    "cost",
    "eligible",
    "first_step",
    *(f"{kind}_hours" for kind in KINDS if kind != "running"),
    "unknown",
    "blamed",
)


# --------------------------------------------------------------------------- #
# Text: durations, hours, money
# --------------------------------------------------------------------------- #


def duration(seconds: float | None) -> str:
    """``45s``, ``3m05s``, ``2h01m``, ``1d03h``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _one_line(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def amount(value: float | None) -> str:
    """Hours or money: two decimals, or three significant digits below 1 (``0.0042``)."""
    if value is None:
        return "-"
    return f"{value:.3g}" if 0 < abs(value) < 1 else f"{value:,.2f}"


def percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _hours(spent: dict[str, float] | None) -> list[str]:
    """Useful and lost unit-hours; ``-`` without an allocation (no accounting)."""
    return [amount(spent["useful"]), amount(spent["lost"])] if spent else ["-", "-"]


def _causes(figs: dict[str, Any]) -> str:
    return ", ".join(f"{n} {cause}" for cause, n in figs["causes"].items()) or "-"


# --------------------------------------------------------------------------- #
# Tables
# --------------------------------------------------------------------------- #


def print_tables(report: Report, show_trials: bool) -> None:
    """The sweeps (and a total), the groups with ``--by``, the trials with ``--trials``."""
    from rich.table import Table
    from rich.text import Text

    from .ui import note, out

    cpu = any(s.figures["cpu_hours"] for s in report.sweeps)
    columns = ["sweep", "trials", "ok", "failed", "fail", "attempts", "causes", "queue p50",
               "queue max", "run", "GPU-h useful", "GPU-h lost"]  # fmt: skip
    columns += ["CPU-h useful", "CPU-h lost"] if cpu else []
    columns += ["cost", "cost/success"]

    def cells(name: str, figs: dict[str, Any]) -> list[str]:
        q = figs["queue_delay_s"]
        row = [_one_line(name), str(figs["trials"]), str(figs["successful"]), str(figs["failed"]),
               percent(figs["failure_rate"]), str(figs["attempts"]), _causes(figs),
               duration(q["median"]), duration(q["max"]), duration(figs["run_s"]),
               *_hours(figs["gpu_hours"])]  # fmt: skip
        if cpu:
            row += _hours(figs["cpu_hours"])
        return [*row, amount(figs["cost"]), amount(figs["cost_per_success"])]

    def table(title: str, rows: Sequence[list[str]]) -> Table:
        t = Table(expand=False, box=None, header_style="bold", title=title, title_justify="left")
        for i, col in enumerate([title.split()[0] if title else "sweep", *columns[1:]]):
            t.add_column(Text(col), justify="left" if i in (0, 6) else "right", overflow="fold")
        for row in rows:
            t.add_row(*(Text(cell) for cell in row))
        return t

    rows = [cells(s.name, s.figures) for s in report.sweeps]
    if len(report.sweeps) > 1:
        rows.append(cells("total", report.totals))
    out.print(table("", rows))
    if report.by:
        out.print(table(f"{report.by} groups", [cells(k, f) for k, f in report.groups()]))
    split = goodput_table(report)
    if split is not None:
        out.print(split)
    if show_trials:
        out.print(trials_table(report.sweeps))
    blamed = report.totals["blamed"]
    if blamed:
        named = ", ".join(f"{node} ({n})" for node, n in blamed.items())
        note(f"nodes that failures were put on (attempts): {named}")
    if report.nodes:
        from .ui import nodes_view

        out.print(nodes_view(report.nodes, "suspect nodes", across=True))
    for s in report.sweeps:
        if "search" in s.figures:
            note(search_line(s.name, s.figures["search"]))
    unpriced = report.totals["unpriced"]
    if unpriced:
        note(
            f"no price for partition {', '.join(map(repr, unpriced))}: cost unknown; add "
            f"report: {{prices: {{{unpriced[0] or 'PARTITION'}: PRICE}}}} to your user config"
        )


def goodput_table(report: Report) -> Any:
    """Where each sweep's GPU-hours (CPU-hours without GPUs) went, and its ETTR; None when no
    sweep had an allocation (no accounting)."""
    from rich.table import Table
    from rich.text import Text

    named = [(s.name, s.figures) for s in report.sweeps]
    if len(named) > 1:
        named.append(("total", report.totals))
    rows = []
    for name, figs in named:
        unit = "GPU-h" if figs["gpu_goodput"] else "CPU-h"
        split = figs["gpu_goodput"] or figs["cpu_goodput"]
        if split is None:
            continue
        unknown = ", ".join(f"{n} {what}" for what, n in split["unknown"].items()) or "-"
        hours = [amount(split[kind]) for kind in KINDS]
        rows.append([_one_line(name), unit, percent(split["ettr"]), *hours, unknown])
    if not rows:
        return None
    t = Table(expand=False, box=None, header_style="bold", title="where the hours went "
              "(ETTR: productive over wall time since eligible)", title_justify="left")  # fmt: skip
    heads = ["sweep", "unit", "ETTR", *(k.replace("_", " ") for k in KINDS), "unknown (attempts)"]
    for i, col in enumerate(heads):
        t.add_column(Text(col), justify="left" if i in (0, 1, len(heads) - 1) else "right")
    for row in rows:
        t.add_row(*(Text(cell) for cell in row))
    return t


def search_line(name: str, found: dict[str, Any]) -> str:
    """One line of what a sweep's search saved (``usage.saved``), against running every trial
    to max_resource."""
    parts = []
    for key, unit in (("gpu_hours", "GPU-h"), ("cpu_hours", "CPU-h")):
        if found[key] is not None:
            parts.append(f"{amount(found[key]['saved'])} {unit}")
    run = found["run_s"]
    parts.append(f"{duration(run['saved'])} of run time")
    text = f"{_one_line(name)}: the search pruned {found['pruned']} trial(s) and saved about "
    text += ", ".join(parts)
    if run["share"] is not None:
        text += f" ({percent(run['share'])} of running every trial to max_resource)"
    if found["unestimated"]:
        text += f"; {found['unestimated']} pruned trial(s) without a recorded reach: not counted"
    return text


def trials_table(sweeps: Sequence[SweepReport]) -> Any:
    from rich.table import Table
    from rich.text import Text

    t = Table(expand=False, box=None, header_style="bold", title="trials", title_justify="left")
    for col in ("sweep", "index", "id", "state", "attempts", "causes", "queue", "run",
                "useful h", "lost h", "cost"):  # fmt: skip
        t.add_column(
            Text(col), justify="left" if col in ("sweep", "id", "state", "causes") else "right"
        )
    for sweep in sweeps:
        for trial in sweep.trials:
            causes = ", ".join(a.cause for a in trial.attempts if a.cause) or "-"
            queue = [a.queue_s for a in trial.attempts if a.queue_s is not None]
            costs = [a.cost for a in trial.attempts]
            t.add_row(
                *map(
                    Text,
                    (
                        _one_line(sweep.name),
                        "-" if trial.index is None else str(trial.index),
                        trial.id[:8] if trial.index is not None else trial.id,
                        trial.state,
                        str(len(trial.attempts)),
                        causes,
                        duration(sum(queue)) if queue else "-",
                        duration(sum(a.run_s or 0.0 for a in trial.attempts)),
                        amount(sum(a.useful_hours for a in trial.attempts)),
                        amount(sum(a.lost_hours for a in trial.attempts)),
                        amount(None if None in costs else sum(c or 0.0 for c in costs)),
                    ),
                )
            )
    return t


# --------------------------------------------------------------------------- #
# CSV: one row per attempt
# --------------------------------------------------------------------------- #


def csv_rows(report: Report) -> list[dict[str, Any]]:
    rows = []
    for sweep in report.sweeps:
        labels = json.dumps(sweep.labels, sort_keys=True, ensure_ascii=False)
        for trial in sweep.trials:
            for a in trial.attempts:
                row = a.as_dict()
                row.update(
                    sweep_dir=sweep.sweep_dir,
                    sweep=sweep.name,
                    labels=labels,
                    trial_index=trial.index,
                    trial_id=trial.id,
                    trial_state=trial.state,
                    attempt=a.n,
                    submit=_iso(a.submit),
                    start=_iso(a.start),
                    end=_iso(a.end),
                    eligible=_iso(a.eligible),
                    first_step=_iso(a.first_step),
                    unknown=" ".join(a.unknown),
                    blamed=" ".join(a.blamed),
                )
                rows.append(row)
    return rows


def write_csv(report: Report, stream: Any = None) -> None:
    writer = csv.DictWriter(stream or sys.stdout, fieldnames=CSV_COLUMNS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(csv_rows(report))


def _iso(when: float | None) -> str:
    return "" if when is None else time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(when))


# --------------------------------------------------------------------------- #
# Prometheus text format (version 0.0.4)
# --------------------------------------------------------------------------- #

_METRICS = {
    "trials": ("gauge", "Trials, by state."),
    "attempts": ("gauge", 'Attempts, by why they ended (cause="": completed or running).'),
    "failure_ratio": ("gauge", "Trials that ended without success, of all that ended."),
    "queue_delay_seconds": ("summary", "Queue delay of attempts (submit to start)."),
    "run_seconds": ("gauge", "Run time of all attempts together."),
    "gpu_hours": ("gauge", "Allocated GPU-hours, by kind (useful, lost, running)."),
    "cpu_hours": ("gauge", "Allocated CPU-hours of attempts without GPUs, by kind."),
    "cost": ("gauge", "Cost at the user config's prices."),
    "cost_per_successful_trial": ("gauge", "Cost over the trials that completed."),
    "goodput_hours": ("gauge", "Unit-hours (unit: gpu, or cpu without GPUs) by where they went."),
    "ettr": ("gauge", "Effective training time ratio: productive over wall time since eligible."),
    "ettr_allocated": ("gauge", "Productive over allocated time (no queue, no hold)."),
    "goodput_unknown_attempts": ("gauge", "Attempts whose records lack a figure of the split."),
    "blamed_attempts": ("gauge", "Attempts whose failure was put on a node, by node."),
    "search_saved": (
        "gauge",
        "What a search's pruning saved against running every trial to max_resource, by unit "
        "(run_seconds, gpu_hours, cpu_hours): an estimate.",
    ),
}


def prometheus(report: Report) -> str:
    """The same figures in Prometheus's text format: one series per sweep (``sweep``,
    ``sweep_dir`` and its labels as ``label_NAME``) and, with ``--by``, per group."""
    samples: dict[str, list[str]] = {name: [] for name in _METRICS}
    for sweep in report.sweeps:
        base = {"sweep": sweep.name, "sweep_dir": sweep.sweep_dir}
        base.update({f"label_{k}": v for k, v in sweep.labels.items()})
        _series(samples, base, sweep.figures, [a for t in sweep.trials for a in t.attempts])
    if report.by:
        for key, figs in report.groups():
            _series(samples, {"by": report.by, "group": key}, figs, None)
    lines = []
    for name, (kind, text) in _METRICS.items():
        if samples[name]:
            lines += [
                f"# HELP slurmkit_report_{name} {text}",
                f"# TYPE slurmkit_report_{name} {kind}",
            ]
            lines += samples[name]
    return "\n".join(lines) + "\n" if lines else ""


def _series(
    samples: dict[str, list[str]], base: dict[str, str], figs: dict[str, Any], attempts: Any
) -> None:
    def add(metric: str, value: float | None, suffix: str = "", **labels: str) -> None:
        if value is not None:
            samples[metric].append(
                f"slurmkit_report_{metric}{suffix}{_labels({**base, **labels})} {_number(value)}"
            )

    for state, n in figs["states"].items():
        add("trials", n, state=state)
    ended = dict(figs["causes"])
    ended[""] = figs["attempts"] - sum(ended.values())
    for cause, n in ended.items():
        add("attempts", n, cause=cause)
    add("failure_ratio", figs["failure_rate"])
    q = figs["queue_delay_s"]
    if q["median"] is not None:
        add("queue_delay_seconds", q["median"], quantile="0.5")
        add("queue_delay_seconds", q["p90"], quantile="0.9")
        add("queue_delay_seconds", q["max"], quantile="1")
    count = sum(1 for a in attempts if a.queue_s is not None) if attempts is not None else None
    add("queue_delay_seconds", q["total"], "_sum")
    if count is not None:
        add("queue_delay_seconds", count, "_count")
    add("run_seconds", figs["run_s"])
    for unit in ("gpu", "cpu"):
        for kind, value in (figs[f"{unit}_hours"] or {}).items():
            add(f"{unit}_hours", value, kind=kind)
    add("cost", figs["cost"])
    add("cost_per_successful_trial", figs["cost_per_success"])
    for unit in ("gpu", "cpu"):
        split = figs[f"{unit}_goodput"]
        if split is None:
            continue
        for kind in KINDS:
            add("goodput_hours", split[kind], unit=unit, kind=kind)
        add("ettr", split["ettr"], unit=unit)
        add("ettr_allocated", split["ettr_allocated"], unit=unit)
        for figure, n in split["unknown"].items():
            add("goodput_unknown_attempts", n, unit=unit, figure=figure)
    for node, n in figs["blamed"].items():
        add("blamed_attempts", n, node=node)
    for key, unit in (
        ("run_s", "run_seconds"),
        ("gpu_hours", "gpu_hours"),
        ("cpu_hours", "cpu_hours"),
    ):
        found = (figs.get("search") or {}).get(key)
        add("search_saved", found["saved"] if found else None, unit=unit)


def _labels(labels: dict[str, str]) -> str:
    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')

    return "{" + ",".join(f'{k}="{escape(str(v))}"' for k, v in labels.items()) + "}"


def _number(value: float) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf")
    return repr(value) if isinstance(value, float) else str(value)


# --------------------------------------------------------------------------- #
# The plot
# --------------------------------------------------------------------------- #


def check_plot() -> None:
    """Before any work: matplotlib must be importable for ``--plot``."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise UserError.failure(
            "--plot needs matplotlib, which is not installed",
            hint="pip install 'slurmkit[plot]'",
        )


def plot(report: Report, path: str) -> None:
    """Queue delay of each attempt and GPU-hours (useful, lost) summed over time, as a PNG at
    ``path`` (written whole: a temporary file renamed into place)."""
    import matplotlib

    matplotlib.use("Agg")
    from datetime import datetime

    import matplotlib.pyplot as plt

    from .core.fsutil import atomic_write_bytes

    attempts = [a for s in report.sweeps for t in s.trials for a in t.attempts]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    for sweep in report.sweeps:
        points = [
            (datetime.fromtimestamp(a.start), a.queue_s / 60)
            for t in sweep.trials
            for a in t.attempts
            if a.start is not None and a.queue_s is not None
        ]
        if points:
            top.scatter(*zip(*points), s=12, label=sweep.name)
    top.set_ylabel("queue delay (min)")
    if len(report.sweeps) > 1:
        top.legend(fontsize="small")
    unit = "gpu" if any(a.unit == "gpu" and a.units for a in attempts) else "cpu"
    ended = sorted(
        (a for a in attempts if a.start is not None and a.unit == unit),
        key=lambda a: a.end or a.start or 0,
    )
    for kind, color in (("useful", "tab:green"), ("lost", "tab:red")):
        xs, ys, total = [], [], 0.0
        for a in ended:
            total += getattr(a, f"{kind}_hours")
            xs.append(datetime.fromtimestamp(a.end or a.start or 0))
            ys.append(total)
        if xs:
            bottom.step(xs, ys, where="post", color=color, label=kind)
    bottom.set_ylabel(f"{unit.upper()}-hours, summed")
    bottom.legend(fontsize="small")
    fig.autofmt_xdate()
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue(), fsync=False)
