"""`slurmkit preflight`: the verdict is a pure function of the ranks' files (every case here),
and the in-job module measures on this machine's CPU (in-process, as a process, and under
plain torchrun); the 2-node run on the real cluster is tests/test_cluster_preflight.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from copy import deepcopy
from pathlib import Path

import pytest
from conftest import ROOT, run_cli

from slurmkit import preflight
from slurmkit.doctor import FAIL, OK, WARN
from slurmkit.preflight import Expect, Thresholds, judge, nodes
from slurmkit.runtime import preflight as job

EXPECT = Expect(nodes=2, ranks=4, gpus_per_node=2, signal="USR2")
NO_LIMITS = Thresholds()
SENT = {"signal": "USR2", "job": "7_0", "at": 1000.0, "error": ""}


def rank(r: int) -> dict:
    """Rank ``r`` of a healthy 2-node x 2-GPU preflight (local rank 0 measured the node)."""
    host = f"n{r // 2 + 1}"
    record: dict = {
        "rank": r,
        "local_rank": r % 2,
        "node_rank": r // 2,
        "world_size": 4,
        "host": host,
        "errors": {},
        "gpus": {
            "allocated": 2,
            "allocated_from": "SLURM_GPUS_ON_NODE",
            "cuda_visible_devices": "0,1",
            "torch": 2,
            "nvidia_smi": ["GPU 0: NVIDIA H200", "GPU 1: NVIDIA H200"],
        },
        "allreduce": {
            "backend": "nccl",
            "world_size": 4,
            "device": f"cuda:{r % 2}",
            "sum_ok": True,
            "sizes": [
                {"bytes": 1 << 20, "time_s": 1e-4, "algbw_gbps": 10.5, "busbw_gbps": 15.7},
                {"bytes": 1 << 30, "time_s": 1e-2, "algbw_gbps": 107.4, "busbw_gbps": 161.1},
            ],
            "peak_busbw_gbps": 161.1,
            "peak_algbw_gbps": 107.4,
        },
        "signal": {"signal": "USR2", "received": ["USR2"], "at": 1000.2, "waited_s": 0.3},
    }
    if r % 2 == 0:
        record["fs"] = {
            "bytes": 1 << 30,
            "write_gbps": 2.0 + r,
            "read_gbps": 4.0 + r,
            "intact": True,
            "cache_dropped": True,
            "files": 1000,
            "creates_per_s": 5000.0,
        }
        record["checkpoint"] = {
            "kind": "torch",
            "bytes": 256 << 20,
            "save_s": 0.5,
            "restore_s": 0.25,
            "match": True,
        }
    return record


HEALTHY = [rank(r) for r in range(4)]


def rows(ranks=None, expect=EXPECT, limits=NO_LIMITS, state="COMPLETED", sent=SENT):
    ranks = HEALTHY if ranks is None else ranks
    return {c.name.split(" (")[0]: c for c in judge(ranks, expect, limits, state, sent)}


def changed(edit) -> list[dict]:
    ranks = deepcopy(HEALTHY)
    edit(ranks)
    return ranks


def test_a_healthy_preflight_is_all_ok():
    found = rows()
    assert {c.level for c in found.values()} == {OK}, [c for c in found.values() if c.level != OK]
    assert "write 2 GB/s, read 4 GB/s" in found["shared filesystem"].detail  # the slowest node
    assert "161 GB/s" in found["all_reduce"].detail
    assert "within 0.2 s" in found["requeue signal"].detail


def _set(path: str, value):
    """An edit of ranks: ``r0.fs.intact`` = value (rank, then keys)."""

    def edit(ranks):
        r, *keys = path.split(".")
        node = ranks[int(r[1:])]
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "name", "level", "words"),
    [
        (_set("r2.gpus.torch", 0), "gpus", FAIL, "n2: 2 allocated (SLURM_GPUS_ON_NODE), 0 seen"),
        (_set("r0.gpus.allocated", 1), "gpus", FAIL, "n1: asked 2, allocated 1"),
        (_set("r1.gpus.nvidia_smi", ["GPU 0: x"]), "gpus", FAIL, "nvidia-smi lists 1"),
        (_set("r0.errors", {"gpus": "OSError: boom"}), "gpus", FAIL, "OSError: boom"),
        (_set("r2.fs.intact", False), "shared filesystem", FAIL, "n2: the data read back differs"),
        (_set("r0.errors", {"fs": "OSError: EIO"}), "shared filesystem", FAIL, "n1: OSError"),
        (_set("r0.fs.cache_dropped", False), "shared filesystem", OK, "page cache NOT dropped"),
        (lambda rs: rs[2].pop("fs"), "shared filesystem", FAIL, "measured on 1 of 2"),
        (_set("r2.checkpoint.match", False), "checkpoint", FAIL, "n2: the restored state's"),
        (_set("r0.errors", {"checkpoint": "CheckpointError: x"}), "checkpoint", FAIL, "n1: Che"),
        (lambda rs: rs[0].pop("checkpoint"), "checkpoint", FAIL, "measured on 1 of 2"),
        (_set("r0.allreduce.sum_ok", False), "all_reduce", FAIL, "the sum came out wrong"),
        (_set("r0.allreduce.backend", "gloo"), "all_reduce", WARN, "not over the GPUs"),
        (_set("r3.signal.received", []), "requeue signal", FAIL, "reached 3 of 4"),
        (_set("r3.signal.received", ["TERM"]), "requeue signal", FAIL, "they got TERM instead"),
    ],
)
def test_each_finding(edit, name, level, words):
    found = rows(changed(edit))
    assert found[name].level == level, found[name]
    assert words in found[name].detail
    others = [c for n, c in found.items() if n != name and c.level != OK]
    assert not others, others


def test_missing_ranks_and_an_unfinished_job_fail_the_job_row():
    found = rows(HEALTHY[:3], state="FAILED")
    assert found["job"].level == FAIL
    assert "FAILED: 3 of 4 rank(s)" in found["job"].detail
    assert "output.log" in found["job"].hint
    nothing = rows([], state="COMPLETED")["job"]
    assert (
        nothing.level == FAIL and "filesystem the nodes and this host share" in nothing.hint
    )  # written there, not seen here


def test_thresholds_fail_below_and_pass_at_or_above():
    limits = Thresholds(min_fs_gbps=3.0, min_busbw=200.0)
    found = rows(limits=limits)
    assert found["shared filesystem"].level == FAIL
    assert "--min-fs-gbps 3" in found["shared filesystem"].hint
    assert found["all_reduce"].level == FAIL and "--min-busbw 200" in found["all_reduce"].hint
    ok = rows(limits=Thresholds(min_fs_gbps=2.0, min_busbw=161.1))
    assert ok["shared filesystem"].level == OK and ok["all_reduce"].level == OK


def test_one_rank_has_no_bus_bandwidth_and_cannot_meet_a_busbw_threshold():
    one = deepcopy(HEALTHY[0])
    one["allreduce"].update(world_size=1, peak_busbw_gbps=None)
    for size in one["allreduce"]["sizes"]:
        size["busbw_gbps"] = None
    solo = Expect(nodes=1, ranks=1, gpus_per_node=2, signal="USR2")
    found = rows([one], expect=solo)
    assert found["all_reduce"].level == OK
    assert "busbw undefined for 1 rank (algbw 107 GB/s)" in found["all_reduce"].detail
    strict = rows([one], expect=solo, limits=Thresholds(min_busbw=1.0))["all_reduce"]
    assert strict.level == FAIL and "2 or more ranks" in strict.hint


def test_no_torch_in_the_job_is_a_warning_unless_busbw_is_asked_for():
    def no_torch(ranks):
        for r in ranks:
            del r["allreduce"]
            r["skipped"] = {"allreduce": "torch is not importable here"}
            r["gpus"].update(torch=None)

    found = rows(changed(no_torch))
    assert (
        found["all_reduce"].level == WARN
        and "torch is not importable" in found["all_reduce"].detail
    )
    assert found["gpus"].level == OK  # nvidia-smi saw them
    strict = rows(changed(no_torch), limits=Thresholds(min_busbw=1.0))
    assert strict["all_reduce"].level == FAIL


def test_gpus_that_nothing_can_see_are_a_warning():
    found = rows(changed(lambda rs: [r["gpus"].update(torch=None, nvidia_smi=None) for r in rs]))
    assert found["gpus"].level == WARN and "neither torch nor nvidia-smi" in found["gpus"].detail


def test_the_cpu_path_and_fake_gpus():
    cpu = Expect(nodes=2, ranks=2, gpus_per_node=0, signal="USR2")
    ranks = [deepcopy(HEALTHY[0]), deepcopy(HEALTHY[2])]
    for r in ranks:
        r["gpus"] = {"allocated": None, "torch": 0, "nvidia_smi": None}
        r["allreduce"]["backend"] = "gloo"
    found = rows(ranks, expect=cpu)
    assert found["gpus"].level == OK and "none asked" in found["gpus"].detail
    assert found["all_reduce"].level == OK
    # the test cluster's fake GPUs: allocated by Slurm, seen by nothing
    fake = Expect(nodes=2, ranks=2, gpus_per_node=1, signal="USR2")
    for r in ranks:
        r["gpus"] = {"allocated": 1, "allocated_from": "SLURM_GPUS_ON_NODE", "torch": 0}
        r["gpus"]["nvidia_smi"] = None
    gpus = rows(ranks, expect=fake)["gpus"]
    assert gpus.level == FAIL and "1 allocated (SLURM_GPUS_ON_NODE), 0 seen by torch" in gpus.detail
    assert "no nvidia-smi" in gpus.detail


def test_the_signal_not_sent_or_refused():
    assert rows(sent={})["requeue signal"].level == FAIL
    assert "never all ready" in rows(sent={})["requeue signal"].detail
    refused = rows(sent={**SENT, "error": "scancel: error: Invalid job id"})["requeue signal"]
    assert refused.level == FAIL and "Invalid job id" in refused.detail


def test_nodes_rows():
    table = nodes(HEALTHY)
    assert [(r["node"], r["ranks"], r["signalled"]) for r in table] == [("n1", 2, 2), ("n2", 2, 2)]
    assert table[1]["write_gbps"] == 4.0 and table[0]["gpus_seen"] == 2


def test_the_job_is_a_spec_over_the_user_config(tmp_path, monkeypatch):
    config = tmp_path / "config.yaml"
    config.write_text("requeue: {signal: USR1}\nresources: {gpus: 8, account: lab}\n")
    monkeypatch.setenv("SLURMKIT_CONFIG", str(config))
    spec = preflight.job(3, partition="gpu", output_root=str(tmp_path), overrides=["env.A=1"])
    assert spec.resources.gpus == 8 and spec.resources.account == "lab"
    assert spec.resources.partition == "gpu" and spec.launcher == "srun"
    assert spec.env == {"A": "1"} and spec.output_root == str(tmp_path)
    assert spec.command[:3] == ("python", "-m", "slurmkit.runtime.preflight")
    assert preflight.expectation(spec) == Expect(3, 24, 8, "USR1")
    assert spec.requeue.budgets["preemption"] == 0  # run once: an interruption is a finding
    cpu = preflight.job(2, gpus_per_node=0)
    assert cpu.resources.gpus is None and preflight.expectation(cpu).ranks == 2


# -- the in-job module, on this machine --


def test_sizes_and_bus_bandwidth():
    assert [job.parse_size(s) for s in ("64K", "16M", "1G", "1MiB", "4096")] == [
        64 << 10,
        16 << 20,
        1 << 30,
        1 << 20,
        4096,
    ]
    for bad in ("", "0", "12X", "-1M", "1.5G"):
        with pytest.raises(ValueError, match="not a size"):
            job.parse_size(bad)
    assert job.busbw(10.0, 1) is None
    assert job.busbw(10.0, 2) == 10.0
    assert job.busbw(10.0, 8) == pytest.approx(17.5)


def test_allocated_gpus_from_the_environment():
    assert job.allocated_gpus({"SLURM_GPUS_ON_NODE": "4", "CUDA_VISIBLE_DEVICES": "0"}) == (
        4,
        "SLURM_GPUS_ON_NODE",
    )
    assert job.allocated_gpus({"CUDA_VISIBLE_DEVICES": "0,1,2"}) == (3, "CUDA_VISIBLE_DEVICES")
    assert job.allocated_gpus({"CUDA_VISIBLE_DEVICES": ""}) == (0, "CUDA_VISIBLE_DEVICES")
    assert job.allocated_gpus({}) == (None, None)


def test_measure_fs_writes_reads_back_and_leaves_nothing(tmp_path):
    found = job.measure_fs(str(tmp_path / "fs"), 3 << 20, 50)  # not a multiple of the block
    assert found["intact"] and found["bytes"] == 3 << 20 and found["files"] == 50
    assert found["cache_dropped"] is hasattr(os, "posix_fadvise")
    assert found["write_gbps"] > 0 and found["read_gbps"] > 0 and found["creates_per_s"] > 0
    assert list((tmp_path / "fs").iterdir()) == []


@pytest.mark.slow  # torch imported here
def test_measure_checkpoint_round_trip_compares_checksums(tmp_path, monkeypatch):
    found = job.measure_checkpoint(str(tmp_path), 1 << 20)
    assert found["kind"] == "torch" and found["match"] and found["step"] == 1
    assert not (tmp_path / "checkpoint").exists()
    from slurmkit.runtime.checkpoint import Checkpointer

    real = Checkpointer.load_latest

    def flipped(self, **kwargs):  # a restore that comes back different: the check must see it
        step, state = real(self, **kwargs)
        state["weights"][0] += 1
        return step, state

    monkeypatch.setattr(Checkpointer, "load_latest", flipped)
    assert job.measure_checkpoint(str(tmp_path), 1 << 20)["match"] is False


# A Python without torch: its import fails, as where torch is not installed.
NO_TORCH = """import json, sys
class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("no torch here")
sys.meta_path.insert(0, NoTorch())
"""


def _python(code: str, **env: str) -> str:
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_without_torch_all_but_the_all_reduce_runs_on_plain_bytes(tmp_path):
    _python(
        NO_TORCH + "from slurmkit.runtime.preflight import main\n"
        f"main(['--out={tmp_path}', '--fs-mib=1', '--files=5', '--checkpoint-mib=1'])\n"
        "assert 'torch' not in sys.modules\n"
    )
    record = json.loads((tmp_path / "rank-00000.json").read_text())
    assert record["errors"] == {}
    assert record["checkpoint"]["kind"] == "bytes" and record["checkpoint"]["match"]
    assert record["skipped"] == {"allreduce": "torch is not importable here"}
    assert record["gpus"]["torch"] is None and record["fs"]["intact"]


def _run_job(out: Path, *args: str, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "slurmkit.runtime.preflight", "--out", str(out), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, **env},
    )


@pytest.mark.slow
def test_one_process_measures_everything_and_reports_json(tmp_path):
    proc = _run_job(
        tmp_path / "out",
        "--fs-mib=2",
        "--files=20",
        "--checkpoint-mib=1",
        "--sizes=4K,64K",
        "--iters=3",
        "--json",
        SLURM_GPUS_ON_NODE="2",
    )
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    (only,) = json.loads(stdout)["ranks"]
    assert only == json.loads((tmp_path / "out" / "rank-00000.json").read_text())
    assert only["errors"] == {} and only["fs"]["intact"] and only["checkpoint"]["match"]
    assert only["gpus"]["allocated"] == 2 and only["gpus"]["torch"] == 0  # the CPU build
    a = only["allreduce"]
    assert a["backend"] == "gloo" and a["world_size"] == 1 and a["sum_ok"]
    assert [s["bytes"] for s in a["sizes"]] == [4096, 65536]
    assert a["peak_busbw_gbps"] is None and all(s["busbw_gbps"] is None for s in a["sizes"])
    assert "signal" not in only  # not asked for (--signal-wait 0)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["rank-00000.json"]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["USR2", "USR1"])
def test_the_requeue_signal_is_reported_not_fatal(tmp_path, name):
    proc = _run_job(
        tmp_path,
        "--only=signal",
        "--signal-wait=60",
        SLURMKIT_REQUEUE_SIGNAL=name,
    )
    ready = tmp_path / "ready-00000"
    end = time.time() + 60
    while not ready.exists() and proc.poll() is None and time.time() < end:
        time.sleep(0.05)
    assert ready.exists(), proc.communicate()[1]
    proc.send_signal(getattr(signal, f"SIG{name}"))
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    record = json.loads((tmp_path / "rank-00000.json").read_text())
    assert record["signal"]["signal"] == name and record["signal"]["received"] == [name]
    assert record["signal"]["waited_s"] < 30


def test_term_still_stops_a_waiting_rank(tmp_path):
    """Only the requeue signal is caught: a cancel (TERM) ends the task as it would any."""
    proc = _run_job(tmp_path, "--only=signal", "--signal-wait=60")
    end = time.time() + 30
    while not (tmp_path / "ready-00000").exists() and time.time() < end:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert not (tmp_path / "rank-00000.json").exists()


@pytest.mark.slow
def test_plain_torchrun_two_ranks_without_slurm(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "SLURMKIT"))}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            "-m",
            "slurmkit.runtime.preflight",
            f"--out={tmp_path}",
            "--only=allreduce,fs",
            "--fs-mib=1",
            "--files=10",
            "--sizes=4K",
            "--iters=3",
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**env, "GLOO_SOCKET_IFNAME": "lo"},
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads(proc.stdout.strip().splitlines()[-1])["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and {r["world_size"] for r in ranks} == {2}
    assert "fs" in ranks[0] and "fs" not in ranks[1]  # one measurement per node
    a = ranks[0]["allreduce"]
    assert a["world_size"] == 2 and a["sum_ok"] and a["backend"] == "gloo"
    assert a["sizes"][0]["busbw_gbps"] == pytest.approx(a["sizes"][0]["algbw_gbps"])  # n = 2


def test_the_job_refuses_bad_arguments(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "SLURMKIT_SWEEP_DIR"}
    for args in (["--sizes=1X", f"--out={tmp_path}"], ["--only=disk", f"--out={tmp_path}"], []):
        proc = subprocess.run(
            [sys.executable, "-m", "slurmkit.runtime.preflight", *args],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert not list(tmp_path.iterdir())


# -- the command --


def test_dry_run_shows_the_job_and_creates_nothing(tmp_path):
    proc = run_cli(
        "preflight", "--dry-run", "--nodes=3", f"--output-root={tmp_path}/runs", cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "srun --kill-on-bad-exit=1 --nodes=3 --ntasks=3" in proc.stdout
    assert "#SBATCH --signal=B:USR2@120" in proc.stdout
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--sizes=1M,12X"], "'12X' is not a size"),
        (["--nodes=0"], "--nodes"),
        (["--min-busbw=-1"], "--min-busbw"),
        (["resources.bogus=1"], "unknown key 'bogus'"),
        (["requeue.signal=KILL"], "requeue.signal"),
    ],
)
def test_usage_errors_exit_2_without_a_traceback(tmp_path, args, words):
    proc = run_cli("preflight", "--dry-run", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert words in proc.stderr and "Traceback" not in proc.stderr


def test_help_has_examples():
    proc = run_cli("preflight", "--help")
    assert proc.returncode == 0
    assert "slurmkit preflight --nodes 16 --gpus-per-node 8" in proc.stdout
    assert "--min-fs-gbps" in proc.stdout and "--min-busbw" in proc.stdout
