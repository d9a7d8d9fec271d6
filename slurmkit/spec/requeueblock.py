"""The spec's ``requeue`` block (the requeue policy): its keys checked, as a :class:`Requeue`."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from ..core import slurmtime
from ..core.contract import SIGNALS
from ..errors import SpecError
from .check import entries, error, mapping, read, typed
from .model import Requeue

# The shortest requeue.hang_timeout: progress is seen to within ~2 s (runtime.progress, hang).
MIN_HANG_TIMEOUT = 5


def requeue_block(data: Mapping[str, Any], source: str, time: str | None) -> Requeue:
    """The ``requeue`` block of ``data`` (the defaults when there is none), checked against
    ``resources.time`` (``time``): SpecError naming the file and the key."""
    if data.get("requeue") is None:
        return Requeue()
    raw = mapping(data, "requeue", source)
    enabled = read(raw, "requeue.enabled", source)
    sig = str(typed(raw, "requeue.signal", source)).upper()
    sig = sig[3:] if sig.startswith("SIG") else sig
    if sig not in SIGNALS:
        raise error("requeue.signal", raw.get("signal"), source)
    lead = read(raw, "requeue.lead", source)
    limit = slurmtime.parse_seconds(time) if time else None
    if limit is not None and lead >= limit:
        raise SpecError(
            f"lead {lead} s is not shorter than the time limit ({time})",
            file=source,
            key="requeue.lead",
            hint="the signal must come before the limit",
        )
    budgets = dict(Requeue().budgets)
    for cause, count, where in entries(raw, "requeue.budgets", source):
        if count is not None and (
            isinstance(count, bool) or not isinstance(count, int) or count < 0
        ):
            raise SpecError(f"expected a count >= 0 or null, got {count!r}", file=source, key=where)
        budgets[cause] = count
    after = read(raw, "requeue.exclude_after", source)
    if after < 0:
        raise SpecError(
            f"expected a count >= 0, got {after}", file=source, key="requeue.exclude_after"
        )
    return Requeue(
        enabled=enabled,
        signal=sig,
        lead=lead,
        budgets=budgets,
        exclude_after=after,
        node_fault=_node_fault(raw, source),
        hang_timeout=_hang_timeout(raw.get("hang_timeout"), source),
    )


def _hang_timeout(value: Any, source: str) -> int | None:
    """``requeue.hang_timeout`` in seconds: an integer is seconds, a string a Slurm time
    (``0`` and ``UNLIMITED``: off); None where not given (auto)."""
    if value is None:
        return None
    hint = f"seconds (an integer) or a Slurm time ({slurmtime.ACCEPTED}); 0 turns it off"
    seconds: int | None = None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        seconds = value
    elif isinstance(value, str):
        try:
            seconds = 0 if value.strip() == "0" else (slurmtime.parse_seconds(value) or 0)
        except ValueError as exc:
            raise SpecError(str(exc), file=source, key="requeue.hang_timeout", hint=hint) from None
    if seconds is None:
        raise SpecError(
            f"expected seconds or a Slurm time, got {value!r}",
            file=source,
            key="requeue.hang_timeout",
            hint=hint,
        )
    if 0 < seconds < MIN_HANG_TIMEOUT:
        raise SpecError(
            f"{seconds} s is shorter than the watchdog can tell (progress is written once a "
            "second, and read once a second)",
            file=source,
            key="requeue.hang_timeout",
            hint=f"0 (off) or at least {MIN_HANG_TIMEOUT} s",
        )
    return seconds


def _node_fault(raw: Mapping[str, Any], source: str) -> dict[str, Any]:
    """``requeue.node_fault``: regular expressions that compile, and exit codes (0-255)."""
    block = mapping(raw, "requeue.node_fault", source)
    if not block:
        return {}

    def items(name: str, kind: type) -> list[Any]:
        got = block.get(name) or []
        if not isinstance(got, list):
            raise SpecError(
                f"expected a list, got {type(got).__name__} {got!r}",
                file=source,
                key=f"requeue.node_fault.{name}",
            )
        for item in got:
            if not isinstance(item, kind) or isinstance(item, bool):
                what = f"{type(item).__name__} {item!r}"
                raise SpecError(
                    f"expected a list of {kind.__name__}, got {what}",
                    file=source,
                    key=f"requeue.node_fault.{name}",
                )
        return got

    patterns: list[str] = items("patterns", str)
    codes: list[int] = items("exit_codes", int)
    where = "requeue.node_fault."
    for code in codes:
        if not 0 <= code <= 255:
            raise SpecError(
                f"not an exit code (0-255): {code}", file=source, key=where + "exit_codes"
            )
    for pattern in patterns:
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SpecError(
                f"not a regular expression: {pattern!r} ({exc})",
                file=source,
                key=where + "patterns",
            ) from None
    return {"patterns": patterns, "exit_codes": codes}
