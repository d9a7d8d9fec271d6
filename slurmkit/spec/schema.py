"""What :data:`.keys.KEYS` looks like to others: the JSON Schema of a spec (``slurmkit schema``,
for editors) and the README's key reference (``make readme-keys``).

The schema (draft-07, which VS Code's YAML extension reads) describes what validation accepts
and never refuses a spec that loads: any value may also be an omegaconf interpolation
(``${oc.env:X}``) or ``???``, and any key that is not required may be null (its default). It is
looser where a check needs more than one value (``requeue.lead`` against ``resources.time``) or
more than a pattern (a Slurm time, an image reference).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any

from .key import Key
from .keys import KEY, KEYS, below

DRAFT = "http://json-schema.org/draft-07/schema#"
BEGIN = "<!-- spec keys: generated from slurmkit/spec/keys.py by `make readme-keys` -->"
END = "<!-- end of spec keys -->"
_LATER = {"$ref": "#/definitions/interpolation"}
_STRINGS = {"type": "array", "items": {"type": "string"}}
# Booleans to the spec loader (YAML 1.1), strings to an editor that reads YAML 1.2.
_YAML11_BOOLS = [
    w for word in ("yes", "no", "on", "off") for w in (word, word.title(), word.upper())
]

# Each kind: its words in the README, and its JSON Schema (None: built from the key).
KINDS: dict[str, tuple[str, dict[str, Any] | None]] = {
    "str": ("string", {"type": "string"}),
    "int": ("integer", {"type": "integer"}),
    "positive": ("integer ≥ 1", {"type": "integer", "minimum": 1}),
    "number": ("number > 0", {"type": "number", "exclusiveMinimum": 0}),
    "bool": ("true/false", {"anyOf": [{"type": "boolean"}, {"enum": _YAML11_BOOLS}]}),
    "switch": ("true/false or a word", None),
    "choice": ("one of", {}),
    "word": ("string or integer", {"type": ["string", "integer"]}),
    "text": ("string or integer", {"type": ["string", "integer"], "minimum": 0}),
    "gpus": ("integer or TYPE:COUNT", {"type": ["string", "integer"], "minimum": 0}),
    "time": ("Slurm time", {"type": ["string", "integer"], "minimum": 0}),
    "command": (
        "string or list",
        {
            "anyOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "minItems": 1, "items": {"type": ["string", "number"]}},
            ]
        },
    ),
    "params": ("mapping", {"type": "object"}),
    "block": ("mapping", None),
    "blocks": ("list of mappings", None),
    "map": ("mapping", None),
    "list": ("list", None),
    "alias": ("", None),
    "scalar": ("string, integer or true/false", {"type": ["string", "integer", "boolean"]}),
    "option": ("string, number or true/false", {"type": ["string", "number", "boolean"]}),
    "paths": ("path or list of paths", {"anyOf": [{"type": "string"}, _STRINGS]}),
    "count": ("integer ≥ 0 or null", {"type": ["integer", "null"], "minimum": 0}),
    "label": ("string or integer", {"type": ["string", "integer"]}),
    "mount": (
        "`SRC[:DST[:FLAGS]]` or mapping",
        {
            "anyOf": [
                {"type": "string"},
                {
                    "type": "object",
                    "properties": {
                        "src": {"type": "string"},
                        "dst": {"type": ["string", "null"]},
                        "flags": {"anyOf": [{"type": "string"}, _STRINGS]},
                    },
                    "required": ["src"],
                    "additionalProperties": False,
                },
            ]
        },
    ),
}
# Where a value is looser than one pattern: a requeue signal is any case, with or without SIG.
_SIGNAL = "^(?:[Ss][Ii][Gg])?(?:%s)$"


def json_schema(config: bool = False) -> dict[str, Any]:
    """The JSON Schema of a spec file (``config``: of the user config instead)."""
    keys = [k for k in below("") if k.config or not config]
    schema: dict[str, Any] = {
        "$schema": DRAFT,
        "title": "slurmkit user config" if config else "slurmkit spec",
        "description": "~/.config/slurmkit/config.yaml: defaults under every spec"
        if config
        else "slurmkit sweep and job specs: `slurmkit schema --help`",
        **_object(keys),
        "definitions": {
            "interpolation": {
                "type": "string",
                "pattern": r"\$\{|^\?\?\?$",
                "description": "an omegaconf interpolation (${oc.env:X}), or ??? (set later)",
            }
        },
    }
    if config:
        schema["properties"]["report"] = {
            "type": "object",
            "description": "`slurmkit report`'s prices (see the README)",
        }
    return schema


def _object(keys: Sequence[Key]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {k.name: _key(k) for k in keys},
        "additionalProperties": False,
        **({"required": required} if (required := [k.name for k in keys if _required(k)]) else {}),
    }


def _required(key: Key) -> bool:
    """Required in the file: unless the user config may give it (``container.image``)."""
    return key.required and not KEY[key.path.partition(".")[0]].config


def _key(key: Key) -> dict[str, Any]:
    """The schema of one key: its value's, or an interpolation, or (unless required) null."""
    if key.kind == "alias":
        target = KEY[f"{key.path.rpartition('.')[0]}.{key.alias}"]
        return {**_key(target), "description": _plain(key.help)}
    value = _value(key)
    ways = [value, _LATER] + ([] if _required(key) else [{"type": "null"}])
    if key.falsy:
        ways.append({"enum": [False, 0, "", [], {}], "description": "not given"})
    out: dict[str, Any] = {"description": _plain(key.help), "anyOf": ways}
    if key.default is not None and not isinstance(key.default, dict):
        out["default"] = key.default
    return out


def _value(key: Key) -> dict[str, Any]:
    if key.kind == "block":
        return _object(below(key.path))
    if key.kind == "blocks":
        return {"type": "array", "items": _object(below(key.path))}
    if key.kind == "map":
        names: dict[str, Any] = {"enum": list(key.choices)} if key.choices else {}
        if key.pattern:
            names["pattern"] = key.pattern
        return {
            "type": "object",
            "propertyNames": names,
            "additionalProperties": _items(key),
        }
    if key.kind == "list":
        listed = {"type": "array", "items": _items(key)}
        # env_keep: one name may stand alone (pyxis.parse)
        return {"anyOf": [_items(key), listed]} if key.path == "container.env_keep" else listed
    if key.kind == "switch":  # true/false (YAML 1.1's words too) or one of its own words
        return {"anyOf": [KINDS["bool"][1], {"enum": list(key.choices)}]}
    base = dict(KINDS[key.kind][1] or {})
    if key.path == "requeue.signal":
        letters = "|".join("".join(f"[{c.upper()}{c.lower()}]" for c in s) for s in key.choices)
        return {"anyOf": [{"enum": list(key.choices)}, {"pattern": _SIGNAL % letters}]}
    if key.choices:
        base["enum"] = list(key.choices)
    if key.pattern:
        base["pattern"] = key.pattern
    if key.maximum is not None:
        base["maximum"] = key.maximum
    return base


def _items(key: Key) -> dict[str, Any]:
    items = dict(KINDS[str(key.items)][1] or {})
    if key.kind == "list" and key.pattern:
        items["pattern"] = key.pattern
    return {"anyOf": [items, _LATER]}


def _plain(text: str) -> str:
    """Markdown's backticks and links dropped, for an editor's hover text."""
    return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text).replace("`", "")


def markdown() -> str:
    """The README's key reference: one row per key, blocks' keys dotted below them."""
    rows = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    for key in KEYS:
        rows.append(f"| `{_shown_path(key)}` | {_type(key)} | {_default(key)} | {key.help} |")
    return "\n".join(rows) + "\n"


def _shown_path(key: Key) -> str:
    head, _, tail = key.path.partition(".")
    return f"{head}[].{tail}" if tail and KEY[head].kind == "blocks" else key.path


def _type(key: Key) -> str:
    if key.kind == "alias":
        return f"as `{key.alias}`"
    if key.kind == "switch":
        return "true/false \\| " + " \\| ".join(f"`{c}`" for c in key.choices)
    if key.choices and key.kind != "map":
        return " \\| ".join(f"`{c}`" for c in key.choices)
    words = KINDS[key.kind][0]
    if key.items:
        words += f" of {KINDS[key.items][0]}"
    return words


def _default(key: Key) -> str:
    if key.required:
        return "required"
    if key.shown is not None:
        return key.shown
    if key.default is None:
        return ""
    if isinstance(key.default, dict):
        return ", ".join(f"{k}: {_yaml(v)}" for k, v in key.default.items())
    return f"`{_yaml(key.default)}`"


def _yaml(value: Any) -> str:
    return json.dumps(value) if value is None or isinstance(value, bool) else str(value)


def readme(text: str) -> str:
    """``text`` (README.md) with its key reference (between the markers) generated again."""
    begin, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[:begin] + "\n\n" + markdown() + "\n" + text[end:]


def main(argv: Sequence[str] | None = None) -> None:
    """``--markdown``: print the key reference; ``--readme FILE``: write it into FILE between
    the markers; else print the JSON Schema (``--config``: of the user config)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--markdown"]:
        sys.stdout.write(markdown())
    elif args[:1] == ["--readme"] and len(args) == 2:
        with open(args[1], encoding="utf-8") as f:
            text = f.read()
        with open(args[1], "w", encoding="utf-8") as f:
            f.write(readme(text))
    else:
        print(json.dumps(json_schema(config="--config" in args), indent=2))


if __name__ == "__main__":
    main()
