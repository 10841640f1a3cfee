"""Config of the agentic pipeline: env managers, custom envs, reward normalization, warm start, workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from roll.config.base import BaseConfig
from roll.config.fields import fld


@dataclass
class CustomEnvConfig:
    """One env tag: which registered env, its kwargs, and per-tag rollout limits."""

    env_type: str = fld("sokoban", "Registered env name (see roll.envs.list_envs()).")
    env_config: Dict[str, Any] = fld(default_factory=dict, help="Keyword arguments of the env constructor.")
    max_actions_per_traj: int = fld(10, "Actions (turns) per trajectory before it is cut.")
    max_tokens_per_step: int = fld(64, "Maximum tokens the model generates per turn.")
    system_prompt: str = fld("You are a helpful assistant that solves the task step by step.",
                             "System message of every conversation.")
    first_turn_template: str = fld("{instruction}\n{observation}",
                                   "User message of the first turn ({instruction}, {observation}).")
    turn_template: str = fld("{observation}", "User message of later turns ({observation}, {reward}).")


@dataclass
class EnvManagerConfig:
    """A set of env groups: ``env_groups`` groups of ``group_size`` envs sharing one seed per group."""

    tags: List[str] = fld(default_factory=lambda: ["SimpleSokoban"], help="Env tags from custom_envs.")
    env_groups: int = fld(8, "Number of groups; split evenly across tags unless n_groups is set.")
    group_size: int = fld(8, "Envs per group; all start from the same seed (state).")
    n_groups: Optional[List[int]] = fld(None, "Groups per tag (same length as tags; sums to env_groups).")
    max_traj_per_env: int = fld(1, "Trajectories an env may produce per rollout (-1 = no limit).")
    format_penalty: float = fld(-0.1, "Reward of an unparseable or invalid action.")
    worker_cls: Optional[str] = fld(None, "Import path of a custom env manager class (not implemented yet: "
                                          "only null accepted; register an env instead).")
    num_env_managers: int = fld(1, "Env manager workers the groups are spread over.")
    action_format: str = fld("answer", "Action format: 'answer', 'think_answer' or a regex with one group.")
    env_step_timeout: float = fld(60.0, "Seconds an env reset/step may take; a slower call ends its trajectory as a "
                                        "timeout and the env is replaced (0 = no limit).")
    env_threads: int = fld(16, "Threads per env manager stepping different envs concurrently.")
    raise_env_errors: Optional[bool] = fld(None, "Re-raise env exceptions with their traceback (None: true with "
                                                 "distributed=local, false under Ray, where they are recorded).")
    max_refill_rounds: int = fld(1, "Extra rollout rounds run when env failures leave the batch short.")
    conformance_samples: int = fld(4, "Trajectories per rollout checked against the chat template (0 = off).")
    batch_max_size: int = fld(256, "Dynamic batching across env managers: most prompts merged into one generate call.")
    batch_max_wait_ms: float = fld(20.0, "Dynamic batching: most milliseconds a request waits for others to join.")


@dataclass
class RewardNormalizationConfig:
    """Normalization of episode scores before advantages (see docs/algorithms.md)."""

    grouping: str = fld("state", "Normalization groups: same-seed group, whole batch, or env tag.",
                        choices=["state", "batch", "inductive"])
    method: str = fld("mean_std", "Normalization method.", choices=["identity", "mean", "mean_std", "asym_clip"])


@dataclass
class TinyModelConfig:
    """Build a tiny Qwen2-architecture model + local tokenizer at ``pretrain`` when that path has no model."""

    hidden_size: int = fld(128, "Hidden size.")
    intermediate_size: int = fld(512, "MLP size.")
    num_hidden_layers: int = fld(4, "Transformer layers.")
    num_attention_heads: int = fld(4, "Query heads.")
    num_key_value_heads: int = fld(2, "Key/value heads.")
    vocab_size: int = fld(1024, "Tokenizer vocabulary size (BPE trained on env text).")
    max_position_embeddings: int = fld(2048, "Maximum positions.")
    initializer_range: float = fld(0.1, "Std of the initial weights. About 1/sqrt(hidden_size): with Hugging Face's "
                                        "0.02 a model this small sits at a uniform policy for hundreds of steps.")
    seed: int = fld(0, "Seed of the initial weights.")


@dataclass
class SFTWarmupConfig:
    """Supervised warm start on solver demonstrations, run by actor_train before RL."""

    enabled: bool = fld(False, "Run the warm start.")
    tag: Optional[str] = fld(None, "Env tag whose solver makes the demonstrations (default: first train tag).")
    num_demos: int = fld(2000, "Demonstration episodes.")
    steps: int = fld(200, "Optimizer steps.")
    batch_size: int = fld(32, "Episodes per optimizer step.")
    learning_rate: float = fld(3.0e-3, "Learning rate of the warm start.")
    reset_optimizer: bool = fld(True, "Start RL with fresh Adam moments (the warm start's would shrink the "
                                      "first RL updates).")
    seed: int = fld(12345, "Seed of the demonstration rooms (kept apart from RL seeds).")


@dataclass
class AgenticConfig(BaseConfig):
    """The agentic pipeline: multi-turn rollouts in grouped envs, then PPO-style training."""

    train_env_manager: EnvManagerConfig = field(default_factory=EnvManagerConfig,
                                                metadata={"help": "Training env groups."})
    val_env_manager: Optional[EnvManagerConfig] = fld(None, "Validation env groups (fixed seeds).")
    custom_envs: Dict[str, CustomEnvConfig] = fld(default_factory=dict, help="Env tags and their settings.")
    reward_normalization: RewardNormalizationConfig = field(
        default_factory=RewardNormalizationConfig, metadata={"help": "Episode score normalization."})
    tiny_model: Optional[TinyModelConfig] = fld(None, "Build a tiny model at `pretrain` if it is missing.")
    sft_warmup: SFTWarmupConfig = field(default_factory=SFTWarmupConfig,
                                        metadata={"help": "Supervised warm start before RL."})
    trajectory_dump_steps: int = fld(0, "Write rollouts (tokens, advantages, masks) as JSONL every N steps, and "
                                        "validation rollouts at every validation (0 = never); `roll view` shows them.")
    trajectory_dump_max: int = fld(64, "At most this many trajectories per dump file, whole env groups (0 = all).")
