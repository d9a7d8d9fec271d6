"""The ``slurmkit`` command: thin click commands over the library; heavy imports inside them.

Exit codes: 0 ok, 1 failed (a trial, the scheduler), 2 usage error (bad input; README's table).
"""

from __future__ import annotations

import errno
import gc
import math
import sys
from collections.abc import Callable
from typing import Any, NoReturn

# This module is the program's entry point, never imported by the library. A command allocates
# in bursts (its imports, 10,000 trials) and then exits: with Python's default threshold (700),
# the cyclic collector would walk those objects dozens of times (~4 ms of a submit).
gc.set_threshold(100_000, 50, 1000)

import click  # noqa: E402

from . import __version__  # noqa: E402


class _Backends(click.Choice):
    """``click.Choice`` over :data:`slurmkit.backends.NAMES`, read when a ``--backend`` is
    parsed or shown: ``slurmkit --help`` and the commands without one import no backend code."""

    def __init__(self) -> None:
        self.case_sensitive = True

    @property
    def choices(self) -> tuple[str, ...]:  # type: ignore[override]
        from .backends import NAMES  # backends: the registry, only where a --backend is read

        return NAMES


BACKEND = _Backends()

# The other commands (:mod:`slurmkit.cliops`) load only when one runs: their first help
# paragraph is written here too, so that `slurmkit --help` lists them without loading them
# (tests/test_cli.py holds each to its command's own).
_LATER = {
    "cancel": "Cancel every queued and running trial of the sweep (one scancel call).",
    "completion": "Print the shell completion script for SHELL (commands, options, files and "
    "directories).",
    "doctor": "Check that this cluster runs slurmkit's jobs as it should: each check ok, warn "
    "or fail with a hint. Exits 1 when a check fails.",
    "image": "Container images on the shared filesystem.",
    "logs": "Print a trial's output (TRIAL: its index or a prefix of its id).",
    "preflight": "Run a short job on N nodes and measure what a big job needs: shared-filesystem "
    "write, read and create rates, a checkpoint save + restore (checksums compared), the GPUs "
    "against the allocation, an all_reduce across every rank (nccl on GPUs, gloo on CPUs) and "
    "the requeue signal's way to the job. Exits 1 when a check fails (or a figure is below "
    "--min-fs-gbps / --min-busbw), 0 otherwise.",
    "render": "Print the batch script(s) of a job or sweep spec (nothing is created or submitted).",
    "report": "Where the time and money of sweeps went: queue delay, run time, attempts and why "
    "they ended, GPU-hours useful and lost, failure rate and cost per successful trial; from "
    "ONE accounting query (sacct) joined with the sweep directories.",
    "schema": "Print the JSON Schema of a spec (draft-07), for editors: completion, hover help "
    "and checks as you type, from the same table of keys that `sweep` checks with.",
    "stage": "Copy a dataset from SRC (s3://, gs://, https://, a path) to DST on the shared "
    "filesystem, once: resumable, published whole with a manifest, one copier among many.",
    "unlock": "Break the lock of a sweep directory whose holder is gone.",
}


class _Commands(click.Group):
    """The ``slurmkit`` group: the commands defined here, the others (:data:`_LATER`) loaded
    from :mod:`slurmkit.cliops` when asked for by name."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*self.commands, *_LATER})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in _LATER and cmd_name not in self.commands:
            import importlib  # only to load an operating command

            self.add_command(getattr(importlib.import_module("slurmkit.cliops"), cmd_name))
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """As click's, with the short help of a command not loaded yet taken from _LATER."""
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = []
        for name in names:
            cmd = self.commands.get(name) or click.Command(name, help=_LATER[name])
            if not cmd.hidden:
                rows.append((name, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


# Failures of the machine, not of slurmkit: said in one line (and exit 1), never a traceback.
_ENVIRONMENT = {
    errno.ENOSPC: "the filesystem is full: free some space (nothing was left half-written)",
    errno.EDQUOT: "your disk quota is used up: free some space",
    errno.EROFS: "the filesystem is mounted read-only here",
    errno.EACCES: "you may not read or write there: check the permissions",
    errno.EPERM: "not permitted there: check the permissions (and that it takes hard links)",
    errno.EIO: "the filesystem failed to read or write: check the mount",
}


def complete_files(_ctx: Any, _param: Any, incomplete: str) -> list[Any]:
    """Shell completion of a SPEC: the shell's own file names."""
    from click.shell_completion import CompletionItem  # only when completing

    return [CompletionItem(incomplete, type="file")]


def complete_dirs(_ctx: Any, _param: Any, incomplete: str) -> list[Any]:
    """Shell completion of a sweep DIR: the shell's own directory names."""
    from click.shell_completion import CompletionItem  # only when completing

    return [CompletionItem(incomplete, type="dir")]


def _fail(exc: Exception, as_json: bool = False) -> NoReturn:
    """The error on stderr (one JSON object with --json), then its exit code."""
    code = getattr(exc, "exit_code", 1)
    if as_json:
        import json  # ~1 ms: only for --json (and --help needs none)

        fields = {k: getattr(exc, k, None) for k in ("message", "file", "key", "hint")}
        click.echo(json.dumps({"error": fields, "exit_code": code}, ensure_ascii=False), err=True)
    else:
        click.echo(click.style("error: ", fg="red", bold=True) + str(exc), err=True)
    sys.exit(code)


def guarded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a UserError into a message and its exit code (no traceback)."""
    import functools  # functools: ~1 ms, only to wrap commands when one runs

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from .errors import UserError  # errors: only when a command runs

        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            _fail(exc, bool(kwargs.get("as_json")))
        except OSError as exc:
            if exc.errno not in _ENVIRONMENT:
                raise  # a bug: show where
            where = f"{exc.filename}: " if exc.filename else ""
            hint = _ENVIRONMENT[exc.errno]
            _fail(UserError.failure(f"{where}{exc.strerror}", hint), bool(kwargs.get("as_json")))

    return wrapper


class _Silent:
    """The reporter for --json: no progress bar (and no rich import)."""

    def start(self, target: Any, sweep: Any) -> None:
        pass

    def trial_done(self, trial: Any, index: int) -> None:
        pass

    def stop(self) -> None:
        pass


def _reporter(as_json: bool) -> Any:
    if as_json:
        return _Silent()
    from . import ui  # ui: rich, ~25 ms; --json and --help need none of it

    return ui.Reporter()


def _outcome(result: Any, as_json: bool) -> None:
    """Print what a submission did (or would do); exit 1 when a local trial failed."""
    warn(result.warnings)
    if as_json:
        emit_json(result.as_dict())
    elif result.dry_run:
        from . import ui  # ui: rich, ~25 ms; --json and --help need none of it

        click.echo("\n".join(result.scripts))
        ui.note(
            f"dry run: {len(result.indices)} trial(s), {len(result.scripts)} script(s) "
            f"for {result.sweep_dir}; nothing was created or submitted"
        )
    else:
        from . import ui  # ui: rich, ~25 ms; --json and --help need none of it

        ui.print_submission(result)
    if any(code != 0 for code in result.exit_codes.values()):
        sys.exit(1)


def _positive_seconds(value: float) -> float:
    if not (value > 0 and value < float("inf")):  # NaN compares false
        raise click.BadParameter(f"{value} is not a number of seconds above 0")
    return value


def warn(warnings: list[str]) -> None:
    """One line on stderr per damaged file of a sweep directory (what it costs, what to do)."""
    for text in warnings:
        click.echo(click.style("warning: ", fg="yellow") + text, err=True)


def emit_json(obj: Any) -> None:
    """One JSON document on one line (json's C encoder; pipe it to ``jq`` to read it), strict
    JSON: a NaN or infinite float is the string "NaN", "Infinity" or "-Infinity"."""
    import json  # ~1 ms: only for --json (and --help needs none)

    try:
        text = json.dumps(obj, default=str, ensure_ascii=False, allow_nan=False)
    except ValueError:  # a non-finite float: only then walk the whole document
        text = json.dumps(_finite(obj), default=str, ensure_ascii=False)
    click.echo(text)


def _finite(obj: Any) -> Any:
    """``obj`` with every NaN or infinite float (in dicts, lists, tuples) spelled as a string."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "NaN" if math.isnan(obj) else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="slurmkit")
def main() -> None:
    """Sweeps, container jobs and resumable work on Slurm clusters (and on this machine).

    \b
      slurmkit sweep sweeps/quickstart.yaml        run a sweep (Slurm if reachable, else local)
      slurmkit status runs/quickstart-2026...      where every trial stands
      slurmkit results runs/quickstart-... --sort loss
    """


@main.command(context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1, metavar="SPEC [OVERRIDES]...", shell_complete=complete_files)
@click.option(
    "--resume",
    "resume_dir",
    metavar="DIR",
    help="Submit again the trials of DIR that did not complete (ARGS are overrides).",
)
@click.option(
    "--unprune",
    is_flag=True,
    help="With --resume: also run the trials the search pruned, to max_resource (judged no more).",
)
@click.option(
    "--backend",
    type=BACKEND,
    default="auto",
    show_default=True,
    help="Where trials run; auto = Slurm when a controller answers, else local.",
)
@click.option("--sweep-dir", metavar="DIR", help="Sweep directory (default OUTPUT_ROOT/NAME-TIME).")
@click.option(
    "--dry-run", is_flag=True, help="Print the batch script(s); create and submit nothing."
)
@click.option(
    "--plain", is_flag=True, help="With --dry-run: render a self-contained script for plain sbatch."
)
@click.option("--wait", is_flag=True, help="On Slurm, follow the sweep until every trial ends.")
@click.option("--yes", is_flag=True, help="Submit even more than 100,000 trials.")
@click.option("--list", "list_trials", is_flag=True, help="List the trials; submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@guarded
def sweep(
    args: tuple[str, ...],
    resume_dir: str | None,
    unprune: bool,
    backend: str,
    sweep_dir: str | None,
    dry_run: bool,
    plain: bool,
    wait: bool,
    yes: bool,
    list_trials: bool,
    as_json: bool,
) -> None:
    """Expand SPEC (YAML) into trials and run them as one Slurm job array.

    OVERRIDES use Hydra's syntax and may sweep parameters.

    \b
    Examples:
      slurmkit sweep sweeps/lr.yaml
      slurmkit sweep sweeps/lr.yaml params.optim.lr=0.1,0.01 'params.hidden=range(16,48,16)'
      slurmkit sweep sweeps/lr.yaml resources.time=2:00:00 resources.partition=gpu
      slurmkit sweep sweeps/lr.yaml --dry-run
      slurmkit sweep sweeps/lr.yaml --list          # the trials, with index and parameters
      slurmkit sweep sweeps/lr.yaml --wait          # progress bar until every trial ends
      slurmkit sweep --resume runs/lr-20261130-101500 resources.time=4:00:00
      slurmkit sweep --resume runs/asha-20261130-101500 --unprune   # pruned trials to the end
    """
    from . import sweep as lib  # sweep: the backends, render and store (~15 ms)

    if resume_dir is None and not args:
        raise click.UsageError("give a SPEC file, or --resume DIR")
    if unprune and resume_dir is None:
        raise click.UsageError("--unprune goes with --resume DIR")
    if list_trials:
        if resume_dir:
            raise click.UsageError("--list goes with a SPEC (for a sweep: slurmkit status DIR)")
        _list_trials(args, as_json)
        return
    if plain:
        if not dry_run or resume_dir:
            raise click.UsageError("--plain only goes with --dry-run and a SPEC")
        from .spec import load  # spec: PyYAML and the override parser (~15 ms)

        click.echo(lib.render_standalone(load(args[0], args[1:]), args[0]), nl=False)
        return
    reporter = _reporter(as_json)
    if resume_dir is not None:
        result = lib.resume(
            resume_dir,
            args,
            backend=None if backend == "auto" else backend,
            dry_run=dry_run,
            on_done=reporter.trial_done,
            on_target=reporter.start,
            unprune=unprune,
        )
    else:
        from .spec import load  # spec: PyYAML and the override parser (~15 ms)

        result = lib.submit(
            load(args[0], args[1:]),
            backend=backend,
            sweep_dir=sweep_dir,
            dry_run=dry_run,
            on_done=reporter.trial_done,
            on_target=reporter.start,
            yes=yes,
        )
    reporter.stop()
    _outcome(result, as_json)
    if wait and not result.ran_here and result.indices and not dry_run:
        _follow(result.sweep_dir, as_json)


def _follow(root: str, as_json: bool) -> NoReturn:
    """``sweep --wait``: follow the sweep until every trial has ended; exit 0 when each
    COMPLETED or was PRUNED, else 1."""
    from .sweepstate import collect  # status: the backends' queries
    from .sweepstate import wait as until_done

    if as_json:
        final = until_done(lambda: collect(root, with_metrics=False))
    else:
        from . import ui  # ui: rich, ~25 ms; --json and --help need none of it

        final = ui.follow(lambda: collect(root, with_metrics=False))
        ui.print_summary(final)
    sys.exit(0 if final.ok else 1)


def _list_trials(args: tuple[str, ...], as_json: bool) -> None:
    """``sweep SPEC --list``: the trials a submit would make (index, id, parameters)."""
    from . import plan  # plan: the trials' expansion
    from .spec import load  # spec: PyYAML and the override parser (~15 ms)

    trials = plan.expand(load(args[0], args[1:]))
    if as_json:
        import json

        emit_json([json.loads(row) for row in trials.rows])  # the manifest's rows, strict JSON
        return
    from . import ui  # ui: rich, ~25 ms; --json and --help need none of it

    ui.print_trials(trials)


@main.command()
@click.argument(
    "args", nargs=-1, metavar="JOB [OVERRIDES]...", required=True, shell_complete=complete_files
)
@click.option(
    "--backend",
    type=BACKEND,
    default="auto",
    show_default=True,
    help="Where it runs; auto = Slurm when a controller answers, else local.",
)
@click.option("--sweep-dir", metavar="DIR", help="Job directory (default OUTPUT_ROOT/NAME-TIME).")
@click.option("--no-self-check", is_flag=True, help="Skip the container self-check.")
@click.option("--dry-run", is_flag=True, help="Print the batch script; create and submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@guarded
def submit(
    args: tuple[str, ...],
    backend: str,
    sweep_dir: str | None,
    no_self_check: bool,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Submit one job (a spec without params; multi-node, containers, launchers).

    \b
    Examples:
      slurmkit submit sweeps/ddp.yaml
      slurmkit submit sweeps/ddp.yaml resources.nodes=16 \\
          container.image=nvcr.io/nvidia/pytorch:24.01-py3
      slurmkit submit sweeps/ddp.yaml --dry-run
    """
    from . import sweep as lib  # sweep: the backends, render and store (~15 ms)
    from .spec import load  # spec: PyYAML and the override parser (~15 ms)

    overrides = [*args[1:], *(["self_check=false"] if no_self_check else [])]
    job = load(args[0], overrides, job=True)
    from .plan import count  # plan: the trials' count

    if count(job) > 1:
        from .errors import UserError

        raise UserError(
            f"submit runs one job, and this spec makes {count(job)} trials",
            file=args[0],
            key="params",
            hint=f"run them all with: slurmkit sweep {args[0]}",
        )
    reporter = _reporter(as_json)
    result = lib.submit(
        job,
        backend=backend,
        sweep_dir=sweep_dir,
        dry_run=dry_run,
        on_done=reporter.trial_done,
        on_target=reporter.start,
    )
    reporter.stop()
    _outcome(result, as_json)


@main.command()
@click.argument("sweep_dir", metavar="DIR", shell_complete=complete_dirs)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print every trial, with its metrics, as JSON (NaN, infinities: "NaN", "Infinity", '
    '"-Infinity").',
)
@click.option("--watch", is_flag=True, help="Refresh until every trial has finished.")
@click.option(
    "--interval",
    default=5.0,
    show_default=True,
    callback=lambda _ctx, _param, v: _positive_seconds(v),
    help="Seconds between refreshes (more than 0).",
)
@click.option("--all", "show_all", is_flag=True, help="List every trial (default: 25 rows).")
@guarded
def status(sweep_dir: str, as_json: bool, watch: bool, interval: float, show_all: bool) -> None:
    """Counts per state and a table of trials (one scheduler query for the whole sweep).

    Exits 1 when a trial has failed, been cancelled or timed out, else 0.

    \b
    Examples:
      slurmkit status runs/lr-20261130-101500
      slurmkit status runs/lr-20261130-101500 --watch
      slurmkit status runs/lr-20261130-101500 --json | jq .counts
    """
    from .sweepstate import collect  # status: the backends' queries

    if watch:
        from . import ui  # ui: rich, ~25 ms; --json and --help need none of it

        current = ui.watch(lambda: collect(sweep_dir, with_metrics=as_json), interval, show_all)
    else:
        current = collect(sweep_dir, with_metrics=as_json)  # metrics.json: only for --json
        warn(current.warnings)
        if not as_json:
            from . import ui  # ui: rich, ~25 ms; --json and --help need none of it

            ui.print_status(current, show_all)
    if as_json:
        emit_json(current.as_dict())
    sys.exit(1 if current.failed else 0)


@main.command()
@click.argument("sweep_dir", metavar="DIR", shell_complete=complete_dirs)
@click.option("--sort", "sort_key", metavar="METRIC", help="Sort by this metric (or parameter).")
@click.option("--desc", is_flag=True, help="Largest first.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print rows as JSON (NaN, infinities: "NaN", "Infinity", "-Infinity").',
)
@click.option("--csv", "as_csv", is_flag=True, help="Print rows as CSV.")
@click.option(
    "--limit", type=click.IntRange(min=0), default=None, help="Show at most this many rows."
)
@guarded
def results(
    sweep_dir: str, sort_key: str | None, desc: bool, as_json: bool, as_csv: bool, limit: int | None
) -> None:
    """Parameters and reported metrics of every trial.

    A metric named like a parameter (or index, id, state) is the column metrics.NAME. With
    --sort, NaN and then missing values come last, --desc or not.

    \b
    Examples:
      slurmkit results runs/lr-20261130-101500 --sort loss
      slurmkit results runs/lr-20261130-101500 --sort acc --desc --limit 5
      slurmkit results runs/lr-20261130-101500 --csv > results.csv
    """
    from .steer import results_table  # steer: status and the sweep directory

    if as_json and as_csv:
        raise click.UsageError("--json and --csv: give one of them")
    rows, columns, warnings = results_table(sweep_dir, sort_key, desc)
    warn(warnings)
    rows = rows[:limit] if limit is not None else rows
    if as_json:
        emit_json(rows)
        return
    from . import ui  # ui: rich, ~25 ms; --json and --help need none of it

    if as_csv:
        ui.print_csv(rows, columns)
    else:
        ui.print_results(rows, columns)


def run() -> None:
    """The ``slurmkit`` console script: :func:`main` in click's standalone mode, which exits
    with the command's code (and quietly with 1 when a reader closes the pipe early).

    On the way out, ``gc.freeze()`` moves every object to the collector's permanent generation:
    the interpreter's collections at exit then skip the imports' and the trials' objects (a cycle
    among them is left to the process's end, like its memory; what this process writes is closed
    by then). The rest of the exit (atexit hooks, flushes, modules torn down) runs as usual.
    Same run (bench/targets.py --stand-in, 11 alternating rounds, the 2-core VM at load 8): a
    10,000-trial submit took 97.6 ms of CPU with it, 108.7 ms without (112.4 / 118.4 ms wall,
    submitit's map_array 1,367 ms); ``--help`` 43.7 / 50.0 ms. That keeps the submit 10x faster
    than the fastest map_array seen here (1.12 s, bench/RESULTS.md).
    """
    try:
        main()
    finally:
        gc.freeze()


if __name__ == "__main__":  # python -m slurmkit.cli: one module, also for cliops's imports
    sys.modules["slurmkit.cli"] = sys.modules[__name__]
    run()
