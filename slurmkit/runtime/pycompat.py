"""CPython's exit hooks that the runtime cannot do without, each here once: a private name
(``threading._register_atexit``) and ``os._exit`` (documented, but off limits outside a shim).

``threading._register_atexit`` (CPython 3.9 on; tested with 3.11), in
:func:`before_thread_shutdown`. It runs a function when the main thread ends, before
``concurrent.futures`` stops taking work (which it registers the same way at import) and before
the interpreter joins non-daemon threads. ``atexit`` runs after both, too late for the
checkpoints' exit guarantee (a pending save is committed and pruned, the mirror's last upload
done, within ``mirror_wait``): (1) the save's writer and pruning run on ``ThreadPoolExecutor``
threads, which then refuse work (``test_a_pending_async_save_is_committed_and_pruned_at_exit``
in tests/test_checkpoint.py fails with ``atexit``); (2) an object
store client whose connection needs a fresh name lookup fails there too (aiohttp resolves names
through asyncio's default executor): measured with s3fs against the test S3 server, endpoint
``localhost``, an upload 17 s after the first (past aiohttp's DNS cache) fails from an
``atexit`` hook ("cannot schedule new futures after shutdown") and succeeds from this one. Our
own executors could be replaced by plain threads; the client library's cannot. No public hook
runs at that moment. Without the private function (another Python), ``atexit`` is the fallback.

``os._exit`` in :func:`exit_now`, for a signal handler that must end the process whatever code
it interrupted (tested with 3.11): ``sys.exit`` there raises SystemExit at any line of the user's
callable, which its ``except BaseException`` (a retry loop) catches and goes on running, and once
out the interpreter still waits for the callable's non-daemon threads
(``tests/test_attempt.py::test_a_function_trial_that_swallows_every_exception_still_exits_for_its_requeue``
holds it).
"""

from __future__ import annotations

import atexit
import os
import sys
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


def exit_now(code: int) -> None:
    """End the process with ``code`` at once: standard streams flushed, no exit handlers, no
    wait for other threads (see the module doc)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
