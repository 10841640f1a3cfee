"""The pipeline block shared by the agentic and RLVR pipelines: run control, batch sizes, PPO/reward keys.

Key names and meanings follow ROLL's configuration guide; defaults live only here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from roll.config.errors import ConfigError
from roll.config.fields import fld
from roll.config.health import RunHealthConfig
from roll.config.worker import WorkerConfig

AGGREGATIONS = ["token", "segment", "geometric", "sequence"]  # roll.algorithms.offpolicy.AGGREGATIONS


@dataclass
class ISWeightConfig:
    """``train_infer_correction.is_weight``: the truncated importance weight old / rollout log-prob ratio."""

    enabled: bool = fld(False, "Weight each token's policy loss by pi_old / pi_rollout (decoupled PPO).")
    weight_type: str = fld(
        "token",
        "Granularity of the ratio: per token, per turn span (segment), per sample as "
        "geometric mean or as product (sequence).",
        choices=AGGREGATIONS,
    )
    upper_bound: float | None = fld(2.0, "Truncate the weight at this value (null = no truncation).", allowed="> 0")
    detach: bool = fld(
        True,
        "Stop-gradient weight (ROLL's key; the old log-probs carry no gradient in roll, so "
        "the weight is a constant either way).",
    )


@dataclass
class CorrectionFilterConfig:
    """One entry of ``train_infer_correction.filters``: mask tokens whose old / rollout ratio (or probability
    difference) leaves a band."""

    enabled: bool = fld(True, "Apply this filter.")
    agg_type: str = fld("token", "Granularity at which the band is checked.", choices=AGGREGATIONS)
    ratio_enabled: bool = fld(True, "Keep only where ratio_low <= pi_old / pi_rollout <= ratio_high.")
    ratio_low: float = fld(0.8, "Lower end of the ratio band.", allowed=">= 0")
    ratio_high: float = fld(1.2, "Upper end of the ratio band.", allowed="> 0")
    diff_enabled: bool = fld(False, "Keep only where diff_low <= p_old - p_rollout <= diff_high.")
    diff_low: float = fld(-1.0, "Lower end of the probability-difference band.")
    diff_high: float = fld(1.0, "Upper end of the probability-difference band.")


@dataclass
class TrainInferCorrectionConfig:
    """ROLL's ``train_infer_correction``: off-policy correction between the inference engine's sampling
    log-probs and the trainer's old log-probs (docs/algorithms.md, "Train/inference correction")."""

    is_weight: ISWeightConfig = field(
        default_factory=ISWeightConfig, metadata={"help": "Truncated importance weights."}
    )
    filters: list[CorrectionFilterConfig] = fld(
        default_factory=list, help="Token masks by ratio or probability band; all enabled ones apply."
    )

    def on(self) -> bool:
        """Whether any correction is applied."""
        return self.is_weight.enabled or any(f.enabled for f in self.filters)


@dataclass
class PPOConfig:
    """PPO, reward and loss keys (flat at the top level of a config file, as in ROLL)."""

    adv_estimator: str = fld(
        "grpo",
        "Advantage estimator: a name registered with @register_advantage (built in: "
        "gae, reinforce, grpo, dr_grpo, reinforce_plus_plus, rloo, gigpo, step_reinforce) or "
        "'package.module:name'.",
    )
    ppo_epochs: int = fld(1, "Optimization passes over each rollout batch.", allowed=">= 1")
    skip_old_log_probs: bool = fld(
        True,
        "Skip the separate old-log-prob pass where it is exact (ppo_epochs 1, the rollout batch is one "
        "optimizer step, no KL penalty in the reward): the old log-probs are the training forward's, detached.",
    )
    old_log_probs_source: str = fld(
        "trainer",
        "Where the old log-probs of the PPO ratio come from. trainer: a forward pass of actor_train before the "
        "update (or the update's own forward where that is exact, skip_old_log_probs). engine: the inference "
        "engine's sampling log-probs of the generated tokens, with no extra pass (the behaviour policy itself; "
        "equal to the trainer's up to rounding where both compute in fp32, e.g. hf_infer on CPU: 3e-7). With "
        "engine, rollout/logprob_mismatch is not logged (there is no trainer pass to compare with). Where a KL "
        "penalty in the reward, the train/inference correction, enable_old_logprobs_recompute or asynchronous "
        "generation needs the trainer's old log-probs, its pass runs anyway (a warning at launch says so).",
        choices=["trainer", "engine"],
    )
    async_generation_ratio: float = fld(
        0.0,
        "k: 0 = generate, then train (synchronous); k >= 1 = rollouts go on while the trainer trains, and no "
        "trained token is more than k policy versions old (admission bound; docs/async.md). Needs actor_infer "
        "on devices of its own (or CPU).",
        allowed="a whole number >= 0; the policy versions a trained token may lag (0 = synchronous)",
    )
    enable_old_logprobs_recompute: bool = fld(
        False,
        "Always compute the old (proximal) log-probs in a separate pass before the update, never from the "
        "training forward; forced on by async_generation_ratio >= 1 (ROLL's key).",
    )
    max_grad_norm: float = fld(1.0, "Gradient clipping norm (0 disables clipping).", allowed=">= 0")
    train_infer_correction: TrainInferCorrectionConfig = field(
        default_factory=TrainInferCorrectionConfig,
        metadata={
            "help": "Importance weights / masks between the engine's sampling log-probs and the trainer's "
            "(ROLL's key; needs an engine that returns log-probs)."
        },
    )
    gamma: float = fld(1.0, "Discount factor over response tokens.", allowed="in [0, 1]")
    lambd: float = fld(0.95, "GAE lambda.", allowed="in [0, 1]")
    pg_clip: float = fld(
        0.2, "PPO ratio clip range (symmetric).", allowed="in (0, 1); the ratio is clipped at 1 - value"
    )
    pg_clip_low: float | None = fld(
        None,
        "Lower clip range (1 - low); overrides pg_clip when set.",
        allowed="in (0, 1); the ratio is clipped at 1 - value",
    )
    pg_clip_high: float | None = fld(
        None,
        "Upper clip range (1 + high); overrides pg_clip (DAPO clip-higher).",
        allowed="> 0; DAPO clip-higher uses 0.28",
    )
    dual_clip_loss: bool = fld(False, "Bound the loss of negative-advantage tokens by c * |A| (dual-clip PPO).")
    dual_clip_c: float = fld(3.0, "The c of dual-clip PPO (> 1).")
    value_clip: float | None = fld(
        None, "Clip range of the value loss around old values; None = no clip.", allowed="> 0; null = off"
    )
    loss_agg_mode: str = fld(
        "token-mean",
        "How token losses are aggregated: a name registered with "
        "@register_agg_mode (built in: token-mean, seq-mean-token-sum, "
        "seq-mean-token-mean, seq-mean-token-sum-norm).",
    )
    kl_penalty: str = fld(
        "kl",
        "KL estimator for the reward penalty: a name registered with @register_kl (built "
        "in: kl/k1, abs, mse/k2, low_var_kl/k3; full is rejected: it needs logits).",
    )
    init_kl_coef: float = fld(
        0.2, "Initial KL coefficient of the reward penalty (fixed or adaptive controller).", allowed=">= 0"
    )
    target_kl: float | None = fld(
        None, "Target KL of the adaptive controller; None = fixed coefficient.", allowed="> 0; null = off"
    )
    kl_horizon: int = fld(
        10000, "Horizon of the adaptive KL controller.", allowed=">= 1; samples over which the coefficient adapts"
    )
    add_token_level_kl: bool = fld(False, "Subtract kl_coef * KL(actor || reference) from token rewards.")
    use_kl_loss: bool = fld(False, "Add kl_loss_coef * KL(actor || reference) to the actor loss.")
    kl_loss_coef: float = fld(0.0, "Coefficient of the KL loss.", allowed=">= 0")
    kl_loss_type: str = fld("low_var_kl", "KL estimator for the KL loss (a registered KL type, as kl_penalty).")
    allow_kl_in_reward_and_loss: bool = fld(False, "Allow add_token_level_kl and use_kl_loss together.")
    entropy_loss_coef: float = fld(0.0, "Entropy bonus coefficient (loss -= coef * entropy).", allowed=">= 0")
    policy_loss: str = fld(
        "ppo",
        "Policy loss: a name registered with @register_policy_loss (built in: ppo, the "
        "token-ratio clip; gspo, the sequence-level ratio) or 'package.module:name'.",
    )
    critic_warmup: int = fld(0, "Steps during which only the critic is trained (needs a critic block).", allowed=">= 0")
    reward_clip: float | None = fld(
        None, "Clip episode scores to [-reward_clip, reward_clip].", allowed="> 0; null = off"
    )
    whiten_rewards: bool = fld(False, "Whiten token rewards over the batch before advantages.")
    whiten_advantages: bool = fld(False, "Whiten advantages over the batch's response tokens.")
    advantage_clip: float | None = fld(
        None, "Clip advantages to [-advantage_clip, advantage_clip].", allowed="> 0; null = off"
    )
    reward_norm: str | None = fld(
        None,
        "RLVR reward normalization: the scope of the statistics, registered with "
        "register_reward_norm_scope (built in: batch, group, running), or None.",
    )
    reward_shift: bool = fld(False, "RLVR: normalization subtracts the mean only.")
    reward_scale: bool = fld(False, "RLVR: normalization divides by the std only.")
    adv_estimator_args: dict[str, Any] = fld(
        default_factory=dict,
        help="Hyperparameters of adv_estimator: its "
        "keyword parameters (gigpo: step_adv_weight, episode_adv_weight, "
        "step_adv_norm, episode_adv_norm; step_reinforce: step_adv_norm); "
        "unknown keys are refused at launch. Defaults: the estimator's.",
    )
    step_adv_weight: float | None = fld(
        None,
        "Alias of adv_estimator_args.step_adv_weight (gigpo: weight of "
        "the step-level advantage; ROLL: step_reward_weight).",
        allowed=">= 0",
    )
    episode_adv_weight: float | None = fld(
        None,
        "Alias of adv_estimator_args.episode_adv_weight (gigpo: weight "
        "of the episode-level advantage; ROLL: episode_reward_weight).",
        allowed=">= 0",
    )
    step_adv_norm: str | None = fld(
        None,
        "Alias of adv_estimator_args.step_adv_norm (gigpo, step_reinforce: mean or mean_std).",
        choices=[None, "mean", "mean_std"],
    )
    episode_adv_norm: str | None = fld(
        None,
        "Alias of adv_estimator_args.episode_adv_norm (gigpo: mean_std, GRPO's, or mean, the paper's F_norm = 1).",
        choices=[None, "mean", "mean_std"],
    )

    #: Top-level keys that are aliases of ``adv_estimator_args`` entries of the same name.
    ESTIMATOR_ARG_ALIASES = ("step_adv_weight", "episode_adv_weight", "step_adv_norm", "episode_adv_norm")

    def estimator_args(self) -> dict[str, Any]:
        """``adv_estimator_args`` with the aliases that are set; a key set both ways to different values is a
        ConfigError."""
        args = dict(self.adv_estimator_args)
        for key in self.ESTIMATOR_ARG_ALIASES:
            value = getattr(self, key)
            if value is None:
                continue
            if key in args and args[key] != value:
                raise ConfigError(key, value, f"adv_estimator_args.{key}={args[key]!r} says otherwise; set one")
            args[key] = value
        return args


@dataclass
class BaseConfig(PPOConfig):
    """Run control, batch sizes, lengths, cluster and tracking keys shared by all pipelines."""

    exp_name: str = fld("roll_exp", "Experiment name (output and tracker naming).")
    seed: int = fld(42, "Global seed (models, sampling, env seeds).")
    rpc_timeout: int = fld(3600, "Seconds a call to a worker may take before it is an error.", allowed=">= 1")
    output_dir: str = fld("./output", "Checkpoints and the final model are written here.")
    logging_dir: str = fld("./output/logs", "Logs, metrics.jsonl, tensorboard and trajectory dumps.")
    render_save_dir: str | None = fld(None, "Save rendered frames of validation episodes here (None = off).")
    system_envs: dict[str, str] = fld(default_factory=dict, help="Environment variables set for every worker.")
    track_with: str = fld(
        "stdout",
        "Tracker registered with register_tracker: stdout, tensorboard, wandb (both also "
        "print to stdout) or 'package.module:name' of a user module's tracker.",
    )
    tracker_kwargs: dict[str, Any] = fld(default_factory=dict, help="Extra tracker arguments (log_dir, project...).")
    num_nodes: int = fld(1, "Nodes in the Ray cluster.", allowed=">= 1")
    num_gpus_per_node: int = fld(0, "GPUs per node; 0 = CPU-only run.", allowed=">= 0")
    colocated_offload: str = fld(
        "auto",
        "What roles sharing a GPU do between phases: always = the idle role offloads (trainer states to CPU, "
        "engine memory released); never = nothing moves (the GPU must hold all); auto = offload until "
        "measured to fit together, then stay resident (docs/strategies.md).",
        choices=["auto", "always", "never"],
    )
    memory_check: str = fld(
        "refuse",
        "Before a GPU run starts, estimate each GPU's peak memory per role and phase (docs/memory.md; printed in "
        "one line): refuse = a config whose estimate exceeds the GPU is a config error naming the largest term and "
        "what would make it fit; warn = print that line and launch; off = no estimate.",
        choices=["refuse", "warn", "off"],
    )
    gpu_memory_gib: float | None = fld(
        None,
        "GiB per GPU the memory estimate assumes where no GPU is visible (a driver that joins a cluster, "
        "roll doctor on a CPU machine); a visible GPU's own size wins. None = skip the estimate there.",
        allowed="> 0",
    )
    distributed: str = fld(
        "ray",
        "ray: roles are Ray actors (local Ray or ray_address); local: every role in this "
        "process without Ray, for debugging.",
        choices=["ray", "local"],
    )
    strict_data_check: bool = fld(
        False,
        "Check every batch hand-off (shapes, dtypes, 0/1 masks, score placement) and "
        "raise BatchCheckError naming stage and key; ROLL_STRICT_DATA_CHECK=1 also "
        "turns it on. See docs/debugging.md.",
    )
    ray_address: str | None = fld(
        None, "Join this Ray cluster (e.g. 'auto' or 'host:6379'); None = start a local Ray instance on loopback."
    )
    ray_num_cpus: int | None = fld(None, "CPUs of the local Ray instance (None = all cores).", allowed=">= 1")
    ray_include_dashboard: bool = fld(False, "Start the Ray dashboard with the local Ray instance.")
    max_steps: int = fld(
        100,
        "Training steps (one rollout batch each); 0 = only the warm start (sft_warmup) and a "
        "validation, then the final export.",
        allowed=">= 0",
    )
    max_train_minutes: float = fld(
        0.0,
        "Also stop after the first step at which training (the warm start plus the "
        "RL steps' time/step; set-up and validation not counted) has taken this "
        "many minutes, then validate and save as at max_steps (a warm start that "
        "reaches it ends there, and no RL step runs); 0 = off. Checkpoints keep the "
        "time spent, so a resumed run goes on counting.",
        allowed=">= 0",
    )
    zero_signal_patience: int = fld(
        5,
        "Stop the run after this many steps in a row whose advantages are all zero "
        "(no learning signal: groups solved alike, constant rewards); the first such "
        "step warns with the likely cause; 0 = never stop.",
        allowed=">= 0",
    )
    run_health: RunHealthConfig = field(
        default_factory=RunHealthConfig,
        metadata={
            "help": "Whether the run is learning: each step's metrics read against healthy ranges, one line per "
            'rule that leaves its range (docs/tracking.md, "Run health").'
        },
    )
    save_steps: int = fld(
        10,
        "Save a checkpoint every N steps (0 = only the final model), so that a crash or kill "
        "loses at most N steps. One costs a save of the training state: 21 MiB in 0.2 s for "
        "sokoban_tiny's model on CPU, 6.5 GB for a 0.5B model with Adam; "
        "checkpoint_config.max_to_keep bounds the disk.",
        allowed=">= 0",
    )
    logging_steps: int = fld(1, "Log metrics every N steps.", allowed=">= 1")
    max_skipped_updates: int = fld(
        3,
        "Stop the run (one line, exit 1) after this many steps in a row whose actor "
        "update was skipped for a non-finite gradient norm (actor/skipped_updates); "
        "0 = never stop.",
        allowed=">= 0",
    )
    eval_steps: int = fld(0, "Run validation every N steps (0 = never).", allowed=">= 0")
    resume_from_checkpoint: Any = fld(
        False, "true: continue from the newest complete checkpoint in output_dir; or a checkpoint path."
    )
    checkpoint_config: dict[str, Any] = fld(
        default_factory=lambda: {"max_to_keep": 2},
        help="Checkpoint options: max_to_keep (the newest N complete checkpoints are kept; 0 = all).",
    )
    rollout_batch_size: int = fld(
        64, "Samples (agentic: trajectories; RLVR: prompts) per training step.", allowed=">= 1"
    )
    val_batch_size: int = fld(0, "Samples per validation round (0 = the val env manager's size).", allowed=">= 0")
    prompt_length: int = fld(1024, "Maximum prompt tokens.", allowed=">= 1")
    response_length: int = fld(512, "Maximum response tokens.", allowed=">= 1")
    sequence_length: int = fld(2048, "Maximum tokens of a whole sample (prompt + all turns).", allowed=">= 1")
    num_return_sequences_in_group: int = fld(
        1,
        "Responses sampled per prompt (RLVR group size); the RLVR train "
        "batch is rollout_batch_size x num_return_sequences_in_group.",
        allowed=">= 1",
    )
    local_rank: int = fld(
        -1,
        "Rank within the node; set by a distributed launcher, -1 when not distributed "
        "(roll's workers learn their rank from Ray, so a config value is informational).",
    )
    generate_opt_level: int = fld(
        1,
        "ROLL's generation interface switch (0 = batched generate calls, 1 = requests "
        "through a scheduler). roll has one protocol, 1: requests are submitted and "
        "polled, the engine batches what is pending; 0 is accepted with a warning.",
        choices=[0, 1],
    )
    is_num_return_sequences_expand: bool = fld(
        True,
        "Send each of a prompt's num_return_sequences samples as its own request (roll always does; the "
        "samples are the same as n samples of one request). false is accepted with a warning.",
    )
    max_running_requests: int | None = fld(
        None,
        "Most generation requests in flight on one inference worker at a time: hf_infer generates at most "
        "this many prompts per generate call (with its generate_batch_size), sglang passes it to the engine; "
        "None = the backend's own limit.",
        allowed=">= 1",
    )
    is_use_additional_prompts: bool = fld(
        False,
        "RLVR: start extra prompts beyond rollout_batch_size so that a full batch is ready even when "
        "some prompts are filtered out (dynamic sampling).",
    )
    max_additional_running_prompts: int = fld(
        16,
        "RLVR: how many extra prompts may run beyond rollout_batch_size when is_use_additional_prompts.",
        allowed=">= 0",
    )
    pretrain: str | None = fld(None, "Base model path, referenced by worker blocks as ${pretrain}.")
    reward_pretrain: str | None = fld(None, "Critic/reward model path, referenced as ${reward_pretrain}.")
    actor_train: WorkerConfig = field(default_factory=WorkerConfig, metadata={"help": "The trained policy."})
    actor_infer: WorkerConfig = field(default_factory=WorkerConfig, metadata={"help": "The rollout engine."})
    reference: WorkerConfig | None = fld(None, "Reference policy for KL (needed when a KL term is on).")
    critic: WorkerConfig | None = fld(None, "Value model (needed by adv_estimator=gae).")
