"""Worker blocks (``actor_train``, ``actor_infer``, ``reference``, ``critic``): model, training, data,
generation and strategy arguments, plus placement (``device_mapping``, ``world_size``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from roll.config.fields import check_rules, fld

#: Attention implementations that cannot take the per-row mask of shared-prefix rows.
MASKLESS_ATTENTION = ("flash_attention_2", "flash_attention_3", "roll_varlen")


@dataclass
class ModelArgs:
    """How a worker loads its model."""

    model_name_or_path: str | None = fld(None, "Hugging Face model directory (or hub name) the worker loads.")
    dtype: str = fld("fp32", "Model dtype.", choices=["fp32", "bf16", "fp16"])
    disable_gradient_checkpointing: bool = fld(
        False, "Disable activation (gradient) checkpointing; only used by training strategies."
    )
    attn_implementation: str | None = fld(
        None, "transformers attention implementation (eager, sdpa, flash_attention_2); None = library default."
    )
    trust_remote_code: bool = fld(False, "Passed to transformers from_pretrained.")
    use_liger_kernel: bool = fld(
        False,
        "Training and scoring models (not generation engines) run Liger's fused Triton kernels for RMSNorm, "
        "SwiGLU and RoPE (pip install liger-kernel; CUDA only; roll.models.kernels).",
    )
    compile_log_probs: bool = fld(
        True,
        "On CUDA, torch.compile the LM-head pass's log-softmax / entropy math into fused kernels "
        "(roll.models.logprobs); false = eager PyTorch. CPU always runs eager.",
    )
    freeze_vision_tower: bool = fld(
        False,
        "Vision-language actors (Qwen2.5-VL): train without the vision tower (its parameters get no gradient and no "
        "optimizer state; the merger that projects it into the decoder is part of the tower). docs/vlm.md.",
    )
    lora_target: Any = fld(
        None,
        "LoRA (peft) on actor_train: the modules that get adapters: all-linear (every linear layer but the LM "
        "head), names as a comma string (q_proj,v_proj) or a list, or a regex over module paths; None = full "
        "fine-tuning. actor_infer may repeat actor_train's LoRA keys, as ROLL's configs do (docs/lora.md).",
    )
    lora_rank: int | None = fld(None, "LoRA rank r (with lora_target); None = 8, ROLL's default.", allowed=">= 1")
    lora_alpha: float | None = fld(
        None,
        "LoRA scale: adapters add (lora_alpha / lora_rank) B A; None = 2 x lora_rank, ROLL's default.",
        allowed="> 0",
    )
    lora_dropout: float = fld(0.0, "Dropout on the LoRA adapters' input while training.", allowed="in [0, 1)")
    lora_reference: str = fld(
        "adapters_off",
        "With LoRA on actor_train, where reference log-probs (KL) come from: adapters_off = the actor with its "
        "adapters disabled, i.e. the base model (no reference worker starts, a reference block is ignored); "
        "separate = the reference block's own worker (a second copy of the base model).",
        choices=["adapters_off", "separate"],
    )


@dataclass
class TrainingArgs:
    """Optimizer and batch settings of a training role."""

    learning_rate: float = fld(1.0e-6, "Peak learning rate of AdamW.", allowed="> 0")
    weight_decay: float = fld(0.0, "AdamW weight decay.", allowed=">= 0")
    adam_beta1: float = fld(0.9, "AdamW beta1.", allowed="in [0, 1)")
    adam_beta2: float = fld(0.999, "AdamW beta2.", allowed="in [0, 1)")
    per_device_train_batch_size: int = fld(
        1, "Micro-batch size per training worker (samples per forward).", allowed=">= 1"
    )
    gradient_accumulation_steps: int = fld(1, "Micro-batches accumulated before one optimizer step.", allowed=">= 1")
    warmup_steps: int = fld(0, "Linear learning-rate warmup, in optimizer steps.", allowed=">= 0")
    lr_scheduler_type: str = fld(
        "constant", "Learning-rate schedule after warmup.", choices=["constant", "linear", "cosine"]
    )
    max_steps: int = fld(
        0, "Optimizer steps the schedule decays over (linear/cosine); 0 = derive from the pipeline.", allowed=">= 0"
    )


@dataclass
class DataArgs:
    """Where a worker's prompt data comes from (RLVR and SFT)."""

    template: str = fld(
        "native",
        "Chat template name (ROLL's: native, qwen2_5, qwen3, ...). roll formats every "
        "conversation with the tokenizer's own chat template, which is what ROLL's named "
        "templates reproduce for their model families, so any name is accepted.",
    )
    file_name: Any = fld(
        None, "Data file or list of files (parquet, jsonl or json); a single path becomes a one-element list."
    )
    prompt: str | None = fld(None, "Column used as the prompt text (exclusive with messages).")
    messages: str | None = fld(None, "Column holding chat messages (exclusive with prompt).")


@dataclass
class GeneratingArgs:
    """Sampling parameters for generation."""

    max_new_tokens: int = fld(
        128, "Maximum tokens generated per request (per turn in agentic rollouts).", allowed=">= 1"
    )
    temperature: float = fld(1.0, "Sampling temperature; 0 = greedy.", allowed=">= 0")
    top_p: float = fld(1.0, "Nucleus sampling threshold (1 = off).", allowed="in (0, 1]")
    top_k: int = fld(0, "Top-k sampling; 0 or -1 disables it.", allowed=">= -1")
    do_sample: bool = fld(True, "Sample (True) or decode greedily (False).")
    num_beams: int = fld(
        1, "Beam count: RL samples its responses, so 1 (no beam search).", allowed="== 1; RL samples (no beam search)"
    )
    num_return_sequences: int = fld(1, "Samples per prompt returned by one request.", allowed=">= 1")
    repetition_penalty: float = fld(1.0, "Repetition penalty (1.0 = off).", allowed="> 0")
    stop_token_ids: list[int] = fld(default_factory=list, help="Extra token ids that end generation.")
    ignore_eos: bool = fld(False, "Generate max_new_tokens even past end tokens (throughput benchmarks).")

    def check(self, key: str) -> None:
        """Stop tokens are token ids (the ranges of the other fields are their ``allowed``)."""
        check_rules(
            key,
            self,
            [
                (
                    "stop_token_ids",
                    all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids),
                    "must be token ids (integers >= 0)",
                )
            ],
        )


@dataclass
class StrategyArgs:
    """Which backend serves the role and its backend-specific settings."""

    strategy_name: str = fld("hf_infer", "Backend of this role (see roll.strategies.list_strategies()).")
    strategy_config: dict[str, Any] = fld(
        default_factory=dict,
        help="Backend settings, read as the strategy's typed options class (DeepSpeed sections "
        "and shorthands, hf_infer or SGLang keys; see 'Strategy options' below).",
    )

    #: ``strategy_config`` parsed into the strategy's typed options class, with the name and mapping it came from:
    #: set once by :func:`roll.strategies.registry.strategy_options` (the launch's preflight asks first) and read by
    #: every later asker, the worker that hands it to its strategy included; not a config key.
    options: ClassVar[Any] = None


@dataclass
class WorkerConfig:
    """One role: what model it runs, with which backend, where."""

    model_args: ModelArgs = field(default_factory=ModelArgs, metadata={"help": "Model loading arguments."})
    training_args: TrainingArgs = field(
        default_factory=TrainingArgs, metadata={"help": "Optimizer and batch arguments (training roles)."}
    )
    data_args: DataArgs = field(default_factory=DataArgs, metadata={"help": "Data arguments (RLVR/SFT)."})
    generating_args: GeneratingArgs = field(
        default_factory=GeneratingArgs, metadata={"help": "Sampling arguments (inference roles)."}
    )
    strategy_args: StrategyArgs = field(
        default_factory=StrategyArgs, metadata={"help": "Backend selection and settings."}
    )
    device_mapping: Any = fld(None, "GPU ids of this role: a list or the string 'list(range(a,b))'; empty/None on CPU.")
    world_size: int = fld(
        1, "Number of workers of this role (CPU); on GPU derived from device_mapping.", allowed=">= 1"
    )
    num_gpus_per_worker: int = fld(1, "GPUs per worker (tensor-parallel inference engines).", allowed=">= 1")
    num_cpus_per_worker: float = fld(1.0, "CPU cores Ray reserves for each worker of this role.", allowed="> 0")
    infer_batch_size: int = fld(8, "Micro-batch size for log-prob / value forward passes.", allowed=">= 1")
    use_dynamic_batching_in_train: bool = fld(
        False,
        "Form training micro-batches by a token budget (max_tokens_per_microbatch_in_train) instead of "
        "per_device_train_batch_size samples; the gradient is the same (micro-batches are weighted exactly).",
    )
    max_tokens_per_microbatch_in_train: int = fld(
        0,
        "Token budget of a training micro-batch with use_dynamic_batching_in_train (padded tokens, or real "
        "tokens with use_sequence_packing).",
    )
    use_dynamic_batching_in_infer: bool = fld(
        False,
        "Form log-prob/value micro-batches by a token budget (max_tokens_per_microbatch_in_infer) instead "
        "of infer_batch_size samples.",
    )
    max_tokens_per_microbatch_in_infer: int = fld(
        0, "Token budget of a log-prob/value micro-batch with use_dynamic_batching_in_infer."
    )
    use_sequence_packing: bool = fld(
        False,
        "Run each micro-batch as one packed row without padding (position ids restart per sample; attention "
        "stays within a sample). Same results as the padded forward within float tolerance.",
    )
    use_prefix_sharing: Any = fld(
        "auto",
        "Run the samples of a micro-batch that begin with the same tokens (a GRPO group's prompt) as one row: "
        "the shared prefix once, then each sample's own tokens, which attend to the prefix and to themselves. "
        "Same results as the padded forward within float tolerance. auto = on wherever it applies (roll's "
        "log-prob forward and hf_infer, no sequence packing, an attention implementation that takes a mask), "
        "with the row planner keeping apart the samples whose sharing does not pay; true = required (a "
        "config error where it cannot apply); false = off.",
        choices=["auto", True, False],
    )
    model_update_frequency: int = fld(
        1,
        "Sync weights to this role every N training steps (RLVR actor_infer; "
        "the agentic pipeline syncs every step and accepts only 1).",
        allowed=">= 1",
    )

    def shares_prefixes(self) -> bool:
        """Whether this role's forward passes plan shared-prefix rows (:mod:`roll.models.prefix_sharing`):
        ``use_prefix_sharing`` true, or ``auto`` without sequence packing and with an attention implementation that
        takes a mask. Strategies that are not roll's forward (SGLang, Megatron) never ask."""
        if self.use_prefix_sharing == "auto":
            return not self.use_sequence_packing and self.model_args.attn_implementation not in MASKLESS_ATTENTION
        return bool(self.use_prefix_sharing)
