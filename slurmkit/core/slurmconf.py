"""``scontrol show config``'s text as a dict: what the login side (backends) and the runtime
(the releaser's hold) both read. Stdlib only."""

from __future__ import annotations


def parse(text: str) -> dict[str, str]:
    """``Key = value`` lines as ``{Key: value}`` (the value may hold ``=``: ``AuthInfo =
    cred_expire=120``); other lines (headers, blanks) are skipped."""
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            out[key.strip()] = value.strip()
    return out
