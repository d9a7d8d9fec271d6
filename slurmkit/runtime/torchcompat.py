"""torch's private names that checkpoint reading cannot do without, each here once (torch is
imported where it is used).

Tested with torch 2.13.0 (CPU build); torch's main branch as of this writing has the same names
and signatures. ``pyproject.toml`` bounds torch to the versions tested.

- ``torch.serialization._load(zip_reader, map_location, pickle_module, overall_storage=...)``
  (:func:`load_records`): unpickles a torch file from a zip reader, its storages views of one
  ``overall_storage`` or taken from the reader as they are. The checkpoint reader checks a file's
  CRC32 over bytes already in memory before anything is unpickled, then builds the state from
  those bytes without a copy, or from storages already streamed to the GPU. ``torch.load`` takes a
  path or a file object only: from a file object it copies every storage out of it (a second
  pass over the whole state, twice its memory at the peak), and ``mmap=True`` needs a path, which
  would read the file a second time. Measured (torch 2.13, CPU, a 512 MiB state of 8 tensors
  already in memory, median of 5 alternating runs on a shared 2-core machine): 0.001 s through
  this, 0.47 s through ``torch.load`` on a file object over the same bytes, about what reading
  the file from the page cache costs, so a resume would take about twice as long.
- ``torch._C.PyTorchFileReader`` (:func:`zip_reader`): torch's zip reader over a file object,
  what ``torch.load`` builds internally; the argument :func:`load_records` needs.
- ``torch._weights_only_unpickler`` (:func:`load_records` with ``weights_only``): the pickle
  module ``torch.load(weights_only=True)`` uses, for tensors of DCP files read the same way.
- ``torch.distributed.checkpoint._fsspec_filesystem.FsspecReader`` (:func:`fsspec_reader`): DCP's
  reader of fsspec URLs, which ``torch.distributed.checkpoint`` does not export (its public
  ``FileSystemReader`` reads local paths only); the one-pass reader inherits its metadata
  reading and planning. Taken from the public package first, should a version export it.
"""

from __future__ import annotations

import pickle
from typing import IO, Any


def zip_reader(file: IO[bytes]) -> Any:
    """torch's zip reader over the bytes of a torch file (a seekable file object)."""
    import torch

    return torch._C.PyTorchFileReader(file)


def load_records(
    records: Any, map_location: Any, *, overall_storage: Any = None, weights_only: bool = False
) -> Any:
    """The object a torch file holds, from ``records`` (a :func:`zip_reader`, or an object
    answering the same calls); its storages views of ``overall_storage`` when given.
    ``weights_only``: unpickled as ``torch.load(weights_only=True)`` does."""
    import torch

    module: Any = pickle
    if weights_only:
        import torch._weights_only_unpickler as module
    return torch.serialization._load(
        records, map_location, module, overall_storage=overall_storage, encoding="utf-8"
    )


def fsspec_reader() -> type:
    """DCP's ``StorageReader`` class for fsspec URLs."""
    import torch.distributed.checkpoint as dcp

    found = getattr(dcp, "FsspecReader", None)
    if found is None:
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader as found
    return found  # type: ignore[return-value]
