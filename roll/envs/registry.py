"""The env registry: ``env_type`` name -> :class:`~roll.envs.base.TextEnv` subclass (:data:`ENVS`).

Envs register themselves with the :func:`register_env` decorator when their module is imported
(``roll.envs`` imports the built-in ones). Each env is also registered with Gymnasium as
``roll/<CamelName>-v0`` (``sokoban`` -> ``roll/Sokoban-v0``), so ``gymnasium.make`` works too.

A config may name an env that lives outside ``roll`` as ``"package.module:name"``: :func:`make_env`
imports ``package.module`` (which registers its env, or the tools and tasks of a built-in env) and then looks up
``name``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, TypeVar

import gymnasium

from roll.envs.base import TextEnv
from roll.registry import Registry, import_user_module

ENVS: Registry[type[TextEnv]] = Registry("env", "register_env", base=TextEnv)
EnvT = TypeVar("EnvT", bound=type[TextEnv])


def gym_id(name: str) -> str:
    """The Gymnasium id of a registered env name: ``"frozen_lake"`` -> ``"roll/FrozenLake-v0"``."""
    return "roll/" + "".join(part.capitalize() for part in name.split("_")) + "-v0"


def register_env(name: str, cls: EnvT | None = None) -> EnvT | Callable[[EnvT], EnvT]:
    """Register ``cls`` in :data:`ENVS` and with Gymnasium (:func:`gym_id`); use as ``@register_env("name")`` or
    ``register_env("name", Cls)``.

    Raises:
        ValueError: ``name`` is already registered, or is not a lowercase identifier.
        TypeError: ``cls`` is not a ``TextEnv`` subclass.
    """
    if not name.isidentifier() or name != name.lower():
        raise ValueError(f"env name {name!r} must be a lowercase identifier such as 'my_env'.")

    def decorator(env_cls: EnvT) -> EnvT:
        ENVS.register(name)(env_cls)
        gymnasium.register(id=gym_id(name), entry_point=env_cls)
        return env_cls

    return decorator if cls is None else decorator(cls)


def unregister_env(name: str) -> None:
    """Remove ``name`` from :data:`ENVS` and from Gymnasium, if registered (tests that register envs for their own
    duration)."""
    ENVS.unregister(name)
    gymnasium.registry.pop(gym_id(name), None)


def list_envs() -> list[str]:
    """Names of all registered envs, sorted."""
    return ENVS.names()


def get_env_class(env_type: str) -> type[TextEnv]:
    """The class registered as ``env_type``; ``"package.module:name"`` imports ``package.module`` first even when
    ``name`` is registered already, so that a module registering tools or tasks can be named with a built-in env
    (``examples.custom_tool.unit_convert:tool_use``) and every process that builds the env imports it.

    Raises:
        UnknownNameError: no env of that name is registered (a ``ValueError``); the message lists the names.
        ImportError: the module of a ``"package.module:name"`` does not import.
    """
    import_user_module(env_type)
    return ENVS.get(env_type)


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
        ValueError: unknown ``env_type`` (lists the registered names) or an unknown keyword in
            ``env_config`` (names it and lists the accepted ones).
        ImportError: the module of a ``"package.module:name"`` does not import.
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
