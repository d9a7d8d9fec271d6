"""A finished ASHA sweep written as its trials would have left it (no trial runs): the sweep
directory, its ``search`` block in sweep.json, each trial's status, metrics, rung records and
``search.json``. The curve is ``loss = q / 10 + 1 / epoch``: its ranking is known."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from slurmkit import spec as spec_mod
from slurmkit import store
from slurmkit.core import search
from slurmkit.plan import expand, make

SEARCH = {
    "method": "asha",
    "metric": "val_loss",
    "mode": "min",
    "resource": "step",
    "min_resource": 1,
    "max_resource": 9,
    "reduction_factor": 3,
}


ORDER = [8, 4, 6, 0, 7, 2, 5, 1, 3]  # the order trials reach each rung


def loss(q: int, epoch: int, mode: str = "min") -> float:
    value = q / 10 + 1 / epoch
    return value if mode == "min" else -value


def run_search(
    tmp_path: Path,
    count: int = 9,
    mode: str = "min",
    command: str = "x",
    end: dict[int, str] | None = None,
) -> tuple[Path, dict[int, str]]:
    """The sweep directory of ``count`` trials (param ``q`` = 0..count-1) as ASHA left it,
    trials judged in index order; each trial's final state by index. ``end`` overrides the
    state a trial's status records (a FAILED trial, say)."""
    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(f"command: {command}\nparams: {{q: 'range(0,{count})'}}\n")
    s = spec_mod.load(str(spec_path))
    sweep = store.create(make(s, expand(s), str(tmp_path)), str(tmp_path / "runs" / "asha"))
    config = json.loads(Path(sweep.sweep_json).read_text())
    config["search"] = {**SEARCH, "mode": mode}
    Path(sweep.sweep_json).write_text(json.dumps(config))
    found = search.Search.from_dict(config["search"], sweep.sweep_json)
    rows = [r for r in store.manifest(sweep) if r is not None]
    final: dict[int, str] = {}
    alive = sorted(rows, key=lambda r: ORDER.index(r["index"] % len(ORDER)))
    for k, rung in enumerate(found.rungs()):
        survivors = []
        for row in alive:
            value = loss(row["params"]["q"], int(rung), mode)
            search.record(sweep.root, k, row["id"], value)
            seen = search.rung_values(sweep.root, k)
            entry = search.decide(found, k, row["id"], value, rung, seen)
            Path(sweep.trial(row["id"])).mkdir(parents=True, exist_ok=True)
            search.write_decision(sweep.trial(row["id"]), entry)
            if entry["decision"] == search.PRUNED:
                final[row["index"]] = "PRUNED"
                _finish(sweep, row, "PRUNED", int(rung), value)
            else:
                survivors.append(row)
        alive = survivors
    top = int(found.max_resource)
    for row in alive:
        final[row["index"]] = "COMPLETED"
        _finish(sweep, row, "COMPLETED", top, loss(row["params"]["q"], top, mode))
    for index, state in (end or {}).items():
        final[index] = state
        row = rows[index]
        status = json.loads(Path(sweep.status(row["id"])).read_text())
        Path(sweep.status(row["id"])).write_text(json.dumps({**status, "state": state}))
    return Path(sweep.root), final


def _finish(sweep: Any, row: dict[str, Any], state: str, epoch: int, value: float) -> None:
    trial = Path(sweep.trial(row["id"]))
    trial.mkdir(parents=True, exist_ok=True)
    now = time.time()
    attempt = {"n": 1, "state": state, "start": now - 10 * epoch, "end": now, "exit_code": 0}
    status = {"id": row["id"], "index": row["index"], "state": state, "exit_code": 0}
    (trial / "status.json").write_text(json.dumps({**status, "attempts": [attempt]}))
    (trial / "metrics.json").write_text(json.dumps({"val_loss": value, "step": epoch}))
