"""Slurm's time-limit syntax (``--time``), parsed and checked before ``sbatch`` sees it."""

from __future__ import annotations

import re

_FORMS = (
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d+)$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d+):(\d+)$"), ("h", "m", "s")),
    (re.compile(r"^(\d+)-(\d+)$"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d+):(\d+)$"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d+):(\d+):(\d+)$"), ("d", "h", "m", "s")),
)
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
UNLIMITED = ("INFINITE", "UNLIMITED")
ACCEPTED = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or UNLIMITED"


def parse_seconds(text: str) -> int | None:
    """Seconds in a Slurm time string; ``None`` for unlimited. Raises ValueError when malformed."""
    value = text.strip()
    if value.upper() in UNLIMITED:
        return None
    for pattern, units in _FORMS:
        match = pattern.match(value)
        if match:
            seconds = sum(int(n) * _SECONDS[u] for n, u in zip(match.groups(), units))
            if seconds <= 0:
                raise ValueError(f"time limit {text!r} is zero")
            return seconds
    raise ValueError(f"{text!r} is not a Slurm time ({ACCEPTED})")
