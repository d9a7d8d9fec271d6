"""The table of spec keys (slurmkit/spec/keys.py) and what comes from it: `slurmkit schema`'s JSON
Schema accepts every spec of the repository and the README, and every spec that loads, and
refuses known mistakes; the README's key reference is the table's; the table is whole."""

from __future__ import annotations

import ast
import copy
import importlib
import json
import re
import subprocess
import textwrap
from pathlib import Path

import jsonschema
import pytest
import yaml
from conftest import ROOT, SLURMKIT
from spec_examples import GOOD, JOB

from slurmkit import spec as spec_mod
from slurmkit.errors import SpecError
from slurmkit.spec import schema, yamldata
from slurmkit.spec.keys import KEY, KEYS, below

SPEC = jsonschema.Draft7Validator(schema.json_schema())
CONFIG = jsonschema.Draft7Validator(schema.json_schema(config=True))
README = (ROOT / "README.md").read_text()
FILES = sorted([*ROOT.glob("sweeps/*.yaml"), *ROOT.glob("tests/**/*.yaml")])
# The README's YAML blocks: specs, the user-config example, and fragments of a spec.
BLOCKS = re.findall(r"```yaml\n(.*?)```", README, re.S)
# Interpolations and the override grammar in params: what the schema must not refuse.
LATER = """
name: later
seed: 3
command: [python, t.py]
params: {lr: 'loguniform(1e-4,1e-1)', opt: 'choice(adam,sgd)', n: 'range(1,4)', wd: [0, 0.1],
         nested: {a: '1,2'}, fixed: 5}
num_samples: 4
resources: {nodes: '${oc.decode:${oc.env:SK_NODES,2}}', time: '${oc.env:SK_TIME,1:00:00}',
            cpus: '${seed}'}
output_root: ${oc.env:HOME}/runs
requeue: {lead: '${oc.decode:${oc.env:SK_LEAD,60}}', signal: sigusr1, budgets: {timeout: null}}
"""


def _errors(validator: jsonschema.Draft7Validator, data: object) -> list[str]:
    return [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(data)]


def _loads_and_fits(path: Path) -> None:
    """``path`` loads (as a job: it may have no params) and the schema accepts it as read."""
    spec_mod.load(str(path), job=True)
    assert _errors(SPEC, yamldata.read(str(path))) == [], path


def test_the_schema_is_draft_07_and_what_the_command_prints():
    jsonschema.Draft7Validator.check_schema(schema.json_schema())
    jsonschema.Draft7Validator.check_schema(schema.json_schema(config=True))
    for extra in ([], ["--config"]):
        proc = subprocess.run(
            [*SLURMKIT, "schema", *extra], capture_output=True, text=True, check=True
        )
        assert json.loads(proc.stdout) == schema.json_schema(config=bool(extra))


def test_the_user_config_schema_has_the_config_keys_only():
    from slurmkit.spec.layers import CONFIG_KEYS

    assert sorted(schema.json_schema(config=True)["properties"]) == sorted(CONFIG_KEYS)
    assert _errors(CONFIG, {"report": {"gpu_hour": 2.5}, "container": {"mount_home": True}}) == []
    assert _errors(CONFIG, {"command": "x"})  # a spec key the user config may not set


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_spec_file_of_the_repository_fits(path):
    _loads_and_fits(path)


def test_the_files_are_found():
    assert len(FILES) >= 10 and len(BLOCKS) >= 5


def _test_specs() -> list[str]:
    """The YAML texts in the test modules that look like specs (a ``command:`` line)."""
    texts = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and re.search(r"^\s*command:", text, re.M):
                texts.append(textwrap.dedent(text))
    return texts


@pytest.mark.slow  # its fast twin: test_spec_examples_fit
def test_every_spec_the_tests_write_that_loads_fits(tmp_path):
    """Each spec text of the test modules (bad input too) that loads: the schema accepts it."""
    loaded = 0
    for i, text in enumerate(_test_specs()):
        path = tmp_path / f"s{i}.yaml"
        path.write_text(text)
        try:
            spec_mod.load(str(path), job=True)
        except SpecError:
            continue
        loaded += 1
        assert _errors(SPEC, yamldata.read(str(path))) == [], text
    assert loaded > 50


@pytest.mark.parametrize("body", [GOOD, JOB, LATER], ids=["good", "job", "interpolations"])
def test_spec_examples_fit(body, tmp_path):
    path = tmp_path / "spec.yaml"
    path.write_text(body)
    _loads_and_fits(path)


@pytest.mark.parametrize("text", BLOCKS, ids=lambda t: t.splitlines()[0][:40])
def test_readme_yaml_examples_fit(text, tmp_path, monkeypatch):
    """As tests/test_readme.py loads them: a spec as it is, the user config as one, a fragment
    inside a minimal spec."""
    path = tmp_path / "example.yaml"
    if re.search(r"^command:", text, re.M):
        path.write_text(text)
    elif text.startswith("resources:") and "output_root:" in text:
        config = tmp_path / "config.yaml"
        config.write_text(text)
        assert _errors(CONFIG, yamldata.read(str(config))) == []
        assert _errors(SPEC, yamldata.read(str(config))) != []  # a spec needs its command
        monkeypatch.setenv("SLURMKIT_CONFIG", str(config))
        path.write_text("command: x\n")
    else:
        path.write_text("command: x\n" + text)
    _loads_and_fits(path)


# (what is wrong, a spec's YAML, where the schema says so)
REFUSED = [
    ("unknown key", "command: x\nbogus: 1\n", []),
    ("unknown resources key", "command: x\nresources: {gpu: 1}\n", ["resources"]),
    ("args not allowed", "command: x\nargs: posix\n", ["args"]),
    ("launcher not allowed", "command: x\nlauncher: mpirun\n", ["launcher"]),
    ("signal not allowed", "command: x\nrequeue: {signal: KILL}\n", ["requeue"]),
    ("stderr not allowed", "command: x\nlogs: {stderr: both}\n", ["logs"]),
    ("nodes not a number", "command: x\nresources: {nodes: many}\n", ["resources"]),
    ("nodes below 1", "command: x\nresources: {nodes: 0}\n", ["resources"]),
    ("bad name", "command: x\nname: 'bad name'\n", ["name"]),
    ("no command", "name: x\n", []),
    ("empty command", "command: []\n", ["command"]),
    ("a boolean in the command", "command: [run, true]\n", ["command"]),
    ("memory unit", "command: x\nresources: {mem: 16Q}\n", ["resources"]),
    ("env name", "command: x\nenv: {1X: a}\n", ["env"]),
    ("env float", "command: x\nenv: {X: 0.5}\n", ["env"]),
    ("unknown budget cause", "command: x\nrequeue: {budgets: {oom: 1}}\n", ["requeue"]),
    ("dataset without src", "command: x\ndata: [{dst: /mnt/d}]\n", ["data"]),
    ("mounts not a list", "command: x\ncontainer: {image: x, mounts: 5}\n", ["container"]),
    ("too many samples", "command: x\nnum_samples: 1000001\n", ["num_samples"]),
]


@pytest.mark.parametrize("what, text, where", REFUSED, ids=[r[0] for r in REFUSED])
def test_known_mistakes_are_refused_by_schema_and_validation(what, text, where, tmp_path):
    data = yaml.safe_load(text)
    errors = list(SPEC.iter_errors(data))
    assert errors, what
    assert any(list(e.absolute_path)[: len(where)] == where for e in errors), errors
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(SpecError):
        spec_mod.load(str(path), job=True)


def _mutations(values: list[object]) -> list[dict]:
    """Each key of the table set to each of ``values`` in a full spec (JOB), one at a time."""
    base = yaml.safe_load(JOB) | {
        "data": [{"src": "s3://b/ds", "dst": "/mnt/data/ds"}],
        "requeue": {"lead": 60},
    }
    out = []
    for key in KEYS:
        *parents, leaf = key.path.split(".")
        for value in values:
            data = copy.deepcopy(base)
            node = data
            for part in parents:
                node = node[part][0] if part == "data" else node.setdefault(part, {})
            node[leaf] = value
            out.append(data)
    return out


def _never_refuses_what_loads(values: list[object], tmp_path: Path) -> int:
    loaded = 0
    for i, data in enumerate(_mutations(values)):
        path = tmp_path / f"s{i}.yaml"
        path.write_text(json.dumps(data))  # JSON is YAML (and faster to write)
        try:
            spec_mod.load(str(path), job=True)
        except SpecError:
            continue
        loaded += 1
        assert _errors(SPEC, yamldata.read(str(path))) == [], data
    return loaded


def test_the_schema_never_refuses_a_spec_that_loads(tmp_path):
    assert _never_refuses_what_loads([1, "x"], tmp_path) > 30


@pytest.mark.slow
def test_the_schema_never_refuses_a_spec_that_loads_more_values(tmp_path):
    values = [None, True, [], {}, 0, -1, 2, 1.5, False, "", "a b", "usr1", "8", "h100:8", "16G"]
    values += ["%x_%a", "node"]
    values += ["1:00:00", "1@10:00", "/abs", "/", "s3://b/x", "separate", "srun", "none", "sunk"]
    values += [["a"], [1], {"A": "x"}, {"timeout": 1}, 16384, "1:30", "${oc.env:HOME}"]
    assert _never_refuses_what_loads(values, tmp_path) > 200


def test_readme_key_reference_is_the_table():
    """README.md holds what `make readme-keys` writes from the table (run it after a change)."""
    assert schema.readme(README) == README
    section = README[README.index(schema.BEGIN) : README.index(schema.END)]
    for key in KEYS:
        assert f"| `{key.path.replace('data.', 'data[].')}` |" in section


def test_the_table_is_whole():
    """Every kind is known, every block has keys, every alias and checker exists, every
    allowed value is a string, every map names its values' kind, no path twice."""
    assert len(KEY) == len(KEYS)
    for key in KEYS:
        assert key.kind in schema.KINDS, key.path
        assert key.items is None or key.items in schema.KINDS, key.path
        if key.kind in ("block", "blocks"):
            assert below(key.path), key.path
        if key.kind in ("map", "list"):
            assert key.items, key.path
        if key.alias:
            assert f"{key.path.rpartition('.')[0]}.{key.alias}" in KEY
        assert all(isinstance(c, str) for c in key.choices)
        if "." in key.path:
            assert key.path.rpartition(".")[0] in KEY, key.path
        if key.checked:
            module, _, name = key.checked.rpartition(".")
            where = "slurmkit." + ("spec." if module in ("validate", "layers") else "") + module
            assert hasattr(importlib.import_module(where), name), key.checked


def test_a_trailing_newline_is_no_slurm_word(spec_file):
    """A key's pattern matches its whole value (as in an editor's JSON Schema, whose `$` is
    ECMA 262's): `gpu\\n` never reaches #SBATCH."""
    path = spec_file('command: x\nresources: {partition: "gpu\\n"}\n')
    with pytest.raises(SpecError, match="resources.partition: 'gpu\\\\n' has characters"):
        spec_mod.load(str(path), job=True)


def test_an_example_with_braces_is_its_hint_as_written(spec_file):
    path = spec_file("command: x\nlauncher: torchrun\ntorchrun: 8\n")
    with pytest.raises(SpecError) as err:
        spec_mod.load(str(path), job=True)
    assert err.value.key == "torchrun" and err.value.hint == "{nproc_per_node: 8}"
