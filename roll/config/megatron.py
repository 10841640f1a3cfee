"""Typed ``strategy_config`` of ``megatron_train`` / ``megatron_infer`` (ROLL's Megatron key names).

:func:`parse_megatron_options` turns a role's ``strategy_config`` dict into :class:`MegatronOptions` (unknown keys
and wrong types are one-line :class:`ConfigError`); :func:`check_megatron_options` checks the rules that span
fields, the role's world size and the model's head and layer counts (read from its ``config.json`` when the model
directory is local). Both run in the launch's preflight (``MegatronOptions.check_worker``) before any worker starts;
the strategy registry names :class:`MegatronOptions` as the options of ``megatron_train`` / ``megatron_infer``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roll.config.errors import ConfigError
from roll.config.fields import fld

MEGATRON_STRATEGIES = ("megatron_train", "megatron_infer")


@dataclass
class MegatronOptions:
    """Parallel layout, memory and precision settings of a megatron-core role."""

    tensor_model_parallel_size: int = fld(
        1,
        "Tensor parallel size (TP): splits each layer's matrices (and the "
        "vocabulary) over TP GPUs; must divide the attention and KV heads.",
    )
    pipeline_model_parallel_size: int = fld(
        1,
        "Pipeline parallel size (PP): splits the layers into PP stages; "
        "must divide the layer count (times the virtual size).",
    )
    virtual_pipeline_model_parallel_size: int | None = fld(
        None, "Layer chunks per pipeline stage (interleaved schedule, fewer pipeline bubbles); needs PP >= 2."
    )
    context_parallel_size: int = fld(
        1, "Context parallel size (CP); roll supports only 1 (CP needs Transformer Engine attention)."
    )
    expert_model_parallel_size: int = fld(1, "Expert parallel size (MoE); roll's Megatron models are dense, so 1.")
    sequence_parallel: bool = fld(
        False,
        "Split norms and dropout along the sequence over the TP ranks (less "
        "activation memory); needs TP > 1 and transformer_impl "
        "transformer_engine.",
    )
    use_distributed_optimizer: bool = fld(
        False, "Shard fp32 master weights and Adam states over data-parallel ranks (ZeRO-1 style)."
    )
    overlap_grad_reduce: bool = fld(False, "Overlap the data-parallel gradient reduce with the backward pass.")
    overlap_param_gather: bool = fld(
        False,
        "Overlap the distributed optimizer's parameter all-gather with the "
        "next forward pass; needs use_distributed_optimizer.",
    )
    recompute_granularity: str | None = fld(
        None,
        "Activation recomputation: full (whole layers), selective (core attention only), None (off).",
        choices=[None, "full", "selective"],
    )
    recompute_method: str | None = fld(
        None, "With recompute_granularity full: uniform or block.", choices=[None, "uniform", "block"]
    )
    recompute_num_layers: int | None = fld(
        None, "With recompute_method: layers per recompute unit (uniform) or recomputed layers per stage (block)."
    )
    bf16: bool | None = fld(
        None, "Train in bf16 with fp32 master weights; None follows model_args.dtype, and a value must agree with it."
    )
    transformer_impl: str = fld(
        "local",
        "Layer implementation: local (megatron-core only) or transformer_engine (needs Transformer Engine installed).",
        choices=["local", "transformer_engine"],
    )

    @property
    def model_parallel_size(self) -> int:
        """Ranks that share one data-parallel replica: TP x PP x CP."""
        return self.tensor_model_parallel_size * self.pipeline_model_parallel_size * self.context_parallel_size

    @classmethod
    def from_mapping(cls, raw: Any, key: str) -> MegatronOptions:
        """The parser :func:`roll.config.strategies.parse_options` uses (:func:`parse_megatron_options`)."""
        return parse_megatron_options(raw or {}, key)

    def packages(self) -> tuple[str, ...]:
        """pip distributions these options need beyond megatron-core (checked by ``roll doctor``)."""
        return ("transformer-engine",) if self.transformer_impl == "transformer_engine" else ()

    def check_worker(self, worker: Any, key: str) -> None:
        """The rules involving the worker block ``key`` belongs to (``<role>.strategy_args.strategy_config``): GPUs
        given, the layout fits its world size and dtype and (when the model directory is local) the model's heads
        and layers. Run by the launch's preflight (it may read the model's ``config.json``)."""
        name, role = worker.strategy_args.strategy_name, key.split(".")[0]
        if not worker.device_mapping:
            raise ConfigError(
                f"{role}.strategy_args.strategy_name",
                name,
                f"{name} needs CUDA GPUs (megatron-core allocates CUDA tensors): give {role} a "
                "device_mapping, or use deepspeed_train / hf_infer on CPU",
            )
        check_megatron_options(
            self, key, worker.world_size, worker.model_args.dtype, read_hf_config(worker.model_args.model_name_or_path)
        )


def parse_megatron_options(strategy_config: dict[str, Any], key: str) -> MegatronOptions:
    """:class:`MegatronOptions` from a ``strategy_config`` dict; ``key`` is its dotted path, for errors."""
    known = {f.name: f for f in dataclasses.fields(MegatronOptions)}
    values = {}
    for name, value in dict(strategy_config).items():
        if name not in known:
            hint = " (MoE keys: roll's Megatron models are dense)" if name.startswith("moe_") else ""
            raise ConfigError(f"{key}.{name}", value, f"unknown Megatron option{hint}; known: {', '.join(known)}")
        hint = str(known[name].type)  # a string: the module has ``from __future__ import annotations``
        optional = hint.endswith(" | None")
        base = {"int": int, "bool": bool, "str": str}[hint.removesuffix(" | None")]
        if value is not None and not (isinstance(value, base) and not (base is int and isinstance(value, bool))):
            raise ConfigError(f"{key}.{name}", value, f"expected {base.__name__}")
        if value is None and not optional:
            raise ConfigError(f"{key}.{name}", value, f"expected {base.__name__}, not null")
        choices = known[name].metadata.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(f"{key}.{name}", value, f"must be one of {', '.join(map(str, choices))}")
        values[name] = value
    return MegatronOptions(**values)


def read_hf_config(path: str | None) -> dict[str, Any] | None:
    """The model's ``config.json`` as a dict when ``path`` is a local directory holding one, else None."""
    if not path:
        return None
    file = Path(path) / "config.json"
    return json.loads(file.read_text()) if file.is_file() else None


def check_megatron_options(
    opts: MegatronOptions, key: str, world_size: int, dtype: str, hf_config: dict[str, Any] | None = None
) -> None:
    """Cross-field rules of ``opts`` for a role of ``world_size`` workers with model dtype ``dtype``; with the
    model's ``hf_config`` also the head and layer divisibility rules. Raises :class:`ConfigError`."""
    tp, pp, vpp = (
        opts.tensor_model_parallel_size,
        opts.pipeline_model_parallel_size,
        opts.virtual_pipeline_model_parallel_size,
    )
    for name in (
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
    ):
        if getattr(opts, name) < 1:
            raise ConfigError(f"{key}.{name}", getattr(opts, name), "must be >= 1")
    if hf_config is not None and "vision_config" in hf_config:
        raise ConfigError(
            "model_args.model_name_or_path",
            hf_config.get("model_type"),
            "is a vision-language model; roll's Megatron strategy has no vision tower: use deepspeed_train or "
            "fsdp2_train (docs/vlm.md)",
        )
    if opts.context_parallel_size != 1:
        raise ConfigError(
            f"{key}.context_parallel_size",
            opts.context_parallel_size,
            "roll's Megatron strategy supports only 1 (context parallelism needs Transformer Engine "
            "attention and a split sequence layout)",
        )
    if opts.expert_model_parallel_size != 1:
        raise ConfigError(
            f"{key}.expert_model_parallel_size",
            opts.expert_model_parallel_size,
            "must be 1: roll's Megatron models (Qwen2, Llama) are dense, without experts",
        )
    if world_size % opts.model_parallel_size:
        raise ConfigError(
            f"{key}",
            {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp},
            f"TP x PP x CP = {opts.model_parallel_size} must divide the role's world size "
            f"({world_size}, i.e. len(device_mapping) on GPU)",
        )
    if vpp is not None and (vpp < 1 or pp < 2):
        raise ConfigError(
            f"{key}.virtual_pipeline_model_parallel_size",
            vpp,
            "must be >= 1 and needs pipeline_model_parallel_size >= 2; or null",
        )
    if opts.sequence_parallel and tp == 1:
        raise ConfigError(f"{key}.sequence_parallel", True, "needs tensor_model_parallel_size > 1; set it to false")
    if opts.sequence_parallel and opts.transformer_impl == "local":
        raise ConfigError(
            f"{key}.sequence_parallel",
            True,
            "megatron-core's local layers (torch norms, no Apex) do "
            "not support it; set transformer_impl: "
            "transformer_engine, or sequence_parallel: false",
        )
    if opts.overlap_param_gather and not opts.use_distributed_optimizer:
        raise ConfigError(f"{key}.overlap_param_gather", True, "needs use_distributed_optimizer: true")
    if opts.recompute_method is not None and opts.recompute_granularity != "full":
        raise ConfigError(
            f"{key}.recompute_method", opts.recompute_method, "applies only with recompute_granularity: full"
        )
    if (opts.recompute_method is None) != (opts.recompute_num_layers is None) or (
        opts.recompute_num_layers is not None and opts.recompute_num_layers < 1
    ):
        raise ConfigError(
            f"{key}.recompute_num_layers",
            opts.recompute_num_layers,
            "recompute_method and recompute_num_layers (>= 1) go together; set both or neither",
        )
    if opts.bf16 is not None and opts.bf16 != (dtype == "bf16"):
        raise ConfigError(
            f"{key}.bf16",
            opts.bf16,
            f"disagrees with model_args.dtype={dtype!r}; set dtype to {'bf16' if opts.bf16 else 'fp32'} or drop bf16",
        )
    if dtype == "fp16":
        raise ConfigError(f"{key}", "model_args.dtype=fp16", "roll's Megatron strategy trains in bf16 or fp32")
    if hf_config is not None:
        check_model_shape(opts, key, hf_config)


def check_model_shape(opts: MegatronOptions, key: str, hf_config: dict[str, Any]) -> None:
    """TP divides the query and KV heads; PP (x virtual PP) divides the layers; the architecture is supported."""
    arch = str(hf_config.get("model_type", ""))
    if arch not in ("qwen2", "llama"):
        raise ConfigError(
            f"{key}",
            f"model_type={arch!r}",
            "roll's Megatron weight conversion covers qwen2 (Qwen2/Qwen2.5) and llama models",
        )
    tp = opts.tensor_model_parallel_size
    heads = int(hf_config["num_attention_heads"])
    groups = int(hf_config.get("num_key_value_heads") or heads)
    for name, count in (("num_attention_heads", heads), ("num_key_value_heads", groups)):
        if count % tp:
            raise ConfigError(f"{key}.tensor_model_parallel_size", tp, f"must divide the model's {name} ({count})")
    layers = int(hf_config["num_hidden_layers"])
    chunks = opts.pipeline_model_parallel_size * (opts.virtual_pipeline_model_parallel_size or 1)
    if layers % chunks:
        raise ConfigError(
            f"{key}.pipeline_model_parallel_size",
            opts.pipeline_model_parallel_size,
            f"PP x virtual PP = {chunks} must divide the model's num_hidden_layers ({layers})",
        )
