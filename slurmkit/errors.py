"""The one exception type for user mistakes: the CLI prints it without a traceback."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


class UserError(Exception):
    """A mistake in the user's input or environment, reported as ``file: key: message (hint)``.

    ``exit_code`` is 2 for bad input (usage) and 1 for a failure the user must look into.
    """

    exit_code = 2

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        key: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.key = key
        self.hint = hint

    @classmethod
    def failure(cls, message: str, hint: str | None = None) -> UserError:
        """A failure the user must look into (exit 1), not a mistake in the input."""
        error = cls(message, hint=hint)
        error.exit_code = 1
        return error

    def __str__(self) -> str:
        file = "''" if self.file == "" else self.file  # an empty path given is still named
        where = ": ".join(str(p) for p in (file, self.key) if p)
        text = f"{where}: {self.message}" if where else self.message
        return f"{text}\n  hint: {self.hint}" if self.hint else text


class SpecError(UserError):
    """The sweep or job spec (file or overrides) is invalid."""


class Busy(UserError):
    """Another command holds the sweep directory's lock (its holder is named)."""

    exit_code = 1


class SchedulerError(UserError):
    """The scheduler refused a request (its own message is relayed)."""

    exit_code = 1


def reject_unknown(
    data: Iterable[Any], allowed: Sequence[str], *, file: str | None, prefix: str = ""
) -> None:
    """The one "unknown key" error: raise SpecError for the first key of ``data`` (a mapping's
    keys) that is not ``allowed``, naming it as ``prefix + key``."""
    unknown = [k for k in data if k not in allowed]
    if unknown:
        import difflib  # ~6 ms: only a mistake pays for the suggestion

        close = difflib.get_close_matches(str(unknown[0]), allowed, n=1)
        raise SpecError(
            f"unknown key {unknown[0]!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
            file=file,
            key=f"{prefix}{unknown[0]}",
            hint=f"allowed keys: {', '.join(allowed)}",
        )
