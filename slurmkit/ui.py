"""What people see: rich tables, progress bars and notes (imported only by commands that print).

Whatever comes from users (params, metrics, ids, reasons, hosts, paths) is shown as it is: as
``rich.text.Text``, never read as rich markup or emoji codes.
"""

from __future__ import annotations

import csv
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group
from rich.live import Live
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table
from rich.text import Text

from .core import states
from .sweepstate import SweepStatus, wait

if TYPE_CHECKING:
    from .backends.base import Backend, Submission
    from .core.layout import SweepDir
    from .doctor import Check
    from .plan import Trial
    from .runtime.trial import TrialRun

# Piped (not a terminal, no COLUMNS): plain text, as wide as it needs, never cut or wrapped.
PIPED = not sys.stdout.isatty() and not os.environ.get("COLUMNS")
out = Console(highlight=False, width=1_000_000 if PIPED else None)
err = Console(stderr=True, highlight=False, width=1_000_000 if PIPED else None)
STYLE = {
    states.COMPLETED: "green",
    states.PRUNED: "blue",
    states.RUNNING: "cyan",
    states.PENDING: "yellow",
    states.REQUEUED: "yellow",
    states.FAILED: "red",
    states.TIMEOUT: "red",
    states.CANCELLED: "magenta",
    states.NODE_FAIL: "red",
    states.TERMINATED: "magenta",
    states.PREEMPTED: "yellow",
    states.UNKNOWN: "dim",
    states.NOT_SUBMITTED: "dim",
    states.DAMAGED: "red",
}
ROWS = 25


def note(text: str) -> None:
    err.print(Text(text, style="dim"))


def _short(value: Any, width: int = 40) -> str:
    """``value`` on one line, cut to ``width`` characters (0: never cut)."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", "\\n")
    return text if not width or len(text) <= width else text[: width - 1] + "…"


class PlainBar:
    """A progress bar over trials as one line of plain text, redrawn with a carriage return:
    what a notebook without ``ipywidgets`` shows (rich's live bar needs them there, and prints
    only 'install "ipywidgets" for Jupyter support'). The part of rich's Progress that
    :class:`Reporter` and :func:`follow` use."""

    def __init__(self, stream: Any = None, width: int = 30) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.total: int | None = None
        self.completed = 0
        self.extra = ""
        self.started = time.monotonic()
        self.shown = ""

    def add_task(self, _name: str, total: int | None = None, extra: str = "") -> TaskID:
        self.total, self.extra = total, extra
        return TaskID(0)

    def update(
        self,
        _task: TaskID,
        *,
        total: int | None = None,
        completed: int | None = None,
        advance: int = 0,
        extra: str | None = None,
    ) -> None:
        self.total = total if total is not None else self.total
        self.completed = (completed if completed is not None else self.completed) + advance
        self.extra = extra if extra is not None else self.extra
        self.draw()

    def line(self) -> str:
        total = self.total or 0
        filled = self.width * self.completed // total if total else 0
        bar = "━" * filled + " " * (self.width - filled)
        extra = Text.from_markup(self.extra).plain
        elapsed = int(time.monotonic() - self.started)
        when = f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"
        count = f"{self.completed}/{total}" if total else f"{self.completed}/?"
        return " ".join(part for part in ("trials", bar, count, extra, when) if part)

    def draw(self) -> None:
        line = self.line()
        if line != self.shown:
            self.stream.write(f"\r{line}{' ' * max(0, len(self.shown) - len(line))}")
            self.stream.flush()
            self.shown = line

    def start(self) -> None:
        self.draw()

    def stop(self) -> None:
        self.draw()
        self.stream.write("\n")
        self.stream.flush()

    def __enter__(self) -> PlainBar:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def live_bars() -> bool:
    """Whether rich can draw a live progress bar here: anywhere but in a notebook that lacks
    ``ipywidgets``."""
    if not err.is_jupyter:
        return True
    import importlib.util

    return importlib.util.find_spec("ipywidgets") is not None


def _trial_bar() -> Progress | PlainBar:
    """A progress bar over trials, with a free-text field ``extra`` after the count."""
    if not live_bars():
        return PlainBar()
    return Progress(
        TextColumn("[bold]trials"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[extra]}"),
        TimeElapsedColumn(),
        console=err,
    )


class Reporter:
    """Announces the backend and, when trials run here, draws a progress bar over them."""

    def __init__(self) -> None:
        self.progress: Progress | PlainBar | None = None
        self.task: Any = None
        self.failed = 0

    def start(self, target: Backend, sweep: SweepDir) -> None:
        if target.note:
            note(target.note)
        if target.hint:
            note(f"  hint: {target.hint}")
        if target.runs_here:
            total = sum(1 for _ in sweep.iter_manifest())
            self.progress = _trial_bar()
            self.task = self.progress.add_task("trials", total=total, extra="")
            self.progress.start()

    def trial_done(self, trial: TrialRun, _index: int) -> None:
        if self.progress is None:
            return
        if trial.status.get("state") not in (None, *states.SUCCESS):
            self.failed += 1
        self.progress.update(
            self.task, advance=1, extra=f"[red]{self.failed} failed[/red]" if self.failed else ""
        )

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _pruned(root: str, indices: Iterable[int]) -> int:
    """How many of the trials ``indices`` of the sweep at ``root`` ended PRUNED (0 without a
    search, with nothing more read)."""
    from . import store

    sweep = store.open_sweep(root)
    if "search" not in store.config(sweep, []):
        return 0
    rows = store.manifest(sweep, [])
    ids = [row["id"] for i in indices if i < len(rows) and (row := rows[i]) is not None]
    found = store.read_statuses(sweep, ids, warnings=[]).values()
    return sum(1 for s in found if s is not None and s.get("state") == states.PRUNED)


def print_submission(result: Submission) -> None:
    if result.ran_here:
        failed = sorted(i for i, c in result.exit_codes.items() if c != 0)
        pruned = _pruned(result.sweep_dir, result.exit_codes)
        out.print(
            f"ran {len(result.exit_codes)} trial(s) locally: "
            f"[green]{len(result.exit_codes) - len(failed) - pruned} completed[/green]"
            + (f", [blue]{pruned} pruned[/blue]" if pruned else "")
            + (
                f", [red]{len(failed)} failed[/red] (indices {_short(failed, 60)})"
                if failed
                else ""
            )
        )
    elif not result.indices:
        out.print("nothing to submit: every trial is completed, queued or running")
    else:
        out.print(
            Text(f"submitted {len(result.indices)} of {result.trials} trial(s) {result.described}")
        )
    out.print(Text.assemble("sweep directory: ", (result.sweep_dir, "bold")))
    out.print(Text(f"next: slurmkit status {result.sweep_dir}"))


def status_view(current: SweepStatus, show_all: bool) -> Table:
    counts = Text("  ").join(Text(f"{s} {n}", STYLE.get(s, "")) for s, n in current.counts.items())
    table = Table(
        title=Text.assemble(
            f"{current.name}: {len(current.trials)} trials   ", counts, style="table.title"
        ),
        title_justify="left",
        expand=False,
        box=None if PIPED else box.HEAVY_HEAD,
    )
    for col in ("idx", "id", "state", "why", "exit", "tries", "host", "job", "params"):
        table.add_column(col, overflow="fold" if col == "params" else "ellipsis")
    trials = current.trials
    if not show_all and len(trials) > ROWS:
        trials = sorted(trials, key=lambda t: t.state in states.SUCCESS)[:ROWS]
        table.caption = (
            f"{ROWS} of {len(current.trials)} rows (unfinished first); --all for every row"
        )
    for t in sorted(trials, key=lambda t: t.index):
        params = " ".join(f"{k}={_short(v, 0 if PIPED else 24)}" for k, v in t.params.items())
        why = t.cause or (t.reason if t.state == states.PENDING else "")
        table.add_row(
            str(t.index),
            Text(t.id),
            Text(t.state, STYLE.get(t.state, "")),
            Text(str(why or "")),  # str(): a hand-edited status.json may hold any JSON
            "" if t.exit_code is None else str(t.exit_code),
            str(t.attempts),
            Text(str(t.host or "")),
            Text(t.job or ""),
            Text(params if PIPED else _short(params, 80)),
        )
    return table


def nodes_view(rows: Sequence[dict[str, Any]], title: str, across: bool = False) -> Table:
    """Suspect nodes (core/badnodes.py) with their evidence: a sweep's (``status``), or
    ``across`` sweeps (``report``: in how many sweeps each is excluded)."""
    table = Table(title=title, title_justify="left", expand=False, box=None, header_style="bold")
    cols = (
        ["node", "failures", "sweeps", "excluded in"]
        if across
        else ["node", "failures", "excluded", "trials"]
    )
    for col in [*cols, "last", "evidence"]:
        table.add_column(col, overflow="fold" if col == "evidence" else "ellipsis")
    for r in rows:
        if across:
            cells = [str(len(r["sweeps"])), str(r["excluded_in"])]
        else:
            cells = ["yes" if r["excluded"] else "no", str(len(r["trials"]))]
        last = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["last"])) if r["last"] else ""
        table.add_row(Text(r["node"]), str(r["failures"]), *cells, last, Text(r["evidence"]))
    return table


def _status_views(current: SweepStatus, show_all: bool) -> Group:
    views: list[Table] = [status_view(current, show_all)]
    if current.nodes:
        views.append(nodes_view(current.nodes, "suspect nodes (excluded: --exclude for the rest)"))
    return Group(*views)


def print_status(current: SweepStatus, show_all: bool) -> None:
    out.print(_status_views(current, show_all))


def watch(fetch: Callable[[], SweepStatus], interval: float, show_all: bool) -> SweepStatus:
    with Live(console=out, refresh_per_second=1) as live:
        return wait(fetch, interval, lambda current: live.update(_status_views(current, show_all)))


def follow(fetch: Callable[[], SweepStatus], interval: float = 2.0) -> SweepStatus:
    """A progress bar over finished trials until the sweep has finished (one query a poll)."""
    with _trial_bar() as progress:
        task = progress.add_task("trials", total=None, extra="")

        def show(current: SweepStatus) -> None:
            done = sum(1 for t in current.trials if t.state in states.FINAL)
            counts = " ".join(
                f"[{STYLE.get(k, '')}]{k.lower()} {n}[/]"
                for k, n in current.counts.items()
                if k != states.COMPLETED  # PRUNED shown: stopped early, not a failure
            )
            progress.update(task, total=len(current.trials), completed=done, extra=counts)

        return wait(fetch, interval, show)


def print_trials(trials: Sequence[Trial]) -> None:
    """The trials a sweep would submit: index, short id and parameters."""
    table = Table(expand=False, box=None, header_style="bold")
    keys = list(trials[0].params) if len(trials) else []
    for col in ("index", "id", *keys):
        table.add_column(Text(col), no_wrap=True, justify="right" if col == "index" else "left")
    for t in trials:
        table.add_row(str(t.index), Text(t.id[:8]), *(_cell(t.params[k]) for k in keys))
    out.print(table)
    note(f"{len(trials)} trial(s); nothing was submitted")


def print_summary(final: SweepStatus) -> None:
    """One line when a followed sweep ends: how many trials ended how."""
    counts = ", ".join(f"{n} {state.lower()}" for state, n in final.counts.items())
    out.print(Text(f"{final.name}: {len(final.trials)} trials: {counts}"))


def print_results(rows: list[dict[str, Any]], columns: list[str]) -> None:
    """The results table; the trial id and an all-COMPLETED state column are left to --json."""
    shown = [
        c
        for c in columns
        if not (c == "state" and all(r.get("state") == states.COMPLETED for r in rows))
    ]
    table = Table(expand=False, box=None, header_style="bold")
    for col in shown:
        table.add_column(
            Text(col),
            overflow="ellipsis",
            no_wrap=True,
            min_width=min(len(col), 12),
            justify="right" if col == "index" else "left",
        )
    for row in rows:
        table.add_row(
            *(Text(str(row["id"])[:8]) if c == "id" else _cell(row.get(c)) for c in shown)
        )
    out.print(table)


def print_checks(found: Sequence[Check]) -> None:
    """`slurmkit doctor`'s table: one row per check, with its hint."""
    style = {"ok": "green", "warn": "yellow", "fail": "red"}
    table = Table(expand=False, box=None, header_style="bold")
    for col in ("check", "", "detail", "hint"):
        table.add_column(Text(col), overflow="fold")
    for c in found:
        table.add_row(
            Text(c.name), Text(c.level, style=style[c.level]), Text(c.detail), Text(c.hint)
        )
    out.print(table)


def _cell(value: Any) -> Text:
    """A results cell: a float to 4 significant digits, anything else shortened."""
    if value is None:
        return Text("")
    return Text(f"{value:.4g}" if isinstance(value, float) else _short(value, 0 if PIPED else 30))


def print_csv(rows: list[dict[str, Any]], columns: list[str]) -> None:
    writer = csv.DictWriter(sys.stdout, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        writer.writerow(
            {
                k: v if isinstance(v, (str, int, float)) or v is None else json.dumps(v)
                for k, v in row.items()
            }
        )


def print_file(path: str, follow: bool, ended: Callable[[], bool] = lambda: False) -> None:
    """Copy the file to stdout; with ``follow``, keep copying what is appended until
    ``ended()`` says the writer is done and nothing more came (or Ctrl-C)."""
    if not os.path.exists(path) and not follow:
        err.print(Text(f"no output yet: {path}"))
        return
    try:
        while not os.path.exists(path):
            if ended():
                err.print(Text(f"no output: {path}"))
                return
            time.sleep(0.5)
        with open(path, "rb") as fh:
            while True:
                chunk = fh.read(65536)
                if chunk:
                    sys.stdout.buffer.write(chunk)
                    sys.stdout.flush()
                elif not follow:
                    return
                elif ended():  # one more read: what it wrote before it ended
                    sys.stdout.buffer.write(fh.read())
                    sys.stdout.flush()
                    return
                else:
                    time.sleep(0.5)
    except KeyboardInterrupt:
        return
