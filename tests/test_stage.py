"""`slurmkit stage` against a real S3 endpoint: moto's standalone server on 127.0.0.1, reached
through s3fs from a real `slurmkit` process. GETs are counted where they arrive, from the
server's request log; the tests that damage or drop chosen objects on their way out go through
a fault proxy (the `faults` fixture; see tests/s3server.py)."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

import pytest
from conftest import ROOT, SLURMKIT
from s3server import BUCKET, SECRET, Server, env_for

from slurmkit import stage as lib
from slurmkit.errors import UserError
from slurmkit.stage.ranged import s3_range

PART_MIB = 4  # --part-size in the tests: the large files below take 4 and 7 parts
SMALL = 1000


@pytest.fixture(scope="module")
def s3():
    server = Server()
    server.create_bucket(BUCKET)
    yield server
    server.close()


@pytest.fixture
def faults(s3):
    """This test's requests go through the fault proxy (``s3.corrupt``, ``s3.gone``)."""
    with s3.faults():
        yield


@pytest.fixture(scope="module")
def dataset(s3) -> dict[str, bytes]:
    """ds/: 1,000 small files in 10 folders and two large ones (16 MiB, 24 MiB + 123 B)."""
    rng = random.Random(13)
    files = {f"d{i % 10}/f{i:04d}.bin": rng.randbytes(rng.randint(1, 4000)) for i in range(SMALL)}
    files["large/a.bin"] = rng.randbytes(16 << 20)
    files["large/b.bin"] = rng.randbytes((24 << 20) + 123)
    for rel, data in files.items():
        s3.put(f"ds/{rel}", data)
    return files


def stage_cmd(src: str, dst: Path, *args: str) -> list[str]:
    return [*SLURMKIT, "stage", src, str(dst), "--part-size", str(PART_MIB), *args]


def run_stage(env, src: str, dst: Path, *args: str, outputs: list | None = None):
    proc = subprocess.run(
        stage_cmd(src, dst, *args), capture_output=True, text=True, env=env, timeout=120
    )
    if outputs is not None:
        outputs += [proc.stdout, proc.stderr]
    return proc


def assert_same(dst: Path, files: dict[str, bytes]) -> None:
    """DST is published and holds exactly ``files``, and its manifest says so."""
    found = lib.ready(str(dst))
    assert found is not None
    rows = {row["path"]: row for row in found["files"]}
    assert set(rows) == set(files)
    for rel, data in files.items():
        assert (dst / rel).read_bytes() == data, rel
        assert rows[rel]["size"] == len(data)
        assert rows[rel]["checksum"] == f"crc32:{zlib.crc32(data):08x}"
    on_disk = {
        str(p.relative_to(dst)) for p in dst.rglob("*") if p.is_file() and p.name != lib.MANIFEST
    }
    assert on_disk == set(files)


def assert_fetched_once(s3: Server, since: int, files: dict[str, bytes], prefix: str) -> None:
    """Every object was fetched exactly once: a small one in one GET, a large one in ranged
    parts that cover it without overlap."""
    seen: dict[str, list[str | None]] = {}
    for key, rng in s3.gets(since, prefix):
        seen.setdefault(key[len(prefix) :], []).append(rng)
    assert set(seen) == set(files)
    for rel, data in files.items():
        if len(data) <= PART_MIB << 20:
            assert seen[rel] == [None], (rel, seen[rel])
        else:
            spans = sorted(tuple(map(int, r.split("=")[1].split("-"))) for r in seen[rel])
            expected = [(a, b - 1) for a, b in lib.parts(len(data), PART_MIB << 20)]
            assert spans == expected, rel


def assert_no_secret(outputs: list[str], *dirs: Path) -> None:
    for text in outputs:
        assert SECRET not in text
    for folder in dirs:
        for path in folder.rglob("*"):
            if path.is_file():
                assert SECRET.encode() not in path.read_bytes(), path


# ---- the pure parts ---------------------------------------------------------------------------


def test_plan_skips_journaled_files_rechecks_unjournaled_ones_and_batches_the_rest():
    e = lambda path, size, version="v1": lib.Entry(path, f"b/{path}", size, version)
    source = [e("a", 10), e("b", 10), e("c", 10), e("d", 10, "v2"), e("big", 100), e("e", 60)]
    journal = {
        "a": lib.Record("a", 10, "v1", "crc32:0"),
        "d": lib.Record("d", 10, "v1", "crc32:0"),  # an older version of d
        "e": lib.Record("e", 10, "v1", "crc32:0"),  # journaled, but gone from the disk
    }
    present = {"a": 10, "b": 10, "d": 10}
    todo = lib.plan(source, journal, present, part_size=64, batch_files=2)
    assert [x.path for x in todo.skip] == ["a"]
    assert [x.path for x in todo.recheck] == ["b"]  # renamed into place, not journaled
    assert [[x.path for x in b] for b in todo.batches] == [["c", "d"], ["e"]]  # bytes, count
    assert [x.path for x in todo.large] == ["big"]
    assert lib.parts(100, 64) == [(0, 64), (64, 100)] and lib.parts(0, 64) == []
    plain = lib.plan([e("big", 100), e("unknown", None)], {}, {}, part_size=64, ranges=False)
    assert [x.path for x in plain.whole] == ["big", "unknown"] and not plain.large


def test_part_bytes_share_the_large_files_among_the_threads():
    big = [lib.Entry(f"f{i}", f"b/f{i}", 256 << 20) for i in range(3)]
    assert lib.part_bytes(big, 16, 16 << 20) == 48 << 20  # one part per thread
    assert lib.part_bytes(big[:1], 16, 16 << 20) == 16 << 20  # never below --part-size
    assert lib.part_bytes(big, 64, 16 << 20) == 16 << 20  # more threads: still --part-size
    assert lib.part_bytes(big, 20, 1 << 20) == 39 << 20  # 38.4 MiB, in whole MiB
    assert lib.part_bytes(big * 10, 16, 16 << 20) == lib.MAX_PART
    assert lib.part_bytes(big * 10, 16, 128 << 20) == 128 << 20  # a larger --part-size holds
    assert lib.part_bytes([], 16, 16 << 20) == 16 << 20


def test_a_streamed_part_cut_short_is_asked_again_from_where_it_stopped(tmp_path):
    """s3fs's ranged GET streamed to disk: the connection drops halfway once; the part is
    asked again for its remaining bytes only, and its CRC covers the whole part."""
    from aiohttp import ClientPayloadError
    from fsspec.asyn import get_loop

    data = random.Random(3).randbytes(5 << 20)
    asked: list[str] = []

    class Body:
        def __init__(self, chunk: bytes, cut: bool) -> None:
            self.chunk, self.cut, self.sent = chunk, cut, 0

        async def read(self, n: int) -> bytes:
            if self.cut and self.sent >= len(self.chunk) // 2:
                raise ClientPayloadError("connection lost")
            out = self.chunk[self.sent : self.sent + min(n, 100_000)]
            self.sent += len(out)
            return out

        def close(self) -> None:
            pass

    class FS:
        loop, retries = get_loop(), 3

        def split_path(self, url: str) -> tuple[str, str, None]:
            return "b", url, None

        async def _call_s3(self, method: str, **kw: str) -> dict:
            asked.append(kw["Range"])
            a, b = map(int, kw["Range"].split("=")[1].split("-"))
            return {"Body": Body(data[a : b + 1], cut=len(asked) == 1), "ContentLength": b + 1 - a}

    fd = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    os.ftruncate(fd, len(data))
    try:
        crc = s3_range(FS(), "k", 1 << 20, 5 << 20, fd, "s3://b/k")
    finally:
        os.close(fd)
    assert crc == zlib.crc32(data[1 << 20 :])
    assert (tmp_path / "f").read_bytes()[1 << 20 :] == data[1 << 20 :]
    cut = (1 << 20) + 2_100_000  # half the part, in whole reads of 100,000 bytes
    assert asked == [f"bytes={1 << 20}-{(5 << 20) - 1}", f"bytes={cut}-{(5 << 20) - 1}"]


def test_urls_are_checked_and_shown_without_credentials():
    assert lib.public("https://user:pw@host/a/b?X-Amz-Signature=abc#f") == "https://host/a/b"
    assert lib.public("s3://bucket/key") == "s3://bucket/key"
    assert lib.source_protocol("s3://b/k") == "s3" and lib.source_protocol("gs://b/k") == "gcs"
    assert lib.source_protocol("/data/x") == "file" and lib.source_protocol("file:///x") == "file"
    for bad in ("ftp://host/x", "s3://", "simplecache::s3://b/k", ""):
        with pytest.raises(UserError) as info:
            lib.source_protocol(bad)
        assert info.value.exit_code == 2
    with pytest.raises(UserError, match="must be a path"):
        lib.local_dst("s3://b/k")
    found = {"b/ds/../x": {"size": 1, "type": "file"}}
    with pytest.raises(UserError, match=r"s3://b/ds/\.\./x"):
        lib.entries(found, "b/ds", "s3")


def test_entries_take_the_listing_apart():
    found = {
        "b/ds/a.txt": {"size": 3, "ETag": '"0cc175b9c0f1b6a831c399e269772661"', "type": "file"},
        "b/ds/sub/": {"size": 0, "type": "directory"},
        "b/ds/sub/m": {"size": 9, "ETag": '"abc-2"', "type": "file"},  # multipart: no MD5
    }
    got = lib.entries(found, "b/ds", "s3")
    assert [(x.path, x.size, x.version, x.md5) for x in got] == [
        ("a.txt", 3, "0cc175b9c0f1b6a831c399e269772661", "0cc175b9c0f1b6a831c399e269772661"),
        ("sub/m", 9, "abc-2", None),
    ]
    one = lib.entries({"b/ds/a.txt": found["b/ds/a.txt"]}, "b/ds/a.txt", "s3")
    assert [x.path for x in one] == ["a.txt"]  # SRC names one object
    rows = {"files": [{"path": "a.txt", "size": 3, "version": got[0].version}]}
    assert lib.differences(got, rows) == ["sub/m: new at the source"]


def test_import_stage_and_ready_need_no_fsspec(tmp_path):
    code = (
        "import sys, slurmkit.stage as s; assert s.ready(sys.argv[1]) is None; "
        "assert 'fsspec' not in sys.modules and 'rich' not in sys.modules, sorted(sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True)
    assert proc.returncode == 0, proc.stderr


# ---- through a real S3 endpoint -----------------------------------------------------------------


def kill_mid_large(proc: subprocess.Popen, big: Path, rng: random.Random) -> None:
    """SIGKILL ``proc`` once the files under ``big`` (parts being written, and whole files)
    hold a random 1 to 48 MiB more, or after 10 s."""

    def written() -> int:
        total = 0
        for p in big.glob("*"):
            with contextlib.suppress(FileNotFoundError):  # renamed meanwhile
                total += p.stat().st_blocks * 512
        return total

    target = written() + (rng.randint(1, 48) << 20)
    deadline = time.monotonic() + 10
    while written() < target and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.002)
    proc.send_signal(signal.SIGKILL)


@pytest.mark.slow  # the 1,000-object dataset, seeded over HTTP
def test_stage_publishes_once_then_a_rerun_makes_no_get(s3, dataset, tmp_path):
    env, dst, outputs = env_for(s3, tmp_path), tmp_path / "ds", []
    start = s3.mark()
    proc = run_stage(env, f"s3://{BUCKET}/ds", dst, "--json", outputs=outputs)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["files"] == summary["copied"] == len(dataset)
    assert summary["bytes"] == sum(map(len, dataset.values())) and summary["skipped"] == 0
    assert summary["source"] == f"s3://{BUCKET}/ds" and summary["destination"] == str(dst)
    assert summary["published"] and summary["seconds"] > 0
    assert proc.stderr == ""  # no terminal: no progress bar
    assert_same(dst, dataset)
    assert_fetched_once(s3, start, dataset, "ds/")
    assert s3.lists(start) == 2  # 1,002 keys: two pages of 1,000
    assert not lib.stage_dir(str(dst)).startswith(str(dst))
    assert not os.path.exists(lib.stage_dir(str(dst)))  # nothing left beside DST

    again = s3.mark()
    proc = run_stage(env, f"s3://{BUCKET}/ds", dst, "--json", "--verify", outputs=outputs)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert (summary["copied"], summary["skipped"], summary["verified"]) == (0, 1002, 1002)
    assert s3.gets(again) == [] and s3.lists(again) == 2

    dry = run_stage(env, f"s3://{BUCKET}/ds", dst, "--dry-run", outputs=outputs)
    assert dry.returncode == 0 and "would copy 0 of 1002" in dry.stdout

    victim = dst / "d3" / "f0003.bin"  # damaged after publishing: --verify says so
    data = bytearray(victim.read_bytes())
    data[0] ^= 0xFF
    victim.write_bytes(bytes(data))
    bad = run_stage(env, f"s3://{BUCKET}/ds", dst, "--verify", outputs=outputs)
    assert bad.returncode == 1
    assert f"{victim}: checksum mismatch" in bad.stderr and "Traceback" not in bad.stderr
    assert_no_secret(outputs, tmp_path)


def journaled(work: Path) -> int:
    try:
        return (work / "journal.jsonl").read_bytes().count(b"\n")
    except FileNotFoundError:
        return 0


def kill_at(
    proc: subprocess.Popen,
    work: Path,
    rng: random.Random,
    early: bool,
    most: int = 200,
    within: float = 1.0,
) -> None:
    """SIGKILL ``proc`` at a random point: ``early``, a random time after its start (while it
    starts, lists or fetches its first files: up to ``within`` seconds); else once a random
    number (1 to ``most``) of files more is finished, plus a random few milliseconds (mid-file,
    mid-batch, mid-journal)."""
    if early:
        time.sleep(rng.uniform(0.1, within))
    else:
        target = journaled(work) + rng.randint(1, most)
        deadline = time.monotonic() + 30
        while journaled(work) < target and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.002)
        time.sleep(rng.uniform(0, 0.03))
    proc.send_signal(signal.SIGKILL)


@pytest.mark.slow  # the 1,000-object dataset, seeded over HTTP
def test_sigkill_at_random_points_never_recopies_a_finished_file(s3, dataset, tmp_path):
    env, dst, outputs = env_for(s3, tmp_path), tmp_path / "ds", []
    work = Path(lib.stage_dir(str(dst)))
    rng = random.Random(int(os.environ.get("STAGE_KILL_SEED", "20")))
    exposed: list[str] = []
    watching = threading.Event()

    def watch() -> None:  # DST is absent or whole, at every moment
        while not watching.is_set():
            if dst.exists() and lib.ready(str(dst)) is None:
                exposed.append("DST without its manifest")
            time.sleep(0.002)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    finished_before: list[tuple[int, set[str]]] = []  # (log mark, files finished by then)
    kills = 0
    for early in (True, False, False, True, False):
        proc = subprocess.Popen(
            stage_cmd(f"s3://{BUCKET}/ds", dst, "--json"),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        kill_at(proc, work, rng, early)
        out, err = proc.communicate()
        outputs += [out, err]
        kills += proc.returncode == -signal.SIGKILL
        assert not dst.exists() or lib.ready(str(dst)) is not None
        data = work / "data"
        finished = {
            str(p.relative_to(data))
            for p in data.rglob("*")
            if p.is_file() and lib.PART not in p.name
        }
        finished_before.append((s3.mark(), finished))
    last = run_stage(env, f"s3://{BUCKET}/ds", dst, "--json", outputs=outputs)
    watching.set()
    watcher.join()
    assert last.returncode == 0, last.stderr
    assert kills == 5  # every run was killed before it ended
    assert not exposed
    assert_same(dst, dataset)
    assert json.loads(last.stdout)["skipped"] >= len(finished_before[-1][1])
    for mark, finished in finished_before:
        again = {key[3:] for key, _ in s3.gets(mark, "ds/")} & finished
        assert not again, f"fetched again after they were finished: {sorted(again)[:5]}"
    assert_no_secret(outputs, tmp_path)


@pytest.mark.slow  # the 1,000-object dataset, seeded over HTTP
def test_two_concurrent_stagers_fetch_each_object_once(s3, dataset, tmp_path):
    env, dst = env_for(s3, tmp_path), tmp_path / "ds"
    start = s3.mark()
    procs = [
        subprocess.Popen(
            stage_cmd(f"s3://{BUCKET}/ds", dst, "--json"),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    done = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in done]
    (waiter, waited), (publisher, _) = sorted(
        ((json.loads(out), err) for out, err in done), key=lambda r: r[0]["published"]
    )
    assert publisher["published"] and publisher["copied"] == len(dataset)
    assert not waiter["published"] and waiter["waited"] and waiter["copied"] == 0
    assert waiter["skipped"] == len(dataset) and "waiting:" in waited
    assert_same(dst, dataset)
    assert_fetched_once(s3, start, dataset, "ds/")
    assert_no_secret([text for pair in done for text in pair], tmp_path)


@pytest.mark.slow
def test_a_corrupted_object_is_an_error_that_names_it(s3, faults, tmp_path):
    env, outputs = env_for(s3, tmp_path), []
    rng = random.Random(5)
    small = {"ok1.bin": rng.randbytes(100), "bad.bin": rng.randbytes(300), "ok2.bin": b"x"}
    for rel, data in small.items():
        s3.put(f"bad-small/{rel}", data)
    s3.put("bad-large/big.bin", rng.randbytes((PART_MIB << 20) * 3 + 7))
    s3.corrupt |= {"bad-small/bad.bin", "bad-large/big.bin"}
    try:
        for prefix, name in (("bad-small", "bad.bin"), ("bad-large", "big.bin")):
            dst = tmp_path / prefix
            proc = run_stage(env, f"s3://{BUCKET}/{prefix}", dst, outputs=outputs)
            assert proc.returncode == 1, proc.stderr
            assert f"s3://{BUCKET}/{prefix}/{name}: checksum mismatch" in proc.stderr
            assert "Traceback" not in proc.stderr
            assert not dst.exists()  # nothing published
    finally:
        s3.corrupt.clear()
    start = s3.mark()  # mended: the rerun fetches only what was not finished
    proc = run_stage(env, f"s3://{BUCKET}/bad-small", tmp_path / "bad-small", outputs=outputs)
    assert proc.returncode == 0, proc.stderr
    assert_same(tmp_path / "bad-small", small)
    assert {k for k, _ in s3.gets(start)} <= {f"bad-small/{r}" for r in small}
    assert "bad-small/bad.bin" in {k for k, _ in s3.gets(start)}
    assert_no_secret(outputs, tmp_path)


@pytest.mark.slow
def test_a_missing_object_is_an_error_that_names_it(s3, faults, tmp_path):
    env, outputs = env_for(s3, tmp_path), []
    s3.put("gone/a.bin", b"a" * 10)
    s3.put("gone/b.bin", b"b" * 10)
    s3.gone.add("gone/b.bin")  # listed, then deleted
    try:
        proc = run_stage(env, f"s3://{BUCKET}/gone", tmp_path / "g", "--json", outputs=outputs)
    finally:
        s3.gone.clear()
    assert proc.returncode == 1
    error = json.loads(proc.stderr)
    assert (
        error["exit_code"] == 1
        and f"s3://{BUCKET}/gone/b.bin: no such object" in (error["error"]["message"])
    )
    assert not (tmp_path / "g").exists()
    for src in (f"s3://{BUCKET}/no-such-prefix", f"s3://{BUCKET}/gone/nope.bin", "s3://nobucket/x"):
        proc = run_stage(env, src, tmp_path / "m", outputs=outputs)
        assert proc.returncode == 1, (src, proc.stderr)
        assert f"error: {src}: no such object or prefix" in proc.stderr
    assert_no_secret(outputs, tmp_path)


@pytest.mark.slow
def test_a_file_renamed_into_place_but_not_journaled_is_checked_not_fetched(s3, tmp_path):
    """A kill between a file's rename and its journal line: the rerun checks the file's bytes
    locally (against the ETag's MD5) and keeps it; a wrong one is fetched again."""
    env, dst = env_for(s3, tmp_path), tmp_path / "r"
    files = {"kept.bin": b"k" * 500, "wrong.bin": b"w" * 500, "new.bin": b"n" * 10}
    for rel, data in files.items():
        s3.put(f"rename/{rel}", data)
    data_dir = Path(lib.stage_dir(str(dst))) / "data"
    data_dir.mkdir(parents=True)
    (data_dir / "kept.bin").write_bytes(files["kept.bin"])
    (data_dir / "wrong.bin").write_bytes(b"x" * 500)  # the right size, other bytes
    start = s3.mark()
    proc = run_stage(env, f"s3://{BUCKET}/rename", dst, "--json")
    assert proc.returncode == 0, proc.stderr
    assert sorted(k for k, _ in s3.gets(start)) == ["rename/new.bin", "rename/wrong.bin"]
    assert json.loads(proc.stdout)["skipped"] == 1
    assert_same(dst, files)


@pytest.mark.slow  # the 1,000-object dataset, seeded over HTTP
def test_dry_run_says_what_it_would_copy_and_writes_nothing(s3, dataset, tmp_path):
    env, dst = env_for(s3, tmp_path), tmp_path / "ds"
    start = s3.mark()
    proc = run_stage(env, f"s3://{BUCKET}/ds", dst, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["dry_run"] and len(summary["to_copy"]) == len(dataset)
    assert {r["path"]: r["size"] for r in summary["to_copy"]} == {
        k: len(v) for k, v in dataset.items()
    }
    assert s3.gets(start) == [] and list(tmp_path.iterdir()) == []
    text = run_stage(env, f"s3://{BUCKET}/ds", dst, "--dry-run")
    assert text.returncode == 0 and "would copy 1002 of 1002 file(s)" in text.stdout
    assert "nothing was written" in text.stdout and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_a_published_dataset_is_never_changed_in_place(s3, tmp_path):
    env = env_for(s3, tmp_path)
    s3.put("v/a.bin", b"one")
    assert run_stage(env, f"s3://{BUCKET}/v", tmp_path / "v").returncode == 0
    s3.put("v/a.bin", b"two")
    proc = run_stage(env, f"s3://{BUCKET}/v", tmp_path / "v")
    assert proc.returncode == 1 and "a.bin: changed at the source" in proc.stderr
    assert (tmp_path / "v" / "a.bin").read_bytes() == b"one"


@pytest.mark.slow
def test_usage_errors_exit_2_and_a_local_source_stages(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.txt").write_text("alpha")
    (src / "sub" / "b.txt").write_text("beta" * 1000)
    for args, text in (
        (["ftp://host/x", str(tmp_path / "d")], "unsupported URL scheme 'ftp://'"),
        ([str(src), "s3://bucket/x"], "DST: must be a path on this machine's filesystem"),
        ([str(src), str(tmp_path / "d"), "--verify", "--dry-run"], "give one"),
    ):
        proc = subprocess.run([*SLURMKIT, "stage", *args], capture_output=True, text=True)
        assert proc.returncode == 2 and text in proc.stderr, proc.stderr
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("not a dataset")
    proc = subprocess.run(
        [*SLURMKIT, "stage", str(src), str(taken)], capture_output=True, text=True
    )
    assert proc.returncode == 2 and "is not a dataset slurmkit staged" in proc.stderr
    assert not Path(lib.stage_dir(str(taken))).exists()  # refused before anything was made
    dst = tmp_path / "local"
    proc = subprocess.run(
        [*SLURMKIT, "stage", f"file://{src}", str(dst), "--part-size", "1", "--json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert_same(dst, {"a.txt": b"alpha", "sub/b.txt": b"beta" * 1000})


def test_an_https_style_url_stages_one_file_and_its_query_stays_out(tmp_path):
    """A web server without byte ranges (Python's own): the file is streamed whole; the
    URL's query (a presigned URL's signature) is used, never written or printed."""
    import functools
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    (tmp_path / "www").mkdir()
    blob = os.urandom((2 << 20) + 5)
    (tmp_path / "www" / "blob.bin").write_bytes(blob)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(tmp_path / "www"))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/blob.bin"
        dst = tmp_path / "web"
        proc = subprocess.run(
            [*SLURMKIT, "stage", f"{url}?X-Amz-Signature={SECRET}", str(dst), "--part-size", "1"],
            capture_output=True,
            text=True,
        )
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    assert_same(dst, {"blob.bin": blob})
    assert lib.ready(str(dst))["source"] == url
    assert_no_secret([proc.stdout, proc.stderr], dst)


def test_the_progress_bar_is_drawn_on_a_terminal_only(tmp_path):
    import pty

    src = tmp_path / "src"
    src.mkdir()
    (src / "f.bin").write_bytes(os.urandom(3 << 20))
    leader, follower = pty.openpty()
    proc = subprocess.run(
        [*SLURMKIT, "stage", str(src), str(tmp_path / "dst"), "--part-size", "1"],
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
        env={**os.environ, "COLUMNS": "120", "TERM": "xterm"},
    )
    os.close(follower)
    drawn = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        drawn += chunk
    os.close(leader)
    assert proc.returncode == 0 and "staged 1 file(s)" in proc.stdout
    assert b"staging" in drawn and b"MB" in drawn  # bytes and bytes/s


@pytest.mark.slow
def test_twenty_kills_with_large_files(s3, tmp_path):
    """The issue's proof at full size: 1,000 small files and two of 256 MiB in 64 MiB parts,
    SIGKILL at 20 random points: among the small files by count, inside the large ones by bytes
    written (a kill by time alone came after the copy on a quiet machine)."""
    rng = random.Random(256)
    files = {f"s/{i}.bin": rng.randbytes(rng.randint(1, 2000)) for i in range(SMALL)}
    files |= {"big/x.bin": os.urandom(256 << 20), "big/y.bin": os.urandom(256 << 20)}
    for rel, data in files.items():
        s3.put(f"full/{rel}", data)
    env, dst = env_for(s3, tmp_path), tmp_path / "full"
    work = Path(lib.stage_dir(str(dst)))
    marks = []
    kills = mid_large = 0

    def partial_large() -> set[str]:  # big files being written, with bytes in them
        return {p.name for p in (work / "data" / "big").glob(f"*{lib.PART}*") if p.stat().st_blocks}

    for i in range(40):  # until 20 kills, or a run that finished the copy (nothing left)
        before = partial_large()
        proc = subprocess.Popen(
            [*SLURMKIT, "stage", f"s3://{BUCKET}/full", str(dst), "--part-size", "64"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if journaled(work) < SMALL - 40:
            kill_at(proc, work, rng, early=i % 3 == 0, most=40, within=2.0)
        else:  # the large files: mid-part, after a random few MiB more
            kill_mid_large(proc, work / "data" / "big", rng)
        killed = proc.wait() == -signal.SIGKILL
        kills += killed
        mid_large += bool(partial_large() - before)
        assert not dst.exists() or lib.ready(str(dst)) is not None
        data = work / "data"
        done = {
            str(p.relative_to(data))
            for p in data.rglob("*")
            if p.is_file() and lib.PART not in p.name
        }
        marks.append((s3.mark(), done))
        if not killed or kills == 20:
            break
    proc = subprocess.run(
        [*SLURMKIT, "stage", f"s3://{BUCKET}/full", str(dst), "--part-size", "64"],
        env=env,
        capture_output=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert kills >= 15 and mid_large >= 1  # killed mid-way, once at least inside a large file
    assert_same(dst, files)
    for mark, done in marks:
        assert not {key[5:] for key, _ in s3.gets(mark, "full/")} & done


def test_the_stage_directory_is_named_beside_dst():
    assert lib.stage_dir("/mnt/data/ds") == "/mnt/data/.ds.slurmkit-stage"
    assert lib.stage_dir("/mnt/data/ds/") == "/mnt/data/.ds.slurmkit-stage"


def test_readme_documents_stage():
    text = (ROOT / "README.md").read_text()
    assert "## Hot data: slurmkit stage" in text and "| `slurmkit stage SRC DST`" in text
