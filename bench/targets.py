"""The user-facing targets of issue 22, each measured in one run against its baseline.

    python bench/targets.py                       # on SLURM_CONF's cluster, else the test cluster
    python bench/targets.py --stand-in            # no cluster: stand-in Slurm commands on PATH
    python bench/targets.py --before /tmp/old     # also an earlier checkout, same run
    python bench/targets.py --tree no-freeze=/tmp/x   # any other checkout too (repeatable)

Targets: a 10,000-trial submit <= 0.5 s for the whole CLI and >= 10x faster than submitit's
``map_array`` of the same (medians of alternating runs); ``slurmkit --help`` <= 1.5x
``python -c "import click"``; ``status`` of a 10,000-task sweep <= 0.5 s. Every side of a figure
runs in turn, round by round (the order turned round each round), so a load that comes and goes
falls on all of them alike. The last lines print each target with its ratio and PASS or FAIL.

``--stand-in``: ``sbatch``, ``scontrol``, ``squeue`` and ``scancel`` are small shell scripts on
PATH (both slurmkit and submitit call them): ``sbatch`` reads the script and answers a new job id
at once, where a real one waits for slurmctld (tens of ms). That time falls on both sides of the
submit ratio alike, so a real cluster gives a ratio a little nearer 1 than the stand-ins do.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import run as common  # bench/run.py: the process runner, the cluster, the rows

ROOT, PY, NEUTRAL = common.ROOT, common.PY, common.NEUTRAL
SLURMKIT = [PY, "-m", "slurmkit.cli"]

_SBATCH = """#!/bin/sh
# A stand-in for sbatch: reads the script, keeps its --array, answers a new job id.
dir=$(dirname "$0")
n=$(( $(cat "$dir/next" 2>/dev/null || echo 700000) + 1 ))
echo "$n" > "$dir/next"
for a do last=$a; done
sed -n 's/^#SBATCH --array=//p' "$last" > "$dir/array.$n"
case " $* " in *" --parsable "*) echo "$n" ;; *) echo "Submitted batch job $n" ;; esac
"""
_SCONTROL = """#!/bin/sh
# A stand-in for `scontrol show config`: the test cluster's limits, no accounting.
[ "$1 $2" = "show config" ] || exit 1
printf 'MaxArraySize            = 100001\\nMaxJobCount             = 100000\\n'
printf 'AccountingStorageType   = accounting_storage/none\\n'
"""
_SQUEUE = """#!/bin/sh
# A stand-in for squeue --jobs=ID,...: each array held and pending, as one record.
dir=$(dirname "$0")
for a do case "$a" in --jobs=*) jobs=${a#--jobs=} ;; esac; done
for j in $(echo "$jobs" | tr , ' '); do
  [ -f "$dir/array.$j" ] && echo "$j|$(cat "$dir/array.$j")|PENDING|JobHeldUser"
done
exit 0
"""


def stand_in_env(tmp: Path) -> dict[str, str]:
    """This environment with the stand-in Slurm commands first on PATH."""
    bin_dir = tmp / "slurm-bin"
    bin_dir.mkdir()
    for name, text in [("sbatch", _SBATCH), ("scontrol", _SCONTROL), ("squeue", _SQUEUE),
                       ("scancel", "#!/bin/sh\nexit 0\n")]:  # fmt: skip
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    return env | {"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}"}


CPU: dict[str, list[float]] = {}
"""Each side's CPU seconds (user + system, its waited-for processes), by name, for the info
lines: on a shared machine they vary less than the wall times that the targets are about."""


def rounds(sides: dict[str, Callable[[], object]], repeat: int) -> dict[str, list[float]]:
    """Each side timed once a round, the order turned round each round: wall seconds (and
    :data:`CPU`)."""
    names = list(sides)
    times: dict[str, list[float]] = {name: [] for name in names}
    for i in range(repeat):
        for name in names[i % len(names) :] + names[: i % len(names)]:
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            times[name] += common.timed(sides[name], 1)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
            CPU.setdefault(name, []).append(cpu)
    return times


def cpu_row(names: list[str]) -> None:
    """The CPU medians of ``names``, on one line."""
    text = ", ".join(f"{name} {med(CPU[name]) * 1000:.1f} ms" for name in names)
    print(f"  (CPU, user + system: {text})", flush=True)


def med(times: list[float]) -> float:
    return statistics.median(times)


class Verdicts:
    """The targets' lines, printed together at the end."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def at_most(self, name: str, value: float, limit: float, unit: str, note: str) -> None:
        ok = value <= limit
        self.lines.append(
            f"{'PASS' if ok else 'FAIL'}  {name:<44} {value:8.2f}{unit} (limit {limit:g}{unit}, "
            f"{value / limit:.2f} of it) {note}"
        )

    def at_least(self, name: str, value: float, limit: float, unit: str, note: str) -> None:
        ok = value >= limit
        self.lines.append(
            f"{'PASS' if ok else 'FAIL'}  {name:<44} {value:8.2f}{unit} (limit >= {limit:g}{unit}, "
            f"{value / limit:.2f} of it) {note}"
        )

    def show(self) -> None:
        print("\ntargets (medians of the alternating runs above):")
        print("\n".join(self.lines), flush=True)


def bench_help(trees: dict[str, Path], repeat: int, out: Verdicts) -> None:
    """``slurmkit --help`` of each tree against ``python -c "import click"``."""
    sides: dict[str, Callable[[], object]] = {
        f"slurmkit --help ({label})": lambda t=tree: common.run(
            [*SLURMKIT, "--help"], env=common.tree_env(t), cwd=NEUTRAL
        )
        for label, tree in trees.items()
    }
    sides["python -c 'import click'"] = lambda: common.run([PY, "-c", "import click"])
    times = rounds(sides, repeat)
    click = times["python -c 'import click'"]
    cpu_row(list(sides))
    for label in trees:
        name = f"slurmkit --help ({label})"
        common.row(name, times[name], click, "import click", "<= 1.5x")
        cpu = med(CPU[name]) / med(CPU["python -c 'import click'"])
        out.at_most(f"--help / import click ({label})", med(times[name]) / med(click), 1.5, "x",
                    f"({med(times[name]) * 1000:.1f} / {med(click) * 1000:.1f} ms; "
                    f"CPU {cpu:.2f}x)")  # fmt: skip


def bench_submit_status(
    trees: dict[str, Path], repeat: int, out: Verdicts, stand_in: bool, n: int = 10_000
) -> None:
    """A held n-trial sweep submitted by each tree's CLI and by submitit's ``map_array`` (its
    pickles and files included), in turn; then ``status`` of the last one by each tree."""
    tmp = Path(tempfile.mkdtemp(prefix="skbench-"))
    env = stand_in_env(tmp) if stand_in else common.cluster_env()
    if not stand_in:  # the test cluster holds 100,000 jobs: (trees + 1) x n a round
        repeat = max(1, min(repeat, (90_000 // n - 1) // (len(trees) + 1)))
    spec = tmp / "s.yaml"
    spec.write_text(
        f"command: [/bin/true]\nparams: {{i: 'range(0,{n})'}}\n"
        f"output_root: {tmp / 'runs'}\nresources: {{extra: {{hold: true}}}}\n"
    )
    script = common.submitit_baseline(tmp, n)
    dirs: dict[str, list[str]] = {label: [] for label in trees}
    ids: list[str] = []
    cache = str(tmp / "cache")  # the user's submit limits, kept as between a user's submits

    def submit(label: str) -> None:
        argv = [*SLURMKIT, "sweep", str(spec), "--backend", "slurm", "--json"]
        tree_env = common.tree_env(trees[label], {**env, "XDG_CACHE_HOME": cache})
        proc = common.run(argv, env=tree_env, cwd=NEUTRAL)
        dirs[label].append(json.loads(proc.stdout)["sweep_dir"])

    sides: dict[str, Callable[[], object]] = {
        f"submit {n} ({label})": lambda label=label: submit(label) for label in trees
    }
    sides[f"submitit map_array({n})"] = lambda: ids.append(
        common.run([PY, str(script)], env=env).stdout.strip()
    )
    submit(next(iter(trees)))  # untimed: the limits cache filled, the files in the page cache
    times = rounds(sides, repeat)
    theirs = times[f"submitit map_array({n})"]
    cpu_row(list(sides))
    for label in trees:
        ours = times[f"submit {n} ({label})"]
        common.row(f"sweep submit, {n} trials ({label})", ours, theirs, "submitit map_array",
                   "<= 500 ms, >= 10x")  # fmt: skip
        out.at_most(f"submit of {n} trials, whole CLI ({label})", med(ours) * 1000, 500, " ms", "")
        cpu = med(CPU[f"submitit map_array({n})"]) / med(CPU[f"submit {n} ({label})"])
        out.at_least(f"submitit map_array / our submit ({label})", med(theirs) / med(ours), 10, "x",
                     f"({med(theirs) * 1000:.0f} / {med(ours) * 1000:.1f} ms; "
                     f"CPU {cpu:.2f}x)")  # fmt: skip
    last = dirs[next(iter(trees))][-1]
    fresh = {**env, "SLURMKIT_POLL_INTERVAL": "0"}  # asked now, no poll cache
    status = rounds(
        {
            f"status ({label})": lambda t=tree: common.run(
                [*SLURMKIT, "status", last, "--json"], env=common.tree_env(t, fresh), cwd=NEUTRAL
            )
            for label, tree in trees.items()
        },
        repeat,
    )
    cpu_row(list(status))
    for label in trees:
        took = status[f"status ({label})"]
        common.row(f"status, {n}-task sweep ({label})", took, None, "", "<= 500 ms")
        out.at_most(f"status of {n} tasks ({label})", med(took) * 1000, 500, " ms", "")
    jobs = []
    for d in (d for ds in dirs.values() for d in ds):
        for sub in sorted((Path(d) / "submissions").glob("*.json")):
            jobs += [j["job_id"] for j in json.loads(sub.read_text())["jobs"]]
    subprocess.run(["scancel", *jobs, *ids], env=env, capture_output=True)
    shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--before", type=Path, metavar="DIR", help="an earlier checkout")
    parser.add_argument(
        "--tree",
        action="append",
        default=[],
        metavar="LABEL=DIR",
        help="one more checkout to time beside them (repeatable)",
    )
    parser.add_argument("--stand-in", action="store_true", help="stand-in Slurm commands")
    parser.add_argument("--only", default="help,submit", help="comma list of: help, submit")
    args = parser.parse_args(argv)
    trees = {"this tree": ROOT}
    if args.before is not None:
        trees["before"] = args.before.resolve()
    for item in args.tree:
        label, _, tree = item.partition("=")
        trees[label] = Path(tree).resolve()
    for tree in trees.values():  # as pip-installed: byte-compiled
        subprocess.run([PY, "-m", "compileall", "-q", str(tree / "slurmkit")], check=True)
    load = os.getloadavg()[0]
    print(f"slurmkit targets  python {sys.version.split()[0]}  {os.cpu_count()} cores  "
          f"{time.strftime('%Y-%m-%d %H:%M')}  load {load:.1f}  "
          f"{'stand-in Slurm commands' if args.stand_in else 'a Slurm cluster'}")  # fmt: skip
    for label, tree in trees.items():
        rev = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                             capture_output=True, text=True).stdout.strip()  # fmt: skip
        print(f"  {label}: {tree} {rev or '(no git)'}")
    out = Verdicts()
    only = args.only.split(",")
    if "help" in only:
        bench_help(trees, args.repeat, out)
    if "submit" in only:
        bench_submit_status(trees, args.repeat, out, args.stand_in)
    print(f"  load average {load:.1f} before, {os.getloadavg()[0]:.1f} after")
    out.show()


if __name__ == "__main__":
    main()
