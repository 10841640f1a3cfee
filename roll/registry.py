"""A small name -> entry registry, filled by a decorator; one instance per extension point.

Entries declare what they need as *capabilities* (``@register_advantage("gae", needs_critic=True)``); each registry
names the capabilities it knows and their defaults, so a typo is an error and config validation asks the registry
(``ADVANTAGES.capabilities("gae")["needs_critic"]``) instead of keeping a list of names.

A name written ``"package.module:name"`` is a user extension: :meth:`Registry.get` imports ``package.module`` (whose
decorators register its entries) and then looks up ``name``, so a config can use an entry defined outside roll.

A failed lookup raises :class:`UnknownNameError`, which lists the valid names and is both a ``KeyError`` (a name
missing from a table) and a ``ValueError`` (a bad value handed to a public function such as ``make_env``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """No entry is registered under a name; the message lists the valid names and how to add one."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""  # the message as written (KeyError would quote it)


def import_user_module(name: str) -> str:
    """For ``"package.module:entry"``, import ``package.module`` and return ``"entry"``; other names unchanged.

    Raises:
        ImportError: the module cannot be imported (the message names the module and the entry).
    """
    if ":" not in name:
        return name
    module, _, entry = name.partition(":")
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"cannot import module {module!r} named by {name!r}: {exc}; make it importable "
            f"(installed, or on the path of the launch directory)"
        ) from exc
    return entry


class Registry(Generic[T]):
    """Maps names (and aliases) to entries of one extension point, with the capabilities each entry declares.

    Args:
        kind: what the entries are, used in error messages (e.g. ``"advantage estimator"``).
        decorator_name: the decorator users call to add an entry, named in error messages.
        capabilities: the capabilities entries may declare, with their defaults (e.g. ``{"needs_critic": False}``).
        base: entries must be subclasses of this class (a ``TypeError`` otherwise); None = any object.
        how_to_add: how a user adds an entry named ``{name}``, for the failed-lookup message; None =
            ``@<decorator_name>('<name>')``.
    """

    def __init__(
        self,
        kind: str,
        decorator_name: str,
        capabilities: Mapping[str, Any] | None = None,
        *,
        base: type | None = None,
        how_to_add: str | None = None,
    ) -> None:
        self.kind = kind
        self.decorator_name = decorator_name
        self.defaults = dict(capabilities or {})
        self.base = base
        self.how_to_add = how_to_add or f"@{decorator_name}({{name!r}})"
        self._entries: dict[str, T] = {}
        self._caps: dict[str, dict[str, Any]] = {}

    def register(self, *names: str, **capabilities: Any) -> Callable[[T], T]:
        """Return a decorator that registers its argument under every name in ``names``, declaring
        ``capabilities`` (keywords among the registry's known ones).

        Raises:
            ValueError: when no name is given, a name is already taken, or a capability is unknown.
            TypeError: the registry has a ``base`` and the entry is not a subclass of it.
        """
        if not names:
            raise ValueError(f"{self.decorator_name}() needs at least one name, e.g. {self.decorator_name}('my_name')")
        unknown = sorted(set(capabilities) - set(self.defaults))
        if unknown:
            raise ValueError(
                f"{self.decorator_name}{names!r}: unknown capabilities {unknown}; a {self.kind} may "
                f"declare {sorted(self.defaults) or 'none'}"
            )

        def decorator(entry: T) -> T:
            if self.base is not None and not (isinstance(entry, type) and issubclass(entry, self.base)):
                raise TypeError(
                    f"{self.decorator_name}({names[0]!r}) needs a {self.base.__name__} subclass, got {entry!r}"
                )
            for name in names:
                if name in self._entries:
                    raise ValueError(
                        f"{self.kind} {name!r} is already registered (by {self._entries[name]!r}); "
                        f"pick another name for {entry!r}"
                    )
            for name in names:
                self._entries[name] = entry
                self._caps[name] = {**self.defaults, **capabilities}
            return entry

        return decorator

    def resolve(self, name: str) -> str:
        """The registered name of ``name``; for ``"module:entry"``, ``entry``, importing the module first unless
        ``entry`` is registered already (the module was imported, or its entry was registered by value, e.g. in a
        Ray worker)."""
        entry = name.partition(":")[2] if ":" in name else name
        if entry not in self._entries:
            entry = import_user_module(name)
        if entry not in self._entries:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; valid names: {self.names()}. "
                f"Use one of these, register a new one with {self.how_to_add.format(name=entry)}, or name it as "
                f"'package.module:{entry}'"
            ) from None
        return entry

    def get(self, name: str) -> T:
        """Return the entry registered as ``name`` (or ``"package.module:name"``, importing the module first).

        Raises:
            UnknownNameError: when ``name`` is unknown (a KeyError and a ValueError); the message lists the valid names.
            ImportError: when a ``"package.module:name"`` module cannot be imported.
        """
        return self._entries[self.resolve(name)]

    def capabilities(self, name: str) -> dict[str, Any]:
        """What entry ``name`` declared, with the registry's defaults for the rest (looked up like :meth:`get`)."""
        return dict(self._caps[self.resolve(name)])

    def unregister(self, name: str) -> None:
        """Remove ``name`` if registered (tests that register entries for their own duration)."""
        self._entries.pop(name, None)
        self._caps.pop(name, None)

    def names(self) -> list[str]:
        """Return all registered names (aliases included), sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
