"""Strategy registry: name -> import path and the roles it can serve.

Backends register by import path so that nothing heavy (DeepSpeed, SGLang, CUDA) is imported until a worker
actually builds the strategy; the config validator only needs names and roles.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

TRAIN_ROLES = frozenset({"actor_train", "critic"})


@dataclass(frozen=True)
class StrategySpec:
    """Where a strategy class lives and which roles it serves."""

    name: str
    import_path: str  # "package.module:ClassName"
    roles: frozenset[str]
    requires: str = ""  # pip requirement to name in errors when the import fails


_STRATEGIES: dict[str, StrategySpec] = {}


def register_strategy(name: str, import_path: str, roles: set[str] | frozenset[str], requires: str = "") -> None:
    """Register a backend; a duplicate name raises."""
    if name in _STRATEGIES:
        raise ValueError(f"strategy {name!r} is already registered ({_STRATEGIES[name].import_path})")
    _STRATEGIES[name] = StrategySpec(name, import_path, frozenset(roles), requires)


def strategy_roles() -> dict[str, frozenset[str]]:
    """Every registered strategy name with the roles it serves."""
    return {name: spec.roles for name, spec in _STRATEGIES.items()}


def list_strategies() -> list[str]:
    """Registered strategy names, sorted."""
    return sorted(_STRATEGIES)


def get_strategy_class(name: str) -> type:
    """Import and return the class of strategy ``name``; a clear error when it or its backend is missing."""
    if name not in _STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(list_strategies())}")
    spec = _STRATEGIES[name]
    module, _, cls = spec.import_path.partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        hint = f" Install it with: pip install '{spec.requires}'" if spec.requires else ""
        raise ImportError(f"strategy {name!r} needs a backend that failed to import: {exc}.{hint}") from exc


register_strategy("hf_infer", "roll.strategies.hf_infer:HFInferStrategy",
                  {"actor_infer", "reference"}, requires="transformers")
register_strategy("deepspeed_train", "roll.strategies.deepspeed_train:DeepSpeedTrainStrategy",
                  {"actor_train", "critic"}, requires="deepspeed")
