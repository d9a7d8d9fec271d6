"""slurmkit.runtime.checkpoint: atomic commits, pruning, damaged checkpoints, async saves,
fsspec, full and read-only storage, kill -9 at random points, two ranks over gloo."""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from collections import Counter
from pathlib import Path
from typing import ClassVar

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem

from slurmkit.runtime.checkpoint import COMMIT, Checkpointer, CheckpointError, agree_step

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.filterwarnings("ignore:slurmkit.checkpoint")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:012d}"


def data_file(root: Path, step: int) -> Path:
    (name,) = json.loads((step_dir(root, step) / COMMIT).read_text())["files"]
    return step_dir(root, step) / name


def test_round_trip_and_commit_record(tmp_path: Path) -> None:
    state = {"step": 7, "lr": 0.1, "names": ["a", "b"], "blob": os.urandom(3 << 20)}
    ckpt = Checkpointer(tmp_path)
    assert ckpt.load_latest() is None
    ckpt.save(state, 7)
    assert ckpt.load_latest() == (7, state)
    assert ckpt.load(7) == state
    assert ckpt.steps() == [7] and ckpt.latest_step() == 7
    record = json.loads((step_dir(tmp_path, 7) / COMMIT).read_text())
    assert record["step"] == 7 and record["format"] == 1 and record["time"] <= time.time()
    ((name, info),) = record["files"].items()
    body = (step_dir(tmp_path, 7) / name).read_bytes()
    assert info == {"size": len(body), "crc32": zlib.crc32(body)}
    assert sorted(os.listdir(step_dir(tmp_path, 7))) == sorted([COMMIT, name])


def test_tensors_sync_and_async(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    base = torch.arange(24, dtype=torch.float64).reshape(4, 6)
    state = {
        "model": model.state_dict(),
        "view": base[1:, ::2],
        "base": base,
        "param": torch.nn.Parameter(torch.ones(3)),
        "big": torch.randn(1 << 19),
        "meta": {"epoch": 3, "sizes": (1, 2)},
    }
    for async_save in (False, True):
        root = tmp_path / str(async_save)
        with Checkpointer(root, async_save=async_save) as ckpt:
            ckpt.save(state, 1)
            expected = {k: v.clone() for k, v in state["model"].items()}
            with torch.no_grad():  # in-place updates after save must not reach the checkpoint
                for p in model.parameters():
                    p.add_(1)
                base.add_(100)
            ckpt.wait()
            step, loaded = ckpt.load_latest()
            with torch.no_grad():
                base.sub_(100)
                for p in model.parameters():
                    p.sub_(1)
        assert step == 1 and loaded["meta"] == state["meta"]
        assert all(torch.equal(loaded["model"][k], v) for k, v in expected.items())
        assert hasattr(loaded["model"], "_metadata")
        assert torch.equal(loaded["view"], base[1:, ::2])
        assert torch.equal(loaded["big"], state["big"])
        view, whole = loaded["view"].untyped_storage(), loaded["base"].untyped_storage()
        assert view.data_ptr() == whole.data_ptr()  # still one storage
        assert isinstance(loaded["param"], torch.nn.Parameter)


def test_keep_last_k_and_resave(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=2)
    for step in range(5):
        ckpt.save({"step": step}, step)
    ckpt.wait()
    assert ckpt.steps() == [3, 4]
    assert sorted(os.listdir(tmp_path)) == [step_dir(tmp_path, 3).name, step_dir(tmp_path, 4).name]
    ckpt.save({"step": 4, "again": True}, 4)  # saving a committed step again replaces it whole
    ckpt.wait()
    assert ckpt.load_latest() == (4, {"step": 4, "again": True})
    assert len(os.listdir(step_dir(tmp_path, 4))) == 2
    ckpt.save({"step": 2}, 2)  # an older step than the newest: kept too, it was just written
    ckpt.wait()
    assert ckpt.steps() == [2, 3, 4]


def test_load_latest_skips_damaged(tmp_path: Path) -> None:
    ckpt = Checkpointer(tmp_path, keep=10)
    for step in range(1, 7):
        ckpt.save({"step": step, "blob": bytes(1000)}, step)
    ckpt.wait()
    # a half-done save of step 7: temp files only, no commit record
    step_dir(tmp_path, 7).mkdir()
    (step_dir(tmp_path, 7) / ".tmp-state-0000.pkl.1234").write_bytes(b"partial")
    (step_dir(tmp_path, 7) / ".tmp-COMMIT.json.5678").write_bytes(b"{")
    (tmp_path / "unrelated.txt").write_text("x")
    assert Checkpointer(tmp_path).load_latest()[0] == 6
    damage = {
        6: lambda: data_file(tmp_path, 6).write_bytes(
            data_file(tmp_path, 6).read_bytes()[:-1] + b"!"
        ),  # bit rot: checksum
        5: lambda: data_file(tmp_path, 5).unlink(),  # missing data file
        4: lambda: (step_dir(tmp_path, 4) / COMMIT).write_text('{"step": 4, "fil'),  # torn record
        3: lambda: os.truncate(data_file(tmp_path, 3), 10),  # torn data file
        2: lambda: (step_dir(tmp_path, 2) / COMMIT).write_text('{"step": 9, "files": {}}'),
    }
    for step, spoil in damage.items():
        spoil()
        fresh = Checkpointer(tmp_path)
        with pytest.warns(RuntimeWarning, match="skipping step"):
            found = fresh.load_latest()
        assert found == (step - 1, {"step": step - 1, "blob": bytes(1000)})
        if step in (6, 5, 3):
            with pytest.raises(CheckpointError, match=f"step {step}"):
                fresh.load(step)
    data_file(tmp_path, 1).unlink()
    assert Checkpointer(tmp_path).load_latest() is None
    # the next save removes the leftovers: uncommitted and damaged-record directories
    ckpt = Checkpointer(tmp_path, keep=2)
    ckpt.save({"step": 8}, 8)
    ckpt.wait()
    assert not step_dir(tmp_path, 7).exists() and not step_dir(tmp_path, 4).exists()
    assert ckpt.load_latest() == (8, {"step": 8})


class GatedFS(MemoryFileSystem):
    """In-memory filesystem whose file writes wait for ``gate``: a storage as slow as we like."""

    protocol = "gatedmem"
    store: ClassVar[dict] = {}  # fsspec's memory filesystem keeps its files on the class
    pseudo_dirs: ClassVar[list] = [""]
    gate = threading.Event()

    def _open(self, path, mode="rb", **kwargs):  # type: ignore[override]
        if "w" not in mode:
            return super()._open(path, mode, **kwargs)
        f = GatedFile(self, self._strip_protocol(path))
        f.commit()
        return f


class GatedFile(MemoryFile):
    def write(self, data):  # type: ignore[override]
        assert GatedFS.gate.wait(30)
        return super().write(data)


def test_async_save_returns_before_write_and_next_save_waits() -> None:
    torch = pytest.importorskip("torch")
    fsspec.register_implementation("gatedmem", GatedFS, clobber=True)
    GatedFS.gate.clear()
    weights = torch.zeros(1000)
    ckpt = Checkpointer("gatedmem://run", async_save=True)
    ckpt.save({"w": weights}, 1)  # returns although no byte can be written yet
    weights.add_(1)  # training goes on; the snapshot is not affected
    assert ckpt.steps() == []
    done = threading.Event()
    second = threading.Thread(target=lambda: (ckpt.save({"w": weights}, 2), done.set()))
    second.start()
    assert not done.wait(0.3), "the next save must wait for the pending write"
    GatedFS.gate.set()
    second.join(30)
    assert done.is_set()
    ckpt.wait()
    assert ckpt.steps() == [1, 2]
    assert torch.equal(ckpt.load(1)["w"], torch.zeros(1000))
    assert torch.equal(ckpt.load_latest()[1]["w"], torch.ones(1000))
    ckpt.close()


@pytest.mark.slow
def test_overlapped_snapshot_waits_for_the_optimizer_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``overlap=opt``, the optimizer's tensors are copied after ``save`` returns; the next
    ``opt.step()`` waits for that copy, other tensors are copied at once, and the checkpoint holds
    the state as it was when ``save`` was called."""
    torch = pytest.importorskip("torch")
    from slurmkit.runtime.checkpoint.snapshot import Copies as _Copies

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.BatchNorm1d(64))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)

    def train_step() -> None:
        model(torch.randn(8, 64)).square().mean().backward()
        opt.step()
        opt.zero_grad()

    train_step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    expected_opt = {
        i: {k: v.clone() for k, v in st.items()} for i, st in opt.state_dict()["state"].items()
    }
    gate = threading.Event()
    finish = _Copies.finish

    def gated(self: _Copies) -> None:
        assert gate.wait(30)
        finish(self)

    monkeypatch.setattr(_Copies, "finish", gated)
    ckpt = Checkpointer(tmp_path, async_save=True)
    ckpt.save(state, 1, overlap=opt)
    model(torch.randn(8, 64)).square().mean().backward()  # forward changes BatchNorm's buffers
    stepped = threading.Event()
    stepper = threading.Thread(target=lambda: (opt.step(), stepped.set()))
    stepper.start()
    assert not stepped.wait(0.5), "the optimizer step must wait for the snapshot's copy"
    gate.set()
    stepper.join(30)
    assert stepped.is_set()
    ckpt.wait()
    assert not opt._optimizer_step_pre_hooks, "the hook is removed once the save is done"
    _, saved = ckpt.load_latest()
    for key, value in expected.items():
        assert torch.equal(saved["model"][key], value), key
    for index, st in expected_opt.items():
        for key, value in st.items():
            assert torch.equal(saved["optimizer"]["state"][index][key], value), (index, key)
    assert not torch.equal(saved["model"]["0.weight"], model.state_dict()["0.weight"])
    train_step()  # no hook left: steps freely
    ckpt.close()


def test_overlap_takes_optimizers_only(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    with Checkpointer(tmp_path, async_save=True) as ckpt:
        with pytest.raises(TypeError, match="overlap: expected torch optimizers, got Linear"):
            ckpt.save({"w": torch.zeros(3)}, 1, overlap=torch.nn.Linear(2, 2))
        assert ckpt.steps() == []


def test_async_error_is_raised_at_next_call(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    ckpt = Checkpointer(tmp_path, async_save=True)
    ckpt.save({"ok": 1}, 1)
    ckpt.save({"bad": lambda: None}, 2)  # not picklable: fails in the writer thread
    with pytest.raises(Exception, match="lambda|pickle"):
        ckpt.wait()
    ckpt.wait()  # raised once
    assert ckpt.load_latest() == (1, {"ok": 1})
    assert os.listdir(tmp_path) == [step_dir(tmp_path, 1).name]
    ckpt.save({"bad": lambda: None}, 3)
    with pytest.raises(Exception, match="lambda|pickle"):
        ckpt.save({"ok": 4}, 4)  # the next save raises the previous one's error
    ckpt.close()


PENDING_AT_EXIT = """
import sys
sys.path.insert(0, {root!r})
from slurmkit.runtime.checkpoint import Checkpointer
ck = Checkpointer(sys.argv[1], async_save=True, keep=1, mirror=False)
ck.save({{"blob": bytes(16 << 20)}}, 1)
ck.save({{"blob": bytes(16 << 20), "n": 2}}, 2)  # no wait(), no close(): the exit waits
"""


def test_a_pending_async_save_is_committed_and_pruned_at_exit(tmp_path: Path) -> None:
    """The interpreter's exit finishes the write under way (its large writes go through the
    helper thread), its commit and its pruning."""
    proc = subprocess.run(
        [sys.executable, "-S", "-c", PENDING_AT_EXIT.format(root=str(ROOT)), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stderr == "", proc.stderr
    assert Checkpointer(tmp_path).steps() == [2] and os.listdir(tmp_path) == [
        step_dir(tmp_path, 2).name
    ]


def test_fsspec_memory_backend(tmp_path: Path) -> None:
    local = Checkpointer(f"file://{tmp_path}")  # a local URL: plain files, with fsync
    local.save({"x": 1}, 1)
    assert local.root == str(tmp_path) and Checkpointer(tmp_path).load_latest() == (1, {"x": 1})
    url = f"memory://ckpt-{os.getpid()}"
    ckpt = Checkpointer(url, keep=2)
    for step in range(4):
        ckpt.save({"step": step, "blob": bytes(2 << 20)}, step)
    ckpt.wait()
    assert ckpt.steps() == [2, 3]
    assert Checkpointer(url).load_latest() == (3, {"step": 3, "blob": bytes(2 << 20)})
    fs = fsspec.filesystem("memory")
    (data,) = [
        p for p in fs.ls(f"/ckpt-{os.getpid()}/step-000000000003", detail=False) if "state-" in p
    ]
    fs.pipe(data, b"garbage")
    assert Checkpointer(url).load_latest()[0] == 2
    assert not [p for p in fs.find(f"/ckpt-{os.getpid()}") if ".tmp-" in p]


def test_only_rank_zero_writes(tmp_path: Path) -> None:
    Checkpointer(tmp_path / "r1", rank=1).save({"x": 1}, 1)
    assert not (tmp_path / "r1").exists()
    assert agree_step(5) == 5 and agree_step(None) is None


STORAGE_SCRIPT = """
import errno, os, sys
sys.path.insert(0, {root!r})
from slurmkit.runtime.checkpoint import Checkpointer, CheckpointError
mnt = sys.argv[1]
for async_save in (False, True):
    where = os.path.join(mnt, "async" if async_save else "sync")
    ckpt = Checkpointer(where, async_save=async_save)
    ckpt.save({{"step": 1, "blob": bytes(100_000)}}, 1)
    ckpt.wait()
    try:  # 2 MiB does not fit in the 1 MiB filesystem
        ckpt.save({{"step": 2, "blob": os.urandom(2 << 20)}}, 2)
        ckpt.wait()
    except CheckpointError as exc:
        assert exc.errno == errno.ENOSPC and where in str(exc) and "step 2" in str(exc), exc
        print("full:", exc)
    else:
        raise AssertionError("no error on a full filesystem")
    assert sorted(os.listdir(where)) == ["step-000000000001"], os.listdir(where)
    assert ckpt.load_latest() == (1, {{"step": 1, "blob": bytes(100_000)}})
os.system(f"mount -o remount,ro {{mnt}}")
ckpt = Checkpointer(os.path.join(mnt, "sync"))
try:
    ckpt.save({{"step": 3}}, 3)
except CheckpointError as exc:
    assert exc.errno == errno.EROFS and "step 3" in str(exc), exc
    print("read-only:", exc)
else:
    raise AssertionError("no error on a read-only filesystem")
assert ckpt.load_latest() == (1, {{"step": 1, "blob": bytes(100_000)}})
print("ok")
"""


def test_full_and_read_only_storage(tmp_path: Path) -> None:
    """A real 1 MiB tmpfs, later remounted read-only, in a private mount namespace (as root)."""
    if (
        shutil.which("unshare") is None
        or subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode != 0
    ):
        pytest.skip("needs unshare -m (root) for a private tmpfs mount")
    script = tmp_path / "storage.py"
    script.write_text(STORAGE_SCRIPT.format(root=str(ROOT)))
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    proc = subprocess.run(
        [
            "unshare",
            "-m",
            "sh",
            "-c",
            f"mount --make-rprivate / && mount -t tmpfs -o size=1m tmpfs {mnt} && "
            f"exec {sys.executable} {script} {mnt}",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No space left on device" in proc.stdout and "Read-only file system" in proc.stdout


def content(step: int) -> dict:
    """What the crash test's child saves as ``step``: up to 256 KiB, different for each step."""
    size = (step * 7919) % (256 << 10)
    digest = hashlib.sha256(str(step).encode()).digest()
    return {"step": step, "blob": (digest * (size // 32 + 1))[:size]}


CRASH_CHILD = """
import hashlib, sys
sys.path.insert(0, {root!r})
from slurmkit.runtime.checkpoint import Checkpointer

{content}
ckpt = Checkpointer(sys.argv[1], keep=2)
found = ckpt.load_latest()
step = 0 if found is None else found[0] + 1
print("ready", flush=True)
while True:
    ckpt.save(content(step), step)
    step += 1
"""


def _phase(root: Path) -> str:
    """Where the newest save was when it was killed, from what it left."""
    dirs = sorted(root.iterdir())
    if not dirs:
        return "before the first save"
    names = os.listdir(dirs[-1])
    if COMMIT in names:
        return "committed (between saves, or pruning)"
    if any(n.startswith(".tmp-COMMIT") for n in names):
        return "writing the commit record"
    if any(n.startswith("state-") for n in names):
        return "data renamed, no commit yet"
    if any(n.startswith(".tmp-") for n in names):
        return "writing the data"
    return "directory created"


@pytest.mark.slow
def test_kill_9_at_random_points_leaves_a_valid_checkpoint(tmp_path: Path) -> None:
    kills = int(os.environ.get("SLURMKIT_CRASH_KILLS", "200"))
    root = tmp_path / "ckpts"
    script = tmp_path / "child.py"
    script.write_text(CRASH_CHILD.format(root=str(ROOT), content=inspect.getsource(content)))
    probe = Checkpointer(tmp_path / "probe", keep=2)  # how long a save takes on this machine
    start = time.perf_counter()
    for step in range(10):
        probe.save(content(step), step)
    window = min(max(5 * (time.perf_counter() - start) / 10, 0.01), 0.06)  # about five saves
    rng = random.Random(1234)
    phases: Counter[str] = Counter()
    latest = -1
    for _ in range(kills):
        child = subprocess.Popen(
            [sys.executable, "-S", str(script), str(root)], stdout=subprocess.PIPE, text=True
        )
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0, window))
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        phases[_phase(root)] += 1
        found = Checkpointer(root).load_latest()
        if found is None:
            assert latest == -1, "a committed checkpoint disappeared"
            continue
        step, state = found
        assert step >= latest, f"step went back from {latest} to {step}"
        assert state == content(step)
        latest = step
    print(
        f"{kills} kills within {window * 1000:.0f} ms of a start, reached step {latest}; "
        f"phases at the kill: {dict(phases)}"
    )
    assert latest >= kills // 10
    assert len(phases) >= 3, phases


REPLICATED = """
import os, sys
sys.path.insert(0, {root!r})
import torch, torch.distributed as dist
from slurmkit.runtime.checkpoint import Checkpointer, agree_step

dist.init_process_group("gloo")
rank = dist.get_rank()
root = sys.argv[1]
assert agree_step(7 if rank == 0 else 5) == 5
assert agree_step(None if rank == 1 else 3) is None

ckpt = Checkpointer(os.path.join(root, "replicated"), keep=2)
assert ckpt.rank == rank
for step in (10, 20, 30):
    ckpt.save({{"step": step, "w": torch.full((4,), float(step))}}, step)
ckpt.wait()  # rank 0's pruning
dist.barrier()
assert ckpt.steps() == [20, 30]
step, state = ckpt.resume()
assert step == 30 and torch.equal(state["w"], torch.full((4,), 30.0))
dist.barrier()
dist.destroy_process_group()
print("rank", rank, "ok", flush=True)
os._exit(0)  # past the checks: a torch/gloo thread torn down at exit once aborted rank 1 under load
"""

SHARDED = """
import os, sys
sys.path.insert(0, {root!r})
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor
from slurmkit.runtime.checkpoint import Checkpointer

dist.init_process_group("gloo")
rank = dist.get_rank()
root = sys.argv[1]
mesh = init_device_mesh("cpu", (2,))
full = torch.arange(64, dtype=torch.float32).reshape(8, 8)
sharded = Checkpointer(os.path.join(root, "sharded"), keep=1)
assert sharded.load_sharded({{"w": distribute_tensor(torch.zeros(8, 8), mesh, [Shard(0)])}}) is None
for step in (1, 2):
    state = {{"w": distribute_tensor(full * step, mesh, [Shard(0)]), "step": step}}
    sharded.save_sharded(state, step)
assert sharded.steps() == [2]
target = {{"w": distribute_tensor(torch.zeros(8, 8), mesh, [Shard(0)]), "step": 0}}
assert sharded.load_sharded(target) == 2
assert torch.equal(target["w"].full_tensor(), full * 2) and target["step"] == 2
dist.barrier()
dist.destroy_process_group()
print("rank", rank, "ok", flush=True)
os._exit(0)  # past the checks: a torch/gloo thread torn down at exit once aborted rank 1 under load
"""


def run_two_ranks(script: str, tmp_path: Path) -> None:
    """Run ``script`` as ranks 0 and 1 of a gloo process group on this machine."""
    path = tmp_path / "ranks.py"
    path.write_text(script.format(root=str(ROOT)))
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "2"}
    procs = [
        subprocess.Popen(
            [sys.executable, str(path), str(tmp_path)],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    ok = all(
        p.returncode == 0 and f"rank {r} ok" in out
        for r, (p, out) in enumerate(zip(procs, outs, strict=True))
    )
    assert ok, "\n".join(f"--- rank {r}:\n{out}" for r, out in enumerate(outs))


@pytest.mark.slow
def test_two_ranks_agree_on_the_step(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed")
    run_two_ranks(REPLICATED, tmp_path)


@pytest.mark.slow
def test_two_ranks_sharded_dcp(tmp_path: Path) -> None:
    pytest.importorskip("torch.distributed.checkpoint")
    pytest.importorskip("numpy", reason="torch.distributed's object collectives (DCP) need numpy")
    run_two_ranks(SHARDED, tmp_path)
    record = json.loads((step_dir(tmp_path / "sharded", 2) / COMMIT).read_text())
    assert record["kind"] == "dcp" and any(f.endswith(".metadata") for f in record["files"])


def test_checksums_over_several_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where spare CPUs give CRC threads, the record's CRC is still zlib's of the whole file,
    and a flipped byte is still caught."""
    torch = pytest.importorskip("torch")
    from slurmkit.runtime import crc

    monkeypatch.setattr(crc, "threads", lambda: 3)
    state = {"a": torch.randn(9 << 20), "b": torch.arange(5)}  # 36 MiB: several pieces
    with Checkpointer(tmp_path, async_save=True) as ckpt:
        assert ckpt._crc_pool() is not None
        ckpt.save(state, 1)
        ckpt.wait()
    path = data_file(tmp_path, 1)
    (info,) = json.loads((step_dir(tmp_path, 1) / COMMIT).read_text())["files"].values()
    assert info["crc32"] == zlib.crc32(path.read_bytes())
    with Checkpointer(tmp_path) as fresh:
        assert torch.equal(fresh.load_latest()[1]["a"], state["a"])
    with path.open("r+b") as fh:
        fh.seek(20 << 20)
        byte = fh.read(1)
        fh.seek(20 << 20)
        fh.write(bytes([byte[0] ^ 1]))
    with Checkpointer(tmp_path) as fresh:
        assert fresh.load_latest() is None


@pytest.mark.parametrize("mode", ["sync", "async", "overlap"])
def test_cuda_snapshot_is_the_state_when_save_was_called(tmp_path: Path, mode: str) -> None:
    """On a GPU (skipped elsewhere): the training steps queued right after ``save`` never leak
    into the checkpoint, whether the copy blocks the host, or runs on a side stream that the
    next optimizer step waits for."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        *[torch.nn.Linear(2048, 2048) for _ in range(8)], torch.nn.BatchNorm1d(2048)
    ).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x = torch.randn(512, 2048, device="cuda")

    def train_step() -> None:
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad()

    for _ in range(2):
        train_step()
    with Checkpointer(tmp_path, async_save=mode != "sync") as ckpt:
        for step in (1, 2):
            state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
            expected = {
                "model": {k: v.clone() for k, v in state["model"].items()},
                "optimizer": {
                    i: {k: v.clone() for k, v in st.items()}
                    for i, st in state["optimizer"]["state"].items()
                },
            }
            ckpt.save(state, step, overlap=opt if mode == "overlap" else None)
            for _ in range(3):
                train_step()  # queued at once: races with the copy unless ordered
            ckpt.wait()
            saved = ckpt.load(step)
            for key, value in expected["model"].items():
                assert torch.equal(saved["model"][key], value.cpu()), (step, key)
            for index, st in expected["optimizer"].items():
                for key, value in st.items():
                    assert torch.equal(saved["optimizer"]["state"][index][key], value.cpu())


def test_unregistrable_snapshot_buffer_warns_and_stays_usable(monkeypatch) -> None:
    """cudaHostRegister can fail (a memlock limit): the buffer stays ordinary memory, usable,
    and a warning says copies into it will block."""
    torch = pytest.importorskip("torch")
    from slurmkit.runtime import pinned

    monkeypatch.setattr(pinned.HostBuffer, "_register", lambda self, device: 201)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    buffers = [pinned.HostBuffer(pinned.REGISTER_FROM + 4096) for _ in range(2)]
    assert not any(b.locked for b in buffers)
    with pytest.warns(RuntimeWarning, match=r"CUDA error 201\) for 2 snapshot buffer"):
        pinned.lock(buffers)
    assert not any(b.locked for b in buffers)
    buffers[0].tensor.fill_(3)
    assert int(buffers[0].tensor.sum()) == 3 * buffers[0].nbytes


def test_cuda_large_snapshot_buffers_are_registered_and_released() -> None:
    """On a GPU (skipped elsewhere): large buffers are page-locked by registration, copies
    into them are right, and dropping the buffer unregisters its memory."""
    import gc

    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from slurmkit.runtime import pinned

    big, small = pinned.HostBuffer(pinned.REGISTER_FROM * 2), pinned.HostBuffer(4096)
    assert small.locked and small.tensor.is_pinned() and not big.locked
    pinned.lock([big, small])
    assert big.locked and big.tensor.is_pinned()
    view = torch.empty(0, dtype=torch.uint8).set_(big.storage)  # outlives the buffer object
    src = torch.arange(256, dtype=torch.uint8, device="cuda").repeat(big.nbytes // 256)
    view.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    assert torch.equal(view, src.cpu())
    del big
    gc.collect()
    assert not view.is_pinned()


def test_cuda_sync_save_goes_through_a_page_locked_copy(tmp_path: Path, monkeypatch) -> None:
    """On a GPU (skipped elsewhere): a sync save copies CUDA state into host memory first, so
    torch.save writes host tensors (the copy is page-locked where large: tests/test_snapshot.py),
    unless that copy would not fit in half the available memory: then torch.save copies each
    CUDA storage itself and the file holds CUDA tensors."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    from slurmkit.runtime import memory

    state = {
        "w": torch.randn(2048, 2048, device="cuda"),  # 16 MiB: a registered buffer
        "b": torch.randn(8, device="cuda"),
        "step": 3,
    }
    cached = torch.cuda.host_memory_stats().get("allocated_bytes.current", 0)
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(state, 1)
        # nothing stays page-locked: small buffers were pageable, not from torch's pinned cache
        assert torch.cuda.host_memory_stats().get("allocated_bytes.current", 0) == cached
        saved = ckpt.load(1)
        assert saved["step"] == 3
        assert all(torch.equal(saved[k], state[k].cpu()) for k in ("w", "b"))
        as_written = ckpt.load(1, map_location=None)  # each tensor where it was when saved
        assert all(as_written[k].device.type == "cpu" for k in ("w", "b"))
        monkeypatch.setattr(memory, "available", lambda: 0)
        ckpt.save(state, 2)
        assert ckpt.load(2, map_location=None)["w"].is_cuda
        assert torch.equal(ckpt.load(2)["w"], state["w"].cpu())


def test_sync_save_of_state_a_snapshot_would_deep_copy(tmp_path: Path) -> None:
    """Sparse tensors, modules and other objects go to torch.save as they are (a snapshot would
    fail on some or deep-copy them); dense trees are counted, shared storages once."""
    torch = pytest.importorskip("torch")
    from slurmkit.runtime.checkpoint.snapshot import dense_tree_bytes as _dense_tree_bytes

    w = torch.ones(4, 4)
    assert _dense_tree_bytes(
        {"a": w, "b": [w[1:], torch.ones(2, dtype=torch.float64)], "n": (1, "x", None)}
    ) == (64 + 16, 0)
    assert _dense_tree_bytes({"emb": w.to_sparse()}) is None
    assert _dense_tree_bytes({"m": torch.nn.Linear(2, 2)}) is None
    state = {"emb": w.to_sparse(), "m": torch.nn.Linear(2, 2), "w": w}
    with Checkpointer(tmp_path) as ckpt:
        ckpt.save(state, 1)
        saved = ckpt.load(1)
    assert torch.equal(saved["emb"].to_dense(), w) and torch.equal(saved["w"], w)
    assert torch.equal(saved["m"].weight, state["m"].weight)
