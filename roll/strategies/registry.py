"""Strategy registry: name -> import path, the roles it serves, its typed options and its abilities.

Backends register by import path so that nothing heavy (DeepSpeed, SGLang, CUDA) is imported until a worker
actually builds the strategy; the preflight checks only need what an entry declares:

- ``roles``: which worker blocks it can serve (``actor_train``, ``critic``: training; ``actor_infer``: generation;
  ``reference``: log-probs). A strategy serving ``critic`` computes values (``compute_values``).
- ``options``: ``"package.module:Class"`` of its typed ``strategy_config`` (:mod:`roll.config.strategies`).
- ``abilities`` (see :data:`ABILITIES`): what callers may ask of it beyond its roles' interface.
- ``requires`` / ``module``: the pip requirement and the Python module of its backend, for the install check.

A backend in another package registers the same way (``register_strategy("my_backend", "pkg.mod:MyStrategy",
{"actor_infer"}, options="pkg.options:MyOptions")``), from a module the run imports.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

TRAIN_ROLES = frozenset({"actor_train", "critic"})
#: Abilities a strategy may declare, and what each lets callers do.
ABILITIES = {
    "submit": "takes generation requests one at a time (submit / poll / abort), batching them itself",
    "weight_group": "receives weights by broadcast in an NCCL weight group (disaggregated sync)",
    "ipc_weights": "receives weights as CUDA-IPC buckets from a trainer on the same GPUs",
}
#: Strategy names of ROLL's guide that no registered backend serves: what is missing and what to use instead.
UNAVAILABLE = {
    "vllm": "needs the vLLM backend, which roll does not implement yet (and `pip install vllm` replaces torch with "
            "the version vllm pins); use sglang on GPU or hf_infer",
}


@dataclass(frozen=True)
class StrategySpec:
    """What one registered strategy declares."""

    name: str
    import_path: str  # "package.module:ClassName"
    roles: frozenset[str]
    options: str  # "package.module:OptionsClass" of its strategy_config
    abilities: frozenset[str] = frozenset()
    requires: str = ""  # pip requirement to name in errors when the import fails
    module: str = ""  # the backend's Python module (checked for installation before workers start)
    role_paths: tuple[tuple[str, str], ...] = ()  # (role, import path) where a role needs its own class

    def can(self, ability: str) -> bool:
        """Whether the strategy declared ``ability`` (a key of :data:`ABILITIES`)."""
        if ability not in ABILITIES:
            raise KeyError(f"unknown strategy ability {ability!r}; known: {sorted(ABILITIES)}")
        return ability in self.abilities

    def options_class(self) -> type:
        """The dataclass of this strategy's ``strategy_config``."""
        return _import(self.options)


_STRATEGIES: dict[str, StrategySpec] = {}


def _import(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def register_strategy(name: str, import_path: str, roles: set[str] | frozenset[str], requires: str = "",
                      role_paths: dict[str, str] | None = None, *, options: str,
                      abilities: set[str] | frozenset[str] = frozenset(), module: str = "") -> None:
    """Register a backend; a duplicate name, an unknown ability or a role path outside ``roles`` raises.
    ``role_paths`` maps a role to its own class (e.g. the critic's value-model variant of a training backend)."""
    if name in _STRATEGIES:
        raise ValueError(f"strategy {name!r} is already registered ({_STRATEGIES[name].import_path})")
    extra = set(role_paths or {}) - set(roles)
    if extra:
        raise ValueError(f"strategy {name!r}: role_paths names roles {sorted(extra)} outside its roles {sorted(roles)}")
    unknown = set(abilities) - set(ABILITIES)
    if unknown:
        raise ValueError(f"strategy {name!r}: unknown abilities {sorted(unknown)}; known: {sorted(ABILITIES)}")
    _STRATEGIES[name] = StrategySpec(name, import_path, frozenset(roles), options, frozenset(abilities), requires,
                                     module, tuple(sorted((role_paths or {}).items())))


def strategy_spec(name: str) -> StrategySpec:
    """What strategy ``name`` declared; a ValueError lists the registered names."""
    if name not in _STRATEGIES:
        hint = f" ({name} {UNAVAILABLE[name]})" if name in UNAVAILABLE else ""
        raise ValueError(f"unknown strategy {name!r}{hint}; valid: {', '.join(list_strategies())}")
    return _STRATEGIES[name]


def strategy_roles() -> dict[str, frozenset[str]]:
    """Every registered strategy name with the roles it serves."""
    return {name: spec.roles for name, spec in _STRATEGIES.items()}


def list_strategies() -> list[str]:
    """Registered strategy names, sorted."""
    return sorted(_STRATEGIES)


def strategy_options(worker: Any, key: str = "strategy_args.strategy_config") -> Any:
    """The typed options of a worker block's strategy (its ``strategy_config`` parsed by the registered options
    class; a ConfigError names ``key``)."""
    from roll.config.strategies import parse_options

    spec = strategy_spec(worker.strategy_args.strategy_name)
    return parse_options(spec.options_class(), worker.strategy_args.strategy_config, key)


def get_strategy_class(name: str, role: str | None = None) -> type:
    """Import and return the class of strategy ``name`` (for ``role``, when that role has its own class); a clear
    error when it or its backend is missing."""
    spec = strategy_spec(name)
    path = dict(spec.role_paths).get(role, spec.import_path)
    try:
        return _import(path)
    except ImportError as exc:
        hint = f" Install it with: pip install '{spec.requires}'" if spec.requires else ""
        raise ImportError(f"strategy {name!r} needs a backend that failed to import: {exc}.{hint}") from exc


register_strategy("hf_infer", "roll.strategies.hf_infer:HFInferStrategy", {"actor_infer", "reference"},
                  requires="transformers", module="transformers", abilities={"ipc_weights"},
                  options="roll.config.strategies:HFInferOptions")
register_strategy("deepspeed_train", "roll.strategies.deepspeed_train:DeepSpeedTrainStrategy",
                  {"actor_train", "critic"}, requires="deepspeed", module="deepspeed",
                  role_paths={"critic": "roll.strategies.deepspeed_train:DeepSpeedCriticStrategy"},
                  options="roll.config.strategies:DeepSpeedTrainOptions")
register_strategy("deepspeed_infer", "roll.strategies.deepspeed_infer:DeepSpeedInferStrategy", {"reference"},
                  requires="deepspeed", module="deepspeed", options="roll.config.strategies:DeepSpeedInferOptions")
register_strategy("megatron_train", "roll.strategies.megatron_train:MegatronTrainStrategy",
                  {"actor_train", "critic"}, requires="roll[megatron]", module="megatron.core",
                  role_paths={"critic": "roll.strategies.megatron_train:MegatronCriticStrategy"},
                  options="roll.config.megatron:MegatronOptions")
register_strategy("megatron_infer", "roll.strategies.megatron_train:MegatronInferStrategy", {"reference"},
                  requires="roll[megatron]", module="megatron.core", options="roll.config.megatron:MegatronOptions")
register_strategy("sglang", "roll.strategies.sglang:SGLangStrategy", {"actor_infer"}, requires="roll[gpu]",
                  module="sglang", abilities={"submit", "weight_group", "ipc_weights"},
                  options="roll.config.strategies:SGLangOptions")
