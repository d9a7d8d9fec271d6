"""An exclusive lock for a directory on a shared filesystem (NFS included), standard library only.

The lock is a small JSON file (holder's host, pid, purpose, start time), made in full under a
temporary name and then hard-linked to the lock's name: ``link`` is atomic on NFS and fails when
the name exists, so two holders can never both succeed, and nobody ever sees a half-written
lock. The holder refreshes the file's modification time (its heartbeat) every few seconds. A
pid cannot be checked from another node, so a lock whose heartbeat is older than
``stale_after`` seconds is stale: a waiter renames it away (only one rename of a file can
succeed), checks that it moved the stale lock and not a fresh one, deletes it and tries again.
A holder known to be dead is broken the same way at once: a process of this host that runs no
more (:func:`slurmkit.core.pids.gone`), or one the caller's ``dead`` test names.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from . import pids

LOCK_NAME = ".slurmkit.lock"
STALE_AFTER = 60.0  # seconds without a heartbeat
HEARTBEAT = 5.0


class LockBusy(Exception):
    """Another process holds the lock (``holder``: what its lock file says, ``age``: seconds
    since its last heartbeat)."""

    def __init__(self, path: str, holder: dict[str, Any], age: float) -> None:
        super().__init__(f"{path} is locked by {describe(holder)} (heartbeat {age:.0f} s ago)")
        self.path, self.holder, self.age = path, holder, age


def describe(holder: dict[str, Any]) -> str:
    """``resume by pid 4242 on login1 since 12:03:44``, from a lock file's contents."""
    since = time.strftime("%H:%M:%S", time.localtime(holder.get("time", 0)))
    return (
        f"{holder.get('purpose', '?')} by pid {holder.get('pid', '?')} on "
        f"{holder.get('host', '?')} since {since}"
    )


def read(path: str) -> tuple[dict[str, Any], float] | None:
    """The holder of the lock file ``path`` and the age of its heartbeat; None if unlocked."""
    try:
        with open(path, "rb") as fh:
            age = time.time() - os.fstat(fh.fileno()).st_mtime
            raw = fh.read()
    except FileNotFoundError:
        return None
    try:
        holder = json.loads(raw)
    except ValueError:  # damaged: it still holds the lock until it is stale or broken by hand
        holder = {}
    return (holder if isinstance(holder, dict) else {}), age


class Lock:
    """The lock of one directory; :meth:`acquire` (or ``with lock.held(...)``) takes it."""

    def __init__(
        self, directory: str, *, stale_after: float = STALE_AFTER, heartbeat: float = HEARTBEAT
    ) -> None:
        self.path = os.path.join(directory, LOCK_NAME)
        self.stale_after, self.heartbeat = stale_after, heartbeat
        self.token = ""
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def acquire(
        self,
        purpose: str,
        wait: float = 10.0,
        *,
        about: dict[str, Any] | None = None,
        dead: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        """Take the lock, waiting up to ``wait`` seconds for its holder (and breaking a stale
        lock, or one whose holder is dead); LockBusy when it is still held then. ``about`` goes
        into the lock file for others to read; ``dead(holder)`` says a holder is surely gone."""
        self.token = os.urandom(8).hex()
        holder = {
            **(about or {}),
            **pids.identity(os.getpid()),
            "purpose": purpose,
            "time": time.time(),
            "token": self.token,
        }
        tmp = f"{self.path}.{self.token}"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(holder, fh)
        try:
            deadline = time.monotonic() + wait
            delay = 0.05
            while True:
                try:
                    os.link(tmp, self.path)
                    break
                except FileExistsError:
                    pass
                found = read(self.path)
                if found is not None and found[1] > self.stale_after:
                    self._break(found[0].get("token"), stale=True)
                    continue
                if found is not None and (pids.gone(found[0]) or (dead and dead(found[0]))):
                    self._break(found[0].get("token"), stale=False)
                    continue
                if time.monotonic() >= deadline:
                    holder_now, age = found if found is not None else ({}, 0.0)
                    raise LockBusy(self.path, holder_now, age) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
        finally:
            os.unlink(tmp)
        self._stop.clear()
        self._beat = threading.Thread(target=self._heartbeat, name="slurmkit-lock", daemon=True)
        self._beat.start()

    def moved(self, directory: str) -> None:
        """The locked directory was renamed to ``directory`` (the lock with it)."""
        self.path = os.path.join(directory, LOCK_NAME)

    def release(self) -> None:
        """Give the lock back (only if it is still ours; again: nothing)."""
        self._stop.set()
        if self._beat is not None:
            self._beat.join()
            self._beat = None
        found = read(self.path) if self.token else None
        if found is not None and found[0].get("token") == self.token:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        self.token = ""

    @contextlib.contextmanager
    def held(self, purpose: str, wait: float = 10.0) -> Iterator[Lock]:
        self.acquire(purpose, wait)
        try:
            yield self
        finally:
            self.release()

    def _heartbeat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            with contextlib.suppress(OSError):  # a passing NFS error: beat again next time
                os.utime(self.path)

    def _break(self, token: str | None, *, stale: bool) -> None:
        """Move the stale or dead holder's lock (the one holding ``token``) aside and delete it.
        What was moved may be another lock by then (a waiter broke that one and took it): that
        one goes back, and this waiter waits for it."""
        aside = f"{self.path}.stale-{os.urandom(4).hex()}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # another waiter moved it first
        found = read(aside)
        if found is not None and (
            found[0].get("token") != token or (stale and found[1] <= self.stale_after)
        ):
            try:
                os.link(aside, self.path)  # not the stale one: it goes back
            except FileExistsError:
                return  # taken meanwhile: keep the moved lock, a holder may still refresh it
        os.unlink(aside)


def unlock(directory: str) -> dict[str, Any] | None:
    """Break the lock of ``directory`` by hand; the holder it had, or None if unlocked."""
    path = os.path.join(directory, LOCK_NAME)
    found = read(path)
    if found is None:
        return None
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return found[0]
