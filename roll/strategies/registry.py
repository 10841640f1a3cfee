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
    role_paths: tuple[tuple[str, str], ...] = ()  # (role, import path) where a role needs its own class


_STRATEGIES: dict[str, StrategySpec] = {}


def register_strategy(name: str, import_path: str, roles: set[str] | frozenset[str], requires: str = "",
                      role_paths: dict[str, str] | None = None) -> None:
    """Register a backend; a duplicate name raises. ``role_paths`` maps a role to its own class (e.g. the
    critic's value-model variant of a training backend)."""
    if name in _STRATEGIES:
        raise ValueError(f"strategy {name!r} is already registered ({_STRATEGIES[name].import_path})")
    extra = set(role_paths or {}) - set(roles)
    if extra:
        raise ValueError(f"strategy {name!r}: role_paths names roles {sorted(extra)} outside its roles {sorted(roles)}")
    _STRATEGIES[name] = StrategySpec(name, import_path, frozenset(roles), requires,
                                     tuple(sorted((role_paths or {}).items())))


def strategy_roles() -> dict[str, frozenset[str]]:
    """Every registered strategy name with the roles it serves."""
    return {name: spec.roles for name, spec in _STRATEGIES.items()}


def list_strategies() -> list[str]:
    """Registered strategy names, sorted."""
    return sorted(_STRATEGIES)


def get_strategy_class(name: str, role: str | None = None) -> type:
    """Import and return the class of strategy ``name`` (for ``role``, when that role has its own class); a clear
    error when it or its backend is missing."""
    if name not in _STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}; valid: {', '.join(list_strategies())}")
    spec = _STRATEGIES[name]
    module, _, cls = dict(spec.role_paths).get(role, spec.import_path).partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except ImportError as exc:
        hint = f" Install it with: pip install '{spec.requires}'" if spec.requires else ""
        raise ImportError(f"strategy {name!r} needs a backend that failed to import: {exc}.{hint}") from exc


register_strategy("hf_infer", "roll.strategies.hf_infer:HFInferStrategy",
                  {"actor_infer", "reference"}, requires="transformers")
register_strategy("deepspeed_train", "roll.strategies.deepspeed_train:DeepSpeedTrainStrategy",
                  {"actor_train", "critic"}, requires="deepspeed",
                  role_paths={"critic": "roll.strategies.deepspeed_train:DeepSpeedCriticStrategy"})
register_strategy("deepspeed_infer", "roll.strategies.deepspeed_infer:DeepSpeedInferStrategy",
                  {"reference"}, requires="deepspeed")
register_strategy("megatron_train", "roll.strategies.megatron_train:MegatronTrainStrategy",
                  {"actor_train", "critic"}, requires="roll[megatron]",
                  role_paths={"critic": "roll.strategies.megatron_train:MegatronCriticStrategy"})
register_strategy("megatron_infer", "roll.strategies.megatron_train:MegatronInferStrategy",
                  {"reference"}, requires="roll[megatron]")
register_strategy("sglang", "roll.strategies.sglang:SGLangStrategy", {"actor_infer"}, requires="roll[gpu]")
