"""What a search would have done on a finished grid: the sweep's own rule replayed (issue 25).

    python bench/asha_grid.py --only train --keep /tmp/asha      # a grid (and an ASHA run) kept
    python bench/asha_replay.py /tmp/asha/train/grid/train-*/ --asha /tmp/asha/train/asha/train-*/

Reads every trial's curve (``val_loss`` by ``step`` in metrics.jsonl) and timing (its attempt's
start, its first and last report) from a sweep whose trials all ran to ``max_resource``, and
replays asynchronous successive halving on them with ``slurmkit.core.search.decide`` (the
decision the trials themselves make): ``max_parallel`` slots, trials started in an order as
slots free, each trial's start-up and epoch time as measured, judged at each rung against the
records made before it. For each ``--search MIN_RESOURCE,REDUCTION_FACTOR``: the trial-epochs
and the trials' run time against the grid's, and the best completed trial's loss against the
grid's best, in the sweep's own order and in ``--orders`` shuffled ones (arrival order decides
which trials an asynchronous search keeps). ``--asha DIR``: a real run of the same sweep under
the first ``--search``, to check the replay (its trial-epochs, run time and completed trials
against the replay's in the sweep's order).
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from slurmkit.core import search

METRIC = "val_loss"


@dataclass(frozen=True)
class Curve:
    trial: str
    values: dict[int, float]  # resource (step) -> value
    lead: float  # attempt start to the first report, less one epoch
    overhead: float  # the attempt's run time less its epochs: start-up and end
    epoch: float  # seconds per resource unit


def trials(sweep: Path) -> list[tuple[str, list[dict], list[dict]]]:
    """Each trial's id, its reports of the metric and its attempts, in the sweep's order."""
    out = []
    for line in (sweep / "trials.jsonl").read_text().splitlines():
        tid = json.loads(line)["id"]
        here = sweep / "trials" / tid
        rows = [json.loads(x) for x in (here / "metrics.jsonl").read_text().splitlines()]
        attempts = json.loads((here / "status.json").read_text())["attempts"]
        out.append((tid, [r for r in rows if METRIC in r], attempts))
    return out


def curves(sweep: Path) -> list[Curve]:
    """Every trial's curve and timing (one attempt each: a grid run to the end)."""
    out = []
    for tid, rows, (attempt,) in trials(sweep):
        epoch = (rows[-1]["time"] - rows[0]["time"]) / max(1, rows[-1]["step"] - rows[0]["step"])
        values = {r["step"]: r[METRIC] for r in rows}
        run_s = attempt["end"] - attempt["start"]
        lead = rows[0]["time"] - attempt["start"] - epoch
        out.append(Curve(tid, values, lead, run_s - rows[-1]["step"] * epoch, epoch))
    return out


@dataclass
class Outcome:
    epochs: int
    run_s: float
    completed: dict[str, float]  # trial -> final value


def replay(cs: list[Curve], s: search.Search, slots: int, order: list[int]) -> Outcome:
    """Asynchronous successive halving over ``cs`` started in ``order`` on ``slots`` slots: a
    trial reports resource k at its start + lead + k epochs, and frees its slot at its start +
    overhead + the epochs it ran."""
    last = int(s.max_resource)
    rungs = {int(r): k for k, r in enumerate(s.rungs())}
    seen: dict[int, dict[str, float]] = {k: {} for k in rungs.values()}
    events: list[tuple[float, int, int, float]] = []  # (time, trial index, step, its start)
    todo = iter(order)
    epochs, run_s, completed = 0, 0.0, {}

    def start(at: float) -> None:
        i = next(todo, None)
        if i is not None:
            heapq.heappush(events, (at + cs[i].lead + cs[i].epoch, i, 1, at))

    for _ in range(slots):
        start(0.0)
    while events:
        now, i, step, began = heapq.heappop(events)
        c = cs[i]
        value = c.values[step]
        stop = step == last
        if step in rungs:
            k = rungs[step]
            seen[k][c.trial] = value
            entry = search.decide(s, k, c.trial, value, step, dict(seen[k]))
            stop = stop or entry["decision"] == search.PRUNED
        if not stop:
            heapq.heappush(events, (now + c.epoch, i, step + 1, began))
            continue
        epochs += step
        run_s += c.overhead + step * c.epoch
        if step == last and not (step in rungs and entry["decision"] == search.PRUNED):
            completed[c.trial] = value
        start(began + c.overhead + step * c.epoch)
    return Outcome(epochs, run_s, completed)


def real_run(sweep: Path) -> Outcome:
    """A finished sweep's trial-epochs, run time and the trials that reached its last step."""
    runs = [
        (tid, {r["step"]: r[METRIC] for r in rows}, sum(a["end"] - a["start"] for a in attempts))
        for tid, rows, attempts in trials(sweep)
    ]
    last = max(max(curve) for _, curve, _ in runs)
    return Outcome(
        sum(max(curve) for _, curve, _ in runs),
        sum(run_s for _, _, run_s in runs),
        {tid: curve[last] for tid, curve, _ in runs if last in curve},
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("grid", type=Path, help="a sweep directory whose trials all ran to the end")
    p.add_argument("--asha", type=Path, help="a real run of the sweep under the first --search")
    p.add_argument("--search", nargs="+", default=["1,3", "1,2", "1,4", "2,3", "3,3"])
    p.add_argument("--slots", type=int, default=2, help="max_parallel")
    p.add_argument("--orders", type=int, default=20)
    args = p.parse_args()
    cs = curves(args.grid)
    last = max(max(c.values) for c in cs)
    grid_run = sum(c.overhead + last * c.epoch for c in cs)
    grid_epochs = last * len(cs)
    best = min(c.values[last] for c in cs)
    overhead = statistics.median(c.overhead for c in cs)
    epoch = statistics.median(c.epoch for c in cs)
    print(
        f"grid: {len(cs)} trials x {last}; start-up and end {overhead:.2f} s, epoch {epoch:.3f} s"
        f" (medians), run time {grid_run:.1f} s; best {best:.5f}"
    )
    print("| min_resource, rf | order | trial-epochs | run time | best's gap | within 1 % |")
    print("| --- | --- | --- | --- | --- | --- |")
    for pair in args.search:
        lo, rf = (int(x) for x in pair.split(","))
        s = search.Search.from_dict(
            {"metric": METRIC, "min_resource": lo, "max_resource": last, "reduction_factor": rf},
            "--search",
        )
        own = replay(cs, s, args.slots, list(range(len(cs))))
        rows = [("the sweep's", [own])]
        shuffled = []
        for seed in range(args.orders):
            order = list(range(len(cs)))
            random.Random(seed).shuffle(order)
            shuffled.append(replay(cs, s, args.slots, order))
        rows.append((f"{args.orders} shuffled (median)", shuffled))
        for label, outs in rows:
            er = statistics.median(o.epochs / grid_epochs for o in outs)
            rr = statistics.median(o.run_s / grid_run for o in outs)
            gaps = [min(o.completed.values()) / best - 1 for o in outs]
            hits = sum(g <= 0.01 for g in gaps)
            print(
                f"| {lo}, {rf} | {label} | {er:.3f}x | {rr:.3f}x | "
                f"{100 * statistics.median(gaps):+.1f} % | {hits}/{len(outs)} |"
            )
        if args.asha and pair == args.search[0]:
            real = real_run(args.asha)
            print(
                f"check, a real run in the sweep's order: {real.epochs} trial-epochs (replay "
                f"{own.epochs}), run time {real.run_s / grid_run:.3f}x (replay "
                f"{own.run_s / grid_run:.3f}x), the same trials completed: "
                f"{sorted(real.completed) == sorted(own.completed)}"
            )


if __name__ == "__main__":
    main()
