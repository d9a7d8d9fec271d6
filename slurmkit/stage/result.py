"""What :func:`slurmkit.stage.stage` did, as a line of text or a JSON object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Result:
    """What :func:`stage` did (or, with ``dry_run``, would do)."""

    source: str
    destination: str
    files: int = 0  # in the dataset
    total_bytes: int = 0
    copied: int = 0  # files fetched by this run
    bytes: int = 0  # bytes fetched by this run
    skipped: int = 0  # files already complete at DST
    seconds: float = 0.0
    published: bool = False  # this run published DST
    waited: bool = False  # another stager held the lock first
    verified: int | None = None  # files whose checksum --verify read again
    dry_run: bool = False
    to_copy: list[tuple[str, int | None]] = field(default_factory=list)  # dry run: what and size

    def as_dict(self) -> dict[str, Any]:
        out = {
            k: getattr(self, k)
            for k in ("source", "destination", "files", "total_bytes", "copied", "bytes")
        }
        out |= {"skipped": self.skipped, "seconds": round(self.seconds, 3)}
        out |= {"published": self.published, "waited": self.waited, "verified": self.verified}
        if self.dry_run:
            out |= {"dry_run": True, "to_copy": [{"path": p, "size": s} for p, s in self.to_copy]}
        return out

    def text(self) -> str:
        if self.dry_run:
            size = sum(s or 0 for _, s in self.to_copy)
            lines = [
                f"dry run: would copy {len(self.to_copy)} of {self.files} file(s), "
                f"{human(size)}, to {self.destination}; {self.skipped} already complete; "
                "nothing was written"
            ]
            lines += [f"  {p}  {human(s or 0)}" for p, s in self.to_copy[:20]]
            if len(self.to_copy) > 20:
                lines.append(f"  ... and {len(self.to_copy) - 20} more (--json lists them all)")
            return "\n".join(lines)
        rate = self.bytes / self.seconds if self.seconds > 0 else 0.0
        what = (
            f"staged {self.files} file(s), {human(self.total_bytes)}, at {self.destination}: "
            f"copied {self.copied} ({human(self.bytes)}, {human(rate)}/s), "
            f"{self.skipped} already complete"
        )
        if self.waited and not self.published:
            what += " (another stager copied it; this one waited)"
        if self.verified is not None:
            what += f"; verified {self.verified} checksum(s)"
        return what


def human(n: float) -> str:
    """A number of bytes in B, KiB, MiB, GiB or TiB."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
