"""The commands loaded only when one of them runs (or is completed): the operating ones
(``image``, ``stage``, ``doctor``, ``preflight``, ``report``, ``unlock``, ``schema`` and
``completion``), ``render``, ``logs`` and ``cancel``. ``slurmkit --help`` and the commands in
:mod:`slurmkit.cli` (``sweep``, ``submit``, ``status``, ``results``) do without their ~60
options.
"""

from __future__ import annotations

import sys
from typing import Any

import click

from .cli import complete_dirs, complete_files, emit_json, guarded, main, warn


@click.group()
def image() -> None:
    """Container images on the shared filesystem."""


@image.command("import")
@click.argument("uri")
@click.option(
    "--to",
    "directory",
    required=True,
    metavar="DIR",
    help="Directory on the shared filesystem for squashfs images.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the outcome as JSON.")
@guarded
def image_import(uri: str, directory: str, as_json: bool) -> None:
    """Pre-stage URI as a squashfs with `enroot import` (skipped when already there).

    \b
    Example:
      slurmkit image import nvcr.io/nvidia/pytorch:24.01-py3 --to /mnt/data/images
      # then in a spec:  container: {image: /mnt/data/images/nvcr.io+nvidia+pytorch+24.01-py3.sqsh}
    """
    from .images import import_image  # images: only `image import` needs it

    staged = import_image(uri, directory)
    if as_json:
        emit_json({"path": staged.path, "created": staged.created})
    else:
        click.echo(f"{'imported' if staged.created else 'already staged'}: {staged.path}")


@click.command()
@click.argument("src", metavar="SRC")
@click.argument("dst", metavar="DST", shell_complete=complete_dirs)
@click.option("--verify", is_flag=True, help="Then read every file at DST again: checksums.")
@click.option("--dry-run", is_flag=True, help="Say what would be copied; write nothing.")
@click.option(
    "--endpoint-url",
    metavar="URL",
    help="S3 endpoint of non-AWS storage (default: $AWS_ENDPOINT_URL).",
)
@click.option(
    "--jobs", "-j", type=click.IntRange(1, 256), default=16, show_default=True, help="Threads."
)
@click.option(
    "--part-size",
    type=click.IntRange(min=1),
    default=16,
    show_default=True,
    metavar="MIB",
    help="Files larger than this are fetched in ranged parts, of at least this size (their "
    "bytes shared among --jobs, up to 64 MiB a part).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a summary as JSON.")
@guarded
def stage(
    src: str,
    dst: str,
    verify: bool,
    dry_run: bool,
    endpoint_url: str | None,
    jobs: int,
    part_size: int,
    as_json: bool,
) -> None:
    """Copy a dataset from SRC (s3://, gs://, https://, a path) to DST on the shared
    filesystem, once: resumable, published whole with a manifest, one copier among many.

    Files already complete at DST are skipped; a rerun after a kill goes on where it stopped.
    Concurrent stagers of one DST (64 nodes) copy it once: the others wait and then use it.
    Credentials come from AWS's usual environment, config files and profiles.

    \b
    Examples:
      slurmkit stage s3://datasets/imagenet /mnt/data/imagenet
      slurmkit stage s3://datasets/imagenet /mnt/data/imagenet --dry-run
      slurmkit stage s3://datasets/imagenet /mnt/data/imagenet --verify --json
      slurmkit stage s3://ds/c4 /mnt/data/c4 --endpoint-url https://cwobject.com
    """
    from . import stage as lib  # stage: fsspec and the S3 backend, only for this command

    if verify and dry_run:
        raise click.UsageError("--verify reads DST and --dry-run writes nothing: give one")
    with lib.bar(sys.stderr.isatty() and not as_json) as reporter:
        result = lib.stage(
            src,
            dst,
            verify_after=verify,
            dry_run=dry_run,
            endpoint_url=endpoint_url,
            jobs=jobs,
            part_size=part_size << 20,
            reporter=reporter,
        )
    if as_json:
        emit_json(result.as_dict())
    else:
        click.echo(result.text())


@click.command()
@click.option(
    "--output-root",
    default="runs",
    show_default=True,
    help="Where sweeps go: it must be writable here and shared with the nodes.",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Also check N compute nodes with a tiny job (their Python, enroot, output_root).",
)
@click.option("--partition", help="The partition of that tiny job.")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
@guarded
def doctor(output_root: str, nodes: int, partition: str | None, as_json: bool) -> None:
    """Check that this cluster runs slurmkit's jobs as it should: each check ok, warn or fail
    with a hint. Exits 1 when a check fails.

    \b
    Examples:
      slurmkit doctor
      slurmkit doctor --nodes 2 --partition gpu --output-root /mnt/data/runs
    """
    from .doctor import FAIL  # doctor: the checks and the cluster's answers
    from .doctor import run as diagnose

    found = diagnose(output_root, nodes, partition)
    if as_json:
        emit_json({"checks": [c.as_dict() for c in found]})
    else:
        from . import ui  # ui: rich, ~25 ms; --json and --help need none of it

        ui.print_checks(found)
    sys.exit(1 if any(c.level == FAIL for c in found) else 0)


def _sizes(_ctx: Any, _param: Any, value: str | None) -> str | None:
    """--sizes: comma-separated sizes (``64K,16M,1G``), checked here as the job would read them."""
    from .runtime.preflight import parse_size  # stdlib only

    try:
        for part in value.split(",") if value else []:
            parse_size(part)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    return value


@click.command()
@click.argument("overrides", nargs=-1, metavar="[OVERRIDES]...")
@click.option("--nodes", type=click.IntRange(min=1), default=2, show_default=True, help="Nodes.")
@click.option("--partition", help="The partition of the job.")
@click.option(
    "--gpus-per-node",
    type=click.IntRange(min=0),
    help="GPUs per node, one task each (default: the user config's resources.gpus, else none: "
    "one CPU task per node).",
)
@click.option(
    "--output-root",
    help="Where preflight-TIME/ goes, on the shared filesystem it measures "
    "(default: the user config's output_root, else runs).",
)
@click.option(
    "--min-fs-gbps",
    type=click.FloatRange(min=0),
    help="Fail below this write or read throughput of any node, in GB/s.",
)
@click.option(
    "--min-busbw",
    type=click.FloatRange(min=0),
    help="Fail below this all_reduce bus bandwidth (peak over sizes), in GB/s.",
)
@click.option(
    "--fs-mib", type=click.IntRange(min=1), default=1024, show_default=True, help="MiB per node."
)
@click.option(
    "--files", type=click.IntRange(min=1), default=1000, show_default=True, help="Creates per node."
)
@click.option(
    "--checkpoint-mib",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="MiB of state saved and restored per node.",
)
@click.option(
    "--sizes",
    callback=_sizes,
    help="all_reduce sizes, e.g. 1M,64M,1G (default 1M..1G on GPUs, 64K..4M on CPUs).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=1),
    default=3600,
    show_default=True,
    help="Seconds to wait, queue time included; then the job is cancelled.",
)
@click.option("--dry-run", is_flag=True, help="Print the batch script; create and submit nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict and figures as JSON.")
@guarded
def preflight(
    overrides: tuple[str, ...],
    nodes: int,
    partition: str | None,
    gpus_per_node: int | None,
    output_root: str | None,
    min_fs_gbps: float | None,
    min_busbw: float | None,
    fs_mib: int,
    files: int,
    checkpoint_mib: int,
    sizes: str | None,
    timeout: float,
    dry_run: bool,
    as_json: bool,
) -> None:
    """Run a short job on N nodes and measure what a big job needs: shared-filesystem write,
    read and create rates, a checkpoint save + restore (checksums compared), the GPUs against
    the allocation, an all_reduce across every rank (nccl on GPUs, gloo on CPUs) and the
    requeue signal's way to the job. Exits 1 when a check fails (or a figure is below
    --min-fs-gbps / --min-busbw), 0 otherwise.

    OVERRIDES are spec keys, as for `slurmkit submit` (container.image=..., env.NAME=...,
    resources.account=...); the user config and profile apply. The results stay in
    OUTPUT_ROOT/preflight-TIME/ (preflight.json).

    \b
    Examples:
      slurmkit preflight
      slurmkit preflight --nodes 16 --gpus-per-node 8 --partition gpu --min-busbw 300
      slurmkit preflight --min-fs-gbps 1 --output-root /mnt/data/runs --json
      slurmkit preflight --gpus-per-node 8 container.image=nvcr.io/nvidia/pytorch:24.01-py3
    """
    from . import preflight as lib  # preflight: the job, the wait and the verdict

    spec = lib.job(
        nodes,
        partition=partition,
        gpus_per_node=gpus_per_node,
        output_root=output_root,
        overrides=overrides,
        fs_mib=fs_mib,
        files=files,
        checkpoint_mib=checkpoint_mib,
        sizes=sizes,
    )
    if dry_run:
        click.echo("\n".join(lib.dry_run(spec)), nl=False)
        return
    say = (lambda _text: None) if as_json else (lambda text: click.echo(text, err=True))
    limits = lib.Thresholds(min_fs_gbps=min_fs_gbps, min_busbw=min_busbw)
    result = lib.run(spec, limits, timeout=timeout, say=say)
    if as_json:
        emit_json(result.as_dict())
    else:
        lib.print_report(result)
    sys.exit(1 if result.failed else 0)


@click.command()
@click.argument("dirs", nargs=-1, metavar="[DIR]...", shell_complete=complete_dirs)
@click.option(
    "--since",
    metavar="DATE",
    help="Every job of --user since DATE (2026-11-01, 2026-11-01T08:00, 7d, 12h); "
    "their sweep directories are found by the job comment.",
)
@click.option("--user", metavar="USER", help="With --since: whose jobs (default: yours).")
@click.option("--by", metavar="KEY", help="Also group by account, user, label or label.NAME.")
@click.option("--trials", "show_trials", is_flag=True, help="Also a table of every trial.")
@click.option("--json", "as_json", is_flag=True, help="Sweeps, trials and attempts as JSON.")
@click.option("--csv", "as_csv", is_flag=True, help="One row per attempt, as CSV.")
@click.option("--prometheus", is_flag=True, help="The figures in Prometheus's text format.")
@click.option(
    "--plot",
    metavar="PNG",
    help="Also draw queue delay and GPU-hours over time into PNG (needs matplotlib: "
    "pip install 'slurmkit[plot]').",
)
@guarded
def report(
    dirs: tuple[str, ...],
    since: str | None,
    user: str | None,
    by: str | None,
    show_trials: bool,
    as_json: bool,
    as_csv: bool,
    prometheus: bool,
    plot: str | None,
) -> None:
    """Where the time and money of sweeps went: queue delay, run time, attempts and why they
    ended, GPU-hours useful and lost, failure rate and cost per successful trial; from ONE
    accounting query (sacct) joined with the sweep directories.

    Prices per GPU-hour (per CPU-hour without GPUs) of each partition come from the user
    config: report: {prices: {h100: 4.25}}.

    \b
    Examples:
      slurmkit report runs/lr-20261130-101500
      slurmkit report runs/lr-20261130-101500 --trials
      slurmkit report runs/lr-20261130-101500 --csv > attempts.csv
      slurmkit report runs/lr-20261130-101500 --prometheus > slurmkit.prom
      slurmkit report --since 7d --by label.team
      slurmkit report --since 2026-11-01 --user alice --json
    """
    if bool(dirs) == (since is not None):
        raise click.UsageError("give sweep directories, or --since DATE")
    if user is not None and since is None:
        raise click.UsageError("--user goes with --since")
    if as_json + as_csv + prometheus > 1:
        raise click.UsageError("--json, --csv and --prometheus: give one of them")
    from . import usageout  # usage: sacct, the sweep directories; rich only for tables
    from .usage import collect

    if plot is not None:
        usageout.check_plot()
    found = collect(dirs, since=since, user=user, by=by)
    warn(found.warnings)
    if as_json:
        emit_json(found.as_dict())
    elif as_csv:
        usageout.write_csv(found)
    elif prometheus:
        click.echo(usageout.prometheus(found), nl=False)
    else:
        usageout.print_tables(found, show_trials)
    if plot is not None:
        usageout.plot(found, plot)
        if not (as_json or as_csv or prometheus):
            click.echo(f"plot: {plot}", err=True)


@click.command()
@click.argument("sweep_dir", metavar="DIR", shell_complete=complete_dirs)
@click.option("--json", "as_json", is_flag=True, help="Print the lock's holder as JSON.")
@guarded
def unlock(sweep_dir: str, as_json: bool) -> None:
    """Break the lock of a sweep directory whose holder is gone.

    `sweep --resume` and `cancel` lock the sweep directory while they work; a lock left by a
    command that died is broken by itself once its heartbeat is a minute old. This breaks it
    now. Never while the holder still runs: two resumes could then submit the same trials.

    \b
    Example:
      slurmkit unlock runs/lr-20261130-101500
    """
    from .core.lock import describe  # core.lock: only this command needs it
    from .steer import unlock as do_unlock  # steer: status and the backends

    holder = do_unlock(sweep_dir)
    if as_json:
        emit_json({"sweep_dir": sweep_dir, "holder": holder})
    else:
        if holder is None:
            text = "not locked"
        elif holder:
            text = f"unlocked: it was held for {describe(holder)}"
        else:  # a damaged lock file names nobody
            text = "unlocked: its lock file was damaged (it named no holder)"
        click.echo(text)


@click.command()
@click.option(
    "--config",
    is_flag=True,
    help="The user config's schema (~/.config/slurmkit/config.yaml) instead.",
)
def schema(config: bool) -> None:
    """Print the JSON Schema of a spec (draft-07), for editors: completion, hover help and
    checks as you type, from the same table of keys that `sweep` checks with.

    The schema accepts every spec that loads (a value may be a ${...} interpolation); some
    mistakes only `slurmkit sweep SPEC --dry-run` finds (values checked against each other).

    \b
    Example:
      slurmkit schema > slurmkit.schema.json
      # then the first line of a spec (VS Code's YAML extension, any yaml-language-server;
      # the path is relative to the spec):
      # yaml-language-server: $schema=slurmkit.schema.json
    """
    import json

    from .spec.schema import json_schema  # the table of keys, as JSON Schema

    click.echo(json.dumps(json_schema(config=config), indent=2))


@click.command()
@click.argument(
    "args", nargs=-1, metavar="SPEC [OVERRIDES]...", required=True, shell_complete=complete_files
)
@click.option("--plain", is_flag=True, help="A self-contained script for plain sbatch.")
@click.option(
    "--submitit",
    is_flag=True,
    help="The submitit executor that slurmkit.executor() makes of a job spec, as JSON.",
)
@click.option(
    "--exact",
    is_flag=True,
    help="What the runtime hands to srun for one trial: its argv and the variables it sets "
    "(for an example job 4242 on node-001...), to diff against a script you port.",
)
@click.option("--trial", type=int, default=0, show_default=True, help="The trial --exact shows.")
@click.option("--json", "as_json", is_flag=True, help="--exact as JSON: argv and env.")
@guarded
def render(
    args: tuple[str, ...], plain: bool, submitit: bool, exact: bool, trial: int, as_json: bool
) -> None:
    """Print the batch script(s) of a job or sweep spec (nothing is created or submitted).

    \b
    Examples:
      slurmkit render sweeps/ddp.yaml resources.nodes=4
      slurmkit render sweeps/lr.yaml --plain > lr.sbatch
      slurmkit render sweeps/ddp.yaml launcher=srun --submitit
      slurmkit render sweeps/quickstart.yaml --exact --trial 3
    """
    if sum((plain, submitit, exact)) > 1:
        raise click.UsageError("--plain, --submitit and --exact do not go together")
    if as_json and not exact:
        raise click.UsageError("--json goes with --exact")
    if exact:
        return render_exact(args, trial, as_json)
    if submitit:
        from .errors import UserError
        from .executors import executor_config  # no submitit needed to show it

        try:
            config = executor_config(args[0], args[1:])
        except UserError as exc:  # the function you submit is the command: leave the spec's out
            if exc.key != "command":
                raise
            config = executor_config(args[0], [*args[1:], "~command"])
        import json

        click.echo(json.dumps(config, indent=2, default=str))
        return
    from . import sweep as lib  # sweep: the backends, render and store (~15 ms)
    from .spec import load  # spec: PyYAML and the override parser (~15 ms)

    spec = load(args[0], args[1:], job=True)
    if plain:
        click.echo(lib.render_standalone(spec, args[0]), nl=False)
    else:
        result = lib.submit(spec, backend="auto", dry_run=True)
        click.echo("\n".join(result.scripts), nl=False)


def render_exact(args: tuple[str, ...], index: int, as_json: bool) -> None:
    """``render --exact``: trial ``index``'s srun argv and the variables the runtime sets."""
    import os
    import shlex

    from .preview import EXAMPLE_JOB, exact
    from .spec import load

    spec = load(args[0], args[1:], job=True)
    argv, env = exact(spec, index, os.getcwd())
    if as_json:
        emit_json({"trial": index, "job_id": EXAMPLE_JOB, "argv": argv, "env": env})
        return
    click.echo(f"# trial {index}, as job {EXAMPLE_JOB} would run it; the runtime runs this argv")
    click.echo(" \\\n  ".join(shlex.quote(a) for a in argv))
    click.echo("# with these variables set (the batch shell's others pass through unchanged)")
    for name in sorted(env):
        click.echo(f"{name}={shlex.quote(env[name])}")


@click.command()
@click.argument("sweep_dir", metavar="DIR", shell_complete=complete_dirs)
@click.argument("trial", metavar="TRIAL")
@click.option("--follow", "-f", is_flag=True, help="Keep printing new output until it ends.")
@click.option("--slurm", "slurm_log", is_flag=True, help="Show Slurm's own log of the task.")
@click.option(
    "--stderr", is_flag=True, help="Show the stderr file (specs with logs.stderr: separate)."
)
@click.option(
    "--hang", is_flag=True, help="Show the stacks of each attempt the hang watchdog ended."
)
@guarded
def logs(
    sweep_dir: str, trial: str, follow: bool, slurm_log: bool, stderr: bool, hang: bool
) -> None:
    """Print a trial's output (TRIAL: its index or a prefix of its id).

    \b
    Examples:
      slurmkit logs runs/lr-20261130-101500 3
      slurmkit logs runs/lr-20261130-101500 9f2c1a -f
      slurmkit logs runs/lr-20261130-101500 3 --hang
    """
    from .steer import hang_files, log_path, trial_ended  # steer: status and the sweep directory

    if hang:
        if follow or slurm_log or stderr:
            raise click.UsageError("--hang goes alone (not with --follow, --slurm or --stderr)")
        files = hang_files(sweep_dir, trial)
        for path in files:
            if len(files) > 1:
                click.echo(f"==> {path} <==")
            with open(path, encoding="utf-8", errors="replace") as fh:
                click.echo(fh.read(), nl=False)
        return
    path = log_path(sweep_dir, trial, slurm_log, stderr)
    from . import ui  # ui: rich, ~25 ms; --json and --help need none of it

    ui.print_file(path, follow, trial_ended(sweep_dir, trial))


@click.command()
@click.argument("sweep_dir", metavar="DIR", shell_complete=complete_dirs)
@click.option("--dry-run", is_flag=True, help="Say what would be cancelled; cancel nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print what was cancelled as JSON.")
@guarded
def cancel(sweep_dir: str, dry_run: bool, as_json: bool) -> None:
    """Cancel every queued and running trial of the sweep (one scancel call).

    \b
    Examples:
      slurmkit cancel runs/lr-20261130-101500 --dry-run
      slurmkit cancel runs/lr-20261130-101500
    """
    from .steer import cancel as do_cancel  # steer: status and the backends

    done = do_cancel(sweep_dir, dry_run)
    warn(done.warnings)
    if as_json:
        emit_json(done.as_dict())
    else:
        what = ", ".join(done.texts)
        click.echo(f"{'would cancel' if dry_run else 'cancelled'}: {what or 'nothing to cancel'}")


@click.command()
@click.argument("shell", type=click.Choice(["bash", "zsh", "fish"]))
def completion(shell: str) -> None:
    """Print the shell completion script for SHELL (commands, options, files and directories).

    \b
    Examples:
      eval "$(slurmkit completion bash)"        # in ~/.bashrc
      eval "$(slurmkit completion zsh)"         # in ~/.zshrc
      slurmkit completion fish > ~/.config/fish/completions/slurmkit.fish
    """
    from click.shell_completion import get_completion_class  # only this command needs it

    cls = get_completion_class(shell)
    assert cls is not None  # click has bash, zsh and fish
    click.echo(cls(main, {}, "slurmkit", "_SLURMKIT_COMPLETE").source())
