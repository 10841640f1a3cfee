"""The env registry: ``env_type`` name -> :class:`~roll.envs.base.TextEnv` subclass.

Envs register themselves with the :func:`register_env` decorator when their module is imported
(``roll.envs`` imports the built-in ones). Each env is also registered with Gymnasium as
``roll/<CamelName>-v0`` (``sokoban`` -> ``roll/Sokoban-v0``), so ``gymnasium.make`` works too.

A config may name an env that lives outside ``roll`` as ``"package.module:name"``: :func:`make_env`
imports ``package.module`` (which registers its env) and then looks up ``name``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium

from roll.envs.base import TextEnv

_ENVS: dict[str, type[TextEnv]] = {}
EnvT = TypeVar("EnvT", bound=type[TextEnv])


def gym_id(name: str) -> str:
    """The Gymnasium id of a registered env name: ``"frozen_lake"`` -> ``"roll/FrozenLake-v0"``."""
    return "roll/" + "".join(part.capitalize() for part in name.split("_")) + "-v0"


def register_env(name: str, cls: EnvT | None = None) -> EnvT | Callable[[EnvT], EnvT]:
    """Register ``cls`` under ``name``; use as ``@register_env("name")`` or ``register_env("name", Cls)``.

    Raises:
        ValueError: ``name`` is already registered, or is not a lowercase identifier.
        TypeError: ``cls`` is not a ``TextEnv`` subclass.
    """
    if not name.isidentifier() or name != name.lower():
        raise ValueError(f"env name {name!r} must be a lowercase identifier such as 'my_env'.")

    def decorator(env_cls: EnvT) -> EnvT:
        if not (inspect.isclass(env_cls) and issubclass(env_cls, TextEnv)):
            raise TypeError(f"register_env({name!r}) needs a TextEnv subclass, got {env_cls!r}.")
        if name in _ENVS:
            raise ValueError(
                f"env name {name!r} is already registered to {_ENVS[name].__module__}.{_ENVS[name].__qualname__}; "
                "pick another name."
            )
        _ENVS[name] = env_cls
        gymnasium.register(id=gym_id(name), entry_point=env_cls)
        return env_cls

    return decorator if cls is None else decorator(cls)


def list_envs() -> list[str]:
    """Names of all registered envs, sorted."""
    return sorted(_ENVS)


def get_env_class(env_type: str) -> type[TextEnv]:
    """The class registered as ``env_type`` (or ``"module:name"``, importing ``module`` first).

    Raises:
        ValueError: no env of that name is registered; the message lists the registered names.
    """
    if env_type not in _ENVS and ":" in env_type:
        module, _, name = env_type.partition(":")
        importlib.import_module(module)
        env_type = name
    if env_type not in _ENVS:
        raise ValueError(
            f"Unknown env_type {env_type!r}. Registered envs: {list_envs()}. Import the module that "
            "registers it, or write env_type as 'package.module:name'."
        )
    return _ENVS[env_type]


def accepted_kwargs(cls: type) -> list[str]:
    """Keyword arguments accepted by ``cls(...)``, following ``**kwargs`` up the MRO."""
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" not in vars(klass) or klass is object:
            continue
        params = inspect.signature(klass.__init__).parameters.values()
        names += [
            p.name
            for p in params
            if p.name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names
        ]
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            break
    return names


def make_env(env_type: str, env_config: dict[str, Any] | None = None) -> TextEnv:
    """Build the env registered as ``env_type`` with ``env_config`` as keyword arguments.

    Raises:
        ValueError: unknown ``env_type`` (lists registered names) or an unknown keyword in
            ``env_config`` (names it and lists the accepted ones).
    """
    cls = get_env_class(env_type)
    config = dict(env_config or {})
    accepted = accepted_kwargs(cls)
    unknown = sorted(set(config) - set(accepted))
    if unknown:
        raise ValueError(
            f"env_config for {env_type!r} has unknown key(s) {unknown}; {cls.__name__} accepts {accepted}."
        )
    return cls(**config)
