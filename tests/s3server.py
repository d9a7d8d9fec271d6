"""A real S3 endpoint for tests: moto's standalone server (``moto[server]``) in a process of its
own on a free loopback port, started by ``tests/s3/up.sh``. ``make test`` starts one before
pytest and stops it after, and hands it over in ``SLURMKIT_TEST_S3_URL`` and
``SLURMKIT_TEST_S3_LOG`` (its request log); without them (``pytest tests/test_stage.py`` alone),
or in a second pytest-xdist worker, the first ``Server()`` starts one the same way for this
process, stopped at its exit. Jobs on
the test cluster reach it on 127.0.0.1 like any other process here.

Requests are counted where they arrive: from the server's request log (``tests/s3/serve.py``:
werkzeug's, with each request's ``Range`` header), from the moment a ``Server()`` reset the
server's state (``POST /moto-api/reset``) on. The helpers' own requests (``put``, ``keys``...)
carry the query parameter ``slurmkit-test`` and are left out.

Fault injection (``corrupt``: a bit flipped in a GET's body; ``gone``: a listed key answered 404;
and whatever a subclass adds in ``intercept``) is an error path a real server cannot produce on
demand: a small loopback proxy in this process, in front of the server, does it, and only for
a test that asks for it (``with server.faults():``, the test modules' ``faults`` fixture); while
it runs, ``server.url`` is the proxy's. Requests answered by the proxy itself (404, 403) never
reach the server and are not in its log."""

from __future__ import annotations

import atexit
import http.client
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

SECRET = "tEsT-sEcReT-9f8e7d6c5b4a"  # the secret key the tests' clients are given
BUCKET = "data"
HERE = Path(__file__).resolve().parent
OWN = "slurmkit-test"  # the query parameter of the helpers' own requests
# One request in the log: "METHOD TARGET HTTP/1.1" STATUS RANGE (serve.py's request line).
LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d{3}) (\S+)$')

_started: dict[str, str] = {}  # the server this process started, when make test gave none


def endpoint() -> tuple[str, Path]:
    """The S3 server's URL and request log: make test's, else one started for this process."""
    url, log = os.environ.get("SLURMKIT_TEST_S3_URL"), os.environ.get("SLURMKIT_TEST_S3_LOG")
    # Under pytest-xdist (make unit: -n 2), a second worker starts its own: a Server() resets
    # its server's state and counts its log, which two workers' tests cannot share.
    if (url or log) and os.environ.get("PYTEST_XDIST_WORKER", "gw0") == "gw0":
        assert url and log, "set both SLURMKIT_TEST_S3_URL and SLURMKIT_TEST_S3_LOG, or neither"
        return url, Path(log)
    if not _started:
        env = {
            **os.environ,
            "SLURMKIT_TEST_S3_DIR": tempfile.mkdtemp(prefix="slurmkit-s3."),
            "SLURMKIT_TEST_S3_PYTHON": sys.executable,
            "SLURMKIT_TEST_S3_WATCH": str(os.getpid()),  # gone with this process, however
        }
        up = subprocess.run(
            ["bash", str(HERE / "s3" / "up.sh")], env=env, capture_output=True, text=True
        )
        if up.returncode:
            raise RuntimeError(f"tests/s3/up.sh failed ({up.returncode}): {up.stderr[-2000:]}")
        down = ["bash", str(HERE / "s3" / "down.sh"), "--purge"]
        atexit.register(subprocess.run, down, env=env, capture_output=True, timeout=60)
        exports = shlex.split(up.stdout.splitlines()[-1])[1:]  # export NAME=VALUE...
        _started.update(item.split("=", 1) for item in exports)
    return _started["SLURMKIT_TEST_S3_URL"], Path(_started["SLURMKIT_TEST_S3_LOG"])


class Server:
    """The tests' S3 server, its state reset, every request logged from then on."""

    def __init__(self) -> None:
        import botocore.session
        from botocore.config import Config

        self.direct, self.requests_log = endpoint()
        self.client = botocore.session.Session().create_client(
            "s3",
            endpoint_url=self.direct,
            region_name="us-east-1",
            aws_access_key_id="s3server",
            aws_secret_access_key="s3server",
            config=Config(
                s3={"addressing_style": "path"},
                retries={"max_attempts": 1},
                request_checksum_calculation="when_required",  # objects stored without one,
            ),  # as the tests' objects were before: clients check what they read themselves
        )
        self.client.meta.events.register("before-sign.s3", _own_request)
        conn = http.client.HTTPConnection(urlsplit(self.direct).netloc, timeout=60)
        conn.request("POST", "/moto-api/reset")  # each module's server starts empty
        assert conn.getresponse().status == 200
        conn.close()
        self._lock = threading.Lock()
        self._pos = self.requests_log.stat().st_size  # the reset's line is written by now
        self._log: list[tuple[str, str, str, str | None]] = []
        self._proxy: _Proxy | None = None
        self._routed = False
        self._corrupt: set[str] = set()
        self._gone: set[str] = set()
        self._bodies: dict[tuple[str, str], bytes] = {}  # keys()'s, by (key, ETag)

    # ---- where clients go ------------------------------------------------------------------

    @property
    def url(self) -> str:
        """The endpoint for clients: the server, or the fault proxy inside ``faults()``."""
        if self._routed and self._proxy is not None:
            return self._proxy.url
        return self.direct

    @contextmanager
    def faults(self) -> Iterator[None]:
        """Route ``url`` through the fault-injecting proxy meanwhile (started at first use)."""
        if self._proxy is None:
            self._proxy = _Proxy(self)
        self._routed = True
        try:
            yield
        finally:
            self._routed = False

    @property
    def corrupt(self) -> set[str]:
        """Keys whose GET bodies lose a bit on the way out (through the proxy)."""
        assert self._routed, "corrupt needs the fault proxy: the test's `faults` fixture"
        return self._corrupt

    @corrupt.setter
    def corrupt(self, keys: set[str]) -> None:
        assert self._routed, "corrupt needs the fault proxy: the test's `faults` fixture"
        self._corrupt = keys

    @property
    def gone(self) -> set[str]:
        """Keys whose GETs are answered 404, as if deleted after the listing (by the proxy)."""
        assert self._routed, "gone needs the fault proxy: the test's `faults` fixture"
        return self._gone

    def intercept(self, method: str, key: str) -> tuple[int, bytes] | None:
        """The proxy's answer of its own to a request, if any: (status, XML body)."""
        if method == "GET" and key in self._gone:
            return 404, b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>"
        return None

    def damage(self, method: str, key: str, body: bytes) -> bytes:
        """The body the proxy passes on for a response of the server."""
        if method == "GET" and key in self._corrupt and body:
            data = bytearray(body)
            data[len(data) // 2] ^= 0x01
            return bytes(data)
        return body

    def close(self) -> None:
        if self._proxy is not None:
            self._proxy.shutdown()
            self._proxy.server_close()

    # ---- what arrived -------------------------------------------------------------------------

    @property
    def log(self) -> list[tuple[str, str, str, str | None]]:
        """Every request since the reset, in the server's order: (method, key, query, range)."""
        with self._lock:
            with self.requests_log.open("rb") as fh:
                fh.seek(self._pos)
                chunk = fh.read()
            whole = chunk.rfind(b"\n") + 1  # a line still being written waits
            self._pos += whole
            for line in chunk[:whole].decode(errors="replace").splitlines():
                m = LINE.search(line)
                if m is None:  # the server's other output
                    continue
                method, target, _status, rng = m.groups()
                path, _, query = target.partition("?")
                if path.startswith("/moto-api/") or OWN in query.split("&"):
                    continue
                key = unquote(path).lstrip("/").partition("/")[2]
                self._log.append((method, key, query, None if rng == "-" else rng))
            return list(self._log)

    def mark(self) -> int:
        return len(self.log)

    def gets(self, since: int = 0, prefix: str = "") -> list[tuple[str, str | None]]:
        """The object GETs since ``since``: (key, range)."""
        return [
            (key, rng)
            for method, key, _query, rng in self.log[since:]
            if method == "GET" and key and key.startswith(prefix)
        ]

    def lists(self, since: int = 0) -> int:
        return sum(1 for m, key, q, _ in self.log[since:] if m == "GET" and not key and "list" in q)

    # ---- the helpers' own requests (left out of the log) -----------------------------------

    def create_bucket(self, name: str) -> None:
        self.client.create_bucket(Bucket=name)

    def put(self, key: str, data: bytes) -> None:
        """Store an object in BUCKET (its ETag computed by the time the PUT answers)."""
        assert self.client.put_object(Bucket=BUCKET, Key=key, Body=data)["ETag"]

    def delete(self, key: str) -> None:
        self.client.delete_object(Bucket=BUCKET, Key=key)

    def keys(self, prefix: str) -> dict[str, bytes]:
        """The objects of BUCKET under ``prefix``: key -> bytes (each fetched once while its
        ETag stays the same: tests poll this between kills)."""
        found, seen = {}, {}
        for page in self.client.get_paginator("list_objects_v2").paginate(
            Bucket=BUCKET, Prefix=prefix
        ):
            for row in page.get("Contents", []):
                key, etag = row["Key"], row["ETag"]
                body = self._bodies.get((key, etag))
                if body is None:
                    body = self.client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
                found[key], seen[key, etag] = body, body
        self._bodies = {k: v for k, v in self._bodies.items() if not k[0].startswith(prefix)}
        self._bodies |= seen
        return found

    def open_uploads(self) -> int:
        """Multipart uploads begun and neither completed nor aborted, in BUCKET."""
        return len(self.client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", []))


def _own_request(request, **_kwargs) -> None:
    request.url += ("&" if "?" in request.url else "?") + OWN


class _Proxy(ThreadingHTTPServer):
    """The fault proxy: each request passed on to the server (or answered by
    ``owner.intercept``), each response body through ``owner.damage``."""

    daemon_threads = True

    def __init__(self, owner: Server) -> None:
        super().__init__(("127.0.0.1", 0), _Relay)
        self.owner = owner
        self.upstream = urlsplit(owner.direct).netloc
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # not a client killed midway
            super().handle_error(request, client_address)


HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer"}
HOP |= {"upgrade", "expect", "content-length", "server", "date"}  # and what send_response sends


class _Relay(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, and "Expect: 100-continue" answered
    disable_nagle_algorithm = True  # headers and body are two writes: no 40 ms ACK wait
    server: _Proxy

    def log_message(self, *args) -> None:
        pass

    def body(self) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(chunks)
        if "Content-Length" in self.headers:
            size = int(self.headers["Content-Length"])
            body = self.rfile.read(size)
            if len(body) < size:  # the client went away midway: nothing is passed on
                raise ConnectionAbortedError(f"{len(body)} of {size} bytes")
            return body
        return None

    def relay(self) -> None:
        method, owner = self.command, self.server.owner
        key = unquote(urlsplit(self.path).path).lstrip("/").partition("/")[2]
        body = self.body()
        answer = owner.intercept(method, key)
        if answer is not None:
            status, data = answer
            reason, headers = "", [("Content-Type", "application/xml")]
        else:
            conn = http.client.HTTPConnection(self.server.upstream, timeout=300)
            try:
                conn.putrequest(method, self.path, skip_host=True, skip_accept_encoding=True)
                for name, value in self.headers.items():
                    if name.lower() not in HOP:
                        conn.putheader(name, value)
                if body is not None:
                    conn.putheader("Content-Length", str(len(body)))
                conn.endheaders(body)
                response = conn.getresponse()
                data = response.read()
            finally:
                conn.close()
            status, reason, headers = response.status, response.reason, response.getheaders()
            data = owner.damage(method, key, data)
        self.send_response(status, reason or None)
        for name, value in headers:
            if name.lower() not in HOP:
                self.send_header(name, value)
        length = str(len(data))
        if method == "HEAD" and answer is None:  # the length of what a GET would return
            length = response.getheader("Content-Length") or "0"
        self.send_header("Content-Length", length)
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = relay


def env_for(s3: Server, tmp_path: Path) -> dict[str, str]:
    """The stager's environment: the AWS chain points at the test server and secret only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return {
        **env,
        "AWS_ACCESS_KEY_ID": "stage-test-key",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": s3.url,
        "AWS_CONFIG_FILE": str(tmp_path / "no-aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "no-aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
