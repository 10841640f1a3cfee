"""Field helpers for the typed config: every field carries a help text and, where it applies, its choices or its
allowed range.

OmegaConf structured configs do not accept ``Literal`` types, so a choice field is a ``str`` whose allowed values
live in the field's metadata; a numeric field may carry its range as text (``allowed="in (0, 1]; 1 = off"``), which
is both the rule (:func:`in_range`) and what docs/config.md shows. :func:`roll.config.validation.check_choices`
enforces both for every dataclass (the strategy options: :func:`roll.config.strategies.parse_options`). A rule on
one field lives on that field; the rules that span fields live in :mod:`roll.config.validation` and in each
pipeline's ``check_pipeline``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from roll.config.errors import ConfigError


def fld(
    default: Any = dataclasses.MISSING,
    help: str = "",
    choices: Sequence[Any] | None = None,
    default_factory: Any = dataclasses.MISSING,
    allowed: str | None = None,
) -> Any:
    """A dataclass field with a one-line ``help`` text and optional ``choices`` or ``allowed`` range
    (:func:`in_range`; a None value, in an Optional field, is always allowed)."""
    metadata: dict[str, Any] = {"help": help}
    if choices is not None:
        metadata["choices"] = tuple(choices)
    if allowed is not None:
        in_range(0, allowed)  # a malformed range fails at import
        metadata["allowed"] = allowed
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


_COMPARE = {">": lambda v, n: v > n, ">=": lambda v, n: v >= n, "==": lambda v, n: v == n}


#: The prefix of a rule that also requires a whole number (``"a whole number >= 0"``).
WHOLE = "a whole number "


def in_range(value: float, allowed: str) -> bool:
    """Whether ``value`` satisfies ``allowed``: ``"> n"``, ``">= n"``, ``"== n"`` or an interval ``"in (a, b]"``
    (brackets closed, parentheses open), optionally after ``"a whole number "``; text after a ``;`` is a note."""
    rule = allowed.split(";")[0].strip()
    if rule.startswith(WHOLE):
        return float(value).is_integer() and in_range(value, rule[len(WHOLE) :])
    if rule.startswith("in "):
        low, high = (float(x) for x in rule[4:-1].split(","))
        above = value > low if rule[3] == "(" else value >= low
        below = value < high if rule[-1] == ")" else value <= high
        if rule[3] not in "([" or rule[-1] not in ")]":
            raise ValueError(f"malformed range {allowed!r}")
        return above and below
    op, number = rule.split()
    return _COMPARE[op](value, float(number))


def check_field(f: dataclasses.Field, value: Any, key: str) -> None:
    """``value`` is one of the field's declared ``choices`` and within its ``allowed`` range (None always is)."""
    choices = f.metadata.get("choices")
    if choices is not None and value not in choices:
        raise ConfigError(key, value, f"must be one of {', '.join(map(str, choices))}")
    allowed = f.metadata.get("allowed")
    if allowed is not None and value is not None and not in_range(value, allowed):
        raise ConfigError(key, value, f"must be {allowed}")


def check_rules(key: str, obj: Any, rules: list[tuple[str, bool, str]]) -> None:
    """Raise :class:`ConfigError` for the first ``(field, holds, what is allowed)`` rule of ``obj`` that does not
    hold; ``key`` is the dotted path of ``obj``."""
    for name, ok, allowed in rules:
        if not ok:
            raise ConfigError(f"{key}.{name}", getattr(obj, name), allowed)


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
    return [
        f"{c.__name__}.{f.name}"
        for c in nested_dataclasses(cls)
        for f in dataclasses.fields(c)
        if not str(f.metadata.get("help", "")).strip()
    ]
