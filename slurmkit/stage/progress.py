"""How a staging run shows its progress: :class:`Reporter`'s callbacks (silent), or
:func:`bar`'s progress bar on stderr (rich, loaded only then)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


class Reporter:
    """Progress callbacks (this one is silent); :func:`bar` draws them."""

    def start(self, total_bytes: int, files: int) -> None:
        pass

    def advance(self, nbytes: int) -> None:
        pass

    def note(self, text: str) -> None:
        import sys

        print(text, file=sys.stderr, flush=True)

    def stop(self) -> None:
        pass


@contextlib.contextmanager
def bar(enabled: bool) -> Iterator[Reporter]:
    """A reporter that draws a progress bar (bytes, bytes/s, ETA) on stderr when ``enabled``
    (stderr a terminal); else the plain one."""
    if not enabled:
        yield Reporter()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    progress = Progress(
        TextColumn("[bold]staging"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[files]}"),
        console=Console(stderr=True),
    )

    class Drawn(Reporter):
        task: Any = None

        def start(self, total_bytes: int, files: int) -> None:
            self.task = progress.add_task("stage", total=total_bytes, files=f"{files} file(s)")
            progress.start()

        def advance(self, nbytes: int) -> None:
            if self.task is not None:
                progress.update(self.task, advance=nbytes)

        def note(self, text: str) -> None:
            from rich.text import Text

            progress.console.print(Text(text, style="dim"))

        def stop(self) -> None:
            progress.stop()

    try:
        yield Drawn()
    finally:
        progress.stop()
