"""CPython's private names that the runtime cannot do without, each here once.

``threading._register_atexit`` (CPython 3.9 on; tested with 3.11), in
:func:`before_thread_shutdown`. It runs a function when the main thread ends, before
``concurrent.futures`` stops taking work (which it registers the same way at import) and before
the interpreter joins non-daemon threads. ``atexit`` runs too late for the checkpoint mirror's
last upload: after that point an object store client whose connection needs a fresh name lookup
(aiohttp resolves names through asyncio's default executor, a ``ThreadPoolExecutor``) fails with
"cannot schedule new futures after shutdown". Measured here (s3fs against the test S3 server,
endpoint ``localhost``, an upload 17 s after the first, past aiohttp's DNS cache): from an
``atexit`` hook it fails so; from :func:`before_thread_shutdown` it succeeds. No public hook
runs at that moment. Without the private function (another Python), ``atexit`` is the fallback.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Callable


def before_thread_shutdown(func: Callable[[], object]) -> None:
    """Call ``func`` at the interpreter's exit while ``concurrent.futures`` still takes work
    (the ones registered later run first)."""
    register = getattr(threading, "_register_atexit", None)
    if register is None:  # not CPython 3.9+: the closest public hook
        atexit.register(func)
    else:
        register(func)
