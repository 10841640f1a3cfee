"""Typed backend options: one dataclass per strategy's ``strategy_args.strategy_config``.

A worker block's ``strategy_config`` is written as a mapping (YAML, ROLL's fragments); the strategy registry names
the options class of each backend (``register_strategy(..., options="roll.config.strategies:SGLangOptions")``) and
:func:`parse_options` turns the mapping into that class: an unknown key, a wrong type, a bad choice or a value
outside the field's ``allowed`` range is a one-line :class:`ConfigError` naming
``<role>.strategy_args.strategy_config.<key>``. Defaults live only in these classes; a backend reads its typed
options, never ``strategy_config.get(key, default)``.

A backend in another file registers its own options class the same way (a dataclass with ``fld`` fields and, for
rules across its fields, a ``check(key)`` method). Optional hooks: ``check_worker(worker, key)`` (rules that need
the worker block or model files; run by the preflight), ``ignored()`` (``(key, why)`` of set keys that are not
used; the preflight warns) and a classmethod ``from_mapping(raw, key)`` that replaces the generic parsing (for
keys beyond the fields, such as :class:`roll.config.fsdp2.FSDP2Options`'s aliases and ignored keys).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

from roll.config.errors import ConfigError
from roll.config.fields import check_field, fld

T = TypeVar("T")


@dataclass
class DeepSpeedTrainOptions:
    """``deepspeed_train``: roll's shorthands plus the sections of a DeepSpeed config (ROLL's ``deepspeed_zero*``
    fragments), which go to DeepSpeed as written; ``auto`` values are filled from the worker block."""

    zero_stage: int | None = fld(
        None, "Shorthand for zero_optimization.stage (None = the section's stage, or 0).", choices=[None, 0, 1, 2, 3]
    )
    offload_optimizer: str | None = fld(
        None,
        "Shorthand: 'cpu' offloads the optimizer states (zero_optimization.offload_optimizer).",
        choices=[None, "cpu", "none"],
    )
    offload_param: str | None = fld(
        None,
        "Shorthand: 'cpu' offloads the parameters (ZeRO-3; zero_optimization.offload_param).",
        choices=[None, "cpu", "none"],
    )
    zero_optimization: dict[str, Any] = fld(
        default_factory=dict, help="DeepSpeed's zero_optimization section (stage, buckets, offload_*), passed through."
    )
    train_batch_size: Any = fld(
        "auto",
        "DeepSpeed's; 'auto' = per_device_train_batch_size x "
        "gradient_accumulation_steps x world_size (another value must equal it).",
    )
    train_micro_batch_size_per_gpu: Any = fld("auto", "DeepSpeed's; 'auto' = per_device_train_batch_size.")
    gradient_accumulation_steps: Any = fld("auto", "DeepSpeed's; 'auto' = training_args.gradient_accumulation_steps.")
    gradient_clipping: Any = fld("auto", "DeepSpeed's; 'auto' = max_grad_norm.")
    bf16: dict[str, Any] = fld(
        default_factory=dict,
        help="DeepSpeed's bf16 section; enabled follows model_args.dtype ('auto' or the matching value).",
    )
    fp16: dict[str, Any] = fld(
        default_factory=dict,
        help="DeepSpeed's fp16 section; enabled follows model_args.dtype ('auto' or the matching value).",
    )
    zero_force_ds_cpu_optimizer: bool | None = fld(
        None, "DeepSpeed's; false lets ZeRO offload run with roll's torch AdamW (None = DeepSpeed's default)."
    )
    zero_allow_untested_optimizer: bool | None = fld(None, "DeepSpeed's (None = DeepSpeed's default).")
    activation_checkpointing: dict[str, Any] = fld(default_factory=dict, help="DeepSpeed's section, passed through.")
    prescale_gradients: bool | None = fld(None, "DeepSpeed's (None = DeepSpeed's default).")
    steps_per_print: int = fld(10**9, "DeepSpeed's logging interval (roll logs its own metrics).", allowed=">= 1")
    wall_clock_breakdown: bool = fld(False, "DeepSpeed's timing breakdown.")
    optimizer: dict[str, Any] = fld(
        default_factory=dict, help="Not used: roll builds torch AdamW from training_args (a warning says so when set)."
    )
    scheduler: dict[str, Any] = fld(
        default_factory=dict,
        help="Not used: roll schedules the learning rate from training_args (a warning says so when set).",
    )

    communication_data_type: str | None = fld(
        None, "DeepSpeed's (None = DeepSpeed's default).", choices=[None, "fp16", "bf16", "fp32"]
    )

    #: The batch keys ``auto`` fills from the worker block, with the field of ``training_args`` each equals.
    BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")

    @property
    def stage(self) -> Any:
        """The ZeRO stage in effect: the shorthand, else the section's (default 0)."""
        return self.zero_stage if self.zero_stage is not None else self.zero_optimization.get("stage", 0)

    def check(self, key: str) -> None:
        """The stage is 0-3 and the offloads fit it; ``auto`` values are ``auto`` or in range."""
        if self.stage not in (0, 1, 2, 3):
            raise ConfigError(f"{key}.zero_optimization.stage", self.stage, "must be one of 0, 1, 2, 3")
        if self.offload_param == "cpu" and self.stage != 3:
            raise ConfigError(f"{key}.offload_param", "cpu", f"needs ZeRO stage 3 (the stage is {self.stage})")
        if self.offload_optimizer == "cpu" and self.stage == 0:
            raise ConfigError(f"{key}.offload_optimizer", "cpu", "needs ZeRO stage 1, 2 or 3 (the stage is 0)")
        for name in self.BATCH_KEYS:
            value = getattr(self, name)
            if value != "auto" and not (isinstance(value, int) and value >= 1):
                raise ConfigError(f"{key}.{name}", value, "must be 'auto' (from the worker block) or an integer >= 1")
        clip = self.gradient_clipping
        if clip != "auto" and not (isinstance(clip, (int, float)) and clip >= 0):
            raise ConfigError(f"{key}.gradient_clipping", clip, "must be 'auto' (= max_grad_norm) or a number >= 0")
        for name in ("bf16", "fp16"):
            enabled = getattr(self, name).get("enabled", "auto")
            if enabled != "auto" and not isinstance(enabled, bool):
                raise ConfigError(f"{key}.{name}.enabled", enabled, "must be 'auto' (from model_args.dtype) or a bool")

    def check_worker(self, worker: Any, key: str) -> None:
        """Values given instead of ``auto`` agree with the worker block (batch sizes, world size, dtype)."""
        ta = worker.training_args
        resolved = {
            "train_micro_batch_size_per_gpu": ta.per_device_train_batch_size,
            "gradient_accumulation_steps": ta.gradient_accumulation_steps,
            "train_batch_size": ta.per_device_train_batch_size * ta.gradient_accumulation_steps * worker.world_size,
        }
        for name, value in resolved.items():
            if getattr(self, name) not in ("auto", value):
                raise ConfigError(
                    f"{key}.{name}",
                    getattr(self, name),
                    f"disagrees with the worker block ({value}: training_args and world_size); set 'auto'",
                )
        dtype = worker.model_args.dtype
        for name in ("bf16", "fp16"):
            enabled = getattr(self, name).get("enabled", "auto")
            if enabled != "auto" and enabled != (dtype == name):
                raise ConfigError(
                    f"{key}.{name}.enabled",
                    enabled,
                    f"disagrees with model_args.dtype ({dtype}); set 'auto' (dtype decides the precision)",
                )

    def ignored(self) -> list[tuple[str, str]]:
        """``(key, why and what to use)`` for set keys roll does not use."""
        out = []
        if self.optimizer:
            out.append(
                (
                    "optimizer",
                    "roll builds torch AdamW from training_args; set learning_rate, weight_decay, "
                    "adam_beta1/adam_beta2 there",
                )
            )
        if self.scheduler:
            out.append(
                (
                    "scheduler",
                    "roll schedules the learning rate from training_args; set warmup_steps and lr_scheduler_type there",
                )
            )
        return out


@dataclass
class DeepSpeedInferOptions:
    """``deepspeed_infer``: a DeepSpeed engine without optimizer (reference log-probs)."""

    zero_stage: int = fld(
        0,
        "0 = a full model copy per worker; 3 = parameters partitioned over the role's workers "
        "(ZeRO-Inference). Stages 1/2 only partition optimizer state.",
        choices=[0, 3],
    )
    offload_param: str = fld(
        "none", "'cpu' keeps the partitioned parameters in CPU memory (zero_stage 3 only).", choices=["cpu", "none"]
    )

    def check(self, key: str) -> None:
        """CPU offload needs partitioned parameters."""
        if self.offload_param == "cpu" and self.zero_stage != 3:
            raise ConfigError(f"{key}.offload_param", self.offload_param, "needs zero_stage: 3")


#: Bytes per weight bucket unless configured (``weight_bucket_bytes``).
DEFAULT_BUCKET_BYTES = 512 * 2**20


@dataclass
class HFInferOptions:
    """``hf_infer``: transformers ``generate`` and forward passes (CPU or one GPU)."""

    generate_batch_size: int = fld(
        64,
        "Prompts per generate call (a larger request is generated in chunks; at most "
        "the pipeline's max_running_requests).",
        allowed=">= 1",
    )
    reuse_kv_cache: bool = fld(
        True, "Keep each sequence's keys and values for its next turn (roll.strategies.turn_cache)."
    )
    kv_cache_mb: float = fld(
        1024,
        "Memory the kept keys and values may take, in MiB (turn reuse off with reuse_kv_cache: false).",
        allowed="> 0",
    )
    weight_bucket_bytes: int = fld(
        DEFAULT_BUCKET_BYTES,
        "Bytes per weight bucket of a CUDA-IPC or in-process (distributed=local) sync from actor_train.",
        allowed=">= 1",
    )


#: Values of :attr:`SGLangOptions.weight_sync` (see :func:`roll.distributed.placement.weight_sync_mode`).
WEIGHT_SYNC_CHOICES = ("auto", "nccl", "cuda_ipc", "copy")


@dataclass
class SGLangOptions:
    """``sglang``: roll's keys (weight sync, memory release) and ``sglang.Engine`` arguments. Typed engine arguments
    that are None are left to SGLang; any other Engine argument goes in ``engine_args``."""

    weight_sync: str = fld(
        "auto",
        "How actor_train's weights arrive: auto (cuda_ipc when every engine GPU holds an "
        "actor_train rank, nccl when actor_infer's GPUs are disjoint under Ray, else "
        "copy), cuda_ipc, nccl or copy.",
        choices=list(WEIGHT_SYNC_CHOICES),
    )
    weight_bucket_bytes: int = fld(
        DEFAULT_BUCKET_BYTES,
        "Bytes per weight bucket of a sync (one update_weights_from_tensor call or broadcast).",
        allowed=">= 1",
    )
    release_tags: list[str] | None = fld(
        None, "What offload_states releases (None = all: weights, kv_cache, cuda_graph)."
    )
    tp_size: int | None = fld(None, "Tensor-parallel size of one engine (None = num_gpus_per_worker).", allowed=">= 1")
    mem_fraction_static: float = fld(0.5, "Fraction of the GPU for weights and KV cache.", allowed="in (0, 1)")
    attention_backend: str = fld("triton", "SGLang attention backend (FA3 kernels are absent from the lent bundles).")
    sampling_backend: str = fld("pytorch", "SGLang sampling backend.")
    enable_memory_saver: bool = fld(True, "Needed to release and resume memory when colocated with a trainer.")
    disable_prefill_cuda_graph: bool = fld(True, "SGLang's flag.")
    log_level: str = fld("warning", "SGLang's log level.", choices=["debug", "info", "warning", "error", "critical"])
    dtype: str | None = fld(None, "Engine dtype (None = from model_args.dtype).")
    context_length: int | None = fld(None, "Engine context length (None = the model's).", allowed=">= 1")
    max_running_requests: int | None = fld(
        None,
        "Engine's most requests in flight (None = the pipeline's max_running_requests, else SGLang's default).",
        allowed=">= 1",
    )
    chunked_prefill_size: int | None = fld(None, "SGLang's (None = its default).")
    disable_cuda_graph: bool | None = fld(None, "SGLang's (None = its default).")
    load_format: str | None = fld(None, "SGLang's (None = its default).")
    engine_args: dict[str, Any] = fld(
        default_factory=dict, help="Other sglang.Engine keyword arguments, passed through as written."
    )

    #: What ``release_memory_occupation`` can release.
    RELEASE_TAGS = ("weights", "kv_cache", "cuda_graph")
    #: What an engine that serves LoRA adapters releases by default: its base weights never change, so they stay.
    LORA_RELEASE_TAGS = ("kv_cache", "cuda_graph")

    def released(self, serves_adapters: bool) -> list[str] | None:
        """The tags released between phases (None: all, SGLang's own default): ``release_tags`` when set, else all,
        or with LoRA adapters (``serves_adapters``) all but the weights (reloading unchanged base weights would
        only cost time)."""
        if self.release_tags is not None:
            return list(self.release_tags)
        return list(self.LORA_RELEASE_TAGS) if serves_adapters else None

    #: Engine arguments roll sets itself (model_path from model_args, random_seed from seed).
    RESERVED = ("model_path", "skip_tokenizer_init", "random_seed")
    #: Where an engine argument without a typed field goes (named in the unknown-key error).
    PASSTHROUGH_FIELD = "engine_args"

    def check(self, key: str) -> None:
        """Chunked prefill is on or -1, release tags are known, reserved engine arguments are not set (the ranges
        of single fields are their ``allowed``)."""
        if self.chunked_prefill_size is not None and not (
            self.chunked_prefill_size >= 1 or self.chunked_prefill_size == -1
        ):
            raise ConfigError(
                f"{key}.chunked_prefill_size",
                self.chunked_prefill_size,
                "must be >= 1, -1 (no chunking) or null (SGLang's default)",
            )
        unknown = sorted(set(self.release_tags or []) - set(self.RELEASE_TAGS))
        if unknown:
            raise ConfigError(
                f"{key}.release_tags",
                self.release_tags,
                f"unknown tags {unknown}; allowed: {', '.join(self.RELEASE_TAGS)} (null = all)",
            )
        bad = sorted(set(self.RESERVED) & set(self.engine_args))
        if bad:
            raise ConfigError(
                f"{key}.engine_args",
                bad,
                "roll sets these itself (model_path from "
                "model_args.model_name_or_path, random_seed from seed); "
                "remove them",
            )


def parse_options(cls: type[T], raw: Any, key: str) -> T:
    """``raw`` (a mapping, or already a ``cls``) as a ``cls`` instance.

    Raises:
        ConfigError: unknown key (the allowed keys are listed), wrong type, bad choice, or a rule of ``cls.check``;
            ``key`` is the mapping's dotted path (``actor_train.strategy_args.strategy_config``).
    """
    if isinstance(raw, cls):
        options = raw
    elif hasattr(cls, "from_mapping"):  # a class with keys beyond its fields (aliases, ignored keys)
        options = cls.from_mapping(raw, key)
    else:
        options = _build(cls, raw, key)
    for f in dataclasses.fields(cls):
        check_field(f, getattr(options, f.name), f"{key}.{f.name}")
    check = getattr(options, "check", None)
    if check is not None:
        check(key)
    return options


def _build(cls: type[T], raw: Any, key: str) -> T:
    """Construct ``cls`` from a mapping with OmegaConf's type checks, naming the offending key."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if raw is None:
        raw = {}
    if not hasattr(raw, "items"):
        raise ConfigError(key, raw, f"expected a mapping of {cls.__name__} keys")
    allowed = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(str(k) for k in raw if k not in allowed)
    if unknown:
        passthrough = getattr(cls, "PASSTHROUGH_FIELD", None)  # the field that takes keys roll does not type
        hint = f"; other keys go under {key}.{passthrough} ({{{unknown[0]}: ...}})" if passthrough else ""
        raise ConfigError(
            f"{key}.{unknown[0]}", raw[unknown[0]], f"not a key of {cls.__name__}; allowed: {', '.join(allowed)}{hint}"
        )
    plain = OmegaConf.to_container(OmegaConf.create(dict(raw)), resolve=True) if raw else {}
    try:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), plain))
    except OmegaConfBaseException as exc:
        leaf = getattr(exc, "full_key", None) or "?"
        value = getattr(exc, "value", None)
        raise ConfigError(f"{key}.{leaf}", value if value is not None else "?", str(exc).splitlines()[0]) from None


def options_as_dict(options: Any) -> dict[str, Any]:
    """A typed options object as a plain dict (every field, defaults included)."""
    return dataclasses.asdict(options)
