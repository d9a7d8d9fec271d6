"""ASHA against the full grid, same run, on the local backend (issue 25, Proof and Performance).

    python bench/asha_grid.py                       # the synthetic curve, then examples/train.py
    python bench/asha_grid.py --only curve --max-parallel 4
    python bench/asha_grid.py --only train --samples 4096  # train.py default data

Each workload runs twice, one after the other, on the same 81 configurations: every trial to
``max_resource`` (the grid), then the same sweep under ``search: asha`` (``--min-resource``,
default 1, max_resource 27, ``--reduction-factor``, default 3: rungs at epochs 1, 3 and 9).
``--keep DIR`` keeps both sweeps (``bench/asha_replay.py`` replays other searches on the grid's
curves). Workloads:

- ``curve``: the synthetic curve of the cluster proof (``tests/payloads/asha_curve.py``):
  ``val_loss = q / 81 + 1 / epoch``, its ranking known, 0.02 s per epoch;
- ``train``: ``examples/train.py`` (an MLP on synthetic data, CPU, one thread) in the issue's
  spec: ``lr: loguniform(0.003, 1.0)`` drawn 27 times (``--seed``) x ``hidden`` 16, 64, 256,
  batch 128, 27 epochs of ``--samples`` points (a quarter held out: ``val_loss``, reported every
  epoch);
- ``train-grid``: ``examples/train.py``'s grid of 9 learning rates from the smallest up x 3
  widths x 3 batch sizes: the arrival order asynchronous halving likes least (trials arrive from
  the worst learning rate up, and each that beats the few before it at a rung continues).

Per run: the trial-epochs run (the last epoch each trial reported), the trials' run time (the
runtime's attempt records, process start-up included: what a GPU allocation would be charged),
the best configuration (lowest ``val_loss`` at epoch 27 among the trials that got there) and its
loss. Targets: ASHA's best is the grid's, or within 1 % of its loss; its trial-epochs and run
time are at most 1/3 of the grid's. The run time splits into a start-up per trial and a cost per
epoch, both solved from the two runs' figures (``run = trials x start-up + epochs x
per-epoch``): where start-up dominates (train.py's default 4,096 points: torch's import and
first optimizer step, ~3 s, against epochs of ~0.02 s) the run-time ratio tells more about
start-up than about the search; ``--samples`` sets what an epoch costs.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from asha_replay import trials  # noqa: E402  (beside this file: each trial's reports and attempts)

import slurmkit  # noqa: E402

EPOCHS = 27
TRIALS = 81  # each workload's configurations


def search(min_resource: int, reduction_factor: int) -> str:
    """The search block the ASHA run adds (the issue's: 1 and 3)."""
    return (
        "search: {method: asha, metric: val_loss, mode: min, resource: step, "
        f"min_resource: {min_resource}, max_resource: {EPOCHS}, "
        f"reduction_factor: {reduction_factor}}}\n"
    )


def workloads(samples: int, seed: int) -> dict[str, str]:
    """Each workload's sweep, without its search."""
    train = ROOT / "examples" / "train.py"
    return {
        "curve": f"""
name: curve
command: [python, {ROOT / "tests" / "payloads" / "asha_curve.py"}]
params: {{i: 'range(0,81)', epochs: [{EPOCHS}], epoch_time: [0.02]}}
""",
        "train": f"""
name: train
command: [python, {train}]
params:
  lr: loguniform(0.003,1.0)
  hidden: choice(16,64,256)
  batch_size: 128
  samples: {samples}
  epochs: {EPOCHS}
  eval_every: 1
num_samples: 27
seed: {seed}
""",
        "train-grid": f"""
name: train-grid
command: [python, {train}]
params:
  lr: [0.003, 0.006, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0]
  hidden: [16, 64, 256]
  batch_size: [32, 64, 128]
  epochs: [{EPOCHS}]
  eval_every: [1]
  samples: [{samples}]
""",
    }


def run(body: str, where: Path, max_parallel: int) -> dict[str, Any]:
    """One sweep of ``body`` on the local backend; its figures."""
    where.mkdir(parents=True)
    spec = where / "spec.yaml"
    spec.write_text(body + f"output_root: {where}\nmax_parallel: {max_parallel}\n")
    began = time.monotonic()
    sw = slurmkit.Sweep.load(str(spec)).submit(backend="local", progress=False)
    wall = time.monotonic() - began
    root = Path(sw.sweep_dir)
    params = {row["id"]: json.dumps(row["params"], sort_keys=True) for row in sw.trials}
    epochs, run_s, finals = 0, 0.0, {}
    for tid, rows, attempts in trials(root):
        curve = {x["step"]: x["val_loss"] for x in rows}
        epochs += max(curve, default=0)
        if EPOCHS in curve:
            finals[params[tid]] = curve[EPOCHS]
        run_s += sum(a["end"] - a["start"] for a in attempts)
    best = min(finals, key=finals.__getitem__)
    return {
        "counts": sw.status().counts,
        "epochs": epochs,
        "run_s": run_s,
        "wall_s": wall,
        "best": json.loads(best),
        "best_loss": finals[best],
    }


def compare(
    name: str, body: str, block: str, max_parallel: int, keep: str | None
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix=f"asha-{name}-") as tmp:
        where = Path(keep) / name if keep else Path(tmp)
        grid = run(body, where / "grid", max_parallel)
        asha = run(body + block, where / "asha", max_parallel)
    # run time = trials x start-up + trial-epochs x epoch: the two runs' figures solved for both
    per_epoch = (grid["run_s"] - asha["run_s"]) / (grid["epochs"] - asha["epochs"])
    start_up = (grid["run_s"] - grid["epochs"] * per_epoch) / TRIALS
    same = asha["best"] == grid["best"]
    close = asha["best_loss"] <= grid["best_loss"] * 1.01
    return {
        "workload": name,
        "grid": grid,
        "asha": asha,
        "epochs_ratio": asha["epochs"] / grid["epochs"],
        "run_ratio": asha["run_s"] / grid["run_s"],
        "wall_ratio": asha["wall_s"] / grid["wall_s"],
        "per_epoch_s": per_epoch,
        "start_up_s": start_up,
        "same_best": same,
        "loss_gap": asha["best_loss"] / grid["best_loss"] - 1,
        "ok": (same or close)
        and asha["epochs"] <= grid["epochs"] / 3
        and asha["run_s"] <= grid["run_s"] / 3,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", choices=["curve", "train", "train-grid"])
    parser.add_argument("--max-parallel", type=int, default=os.cpu_count() or 2)
    parser.add_argument(
        "--samples", type=int, default=2**18, help="train.py's data points (an epoch's cost)"
    )
    parser.add_argument("--seed", type=int, default=0, help="the train workload's draws")
    parser.add_argument("--keep", help="run the sweeps under this directory and keep them")
    parser.add_argument("--min-resource", type=int, default=1)
    parser.add_argument("--reduction-factor", type=int, default=3)
    args = parser.parse_args()
    os.environ.setdefault("SLURMKIT_PYTHON", sys.executable)
    bodies = workloads(args.samples, args.seed)
    for name in [args.only] if args.only else ["curve", "train"]:
        block = search(args.min_resource, args.reduction_factor)
        r = compare(name, bodies[name], block, args.max_parallel, args.keep)
        g, a = r["grid"], r["asha"]
        knobs = "" if name == "curve" else f", samples {args.samples}, seed {args.seed}"
        print(f"## {name} (81 trials, max_parallel {args.max_parallel}{knobs})\n{block}")
        print("| run | states | trial-epochs | trial run time | wall | best | its val_loss |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for label, x in (("grid", g), ("asha", a)):
            print(
                f"| {label} | {x['counts']} | {x['epochs']} | {x['run_s']:.1f} s | "
                f"{x['wall_s']:.1f} s | {x['best']} | {x['best_loss']:.5f} |"
            )
        print(
            f"asha/grid: trial-epochs {r['epochs_ratio']:.3f}, run time {r['run_ratio']:.3f}, "
            f"wall {r['wall_ratio']:.3f}; same best: {r['same_best']} (loss gap "
            f"{100 * r['loss_gap']:+.2f} %); targets met: {r['ok']}"
        )
        print(
            f"run time = trials x {r['start_up_s']:.2f} s (start-up) + trial-epochs x "
            f"{r['per_epoch_s']:.3f} s (both runs solved): start-up is "
            f"{100 * TRIALS * r['start_up_s'] / a['run_s']:.0f} % of asha's run time, "
            f"{100 * TRIALS * r['start_up_s'] / g['run_s']:.0f} % of the grid's\n",
            flush=True,
        )


if __name__ == "__main__":
    main()
