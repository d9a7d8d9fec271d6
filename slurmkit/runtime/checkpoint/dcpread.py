"""Sharded checkpoints (torch.distributed.checkpoint) read in one pass: :func:`storage_reader`.

DCP's own reader reads each tensor through a file object and ``torch.load`` (a copy), then
copies it into the state dict. This one reads the part of each file that this rank needs once,
by large parallel reads (:class:`~.fetch.Fetch`), and copies each tensor to its place (a GPU
included) as soon as its bytes are in, while the readers go on with the next ones; the bytes
are views of the read memory until then, which is given back as the copies pass (at most
``reader.WINDOW`` bytes, or the largest tensor, held). Files with DCP storage transforms
(e.g. compression) go through DCP's own reader.

torch is imported where it is used.
"""

from __future__ import annotations

import io
from typing import Any

from ..torchcompat import fsspec_reader, load_records
from . import reader
from .fetch import Fetch, Source
from .storage import LocalStore


def storage_reader(store: Any, directory: str) -> Any:
    """A DCP ``StorageReader`` for the checkpoint in ``directory`` of ``store``, for
    ``dcp.load(state_dict, storage_reader=...)``."""
    from torch.distributed.checkpoint import FileSystemReader

    base = FileSystemReader if isinstance(store, LocalStore) else fsspec_reader()
    made = type("OnePassReader", (_OnePass, base), {})(store.url(directory))
    made.slurmkit_store, made.slurmkit_dir = store, directory
    return made


class _OnePass:
    """``read_data`` for DCP's file readers (mixed in before them)."""

    storage_data: dict[Any, Any]
    slurmkit_store: Any
    slurmkit_dir: str

    def read_data(self, plan: Any, planner: Any) -> Any:
        from torch.futures import Future

        per_file: dict[str, list[tuple[Any, Any]]] = {}
        for item in plan.items:
            info = self.storage_data[item.storage_index]
            if info.transform_descriptors:
                return super().read_data(plan, planner)  # type: ignore[misc]
            per_file.setdefault(info.relative_path, []).append((info, item))
        for relative, items in per_file.items():
            items.sort(key=lambda pair: pair[0].offset)
            path = self.slurmkit_store.sep.join([self.slurmkit_dir, relative])
            _read_file(self.slurmkit_store, path, items, planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done


def _read_file(store: Any, path: str, items: list[tuple[Any, Any]], planner: Any) -> None:
    """Read the items (``(storage info, read item)`` by offset) of one file and hand each to
    ``planner`` as DCP's reader does."""
    import torch
    from torch.distributed.checkpoint.planner import LoadItemType

    low = items[0][0].offset
    high = max(info.offset + info.length for info, _ in items)
    window = max(reader.WINDOW, max(info.length for info, _ in items) + 2 * reader.CHUNK)
    with (
        Source(store, path) as src,
        Fetch(
            src.read_into, low, high, chunk=reader.CHUNK, readers=reader.READERS, window=window
        ) as fetch,
    ):
        memory = torch.frombuffer(fetch.mem, dtype=torch.uint8).untyped_storage()
        for index, (info, item) in enumerate(items):
            begin, end = info.offset - low, info.offset - low + info.length
            fetch.wait(end)
            view = fetch.view[begin:end]
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(bytes(view)))
            else:
                tensor = load_records(
                    reader.archive(view),
                    "cpu",
                    overall_storage=memory[begin:end],
                    weights_only=True,
                )
                tensor = _narrow(tensor, item.storage_offsets, item.lengths)
                target = planner.resolve_tensor(item).detach()
                if target.size() != tensor.size():
                    raise ValueError(
                        f"{path}: item {item.storage_index} has size {tuple(tensor.size())}, "
                        f"the state dict's tensor {tuple(target.size())}"
                    )
                target.copy_(tensor)
                planner.commit_tensor(item, target)
            following = items[index + 1][0].offset - low if index + 1 < len(items) else end
            fetch.release(min(following, end))


def _narrow(tensor: Any, offsets: Any, lengths: Any) -> Any:
    """The part of ``tensor`` a read item asks for: ``lengths`` from ``offsets`` in each dim
    (what DCP's own reader takes)."""
    for dim, (offset, length) in enumerate(zip(offsets, lengths)):
        if length < tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    return tensor
