"""One checkpoint directory (torch or pickle) read in one pass: :func:`read`.

Its file is read once (:class:`~.fetch.Fetch`: large parallel reads, each piece's CRC32 taken as
it arrives), checked against the commit record, and only then deserialized, from memory:

- to a CUDA device (``map_location="cuda"``, ``"cuda:1"``, a ``torch.device``): the file's zip
  directory is read first, then each tensor's bytes go to the GPU while the rest of the file is
  still being read, through at most ``WINDOW`` bytes of host memory; the pickle is unpickled
  once the checksum is right, its storages being the ones already on the GPU;
- elsewhere: the whole file in host memory, the tensors views of it (like ``torch.load`` with
  ``mmap=True``), moved by ``map_location`` as ``torch.load`` does.

torch is imported where it is used.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from typing import IO, Any, cast

from ..torchcompat import load_records, zip_reader
from .fetch import Fetch, Invalid, Source

CHUNK = 16 << 20  # bytes per read
READERS = 8  # reads in flight
WINDOW = 1 << 30  # streamed to a GPU: bytes read ahead of the copies (host memory held)
TAIL = 1 << 20  # bytes at the end read first: the zip directory of a torch file
_LOCAL = struct.Struct("<4s22xHH")  # a zip local header: signature ... name and extra lengths


def read(store: Any, directory: str, record: dict[str, Any], *, map_location: Any = "cpu") -> Any:
    """The state saved in ``directory`` (of ``store``) under commit record ``record``.

    Raises :class:`~.fetch.Invalid` when its file is missing or does not match the record
    (size, CRC32); an error in unpickling a file that matches is raised as it is.
    """
    (name,) = record["files"]
    info = record["files"][name]
    path = store.sep.join([directory, name])
    with Source(store, path) as src:
        if src.size != info["size"]:
            raise Invalid(f"{path} has {src.size} bytes, its record says {info['size']}")
        if record["kind"] == "pickle":
            return pickle.loads(_whole(src, info, CHUNK, READERS).view)
        device = _cuda(map_location)
        if device is not None:
            state = _streamed(src, info, device, map_location, CHUNK, READERS, WINDOW)
            if state is not _UNSUPPORTED:
                return state
        return _torch_load(_whole(src, info, CHUNK, READERS), map_location)


def _check(path: str, got: tuple[int, int], info: dict[str, Any]) -> None:
    if got[0] != info["size"]:
        raise Invalid(f"{path} has {got[0]} bytes, its record says {info['size']}")
    if "crc32" in info and got[1] != info["crc32"]:
        raise Invalid(f"checksum mismatch in {path}")


def _whole(src: Source, info: dict[str, Any], chunk: int, readers: int) -> Fetch:
    """The file in host memory, checked."""
    with Fetch(src.read_into, 0, src.size, chunk=chunk, readers=readers) as fetch:
        _check(src.path, fetch.finish(), info)
    return fetch


def _cuda(map_location: Any) -> Any:
    """The one CUDA device ``map_location`` names (its index filled in), else ``None``."""
    import torch

    if isinstance(map_location, str):
        try:
            device = torch.device(map_location)
        except RuntimeError:
            return None
    elif isinstance(map_location, torch.device):
        device = map_location
    else:
        return None
    if device.type != "cuda":
        return None
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def _torch_load(fetch: Fetch, map_location: Any) -> Any:
    """``torch.load`` of the checked bytes in ``fetch``, its storages views of them."""
    import torch

    view = fetch.view
    if bytes(view[:4]) != b"PK\x03\x04":  # torch's legacy format: no zip, no views
        return torch.load(io.BytesIO(view), map_location=map_location, weights_only=False)
    storage = torch.frombuffer(fetch.mem, dtype=torch.uint8).untyped_storage()
    return load_records(archive(view), map_location, overall_storage=storage)


def archive(view: memoryview) -> Any:
    """torch's zip reader over the bytes of a torch file in memory."""
    return zip_reader(cast(IO[bytes], _MemFile(view)))


class _MemFile(io.RawIOBase):
    """A read-only file over a memoryview: what torch's and zipfile's readers read from."""

    def __init__(self, view: memoryview, size: int | None = None) -> None:
        self.data, self.pos = view, 0
        self.size = len(view) if size is None else size

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        self.pos = offset + (0, self.pos, self.size)[whence]
        return self.pos

    def tell(self) -> int:
        return self.pos

    def _at(self, pos: int, n: int) -> memoryview:
        return self.data[pos : pos + n]

    def readinto(self, buf: Any) -> int:
        with memoryview(buf) as out:
            piece = self._at(self.pos, min(len(out), max(0, self.size - self.pos)))
            out[: len(piece)] = piece
        self.pos += len(piece)
        return len(piece)

    def read(self, n: int = -1) -> bytes:
        n = self.size - self.pos if n is None or n < 0 else min(n, self.size - self.pos)
        out = bytes(self._at(self.pos, max(0, n)))
        self.pos += len(out)
        return out


class _Tail(_MemFile):
    """The file as zipfile sees it while only its tail (``[low, size)``) is in ``fetch``:
    bytes before it (a zip directory larger than ``TAIL``) are read from the source."""

    def __init__(self, fetch: Fetch, src: Source, low: int) -> None:
        super().__init__(fetch.view)
        self.src, self.low = src, low

    def _at(self, pos: int, n: int) -> memoryview:
        if pos >= self.low:
            return self.data[pos : pos + n]
        out = memoryview(bytearray(n))
        self.src.read_into(pos, out)
        return out


class _Layout(Exception):
    """A torch file this reader does not stream (or a damaged one: the checksum tells)."""


_UNSUPPORTED = object()


def _entries(fetch: Fetch, src: Source) -> list[tuple[str, int, int]]:
    """The archive's records as ``(name, local header offset, size)``, in file order, from its
    zip directory (in the tail ``fetch`` read first)."""
    low = max(0, src.size - TAIL) // fetch.chunk * fetch.chunk
    try:
        archive = zipfile.ZipFile(_Tail(fetch, src, low))
    except (zipfile.BadZipFile, ValueError, EOFError, OSError, struct.error) as exc:
        raise _Layout(f"no zip directory: {exc}") from None
    infos = archive.infolist()
    if any(i.compress_type != zipfile.ZIP_STORED for i in infos):
        raise _Layout("compressed records")
    entries = sorted(((i.filename, i.header_offset, i.compress_size) for i in infos), key=_second)
    bounds = [*(header for _, header, _ in entries[1:]), archive.start_dir]
    for (name, header, size), bound in zip(entries, bounds):
        if header < 0 or header + _LOCAL.size + len(name.encode()) + size > bound:
            raise _Layout(f"record {name} does not fit before the next one")
    return entries


def _second(entry: tuple[str, int, int]) -> int:
    return entry[1]


class _Stream:
    """Walks a torch file's bytes in order: each record's local header, then its bytes, which
    go to a storage on ``device`` (``data/*`` records) or to host memory (the pickle and the
    rest)."""

    def __init__(self, entries: list[tuple[str, int, int]], device: Any, fetch: Fetch) -> None:
        import torch

        self.torch, self.device, self.fetch = torch, device, fetch
        self.entries = entries
        self.src = torch.frombuffer(fetch.mem, dtype=torch.uint8)
        self.index = 0
        self.header = bytearray()  # the current record's local header, as far as read
        self.data = -1  # where the current record's bytes start; -1: in its header still
        self.dest: Any = None
        self.host: dict[str, bytearray] = {}
        self.storages: dict[str, Any] = {}

    def feed(self, pos: int, end: int) -> None:
        """Take bytes ``[pos, end)`` of the file, the ones after those fed before."""
        while pos < end and self.index < len(self.entries):
            name, header, size = self.entries[self.index]
            if self.data < 0:
                pos = max(pos, header)  # past the previous record's data descriptor
                take = max(0, min(end - pos, self._need(name) - len(self.header)))
                self.header += self.fetch.view[pos : pos + take]
                pos += take
                if len(self.header) == self._need(name) > _LOCAL.size:
                    self._start(name, header, size)
                continue
            take = min(end, self.data + size) - pos
            at = pos - self.data
            if isinstance(self.dest, bytearray):
                self.dest[at : at + take] = self.fetch.view[pos : pos + take]
            else:
                self.dest[at : at + take].copy_(self.src[pos : pos + take])
            pos += take
            if pos == self.data + size:
                self._next()

    def _need(self, name: str) -> int:
        """Bytes of the current local header: 30, then 30 + its name and extra field."""
        if len(self.header) < _LOCAL.size:
            return _LOCAL.size
        signature, name_len, extra_len = _LOCAL.unpack_from(self.header)
        if signature != b"PK\x03\x04" or name_len != len(name.encode()):
            raise _Layout(f"no local header for {name}")
        return _LOCAL.size + name_len + extra_len

    def _start(self, full: str, header: int, size: int) -> None:
        encoded = full.encode()
        if bytes(self.header[_LOCAL.size : _LOCAL.size + len(encoded)]) != encoded:
            raise _Layout(f"the local header of {full} names another record")
        self.data = header + len(self.header)
        after = self.entries[self.index + 1][1] if self.index + 1 < len(self.entries) else None
        if self.data + size > (self.fetch.size if after is None else after):
            raise _Layout(f"record {full} runs into the next one")
        name = full.split("/", 1)[-1]
        if name.startswith("data/"):
            self.dest = self.torch.empty(size, dtype=self.torch.uint8, device=self.device)
            self.storages[name] = self.dest
        else:
            self.dest = self.host[name] = bytearray(size)
        if size == 0:
            self._next()

    def _next(self) -> None:
        self.index += 1
        self.header = bytearray()
        self.data = -1
        self.dest = None

    def done(self) -> None:
        if self.index < len(self.entries):
            raise _Layout(f"the file ended inside record {self.entries[self.index][0]}")


class _Records:
    """What :func:`~slurmkit.runtime.torchcompat.load_records` asks of a zip reader, answered
    from a :class:`_Stream`: records in host memory, storages already on their device."""

    def __init__(self, stream: _Stream) -> None:
        self.host, self.storages = stream.host, stream.storages

    def has_record(self, name: str) -> bool:
        return name in self.host or name in self.storages

    def get_record(self, name: str) -> bytes:
        return bytes(self.host[name])

    def get_storage_from_record(self, name: str, nbytes: int, _type: Any) -> Any:
        tensor = self.storages[name]
        if tensor.numel() != nbytes:
            raise ValueError(f"record {name} has {tensor.numel()} bytes, the pickle says {nbytes}")
        return tensor

    def get_all_records(self) -> list[str]:
        return [*self.host, *self.storages]

    def serialization_id(self) -> str:
        return bytes(self.host.get(".data/serialization_id", b"")).decode()


def _streamed(
    src: Source,
    info: dict[str, Any],
    device: Any,
    map_location: Any,
    chunk: int,
    readers: int,
    window: int,
) -> Any:
    """The torch file's state with its storages copied to ``device`` while the file is read;
    ``_UNSUPPORTED`` when the file checks out but is no zip this walk knows (the caller then
    loads it from memory)."""
    count = -(-src.size // chunk)
    tail = range(max(0, src.size - TAIL) // chunk, count)
    with Fetch(
        src.read_into, 0, src.size, chunk=chunk, readers=readers, window=window, first=tail
    ) as fetch:
        try:
            for index in tail:
                fetch.wait_piece(index)
            stream = _Stream(_entries(fetch, src), device, fetch)
            for index in range(count):
                end = min((index + 1) * chunk, src.size)
                fetch.wait(end)
                stream.feed(index * chunk, end)
                fetch.release(end)
            stream.done()
        except _Layout:
            _check(src.path, fetch.finish(), info)
            return _UNSUPPORTED
        _check(src.path, fetch.finish(), info)
    return load_records(_Records(stream), map_location)
