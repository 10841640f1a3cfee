"""Config of the RLVR pipeline: prompt data, rule rewards, validation data, dynamic sampling, warm start, workers.

Data keys follow ROLL: ``actor_train.data_args.file_name`` (list of files), ``.prompt`` / ``.messages`` (the
prompt column), plus the ground-truth / tag columns and truncation mode here. Cross-field rules live in
:func:`check_rlvr` (called by :func:`roll.config.validation.validate`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from roll.config.agentic import TinyModelConfig
from roll.config.base import BaseConfig
from roll.config.errors import ConfigError
from roll.config.fields import fld
from roll.config.validation import check_train_batch, global_train_batch
from roll.config.worker import GeneratingArgs


@dataclass
class ValidationGeneratingArgs(GeneratingArgs):
    """Sampling for validation: greedy, at most ``response_length`` new tokens unless set."""

    max_new_tokens: int | None = fld(
        None, "Maximum tokens per validation response; None = response_length.", allowed=">= 1"
    )
    temperature: float = fld(0.0, "Sampling temperature; 0 = greedy.")
    do_sample: bool = fld(False, "Sample (True) or decode greedily (False).")


@dataclass
class ValidationDataConfig:
    """Held-out prompts scored every ``eval_steps`` (accuracy per tag). The whole block may be left out or null."""

    file_name: list[str] | None = fld(
        default_factory=list, help="Validation data files (parquet/jsonl); empty or null = none."
    )
    max_samples: int = fld(0, "Use at most this many validation prompts (0 = all; the first N, file order).")
    generating_args: ValidationGeneratingArgs = field(
        default_factory=ValidationGeneratingArgs,
        metadata={
            "help": "Sampling for validation (greedy, max_new_tokens = response_length by default; one "
            "response per prompt)."
        },
    )


@dataclass
class RewardsConfig:
    """Rule rewards: which registered reward scores each data tag, its options, and the reward workers."""

    tag_to_reward: dict[str, str] = fld(
        default_factory=dict, help="Data tag -> registered reward name; unlisted tags use the tag itself."
    )
    reward_options: dict[str, dict[str, Any]] = fld(
        default_factory=dict, help="Options per reward name, e.g. {math: {format_reward: 0.1, timeout_s: 1.0}}."
    )
    num_workers: int = fld(2, "Reward workers (Ray actors; in-process when distributed=local).", allowed=">= 1")
    num_cpus_per_worker: float = fld(0.25, "CPUs each reward actor reserves.")
    timeout_s: float = fld(
        60.0,
        "Seconds one reward call may take; a call still running then stops the run with one "
        "line naming the reward function and the sample (0 = no limit).",
        allowed=">= 0",
    )


@dataclass
class DynamicSamplingConfig:
    """Drop prompt groups with no learning signal and refill the batch with additional prompts."""

    enabled: bool = fld(False, "Filter groups (see the thresholds below).")
    drop_all_equal: bool = fld(True, "Drop a group whose rewards are all equal (std ~ 0: zero GRPO advantage).")
    mean_low: float | None = fld(None, "Drop a group whose mean reward is below this (None = no bound).")
    mean_high: float | None = fld(None, "Drop a group whose mean reward is above this (None = no bound).")
    std_min: float | None = fld(
        None, "Drop a group whose reward std (population) is below this (None = no bound).", allowed=">= 0"
    )


@dataclass
class RLVRWarmupConfig:
    """Supervised warm start on (prompt, ground-truth answer) pairs of the training data, before RL."""

    enabled: bool = fld(False, "Run the warm start.")
    answer_template: str = fld("<answer>{answer}</answer>", "Response text trained on ({answer}).")
    steps: int = fld(50, "Optimizer steps.")
    batch_size: int = fld(32, "Examples per optimizer step.")
    learning_rate: float = fld(3.0e-3, "Learning rate of the warm start.", allowed="> 0")
    max_examples: int = fld(
        0, "Train on at most the first N shuffled examples (0 = all), leaving RL the rest.", allowed=">= 0"
    )
    seed: int = fld(12345, "Seed of the example order.")


@dataclass
class RLVRConfig(BaseConfig):
    """The RLVR pipeline: prompts -> grouped responses -> rule rewards -> advantages -> PPO-style update."""

    ground_truth_key: str = fld("ground_truth", "Column holding the reference answer.")
    tag_key: str = fld("tag", "Column holding the domain tag (selects the reward).")
    default_tag: str | None = fld(
        None, "Tag of rows without one (no tag column, or a null tag), e.g. math; None = every row must have a tag."
    )
    truncation: str = fld(
        "error", "What to do with a prompt longer than prompt_length.", choices=["error", "left", "right"]
    )
    filter_overlong_prompts: bool = fld(False, "Drop prompts longer than prompt_length (reported) instead.")
    system_prompt: str | None = fld(None, "System message prepended to prompts without one (None = none).")
    validation: ValidationDataConfig | None = field(
        default_factory=ValidationDataConfig, metadata={"help": "Validation prompts and sampling; null = none."}
    )
    rewards: RewardsConfig = field(default_factory=RewardsConfig, metadata={"help": "Rule rewards and workers."})
    dynamic_sampling: DynamicSamplingConfig = field(
        default_factory=DynamicSamplingConfig, metadata={"help": "Group filters (DAPO-style)."}
    )
    tiny_model: TinyModelConfig | None = fld(
        None, "Build a tiny model at `pretrain` if it is missing (tokenizer trained on the data's text)."
    )
    sft_warmup: RLVRWarmupConfig = field(
        default_factory=RLVRWarmupConfig, metadata={"help": "Supervised warm start before RL."}
    )
    rollout_dump_steps: int = fld(
        0,
        "Write prompts, responses, rewards and token advantages as JSONL every N "
        "steps, and validation responses at every validation (0 = never); `roll view` "
        "shows them.",
        allowed=">= 0",
    )
    rollout_dump_max: int = fld(
        64, "At most this many responses per dump file, whole prompt groups (0 = all).", allowed=">= 0"
    )

    #: The score normalization of this pipeline (an entry of ``roll.ppo.advantage_step.SCORE_NORMALIZERS``); not
    #: a field.
    score_normalizer = "response"
    pipeline = "RLVR"  # the name of this pipeline in :data:`roll.config.validation.UNUSED`; not a field
    #: Keys of the agentic pipeline, named when they appear in an RLVR config (see the loader's unknown-key error).
    ELSEWHERE = {  # not a field (no annotation)
        "custom_envs": "agentic only; an RLVR response is limited by response_length "
        "(actor_infer.generating_args.max_new_tokens)",
        "train_env_manager": "agentic only; RLVR prompts come from actor_train.data_args.file_name, "
        "num_return_sequences_in_group responses each",
        "val_env_manager": "agentic only; RLVR validation data is validation.file_name",
        "reward_normalization": "agentic only; RLVR normalizes rewards with reward_norm (batch, group, running)",
        "trajectory_dump_steps": "agentic's; the RLVR equivalent is rollout_dump_steps",
        "trajectory_dump_max": "agentic's; the RLVR equivalent is rollout_dump_max",
        "trajectory_dump_frames": "agentic's (frames of vision-language envs); RLVR dumps have none",
        "trajectory_dump_frame_kib": "agentic's (frames of vision-language envs); RLVR dumps have none",
    }

    def check_pipeline(self) -> None:
        """The RLVR rules (:func:`check_rlvr`)."""
        check_rlvr(self)


def _check_sampling(cfg: RLVRConfig) -> None:
    ds = cfg.dynamic_sampling
    if ds.mean_low is not None and ds.mean_high is not None and ds.mean_low > ds.mean_high:
        raise ConfigError("dynamic_sampling.mean_low", ds.mean_low, f"must be <= mean_high ({ds.mean_high})")
    if cfg.is_use_additional_prompts and not ds.enabled:
        raise ConfigError(
            "is_use_additional_prompts",
            True,
            "additional prompts only refill filtered groups; set dynamic_sampling.enabled: true or turn it off",
        )


def _check_lengths(cfg: RLVRConfig) -> None:
    if cfg.prompt_length + cfg.response_length > cfg.sequence_length:
        raise ConfigError(
            "sequence_length",
            cfg.sequence_length,
            f"must be >= prompt_length ({cfg.prompt_length}) + response_length ({cfg.response_length})",
        )
    for key, args in (
        ("actor_infer.generating_args", cfg.actor_infer.generating_args),
        ("validation.generating_args", cfg.validation.generating_args),
    ):
        if not 1 <= args.max_new_tokens <= cfg.response_length:
            raise ConfigError(
                f"{key}.max_new_tokens", args.max_new_tokens, f"must be in [1, response_length={cfg.response_length}]"
            )
        if args.num_return_sequences not in (1, cfg.num_return_sequences_in_group):
            raise ConfigError(
                f"{key}.num_return_sequences",
                args.num_return_sequences,
                f"must be 1 or num_return_sequences_in_group ({cfg.num_return_sequences_in_group}): "
                "the group size is num_return_sequences_in_group (prompts are repeated)",
            )


def _check_warmup(cfg: RLVRConfig) -> None:
    sft, worker = cfg.sft_warmup, cfg.actor_train
    if "{answer}" not in sft.answer_template:
        raise ConfigError("sft_warmup.answer_template", sft.answer_template, "must contain {answer}")
    if sft.steps < 1:
        raise ConfigError("sft_warmup.steps", sft.steps, "must be >= 1 (or set sft_warmup.enabled: false)")
    global_batch = global_train_batch(worker)
    if sft.batch_size < 1 or sft.batch_size % global_batch:
        raise ConfigError(
            "sft_warmup.batch_size",
            sft.batch_size,
            f"must be a positive multiple of actor_train's global train batch ({global_batch} = "
            "per_device_train_batch_size x gradient_accumulation_steps x data-parallel size)",
        )


def check_rlvr(cfg: RLVRConfig) -> None:
    """Rules of the RLVR pipeline: data columns, lengths, group sizes, sampling thresholds, batch arithmetic (the
    data files and rows, and what the estimator needs, are checked in the preflight)."""
    args = cfg.actor_train.data_args
    if args.prompt and args.messages:
        raise ConfigError(
            "actor_train.data_args.messages",
            args.messages,
            f"prompt ({args.prompt!r}) and messages are exclusive; set one of them to null",
        )
    if cfg.default_tag is not None and not cfg.default_tag.strip():
        raise ConfigError("default_tag", cfg.default_tag, "must be a non-empty tag (e.g. math) or null")
    if cfg.validation is None:  # `validation: null`: no validation
        cfg.validation = ValidationDataConfig()
    if cfg.validation.file_name is None:  # `validation.file_name: null`: no validation data
        cfg.validation.file_name = []
    if cfg.validation.generating_args.max_new_tokens is None:
        cfg.validation.generating_args.max_new_tokens = cfg.response_length
    cfg.validation.generating_args.check("validation.generating_args")
    if not args.file_name:
        raise ConfigError(
            "actor_train.data_args.file_name",
            args.file_name,
            "list at least one .jsonl/.parquet data file, e.g. [data/math_tiny/train.jsonl]",
        )
    _check_lengths(cfg)
    _check_sampling(cfg)
    if cfg.reward_norm is None and (cfg.reward_shift or cfg.reward_scale):
        raise ConfigError(
            "reward_norm",
            None,
            "reward_shift / reward_scale need a scope: set reward_norm to batch, group or running, or turn them off",
        )
    if cfg.sft_warmup.enabled:
        _check_warmup(cfg)
    samples = cfg.rollout_batch_size * cfg.num_return_sequences_in_group
    check_train_batch(cfg, "actor_train", samples)
    if cfg.critic is not None:
        check_train_batch(cfg, "critic", samples)
