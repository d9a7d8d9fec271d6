"""A real S3 endpoint for tests: moto's S3 app on a free loopback port (the app that
`moto_server` and `ThreadedMotoServer` serve), in the test process behind a WSGI layer that logs
every request (so GETs are counted where they arrive) and can damage or drop chosen objects on
their way out. Jobs on the test cluster reach it on 127.0.0.1 like any other process here."""

from __future__ import annotations

import os
import threading
from pathlib import Path

SECRET = "tEsT-sEcReT-9f8e7d6c5b4a"  # the secret key the tests' clients are given
BUCKET = "data"


class Server:
    """moto's S3 app on a free loopback port, every request logged."""

    def __init__(self) -> None:
        import logging

        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )
        from werkzeug.serving import make_server

        logging.getLogger("werkzeug").setLevel(logging.ERROR)
        self.backend().reset()  # moto keeps buckets per process: each module's server starts empty
        self.app = DomainDispatcherApplication(create_backend_app)
        self.log: list[tuple[str, str, str, str | None]] = []  # method, key, query, range
        self.corrupt: set[str] = set()  # keys whose bodies lose a bit on the way out
        self.gone: set[str] = set()  # keys answered 404, as if deleted after the listing
        self.server = make_server(
            "127.0.0.1", 0, self.wsgi, threaded=True, request_handler=MotoRequestHandler
        )
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def wsgi(self, environ, start_response):
        path = environ.get("PATH_INFO", "").lstrip("/")
        key = path.partition("/")[2]
        method = environ["REQUEST_METHOD"]
        self.log.append((method, key, environ.get("QUERY_STRING", ""), environ.get("HTTP_RANGE")))
        if method == "GET" and key in self.gone:
            body = b"<Error><Code>NoSuchKey</Code><Message>gone</Message></Error>"
            start_response("404 Not Found", [("Content-Type", "application/xml")])
            return [body]
        body = self.app(environ, start_response)
        if method == "GET" and key in self.corrupt:
            data = bytearray(b"".join(body))
            data[len(data) // 2] ^= 0x01
            return [bytes(data)]
        return body

    def backend(self):
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.s3.models import s3_backends

        return s3_backends[DEFAULT_ACCOUNT_ID]["aws"]

    def put(self, key: str, data: bytes) -> None:
        """Store an object, its ETag computed now: moto computes it at first use, without a
        lock, and two requests doing so at once (a killed stager's listing still being served
        beside its rerun's) would read the object's buffer interleaved."""
        assert self.backend().put_object(BUCKET, key, data).etag

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
