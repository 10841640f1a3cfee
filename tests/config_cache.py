"""Configs loaded once per test session: a config load (Hydra's compose, the schema merge, validation) takes about
0.5 s on 2 cores, and many tests start from the same shipped config with the same overrides. Only for tests that use
a loaded config; a test of the loader itself (its errors, its warnings) calls ``load_config`` directly."""

from __future__ import annotations

import copy
import functools
from typing import Any


@functools.cache
def _load(name: str, overrides: tuple[str, ...], schema: type) -> Any:
    from roll.config.loader import load_config

    return load_config(name, None, list(overrides), schema)


def cached_config(name: str, overrides: tuple[str, ...] = (), schema: type | None = None) -> Any:
    """``load_config(name, overrides=overrides, schema=schema)`` from ``examples/config``, loaded once per session;
    each call returns a deep copy, which the caller may change. ``schema``: default :class:`AgenticConfig`, and
    :class:`RLVRConfig` for the ``rlvr*`` configs."""
    if schema is None:
        from roll.config.agentic import AgenticConfig
        from roll.config.rlvr import RLVRConfig

        schema = RLVRConfig if name.startswith("rlvr") else AgenticConfig
    return copy.deepcopy(_load(name, tuple(overrides), schema))
