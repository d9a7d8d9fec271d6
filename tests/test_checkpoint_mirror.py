"""Checkpoint tiering: ``Checkpointer(root, mirror=URL)`` against a real S3 endpoint (moto's
server on 127.0.0.1, every request logged; see tests/s3server.py). Whole checkpoints only on
the mirror (SIGKILL midway), its retention, retries with backoff, restores from the newest copy
valid on either tier, the mirror from the environment; and on the real test cluster, a trial
requeued after its checkpoints were wiped resumes from the mirror, bit-exactly."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from conftest import ROOT, slurm_submit
from s3server import BUCKET, SECRET, Server, env_for
from test_cluster_requeue import RESULT_KEYS, trial_status, wait_for

from slurmkit.runtime.checkpoint import COMMIT, Checkpointer
from slurmkit.runtime.checkpoint import mirror as lib

pytestmark = pytest.mark.filterwarnings("ignore:slurmkit.checkpoint")
TRAIN = ROOT / "examples" / "resumable_train.py"
BLOCK = 5 << 20  # larger files go to S3 in multipart uploads (s3fs's smallest part size)


class Flaky(Server):
    """The test server, able (through its fault proxy: the `faults` fixture) to refuse chosen
    writes (403, which botocore does not retry) and to hold chosen requests until released."""

    def __init__(self) -> None:
        super().__init__()
        self.refuse: dict[str, int] = {}  # key pattern -> PUT/POSTs still to refuse
        self.held: set[str] = set()  # key prefixes whose requests wait for `released`
        self.released = threading.Event()
        self.released.set()

    def intercept(self, method: str, key: str) -> tuple[int, bytes] | None:
        if any(key.startswith(p) for p in list(self.held)):
            assert self.released.wait(60)
        if method in ("PUT", "POST"):
            for pattern, left in list(self.refuse.items()):
                if re.match(pattern, key) and left > 0:
                    self.refuse[pattern] = left - 1
                    return 403, b"<Error><Code>AccessDenied</Code><Message>no</Message></Error>"
        return super().intercept(method, key)


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The server; this process's AWS chain (and its children's) points at it meanwhile."""
    pytest.importorskip("s3fs")
    import fsspec.config
    import s3fs

    server = Flaky()
    server.create_bucket(BUCKET)
    env = env_for(server, tmp_path_factory.mktemp("aws"))
    with pytest.MonkeyPatch.context() as mp:
        for name in [k for k in os.environ if k.startswith("AWS_")]:
            mp.delenv(name)
        for name, value in env.items():
            if name.startswith("AWS_"):
                mp.setenv(name, value)
        mp.setenv("FSSPEC_S3", json.dumps({"default_block_size": BLOCK}))  # children
        mp.setitem(fsspec.config.conf, "s3", {"default_block_size": BLOCK})
        s3fs.S3FileSystem.clear_instance_cache()
        yield server
    s3fs.S3FileSystem.clear_instance_cache()
    server.close()


@pytest.fixture
def faults(s3, monkeypatch):
    """This test's requests (its children's too) go through the fault proxy: ``s3.corrupt``,
    ``gone``, ``refuse``, ``held``."""
    import s3fs

    with s3.faults():
        monkeypatch.setenv("AWS_ENDPOINT_URL", s3.url)
        s3fs.S3FileSystem.clear_instance_cache()
        yield
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def url(s3, request) -> str:
    """A prefix of its own for each test."""
    return f"s3://{BUCKET}/{request.node.name.replace('[', '-').strip(']')}"


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr(lib, "BACKOFF", (0.05, 0.2))


def state(step: int, size: int = 1 << 20) -> dict:
    return {"step": step, "blob": random.Random(step).randbytes(size)}


def mirror_of(url: str) -> Checkpointer:
    return Checkpointer(url, mirror=False)


def assert_whole(s3: Flaky, url: str) -> list[int]:
    """Every commit record on the mirror stands beside all its files, intact; its steps."""
    prefix = url.split("/", 3)[3] + "/"
    keys = s3.keys(prefix)
    steps = []
    for key, body in keys.items():
        if key.endswith("/" + COMMIT):
            record = json.loads(body)
            folder = key[: -len(COMMIT)]
            for rel, info in record["files"].items():
                data = keys.get(folder + rel)
                assert data is not None, f"{key} without its {rel}"
                assert len(data) == info["size"], rel
                assert zlib.crc32(data) == info.get("crc32", zlib.crc32(data)), rel
            steps.append(record["step"])
    return sorted(steps)


# ---- the pure parts -----------------------------------------------------------------------------


def test_the_mirror_from_the_environment_is_one_per_sweep_trial_and_root():
    env = {
        "SLURMKIT_CHECKPOINT_MIRROR": "s3://b/runs/",
        "SLURMKIT_SWEEP_DIR": "/shared/runs/lr-20261130-101500",
        "SLURMKIT_TRIAL_ID": "3f2a",
        "SLURMKIT_TRIAL_DIR": "/shared/runs/lr-20261130-101500/trials/3f2a",
    }
    trial = "s3://b/runs/lr-20261130-101500/trials/3f2a"
    assert lib.from_environment(env["SLURMKIT_TRIAL_DIR"] + "/checkpoints", env) == (
        f"{trial}/checkpoints"
    )
    assert lib.from_environment(env["SLURMKIT_TRIAL_DIR"] + "/ck/a", env) == f"{trial}/ck/a"
    assert lib.from_environment("/var/nvme/job7/ckpt", env) == f"{trial}/ckpt"  # elsewhere
    assert lib.from_environment(env["SLURMKIT_TRIAL_DIR"], env) == f"{trial}/3f2a"
    outside = {"SLURMKIT_CHECKPOINT_MIRROR": "s3://b/run"}
    assert lib.from_environment("/tmp/x", outside) == "s3://b/run"
    assert lib.from_environment("/tmp/x", {"SLURMKIT_CHECKPOINT_MIRROR": " "}) is None
    assert lib.keep_from_environment({"SLURMKIT_CHECKPOINT_MIRROR_KEEP": "5"}) == 5
    assert lib.keep_from_environment({}) is None
    with pytest.raises(ValueError, match="SLURMKIT_CHECKPOINT_MIRROR_KEEP='x'"):
        lib.keep_from_environment({"SLURMKIT_CHECKPOINT_MIRROR_KEEP": "x"})
    assert lib.public("https://u:pw@host/a/b?sig=1#f") == "https://host/a/b"
    assert lib.public("s3://bucket/run") == "s3://bucket/run" and lib.public("/p") == "/p"


def test_backoff_doubles_up_to_a_cap_and_restores_look_newest_first():
    assert [lib.backoff(n, 1.0, 10.0) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]
    assert lib.order([3, 5], [5, 7, 1]) == [
        (7, "mirror"),
        (5, "fast"),
        (5, "mirror"),
        (3, "fast"),
        (1, "mirror"),
    ]
    assert lib.order([], []) == []


def test_a_bad_mirror_is_refused_at_once(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="mirror_keep"):
        Checkpointer(tmp_path, mirror=str(tmp_path / "m"), mirror_keep=0)
    with pytest.raises(ValueError, match="is the root itself"):
        Checkpointer(tmp_path, mirror=f"file://{tmp_path}")
    monkeypatch.setenv("SLURMKIT_CHECKPOINT_MIRROR", str(tmp_path / "m"))
    monkeypatch.setenv("SLURMKIT_CHECKPOINT_MIRROR_KEEP", "many")
    with pytest.raises(ValueError, match="not a whole number"):
        Checkpointer(tmp_path)
    assert Checkpointer(tmp_path, mirror=False).mirror is None


def test_a_local_mirror_is_written_through_renames(tmp_path):
    """A mirror on a path (a second disk) goes through temporary names like the fast path."""
    with Checkpointer(tmp_path / "fast", keep=1, mirror=tmp_path / "slow", mirror_keep=2) as ck:
        for step in range(4):
            ck.save(state(step), step)
            assert ck.wait_mirrored(30)
    assert mirror_of(str(tmp_path / "slow")).steps() == [2, 3]
    assert not [p for p in (tmp_path / "slow").rglob("*") if ".tmp-" in p.name]
    shutil.rmtree(tmp_path / "fast")
    assert Checkpointer(tmp_path / "fast", mirror=tmp_path / "slow").load_latest() == (3, state(3))


# ---- through a real S3 endpoint -----------------------------------------------------------------


@pytest.mark.slow
def test_saves_are_mirrored_whole_with_their_own_retention(s3, url, tmp_path):
    fast = tmp_path / "fast"
    prefix = url.split("/", 3)[3] + "/"
    mark = s3.mark()
    with Checkpointer(fast, keep=1, mirror=url, mirror_keep=3) as ck:
        for step in range(6):
            ck.save(state(step, 3 * BLOCK), step)  # multipart uploads
            assert ck.wait_mirrored(60)
    status = ck.mirror_status()
    assert status is not None
    assert (status.state, status.mirrored, status.uploaded, status.failures) == ("closed", 5, 6, 0)
    assert status.url == url and status.error is None
    assert assert_whole(s3, url) == [3, 4, 5]  # mirror_keep
    assert [p.name for p in fast.iterdir()] == ["step-000000000005"]  # keep
    assert mirror_of(url).load(4) == state(4, 3 * BLOCK)
    # per step, the commit record is written only once its data file is complete
    for step in range(6):
        writes = [
            (m, q)
            for m, k, q, _ in s3.log[mark:]
            if k.startswith(f"{prefix}step-{step:012d}/") and m in ("PUT", "POST")
        ]
        done = writes.index(next(w for w in writes if w[0] == "POST" and "uploadId" in w[1]))
        assert writes[-1] == ("PUT", "") and done == len(writes) - 2, writes
    assert s3.open_uploads() == 0


@pytest.mark.slow
def test_save_never_waits_for_the_mirror(s3, faults, url, tmp_path):
    """With every request to the mirror held, saves commit on the fast path and return; the
    newest checkpoint is uploaded once the store answers, the ones in between superseded."""
    prefix = url.split("/", 3)[3] + "/"
    s3.held.add(prefix)
    s3.released.clear()
    try:
        with Checkpointer(tmp_path, keep=4, mirror=url, mirror_keep=2) as ck:
            ck.save(state(0), 0)
            wait_for("the upload to start", lambda: ck.mirror_status().pending == 0)  # type: ignore[union-attr]
            for step in range(1, 4):
                ck.save(state(step), step)
            assert ck.steps() == [0, 1, 2, 3]
            status = ck.mirror_status()
            assert status is not None and (status.state, status.pending) == ("uploading", 0)
            assert not ck.wait_mirrored(0.1)
            s3.released.set()
            assert ck.wait_mirrored(60)
            status = ck.mirror_status()
    finally:
        s3.held.discard(prefix)
        s3.released.set()
    assert status is not None and (status.mirrored, status.uploaded) == (3, 2)
    assert status.superseded == 2  # steps 1 and 2: step 3 was queued before their turn
    assert assert_whole(s3, url) == [0, 3]


@pytest.mark.slow
def test_upload_failures_are_retried_with_backoff_and_reported(
    s3, faults, url, tmp_path, capfd, fast_backoff
):
    prefix = url.split("/", 3)[3] + "/"
    s3.refuse[prefix] = 10**6  # refused until further notice (the prefix: a plain pattern)
    ck = Checkpointer(tmp_path, mirror=url)
    try:
        ck.save(state(1), 1)
        deadline = time.time() + 60
        while (ck.mirror_status().failures < 4) and time.time() < deadline:  # type: ignore[union-attr]
            time.sleep(0.02)
        status = ck.mirror_status()
        assert status is not None and status.state == "retrying" and status.pending == 1
        assert status.attempts >= 4 and status.backoff == 0.2  # 0.05, 0.1, 0.2, 0.2, ...
        assert "PermissionError" in (status.error or "") and status.mirrored is None
        ck.save(state(2), 2)  # training goes on meanwhile
        assert ck.steps() == [1, 2]
        s3.refuse[prefix] = 0
        assert ck.wait_mirrored(60)
        status = ck.mirror_status()
    finally:
        s3.refuse.pop(prefix, None)
        ck.close()
    assert status is not None and (status.state, status.mirrored, status.pending) == (
        "idle",
        2,
        None,
    )
    assert status.uploaded + status.superseded == 2  # step 2 replaced step 1, or came after it
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "mirroring step 1" in line]
    delays = [line.rsplit("retrying in ", 1)[1] for line in lines]
    assert delays[:4] == ["0.05 s", "0.1 s", "0.2 s", "0.2 s"], err
    assert all(f"to {url} failed (attempt {n})" in line for n, line in enumerate(lines, 1))
    assert assert_whole(s3, url)[-1] == 2
    assert SECRET not in err


@pytest.mark.slow
def test_close_waits_for_the_mirror_no_longer_than_mirror_wait(
    s3, faults, url, tmp_path, capfd, fast_backoff
):
    prefix = url.split("/", 3)[3] + "/"
    s3.refuse[prefix] = 10**6
    try:
        ck = Checkpointer(tmp_path, mirror=url, mirror_wait=0.3)
        ck.save(state(1), 1)
        ck.close()  # returns with step 1 unmirrored, and says so
        assert not ck.wait_mirrored()  # the uploader has ended: nothing to wait for
    finally:
        s3.refuse.pop(prefix)
    status = ck.mirror_status()
    assert status is not None and status.state == "closed" and status.mirrored is None
    assert f"step 1 not yet mirrored to {url} (not done after 0.3 s)" in capfd.readouterr().err
    assert ck.load_latest() == (1, state(1))  # still on the fast path


@pytest.mark.slow
def test_a_failure_that_retrying_cannot_fix_is_reported_once(s3, faults, url, tmp_path, capfd):
    """A fast-path copy damaged before its upload: no commit record reaches the mirror."""
    prefix = url.split("/", 3)[3] + "/"
    s3.held.add(prefix)
    s3.released.clear()
    try:
        ck = Checkpointer(tmp_path, mirror=url)
        ck.save(state(1), 1)
        (data,) = (tmp_path / "step-000000000001").glob("state-*")
        body = bytearray(data.read_bytes())
        body[100] ^= 1
        data.write_bytes(body)
        s3.released.set()
        assert not ck.wait_mirrored(60)
        status = ck.mirror_status()
        ck.close()
    finally:
        s3.held.discard(prefix)
        s3.released.set()
    assert status is not None and status.state == "failed" and status.failures == 0
    assert "does not match its commit record" in (status.error or "")
    assert "step 1 not mirrored" in capfd.readouterr().err
    assert s3.keys(prefix) == {} and s3.open_uploads() == 0


@pytest.mark.slow
def test_restores_the_newest_copy_valid_on_either_tier(s3, faults, url, tmp_path, recwarn, capfd):
    fast, prefix = tmp_path / "fast", url.split("/", 3)[3] + "/"
    with Checkpointer(fast, keep=10, mirror=url, mirror_keep=10) as ck:
        for step in (1, 2, 3, 4):
            ck.save(state(step), step)
            assert ck.wait_mirrored(60)
    Checkpointer(fast, keep=10, mirror=False).save(state(5), 5)  # not mirrored (yet)

    def latest() -> tuple[int, dict] | None:
        return Checkpointer(fast, mirror=url).load_latest()

    def spoil(step: int) -> None:
        (data,) = (fast / f"step-{step:012d}").glob("state-*")
        data.write_bytes(b"rot")

    assert latest() == (5, state(5))  # the fast path's newest, newer than the mirror's
    spoil(5)
    assert latest() == (4, state(4))  # fast 4 (fast first for one step)
    assert "restored" not in capfd.readouterr().err
    spoil(4)
    assert latest() == (4, state(4))  # the mirror's 4
    assert "restored step 4 from the mirror " + url in capfd.readouterr().err
    s3.corrupt.add(f"{prefix}step-000000000004/" + data_name(s3, prefix, 4))
    try:
        assert latest() == (3, state(3))  # both copies of 4 damaged: fast 3
    finally:
        s3.corrupt.clear()
    assert any("skipping step 4 (mirror)" in str(w.message) for w in recwarn)
    shutil.rmtree(fast)  # a wiped scratch, a fresh cluster
    assert latest() == (4, state(4))
    s3.delete(f"{prefix}step-000000000004/{COMMIT}")  # cut short
    recwarn.clear()
    assert latest() == (3, state(3))
    assert not [w for w in recwarn if "step 4" in str(w.message)]  # no checkpoint, no warning
    s3.gone.add(f"{prefix}step-000000000003/" + data_name(s3, prefix, 3))
    try:
        assert latest() == (2, state(2))
    finally:
        s3.gone.clear()
    assert Checkpointer(fast, mirror=url).resume() == (3, state(3))  # one rank: the same choice


def data_name(s3: Flaky, prefix: str, step: int) -> str:
    (key,) = [k for k in s3.keys(f"{prefix}step-{step:012d}/") if "/state-" in k]
    return key.rsplit("/", 1)[1]


@pytest.mark.slow
def test_an_unreachable_mirror_is_warned_about_and_raises_only_with_nothing_else(tmp_path):
    bad = f"s3://{BUCKET}/x"  # no S3 server at this address: the listing fails
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "1"}
    code = f"""
import sys, warnings
sys.path.insert(0, {str(ROOT)!r})
from slurmkit.runtime.checkpoint import Checkpointer, CheckpointError
Checkpointer(sys.argv[1], mirror=False).save({{"x": 1}}, 1)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    assert Checkpointer(sys.argv[1], mirror={bad!r}).load_latest() == (1, {{"x": 1}})
assert any("cannot read s3://data/x" in str(w.message) for w in seen), seen
try:
    Checkpointer(sys.argv[2], mirror={bad!r}).load_latest()
except CheckpointError as exc:
    assert "cannot read checkpoints: s3://data/x" in str(exc), exc
    print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "a"), str(tmp_path / "b")],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=120,
    )
    assert proc.stdout == "ok\n", proc.stderr


def test_the_environment_turns_the_mirror_on(s3, url, tmp_path, monkeypatch):
    trial = tmp_path / "sweep-1" / "trials" / "abc"
    monkeypatch.setenv("SLURMKIT_CHECKPOINT_MIRROR", url)
    monkeypatch.setenv("SLURMKIT_CHECKPOINT_MIRROR_KEEP", "1")
    monkeypatch.setenv("SLURMKIT_SWEEP_DIR", str(tmp_path / "sweep-1"))
    monkeypatch.setenv("SLURMKIT_TRIAL_ID", "abc")
    monkeypatch.setenv("SLURMKIT_TRIAL_DIR", str(trial))
    with Checkpointer(trial / "checkpoints") as ck:
        for step in (1, 2):
            ck.save(state(step), step)
        assert ck.wait_mirrored(60)
    assert assert_whole(s3, f"{url}/sweep-1/trials/abc/checkpoints") == [2]
    assert Checkpointer(trial / "other", mirror=False).mirror is None


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_sharded_checkpoints_are_mirrored_whole(s3, url, tmp_path):
    """A DCP checkpoint (files in a subfolder, sizes in its record) reaches the mirror, which
    load_sharded reads as a root of its own."""
    torch = pytest.importorskip("torch")
    with Checkpointer(tmp_path, mirror=url) as ck:
        ck.save_sharded({"w": torch.arange(8.0), "n": 1}, 1)
        assert ck.wait_mirrored(60)
    keys = sorted(k.split("/", 2)[2] for k in s3.keys(url.split("/", 3)[3] + "/"))
    assert keys[0] == COMMIT and len(keys) == 3 and all(k.startswith("dcp-") for k in keys[1:])
    target = {"w": torch.zeros(8), "n": 0}
    assert mirror_of(url).load_sharded(target) == 1
    assert torch.equal(target["w"], torch.arange(8.0)) and target["n"] == 1


EXITING = """
import sys
sys.path.insert(0, {root!r})
from slurmkit.runtime import preemption
from slurmkit.runtime.checkpoint import Checkpointer
ck = Checkpointer(sys.argv[1], mirror=sys.argv[2], async_save=True)
ck.save({{"step": 7}}, 7)
preemption.exit_for_requeue()  # no close(): the interpreter's exit flushes the mirror
"""


@pytest.mark.slow
def test_exit_for_requeue_flushes_the_mirror(s3, url, tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", EXITING.format(root=str(ROOT)), str(tmp_path), url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 75, proc.stderr
    assert assert_whole(s3, url) == [7] and proc.stderr == ""


KILLED = """
import random, sys
sys.path.insert(0, {root!r})
from slurmkit.runtime.checkpoint import Checkpointer

def content(step):
    return {{"step": step, "blob": random.Random(step).randbytes({size})}}

ck = Checkpointer(sys.argv[1], keep=2, mirror=sys.argv[2], mirror_keep=2)
found = ck.load_latest()
step = 0 if found is None else found[0] + 1
print("ready", flush=True)
while True:
    ck.save(content(step), step)
    step += 1
"""


@pytest.mark.slow
def test_kill_9_midway_leaves_only_whole_checkpoints_on_the_mirror(s3, faults, url, tmp_path):
    """The uploader (and its process) killed at random points: every commit record on the
    mirror stands beside its whole data, and a restore from the mirror alone always works."""
    kills = int(os.environ.get("SLURMKIT_MIRROR_KILLS", "10"))
    size = BLOCK + 12345  # a multipart upload
    script = tmp_path / "child.py"
    script.write_text(KILLED.format(root=str(ROOT), size=size))
    prefix = url.split("/", 3)[3] + "/"
    rng = random.Random(13)
    phases = {"data without its record": 0, "a multipart upload open": 0}
    newest, uploads = -1, s3.open_uploads()
    commits = f"{re.escape(prefix)}.*/{re.escape(COMMIT)}$"
    # at least `kills` kills, and more (up to 4x) until both phases were hit: where a random
    # kill lands is timing, and a loaded machine shifts it
    done = 0
    while done < kills or (not all(phases.values()) and done < 4 * kills):
        i, done = done, done + 1
        s3.refuse[commits] = 10**6 if i % 3 == 2 else 0  # now and then, after the data
        child = subprocess.Popen(
            [sys.executable, str(script), str(tmp_path / "fast"), url],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        time.sleep(rng.uniform(0.5, 4.0))  # an upload takes about a second here
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        steps = assert_whole(s3, url)
        folders = {k.split("/")[-2] for k in s3.keys(prefix)}
        if len(folders) > len(steps):
            phases["data without its record"] += 1
        if s3.open_uploads() > uploads:
            phases["a multipart upload open"] += 1
            uploads = s3.open_uploads()
        if steps:
            assert steps[-1] >= newest, "the mirror went back"
            newest = steps[-1]
            found = Checkpointer(tmp_path / "empty", mirror=url).load_latest()
            assert found is not None and found[1]["blob"] == random.Random(found[0]).randbytes(size)
    s3.refuse.pop(commits)
    print(f"{done} kills, the mirror reached step {newest}; at the kills: {phases}")
    assert newest >= 0 and all(phases.values()), phases


# ---- on the real test cluster --------------------------------------------------------------------


@pytest.mark.cluster
@pytest.mark.slow
def test_a_requeued_trial_whose_checkpoints_were_wiped_resumes_from_the_mirror(
    slurm_cluster, s3, url, tmp_path
):
    """examples/resumable_train.py, the mirror turned on by the spec's env alone; requeued by
    `scontrol requeue`, its shared checkpoint directory wiped while it waits: it resumes from
    the mirror at the very step it stopped at, and ends bit-identical to an uninterrupted run.
    The AWS chain reaches the job as the submitting shell's environment (sbatch exports it)."""
    params = {"steps": 200, "ckpt_every": 20}
    result = slurm_submit(
        tmp_path,
        f"""
name: mirrored
command: [python, {TRAIN}]
params: {{steps: [200], step_time: [0.05], ckpt_every: [20]}}
env: {{SLURMKIT_CHECKPOINT_MIRROR: "{url}"}}
""",
    )
    root = Path(result["sweep_dir"])
    (row,) = [json.loads(line) for line in (root / "trials.jsonl").read_text().splitlines()]
    trial = root / "trials" / row["id"]
    mirrored = f"{url}/{root.name}/trials/{row['id']}/checkpoints"
    wait_for("a checkpoint on the mirror", lambda: bool(assert_whole(s3, mirrored)), 120)
    attempt = trial_status(str(root))["attempts"][-1]
    task = f"{attempt['array_job_id']}_{attempt['array_task_id']}"
    slurm_cluster.run("scontrol", "requeue", task)
    wait_for(
        "the first attempt to end",
        lambda: trial_status(str(root))["attempts"][0].get("exit_code") == 75,
        120,
    )
    shutil.rmtree(trial / "checkpoints")  # a wiped scratch
    slurm_cluster.release_requeued(task)
    final = slurm_cluster.finish(str(root))
    assert final["counts"] == {"COMPLETED": 1}
    log = (trial / "output.log").read_text()
    stopped = re.findall(r"stopping at step (\d+)", log)
    restored = re.findall(r"restored step (\d+) from the mirror (\S+)", log)
    assert len(stopped) == 1 and restored == [(stopped[0], mirrored)], log
    assert re.findall(r"resumed from step (\d+)", log) == stopped
    metrics = json.loads((trial / "metrics.json").read_text())
    expected = reference(tmp_path, params)
    assert {k: metrics[k] for k in RESULT_KEYS} == {k: expected[k] for k in RESULT_KEYS}
    assert metrics["resumed_at"] == int(stopped[0]) > 0
    assert assert_whole(s3, mirrored)[-1] == 200  # the last checkpoint, mirrored at close()
    logs = [p for p in slurm_cluster.dir.rglob("*.log") if p.is_file()]
    for path in [*root.rglob("*"), *logs]:
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def reference(tmp_path: Path, params: dict) -> dict:
    """The metrics of an uninterrupted run, here, without a mirror."""
    tdir = tmp_path / "reference"
    tdir.mkdir()
    env = {
        **os.environ,
        "SLURMKIT_TRIAL_DIR": str(tdir),
        "SLURMKIT_PARAMS": json.dumps({**params, "step_time": 0}),
    }
    subprocess.run([sys.executable, str(TRAIN)], env=env, check=True, capture_output=True)
    return json.loads((tdir / "metrics.json").read_text())
