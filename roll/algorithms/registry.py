"""A small name -> entry registry, filled by a decorator; one instance per extension point."""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """Maps names (and aliases) to entries of one extension point.

    Args:
        kind: what the entries are, used in error messages (e.g. ``"advantage estimator"``).
        decorator_name: the decorator users call to add an entry, named in error messages.
    """

    def __init__(self, kind: str, decorator_name: str) -> None:
        self.kind = kind
        self.decorator_name = decorator_name
        self._entries: dict[str, T] = {}

    def register(self, *names: str) -> Callable[[T], T]:
        """Return a decorator that registers its argument under every name in ``names``.

        Raises:
            ValueError: when no name is given or a name is already taken.
        """
        if not names:
            raise ValueError(f"{self.decorator_name}() needs at least one name, e.g. {self.decorator_name}('my_name')")

        def decorator(entry: T) -> T:
            for name in names:
                if name in self._entries:
                    raise ValueError(
                        f"{self.kind} {name!r} is already registered (by {self._entries[name]!r}); "
                        f"pick another name for {entry!r}"
                    )
            for name in names:
                self._entries[name] = entry
            return entry

        return decorator

    def get(self, name: str) -> T:
        """Return the entry registered as ``name``.

        Raises:
            KeyError: when ``name`` is unknown; the message lists the valid names.
        """
        try:
            return self._entries[name]
        except KeyError:
            raise KeyError(
                f"unknown {self.kind} {name!r}; valid names: {self.names()}. "
                f"Use one of these, or register a new one with @{self.decorator_name}({name!r})"
            ) from None

    def names(self) -> list[str]:
        """Return all registered names (aliases included), sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
