"""PyYAML, imported at about half its cost: ``from slurmkit.yamlimport import yaml``.

At import, PyYAML's ``Reader`` compiles ``NON_PRINTABLE``, a negated character class over all of
Unicode; ``re`` takes ~57M instructions (about 9 ms here) to optimise it, more than half of what
``import yaml`` costs, on every command that reads a spec. :data:`SAME_SET` is the same set of
code points written as the few small ranges outside it, which compiles in a fraction of that.
``re`` looks up compiled patterns by their text before compiling, so putting the cheap pattern
in that cache under the expensive one's text makes PyYAML's ``re.compile`` return it.
``tests/test_yamlimport.py`` checks that both match exactly the same code points, and that
PyYAML took the cheap one. Where ``re`` keeps no such cache (another Python), nothing changes.
"""

from __future__ import annotations

import re
import sys

NON_PRINTABLE = "[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]"
"""The text of ``yaml.reader.Reader.NON_PRINTABLE`` (PyYAML 5.1 to 6.x)."""
SAME_SET = "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]"
"""The code points that :data:`NON_PRINTABLE` matches, as ranges that compile quickly."""

_cache = getattr(re, "_cache", None)
if "yaml" not in sys.modules and isinstance(_cache, dict):
    _cache[(str, NON_PRINTABLE, 0)] = re.compile(SAME_SET)

import yaml  # noqa: E402

__all__ = ["yaml"]
