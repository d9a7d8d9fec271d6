"""The sweep's bad nodes (owner: the nodes part of issue 24; this is the release part's minimal
stand-in with the agreed signatures: no node is excluded yet)."""

from __future__ import annotations


def excluded(sweep_dir: str) -> list[str]:
    """The node names excluded from this sweep (sorted)."""
    return []


def for_trial(sweep_dir: str, trial_id: str) -> list[str]:
    """The nodes this trial's next attempt must avoid."""
    return []
