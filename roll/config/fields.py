"""Field helpers for the typed config: every field carries a help text and, where it applies, its choices.

OmegaConf structured configs do not accept ``Literal`` types, so a choice field is a ``str`` whose allowed values
live in the field's metadata; :func:`roll.config.validation.check_choices` enforces them for every dataclass.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence


def fld(default: Any = dataclasses.MISSING, help: str = "", choices: Sequence[Any] | None = None,
        default_factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with a one-line ``help`` text and optional ``choices``."""
    metadata = {"help": help}
    if choices is not None:
        metadata["choices"] = tuple(choices)
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def help_of(cls: type, name: str) -> str:
    """The help text of field ``name`` of dataclass ``cls``."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            return f.metadata.get("help", "")
    raise KeyError(name)


def nested_dataclasses(cls: type) -> list[type]:
    """``cls`` and every dataclass reachable from its field types (through Optional/List/Dict), in first-seen
    order."""
    import typing

    order: list[type] = []
    todo = [cls]
    while todo:
        current = todo.pop(0)
        if current in order:
            continue
        order.append(current)
        for hint in typing.get_type_hints(current).values():
            stack = [hint]
            while stack:
                t = stack.pop()
                if dataclasses.is_dataclass(t) and isinstance(t, type):
                    todo.append(t)
                stack.extend(typing.get_args(t))
    return order


def fields_without_help(cls: type) -> list[str]:
    """``Class.field`` names, over ``cls`` and its nested dataclasses, whose help text is missing or empty."""
    return [f"{c.__name__}.{f.name}" for c in nested_dataclasses(cls) for f in dataclasses.fields(c)
            if not str(f.metadata.get("help", "")).strip()]
