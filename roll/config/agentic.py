"""Config of the agentic pipeline: env managers, custom envs, reward normalization, warm start, workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from roll.config.base import BaseConfig
from roll.config.errors import ConfigError
from roll.config.fields import check_rules, fld
from roll.config.validation import (
    NOT_IMPLEMENTED_AGENTIC,
    check_not_implemented,
    check_train_batch,
    global_train_batch,
)
from roll.config.worker import GeneratingArgs


def _fields(template: str) -> list[str]:
    """The placeholder names of a format string (``{a.b}`` -> ``a``)."""
    import string

    return [f.split(".")[0].split("[")[0] for _, f, _, _ in string.Formatter().parse(template) if f is not None]


@dataclass
class CustomEnvConfig:
    """One env tag: which registered env, its kwargs, and per-tag rollout limits."""

    env_type: str = fld("sokoban", "Registered env name (see roll.envs.list_envs()).")
    env_config: dict[str, Any] = fld(default_factory=dict, help="Keyword arguments of the env constructor.")
    max_actions_per_traj: int = fld(
        10,
        "Actions (turns) per trajectory before it is cut (agent tags: model calls, enforced by the gateway: the "
        "call past it is refused and the episode ends truncated).",
        allowed=">= 1",
    )
    max_tokens_per_step: int = fld(64, "Maximum tokens the model generates per turn.", allowed=">= 1")
    system_prompt: str = fld(
        "You are a helpful assistant that solves the task step by step.", "System message of every conversation."
    )
    first_turn_template: str = fld(
        "{instruction}\n{observation}",
        "User message of the first turn ({instruction}, {observation}; also {turn_idx}, "
        "{actions_left}, {max_response_length} as in ROLL's agent_template; {image}: where the observation's "
        "images go, else before the text).",
    )
    turn_template: str = fld(
        "{observation}",
        "User message of later turns ({observation}, {reward}, {turn_idx}, "
        "{actions_left}, {max_response_length}, {image}; ROLL's step fields "
        "{env_instruction}, {step_count}, {history_length}, {history}, "
        "{current_step}, {current_observation}).",
    )
    instruction: str | None = fld(
        None,
        "The task rules the templates show as {instruction} / {env_instruction}, instead of the env's own "
        "(ROLL's env_config.env_instruction); None = the env's.",
    )
    trajectory_mode: str = fld(
        "traj",
        "Training samples of an episode: 'traj' = one per episode (turns merged while "
        "each prompt extends the last; a turn that starts a sample starts a new one), "
        "'step' = one per turn (the turn's whole prompt, then its reply) (ROLL's key).",
        choices=["traj", "step"],
    )
    turn_prompt: str = fld(
        "append",
        "'append' = each turn's message is appended to the token history; 'fresh' = "
        "each turn is a new conversation (system + turn_template, which summarises the "
        "last turns in {history}) and starts a sample: ROLL's StepEnvManager.",
        choices=["append", "fresh"],
    )
    overflow: str = fld(
        "truncate",
        "When the next turn of a token history (turn_prompt: append) would exceed "
        "sequence_length: 'truncate' ends the episode (truncated_by_length); 'restart' "
        "continues it in a new conversation (first_turn_template; {history} summarises "
        "the last turns) that starts a sample.",
        choices=["truncate", "restart"],
    )
    history_length: int | None = fld(
        None,
        "Turns {history} spans, the current one included (ROLL's meaning: "
        "the last history_length - 1 completed turns); None = every completed "
        "turn.",
        allowed=">= 1",
    )

    env_manager_cls: str | None = fld(
        None,
        "Who plays this tag: null or 'traj' = roll's env manager; 'proxy' (or "
        "ROLL's ...ProxyEnvManager) = agent_runner_cls through the gateway "
        "(docs/agents.md).",
    )
    agent_runner_cls: str | None = fld(
        None,
        "Import path of the agent runner (an AgentRunner subclass, a function "
        "fn(task, **kwargs), or roll.agentic.gateway.runners.CommandRunner); "
        "only with env_manager_cls: proxy.",
    )
    agent_runner_kwargs: dict[str, Any] = fld(
        default_factory=dict,
        help="Keyword arguments of the agent runner (checked against its signature); only with env_manager_cls: proxy.",
    )
    agent_timeout: float = fld(
        600.0,
        "Seconds one agent episode may take; a slower one is abandoned, its session "
        "closed and its trajectory counted as a timeout (0 = no limit); only with env_manager_cls: proxy.",
        allowed=">= 0; seconds, 0 = no limit",
    )
    tool_parser: str = fld(
        "hermes",
        "The gateway's tool-call parser (registry roll.agentic.gateway.tool_parsers); only with env_manager_cls: "
        "proxy.",
    )

    #: the placeholders :meth:`turn_text` fills (roll's, then ROLL's StepEnvManager's)
    TEMPLATE_FIELDS = (
        "instruction",
        "observation",
        "reward",
        "turn_idx",
        "actions_left",
        "max_response_length",
        "env_instruction",
        "step_count",
        "history_length",
        "history",
        "current_step",
        "current_observation",
        "image",
    )

    def check_templates(self, key: str) -> None:
        """Every ``{placeholder}`` of the two templates is one :meth:`turn_text` fills (else a ConfigError naming
        it and the known ones, before any worker starts)."""
        for name in ("first_turn_template", "turn_template"):
            template = getattr(self, name)
            try:
                fields = _fields(template)
            except ValueError as exc:  # an unmatched brace
                raise ConfigError(
                    f"{key}.{name}", template, f"not a format string ({exc}); write a literal brace as {{{{ or }}}}"
                ) from None
            for base in fields:
                if base not in self.TEMPLATE_FIELDS:
                    raise ConfigError(
                        f"{key}.{name}",
                        template,
                        f"unknown placeholder {{{base}}}; roll fills "
                        f"{', '.join('{' + f + '}' for f in self.TEMPLATE_FIELDS)}",
                    )
            if fields.count("image") > 1:
                raise ConfigError(
                    f"{key}.{name}", template, "{image} more than once; an observation's images are placed once"
                )

    @property
    def uses_gateway(self) -> bool:
        """Whether agent runners play this tag through the gateway (``env_manager_cls`` names the proxy manager)."""
        return self.env_manager_cls is not None and (
            self.env_manager_cls == "proxy" or self.env_manager_cls.endswith("ProxyEnvManager")
        )

    #: Keys that only an agent harness tag (``env_manager_cls: proxy``) reads.
    GATEWAY_KEYS = ("agent_runner_kwargs", "agent_timeout", "tool_parser")

    def check_agent(self, key: str) -> None:
        """``env_manager_cls`` is known, ``agent_runner_cls`` is set exactly when the gateway is used, and a tag
        played by roll's env manager sets none of the gateway's keys (:attr:`GATEWAY_KEYS`)."""
        if self.env_manager_cls not in (None, "traj") and not self.uses_gateway:
            raise ConfigError(
                f"{key}.env_manager_cls",
                self.env_manager_cls,
                "must be null or 'traj' (roll's env manager) or 'proxy' / ROLL's "
                "roll.pipeline.agentic.env_manager.proxy_env_manager.ProxyEnvManager",
            )
        if self.uses_gateway and not self.agent_runner_cls:
            raise ConfigError(
                f"{key}.agent_runner_cls",
                self.agent_runner_cls,
                "env_manager_cls: proxy plays episodes with an agent runner: name one by import path (docs/agents.md)",
            )
        if self.agent_runner_cls and not self.uses_gateway:
            raise ConfigError(
                f"{key}.agent_runner_cls",
                self.agent_runner_cls,
                "agent runners play through the gateway: set env_manager_cls: proxy as well",
            )
        if not self.uses_gateway:
            default = CustomEnvConfig()
            for name in self.GATEWAY_KEYS:
                if getattr(self, name) != getattr(default, name):
                    raise ConfigError(
                        f"{key}.{name}",
                        getattr(self, name),
                        "is read only for tags played by an agent harness through the gateway (env_manager_cls: "
                        "proxy with agent_runner_cls); roll's env manager plays this tag: remove the key, or set both",
                    )

    def env_kwargs(self, format_penalty: float, action_format: str) -> dict[str, Any]:
        """The env constructor's keyword arguments: the env manager's ``format_penalty`` and ``action_format``, then
        this tag's ``env_config`` (which may override them)."""
        return {"format_penalty": format_penalty, "action_format": action_format, **dict(self.env_config)}

    def turn_text(
        self,
        turns_done: int,
        observation: str,
        instruction: str = "",
        reward: float = 0.0,
        history: str = "",
        history_shown: int = 0,
        first: bool = False,
        image_text: str = "",
    ) -> str:
        """The user message before turn ``turns_done + 1``: the first-turn template at 0 (or when ``first``: a
        conversation restarted, ``overflow: restart``), else the turn template;
        ``turn_idx`` counts from 1, ``actions_left`` = max_actions_per_traj - turns_done, ``max_response_length`` =
        max_tokens_per_step. ROLL's step fields: ``env_instruction`` = ``instruction``, ``step_count`` =
        turns_done, ``current_step`` = turns_done + 1, ``current_observation`` = ``observation``, ``history`` (the
        summary of the last turns, :func:`roll.agentic.chat.history_summary`) and ``history_length`` = the turns
        it shows (``history_shown``). ``instruction`` is :attr:`instruction` where that is set.

        ``image_text``: the observation's images as prompt text (one ``<|vision_start|><|image_pad|><|vision_end|>``
        each, :func:`roll.models.vision.with_image_placeholders`); it goes where the template says ``{image}``
        (ROLL's VLTrajEnvManager puts the frame between its pre-step and next-step text), else before the text; with
        no images, ``{image}`` is empty."""
        template = self.first_turn_template if turns_done == 0 or first else self.turn_template
        instruction = self.instruction if self.instruction is not None else instruction
        placeholders = image_text
        text = template.format(
            image=placeholders,
            instruction=instruction,
            observation=observation,
            reward=reward,
            turn_idx=turns_done + 1,
            actions_left=self.max_actions_per_traj - turns_done,
            max_response_length=self.max_tokens_per_step,
            env_instruction=instruction,
            step_count=turns_done,
            current_step=turns_done + 1,
            current_observation=observation,
            history=history,
            history_length=history_shown,
        )
        return text if _fields(template).count("image") else placeholders + text


@dataclass
class EnvManagerConfig:
    """A set of env groups: ``env_groups`` groups of ``group_size`` envs sharing one seed per group."""

    tags: list[str] = fld(default_factory=lambda: ["SimpleSokoban"], help="Env tags from custom_envs.")
    env_groups: int = fld(8, "Number of groups; split evenly across tags unless n_groups is set.", allowed=">= 1")
    group_size: int = fld(8, "Envs per group; all start from the same seed (state).", allowed=">= 1")
    n_groups: list[int] | None = fld(None, "Groups per tag (same length as tags; sums to env_groups).")
    max_traj_per_env: int = fld(
        -1,
        "Trajectories an env may produce per step (-1 = no limit): rollout rounds, one "
        "trajectory per env each, stop there even when failures leave the batch short.",
    )
    format_penalty: float = fld(-0.1, "Reward of an unparseable or invalid action.")
    num_env_managers: int = fld(1, "Env manager workers the groups are spread over.", allowed=">= 1")
    action_format: str = fld("answer", "Action format: 'answer', 'think_answer' or a regex with one group.")
    env_step_timeout: float = fld(
        60.0,
        "Seconds an env reset/step (or its constructor) may take; a slower call is "
        "abandoned, ends its trajectory as a timeout and the env is replaced (a "
        "constructor: the run stops with one line); 0 = no limit.",
        allowed=">= 0; seconds, 0 = no limit",
    )
    env_threads: int = fld(16, "Threads per env manager stepping different envs concurrently.", allowed=">= 1")
    raise_env_errors: bool = fld(
        False,
        "Re-raise env exceptions with their traceback (debugging); by default they "
        "end their trajectory and are counted and printed, in local and Ray mode.",
    )
    max_refill_rounds: int = fld(1, "Extra rollout rounds run when env failures leave the batch short.", allowed=">= 0")
    conformance_samples: int = fld(
        4, "Trajectories per rollout checked against the chat template (0 = off).", allowed=">= 0; 0 = off"
    )
    batch_max_size: int = fld(
        256, "Dynamic batching across env managers: most prompts merged into one generate call.", allowed=">= 1"
    )
    batch_max_wait_ms: float = fld(
        20.0, "Dynamic batching: most milliseconds a request waits for others to join.", allowed=">= 0"
    )
    gateway_wait_s: float = fld(
        10.0,
        "Agent tags (env_manager_cls: proxy): seconds a turn's batch waits for every open episode's next model call "
        "before it generates without the late ones (lock-step, like env steps: while every harness calls within "
        "it, a run is reproducible); at most a quarter of the tags' agent_timeout; 0 = do not wait.",
        allowed=">= 0; seconds, 0 = do not wait",
    )
    generating_args: GeneratingArgs | None = fld(
        None,
        "Sampling of this manager's rollouts (ROLL's per-manager block); None = actor_infer.generating_args. "
        "On train_env_manager it is merged into actor_infer.generating_args when the config loads (training "
        "rollouts sample as actor_infer says); on val_env_manager it is validation's own (e.g. a lower "
        "temperature).",
    )


@dataclass
class RewardNormalizationConfig:
    """Normalization of episode scores before advantages (see docs/algorithms.md)."""

    grouping: str = fld(
        "state",
        "Normalization groups: same-seed group, whole batch, or env tag.",
        choices=["state", "batch", "inductive"],
    )
    method: str = fld(
        "mean_std",
        "Normalization method: a name registered with @register_score_norm (built in: identity, mean, mean_std, "
        "asym_clip = mean_std clamped to [-1, 3]). For the built-ins it only derives norm_mean_type / norm_std_type "
        "where they are null, as in ROLL (mean: a mean; mean_std, asym_clip: both; over the batch with grouping "
        "batch, else the group); a block that sets a norm type and not method gets ROLL's default, identity.",
    )
    norm_mean_type: str | None = fld(
        None,
        "Mean subtracted from each score: the whole batch's, or its group's (the grouping's groups); null: "
        "derived from method (identity: none).",
        choices=[None, "batch", "group"],
    )
    norm_std_type: str | None = fld(
        None,
        "Standard deviation each score is divided by (+1e-6): the whole batch's, or its group's; 0 for a sample "
        "in a group of one or when the std is ~0; null: derived from method (identity, mean: none).",
        choices=[None, "batch", "group"],
    )


@dataclass
class TinyModelConfig:
    """Build a tiny Qwen2-architecture model + local tokenizer at ``pretrain`` when that path has no model."""

    hidden_size: int = fld(128, "Hidden size.", allowed=">= 1")
    intermediate_size: int = fld(512, "MLP size.", allowed=">= 1")
    num_hidden_layers: int = fld(4, "Transformer layers.", allowed=">= 1")
    num_attention_heads: int = fld(4, "Query heads.", allowed=">= 1")
    num_key_value_heads: int = fld(2, "Key/value heads.", allowed=">= 1")
    vocab_size: int = fld(1024, "Tokenizer vocabulary size (BPE trained on env text).", allowed=">= 1")
    max_position_embeddings: int = fld(2048, "Maximum positions.", allowed=">= 1")
    initializer_range: float = fld(
        0.1,
        "Std of the initial weights. About 1/sqrt(hidden_size): with Hugging Face's "
        "0.02 a model this small sits at a uniform policy for hundreds of steps.",
        allowed="> 0",
    )
    seed: int = fld(0, "Seed of the initial weights.")
    vision: bool = fld(
        False,
        "Build a Qwen2.5-VL-architecture model instead (a vision tower, a Qwen2-VL image processor and the image "
        "tokens), for envs with render_mode: rgb_array (docs/vlm.md).",
    )
    vision_hidden_size: int = fld(64, "With vision: width of the vision tower's blocks.", allowed=">= 1")
    vision_depth: int = fld(2, "With vision: blocks of the vision tower.", allowed=">= 1")
    vision_heads: int = fld(2, "With vision: attention heads of the vision tower.", allowed=">= 1")
    max_image_pixels: int = fld(
        56 * 56,
        "With vision: images are resized to at most this many pixels (sides multiples of 28): 56*56 = 4 image "
        "tokens, 84*84 = 9.",
        allowed=">= 784",
    )

    def check(self, key: str) -> None:
        """The heads divide evenly (``key``: ``tiny_model``; the sizes' ranges are their ``allowed``)."""
        check_rules(
            key,
            self,
            [
                (
                    "hidden_size",
                    self.hidden_size % self.num_attention_heads == 0,
                    f"must be a multiple of num_attention_heads ({self.num_attention_heads})",
                ),
                (
                    "num_attention_heads",
                    self.num_attention_heads % self.num_key_value_heads == 0,
                    f"must be a multiple of num_key_value_heads ({self.num_key_value_heads})",
                ),
                (
                    "vision_hidden_size",
                    self.vision_hidden_size % self.vision_heads == 0,
                    f"must be a multiple of vision_heads ({self.vision_heads})",
                ),
            ],
        )


@dataclass
class SFTWarmupConfig:
    """Supervised warm start on solver demonstrations, run by actor_train before RL."""

    enabled: bool = fld(False, "Run the warm start.")
    tag: str | None = fld(None, "Env tag whose solver makes the demonstrations (default: first train tag).")
    num_demos: int = fld(2000, "Demonstration episodes.", allowed=">= 1")
    steps: int = fld(200, "Optimizer steps.", allowed=">= 0")
    batch_size: int = fld(32, "Episodes per optimizer step.", allowed=">= 1")
    learning_rate: float = fld(3.0e-3, "Learning rate of the warm start.", allowed="> 0")
    reset_optimizer: bool = fld(
        True, "Start RL with fresh Adam moments (the warm start's would shrink the first RL updates)."
    )
    seed: int = fld(12345, "Seed of the demonstration rooms (kept apart from RL seeds).")
    demo_noise: float = fld(
        0.0,
        "Probability that the demonstrator takes a random valid action instead of its plan's next move (then plans "
        "again): an imperfect expert, whose detours a warm-started policy copies and RL has to unlearn.",
        allowed="in [0, 1)",
    )


@dataclass
class AgenticConfig(BaseConfig):
    """The agentic pipeline: multi-turn rollouts in grouped envs, then PPO-style training."""

    train_env_manager: EnvManagerConfig = field(
        default_factory=EnvManagerConfig, metadata={"help": "Training env groups."}
    )
    val_env_manager: EnvManagerConfig | None = fld(None, "Validation env groups (fixed seeds).")
    custom_envs: dict[str, CustomEnvConfig] = fld(default_factory=dict, help="Env tags and their settings.")
    reward_normalization: RewardNormalizationConfig = field(
        default_factory=RewardNormalizationConfig, metadata={"help": "Episode score normalization."}
    )
    tiny_model: TinyModelConfig | None = fld(None, "Build a tiny model at `pretrain` if it is missing.")
    sft_warmup: SFTWarmupConfig = field(
        default_factory=SFTWarmupConfig, metadata={"help": "Supervised warm start before RL."}
    )
    trajectory_dump_steps: int = fld(
        0,
        "Write rollouts (tokens, advantages, masks) as JSONL every N steps, and "
        "validation rollouts at every validation (0 = never); `roll view` shows them.",
        allowed=">= 0",
    )
    trajectory_dump_max: int = fld(
        64, "At most this many trajectories per dump file, whole env groups (0 = all).", allowed=">= 0"
    )
    trajectory_dump_frames: int = fld(
        16,
        "At most this many observation frames (vision-language envs) per dumped episode, spread evenly; the rest "
        "are dropped and counted (0 = none).",
        allowed=">= 0",
    )
    trajectory_dump_frame_kib: int = fld(
        64, "At most this many KiB per dumped frame (PNG); a larger frame is downscaled until it fits.", allowed=">= 1"
    )

    #: The score normalization of this pipeline (an entry of ``roll.ppo.advantage_step.SCORE_NORMALIZERS``); not
    #: a field.
    score_normalizer = "episode"
    pipeline = "agentic"  # the name of this pipeline in :data:`roll.config.validation.UNUSED`; not a field
    #: Keys of the RLVR pipeline, named when they appear in an agentic config (see the loader's unknown-key error).
    ELSEWHERE = {  # not a field (no annotation)
        "validation": "RLVR's block; agentic validation runs val_env_manager every eval_steps",
        "rewards": "RLVR's rule rewards; agentic rewards come from the envs (custom_envs.<tag>)",
        "dynamic_sampling": "RLVR only",
        "rollout_dump_steps": "RLVR's; the agentic equivalent is trajectory_dump_steps",
        "rollout_dump_max": "RLVR's; the agentic equivalent is trajectory_dump_max",
        "ground_truth_key": "RLVR data only",
        "tag_key": "RLVR data only",
        "default_tag": "RLVR data only",
    }

    def check_pipeline(self) -> None:
        """Rules of the agentic pipeline (see ARCHITECTURE.md section 3); env types and kwargs are checked against
        the env registry in the preflight."""
        check_env_manager(self, "train_env_manager")
        check_not_implemented(self, NOT_IMPLEMENTED_AGENTIC)
        train = self.train_env_manager
        if self.rollout_batch_size % train.group_size:
            raise ConfigError(
                "rollout_batch_size",
                self.rollout_batch_size,
                f"must be a multiple of train_env_manager.group_size ({train.group_size}): a batch holds whole groups",
            )
        groups_needed = self.rollout_batch_size // train.group_size
        k, per = self.async_generation_ratio, train.env_groups // train.num_env_managers
        if k and per > (k + 1) * groups_needed:
            raise ConfigError(
                "train_env_manager.num_env_managers",
                train.num_env_managers,
                f"with async_generation_ratio={k:g} each env manager plays {per} groups a round, more "
                f"than (k + 1) x the batch's {groups_needed} groups that may run or wait: its rounds "
                f"could never start; use more env managers or a larger k (docs/async.md)",
            )
        if train.max_traj_per_env > 0 and groups_needed > train.env_groups * train.max_traj_per_env:
            raise ConfigError(
                "rollout_batch_size",
                self.rollout_batch_size,
                f"needs {groups_needed} groups but env_groups ({train.env_groups}) x max_traj_per_env "
                f"({train.max_traj_per_env}) give at most {train.env_groups * train.max_traj_per_env}",
            )
        if self.val_env_manager is not None:
            check_env_manager(self, "val_env_manager")
        for tag, spec in self.custom_envs.items():
            spec.check_templates(f"custom_envs.{tag}")
            spec.check_agent(f"custom_envs.{tag}")
        for name in ("train_env_manager", "val_env_manager"):
            block = getattr(self, name)
            kinds = {self.custom_envs[t].uses_gateway for t in (block.tags if block else []) if t in self.custom_envs}
            if block is not None and True not in kinds and block.gateway_wait_s != EnvManagerConfig().gateway_wait_s:
                raise ConfigError(
                    f"{name}.gateway_wait_s",
                    block.gateway_wait_s,
                    "is read only by managers of agent harness tags (env_manager_cls: proxy); this one plays envs",
                )
            if len(kinds) > 1:
                raise ConfigError(
                    f"{name}.tags",
                    block.tags,
                    "mixes tags played by agent runners (env_manager_cls: "
                    "proxy) with env tags; put them in separate managers",
                )
        sft = self.sft_warmup
        if sft.enabled and sft.tag is not None and sft.tag not in self.custom_envs:
            raise ConfigError("sft_warmup.tag", sft.tag, f"not in custom_envs ({', '.join(self.custom_envs)})")
        check_train_batch(self, "actor_train", self.rollout_batch_size)
        if sft.enabled:
            unit = global_train_batch(self.actor_train)
            if sft.batch_size % unit:
                raise ConfigError(
                    "sft_warmup.batch_size",
                    sft.batch_size,
                    f"must be a multiple of actor_train's global train batch per_device_train_batch_size "
                    f"x gradient_accumulation_steps x data-parallel size = {unit}",
                )
        if self.critic is not None:
            check_train_batch(self, "critic", self.rollout_batch_size)


def check_env_manager(cfg: AgenticConfig, name: str) -> None:
    """Tags exist in custom_envs, group counts add up, per-tag limits are positive."""
    manager = getattr(cfg, name)
    if not manager.tags:
        raise ConfigError(f"{name}.tags", manager.tags, "list at least one env tag from custom_envs")
    for tag in manager.tags:
        if tag not in cfg.custom_envs:
            raise ConfigError(f"{name}.tags", tag, f"not in custom_envs; defined tags: {', '.join(cfg.custom_envs)}")
    if manager.max_traj_per_env != -1 and manager.max_traj_per_env < 1:
        raise ConfigError(f"{name}.max_traj_per_env", manager.max_traj_per_env, "must be -1 (no limit) or >= 1")
    if manager.n_groups is not None:
        if len(manager.n_groups) != len(manager.tags) or sum(manager.n_groups) != manager.env_groups:
            raise ConfigError(
                f"{name}.n_groups",
                manager.n_groups,
                f"needs one entry per tag ({len(manager.tags)}) summing to env_groups ({manager.env_groups})",
            )
    elif manager.env_groups % len(manager.tags):
        raise ConfigError(
            f"{name}.env_groups",
            manager.env_groups,
            f"must split evenly across the {len(manager.tags)} tags, or set n_groups",
        )
    if manager.env_groups % manager.num_env_managers:
        raise ConfigError(
            f"{name}.num_env_managers", manager.num_env_managers, f"must divide env_groups ({manager.env_groups})"
        )
