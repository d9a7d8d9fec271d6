"""slurmkit.yamlimport: PyYAML's NON_PRINTABLE pattern swapped for a cheaper one of the same set."""

from __future__ import annotations

import re
import subprocess
import sys

from slurmkit.yamlimport import NON_PRINTABLE, SAME_SET

EVERY_CODE_POINT = "".join(map(chr, range(0x110000)))


def test_both_patterns_match_exactly_the_same_code_points() -> None:
    slow = [m.start() for m in re.compile(NON_PRINTABLE).finditer(EVERY_CODE_POINT)]
    fast = [m.start() for m in re.compile(SAME_SET).finditer(EVERY_CODE_POINT)]
    assert fast == slow
    assert len(fast) == 2111  # C0 but tab/LF/CR, DEL..x84, x86..x9F, surrogates, FFFE/FFFF


def fresh(code: str) -> str:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_pyyaml_compiles_the_pattern_we_name() -> None:
    """If PyYAML ever changes its pattern, the seed silently stops helping: say so here."""
    code = "import yaml; print(ascii(yaml.reader.Reader.NON_PRINTABLE.pattern))"
    assert fresh(code) == ascii(NON_PRINTABLE)


def test_pyyaml_takes_the_cheap_pattern_and_still_refuses_what_it_refused() -> None:
    out = fresh(
        "from slurmkit.yamlimport import yaml\n"
        "print(yaml.reader.Reader.NON_PRINTABLE.pattern == "
        "__import__('slurmkit.yamlimport').yamlimport.SAME_SET)\n"
        "for text in ('a: 1', 'a: \\x07', 'a: \\ufffe', 'a: \\u00e9'):\n"
        "    try:\n"
        "        yaml.safe_load(text); print('ok')\n"
        "    except yaml.reader.ReaderError:\n"
        "        print('refused')\n"
    )
    assert out.split() == ["True", "ok", "refused", "refused", "ok"]
