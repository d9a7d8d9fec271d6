"""Spec loading and validation: good specs load; every user mistake is a SpecError naming the
file and key (and the CLI turns it into exit code 2, no traceback, no sweep directory)."""

from __future__ import annotations

import pytest
from conftest import run_cli
from spec_examples import BAD_INPUT, GOOD

from slurmkit import render
from slurmkit import spec as spec_mod
from slurmkit.core.values import Choice, Distribution
from slurmkit.errors import SpecError


def test_good_spec_loads(spec_file):
    s = spec_mod.load(str(spec_file(GOOD)))
    assert s.name == "demo"
    assert s.command == ("python", "train.py", "--epochs", "3")
    assert s.params["lr"] == Choice((0.1, 0.01))
    assert s.params["optim.momentum"] == Choice((0.9, 0.95))
    assert s.params["layers"] == Choice((1, 2, 3))
    assert s.params["act"] == Choice(("relu", "gelu"))
    assert s.params["wd"] == Distribution("loguniform", 1e-5, 1e-2)
    assert s.params["tag"] == "base"
    assert render.resource_options(s.resources) == [
        "--partition=low",
        "--time=1:00:00",
        "--nodes=1",
        "--cpus-per-task=2",
        "--gpus-per-node=1",
        "--mem=4G",
        "--exclusive",
        "--comment=run42",
    ]
    assert s.env == {"OMP_NUM_THREADS": "1"}


def test_overrides_in_hydra_syntax(spec_file):
    s = spec_mod.load(
        str(spec_file(GOOD)),
        [
            "params.lr=0.5,0.05",
            "resources.time=2:00:00",
            "params.new=range(0,3)",
            "~params.tag",
            "max_parallel=8",
            "params.optim.momentum=0.8",
        ],
    )
    assert s.params["lr"] == Choice((0.5, 0.05))
    assert s.params["new"] == Choice((0, 1, 2))
    assert "tag" not in s.params
    assert s.params["optim.momentum"] == 0.8
    assert s.resources.time == "2:00:00"
    assert s.max_parallel == 8


def test_round_trip_through_dict(spec_file):
    s = spec_mod.load(str(spec_file(GOOD)))
    again = spec_mod.from_dict(s.to_dict(), "sweep.json")
    assert again.params == s.params and again.resources == s.resources


@pytest.mark.parametrize("body,overrides,key,needle", BAD_INPUT)
def test_bad_input_names_file_and_key(spec_file, body, overrides, key, needle):
    path = spec_file(body)
    with pytest.raises(SpecError) as info:
        spec_mod.load(str(path), overrides)
    err = info.value
    assert err.key == key
    assert err.file in (str(path), spec_mod.CLI)
    assert needle in str(err)


def test_malformed_yaml(spec_file):
    path = spec_file("command: x\nparams: {a: [1, 2\n")
    with pytest.raises(SpecError) as info:
        spec_mod.load(str(path))
    assert info.value.file == str(path) and "malformed YAML" in str(info.value)


@pytest.mark.parametrize(
    "body,overrides",
    [
        ("command: x\nparams: {a: [1, 2\n", []),
        ("command: x\nparams: {a: [1]}\nwat: 1\n", []),
        ("command: x\nparams: {a: [1]}\n", ["resources.time=yesterday"]),
        ("command: x\nparams: {a: [1]}\n", ["params.a=(("]),
    ],
)
def test_cli_bad_input_exit_2_no_traceback_nothing_left(tmp_path, spec_file, body, overrides):
    path = spec_file(body)
    out = tmp_path / "out"
    proc = run_cli("sweep", str(path), *overrides, f"output_root={out}", "--backend", "local")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "error:" in proc.stderr
    assert not out.exists() or not any(out.iterdir())


def test_spec_errors_come_before_scheduler_errors(tmp_path, spec_file):
    """The controller is asked while trials expand, but a bad spec is still what the user
    hears about first (exit 2), not an unreachable cluster (exit 1)."""
    path = spec_file("command: x\nparams: {a: [1, 1]}\n")
    env = {"SLURM_CONF": str(tmp_path / "missing.conf")}
    proc = run_cli("sweep", str(path), f"output_root={tmp_path}", "--backend", "slurm", env=env)
    assert proc.returncode == 2 and "same parameters" in proc.stderr, proc.stderr
    ok = spec_file("command: x\nparams: {a: [1, 2]}\n")
    proc = run_cli("sweep", str(ok), f"output_root={tmp_path}", "--backend", "slurm", env=env)
    assert proc.returncode == 1 and "missing.conf does not exist" in proc.stderr, proc.stderr


def test_cli_missing_file_and_usage(tmp_path):
    proc = run_cli("sweep", str(tmp_path / "nope.yaml"))
    assert proc.returncode == 2 and "no such file" in proc.stderr
    proc = run_cli("sweep")
    assert proc.returncode == 2 and "Usage" in proc.stderr


# the spec's own layers (data path, and omegaconf's for an interpolation), the user config below
LAYERED = "name: t\ncommand: x\nparams: {a: [1]}\n"


@pytest.mark.parametrize("route", ["", "output_root: runs/${name}\n"])
@pytest.mark.parametrize(
    "config,body,overrides,named,key",
    [
        ("resources: {cpus: x}\n", "", [], "config", "resources.cpus"),
        ("resources: {wat: 1}\n", "resources: {cpus: 2}\n", [], "config", "resources.wat"),
        ("requeue: {signal: KILL}\n", "", [], "config", "requeue.signal"),
        ("container: {mounts: 5}\n", "", ["container.image=i.sqsh"], "config", "container.mounts"),
        ("resources: {cpus: 2}\n", "resources: {cpus: x}\n", [], "spec", "resources.cpus"),
        ("resources: {cpus: 2}\n", "", ["resources.cpus=x"], "spec", "resources.cpus"),
        ("resources: {cpus: x}\n", "", ["resources.cpus=y"], "spec", "resources.cpus"),
        ("profile: nosuch\n", "profile: sunk\n", [], None, None),
        ("profile: sunk\n", "profile: nosuch\n", [], "spec", "profile"),
        ("", "profile: sunk\n", ["profile=nosuch"], "cli", "profile"),
    ],
)
def test_errors_name_the_layer_of_the_value(
    tmp_path, monkeypatch, route, config, body, overrides, named, key
):
    """An error in the merged layers names the one its value came from: the user config, or
    the spec file (with its overrides); an unknown profile, the layer that chose it."""
    cfg = tmp_path / "config.yaml"
    cfg.write_text(config)
    monkeypatch.setenv("SLURMKIT_CONFIG", str(cfg))
    path = tmp_path / "spec.yaml"
    path.write_text(LAYERED + body + route)
    if named is None:
        spec_mod.load(str(path), overrides)
        return
    with pytest.raises(SpecError) as info:
        spec_mod.load(str(path), overrides)
    files = {"config": str(cfg), "spec": str(path), "cli": spec_mod.CLI}
    assert (info.value.file, info.value.key) == (files[named], key)


def test_resume_errors_name_the_overrides_or_sweep_json(spec_file):
    """What the overrides make invalid names the command line (a time limit under the requeue
    lead too); a mistake in sweep.json itself names sweep.json."""
    config = spec_mod.load(str(spec_file(LAYERED))).to_dict()
    for overrides, key in [
        (["resources.cpus=x"], "resources.cpus"),
        (["resources.time=1:00"], "requeue.lead"),
    ]:
        with pytest.raises(SpecError) as info:
            spec_mod.resumed(config, overrides, "sweep.json")
        assert (info.value.file, info.value.key) == (spec_mod.CLI, key)
    damaged = {**config, "seed": "x"}
    with pytest.raises(SpecError) as info:
        spec_mod.resumed(damaged, ["resources.cpus=2"], "sweep.json")
    assert (info.value.file, info.value.key) == ("sweep.json", "seed")
