"""s3fs's private names that slurmkit uses: only here.

``S3FileSystem._call_s3(method, **kwargs)``, a coroutine: one S3 API call with the
filesystem's session, its request defaults (``s3_additional_kwargs``, requester pays) and its
retries of throttling and transient errors. :mod:`slurmkit.stage` streams a ranged GET to disk
on s3fs's event loop: the response body is read in chunks there, so the call is awaited in that
loop. The public surface has no coroutine that does the same: ``call_s3`` is its blocking twin
(it cannot be awaited inside the loop it blocks on), ``cat_file`` reads the whole range into
memory, ``open`` sends one GET per read, and ``fs.s3`` (the aiobotocore client) skips the
request defaults and the retries.

Tested with s3fs 2026.9.0 (constraints.txt) and the newest release `make test-latest` installs
(2026.9.0 on 2026-12-05); ``pyproject.toml`` holds s3fs below 2026.10.
"""

from __future__ import annotations

from typing import Any


def can_call(fs: Any) -> bool:
    """Whether ``fs`` answers :func:`call` (an s3fs filesystem)."""
    return hasattr(fs, "_call_s3")


async def call(fs: Any, method: str, **kwargs: Any) -> Any:
    """The response of the S3 API's ``method`` (``"get_object"``, ...) with ``kwargs``, asked
    through ``fs`` (an s3fs ``S3FileSystem``), awaited in ``fs``'s loop."""
    return await fs._call_s3(method, **kwargs)
