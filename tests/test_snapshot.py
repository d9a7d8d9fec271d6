"""slurmkit.runtime.checkpoint.snapshot: host copies of a state's tensors (shared storages,
reused buffers, containers, deferred copies and their guard), on CPU and, where there is one,
on a GPU."""

from __future__ import annotations

import collections
import threading

import pytest

torch = pytest.importorskip("torch")

from slurmkit.runtime import pinned  # noqa: E402
from slurmkit.runtime.checkpoint.snapshot import (  # noqa: E402
    Copies as _Copies,
)
from slurmkit.runtime.checkpoint.snapshot import (  # noqa: E402
    Snapshot as _Snapshot,
)
from slurmkit.runtime.checkpoint.snapshot import (  # noqa: E402
    _key,
)
from slurmkit.runtime.checkpoint.snapshot import (  # noqa: E402
    dense_tree_bytes as _dense_tree_bytes,
)

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
Point = collections.namedtuple("Point", "x y")


class Meta(dict):
    """A dict subclass with attributes, as a module's state dict (``_metadata``)."""


class Box:
    def __init__(self, items: object) -> None:
        self.items = items


def ptr(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def test_shared_storages_stay_shared_in_host_buffers() -> None:
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    state = {"base": base, "view": base[1:, ::2], "again": base}
    snap = _Snapshot()
    out, copies = snap.take(state)
    assert copies is None
    assert len(snap.buffers) == 1  # one storage, copied once
    assert ptr(out["base"]) == ptr(out["view"]) == ptr(out["again"]) != ptr(base)
    assert out["view"].storage_offset() == 6 and out["view"].stride() == (6, 2)
    assert torch.equal(out["view"], base[1:, ::2]) and torch.equal(out["base"], base)


def test_snapshot_does_not_follow_the_source() -> None:
    w, p = torch.randn(1000), torch.nn.Parameter(torch.ones(3), requires_grad=False)
    expected = w.clone()
    out, _ = _Snapshot().take({"w": w, "p": p})
    w.add_(1)
    p.data.mul_(5)
    assert torch.equal(out["w"], expected) and torch.equal(out["p"], torch.ones(3))
    assert isinstance(out["p"], torch.nn.Parameter) and not out["p"].requires_grad


def test_buffers_are_reused_and_replaced_when_a_storage_changes_size() -> None:
    snap = _Snapshot()
    a, b = torch.zeros(16), torch.zeros(8)
    first, _ = snap.take({"a": a, "b": b})
    a.fill_(1)
    second, _ = snap.take({"a": a, "b": b})
    assert ptr(second["a"]) == ptr(first["a"]) and ptr(second["b"]) == ptr(first["b"])
    assert torch.equal(second["a"], torch.ones(16))
    third, _ = snap.take({"a": torch.full((32,), 2.0), "b": b})  # a's storage grew
    assert ptr(third["a"]) != ptr(first["a"]) and snap.buffers[0][0].nbytes() == 32 * 4
    assert ptr(third["b"]) == ptr(first["b"])
    assert torch.equal(third["a"], torch.full((32,), 2.0))


def test_a_state_that_shrinks_drops_its_buffers() -> None:
    snap = _Snapshot()
    tensors = [torch.zeros(4), torch.zeros(5), torch.zeros(6)]
    first, _ = snap.take(tensors)
    assert len(snap.buffers) == 3
    second, _ = snap.take(tensors[:1])
    assert len(snap.buffers) == 1 and ptr(second[0]) == ptr(first[0])


def test_containers_keep_their_types_and_other_objects_are_deep_copied() -> None:
    sd = Meta(w=torch.ones(2))
    sd._metadata = {"": {"version": 1}}
    box = Box([torch.ones(2), 1])
    state = {
        "sd": sd,
        "od": collections.OrderedDict(a=torch.ones(1)),
        "pt": Point(torch.ones(1), 2),
        "tup": (torch.ones(1), "s"),
        "lst": [torch.ones(1), 3],
        "box": box,
    }
    out, _ = _Snapshot().take(state)
    assert type(out["sd"]) is Meta and out["sd"] is not sd
    assert out["sd"]._metadata == {"": {"version": 1}}
    assert type(out["od"]) is collections.OrderedDict
    assert type(out["pt"]) is Point and out["pt"].y == 2 and ptr(out["pt"].x) != ptr(state["pt"].x)
    assert type(out["tup"]) is tuple and out["tup"][1] == "s"
    assert type(out["lst"]) is list and out["lst"][1] == 3
    assert out["box"] is not box and out["box"].items is not box.items
    sd["new"] = 1
    box.items[0].add_(1)
    box.items.append("later")
    assert "new" not in out["sd"]
    assert torch.equal(out["box"].items[0], torch.ones(2)) and len(out["box"].items) == 2


def test_a_sparse_tensor_goes_through_to_cpu() -> None:
    sparse = torch.eye(3).to_sparse()
    snap = _Snapshot()
    out, _ = snap.take({"emb": sparse})
    assert out["emb"].is_sparse and not snap.buffers  # a copy of its own, no snapshot buffer
    sparse._values().mul_(5)
    assert torch.equal(out["emb"].to_dense(), torch.eye(3))


def test_deferred_storages_are_copied_by_finish() -> None:
    snap = _Snapshot()
    p, x = torch.zeros(1000), torch.zeros(10)
    snap.take({"p": p, "x": x})  # the buffers now hold zeros
    p.fill_(1)
    x.fill_(1)
    out, copies = snap.take({"p": p, "x": x}, frozenset({_key(p)}))
    assert copies is not None and not copies.cpu_done.is_set()
    assert torch.equal(out["x"], x)  # copied before take returned
    assert torch.equal(out["p"], torch.zeros(1000))  # not yet: the last save's copy
    copies.finish()
    assert copies.cpu_done.is_set() and torch.equal(out["p"], p)


def test_guard_waits_for_the_deferred_copies_once() -> None:
    p = torch.zeros(1000)
    _, copies = _Snapshot().take({"p": p}, frozenset({_key(p)}))
    guarded = threading.Event()
    hook = threading.Thread(target=lambda: (copies.guard(None, (), {}), guarded.set()))
    hook.start()
    assert not guarded.wait(0.3), "an optimizer step must wait for the deferred copy"
    copies.finish()
    hook.join(10)
    assert guarded.is_set()
    copies.cpu_done.clear()  # were it to wait again, the next step would block for ever
    again = threading.Thread(target=copies.guard, daemon=True)
    again.start()
    again.join(10)
    assert not again.is_alive()


def test_a_failed_copy_still_releases_the_guard() -> None:
    copies = _Copies()
    copies.cpu.append((torch.zeros(4, dtype=torch.uint8), torch.zeros(8, dtype=torch.uint8)))
    with pytest.raises(RuntimeError):
        copies.finish()
    assert copies.cpu_done.is_set()


def test_a_failed_take_leaves_the_snapshot_usable() -> None:
    snap = _Snapshot()
    w = torch.ones(4)
    with pytest.raises(TypeError):
        snap.take({"w": w, "lock": threading.Lock()})  # cannot be deep-copied
    assert not snap.memo and not snap.todo and not snap.fresh
    out, _ = snap.take({"w": w})
    assert torch.equal(out["w"], w)


def test_drain_without_streams() -> None:
    snap = _Snapshot()
    snap.drain()
    snap.take({"w": torch.ones(4)})
    assert snap.streams == {}  # CPU state: no side stream
    snap.drain()


@cuda
def test_cuda_snapshot_buffers_are_page_locked() -> None:
    big = torch.randn(pinned.REGISTER_FROM // 4, device="cuda")  # 16 MiB: registered
    small = torch.randn(8, device="cuda")
    for small_pinned in (True, False):
        snap = _Snapshot(small_pinned=small_pinned)
        out, copies = snap.take({"big": big, "small": small})
        assert copies is None and out["big"].device.type == "cpu"
        assert torch.equal(out["big"], big.cpu()) and torch.equal(out["small"], small.cpu())
        assert out["big"].is_pinned()
        assert out["small"].is_pinned() == small_pinned
        assert [host is not None for _, host in snap.buffers] == [True, small_pinned]
        snap.drain()


@cuda
def test_cuda_snapshot_is_the_state_when_take_was_called() -> None:
    x = torch.randn(4096, 4096, device="cuda")
    snap = _Snapshot()
    snap.take({"x": x})  # the first take makes (and page-locks) the buffers, then they are reused
    expected = x.cpu() * 2**10
    busy = torch.randn(8192, 8192, device="cuda")
    for _ in range(4):
        busy = busy @ busy  # the GPU is still at work when take queues its copy
    for _ in range(10):
        x.mul_(2)  # queued before take: the copy must wait for it
    out, copies = snap.take({"x": x})
    for _ in range(10):
        x.mul_(1.5)  # queued after take: must not reach the snapshot
    assert copies is None and torch.equal(out["x"], expected)  # done when take returns


@cuda
def test_cuda_deferred_copies_come_before_the_guarded_step() -> None:
    p, x = torch.randn(4096, 4096, device="cuda"), torch.randn(4096, 4096, device="cuda")
    state, deferred = {"p": p, "x": x}, frozenset({_key(p)})
    snap = _Snapshot()
    snap.take(state, deferred)[1].finish()  # the buffers are made by the first take
    expected_p, expected_x = p.cpu(), x.cpu()
    out, copies = snap.take(state, deferred)
    assert copies is not None and copies.events
    for _ in range(10):
        x.add_(1)  # the next kernels: ordered after x's copy
    writer = threading.Thread(target=copies.finish)  # as the checkpoint's writer thread does
    writer.start()
    copies.guard()
    copies.guard()
    for _ in range(10):
        p.add_(1)  # the optimizer's step: ordered after p's copy
    writer.join(30)
    assert not writer.is_alive()
    assert torch.equal(out["x"], expected_x) and torch.equal(out["p"], expected_p)
    snap.drain()
    assert all(side.query() for side in snap.streams.values())


@cuda
def test_cuda_bytes_of_a_dense_tree() -> None:
    w = torch.ones(4, device="cuda")
    assert _dense_tree_bytes({"w": w, "v": w[1:], "c": torch.ones(2), "n": 1}) == (24, 16)
