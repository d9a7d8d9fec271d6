"""Other libraries' private names, CPython's included, appear only in their shim: one module per
library (:data:`SHIMS`), whose docstring names each and the versions tested; everywhere else
slurmkit uses public APIs. (The in-job shims live under ``runtime/``, which imports nothing of
the login side.)

What is read from the source: imports of a private module or name (``from _sha2 import ...``,
``from submitit.x import _y``), a private attribute of an imported module (``atexit._x``,
``torch.serialization._load``) and ``getattr``/``hasattr``/``setattr`` with a private name
(``getattr(re, "_cache")``). Private methods that a subclass overrides are not seen here.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from slurmkit.compat import s3fs as s3compat

ROOT = Path(__file__).resolve().parent.parent
PUBLIC = {"os._exit", "sys._getframe"}  # documented, despite the underscore
NAMEDTUPLE = {"_fields", "_asdict", "_replace", "_make"}  # a named tuple's public API
SHIMS = {  # module: the library whose private names it alone may use
    "slurmkit/compat/s3fs.py": "s3fs",
    "slurmkit/submitit_adapter.py": "submitit",
    "slurmkit/runtime/torchcompat.py": "torch",
    "slurmkit/runtime/pycompat.py": "threading",  # CPython's
}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_names(source: str) -> set[str]:
    """The private names of other modules that ``source`` uses (see the module docstring)."""
    tree = ast.parse(source)
    modules: set[str] = set()  # names bound to a module that is not slurmkit's
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "slurmkit":
                    modules.add(alias.asname or alias.name.split(".")[0])
                    if any(map(_private, alias.name.split("."))):
                        found.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] == "slurmkit":
                continue
            if any(map(_private, node.module.split("."))):
                found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if _private(a.name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            base = node.value
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in modules:
                found.add(ast.unparse(node))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr", "setattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and node.args[1].value not in NAMEDTUPLE
        ):
            found.add(f"{ast.unparse(node.args[0])}.{node.args[1].value}")
    return found - PUBLIC


@functools.cache
def _sites() -> set[tuple[str, str]]:
    sites = set()
    for path in sorted((ROOT / "slurmkit").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        sites.update((rel, name) for name in private_names(path.read_text()))
    return sites


@pytest.mark.parametrize(
    "source, names",
    [
        ("from _sha2 import sha256", {"_sha2"}),
        ("import re\n_c = getattr(re, '_cache', None)", {"re._cache"}),
        ("import atexit\natexit._run_exitfuncs()", {"atexit._run_exitfuncs"}),
        ("def f(fs):\n    return hasattr(fs, '_call_s3')", {"fs._call_s3"}),
        ("from submitit.x import _make", {"submitit.x._make"}),
        ("def f(obj):\n    return getattr(obj, '_fields')", set()),
        ("import os, sys\nos._exit(0)\nsys._getframe()", set()),
        ("from hashlib import sha256\nfrom . import _local\nx._y = self._z", set()),
    ],
)  # fmt: skip
def test_private_names_are_read_from_the_source(source, names):
    assert private_names(source) == names


@pytest.mark.slow  # reads every module; the reader's own cases above stay in make unit
def test_no_private_name_of_another_library_outside_its_shim():
    outside = {(rel, name) for rel, name in _sites() if rel not in SHIMS}
    assert not outside, f"private names of other libraries outside their shim: {sorted(outside)}"


@pytest.mark.slow
def test_each_shim_reaches_into_its_one_library_and_names_what_and_which_versions():
    for rel, library in SHIMS.items():
        text = (ROOT / rel).read_text()
        doc = ast.get_docstring(ast.parse(text)) or ""
        assert "tested" in doc.lower(), f"{rel}: its docstring names no versions tested"
        for _, name in {site for site in _sites() if site[0] == rel}:
            root = name.split(".")[0]
            assert root in (library, "fs"), f"{rel} reaches into {name}, not {library}"
            private = next(part for part in name.split(".") if part.startswith("_"))
            assert private in doc, f"{rel}: its docstring does not name {private}"


def test_the_s3fs_shim_names_what_it_uses():
    doc = s3compat.__doc__ or ""
    assert "_call_s3" in doc and "Tested with s3fs" in doc

    class FS:
        async def _call_s3(self, method: str, **kw: str) -> tuple[str, dict]:
            return method, kw

    assert s3compat.can_call(FS()) and not s3compat.can_call(object())
    coro = s3compat.call(FS(), "get_object", Bucket="b")
    with pytest.raises(StopIteration) as done:
        coro.send(None)
    assert done.value.value == ("get_object", {"Bucket": "b"})
