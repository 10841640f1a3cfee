"""Strategy registry: name -> everything a caller may rely on about a backend.

A registry entry (:class:`StrategySpec`) is the whole contract of a backend:

- ``import_path`` (and ``role_paths``): its class, imported lazily (no DeepSpeed, SGLang or CUDA import until a
  worker builds it). The class derives from the base of each role it serves (:data:`roll.strategies.base.
  ROLE_BASES`: ``actor_train`` -> ``TrainStrategy``, ``critic`` -> ``CriticStrategy``, ``actor_infer`` ->
  ``InferenceStrategy``, ``reference`` -> ``ScoringStrategy``), which declare every method a caller uses.
- ``abilities``: what callers may ask beyond the roles, each a ``Protocol`` of :data:`roll.strategies.abilities.
  ABILITIES` (``submit``, ``weight_group``, ``ipc_weights``, ``lora_adapters``). Role bases and abilities are
  checked against the class when it is registered, if its module is already imported (a backend registering
  itself), else when the class is first imported (:func:`get_strategy_class`): a TypeError lists what is missing.
- ``options``: ``"package.module:Class"`` of its typed ``strategy_config`` (:mod:`roll.config.strategies`),
  parsed once, by the launch's preflight (:func:`strategy_options`); the worker hands the object to the strategy.
- what the doctor and the preflight read: ``packages`` (pip distributions it needs, e.g. ``megatron-core``),
  ``requires`` (the pip requirement named in errors), ``module`` (its Python module, checked for installation),
  ``needs_gpu``, and ``prefix_sharing`` (:data:`PREFIX_SHARING`: whether ``use_prefix_sharing`` applies).

The entries live in :data:`STRATEGIES`, a :class:`roll.registry.Registry` (duplicates raise, a failed lookup lists
the names). A backend in another package registers the same way (``register_strategy("my_backend", "pkg.mod:MyStrategy",
{"actor_infer"}, options="pkg.options:MyOptions")``), from a module the run imports; ``docs/architecture.md``
walks through one.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from typing import Any

from roll.config.validation import ROLES
from roll.config.vllm_compat import VLLM_UNAVAILABLE
from roll.registry import Registry
from roll.strategies.abilities import ABILITIES

TRAIN_ROLES = frozenset({"actor_train", "critic"})
#: Values of ``prefix_sharing``: how a strategy relates to ``use_prefix_sharing``.
PREFIX_SHARING = {
    "roll": "runs roll's log-prob forward, which shares prompt prefixes when use_prefix_sharing is set",
    "engine": "shares prompt prefixes itself (its radix cache): use_prefix_sharing does not apply",
    "none": "runs its own forward, which cannot share prefixes",
}
#: Strategy names of ROLL's guide that no registered backend serves: what is missing and what to use instead.
UNAVAILABLE = {"vllm": VLLM_UNAVAILABLE}


@dataclass(frozen=True, repr=False)
class StrategySpec:
    """What one registered strategy declares (see the module docstring)."""

    name: str
    import_path: str  # "package.module:ClassName"
    roles: frozenset[str]
    options: str  # "package.module:OptionsClass" of its strategy_config
    abilities: frozenset[str] = frozenset()
    requires: str = ""  # pip requirement to name in errors when the import fails
    module: str = ""  # the backend's Python module (checked for installation before workers start)
    role_paths: tuple[tuple[str, str], ...] = ()  # (role, import path) where a role needs its own class
    packages: tuple[str, ...] = ()  # pip distributions the doctor checks
    needs_gpu: bool = False  # runs only on a CUDA GPU
    prefix_sharing: str = "roll"  # a key of PREFIX_SHARING

    def __repr__(self) -> str:
        return f"StrategySpec({self.name!r}: {self.import_path})"

    def can(self, ability: str) -> bool:
        """Whether the strategy declared ``ability`` (a key of :data:`roll.strategies.abilities.ABILITIES`)."""
        if ability not in ABILITIES:
            raise KeyError(f"unknown strategy ability {ability!r}; known: {sorted(ABILITIES)}")
        return ability in self.abilities

    def options_class(self) -> type:
        """The dataclass of this strategy's ``strategy_config``."""
        return _import(self.options)

    def class_path(self, role: str) -> str:
        """Import path of the class serving ``role``."""
        return dict(self.role_paths).get(role, self.import_path)


#: Every registered backend by name (:func:`register_strategy` adds one).
STRATEGIES: Registry[StrategySpec] = Registry("strategy", "register_strategy")


def _import(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def check_contract(spec: StrategySpec, role: str, cls: type) -> None:
    """Raise a TypeError when ``cls`` does not derive from ``role``'s base or lacks a declared ability's methods."""
    from roll.strategies.base import contract_gaps  # torch: only where a class is checked

    gaps = contract_gaps(cls, role, spec.abilities)
    if gaps:
        raise TypeError(
            f"strategy {spec.name!r} ({cls.__name__}) cannot serve {role} with abilities "
            f"{sorted(spec.abilities) or 'none'}: {'; '.join(gaps)}"
        )


def _already_imported(path: str) -> Any:
    """The object at ``path`` when its module is imported already (else None: nothing is imported here)."""
    module, _, attr = path.partition(":")
    return getattr(sys.modules.get(module), attr, None)


def register_strategy(
    name: str,
    import_path: str,
    roles: set[str] | frozenset[str],
    requires: str = "",
    role_paths: dict[str, str] | None = None,
    *,
    options: str,
    abilities: set[str] | frozenset[str] = frozenset(),
    module: str = "",
    packages: tuple[str, ...] = (),
    needs_gpu: bool = False,
    prefix_sharing: str = "roll",
) -> None:
    """Register a backend (fields: :class:`StrategySpec`) in :data:`STRATEGIES`. Raises a ValueError for a duplicate
    name, an unknown role, ability or ``prefix_sharing`` value, or a role path outside ``roles``; a TypeError when a
    class already imported does not fulfil its roles and abilities."""
    unknown_roles = set(roles) - set(ROLES)
    if unknown_roles:
        raise ValueError(f"strategy {name!r}: unknown roles {sorted(unknown_roles)}; known: {sorted(ROLES)}")
    extra = set(role_paths or {}) - set(roles)
    if extra:
        raise ValueError(f"strategy {name!r}: role_paths names roles {sorted(extra)} outside its roles {sorted(roles)}")
    unknown = set(abilities) - set(ABILITIES)
    if unknown:
        raise ValueError(f"strategy {name!r}: unknown abilities {sorted(unknown)}; known: {sorted(ABILITIES)}")
    if prefix_sharing not in PREFIX_SHARING:
        raise ValueError(f"strategy {name!r}: prefix_sharing={prefix_sharing!r}; known: {sorted(PREFIX_SHARING)}")
    spec = StrategySpec(
        name,
        import_path,
        frozenset(roles),
        options,
        frozenset(abilities),
        requires,
        module,
        tuple(sorted((role_paths or {}).items())),
        tuple(packages),
        needs_gpu,
        prefix_sharing,
    )
    for role in sorted(spec.roles):
        cls = _already_imported(spec.class_path(role))
        if cls is not None:
            check_contract(spec, role, cls)
    STRATEGIES.register(name)(spec)


def strategy_spec(name: str) -> StrategySpec:
    """What strategy ``name`` declared; ``"package.module:name"`` imports ``package.module`` first (a user module
    that registers its backend). A ValueError lists the registered names."""
    try:
        return STRATEGIES.get(name)
    except ImportError as exc:
        raise ValueError(str(exc)) from None
    except KeyError:
        entry = name.partition(":")[2] or name
        hint = f" ({entry} {UNAVAILABLE[entry]})" if entry in UNAVAILABLE else ""
        raise ValueError(f"unknown strategy {name!r}{hint}; valid: {', '.join(list_strategies())}") from None


def strategy_roles() -> dict[str, frozenset[str]]:
    """Every registered strategy name with the roles it serves."""
    return {name: STRATEGIES.get(name).roles for name in STRATEGIES.names()}


def list_strategies() -> list[str]:
    """Registered strategy names, sorted."""
    return STRATEGIES.names()


def strategy_options(worker: Any, key: str = "strategy_args.strategy_config") -> Any:
    """The typed options of a worker block's strategy: its ``strategy_config`` parsed by the options class its
    registry entry names (:func:`roll.config.strategies.parse_options`), the one parse of a run. The launch's
    preflight asks first; the object is kept on ``strategy_args.options`` with the strategy name and mapping it came
    from, so every later reader (the worker, which hands it to its strategy; the weight-sync setup; the doctor) gets
    that object, in the driver and, pickled with the block, in each worker. A block whose strategy name or mapping
    changed since is parsed afresh. A ConfigError names ``key`` (``<role>.strategy_args.strategy_config.<key>``)."""
    from roll.config.strategies import parse_options

    args = worker.strategy_args
    source = (args.strategy_name, dict(args.strategy_config or {}))
    stored = getattr(args, "options", None)  # None on a block that was never asked (or is not a StrategyArgs)
    if stored is not None and stored[0] == source:
        return stored[1]
    options = parse_options(strategy_spec(args.strategy_name).options_class(), args.strategy_config, key)
    args.options = (source, options)
    return options


def get_strategy_class(name: str, role: str | None = None) -> type:
    """Import and return the class of strategy ``name`` (for ``role``, when that role has its own class), checked
    against the role's base and the declared abilities; a clear error when it or its backend is missing."""
    spec = strategy_spec(name)
    path = spec.class_path(role) if role else spec.import_path
    try:
        cls = _import(path)
    except ImportError as exc:
        hint = f" Install it with: pip install '{spec.requires}'" if spec.requires else ""
        raise ImportError(f"strategy {name!r} needs a backend that failed to import: {exc}.{hint}") from exc
    for served in [role] if role else sorted(r for r in spec.roles if spec.class_path(r) == path):
        check_contract(spec, served, cls)
    return cls


def build_strategy(worker: Any, role: str, rank: int = 0, world_size: int = 1) -> Any:
    """The strategy of worker block ``worker`` serving ``role`` as rank ``rank`` of ``world_size``: its class
    (:func:`get_strategy_class`, checked against the role and abilities) built with the block's typed options
    (:func:`strategy_options`). What a worker does; tests and scripts build strategies the same way."""
    cls = get_strategy_class(worker.strategy_args.strategy_name, role)
    options = strategy_options(worker, f"{role}.strategy_args.strategy_config")
    return cls(worker, rank, world_size, options=options)


register_strategy(
    "hf_infer",
    "roll.strategies.hf_infer:HFInferStrategy",
    {"actor_infer", "reference"},
    requires="transformers",
    module="transformers",
    packages=("transformers",),
    abilities={"ipc_weights", "lora_adapters"},
    options="roll.config.strategies:HFInferOptions",
)
register_strategy(
    "deepspeed_train",
    "roll.strategies.deepspeed_train:DeepSpeedTrainStrategy",
    {"actor_train", "critic"},
    requires="deepspeed",
    module="deepspeed",
    packages=("deepspeed",),
    role_paths={"critic": "roll.strategies.deepspeed_train:DeepSpeedCriticStrategy"},
    options="roll.config.strategies:DeepSpeedTrainOptions",
)
register_strategy(
    "deepspeed_infer",
    "roll.strategies.deepspeed_infer:DeepSpeedInferStrategy",
    {"reference"},
    requires="deepspeed",
    module="deepspeed",
    packages=("deepspeed",),
    options="roll.config.strategies:DeepSpeedInferOptions",
)
register_strategy(
    "fsdp2_train",
    "roll.strategies.fsdp2_train:FSDP2TrainStrategy",
    {"actor_train", "critic"},
    requires="torch>=2.6",
    module="torch",
    packages=("torch",),
    role_paths={"critic": "roll.strategies.fsdp2_train:FSDP2CriticStrategy"},
    options="roll.config.fsdp2:FSDP2Options",
)
register_strategy(
    "fsdp2_infer",
    "roll.strategies.fsdp2_infer:FSDP2InferStrategy",
    {"reference"},
    requires="torch>=2.6",
    module="torch",
    packages=("torch",),
    options="roll.config.fsdp2:FSDP2Options",
)
register_strategy(
    "megatron_train",
    "roll.strategies.megatron_train:MegatronTrainStrategy",
    {"actor_train", "critic"},
    requires="roll[megatron]",
    module="megatron.core",
    packages=("megatron-core",),
    needs_gpu=True,
    prefix_sharing="none",
    role_paths={"critic": "roll.strategies.megatron_train:MegatronCriticStrategy"},
    options="roll.config.megatron:MegatronOptions",
)
register_strategy(
    "megatron_infer",
    "roll.strategies.megatron_train:MegatronInferStrategy",
    {"reference"},
    requires="roll[megatron]",
    module="megatron.core",
    packages=("megatron-core",),
    needs_gpu=True,
    prefix_sharing="none",
    options="roll.config.megatron:MegatronOptions",
)
register_strategy(
    "sglang",
    "roll.strategies.sglang:SGLangStrategy",
    {"actor_infer"},
    requires="roll[gpu]",
    module="sglang",
    packages=("sglang",),
    needs_gpu=True,
    prefix_sharing="engine",
    abilities={"submit", "weight_group", "ipc_weights", "lora_adapters"},
    options="roll.config.strategies:SGLangOptions",
)
