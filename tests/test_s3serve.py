"""The tests' S3 server (tests/s3/serve.py) answers ranged GETs as moto's own server does: the
same status, bytes and headers for every kind of Range, against a plain ``python -m moto.server``
(serve.py reads only the range asked for, where moto reads the whole object and slices it)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest
from s3server import BUCKET, Server

pytestmark = pytest.mark.slow  # two S3 servers

SIZE = 1 << 20
RANGES = [
    "bytes=0-0",
    "bytes=5-100",
    "bytes=1000-",
    "bytes=-7",
    f"bytes={SIZE - 1}-",
    f"bytes=0-{SIZE * 4}",
    f"bytes={SIZE}-",  # past the end: 416
    "bytes=-0",  # 416
    "bytes=9-3",  # backwards: the whole object
    "bytes=0-1,5-6",  # several ranges: the whole object
    "bytes=x-y",  # not a range: the whole object
]


@pytest.fixture(scope="module")
def reference():
    """moto's own server, unchanged, on a free loopback port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None and time.monotonic() < deadline, "moto.server did not start"
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    proc.terminate()
    proc.wait(timeout=30)


def _answer(client, key: str, rng: str) -> tuple:
    try:
        got = client.get_object(Bucket=BUCKET, Key=key, Range=rng)
    except client.exceptions.ClientError as exc:
        return ("error", exc.response["ResponseMetadata"]["HTTPStatusCode"])
    meta = got["ResponseMetadata"]
    return (
        meta["HTTPStatusCode"],
        got["Body"].read(),
        got.get("ContentRange"),
        got["ContentLength"],
        got["ETag"],
    )


def test_ranged_gets_answer_as_moto_does(reference):
    ours = Server()
    theirs = Server.__new__(Server)  # the same client settings, on the reference server
    import botocore.session
    from botocore.config import Config

    theirs.client = botocore.session.Session().create_client(
        "s3",
        endpoint_url=reference,
        region_name="us-east-1",
        aws_access_key_id="s3server",
        aws_secret_access_key="s3server",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )
    body = os.urandom(SIZE)
    for server in (ours, theirs):
        server.client.create_bucket(Bucket=BUCKET)
        server.client.put_object(Bucket=BUCKET, Key="one", Body=body)
        up = server.client.create_multipart_upload(Bucket=BUCKET, Key="parts")
        parts = []
        for n, at in enumerate(range(0, SIZE, 5 << 18), start=1):  # 5 MiB minimum: 1 part
            got = server.client.upload_part(
                Bucket=BUCKET,
                Key="parts",
                UploadId=up["UploadId"],
                PartNumber=n,
                Body=body[at : at + (5 << 18)],
            )
            parts.append({"PartNumber": n, "ETag": got["ETag"]})
        server.client.complete_multipart_upload(
            Bucket=BUCKET, Key="parts", UploadId=up["UploadId"], MultipartUpload={"Parts": parts}
        )
    kinds = set()
    for key in ("one", "parts"):
        for rng in RANGES:
            answer = _answer(ours.client, key, rng)
            assert answer == _answer(theirs.client, key, rng), (key, rng)
            kinds.add(answer[0])
    assert kinds == {200, 206, "error"}
    ours.close()
