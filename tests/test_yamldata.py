"""The spec's data path (no omegaconf) against omegaconf's: the same specs, the same merged and
overridden keys, the same errors; anything else goes to omegaconf."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf
from omegaconf._utils import get_yaml_loader
from spec_examples import BAD_INPUT, GOOD, JOB

from slurmkit import spec as spec_mod
from slurmkit.errors import SpecError
from slurmkit.spec import layers, yamldata

ROOT = Path(__file__).resolve().parent.parent
SWEEPS = sorted(str(p) for p in (ROOT / "sweeps").glob("*.yaml"))

USER_CONFIGS = {
    "none": None,
    "empty": "",
    "full": "resources: {partition: gpu, account: ml, time: '1:00:00'}\noutput_root: /shared/runs\n"
    "profile: sunk\nenv: {NCCL_IB_HCA: mlx5}\ncontainer: {mounts: [/mnt/data]}\n",
    "requeue": "requeue: {signal: USR1, budgets: {timeout: 5}}\nenv: {A: 1}\n",
    "bad-key": "partition: gpu\n",
    "list": "- a\n",
    "interpolation": "output_root: ${oc.env:HOME}/runs\n",
    "missing": "output_root: ???\n",
    "malformed": "resources: {a: [1\n",
    "duplicate": "env: {A: 1}\nenv: {B: 2}\n",
    "base-60": "resources: {time: 1:30:00, cpus_per_task: 2}\nenv: {T: 15:00}\n",
    "env-float": "env: {LR: 1e-3}\n",
}

BODIES = [
    GOOD,
    JOB,
    "command: x\nparams: {a: [1]}\n",
    "name: n\ncommand: [python, t.py, 3]\nparams:\n  a: 1e-5\n  b: [1_000, 0x1f, 0o17, .5, 1.]\n"
    "  c: [yes, no, on, off, ~, null, 2001-12-14, '2001-12-14', 1:30, 1.5e3]\n"
    "  d: {e: {f: 'x,y'}}\n",
    "command: x\nparams: {a: [1]}\nresources: &r {partition: low}\nenv: {A: 1, B: two, C: true}\n",
    "base: &b {partition: low, time: '1:00'}\ncommand: x\nparams: {a: [1]}\nresources:\n  <<: *b\n"
    "  partition: high\n",
    "command: x\nparams: {a: [1]}\ncontainer: {image: /img.sqsh, mounts: [/mnt/a]}\n",
    "command: x\nparams: {a: [1]}\ncontainer: null\n",
    "command: x\nparams: {a: [1]}\ncontainer: {mounts: [/mnt/a]}\n",
    "command: x\nparams: {a: [1]}\nprofile: sunk-gb200\nenv: {UCX_TLS: rc}\n",
    "command: x\nparams: {a: [1]}\nprofile: nope\n",
    "command: x\nparams: {a: [1]}\nprofile: {a: 1}\n",
    "command: x\nparams: {a: [1]}\nprofile: null\n",
    "command: x\nparams: {a: [1]}\nname: ${oc.env:USER}\n",
    "command: x\nparams: {a: [1]}\nname: '\\${x}'\n",
    "command: x\nparams: {a: [1]}\nname: ???\n",
    "command: x\nparams: {a: ['${x}']}\n",
    "command: x\nparams: {a: [1]}\nname: n\nname: m\n",
    "command: x\nparams: {a: [1]}\nresources: {time: !!timestamp 2001-12-14}\n",
    "command: x\nparams: {a: [1]}\nworkdir: !!python/object/apply:pathlib.Path [/tmp]\n",
    "command: x\nparams: {a: [1]}\nenv: !!binary aGVsbG8=\n",
    "command: x\nparams: {1: [1], 2.5: [2], true: [3], null: [4]}\n",
    "command: x\nparams: {a: [1]}\n'': 1\n",
    "command: x\nparams: {a: [1]}\nresources: [1, 2]\n",
    "- command\n",
    "just a string\n",
    "",
    "command: x\nparams: {a: [1, 2\n",
    "command: x\nparams: {a: [1], t: 1:30}\nresources: {time: 15:00}\nenv: {T: 1:00:00}\n",
    "command: x\nparams: {a: [1]}\nenv: {LR: 1e-3}\n",
    "command: x\nparams: {a.b: [1], a: {b: [2]}}\n",
    "command: x\nparams: {a: [1]}\nresources: {cpus: 1, cpus_per_task: 2}\n",
    "command: x\nparams: {a: [1]}\nresources: {gpus_per_node: 2}\ncontainer: [a]\n",
    "command: x\nparams: {a: &a [1, *a]}\n",
    'command: "x\\0"\nparams: {a: [1]}\n',
]

OVERRIDES = [
    [],
    [
        "resources.time=2:00:00",
        "max_parallel=3",
        "params.a=1,2",
        "~params.a",
        "params.b=range(0,4)",
    ],
    ["resources.partition=gpu", "+resources.qos=high", "++env.X=1", "~resources.partition"],
    ["resources={partition: low, nodes: 2}", "env.Y=[1,2]", "name=${x}", "seed=???"],
    ["resources=5"],
    ["name.x=1", "command.0=python", "command=[a, b]", "env.A.B=1"],
    ["~env", "~env.A", "~nope", "~resources.nope.deeper", "~command.0"],
    ["profile=sunk", "container.image=/i.sqsh"],
    ["profile=none", "~profile"],
    ["profile=a,b"],
    ["resources.time=1:00,2:00"],
    ["env.Z={1: a}", "env.W={a: ${b}}", "workdir='/a b'", "name=null"],
    ["params.=1"],
    ["=1", "a=(("],
    ["_private=1", "db/mysql=1", "pkg@grp=1", "$x=1"],
]


def _outcome(fn, *args, **kwargs):
    try:
        return "ok", fn(*args, **kwargs)
    except Exception as exc:  # the same error: its type, message and named file and key
        return "error", (
            type(exc),
            str(exc),
            getattr(exc, "file", None),
            getattr(exc, "key", None),
            getattr(exc, "hint", None),
        )


def _deep(value):
    """``value`` with the order of every mapping's keys made visible to ``==``."""
    if isinstance(value, dict):
        return [(k, _deep(v)) for k, v in value.items()]
    if isinstance(value, list):
        return [_deep(v) for v in value]
    return value


def _omegaconf_only(monkeypatch):
    def refuse(*_args):
        raise yamldata.NeedsOmegaConf("refused")

    monkeypatch.setattr(yamldata, "load", refuse)


def _compare(path, overrides, monkeypatch):
    """Both paths give the same spec or error; return whether the data path had the answer."""
    data = _outcome(layers.resolve_data, path, overrides)
    fast = _outcome(spec_mod.load, path, overrides)
    with monkeypatch.context() as m:
        _omegaconf_only(m)
        slow = _outcome(spec_mod.load, path, overrides)
        reference = _outcome(layers.resolve_omegaconf, path, overrides)
    assert fast == slow
    if fast[0] == "ok":
        assert fast[1].params_text == slow[1].params_text
    if data[0] == "ok":  # whatever the data path gives, omegaconf gives it too
        assert reference[0] == "ok" and _deep(data[1][0]) == _deep(reference[1][0])
    return data[0] == "ok" or data[1][0] is SpecError


@pytest.mark.parametrize(
    "user,overrides",
    [  # two overrides with each user config; every override with none and a full one (slow)
        pytest.param(user, overrides, marks=[pytest.mark.slow] if n >= 2 else [])
        for user in USER_CONFIGS
        for n, overrides in enumerate(OVERRIDES)
        if user in ("none", "full") or n < 2
    ],
    ids=lambda o: "|".join(o) or "-" if isinstance(o, list) else o,
)
def test_bodies_both_paths(tmp_path, monkeypatch, user, overrides):
    if USER_CONFIGS[user] is not None:
        (tmp_path / "config.yaml").write_text(USER_CONFIGS[user])
        monkeypatch.setenv("SLURMKIT_CONFIG", str(tmp_path / "config.yaml"))
    for n, body in enumerate(BODIES):
        path = tmp_path / f"s{n}.yaml"
        path.write_text(body)
        _compare(str(path), overrides, monkeypatch)


@pytest.mark.parametrize("path", [*SWEEPS, "bad-table"])
def test_shipped_and_test_specs_take_the_data_path(tmp_path, monkeypatch, path):
    cases = [(path, [])] if path != "bad-table" else []
    for n, (body, overrides, *_) in enumerate(BAD_INPUT if path == "bad-table" else []):
        (tmp_path / f"b{n}.yaml").write_text(body)
        cases.append((str(tmp_path / f"b{n}.yaml"), overrides))
    for spec_path, overrides in cases:
        assert _compare(spec_path, overrides, monkeypatch)
    if path != "bad-table":
        assert _compare(path, ["resources.time=1:00:00", "resources.partition=low"], monkeypatch)


def test_data_specs_do_not_import_omegaconf(tmp_path):
    import subprocess
    import sys

    code = (
        "import sys; from slurmkit import spec, plan; s = spec.load(sys.argv[1], job=True); "
        "plan.expand(s); assert 'omegaconf' not in sys.modules, 'omegaconf imported'"
    )
    for path in SWEEPS:
        proc = subprocess.run(
            [sys.executable, "-c", code, path],
            capture_output=True,
            text=True,
            env={"SLURMKIT_CONFIG": "/dev/null", "PATH": "/usr/bin:/bin"},
        )
        assert proc.returncode == 0, proc.stderr


BASE_60 = "(?::[0-5]?[0-9])+"  # YAML 1.1's sexagesimal ints and floats: 15:00 is 900


def _alternatives(regexp):
    """A resolver's pattern as its alternatives (one a line in these verbose patterns)."""
    body = regexp.pattern.strip().removeprefix("^(?:").removesuffix(")$")
    return [alt.strip().removeprefix("|") for alt in body.splitlines() if alt.strip()]


def test_loader_is_omegaconfs():
    """Our loader is omegaconf's minus its pathlib tags and minus the sexagesimal forms of ints
    and floats: ``15:00`` stays a string (Slurm's 15 minutes), not the int 900."""
    theirs = get_yaml_loader()
    removed = set()
    expected = {}
    for first, resolvers in theirs.yaml_implicit_resolvers.items():
        expected[first] = []
        for tag, regexp in resolvers:
            alternatives = _alternatives(regexp)
            removed.update((tag, a) for a in alternatives if BASE_60 in a)
            kept = [a for a in alternatives if BASE_60 not in a]
            expected[first].append((tag, kept, regexp.flags))
    assert {tag for tag, _ in removed} == {"tag:yaml.org,2002:int", "tag:yaml.org,2002:float"}
    assert len(removed) == 3  # PyYAML's int and float, omegaconf's float
    assert {
        first: [(tag, _alternatives(regexp), regexp.flags) for tag, regexp in resolvers]
        for first, resolvers in yamldata.Loader.yaml_implicit_resolvers.items()
    } == expected
    pathlib_tags = {t for t in theirs.yaml_constructors if "pathlib" in str(t)}
    assert len(pathlib_tags) == 3
    assert {
        t: c for t, c in theirs.yaml_constructors.items() if t not in pathlib_tags
    } == yamldata.Loader.yaml_constructors
    docs = [
        "a: 1e-5\nb: 1.5\nc: .inf\nd: 2001-12-14\nf: 0x10\ng: [on, y, ~]\nh: 12:61\n",
        "a: {b: &x [1, {c: 2}], d: *x}\n",
        "a: !!set {x, y}\n",
    ]
    for doc in docs:
        assert yaml.load(doc, Loader=yamldata.Loader) == yaml.load(doc, Loader=theirs)
    # the sexagesimal expectations: these were 80, 900, 3600, -90, 5400 and 90.5 (as omegaconf's)
    for text in ["1:20", "15:00", "1:00:00", "-1:30", "+1:30:00", "1:30.5"]:
        assert yaml.load(f"e: {text}\n", Loader=theirs)["e"] != text
        assert yaml.load(f"e: {text}\n", Loader=yamldata.Loader) == {"e": text}
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key a"):
        yaml.load("a: 1\na: 2\n", Loader=yamldata.Loader)


def _outcome_of(load) -> tuple:
    try:
        return ("ok", load())
    except SpecError as exc:
        return ("SpecError", exc.message, exc.key)
    except yaml.YAMLError:
        return ("YAMLError",)


@pytest.mark.slow
def test_libyaml_events_load_what_pyyamls_parser_loads(tmp_path):
    """read()'s loader (libyaml's events, PyYAML's composer and constructor) gives the same data
    and the same SpecErrors as PyYAML's own parser on every spec here, and on 2,000 mangled copies
    of them (cut short, a character doubled or dropped: mostly malformed). Where libyaml refuses
    (it is stricter: ``{a:[1]}``), read() asks PyYAML's parser, so read() always answers as
    PyYAML does, and words malformed YAML as PyYAML does (a tab that starts a token)."""
    texts = [*BODIES, *(body for body, *_ in BAD_INPUT), *(Path(p).read_text() for p in SWEEPS)]
    texts += ["a: [" * 70 + "]" * 70, "a: 'x\\0'\nb: \"y\\0\"\n", "env: {A: 1e-3}\n"]
    texts += [f"a: {tag}\n" for tag in ["!!int x", "!!bool maybe", "!!float x", "!", "! 1", "&x"]]
    rng = random.Random(7)
    for _ in range(2000):
        text = rng.choice(texts)
        at = rng.randrange(len(text) + 1)
        texts.append(
            rng.choice([text[:at], text[:at] + text[at : at + 1] * 2 + text[at + 1 :]])
            if rng.random() < 0.7
            else text[:at] + text[at + 1 :]
        )
    kinds, deferred = set(), 0
    path = tmp_path / "f.yaml"
    for text in texts:
        path.write_text(text)
        fast = _outcome_of(yamldata.Loader(text, str(path)).get_single_data)
        reference = _outcome_of(yamldata.Worded(text, str(path)).get_single_data)
        assert _outcome_of(lambda: yamldata.read(str(path))) == reference, text
        assert fast == reference or fast == ("YAMLError",), text
        deferred += fast != reference
        kinds.add(reference[0])
    assert kinds == {"ok", "SpecError", "YAMLError"} and 0 < deferred < len(texts) // 10
    path.write_text("a:\n\tb: 1\n")
    with pytest.raises(yaml.YAMLError, match="found character '\\\\t' that cannot start any token"):
        yamldata.read(str(path))
    path.write_text("a: !!timestamp 2001-12-114\n")  # PyYAML's constructor: an AttributeError
    with pytest.raises(yaml.YAMLError, match="cannot read '2001-12-114' as tag:yaml.org"):
        yamldata.read(str(path))


def _tree(rng: random.Random, depth: int = 0) -> dict:
    keys = ["a", "b", "c", "d"]
    out = {}
    for key in rng.sample(keys, rng.randint(0, len(keys))):
        out[key] = _value(rng, depth)
    return out


def _value(rng: random.Random, depth: int):
    roll = rng.random()
    if roll < 0.3 and depth < 3:
        return _tree(rng, depth + 1)
    if roll < 0.45:
        return [rng.choice([1, "x", None, 2.5]) for _ in range(rng.randint(0, 2))]
    return rng.choice([None, 0, 1, -1.5, True, False, "", "s", "0.1", "${a}", "???"])


@pytest.mark.slow
def test_merge_update_delete_match_omegaconf_on_random_trees():
    rng = random.Random(0)
    checked = 0
    for _ in range(3000):
        layers = [_tree(rng) for _ in range(rng.randint(1, 3))]
        ops = [
            (
                rng.choice(["set", "del"]),
                ".".join(rng.choices("abcd", k=rng.randint(1, 3))),
                _value(rng, 2),
            )
            for _ in range(rng.randint(0, 3))
        ]
        try:
            ours = yamldata.merge(*(yamldata.as_data(layer) for layer in layers))
            for op, key, value in ops:
                if op == "set":
                    yamldata.update(ours, key, value)
                else:
                    yamldata.delete(ours, key)
        except yamldata.NeedsOmegaConf:
            continue
        theirs = OmegaConf.merge(*map(OmegaConf.create, layers))
        for op, key, value in ops:
            if op == "set":
                OmegaConf.update(theirs, key, value, force_add=True, merge=False)
            else:
                parent, _, leaf = key.rpartition(".")
                node = OmegaConf.select(theirs, parent) if parent else theirs
                del node[leaf]
        assert _deep(ours) == _deep(OmegaConf.to_container(theirs, resolve=True)), (layers, ops)
        checked += 1
    assert checked > 500


@pytest.mark.slow
def test_specs_load_where_pyyaml_has_no_libyaml(tmp_path):
    """PyYAML built without libyaml: the loader is PyYAML's own parser, with the same checks."""
    import subprocess
    import sys

    (tmp_path / "s.yaml").write_text("command: x\nparams: {lr: [1e-3, 2]}\nenv: {A: 1e-3}\n")
    code = (
        "import yaml; yaml.__with_libyaml__ = False\n"
        "from slurmkit.spec import yamldata\n"
        "from slurmkit.errors import SpecError\n"
        "assert yamldata.Loader is yamldata.Worded\n"
        "try:\n"
        f"    yamldata.read({str(tmp_path / 's.yaml')!r})\n"
        "except SpecError as exc:\n"
        "    print(exc.key, exc.message)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "env.A 1e-3 is a YAML float: the job would see '0.001'\n"
