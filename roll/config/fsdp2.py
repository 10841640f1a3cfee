"""Typed options of the FSDP2 strategies (``fsdp2_train``, ``fsdp2_infer``): the keys of their ``strategy_config``.

Key names are ROLL's (``fsdp_size``, ``param_dtype``, ``reduce_dtype``, ``reshard_after_forward``,
``offload_policy``, ``wrap_policy``), which verl's FSDP2 config shares where it has the key; verl's
``mixed_precision: {param_dtype, reduce_dtype}`` block is accepted as an alias of the two flat keys. Keys of ROLL or
verl that have no meaning in roll are accepted with a warning (:data:`IGNORED`); keys of features roll does not
have are errors that name what to use instead (:data:`UNSUPPORTED`).

The strategy registry names :class:`FSDP2Options` as the options of ``fsdp2_train`` / ``fsdp2_infer``;
:func:`roll.config.strategies.parse_options` builds it through :meth:`FSDP2Options.from_mapping` (unknown keys, types
and choices checked), and the launch's preflight runs :meth:`FSDP2Options.check_worker` (world size, model dtype,
role) and prints :meth:`FSDP2Options.ignored`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from roll.config.errors import ConfigError
from roll.config.fields import fld

#: Accepted dtype spellings (roll's and torch's names, as ROLL's examples mix them) -> roll's name.
DTYPE_ALIASES = {
    "fp32": "fp32",
    "float32": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
}

#: Keys of ROLL's / verl's FSDP2 config that mean nothing in roll: accepted, named in one warning, ignored.
IGNORED = {
    "async_save_ckpt": "roll writes checkpoints synchronously (a checkpoint is complete before training goes on)",
    "use_batched_model_update": "roll always syncs weights in buckets (actor_infer's weight_bucket_bytes)",
    "apply_expert_patch": "roll never shards MoE experts as separate units, so no expert patch is needed",
    "zero_stage": "a deepspeed_train key; FSDP2 shards parameters, gradients and optimizer states like ZeRO-3, "
    "and reshard_after_forward: false keeps parameters gathered from forward to backward like ZeRO-2",
}
#: Keys of features roll's FSDP2 strategies do not have: an error when set to anything but off.
UNSUPPORTED = {
    "apply_tiled_mlp": "TiledMLP is not implemented in roll; keep activation checkpointing on "
    "(model_args.disable_gradient_checkpointing: false) or lower the micro-batch token budget",
    "tiled_num_shards": "TiledMLP is not implemented in roll (see apply_tiled_mlp)",
    "param_offload": "use offload_policy: true for CPU offload during training; between phases roll offloads "
    "colocated roles by colocated_offload",
    "optimizer_offload": "use offload_policy: true (parameters, gradients and optimizer states on CPU); between "
    "phases roll offloads colocated roles by colocated_offload",
    "moe_experts": "roll does not shard MoE experts as separate units; remove it (experts stay in their layer's unit)",
    "buffer_dtype": "buffers keep the dtype the model was loaded in (model_args.dtype); remove it",
    "offload_optimizer": "a deepspeed_train key; for CPU offload use offload_policy: true",
    "offload_param": "a deepspeed_train key; for CPU offload use offload_policy: true",
}
#: Values that mean "off" for an :data:`UNSUPPORTED` key (DeepSpeed writes ``offload_param: none``).
OFF = (None, False, 0, "", "none", [], {})


@dataclass
class FSDP2WrapPolicy:
    """Which modules become FSDP units (all-gathered before, freed after their own forward and backward)."""

    transformer_layer_cls_to_wrap: list[str] = fld(
        default_factory=list,
        help="Module class names that each become an FSDP unit; empty = the model's "
        "_no_split_modules (its decoder layer, e.g. Qwen2DecoderLayer).",
    )
    wrap_embeddings: bool = fld(False, "Shard the input embeddings as a unit of their own (untied models only).")
    wrap_lm_output: bool = fld(
        False,
        "Shard the LM head as a unit of their own (untied models only); the log-prob "
        "pass then runs checkpointed through the head module, not the fused kernel.",
    )


@dataclass
class FSDP2Options:
    """``strategy_config`` of ``fsdp2_train`` / ``fsdp2_infer`` (PyTorch FSDP2, ``fully_shard``). ROLL's key names;
    verl's ``mixed_precision: {param_dtype, reduce_dtype}`` is accepted for the two flat keys. Accepted with a
    warning and ignored: ``async_save_ckpt``, ``use_batched_model_update``, ``apply_expert_patch``, ``zero_stage``.
    Errors unless off (the error names what to use): ``apply_tiled_mlp``, ``tiled_num_shards``, ``param_offload``,
    ``optimizer_offload``, ``moe_experts``, ``buffer_dtype``, ``offload_optimizer``, ``offload_param``."""

    fsdp_size: int = fld(
        0,
        "Ranks that shard one model replica: 0 or 1 (or >= the role's world size) = all of "
        "them (FSDP, as in ROLL); a divisor of the world size in between = HSDP, "
        "world_size / fsdp_size replicas.",
    )
    param_dtype: str | None = fld(
        None,
        "Compute dtype of the gathered parameters (mixed precision); None = "
        "model_args.dtype. fsdp2_train keeps fp32 sharded master weights.",
        choices=[None, *DTYPE_ALIASES],
    )
    reduce_dtype: str = fld(
        "fp32",
        "Dtype in which gradients are accumulated over micro-batches and reduced over ranks.",
        choices=list(DTYPE_ALIASES),
    )
    reshard_after_forward: bool = fld(
        True,
        "Free each unit's gathered parameters after its forward (gathered again "
        "for backward): less memory, more communication.",
    )
    offload_policy: bool = fld(
        False,
        "CPU offload (FSDP2 CPUOffloadPolicy): sharded parameters, gradients and "
        "optimizer states stay in CPU memory and the optimizer steps on CPU; each "
        "unit is copied to the GPU for its forward and backward.",
    )
    wrap_policy: FSDP2WrapPolicy = field(
        default_factory=FSDP2WrapPolicy, metadata={"help": "Which modules become FSDP units."}
    )

    def ignored(self) -> list[tuple[str, str]]:
        """``(key, why)`` for the set keys roll accepts but does not use (:data:`IGNORED`, :data:`UNSUPPORTED` off)."""
        return list(getattr(self, "_ignored", []))

    @classmethod
    def from_mapping(cls, raw: Any, key: str) -> FSDP2Options:
        """Parse a ``strategy_config`` (the hook :func:`roll.config.strategies.parse_options` calls): verl's
        ``mixed_precision: {param_dtype, reduce_dtype}`` fills the flat keys (setting one both ways is an error);
        :data:`IGNORED` keys are kept for :meth:`ignored`; :data:`UNSUPPORTED` keys raise unless off."""
        data = dict(raw or {}) if isinstance(raw, Mapping) or raw is None else raw
        if isinstance(data, dict) and data.get("mixed_precision") is not None:
            mixed = data.pop("mixed_precision")
            if not isinstance(mixed, Mapping):
                raise ConfigError(f"{key}.mixed_precision", mixed, "expected a mapping with param_dtype / reduce_dtype")
            for name, value in mixed.items():
                if name in data:
                    raise ConfigError(
                        f"{key}.mixed_precision.{name}",
                        value,
                        f"also set as {key}.{name}; set it in one place (mixed_precision is verl's "
                        f"spelling of the flat keys)",
                    )
                data[name] = value
        ignored: list[tuple[str, str]] = []
        options = _build(cls, data, key, "", ignored)
        options._ignored = ignored
        return options

    def check_worker(self, worker: Any, key: str) -> None:
        """Rules that need the worker block ``key`` belongs to: ``fsdp_size`` divides the role's world size, and
        training does not run in fp16 (it needs loss scaling, which fsdp2_train does not do)."""
        check_fsdp2_worker(self, worker, key, worker.world_size)


def dtype_name(value: str | None) -> str | None:
    """roll's name of a dtype spelling (``"bfloat16"`` -> ``"bf16"``); None stays None."""
    return None if value is None else DTYPE_ALIASES[value]


def _typed(value: Any, hint: Any, key: str) -> Any:
    """``value`` checked against a field's type hint (bool, int, str, Optional[str], List[str])."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        return None if value is None else _typed(value, next(a for a in args if a is not type(None)), key)
    if origin is list:
        if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
            raise ConfigError(key, value, "expected a list of strings")
        return list(value)
    exact = {
        bool: isinstance(value, bool),
        int: isinstance(value, int) and not isinstance(value, bool),
        str: isinstance(value, str),
    }
    if not exact.get(hint, True):
        raise ConfigError(key, value, f"expected {hint.__name__}")
    return value


def _build(cls: type, data: Any, key: str, prefix: str, ignored: list[tuple[str, str]]) -> Any:
    """An instance of dataclass ``cls`` from a mapping: unknown keys, types and choices checked; :data:`IGNORED`
    keys go to ``ignored`` (``prefix`` + name, why); :data:`UNSUPPORTED` keys raise unless off (:data:`OFF`)."""
    from roll.config.validation import check_choices

    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(key, data, f"expected a mapping of {cls.__name__} keys")
    fields = {f.name for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for name, value in data.items():
        where = f"{key}.{name}"
        if name in IGNORED:
            ignored.append((prefix + name, IGNORED[name]))
        elif name in UNSUPPORTED:
            if value not in OFF:
                raise ConfigError(where, value, f"not supported by roll's FSDP2 strategies: {UNSUPPORTED[name]}")
            ignored.append((prefix + name, f"off; {UNSUPPORTED[name]}"))
        elif name not in fields:
            raise ConfigError(where, value, f"unknown {cls.__name__} key; known: {', '.join(sorted(fields))}")
        elif dataclasses.is_dataclass(hints[name]):
            kwargs[name] = _build(hints[name], value, where, f"{prefix}{name}.", ignored)
        else:
            kwargs[name] = _typed(value, hints[name], where)
    obj = cls(**kwargs)
    check_choices(obj, key + ".")
    return obj


def check_fsdp2_worker(options: FSDP2Options, worker: Any, key: str, world: int) -> None:
    """``fsdp_size`` fits ``world`` ranks; an ``fsdp2_train`` role does not compute in fp16."""
    if options.fsdp_size < 0 or 1 < options.fsdp_size < world and world % options.fsdp_size:
        raise ConfigError(
            f"{key}.fsdp_size",
            options.fsdp_size,
            f"must be 0 (shard over all {world} ranks) or a divisor of the world size {world}",
        )
    compute = dtype_name(options.param_dtype) or worker.model_args.dtype
    if worker.strategy_args.strategy_name == "fsdp2_train" and compute == "fp16":
        role = key.split(".")[0]
        raise ConfigError(
            f"{key}.param_dtype" if options.param_dtype else f"{role}.model_args.dtype",
            "fp16",
            "fsdp2_train trains in bf16 or fp32 (fp16 needs loss scaling, which it does not do)",
        )


def fsdp2_options(worker: Any, role: str, world_size: int, options: FSDP2Options) -> FSDP2Options:
    """``options`` (the typed ``strategy_config`` of ``worker``, a ``WorkerConfig``) checked for ``world_size``
    ranks (a strategy's own world size): what the strategies build from."""
    check_fsdp2_worker(options, worker, f"{role}.strategy_args.strategy_config", world_size)
    return options
