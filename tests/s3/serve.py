"""moto's standalone server (``python -m moto.server``, from ``moto[server]``) as the tests run it:
the same app, options and werkzeug request log, with two changes. Each request line ends in the
request's ``Range`` header (``-`` without one) where werkzeug writes ``-`` (the tests count
ranged GETs from the log) and shows the raw request target (werkzeug's is percent-decoded and
coloured). With ``SLURMKIT_TEST_S3_WATCH=PID`` the server exits once process PID has ended (the
pytest or ``make test`` that started it), so a killed run leaves no server behind.

    python tests/s3/serve.py -H 127.0.0.1 -p PORT 2>requests.log
"""

from __future__ import annotations

import os
import sys
import threading
import time

from moto import server
from moto.moto_server.werkzeug_app import MotoRequestHandler


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
