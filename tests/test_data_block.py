"""The spec's ``data`` block (issue 13, item 2): validation, the rendered stage job and array
scripts, the in-job node cache, local sweeps, and on the real cluster with moto's S3 server
(``tests/s3server.py``; jobs reach it on 127.0.0.1): two sweeps of one dataset, a 4-node job
with ``cache: node``, a missing source, a stage job that fails. Objects are counted as they
arrive at the server; the test secret is looked for in every file the sweeps and Slurm wrote."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT, SLURMKIT, assert_shell_ok, run_cli, wait_sweep
from s3server import BUCKET, SECRET, Server, env_for

from slurmkit import launch, plan, render, stage
from slurmkit import spec as spec_mod
from slurmkit.errors import SpecError
from slurmkit.runtime import datacache

# What a trial reports: where each of its tasks found the dataset and the CRC-32 of each file.
PAYLOAD = """\
import json, os, socket, zlib
path = os.environ["SLURMKIT_DATA_DS"]
files = {}
for folder, _dirs, names in os.walk(path):
    for name in names:
        full = os.path.join(folder, name)
        with open(full, "rb") as fh:
            files[os.path.relpath(full, path)] = "crc32:%08x" % zlib.crc32(fh.read())
node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
out = os.path.join(os.environ["SLURMKIT_TRIAL_DIR"], "data-" + node + ".json")
with open(out, "w") as fh:
    json.dump({"node": node, "path": path, "single": os.environ.get("SLURMKIT_DATA"),
               "files": files}, fh)
"""


@pytest.fixture(scope="module")
def s3():
    server = Server()
    server.create_bucket(BUCKET)
    yield server
    server.close()


@pytest.fixture
def faults(s3):
    """This test's requests go through the fault proxy (``s3.gone``)."""
    with s3.faults():
        yield


@pytest.fixture(scope="module")
def objects(s3) -> dict[str, bytes]:
    """s3://data/ds/: 40 small files in 4 folders and one of 5 MiB."""
    files = {f"part{i % 4}/f{i:03d}.bin": os.urandom(100 + 37 * i) for i in range(40)}
    files["big.bin"] = os.urandom(5 << 20)
    for rel, data in files.items():
        s3.put(f"ds/{rel}", data)
    return files


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def load(tmp_path: Path, body: str, *overrides: str) -> spec_mod.SweepSpec:
    return spec_mod.load(str(write(tmp_path / "spec.yaml", body)), list(overrides), job=True)


def local_dataset(tmp_path: Path) -> tuple[Path, dict[str, bytes]]:
    """A dataset staged at tmp_path/shared/ds from a local folder (stage's own code)."""
    files = {"a.txt": b"alpha\n", "sub/b.bin": os.urandom(300_000), "sub/deep/c": b""}
    for rel, data in files.items():
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_bytes(data)
    dst = tmp_path / "shared" / "ds"
    stage.stage(str(tmp_path / "src"), str(dst))
    return dst, files


def node_copy(tmp_path: Path, dst: Path, node: str = "n1") -> datacache.Item:
    row = {"name": "ds", "dst": str(dst), "cache": "node", "cache_dir": str(tmp_path / "nvme")}
    [item] = datacache.items([row], {})
    return item


def assert_matches(folder: Path, files: dict[str, bytes]) -> None:
    found = {
        str(p.relative_to(folder)): p.read_bytes()
        for p in folder.rglob("*")
        if p.is_file() and p.name != datacache.MANIFEST
    }
    assert found == files


def assert_no_secret(*folders: Path, texts: tuple[str, ...] = ()) -> None:
    for text in texts:
        assert SECRET not in text
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert SECRET.encode() not in path.read_bytes(), path


# ---- the spec ----------------------------------------------------------------------------------


def test_an_entry_takes_its_defaults_and_reads_back_from_sweep_json(tmp_path):
    s = load(
        tmp_path,
        """
command: x
data:
  - {src: s3://bucket/imagenet-1k, dst: /mnt/data/imagenet-1k/, cache: node}
  - {src: /scratch/c4, dst: /mnt/data/c4, name: text, cache_dir: /var/nvme/storage,
     cache: node}
  - {src: 'https://example.com/files/vocab.json', dst: /mnt/data/vocab}
""",
    )
    assert [(d.name, d.dst, d.cache, d.cache_dir) for d in s.data] == [
        ("imagenet_1k", "/mnt/data/imagenet-1k", "node", None),
        ("text", "/mnt/data/c4", "node", "/var/nvme/storage"),
        ("vocab", "/mnt/data/vocab", "none", None),
    ]
    again = spec_mod.from_dict(json.loads(json.dumps(s.to_dict())), "sweep.json")
    assert again.data == s.data
    assert load(tmp_path, "command: x\n").data == ()


@pytest.mark.parametrize(
    "data, key, words",
    [
        ("{src: s3://b/ds, dst: /d}", "data", "must be a list"),
        ("[s3://b/ds]", "data.0", "must be a mapping"),
        ("[{src: s3://b/ds, dts: /d}]", "data.0.dts", "did you mean 'dst'"),
        ("[{dst: /d}]", "data.0.src", "required"),
        ("[{src: s3://b/ds}]", "data.0.dst", "required"),
        ("[{src: ftp://h/ds, dst: /d}]", "data.0.src", "unsupported URL scheme"),
        ("[{src: 's3://k:secret@b/ds', dst: /d}]", "data.0.src", "credentials stay out"),
        ("[{src: 'https://h/f?X-Amz-Signature=x', dst: /d}]", "data.0.src", "credentials"),
        ("[{src: s3://b/ds, dst: data/ds}]", "data.0.dst", "absolute path"),
        ("[{src: s3://b/ds, dst: /}]", "data.0.dst", "not /"),
        ("[{src: s3://b/ds, dst: /d, cache: nvme}]", "data.0.cache", "allowed values: none, node"),
        ("[{src: s3://b/ds, dst: /d, cache_dir: /nvme}]", "data.0.cache_dir", "cache: node"),
        ("[{src: s3://b/ds, dst: /d, cache: node, cache_dir: nvme}]", "data.0.cache_dir", "abs"),
        ("[{src: s3://b/ds, dst: /d, name: my-ds}]", "data.0.name", "SLURMKIT_DATA_<NAME>"),
        (
            "[{src: s3://b/x, dst: /a/ds}, {src: s3://b/y, dst: /b/DS}]",
            "data.1.name",
            "same env name 'DS'",
        ),
        (
            "[{src: s3://b/x, dst: /a/x}, {src: s3://b/y, dst: /a/x/, name: y}]",
            "data.1.dst",
            "same",
        ),
    ],
)
def test_a_bad_entry_names_file_key_and_what_is_allowed(tmp_path, data, key, words):
    path = write(tmp_path / "spec.yaml", f"command: x\ndata: {data}\n")
    with pytest.raises(SpecError) as info:
        spec_mod.load(str(path), job=True)
    assert info.value.file == str(path) and info.value.key == key
    assert words in str(info.value)


def test_a_bad_entry_is_a_clean_cli_error(tmp_path):
    write(tmp_path / "s.yaml", "command: x\ndata: [{src: s3://b/ds, dst: /d, cache: yes}]\n")
    proc = run_cli("submit", "s.yaml", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "data.0.cache" in proc.stderr and "allowed values: none, node" in proc.stderr


# ---- rendered scripts ----------------------------------------------------------------------


def test_the_stage_job_holds_no_source_path_or_credential(tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    s = load(
        tmp_path,
        """
name: train
command: x
resources: {partition: low, time: "1:00:00", gpus: 8, nodes: 4, account: ml}
data: [{src: s3://hidden-bucket/imagenet, dst: /mnt/data/imagenet, cache: node}]
""",
    )
    text = render.stage_script(s, "/shared/runs/train-1", python="/opt/py/bin/python")
    for hidden in ("s3://", "hidden-bucket", "/mnt/data", SECRET):
        assert hidden not in text
    sbatch = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert sbatch == [
        "#SBATCH --job-name=train-stage",
        "#SBATCH --output=/shared/runs/train-1/logs/stage-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        "#SBATCH --ntasks=1",
        "#SBATCH --partition=low",
        "#SBATCH --time=1:00:00",
        "#SBATCH --account=ml",
    ]  # no GPUs, no nodes: one CPU task
    assert text.rstrip().endswith('exec "$PY" -m slurmkit.data')
    assert_shell_ok(text)


def test_array_scripts_name_the_variables_and_the_node_copy_step(tmp_path):
    body = """
name: t
command: x
params: {lr: [1, 2]}
data:
  - {src: s3://b/imagenet, dst: /mnt/data/imagenet, cache: node}
  - {src: s3://b/c4, dst: /mnt/data/c4}
"""
    s = load(tmp_path, body, "resources.nodes=4")
    [(_, text)] = render.scripts(plan.make(s, plan.expand(s), "/w"), [0, 1], 1001, "/r/t-1")
    assert "#SBATCH --kill-on-invalid-dep=yes" in text
    assert "$SLURMKIT_DATA_IMAGENET: each node copies it" in text
    assert "$SLURMKIT_DATA_C4\n" in text and "(SLURMKIT_DATA)" not in text
    copy = "srun --kill-on-bad-exit=1 --nodes=4 --ntasks=4 --ntasks-per-node=1"
    assert f"# The node copies: {copy} PYTHON -m slurmkit.runtime.datacache" in text
    assert "s3://" not in text and "/mnt/data" not in text
    assert_shell_ok(text)
    assert launch.build(s, "/w")["data"] == copy.split()
    assert "data" not in launch.build(load(tmp_path, body), "/w")  # one node: copied in-process
    plain = render.standalone(plan.make(s, plan.expand(s), "/w"), "spec.yaml")
    assert "each task first stages" in plain and "kill-on-invalid-dep" not in plain


# ---- the node cache (runtime/datacache) ----------------------------------------------------------


def test_paths_and_variables_hold_the_node_name():
    rows = [
        {"name": "ds", "dst": "/mnt/data/ds", "cache": "node", "cache_dir": None},
        {"name": "vocab", "dst": "/mnt/data/v", "cache": "none", "cache_dir": None},
    ]
    ds, vocab = datacache.items(rows, {"TMPDIR": "/scratch/42"})
    assert ds.path("n3").startswith("/scratch/42/slurmkit-data/n3/ds-")
    assert ds.path("n3") != ds.path("n4") and vocab.path("n3") == "/mnt/data/v"
    assert datacache.variables([ds, vocab], "n3") == {
        "SLURMKIT_DATA_DS": ds.path("n3"),
        "SLURMKIT_DATA_VOCAB": "/mnt/data/v",
    }
    [alone] = datacache.items(rows[:1], {})
    assert alone.path("n1").startswith("/tmp/slurmkit-data/n1/")
    assert datacache.variables([alone], "n1")["SLURMKIT_DATA"] == alone.path("n1")
    assert stage.MANIFEST == datacache.MANIFEST


def test_the_wrapper_gives_each_node_its_own_path():
    rows = [{"name": "ds", "dst": "/d/ds", "cache": "node", "cache_dir": "/nv me/$(id)`id`"}]
    [item] = datacache.items(rows, {})
    argv = [*datacache.wrapper([item]), "sh", "-c", 'echo "$SLURMKIT_DATA_DS|$SLURMKIT_DATA"']
    for node in ("n2", "n4"):
        env = {**os.environ, "SLURMD_NODENAME": node}
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
        assert out.strip() == f"{item.path(node)}|{item.path(node)}"  # byte-exact, never run
        assert item.path(node).startswith(f"/nv me/$(id)`id`/slurmkit-data/{node}/ds-")
    assert not datacache.wrapper(datacache.items([{**rows[0], "cache": "none"}], {}))


def test_a_node_copy_is_made_once_and_matches_the_manifest(tmp_path):
    dst, files = local_dataset(tmp_path)
    item = node_copy(tmp_path, dst)
    manifest = datacache.published(item)
    results: list[bool] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(datacache.cache(item, "n1", manifest, lambda: False))
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False, False, False, True]  # one copier, three found it whole
    target = Path(item.path("n1"))
    assert_matches(target, files)
    assert json.loads((target / datacache.MANIFEST).read_text()) == manifest
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]  # no leftovers
    assert datacache.cache(item, "n2", manifest, lambda: False)  # another node: its own copy
    assert_matches(Path(item.path("n2")), files)


def test_a_broken_or_outdated_node_copy_is_made_again(tmp_path):
    dst, files = local_dataset(tmp_path)
    item = node_copy(tmp_path, dst)
    manifest = datacache.published(item)
    datacache.cache(item, "n1", manifest, lambda: False)
    (Path(item.path("n1")) / "sub" / "b.bin").write_bytes(b"short")
    assert datacache.cache(item, "n1", manifest, lambda: False)
    assert_matches(Path(item.path("n1")), files)
    newer = {**manifest, "files": manifest["files"][:-1]}  # the dataset was published again
    assert datacache.cache(item, "n1", newer, lambda: False)


def test_a_damaged_shared_file_or_an_unpublished_dataset_is_named(tmp_path):
    dst, _ = local_dataset(tmp_path)
    item = node_copy(tmp_path, dst)
    manifest = datacache.published(item)
    data = bytearray((dst / "sub" / "b.bin").read_bytes())
    data[1000] ^= 1
    (dst / "sub" / "b.bin").write_bytes(bytes(data))
    with pytest.raises(datacache.DataError, match=r"sub/b\.bin: .*the shared copy is damaged"):
        datacache.cache(item, "n1", manifest, lambda: False)
    assert not Path(item.path("n1")).exists()
    assert [p.name for p in Path(item.path("n1")).parent.iterdir()] == []  # nothing half-made
    [missing] = datacache.items([{"name": "x", "dst": str(tmp_path / "nope"), "cache": "none"}], {})
    with pytest.raises(datacache.DataError, match=r"nope: not staged"):
        datacache.published(missing)


# ---- local sweeps ----------------------------------------------------------------------------


def test_a_local_sweep_stages_first_and_each_trial_finds_its_copy(tmp_path):
    src = tmp_path / "src"
    files = {"x/a.bin": os.urandom(1000), "b.txt": b"b\n"}
    for rel, data in files.items():
        (src / rel).parent.mkdir(parents=True, exist_ok=True)
        (src / rel).write_bytes(data)
    write(tmp_path / "payload.py", PAYLOAD)
    write(
        tmp_path / "s.yaml",
        f"""
command: [python, {tmp_path / "payload.py"}]
params: {{i: [1, 2, 3]}}
data: [{{src: {src}, dst: {tmp_path}/shared/ds, cache: node, cache_dir: {tmp_path}/nvme}}]
output_root: {tmp_path}/runs
""",
    )
    proc = run_cli("sweep", "s.yaml", "--backend", "local", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    root = Path(json.loads(proc.stdout)["sweep_dir"])
    assert_matches(tmp_path / "shared" / "ds", files)
    reports = [json.loads(p.read_text()) for p in root.glob("trials/*/data-*.json")]
    assert len(reports) == 3
    want = {rel: f"crc32:{zlib.crc32(data):08x}" for rel, data in files.items()}
    for report in reports:
        assert report["path"] == report["single"]
        assert report["path"].startswith(f"{tmp_path}/nvme/slurmkit-data/{report['node']}/")
        assert report["files"] == {**want, datacache.MANIFEST: report["files"][datacache.MANIFEST]}
    logs = "".join(p.read_text() for p in root.glob("trials/*/output.log"))
    assert logs.count("ds copied to") == 1 and logs.count("ds already whole at") == 2


def test_a_trial_whose_dataset_is_gone_fails_before_its_command(tmp_path):
    dst, _ = local_dataset(tmp_path)
    body = "command: [python, -c, 'print(\"RAN\"); exit(3)']\n"  # FAILED: it may run again
    write(tmp_path / "s.yaml", body + f"data: [{{src: {tmp_path}/src, dst: {dst}}}]\n")
    proc = run_cli("submit", "s.yaml", "--backend", "local", "--json", cwd=tmp_path)
    root = Path(json.loads(proc.stdout)["sweep_dir"])
    (dst / stage.MANIFEST).unlink()  # removed under the sweep: the next attempt finds no dataset
    env = {**os.environ, "SLURMKIT_SWEEP_DIR": str(root), "SLURM_ARRAY_TASK_ID": "0"}
    env.pop("SLURM_JOB_ID", None)
    again = subprocess.run(
        [sys.executable, "-m", "slurmkit.runtime", "task"], env=env, capture_output=True
    )
    assert again.returncode == 1
    [status] = [json.loads(p.read_text()) for p in root.glob("trials/*/status.json")]
    assert status["state"] == "FAILED" and f"{dst}: not staged" in status["reason"]
    log = next(root.glob("trials/*/output.log")).read_text()
    assert log.count("RAN") == 1  # the first attempt only


def refuse_missing_source(tmp_path: Path, s3: Server, backend: str) -> None:
    """A source that is not there: exit 1 naming it and its key, nothing made or submitted."""
    body = f"name: nosrc-{backend}\ncommand: x\n"
    body += f"data: [{{src: s3://{BUCKET}/no-such-prefix, dst: {tmp_path}/d}}]\n"
    write(tmp_path / "s.yaml", body)
    proc = subprocess.run(
        [*SLURMKIT, "submit", "s.yaml", "--backend", backend, f"output_root={tmp_path}/runs"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env_for(s3, tmp_path),
    )
    assert proc.returncode == 1, proc.stderr
    assert f"s3://{BUCKET}/no-such-prefix: no such object or prefix" in proc.stderr
    assert "data.0.src" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists() and not (tmp_path / "d").exists()


def test_a_resume_stages_again_what_was_removed(tmp_path):
    dst, files = local_dataset(tmp_path)
    body = "command: [python, -c, 'import os, sys; sys.exit(os.path.exists(os.environ[\"F\"]))']\n"
    write(tmp_path / "s.yaml", body + f"data: [{{src: {tmp_path}/src, dst: {dst}}}]\n")
    env = {"F": str(tmp_path / "fail-once")}
    (tmp_path / "fail-once").touch()
    proc = run_cli("submit", "s.yaml", "--backend", "local", "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 1  # FAILED: resume runs it again
    (tmp_path / "fail-once").unlink()
    shutil.rmtree(dst)
    root = json.loads(proc.stdout)["sweep_dir"]
    again = run_cli("sweep", "--resume", root, "--backend", "local", "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert_matches(dst, files)


@pytest.mark.slow
def test_a_missing_source_is_refused_before_anything_is_made(tmp_path, s3):
    refuse_missing_source(tmp_path, s3, "local")


@pytest.mark.slow
def test_a_local_sweep_stages_from_s3_with_the_chains_credentials(tmp_path, s3, objects):
    env = env_for(s3, tmp_path)
    write(tmp_path / "payload.py", PAYLOAD)
    body = f"""
command: [python, {tmp_path / "payload.py"}]
data: [{{src: s3://{BUCKET}/ds, dst: {tmp_path}/shared/ds}}]
output_root: {tmp_path}/runs
"""
    write(tmp_path / "s.yaml", body)
    since = s3.mark()
    proc = subprocess.run(
        [*SLURMKIT, "submit", "s.yaml", "--backend", "local", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert_matches(tmp_path / "shared" / "ds", objects)
    assert sorted(key for key, _ in s3.gets(since, "ds/")) == sorted(f"ds/{k}" for k in objects)
    assert_no_secret(tmp_path, texts=(proc.stdout, proc.stderr))


# ---- on the real cluster -------------------------------------------------------------------------


def cluster_env(s3: Server, tmp_path: Path) -> dict[str, str]:
    return {**env_for(s3, tmp_path), "SLURMKIT_PYTHON": str(ROOT / ".venv" / "bin" / "python")}


def submit(tmp_path: Path, env: dict[str, str], body: str, *args: str) -> dict:
    spec = write(tmp_path / f"spec-{time.monotonic_ns()}.yaml", body)
    proc = subprocess.run(
        [*SLURMKIT, *args, str(spec), "--backend", "slurm", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def assert_fetched_once(s3: Server, since: int, objects: dict[str, bytes]) -> None:
    """Each object was fetched once for the shared copy (the large one in ranged parts that
    cover it once)."""
    seen: dict[str, list[str | None]] = {}
    for key, rng in s3.gets(since, "ds/"):
        seen.setdefault(key[3:], []).append(rng)
    assert set(seen) == set(objects)
    for rel, data in objects.items():
        if len(data) <= stage.PART_SIZE:
            assert seen[rel] == [None], (rel, seen[rel])


def cluster_logs(slurm_cluster) -> list[Path]:
    return [p for p in Path(slurm_cluster.dir).rglob("*.log") if p.is_file()]


@pytest.mark.cluster
def test_a_missing_source_is_refused_at_submit_and_nothing_is_queued(slurm_cluster, tmp_path, s3):
    refuse_missing_source(tmp_path, s3, "slurm")
    queued = slurm_cluster.run("squeue", "--noheader", "--states=all", "--name=nosrc-slurm")
    assert queued.stdout.strip() == ""


@pytest.mark.cluster
@pytest.mark.slow
def test_two_sweeps_of_one_dataset_fetch_each_object_once(slurm_cluster, tmp_path, s3, objects):
    env = cluster_env(s3, tmp_path)
    write(tmp_path / "payload.py", PAYLOAD)
    body = f"""
name: NAME
command: [python, {tmp_path / "payload.py"}]
params: {{i: [1, 2, 3]}}
resources: {{time: 10}}
data: [{{src: s3://{BUCKET}/ds, dst: {tmp_path}/shared/ds}}]
output_root: {tmp_path}/runs
"""
    since = s3.mark()
    with ThreadPoolExecutor(2) as pool:  # at once: each finds the dataset unpublished
        results = list(
            pool.map(lambda n: submit(tmp_path, env, body.replace("NAME", n), "sweep"), "ab")
        )
    for result in results:
        record = json.loads(Path(result["sweep_dir"], "submissions", "0000.json").read_text())
        assert record["stage_job"]  # each found the dataset unpublished and submitted a stager
    finals = [wait_sweep(r["sweep_dir"], timeout=240) for r in results]
    assert [f["counts"] for f in finals] == [{"COMPLETED": 3}, {"COMPLETED": 3}]
    assert_fetched_once(s3, since, objects)
    want = {rel: f"crc32:{zlib.crc32(data):08x}" for rel, data in objects.items()}
    for result in results:
        root = Path(result["sweep_dir"])
        for report in map(json.loads, map(Path.read_text, root.glob("trials/*/data-*.json"))):
            assert report["path"] == f"{tmp_path}/shared/ds" == report["single"]
            assert {k: v for k, v in report["files"].items() if k != stage.MANIFEST} == want
        [log] = root.glob("logs/stage-*.out")
        assert "slurmkit.data: ds:" in log.read_text()
    assert_no_secret(tmp_path, *cluster_logs(slurm_cluster))
    since = s3.mark()  # a third sweep finds the dataset published: no stage job, no request
    third = submit(tmp_path, env, body.replace("NAME", "c"), "sweep")
    record = json.loads(Path(third["sweep_dir"], "submissions", "0000.json").read_text())
    assert "stage_job" not in record and s3.log[since:] == []
    assert wait_sweep(third["sweep_dir"], timeout=240)["counts"] == {"COMPLETED": 3}


@pytest.mark.cluster
@pytest.mark.slow
def test_a_four_node_job_caches_the_dataset_on_every_node(slurm_cluster, tmp_path, s3, objects):
    env = cluster_env(s3, tmp_path)
    write(tmp_path / "payload.py", PAYLOAD)
    since = s3.mark()
    result = submit(
        tmp_path,
        env,
        f"""
name: four
command: [python, {tmp_path / "payload.py"}]
resources: {{nodes: 4, time: 10}}
data:
  - {{src: s3://{BUCKET}/ds, dst: {tmp_path}/shared/ds4, name: ds, cache: node,
     cache_dir: {tmp_path}/nvme}}
output_root: {tmp_path}/runs
""",
        "submit",
    )
    root = Path(result["sweep_dir"])
    final = wait_sweep(str(root), timeout=240)
    tdir = root / "trials" / final["trials"][0]["id"]
    assert final["counts"] == {"COMPLETED": 1}, (tdir / "output.log").read_text()[-3000:]
    assert_fetched_once(s3, since, objects)
    reports = {r["node"]: r for r in map(json.loads, map(Path.read_text, tdir.glob("data-*.json")))}
    assert sorted(reports) == ["n1", "n2", "n3", "n4"]
    manifest = stage.ready(f"{tmp_path}/shared/ds4")
    assert manifest is not None
    want = {row["path"]: row["checksum"] for row in manifest["files"]}
    for node, report in reports.items():
        copy = Path(report["path"])
        assert copy.parent == tmp_path / "nvme" / "slurmkit-data" / node
        assert report["single"] == report["path"]
        assert {k: v for k, v in report["files"].items() if k != stage.MANIFEST} == want
        assert_matches(copy, objects)
        assert json.loads((copy / stage.MANIFEST).read_text()) == manifest
    log = (tdir / "output.log").read_text()
    assert sorted(ln.split(" on ")[-1] for ln in log.splitlines() if " copied to " in ln) == [
        "n1",
        "n2",
        "n3",
        "n4",
    ]  # one copy per node, by the srun step's one task per node
    assert_no_secret(tmp_path, *cluster_logs(slurm_cluster))


@pytest.mark.cluster
@pytest.mark.slow
def test_a_stage_job_that_fails_cancels_the_arrays_before_they_start(
    slurm_cluster, tmp_path, s3, faults
):
    """A source the login node sees but the stager cannot fetch (listed, then gone): the stage
    job names the object and fails, and the array is cancelled without ever running."""
    env = cluster_env(s3, tmp_path)
    s3.put("gone/a.bin", b"a" * 100)
    s3.gone.add("gone/a.bin")
    try:
        result = submit(
            tmp_path,
            env,
            f"""
name: bad
command: [python, -c, 'print("RAN")']
params: {{i: [1, 2]}}
resources: {{time: 10}}
data: [{{src: s3://{BUCKET}/gone, dst: {tmp_path}/shared/gone}}]
output_root: {tmp_path}/runs
""",
            "sweep",
        )
        root = Path(result["sweep_dir"])
        record = json.loads((root / "submissions" / "0000.json").read_text())
        [array] = [job["job_id"] for job in record["jobs"]]
        states = slurm_cluster.wait_for_jobs([record["stage_job"], array], timeout=120)
    finally:
        s3.gone.discard("gone/a.bin")
    assert states[record["stage_job"]] == "FAILED"
    assert {v for k, v in states.items() if k.startswith(f"{array}_")} == {"CANCELLED"}
    [log] = root.glob("logs/stage-*.out")
    assert f"s3://{BUCKET}/gone/a.bin: no such object" in log.read_text()
    assert not list(root.glob("trials/*/output.log"))  # no trial ever started
    assert not (tmp_path / "shared" / "gone").exists()


@pytest.mark.cluster
@pytest.mark.slow
def test_a_standalone_script_stages_in_its_tasks_once(slurm_cluster, tmp_path, s3, objects):
    """Plain ``sbatch`` of ``sweep --dry-run --plain``: no stage job; its tasks take the stage
    lock, one copies, the others wait, and every trial reads the one shared copy."""
    env = cluster_env(s3, tmp_path)
    write(tmp_path / "payload.py", PAYLOAD)
    write(
        tmp_path / "plain.yaml",
        f"""
name: plain
command: [python, {tmp_path / "payload.py"}]
params: {{i: [1, 2, 3, 4]}}
resources: {{time: 10}}
data: [{{src: s3://{BUCKET}/ds, dst: {tmp_path}/shared/dsp, name: ds}}]
""",
    )
    script = subprocess.run(
        [*SLURMKIT, "sweep", "plain.yaml", "--dry-run", "--plain"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=True,
    ).stdout
    write(tmp_path / "plain.sbatch", script)
    since = s3.mark()
    job = subprocess.run(
        ["sbatch", "--parsable", "plain.sbatch"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        check=True,
    ).stdout.strip()
    states = slurm_cluster.wait_for_jobs([job], timeout=240)
    root = tmp_path / "runs" / "plain" / f"sbatch-{job}"
    assert set(states.values()) == {"COMPLETED"}, [p.read_text() for p in tmp_path.glob("*.out")]
    assert wait_sweep(str(root), timeout=60)["counts"] == {"COMPLETED": 4}
    assert_fetched_once(s3, since, objects)
    reports = [json.loads(p.read_text()) for p in root.glob("trials/*/data-*.json")]
    assert [r["path"] for r in reports] == [f"{tmp_path}/shared/dsp"] * 4
    assert_matches(tmp_path / "shared" / "dsp", objects)
    assert_no_secret(tmp_path, *cluster_logs(slurm_cluster))
