"""slurmkit.runtime.checkpoint's one-pass load (fetch, reader, dcpread) and prepare(): each
byte read once and checked as it arrives, damage caught before anything is unpickled, the
state equal to torch.load's, pieces of every size, sharded state, the first save's buffers made
ahead, and a save from a signal handler while they are being made."""

from __future__ import annotations

import io
import json
import mmap
import os
import subprocess
import sys
import tempfile
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

from slurmkit.runtime.checkpoint import (  # noqa: E402
    COMMIT,
    Checkpointer,
    CheckpointError,
    fetch,
    reader,
)
from slurmkit.runtime.checkpoint import checkpointer as policy  # noqa: E402
from slurmkit.runtime.checkpoint.fetch import Fetch, Invalid, Source  # noqa: E402
from slurmkit.runtime.checkpoint.snapshot import Snapshot as _Snapshot  # noqa: E402
from slurmkit.runtime.checkpoint.storage import open_store as _storage  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
CPU = torch.device("cpu")
pytestmark = pytest.mark.filterwarnings("ignore:slurmkit.checkpoint")
FUZZ = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def sample_state(seed: int = 0, sizes: tuple[int, ...] = (1000, 37, 0, 4096)) -> dict[str, Any]:
    """Tensors of several dtypes and sizes, a view sharing a storage, a parameter, a sparse
    tensor, nested containers and plain values."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(max(sizes) + 8, generator=gen)
    return {
        "tensors": [torch.randint(0, 255, (n,), dtype=torch.uint8, generator=gen) for n in sizes],
        "base": base,
        "view": base[3:11],
        "half": torch.randn(33, generator=gen).to(torch.bfloat16),
        "flags": torch.rand(17, generator=gen) > 0.5,
        "param": torch.nn.Parameter(torch.ones(5)),
        "sparse": torch.eye(4).to_sparse(),
        "meta": {"step": 7, "name": "run", "tuple": (1, 2.5, None)},
    }


def same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        if a.is_sparse:
            return b.is_sparse and torch.equal(a.to_dense(), b.to_dense())
        return (
            type(a) is type(b) and a.dtype == b.dtype and a.device == b.device and torch.equal(a, b)
        )
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    return bool(a == b)


def shared(a: Any, b: Any) -> bool:
    return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())


def write(directory: Path, state: Any) -> tuple[Any, str, dict[str, Any]]:
    """``state`` saved as a committed-checkpoint-like file: (store, directory, record)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "state-0.pt"
    torch.save(state, path)
    body = path.read_bytes()
    record = {
        "step": 1,
        "kind": "torch",
        "files": {path.name: {"size": len(body), "crc32": zlib.crc32(body)}},
    }
    return _storage(directory), str(directory), record


def streamed(store: Any, directory: str, record: dict[str, Any], **kw: Any) -> Any:
    """The GPU walk of :func:`reader.read`, its storages made on the CPU (no GPU here)."""
    ((name, info),) = record["files"].items()
    with Source(store, os.path.join(directory, name)) as src:
        state = reader._streamed(
            src,
            info,
            CPU,
            kw.pop("map_location", "cpu"),
            kw.pop("chunk", reader.CHUNK),
            kw.pop("readers", 3),
            kw.pop("window", reader.WINDOW),
        )
    assert state is not reader._UNSUPPORTED, "a torch file must stream"
    return state


def bytes_read() -> int:
    """Bytes this process has read with read/pread calls so far (the kernel's count)."""
    with open("/proc/self/io") as fh:
        return int(next(line for line in fh if line.startswith("rchar:")).split()[1])


# -- the state is torch.load's --


def test_one_pass_load_equals_torch_load(tmp_path: Path) -> None:
    state = sample_state()
    store, directory, record = write(tmp_path, state)
    expected = torch.load(tmp_path / "state-0.pt", weights_only=False)
    assert same(expected, state)
    for location in ("cpu", None, CPU, {"cpu": "cpu"}, lambda storage, _: storage):
        loaded = reader.read(store, directory, record, map_location=location)
        assert same(loaded, expected), location
        assert shared(loaded["view"], loaded["base"])
    walked = streamed(store, directory, record)
    assert same(walked, expected)
    assert shared(walked["view"], walked["base"])


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_each_byte_is_read_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """load_latest, load and resume read the file once (they read it twice before: once for
    the checksum, once more in torch.load); so does the walk to a GPU, its tail first."""
    state = {"big": torch.randn(1 << 20), **sample_state()}  # 4 MiB and more
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(state, 5)
    (data,) = [f for f in (tmp_path / "step-000000000005").iterdir() if f.name != COMMIT]
    size = data.stat().st_size

    def reads(load: Any) -> int:
        ckpt = Checkpointer(tmp_path)
        before = bytes_read()
        assert same(load(ckpt), state)
        return bytes_read() - before

    for load in (
        lambda c: c.load_latest()[1],
        lambda c: c.load(5),
        lambda c: c.resume()[1],
    ):
        assert size <= reads(load) < 1.2 * size
    monkeypatch.setattr(reader, "_cuda", lambda location: CPU)  # the walk to a GPU, to the CPU
    assert size <= reads(lambda c: c.load_latest()[1]) < 1.2 * size


def test_pickle_checkpoints_and_legacy_torch_files(tmp_path: Path) -> None:
    state = {"x": 1, "blob": os.urandom(100_000)}
    with Checkpointer(tmp_path / "p") as ckpt:
        ckpt.save(state, 1)  # torch is imported, so this is a torch file; pickle below
        ckpt._write(state, 2, "pickle")
        assert ckpt.load(2) == state and ckpt.load(1) == state
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    torch.save({"w": torch.arange(5)}, legacy / "s.pt", _use_new_zipfile_serialization=False)
    body = (legacy / "s.pt").read_bytes()
    record = {"kind": "torch", "files": {"s.pt": {"size": len(body), "crc32": zlib.crc32(body)}}}
    assert torch.equal(reader.read(_storage(legacy), str(legacy), record)["w"], torch.arange(5))
    ((name, info),) = record["files"].items()
    with Source(_storage(legacy), str(legacy / name)) as src:  # no zip: the walk declines
        assert reader._streamed(src, info, CPU, "cpu", 64, 2, 1 << 20) is reader._UNSUPPORTED


def test_remote_store_reads_ranges(tmp_path: Path) -> None:
    url = f"memory://reader-{os.getpid()}"
    state = sample_state(3)
    with Checkpointer(url) as ckpt:
        ckpt.save(state, 4)
    assert same(Checkpointer(url).load_latest()[1], state)
    remote = Checkpointer(url)
    record = remote._record(remote._dirname(4))
    assert same(streamed(remote.store, remote._join(remote._dirname(4)), record, chunk=999), state)


# -- damage is caught, before anything is unpickled --


@pytest.mark.parametrize("path", ["host", "walk"])
def test_corrupt_truncated_and_missing_files_are_invalid(tmp_path: Path, path: str) -> None:
    store, directory, record = write(tmp_path, sample_state())
    file = tmp_path / "state-0.pt"
    good = file.read_bytes()

    def load() -> Any:
        if path == "host":
            return reader.read(store, directory, record)
        return streamed(store, directory, record, chunk=256, window=1024)

    for spoil, message in (
        (lambda b: b[:20] + bytes([b[20] ^ 0x40]) + b[21:], "checksum mismatch"),  # the pickle
        (lambda b: b[:-30] + bytes([b[-30] ^ 1]) + b[-29:], "checksum mismatch"),  # zip directory
        (lambda b: b[: len(b) // 2], "has .* bytes, its record says"),
        (lambda b: b + b"x", "has .* bytes, its record says"),
    ):
        file.write_bytes(spoil(good))
        with pytest.raises(Invalid, match=message):
            load()
    file.unlink()
    with pytest.raises(Invalid, match="missing"):
        load()


@pytest.mark.slow
@FUZZ
@given(data=st.data())
def test_any_flipped_byte_is_caught_in_both_paths(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store, directory, record = write(Path(tmp), sample_state(1, (300, 5000, 0, 70)))
        file = Path(tmp) / "state-0.pt"
        body = bytearray(file.read_bytes())
        where = data.draw(st.integers(0, len(body) - 1), label="byte")
        body[where] ^= data.draw(st.integers(1, 255), label="xor")
        file.write_bytes(body)
        chunk = data.draw(st.integers(16, 4096), label="chunk")
        with pytest.raises(Invalid, match="checksum mismatch"):
            reader.read(store, directory, record)
        with pytest.raises(Invalid, match="checksum mismatch"):
            streamed(store, directory, record, chunk=chunk, window=2 * chunk)


def test_damaged_checkpoint_is_skipped_by_load_latest(tmp_path: Path) -> None:
    """Through the policy: the newest checkpoint's flipped byte is caught by the one-pass read,
    a warning says so, the one before is loaded; load() of the damaged step is an error."""
    with Checkpointer(tmp_path, keep=5) as ckpt:
        for step in (1, 2):
            ckpt.save(sample_state(step), step)
    (data,) = [f for f in (tmp_path / "step-000000000002").iterdir() if f.name != COMMIT]
    body = bytearray(data.read_bytes())
    body[len(body) // 3] ^= 0xFF
    data.write_bytes(body)
    fresh = Checkpointer(tmp_path)
    with pytest.warns(RuntimeWarning, match="skipping step 2: checksum mismatch"):
        step, state = fresh.load_latest()
    assert step == 1 and same(state, sample_state(1))
    with pytest.raises(CheckpointError, match="step 2"):
        fresh.load(2)


# -- reads in pieces: every boundary --


@pytest.mark.parametrize(
    "chunk", [pytest.param(1, marks=pytest.mark.slow), 7, 64, 4095, 4096, 4097, 1 << 20]
)
def test_piece_boundaries(tmp_path: Path, chunk: int) -> None:
    store, directory, record = write(tmp_path, sample_state(2, (4096, 4095, 1, 0, 8191)))
    expected = torch.load(tmp_path / "state-0.pt", weights_only=False)
    for readers in (1, 4):
        assert same(streamed(store, directory, record, chunk=chunk, readers=readers), expected)
    saved = reader.CHUNK, reader.READERS
    try:
        reader.CHUNK, reader.READERS = chunk, 3
        assert same(reader.read(store, directory, record), expected)
    finally:
        reader.CHUNK, reader.READERS = saved


@pytest.mark.slow
@FUZZ
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=6),
    chunk=st.integers(1, 5000),
    readers=st.integers(1, 4),
    window=st.integers(0, 20000),
)
def test_any_sizes_and_pieces_load_as_torch_load(
    sizes: list[int], chunk: int, readers: int, window: int
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = {f"t{i}": torch.arange(n, dtype=torch.int8) for i, n in enumerate(sizes)}
        store, directory, record = write(Path(tmp), state)
        expected = torch.load(Path(tmp) / "state-0.pt", weights_only=False)
        walked = streamed(store, directory, record, chunk=chunk, readers=readers, window=window)
        assert same(walked, expected)


@FUZZ
@given(
    size=st.integers(0, 40000),
    start=st.integers(0, 5000),
    chunk=st.integers(1, 9000),
    readers=st.integers(1, 5),
    window=st.one_of(st.none(), st.integers(0, 30000)),
)
def test_fetch_checksums_any_range(
    size: int, start: int, chunk: int, readers: int, window: int | None
) -> None:
    """Fetch's (size, crc32) is zlib's of the range, with readers kept within the window of
    what the consumer gave back, whatever the sizes."""
    blob = bytes(range(256)) * (-(-(start + size) // 256))
    blob = blob[: start + size]
    ahead: list[int] = []
    released = [0]

    def read_into(offset: int, view: memoryview) -> None:
        ahead.append(offset - start + len(view) - released[0])
        view[:] = blob[offset : offset + len(view)]

    with Fetch(read_into, start, start + size, chunk=chunk, readers=readers, window=window) as f:
        for end in range(chunk, size + chunk, chunk):
            begin, end = end - chunk, min(end, size)
            f.wait(end)
            assert bytes(f.view[begin:end]) == blob[start + begin : start + end]
            released[0] = end
            f.release(end)
        assert f.finish() == (size, zlib.crc32(blob[start:]))
    if window is not None:
        assert max(ahead, default=0) <= max(window, 2 * chunk)


def test_fetch_reads_first_pieces_first_and_raises_a_readers_error() -> None:
    order: list[int] = []

    def read_into(offset: int, view: memoryview) -> None:
        order.append(offset)
        view[:] = bytes(len(view))

    with Fetch(read_into, 0, 1000, chunk=100, readers=1, first=[9, 8]) as f:
        f.finish()
    assert order[:3] == [900, 800, 0]

    def failing(offset: int, view: memoryview) -> None:
        if offset == 300:
            raise OSError(5, "Input/output error")
        view[:] = bytes(len(view))

    with Fetch(failing, 0, 1000, chunk=100, readers=2) as f, pytest.raises(OSError, match="I"):
        f.finish()


def test_released_bytes_go_back_to_the_system() -> None:
    """What the consumer gave back is dropped from memory (read again: zeros), the rest kept;
    without a window nothing is dropped (the host path's tensors are views of it)."""
    page = mmap.PAGESIZE

    def ones(offset: int, view: memoryview) -> None:
        view[:] = b"\x01" * len(view)

    for window, kept in ((4 * page, False), (None, True)):
        with Fetch(ones, 0, 8 * page, chunk=page, readers=2, window=window) as f:
            f.wait(3 * page)
            f.release(2 * page + 100)
            assert bytes(f.view[: 2 * page]) == (b"\x01" if kept else b"\x00") * 2 * page
            assert bytes(f.view[2 * page : 3 * page]) == b"\x01" * page
            f.finish()


def test_file_shorter_than_its_reads_is_invalid(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    with Source(_storage(tmp_path), str(path)) as src:
        os.truncate(path, 50)  # shrinks after its size was taken
        with pytest.raises(Invalid, match="ended at byte 50"):
            src.read_into(0, memoryview(bytearray(100)))


# -- sharded state --


@pytest.mark.slow
def test_sharded_state_one_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """save_sharded/load_sharded in one process: tensors, bytes items, an empty tensor; pieces
    and window far smaller than the file; each byte of the shard file read once."""
    pytest.importorskip("torch.distributed.checkpoint")
    state = {
        "w": torch.randn(1000, 300),
        "b": torch.arange(9),
        "e": torch.empty(0),
        "step": 11,
        "meta": {"names": ["a", "b"]},
    }
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save_sharded(state, 3)
    monkeypatch.setattr(reader, "CHUNK", 4096)
    monkeypatch.setattr(reader, "WINDOW", 3 * 4096)
    target = {"w": torch.zeros(1000, 300), "b": torch.zeros(9, dtype=torch.long)}
    target |= {"e": torch.empty(0), "step": 0, "meta": {"names": []}}
    ckpt = Checkpointer(tmp_path)
    before = bytes_read()
    assert ckpt.load_sharded(target) == 3
    read = bytes_read() - before
    assert same(target, state)
    record = json.loads((tmp_path / "step-000000000003" / COMMIT).read_text())
    files = sum(i["size"] for i in record["files"].values())
    assert 0.9 * files <= read < 1.2 * files  # once, in pieces of 4 KiB and a 12 KiB window


@pytest.mark.slow
def test_sharded_state_with_a_shortened_shard_fails(tmp_path: Path) -> None:
    dcp = pytest.importorskip("torch.distributed.checkpoint")
    from slurmkit.runtime.checkpoint.dcpread import storage_reader

    with Checkpointer(tmp_path) as ckpt:
        ckpt.save_sharded({"w": torch.randn(1000)}, 1)
    (shard,) = (tmp_path / "step-000000000001").glob("dcp-*/*.distcp")
    os.truncate(shard, shard.stat().st_size - 10)
    with pytest.warns(RuntimeWarning, match="skipping step 1: .* its record says"):
        assert Checkpointer(tmp_path).load_sharded({"w": torch.zeros(1000)}) is None
    reading = storage_reader(_storage(shard.parent), str(shard.parent))  # past the size check
    with pytest.raises(dcp.api.CheckpointException) as raised:
        dcp.load({"w": torch.zeros(1000)}, storage_reader=reading)
    ((error, _),) = raised.value.failures.values()  # rank 0's (exception, traceback)
    assert isinstance(error, Invalid) and "ended at byte" in str(error)


# -- resume: one read where the ranks agree --


def test_resume_loads_the_agreed_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Checkpointer(tmp_path, keep=5) as ckpt:
        for step in (1, 2):
            ckpt.save(sample_state(step), step)
    assert Checkpointer(tmp_path).resume()[0] == 2
    monkeypatch.setattr(policy, "agree_step", lambda step: None if step is None else step - 1)
    step, state = Checkpointer(tmp_path).resume()  # another rank has only step 1
    assert step == 1 and same(state, sample_state(1))


# -- prepare: the first save's buffers, made ahead --


def test_reserved_buffers_are_the_ones_take_uses() -> None:
    big = torch.randn(1 << 16)
    state = {
        "a": big,
        "view": big[5:],
        "nested": [{"t": torch.ones(3)}, (torch.zeros(2, dtype=torch.int64),)],
        "sparse": torch.eye(3).to_sparse(),  # copied by .to("cpu"): no buffer
        "other": torch.ones(7),
    }
    snap = _Snapshot()
    plan = snap.plan(state)
    assert plan == [(big.nbytes, False), (12, False), (16, False), (28, False)]
    snap.reserve(plan)
    made = [buf for buf, _ in snap.buffers]
    out, _ = snap.take(state)
    assert len(snap.buffers) == len(made)
    assert all(a is b for a, (b, _) in zip(made, snap.buffers))  # none made anew
    assert torch.equal(out["view"], big[5:]) and torch.equal(out["other"], torch.ones(7))


@pytest.mark.slow
def test_prepare_makes_the_first_save_reuse_its_buffers(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    with Checkpointer(tmp_path, async_save=True) as ckpt:
        ckpt.prepare(state)
        ckpt.wait()
        assert ckpt._snapshot is not None
        made = [id(buf) for buf, _ in ckpt._snapshot.buffers]
        assert len(made) == len(_Snapshot.plan(state)) > 0
        ckpt.save(state, 1)
        assert [id(buf) for buf, _ in ckpt._snapshot.buffers] == made
        ckpt.prepare(state)  # once a save was made: nothing more
        ckpt.wait()
        assert [id(buf) for buf, _ in ckpt._snapshot.buffers] == made
        _, saved = ckpt.load_latest()
    assert same(saved["model"], state["model"])
    for mode in ({"async_save": False}, {"async_save": True, "rank": 1}):
        other = Checkpointer(tmp_path / "x", **mode)
        other.prepare(state)
        assert other._snapshot is None and other._preparing is None


def test_prepare_returns_at_once_and_the_save_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = threading.Event()
    reserve = _Snapshot.reserve

    def gated(self: _Snapshot, plan: list[tuple[int, bool]]) -> None:
        assert gate.wait(30)
        reserve(self, plan)

    monkeypatch.setattr(_Snapshot, "reserve", gated)
    state = {"w": torch.randn(1000)}
    with Checkpointer(tmp_path, async_save=True) as ckpt:
        ckpt.prepare(state)  # returns although the buffers cannot be made yet
        saved = threading.Event()
        saver = threading.Thread(target=lambda: (ckpt.save(state, 1), saved.set()))
        saver.start()
        assert not saved.wait(0.3), "the first save must wait for the buffers"
        gate.set()
        saver.join(30)
        assert saved.is_set()
        ckpt.wait()
        assert torch.equal(ckpt.load(1)["w"], state["w"])


def test_failed_prepare_warns_and_the_save_makes_its_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(self: _Snapshot, plan: list[tuple[int, bool]]) -> None:
        raise MemoryError("no room")

    monkeypatch.setattr(_Snapshot, "reserve", broken)
    state = {"w": torch.randn(100)}
    with Checkpointer(tmp_path, async_save=True) as ckpt:
        ckpt.prepare(state)
        with pytest.warns(RuntimeWarning, match="preparing the snapshot buffers failed"):
            ckpt.save(state, 1)
        ckpt.wait()
        assert torch.equal(ckpt.load(1)["w"], state["w"])


SIGNAL_SAVE = """
import os, signal, sys, threading, time
sys.path.insert(0, {root!r})
import torch
from slurmkit.runtime.checkpoint import Checkpointer
from slurmkit.runtime.checkpoint.snapshot import Snapshot as _Snapshot

gate = threading.Event()
reserve = _Snapshot.reserve
def gated(self, plan):
    gate.wait()
    reserve(self, plan)
_Snapshot.reserve = gated

state = {{"w": torch.arange(1000.0)}}
ckpt = Checkpointer(sys.argv[1], async_save=True, keep=5)
in_handler = []
def on_signal(signum, frame):  # a preemption handler that checkpoints at once
    in_handler.append(time.monotonic())
    ckpt.save({{"w": state["w"] * 2}}, 2)
signal.signal(signal.SIGUSR1, on_signal)
ckpt.prepare(state)
threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGUSR1)).start()
threading.Timer(0.8, gate.set).start()
ckpt.save(state, 1)  # waits for prepare: the signal comes meanwhile
ckpt.wait()
assert in_handler, "the handler did not run"
assert ckpt.steps() == [1, 2], ckpt.steps()
assert torch.equal(ckpt.load(1)["w"], state["w"]) and torch.equal(ckpt.load(2)["w"], state["w"] * 2)
print("ok", flush=True)
"""


@pytest.mark.slow
def test_save_from_a_signal_handler_while_preparing(tmp_path: Path) -> None:
    """A signal handler that saves, run while the main thread's save waits for prepare's
    thread: nothing there takes a lock the interrupted main thread may hold (it joins the
    preparing thread), so both saves finish instead of deadlocking."""
    script = tmp_path / "signal_save.py"
    script.write_text(SIGNAL_SAVE.format(root=str(ROOT)))
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


def test_records_answer_what_torch_load_asks(tmp_path: Path) -> None:
    """The walk's stand-in for torch's zip reader gives torch.serialization._load what it needs
    (records, storages, serialization id), and refuses a storage of the wrong size."""
    store, directory, record = write(tmp_path, {"w": torch.arange(4)})
    (name,) = record["files"]
    with (
        Source(store, os.path.join(directory, name)) as src,
        Fetch(src.read_into, 0, src.size, chunk=64, readers=2) as f,
    ):
        f.finish()
        stream = reader._Stream(reader._entries(f, src), CPU, f)
        for begin in range(0, src.size, 64):
            stream.feed(begin, min(begin + 64, src.size))
        stream.done()
    records = reader._Records(stream)
    archive = torch._C.PyTorchFileReader(io.BytesIO((tmp_path / name).read_bytes()))
    assert records.serialization_id() == archive.serialization_id()
    assert sorted(records.get_all_records()) == sorted(archive.get_all_records())
    assert records.get_record("data.pkl") == archive.get_record("data.pkl")
    with pytest.raises(ValueError, match="the pickle says"):
        records.get_storage_from_record("data/0", 3, None)
    assert fetch.Invalid is policy.Invalid  # the policy skips what the reader finds damaged
