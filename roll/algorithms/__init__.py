"""roll.algorithms: pure tensor functions of RL for LLMs (advantages, reward normalization, losses, KL, masking).

No Ray, no backends, no config objects from elsewhere: tensors in, tensors out. Each extension point has one
decorator registry: ``register_advantage``, ``register_policy_loss``, ``register_agg_mode``, ``register_kl``,
``register_score_norm``.
"""

from roll.algorithms.advantages import (
    AdvantageInputs,
    AdvantageOutputs,
    compute_advantage,
    discounted_turn_returns,
    get_advantage_fn,
    register_advantage,
    step_level_advantages,
    whiten_and_clip_advantages,
)
from roll.algorithms.aggregation import agg_loss, register_agg_mode
from roll.algorithms.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    full_kl,
    kl_penalty,
    make_kl_controller,
    register_kl,
)
from roll.algorithms.losses import ActorLossConfig, actor_loss, entropy_from_logits, explained_variance, value_loss
from roll.algorithms.masking import masked_mean, masked_sum, masked_var, masked_whiten
from roll.algorithms.policy_losses import get_policy_loss_fn, gspo_policy_loss, ppo_policy_loss, register_policy_loss
from roll.algorithms.reward_norm import (
    RunningMeanStd,
    normalize_episode_scores,
    normalize_scores,
    postprocess_rlvr_rewards,
    register_score_norm,
    scoped_norm,
)

__all__ = [
    "ActorLossConfig",
    "AdaptiveKLController",
    "AdvantageInputs",
    "AdvantageOutputs",
    "FixedKLController",
    "RunningMeanStd",
    "actor_loss",
    "agg_loss",
    "apply_kl_penalty",
    "compute_advantage",
    "discounted_turn_returns",
    "entropy_from_logits",
    "explained_variance",
    "full_kl",
    "get_advantage_fn",
    "get_policy_loss_fn",
    "gspo_policy_loss",
    "kl_penalty",
    "make_kl_controller",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "normalize_episode_scores",
    "normalize_scores",
    "postprocess_rlvr_rewards",
    "ppo_policy_loss",
    "register_advantage",
    "register_agg_mode",
    "register_kl",
    "register_policy_loss",
    "register_score_norm",
    "scoped_norm",
    "step_level_advantages",
    "value_loss",
    "whiten_and_clip_advantages",
]
