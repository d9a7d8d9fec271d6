"""One spec key's record (:class:`Key`) and the kinds of value a key may have: the rows of
:data:`slurmkit.spec.keys.KEYS`. Stdlib only: every submit imports it."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from ..core.record import record

# The kinds of value (see schema.KINDS for what each is in JSON Schema and in the README):
#   str, int, bool          a YAML string, integer (not a boolean), boolean
#   positive                an integer >= 1
#   choice                  one of ``choices`` (no type check first: ``5 is not allowed``)
#   word                    a string; an integer is taken as its text (``switches: 1``)
#   text                    any value, taken as its text (``mem: 16384``)
#   gpus, time, command     a GPU count, a Slurm time, a command line (validate.py reads them)
#   params                  the search space (validate.param_space)
#   block                   a mapping of the keys below it (``resources.time`` is in ``resources``)
#   blocks                  a list of such mappings (``data``: ``data.src`` is each item's src)
#   map                     names to values (``env``) of the kind ``items``; ``pattern`` is the
#                           names' (``choices``: the names allowed)
#   list                    a list of ``items`` (``container.mounts``); ``pattern`` is theirs
#   alias                   another name of the key ``alias`` (``cpus_per_task`` is ``cpus``)
# and, as ``items`` only: scalar (a string, integer or boolean), option (a string, number or
# boolean), paths (a path or a list of them), count (an integer >= 0, or null), label (a
# string or integer), mount (``SRC[:DST[:FLAGS]]`` or ``{src, dst, flags}``).


@record
class Key:
    """One spec key. ``path`` is dotted (an item of a ``blocks`` list has its list's path:
    ``data.src``); ``mismatch`` and ``hint`` word the error of a value (of a map: a name)
    that fails ``choices``, ``pattern`` or ``maximum`` (``{value!r}``, ``{type}``,
    ``{allowed}``, ``{maximum:,}`` filled in; by default ``... is not allowed``); a block or map
    that is no mapping is ``must be a mapping of WHAT`` (a block's ``mismatch`` if it has one)
    with ``example`` as its hint (a block's default: its allowed keys). ``config``: the user
    config may set it too; ``resumable``: ``sweep --resume DIR KEY=VALUE`` may change it;
    ``checked``: the function that checks the value when the generic checks do not (the table
    still describes it); ``falsy``: any false value is "not given", as it always was there."""

    path: str
    kind: str
    help: str
    default: Any = None  # None: not given (what a YAML null also says)
    shown: str | None = None  # the default as the README shows it, where it is computed
    required: bool = False
    choices: tuple[str, ...] = ()
    pattern: str | None = None  # a value's text matches it (Python's re and ECMA 262 alike)
    mismatch: str | None = None
    hint: str | None = None
    maximum: int | None = None
    what: str | None = None
    items: str | None = None  # the kind of a map's values or a list's items
    example: str | None = None
    alias: str | None = None
    config: bool = False
    resumable: bool = False
    checked: str | None = None
    falsy: bool = False  # any false value (false, 0, '', [], {}) counts as not given

    @cached_property
    def name(self) -> str:
        """The key's own name (the last part of its path)."""
        return self.path.rpartition(".")[2]
