"""Specs that must not be trusted as written: YAML 1.1's base-60 numbers, alias bombs, deep
nesting, env floats, keys that collide, text that is not UTF-8, NUL characters, a container that
is no mapping, a huge num_samples. Each mistake is a SpecError naming the file and the key, through
``spec.load`` and through the real CLI (exit 2, no traceback); random specs load or raise
SpecError, never anything else."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmkit import render
from slurmkit import spec as spec_mod
from slurmkit.errors import SpecError
from slurmkit.spec import CLI, yamldata
from slurmkit.spec.layers import CONFIG_KEYS
from slurmkit.spec.model import CAUSES, CONTAINER_KEYS, REQUEUE_KEYS, RESOURCE_KEYS, TOP_KEYS

BASE = "command: x\nparams: {a: [1]}\n"


def _bomb() -> str:
    """A "billion laughs" under params: 9 levels of 9 aliases each (9^9 values), ~400 bytes."""
    lines = ["command: x", "params:", "  l0: &l0 [" + ", ".join(["lol"] * 9) + "]"]
    for n in range(1, 9):
        lines.append(f"  l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def _nested(depth: int, leaf: str = "1") -> str:
    return "[" * depth + leaf + "]" * depth


def _block(depth: int) -> str:
    """params nested ``depth`` mappings deep, in block style."""
    lines = ["command: x", "params:"]
    lines += [f"{'  ' * (n + 1)}k{n}:" for n in range(depth)]
    return "\n".join(lines) + " [1]\n"


# (id, spec body (str or bytes), overrides, user config, the file named: spec/config/cli,
#  the key named (a trailing "..." means: starts with), a part of the message)
REFUSED = [
    ("alias-bomb", _bomb(), [], None, "spec", "params.l...", "aliases repeat more than 10,000"),
    ("alias-recursive", "command: x\nparams: {a: &a [1, *a]}\n", [], None, "spec", "params.a.1",
     "contain itself"),
    ("alias-deep", f"command: x\nparams:\n  a: &a {_nested(40)}\n  b: {_nested(40, '*a')}\n", [],
     None, "spec", "params.b...", "nested more than 64 levels"),
    ("deep-flow", f"command: x\nparams:\n  a: {_nested(5000)}\n", [], None, "spec",
     "params.a.0...", "nested more than 64 levels"),
    ("deep-block", _block(100), [], None, "spec", "params.k0.k1...", "nested more than 64"),
    ("deep-config", BASE, [], f"env: {{A: {_nested(3000)}}}\n", "config", "env.A.0...",
     "nested more than 64"),
    ("deep-override", BASE, [f"env.X={_nested(3000)}"], None, "cli", "env.X",
     "nested more than 64"),
    ("deep-override-dict", BASE, ["env.X=" + "{a: " * 300 + "1" + "}" * 300], None, "cli",
     "env.X", "nested more than 64"),
    ("deep-override-key", BASE, ["env." + ".".join(["a"] * 3000) + "=1"], None, "cli",
     "env.a.a...", "nested more than 64"),
    ("env-float", BASE + "env: {LR: 1e-3, N: 2}\n", [], None, "spec", "env.LR",
     "quote it: LR: '1e-3'"),
    ("env-float-block", BASE + "env:\n  N: 2\n  WD: 5.0e-4\n", [], None, "spec", "env.WD",
     "quote it: WD: '5.0e-4'"),
    ("env-float-config", BASE, [], "env: {LR: 1e-3}\n", "config", "env.LR",
     "quote it: LR: '1e-3'"),
    ("env-float-override", BASE, ["env.LR=1e-3"], None, "cli", "env.LR", "quote it"),
    ("params-dotted-then-nested", "command: x\nparams: {a.b: [1], a: {b: [2]}}\n", [], None,
     "spec", "params.a.b", "the keys 'a.b' and 'a' both set params.a.b"),
    ("params-nested-then-dotted", "command: x\nparams: {a: {b: [2]}, a.b: [1]}\n", [], None,
     "spec", "params.a.b", "the keys 'a' and 'a.b' both set params.a.b"),
    ("params-deeper", "command: x\nparams: {x: {a.b: [1], a: {b: [2]}}}\n", [], None, "spec",
     "params.x.a.b", "'a.b' and 'a'"),
    ("params-int-and-str", "command: x\nparams: {1: [1], '1': [2]}\n", [], None, "spec",
     "params.1", "both set"),
    ("resources-cpus", BASE + "resources: {cpus: 2, cpus_per_task: 4}\n", [], None, "spec",
     "resources.cpus_per_task", "resources.cpus and resources.cpus_per_task"),
    ("resources-gpus", BASE + "resources: {gpus_per_node: 2, gpus: 1}\n", [], None, "spec",
     "resources.gpus_per_node", "resources.gpus and resources.gpus_per_node"),
    ("resources-config-alias", BASE + "resources: {cpus: 2, cpus_per_task: 4}\n", [],
     "resources: {cpus: 1}\n", "spec", "resources.cpus_per_task", "same setting"),
    ("extra-dashes", BASE + "resources: {extra: {comment: a, --comment: b}}\n", [], None,
     "spec", "resources.extra.comment", "'comment' and '--comment'"),
    ("env-bool-key", BASE + "env: {true: a, 'True': b}\n", [], None, "spec", "env.True",
     "True and 'True'"),
    ("not-utf8", b"command: x\nparams: {a: [1]}\nname: caf\xe9\n", [], None, "spec", "name",
     "not UTF-8 text: byte 0xe9 on line 3"),
    ("not-utf8-nested", b"command: x\nparams:\n  a: [1]\n  b: [x, \xff]\n", [], None, "spec",
     "params.b.1", "not UTF-8 text: byte 0xff on line 4"),
    ("not-utf8-config", BASE, [], b"env: {A: \xff}\n", "config", "env.A", "not UTF-8"),
    ("nul-command", 'command: "python\\0 t.py"\nparams: {a: [1]}\n', [], None, "spec",
     "command", "NUL character"),
    ("nul-argument", 'command: [python, "t\\0.py"]\nparams: {a: [1]}\n', [], None, "spec",
     "command.1", "NUL character"),
    ("nul-env", BASE + 'env: {A: "x\\0"}\n', [], None, "spec", "env.A", "NUL character"),
    ("nul-env-name", BASE + 'env: {"A\\0": x}\n', [], None, "spec", "env.A\\0", "NUL"),
    ("nul-param", 'command: x\nparams: {a: ["\\0"]}\n', [], None, "spec", "params.a.0", "NUL"),
    ("nul-config", BASE, [], 'env: {A: "\\0"}\n', "config", "env.A", "NUL character"),
    ("container-scalar", BASE + "container: 5\n", [], None, "spec", "container",
     "must be a mapping"),
    ("container-list", BASE + "container: [nvcr.io/nvidia/pytorch:24.01-py3]\n", [], None,
     "spec", "container", "must be a mapping"),
    ("container-string-profile", BASE + "profile: sunk\ncontainer: img.sqsh\n", [], None,
     "spec", "container", "must be a mapping"),
    ("container-list-profile", BASE + "profile: sunk\ncontainer: [img.sqsh]\n", [], None,
     "spec", "container", "cannot be merged"),
    ("container-override", BASE, ["container=5"], None, "spec", "container", "mapping"),
    ("container-config", BASE, [], "container: [a]\n", "config", "container",
     "must be a mapping"),
    ("config-merge-clash", BASE + "resources: [1, 2]\n", [], "resources: {partition: gpu}\n",
     "spec", "resources", "cannot be merged"),
    ("num-samples", "command: x\nparams: {a: 'uniform(0,1)'}\nnum_samples: 1000000000000\n", [],
     None, "spec", "num_samples", "at most 1,000,000"),
]  # fmt: skip


def _write(path: Path, body: str | bytes) -> Path:
    path.write_bytes(body.encode() if isinstance(body, str) else body)
    return path


def _setup(tmp_path, monkeypatch, body, config):
    """Write the spec (and user config); return them and the file each kind of error names."""
    path = _write(tmp_path / "spec.yaml", body)
    files = {"spec": str(path), "cli": CLI}
    if config is not None:
        files["config"] = str(_write(tmp_path / "config.yaml", config))
        monkeypatch.setenv("SLURMKIT_CONFIG", files["config"])
    return path, files


def _key_matches(key: str | None, expected: str) -> bool:
    if expected.endswith("..."):
        return key is not None and key.startswith(expected[:-3])
    return key == expected


@pytest.mark.parametrize(
    "body,overrides,config,named,key,needle",
    [case[1:] for case in REFUSED],
    ids=[case[0] for case in REFUSED],
)
def test_load_refuses_naming_file_and_key(
    tmp_path, monkeypatch, body, overrides, config, named, key, needle
):
    path, files = _setup(tmp_path, monkeypatch, body, config)
    start = time.monotonic()
    with pytest.raises(SpecError) as info:
        spec_mod.load(str(path), overrides)
    assert time.monotonic() - start < 5  # the bomb is refused, not expanded
    err = info.value
    assert err.file == files[named]
    assert _key_matches(err.key, key), err.key
    assert needle in str(err)


@pytest.mark.parametrize(
    "body,overrides,config,named,key,needle",
    [  # a fresh CLI each: one case in four in make unit (the test above has them all)
        pytest.param(*case[1:], id=case[0], marks=[pytest.mark.slow] if n % 4 else [])
        for n, case in enumerate(REFUSED)
    ],
)
def test_cli_refuses_exit_2_no_traceback(
    tmp_path, monkeypatch, body, overrides, config, named, key, needle
):
    path, files = _setup(tmp_path, monkeypatch, body, config)
    proc = run_cli("sweep", str(path), *overrides, "--dry-run", timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"error: {files[named]}: {key.removesuffix('...')}" in proc.stderr, proc.stderr
    assert needle in proc.stderr


# --------------------------------------------------------------------------- #
# What stays as written.
# --------------------------------------------------------------------------- #

# an interpolation sends a spec down omegaconf's path: both paths read times the same
PATHS = {"data": "", "omegaconf": "output_root: runs/${name}\n"}


@pytest.mark.parametrize("route", PATHS)
@pytest.mark.parametrize("written", ["15:00", "1:00:00", "10", "'1:00:00'", "2-00:00:00"])
def test_times_stay_slurm_times(spec_file, route, written):
    body = f"name: t\ncommand: x\nparams: {{a: [1]}}\nresources: {{time: {written}}}\n"
    s = spec_mod.load(str(spec_file(body + PATHS[route])))
    expected = written.strip("'")
    assert s.resources.time == expected
    assert f"--time={expected}" in render.resource_options(s.resources)


@pytest.mark.parametrize("route", PATHS)
def test_base_60_looking_values_stay_strings(tmp_path, monkeypatch, spec_file, route):
    config = tmp_path / "config.yaml"
    config.write_text("resources: {time: 1:30:00}\nenv: {T: 15:00}\n")
    monkeypatch.setenv("SLURMKIT_CONFIG", str(config))
    body = "name: t\ncommand: x\nparams: {a: 1:30, b: [1:30, 2:45.5], c: 90}\n" + PATHS[route]
    s = spec_mod.load(str(spec_file(body)))
    assert s.params["a"] == "1:30"
    assert s.params["b"].values == ("1:30", "2:45.5")
    assert s.params["c"] == 90  # plain integers are still integers
    assert s.resources.time == "1:30:00"
    assert s.env["T"] == "15:00"


def test_cli_renders_time_as_written(spec_file):
    path = spec_file("command: x\nparams: {a: [1]}\nresources: {time: 15:00}\n")
    proc = run_cli("render", str(path))
    assert proc.returncode == 0, proc.stderr
    assert "#SBATCH --time=15:00\n" in proc.stdout


def test_env_keeps_ints_strings_and_booleans(spec_file):
    body = BASE + "env: {N: 10, S: '1e-3', B: true, T: text}\n"
    s = spec_mod.load(str(spec_file(body)), ["env.M=3", "env.Q='0.5'"])
    assert s.env == {"N": "10", "S": "1e-3", "B": "true", "T": "text", "M": "3", "Q": "0.5"}


def test_env_float_from_python_data_is_refused():
    with pytest.raises(SpecError) as info:
        spec_mod.from_dict({"command": "x", "env": {"LR": 0.001}}, "sweep.json")
    assert info.value.key == "env.LR" and "quote it: LR: '0.001'" in str(info.value)


def test_nul_in_an_override_from_python(spec_file):
    """argv cannot hold a NUL, but the Python API's overrides can: refused as in a file."""
    with pytest.raises(SpecError) as info:
        spec_mod.load(str(spec_file(BASE)), ['command=[python, "t\0.py"]'])
    assert info.value.file == CLI and info.value.key == "command"
    assert "NUL character" in str(info.value)


def test_aliases_of_resources_keys_merge_across_layers(tmp_path, monkeypatch, spec_file):
    """The key one layer writes replaces the alias a lower layer wrote (and the other way round):
    only a layer that writes both is refused."""
    config = tmp_path / "config.yaml"
    config.write_text("resources: {cpus_per_task: 4, gpus: 1}\n")
    monkeypatch.setenv("SLURMKIT_CONFIG", str(config))
    path = str(spec_file(BASE + "resources: {cpus: 8, gpus_per_node: 2}\n"))
    s = spec_mod.load(path)
    assert (s.resources.cpus, s.resources.gpus) == (8, 2)
    s = spec_mod.load(path, ["resources.cpus_per_task=2", "resources.gpus=4"])
    assert (s.resources.cpus, s.resources.gpus) == (2, 4)
    s = spec_mod.load(path, ["~resources.cpus_per_task"])
    assert s.resources.cpus is None  # not asked for any more: not rendered
    resumed = spec_mod.resumed(s.to_dict(), ["resources.cpus_per_task=16"], "sweep.json")
    assert resumed.resources.cpus == 16


def test_just_inside_the_limits_loads(spec_file):
    """A value's depth is the length of its dotted key: params.a.0.0...0 with 62 indices is 64."""
    depth = yamldata.MAX_DEPTH - 2
    body = f"command: x\nparams:\n  a: {_nested(depth)}\n  b: &b [1, 2, 3]\n  c: *b\n"
    s = spec_mod.load(
        str(spec_file(body + "resources: &r {cpus: 2}\n")), [f"params.q={_nested(depth)}"]
    )
    assert s.params["c"].values == (1, 2, 3) and s.resources.cpus == 2
    with pytest.raises(SpecError, match="nested more than"):
        spec_mod.load(str(spec_file(f"command: x\nparams:\n  a: {_nested(depth + 1)}\n")))
    with pytest.raises(SpecError, match="nested more than"):
        spec_mod.load(str(spec_file(BASE)), [f"params.q={_nested(depth + 1)}"])
    ok = spec_file("command: x\nparams: {a: 'uniform(0,1)'}\nnum_samples: 1000000\n")
    assert spec_mod.load(str(ok)).num_samples == 1_000_000


def test_aliases_within_the_limit_load(spec_file):
    """Aliases that repeat ~8,000 values (9^4 in all) load; one level more (9^5) does not."""
    lines = ["command: x", "params:", "  l0: &l0 [" + ", ".join(["1"] * 9) + "]"]
    for n in range(1, 4):
        lines.append(f"  l{n}: &l{n} [" + ", ".join([f"*l{n - 1}"] * 9) + "]")
    s = spec_mod.load(str(spec_file("\n".join(lines) + "\n")))
    assert len(s.params["l3"].values) == 9
    lines.append("  l4: [" + ", ".join(["*l3"] * 9) + "]")
    with pytest.raises(SpecError, match="aliases repeat"):
        spec_mod.load(str(spec_file("\n".join(lines) + "\n")))


# --------------------------------------------------------------------------- #
# Random specs: they load or raise SpecError, nothing else.
# --------------------------------------------------------------------------- #

# the keys a spec's mappings hold (params and env take any names)
SCHEMA = {
    None: TOP_KEYS,
    "resources": RESOURCE_KEYS,
    "container": CONTAINER_KEYS,
    "requeue": REQUEUE_KEYS,
    "budgets": CAUSES,
    "extra": ("comment", "--comment", "exclusive", "array", "mem-per-cpu"),
    "params": ("a", "b", "a.b", "optim.lr", "1", "true", "x y", ".", "''", "~"),
    "env": ("A", "B_1", "true", "1", "A.B", "LR", "NUL\\0"),
}
# texts that YAML (or the override grammar under params) reads in more than one way
SPECIAL = [
    "15:00", "1:00:00", "-1:30", "1:30.5", "1e-3", ".inf", ".nan", "0x1f", "0o17", "010",
    "1_000", "yes", "No", "on", "~", "null", "true", "2001-12-14", "${name}", "${oc.env:HOME}",
    "???", "'quoted'", '"dq\\0"', '"\\x00"', "a: b", "- x", "[1, 2", "{a: 1}", "&x", "*x",
    "!!str", "!!binary aGk=", "!!python/object:os.system", "!!timestamp 2001-12-14", "%", "@x",
    "`x`", "#c", "a #b", "|", ">", "'", "range(1,4)", "'uniform(0,1)'", "'choice(a,b)'", "1,2",
    "x=y", "\\", "é", "\t", "", "python t.py", "h100:8", "16G", "USR1", "/img.sqsh",
    "nvcr.io/nvidia/pytorch:24.01-py3", "torchrun", "sunk", "none",
]  # fmt: skip
printable = st.characters(codec="utf-8", exclude_categories=("Cc", "Cs"))
scalars = st.one_of(
    st.sampled_from(SPECIAL),  # raw: some are not YAML in a flow mapping
    st.sampled_from(SPECIAL).map(json.dumps),
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True).map(repr),
    st.text(printable, max_size=12).map(json.dumps),
    st.text("az09_-./:@ ", max_size=8),
)


def _document(data: st.DataObject) -> str:
    """A YAML document of spec keys (block style at the top, flow style below) with random
    scalars (raw or quoted), nested mappings and lists, anchors and aliases to them."""
    anchors: list[str] = []

    def value(depth: int, key: str | None, anchor: bool = True) -> str:
        kinds = (
            ["scalar", "list"] + ["alias", "anchor"] * anchor + ["map"] * (1 + 3 * (key in SCHEMA))
        )
        kind = data.draw(st.sampled_from(kinds))
        if kind == "alias" and anchors:
            return f"*{data.draw(st.sampled_from(anchors))}"
        if kind == "anchor":
            name = f"a{len(anchors)}"
            if data.draw(st.integers(0, 9)) == 0:  # now and then, aliases inside their anchor
                anchors.append(name)
            text = value(depth, key, anchor=False)
            anchors.append(name)
            return f"&{name} {text}"
        if kind == "map" and depth < 5:
            return "{" + ", ".join(entries(depth + 1, key)) + "}"
        if kind == "list" and depth < 5:
            items = [value(depth + 1, None) for _ in range(data.draw(st.integers(0, 3)))]
            return "[" + ", ".join(items) + "]"
        return data.draw(scalars)

    def entries(depth: int, parent: str | None) -> list[str]:
        names = st.sampled_from(SCHEMA.get(parent, ("a", "b")))
        keys = data.draw(st.lists(names | scalars if depth > 2 else names, max_size=4, unique=True))
        return [f"{key}: {value(depth, key)}" for key in keys]

    lines = [line for line in entries(1, None) if not line.startswith(("command:", "params:"))]
    if data.draw(st.integers(0, 3)):  # mostly specs that validation reads further
        lines.insert(0, "command: [python, t.py]")
    if data.draw(st.booleans()):
        lines.insert(0, "params: {" + ", ".join([*entries(2, "params"), "z: [1, 2]"]) + "}")
    return "\n".join(lines) + "\n"


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_specs_load_or_raise_spec_error(tmp_path_factory, data):
    """Random specs (and user configs, and overrides) load or raise SpecError."""
    where = tmp_path_factory.mktemp("fuzz")
    (where / "spec.yaml").write_text(_document(data), encoding="utf-8")
    config = [
        line for line in _document(data).splitlines(True) if line.split(":")[0] in CONFIG_KEYS
    ]
    (where / "config.yaml").write_text("".join(config), encoding="utf-8")
    keys = st.sampled_from(["name", "seed", "env.A", "params.a", "resources.cpus_per_task"])
    overrides = data.draw(st.lists(st.tuples(keys, scalars).map("=".join), max_size=2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURMKIT_CONFIG", str(where / "config.yaml"))
        try:
            spec_mod.load(str(where / "spec.yaml"), overrides, job=data.draw(st.booleans()))
        except SpecError:
            pass
