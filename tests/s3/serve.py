"""moto's standalone server (``python -m moto.server``, from ``moto[server]``) as the tests run it:
the same app, options and werkzeug request log, with these changes. Each request line ends in the
request's ``Range`` header (``-`` without one) where werkzeug writes ``-`` (the tests count
ranged GETs from the log) and shows the raw request target (werkzeug's is percent-decoded and
coloured). A GET of one byte range reads only that range of the stored object: moto reads the
whole object and slices it, which makes a ranged read of a large object (a checkpoint of several
GB) cost the whole object each time. With ``SLURMKIT_TEST_S3_WATCH=PID`` the server exits once
process PID has ended (the pytest or ``make test`` that started it), so a killed run leaves no
server behind.

    python tests/s3/serve.py -H 127.0.0.1 -p PORT 2>requests.log
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Any

from moto import server
from moto.moto_server.werkzeug_app import MotoRequestHandler
from moto.s3.models import FakeKey
from moto.s3.responses import S3Response

ONE_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _Stored:
    """An object's bytes for moto's range handling (``len``, one slice), read only where sliced."""

    def __init__(self, key: FakeKey) -> None:
        self.key = key

    def __len__(self) -> int:
        return int(self.key.size)

    def __getitem__(self, part: slice) -> bytes:
        start, stop, _ = part.indices(len(self))
        with self.key.lock:
            self.key._value_buffer.seek(start)
            return self.key._value_buffer.read(max(0, stop - start))


_ranged = threading.local()  # on while moto's get_object answers a GET of one byte range
_value = FakeKey.value
_get_object = S3Response.get_object


def _key_value(key: FakeKey) -> Any:
    return _Stored(key) if getattr(_ranged, "on", False) else _value.fget(key)


def _ranged_get_object(self: S3Response) -> Any:
    """moto's get_object; for a GET of one byte range (that moto slices: begin <= end, no
    partNumber), with the body read where moto slices it."""
    one = ONE_RANGE.match(self.headers.get("range") or "")
    _ranged.on = bool(
        one and (not one[2] or int(one[2]) >= int(one[1])) and "partNumber" not in self.querystring
    )
    try:
        return _get_object(self)
    finally:
        _ranged.on = False


FakeKey.value = property(_key_value, _value.fset)  # type: ignore[method-assign,assignment]
S3Response.get_object = _ranged_get_object  # type: ignore[method-assign]


class RequestHandler(MotoRequestHandler):
    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        rng = (self.headers.get("Range") or "-").replace(" ", "")
        self.log("info", '"%s" %s %s', self.requestline, code, rng)


def watch(pid: int) -> None:
    while os.path.exists(f"/proc/{pid}"):
        time.sleep(1)
    os._exit(0)


if __name__ == "__main__":
    if os.environ.get("SLURMKIT_TEST_S3_WATCH", "").isdigit():
        pid = int(os.environ["SLURMKIT_TEST_S3_WATCH"])
        threading.Thread(target=watch, args=(pid,), daemon=True).start()
    server.MotoRequestHandler = RequestHandler
    server.main(sys.argv[1:])
