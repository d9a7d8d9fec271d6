"""``@record``: a dataclass without generated code, for the classes every command loads.

``dataclasses.dataclass`` writes ``__init__``, ``__repr__``, ``__eq__``, ``__hash__`` (and, when
frozen, ``__setattr__``/``__delattr__``) as source text and compiles it when the class is
created: about 5M instructions (~1 ms) a class, some 50M of a ``slurmkit sweep`` that loads a
dozen of them. ``@record`` makes the same dataclass (fields, defaults, ``default_factory``,
``dataclasses.fields``/``replace``/``asdict``, ``__match_args__``) with generic, already compiled
methods that read the fields from a table built once per class: it costs about a sixth. A
record is frozen unless ``frozen=False``; it compares, hashes (when frozen) and prints like the
dataclass it replaces, field options (``compare``, ``hash``, ``repr``, ``init``) included.
``tests/test_record.py`` checks each behaviour against ``dataclass`` itself. Not supported (a
TypeError at decoration): ``__post_init__``, keyword-only fields, inheritance between records;
nor ``InitVar``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, FrozenInstanceError, dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:

    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda decorator: decorator


T = TypeVar("T")


class _Table:
    """What the generic methods need to know of one record class."""

    __slots__ = ("compare", "frozen", "hashed", "init", "later", "name", "shown")

    def __init__(self, cls: type, frozen: bool) -> None:
        fs = fields(cls)
        self.name = cls.__name__
        self.frozen = frozen
        self.init = tuple((f.name, f.default, f.default_factory) for f in fs if f.init)
        self.later = tuple((f.name, f.default, f.default_factory) for f in fs if not f.init)
        self.shown = tuple(f.name for f in fs if f.repr)
        self.compare = tuple(f.name for f in fs if f.compare)
        self.hashed = tuple(f.name for f in fs if (f.compare if f.hash is None else f.hash))


def _value(default: Any, factory: Any) -> Any:
    return factory() if factory is not MISSING else default


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    table: _Table = type(self).__record__
    if len(args) > len(table.init):
        raise TypeError(
            f"{table.name}() takes {len(table.init)} positional arguments but {len(args)} "
            "were given"
        )
    put = object.__setattr__
    for (name, _, _), value in zip(table.init, args):
        if name in kwargs:
            raise TypeError(f"{table.name}() got multiple values for argument {name!r}")
        put(self, name, value)
    for name, default, factory in table.init[len(args) :]:
        if name in kwargs:
            put(self, name, kwargs.pop(name))
        elif default is MISSING and factory is MISSING:
            raise TypeError(f"{table.name}() missing 1 required argument: {name!r}")
        else:
            put(self, name, _value(default, factory))
    if kwargs:
        raise TypeError(f"{table.name}() got an unexpected keyword argument {next(iter(kwargs))!r}")
    for name, default, factory in table.later:
        if default is not MISSING or factory is not MISSING:
            put(self, name, _value(default, factory))


def _repr(self: Any) -> str:
    shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in type(self).__record__.shown)
    return f"{type(self).__qualname__}({shown})"


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = type(self).__record__.compare
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, n) for n in type(self).__record__.hashed))


def _setattr(self: Any, name: str, value: Any) -> None:
    raise FrozenInstanceError(f"cannot assign to field {name!r}")


def _delattr(self: Any, name: str) -> None:
    raise FrozenInstanceError(f"cannot delete field {name!r}")


def _make(cls: type[T], frozen: bool) -> type[T]:
    if "__post_init__" in cls.__dict__ or any("__record__" in vars(b) for b in cls.__mro__[1:]):
        raise TypeError(f"{cls.__name__}: @record takes no __post_init__ and no record base")
    made: Any = dataclass(init=False, repr=False, eq=False)(cls)
    if any(f.kw_only is True for f in fields(made)):
        raise TypeError(f"{cls.__name__}: @record takes no keyword-only fields")
    made.__record__ = _Table(made, frozen)
    made.__init__ = _init
    made.__repr__ = _repr
    made.__eq__ = _eq
    if frozen:
        made.__hash__ = _hash
        made.__setattr__ = _setattr
        made.__delattr__ = _delattr
    else:
        made.__hash__ = None  # like a mutable dataclass with eq
    made_type: type[T] = made
    return made_type


@overload
def record(cls: type[T], /) -> type[T]: ...
@overload
def record(*, frozen: bool = True) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[T] | None = None, /, *, frozen: bool = True) -> Any:
    """``@record`` or ``@record(frozen=False)``: see the module's docstring."""
    if cls is None:
        return lambda c: _make(c, frozen)
    return _make(cls, frozen)
