"""Where things live in a sweep directory (stdlib only: used inside jobs too).

::

    SWEEP_DIR/
      sweep.json            resolved spec, machine form (the runtime reads this)
      spec.yaml             resolved spec, human form
      trials.jsonl          manifest: one {"index", "id", "params"} per line
      submissions/NNNN.json one per submission: backend, job ids, array specs, indices
      scripts/NNNN-C.sbatch the rendered batch script of submission NNNN, array chunk C
      logs/                 Slurm's own output per array task (%A_%a.out)
      trials/ID/            status.json, metrics.json, metrics.jsonl, output.log
                            (and output.err with logs.stderr: separate), checkpoints.jsonl
                            (step and time of each checkpoint the trial committed)
      nodes/TRIAL-N.json    a failure attributed to its node (core/badnodes.py)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

DEFAULT_LOG_NAME = "%A_%a"  # Slurm's own log of an array task, without .out / .err
# A trial's checkpoint journal (runtime/checkpoint/journal.py appends, `slurmkit report` reads).
CHECKPOINT_JOURNAL = "checkpoints.jsonl"
# The job comment of a sweep's arrays, `slurmkit:SWEEP_DIR` (render.py writes it, accounting
# keeps it with AccountingStoreFlags=job_comment, `slurmkit report --since` reads it).
COMMENT_PREFIX = "slurmkit:"


def slurm_log_name(pattern: str | None, name: str, standalone: bool) -> str:
    """The sbatch file-name pattern of Slurm's own log (spec ``logs.name``). By default a
    standalone script's goes beside where it was submitted, so it carries the sweep's name."""
    if pattern and pattern != DEFAULT_LOG_NAME:
        return pattern
    return f"{name}-{DEFAULT_LOG_NAME}" if standalone else DEFAULT_LOG_NAME


class SweepDir(NamedTuple):
    """Paths inside one sweep directory (immutable; a NamedTuple loads faster than a dataclass)."""

    root: str

    @property
    def sweep_json(self) -> str:
        return os.path.join(self.root, "sweep.json")

    @property
    def spec_yaml(self) -> str:
        return os.path.join(self.root, "spec.yaml")

    @property
    def manifest(self) -> str:
        return os.path.join(self.root, "trials.jsonl")

    @property
    def submissions(self) -> str:
        return os.path.join(self.root, "submissions")

    @property
    def scripts(self) -> str:
        return os.path.join(self.root, "scripts")

    @property
    def logs(self) -> str:
        return os.path.join(self.root, "logs")

    @property
    def trials(self) -> str:
        return os.path.join(self.root, "trials")

    def trial(self, trial_id: str) -> str:
        return os.path.join(self.root, "trials", trial_id)

    def status(self, trial_id: str) -> str:
        return os.path.join(self.trial(trial_id), "status.json")

    def metrics(self, trial_id: str) -> str:
        return os.path.join(self.trial(trial_id), "metrics.json")

    def output(self, trial_id: str) -> str:
        return os.path.join(self.trial(trial_id), "output.log")

    def errors(self, trial_id: str) -> str:
        """The trial's stderr, when the spec keeps it apart (``logs.stderr: separate``)."""
        return os.path.join(self.trial(trial_id), "output.err")

    def checkpoint_journal(self, trial_id: str) -> str:
        """One line per checkpoint the trial committed (step, time): it outlives pruning."""
        return os.path.join(self.trial(trial_id), CHECKPOINT_JOURNAL)

    def exists(self) -> bool:
        return os.path.isfile(self.manifest) and os.path.isfile(self.sweep_json)

    def iter_manifest(self) -> Iterator[dict[str, Any]]:
        """Yield manifest rows in index order."""
        with open(self.manifest, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)

    def manifest_row(self, index: int) -> dict[str, Any]:
        """The manifest row of trial ``index`` (a scan: rows are short and read once per task)."""
        for row in self.iter_manifest():
            if row["index"] == index:
                return row
        raise LookupError(f"{self.manifest}: no trial with index {index}")
