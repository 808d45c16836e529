"""`evolve(obj, **changes)`: dataclasses.replace for the engine's hot path.

dataclasses.replace builds its keyword arguments from every field and calls __init__,
which for a frozen dataclass sets each field through object.__setattr__: ~4.6 us for a
Job, where a copy of the instance's __dict__ costs ~0.9 us. A job's turns replace a
dozen records, so the copy is taken where it means the same: a plain frozen or mutable
dataclass with the generated __init__ and neither __post_init__ nor __slots__ nor an
init=False field (whose replace would build it anew). Any other class, or a name that
is not an init field, goes through dataclasses.replace (which raises for the latter).
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

T = TypeVar("T")

_fields: dict[type, frozenset[str] | None] = {}  # None: the class needs dataclasses.replace


def _copyable(cls: type) -> frozenset[str] | None:
    # ClassVars and InitVars are not fields: an InitVar means something only to a
    # __post_init__ (such a class goes through replace), and one named in `changes` is not
    # an init field here, so that call goes through replace too.
    fields = dataclasses.fields(cls)
    if (
        not cls.__dataclass_params__.init  # type: ignore[attr-defined]  # its own __init__
        or hasattr(cls, "__post_init__")
        or "__slots__" in cls.__dict__
        or any(not f.init for f in fields)
    ):
        return None
    return frozenset(f.name for f in fields)


def evolve(obj: T, **changes: Any) -> T:
    """A copy of the dataclass instance `obj` with `changes`, as dataclasses.replace."""
    cls = type(obj)
    try:
        names = _fields[cls]
    except KeyError:
        names = _fields[cls] = _copyable(cls)
    if names is None or not names.issuperset(changes):
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    new = object.__new__(cls)
    state = new.__dict__
    state.update(obj.__dict__)
    state.update(changes)
    return new
