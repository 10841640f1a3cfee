"""Advantage estimators (one registry) and advantage post-processing.

All estimators take :class:`AdvantageInputs` and return :class:`AdvantageOutputs`; tensors are (B, T) =
batch x response tokens, and outputs are 0 where ``response_mask`` is 0. The episode (outcome) reward of a
sample is the sum of its token-level rewards over masked positions; it usually sits on the last response token.
Multi-turn samples may have several separate spans of response tokens; see :mod:`roll.algorithms.returns`.

Each estimator declares what it needs when it registers: ``needs_critic`` (``values``), ``needs_groups``
(``group_ids``: a baseline from the other samples of the group) and ``needs_turns`` (``turns``: per-turn spans,
rewards and states). Config validation asks :data:`ADVANTAGES` for these, so a user estimator registered with
``@register_advantage("my_adv", needs_groups=True)`` (or named as ``"package.module:my_adv"``) is validated like
a built-in one.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from roll.algorithms.groups import STD_ZERO_TOL, group_stats
from roll.algorithms.masking import masked_mean, masked_sum, masked_whiten
from roll.algorithms.returns import discounted_returns, gae_advantages
from roll.algorithms.reward_norm import normalize_scores
from roll.registry import Registry


@dataclass
class TurnInputs:
    """Per-turn data of multi-turn samples: N turns over the batch, each sample's turns in order.

    Attributes:
        sample: (N,) long, the sample (row of the (B, T) tensors) each turn belongs to.
        start: (N,) long, first index of the turn's generated tokens in the (B, T) frame.
        end: (N,) long, one past its last generated token (``[start, end)``).
        rewards: (N,) float, the env's reward for the turn.
        state_ids: (N,) long, id of the env state the turn acted in (equal ids = equal states).
    """

    sample: Tensor
    start: Tensor
    end: Tensor
    rewards: Tensor
    state_ids: Tensor

    def __post_init__(self) -> None:
        n = tuple(self.sample.shape)
        for name in ("start", "end", "rewards", "state_ids"):
            if len(n) != 1 or tuple(getattr(self, name).shape) != n:
                raise ValueError(
                    f"TurnInputs.{name} must have shape {n} like sample (one entry per turn), got "
                    f"{tuple(getattr(self, name).shape)}"
                )


@dataclass
class AdvantageInputs:
    """Inputs of an advantage estimator.

    Attributes:
        token_level_rewards: (B, T) rewards per response token (KL penalty already applied, if any).
        response_mask: (B, T) 1 on tokens the model generated.
        values: (B, T) critic values; required by ``gae``.
        group_ids: (B,) integer group ids (same prompt / same env seed); ``None`` = the whole batch is one group.
        gamma: discount per response token.
        lambd: GAE lambda.
        norm_eps: epsilon of the group-std normalization of ``grpo``.
        turns: per-turn data (:class:`TurnInputs`); required by estimators that declare ``needs_turns``.

    An estimator's own hyperparameters are its keyword-only parameters (``gigpo(inputs, *, step_adv_weight=1.0,
    ...)``), set by the config's ``adv_estimator_args`` and checked against them (:func:`estimator_parameters`).
    """

    token_level_rewards: Tensor
    response_mask: Tensor
    values: Tensor | None = None
    group_ids: Tensor | None = None
    gamma: float = 1.0
    lambd: float = 1.0
    norm_eps: float = 1e-6
    turns: TurnInputs | None = None

    def __post_init__(self) -> None:
        shape = tuple(self.token_level_rewards.shape)
        if len(shape) != 2 or tuple(self.response_mask.shape) != shape:
            raise ValueError(
                f"token_level_rewards {shape} and response_mask {tuple(self.response_mask.shape)} must both be (B, T)"
            )
        if self.values is not None and tuple(self.values.shape) != shape:
            raise ValueError(f"values must have the rewards' shape {shape}, got {tuple(self.values.shape)}")
        if self.group_ids is not None and tuple(self.group_ids.shape) != shape[:1]:
            raise ValueError(f"group_ids must have shape ({shape[0]},), got {tuple(self.group_ids.shape)}")
        for name in ("gamma", "lambd"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")


@dataclass
class AdvantageOutputs:
    """Outputs of an advantage estimator: ``advantages`` (B, T) and ``returns`` (B, T) (the critic's targets)."""

    advantages: Tensor
    returns: Tensor


#: Signature of an advantage estimator: ``(inputs: AdvantageInputs, *, <its hyperparameters, with defaults>) ->
#: AdvantageOutputs`` (the hyperparameters are the config's ``adv_estimator_args``; each estimator names its own, which
#: a Protocol with ``**kwargs`` cannot express).
AdvantageFn = Callable[..., AdvantageOutputs]


ADVANTAGES: Registry[AdvantageFn] = Registry(
    "advantage estimator",
    "register_advantage",
    capabilities={"needs_critic": False, "needs_groups": False, "needs_turns": False},
)
register_advantage = ADVANTAGES.register


def get_advantage_fn(name: str) -> AdvantageFn:
    """Return the estimator registered as ``name`` (a KeyError lists the valid names)."""
    return ADVANTAGES.get(name)


def estimator_parameters(name: str) -> dict[str, Any]:
    """The hyperparameters of the estimator registered as ``name``: its keyword-only parameters and defaults."""
    fn = inspect.unwrap(get_advantage_fn(name))
    return {p.name: p.default for p in inspect.signature(fn).parameters.values() if p.kind is p.KEYWORD_ONLY}


def compute_advantage(name: str, inputs: AdvantageInputs, **args: Any) -> AdvantageOutputs:
    """Run the estimator registered as ``name`` on ``inputs`` with hyperparameters ``args``."""
    return get_advantage_fn(name)(inputs, **args)


def episode_rewards(token_level_rewards: Tensor, response_mask: Tensor) -> Tensor:
    """``R_i = sum_t r_{i,t} m_{i,t}``: (B, T), (B, T) -> (B,)."""
    return masked_sum(token_level_rewards, response_mask, dim=-1)


def _broadcast(per_sample: Tensor, mask: Tensor) -> Tensor:
    """(B,) -> (B, T): the sample's value on its response tokens, 0 elsewhere."""
    return per_sample[:, None] * mask.to(per_sample.dtype)


@register_advantage("gae", needs_critic=True)
@torch.no_grad()
def gae(inputs: AdvantageInputs) -> AdvantageOutputs:
    """GAE(gamma, lambd) with a critic (Schulman et al. 2016, PPO: Schulman et al. 2017).

    ``A`` from :func:`roll.algorithms.returns.gae_advantages`; returns ``R_t = A_t + V_t`` on response tokens.
    """
    if inputs.values is None:
        raise ValueError(
            "adv_estimator 'gae' needs critic values (AdvantageInputs.values, shape (B, T)); "
            "compute them with the critic or choose a critic-free estimator such as 'grpo'"
        )
    mask = inputs.response_mask
    adv = gae_advantages(inputs.token_level_rewards, inputs.values, mask, inputs.gamma, inputs.lambd)
    returns = torch.where(mask.bool(), adv + inputs.values, torch.zeros_like(adv))
    return AdvantageOutputs(advantages=adv, returns=returns)


@register_advantage("reinforce")
@torch.no_grad()
def reinforce(inputs: AdvantageInputs) -> AdvantageOutputs:
    """REINFORCE without baseline (Williams 1992): ``A_t = G_t``, the discounted return-to-go over response tokens."""
    returns = discounted_returns(inputs.token_level_rewards, inputs.response_mask, inputs.gamma)
    return AdvantageOutputs(advantages=returns.clone(), returns=returns)


@register_advantage("reinforce_plus_plus")
@torch.no_grad()
def reinforce_plus_plus(inputs: AdvantageInputs) -> AdvantageOutputs:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted returns whitened over the batch's response tokens.

    ``A = (G - mean(G)) / sqrt(var(G) + 1e-8)`` with mean/var over all masked tokens. The KL term is part of the
    rewards (the caller applies :func:`roll.algorithms.kl.apply_kl_penalty` first). Returns are the raw ``G``.
    """
    returns = discounted_returns(inputs.token_level_rewards, inputs.response_mask, inputs.gamma)
    return AdvantageOutputs(advantages=masked_whiten(returns, inputs.response_mask), returns=returns)


@register_advantage("grpo", needs_groups=True)
@torch.no_grad()
def grpo(inputs: AdvantageInputs) -> AdvantageOutputs:
    """GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300): group-normalized outcome reward.

    ``A_i = (R_i - mean_g) / (std_g + norm_eps)`` with the sample (unbiased) std of the episode rewards R in the
    sample's group, broadcast to its response tokens. A group of one, or whose rewards are all equal
    (std < 1e-6), gets advantage 0 (no contrast, no signal). Returns equal the advantages.
    """
    mask = inputs.response_mask
    r = episode_rewards(inputs.token_level_rewards, mask)
    stats = group_stats(r, inputs.group_ids, unbiased=True)
    adv = (r - stats.mean) / (stats.std + inputs.norm_eps)
    adv = torch.where(stats.std < STD_ZERO_TOL, torch.zeros_like(adv), adv)
    token_adv = _broadcast(adv, mask)
    return AdvantageOutputs(advantages=token_adv, returns=token_adv.clone())


@register_advantage("dr_grpo", needs_groups=True)
@torch.no_grad()
def dr_grpo(inputs: AdvantageInputs) -> AdvantageOutputs:
    """Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv:2503.20783): GRPO without the std.

    ``A_i = R_i - mean_g`` (no division by the group std, which over-weights easy and hard prompts), broadcast to
    response tokens; a group of one gets 0. Pair it with ``loss_agg_mode='seq-mean-token-sum-norm'``.
    Returns equal the advantages.
    """
    mask = inputs.response_mask
    r = episode_rewards(inputs.token_level_rewards, mask)
    token_adv = _broadcast(r - group_stats(r, inputs.group_ids).mean, mask)
    return AdvantageOutputs(advantages=token_adv, returns=token_adv.clone())


@register_advantage("rloo", needs_groups=True)
@torch.no_grad()
def rloo(inputs: AdvantageInputs) -> AdvantageOutputs:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740): leave-one-out baseline.

    ``A_i = R_i - (sum_{j in g, j != i} R_j) / (n_g - 1)``, broadcast to response tokens; a group of one gets 0.
    Returns equal the advantages.
    """
    mask = inputs.response_mask
    r = episode_rewards(inputs.token_level_rewards, mask)
    stats = group_stats(r, inputs.group_ids)
    others = stats.mean * stats.count - r
    baseline = others / (stats.count - 1).clamp(min=1)
    adv = torch.where(stats.count > 1, r - baseline, torch.zeros_like(r))
    token_adv = _broadcast(adv, mask)
    return AdvantageOutputs(advantages=token_adv, returns=token_adv.clone())


#: GiGPO's episode-level term per ``episode_adv_norm``: group mean and std, or the group mean only
EPISODE_NORMS: dict[str, AdvantageFn] = {"mean_std": grpo, "mean": dr_grpo}
#: Normalizations of turn returns within a comparison group (``step_adv_norm``).
STEP_NORMS = ("mean", "mean_std")


def _check_turn_args(step_adv_norm: str, episode_adv_norm: str = "mean_std", *weights: float) -> None:
    """A ValueError for a normalization outside its choices or a negative weight (GiGPO / step_reinforce)."""
    if step_adv_norm not in STEP_NORMS:
        raise ValueError(f"step_adv_norm must be one of {list(STEP_NORMS)}, got {step_adv_norm!r}")
    if episode_adv_norm not in EPISODE_NORMS:
        raise ValueError(f"episode_adv_norm must be one of {sorted(EPISODE_NORMS)}, got {episode_adv_norm!r}")
    if any(w < 0 for w in weights):
        raise ValueError(f"episode_adv_weight and step_adv_weight must be >= 0, got {list(weights)}")


@torch.no_grad()
def discounted_turn_returns(turn_rewards: Tensor, episode_ids: Tensor, gamma: float) -> Tensor:
    """Per-turn discounted return-to-go within each episode, for :func:`step_level_advantages`.

    Formula: ``G_k = r_k + gamma * G_{k+1}`` over the turns k of one episode (``G = 0`` after its last turn).
    Rows of one episode must appear in turn order; episodes may interleave.

    Args:
        turn_rewards: (N,) reward of each turn.
        episode_ids: (N,) integer id of each turn's episode (trajectory).
        gamma: discount per turn, in [0, 1].
    Returns:
        (N,) returns.
    """
    if tuple(episode_ids.shape) != tuple(turn_rewards.shape) or turn_rewards.dim() != 1:
        raise ValueError(
            f"turn_rewards {tuple(turn_rewards.shape)} and episode_ids {tuple(episode_ids.shape)} must both be (N,)"
        )
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    running: dict[int, float] = {}
    out = torch.empty_like(turn_rewards)
    for k in reversed(range(turn_rewards.shape[0])):  # N turns: small, a plain loop is clear and fast enough
        episode = int(episode_ids[k])
        running[episode] = float(turn_rewards[k]) + gamma * running.get(episode, 0.0)
        out[k] = running[episode]
    return out


@torch.no_grad()
def step_level_advantages(
    turn_returns: Tensor,
    turn_group_ids: Tensor,
    turn_state_ids: Tensor,
    episode_advantages: Tensor,
    *,
    episode_weight: float = 1.0,
    step_weight: float = 1.0,
    method: str = "mean_std",
) -> Tensor:
    """Step-level (anchor-state) advantages of GiGPO (Feng et al. 2025, "Group-in-Group Policy Optimization for
    LLM Agent Training", arXiv:2505.10978).

    Each row is one turn of some trajectory. Turns of the same rollout group that start from the same
    environment state (equal ``(group_id, state_id)``) form an anchor group; their returns are normalized
    within it by ``method`` (see :func:`roll.algorithms.reward_norm.normalize_scores`; an anchor group of one
    gives 0 with ``mean``/``mean_std``). Result: ``episode_weight * episode_adv + step_weight * step_adv``.

    Args:
        turn_returns: (N,) (discounted) return from each turn to the episode end.
        turn_group_ids: (N,) rollout group id of the turn's trajectory.
        turn_state_ids: (N,) id of the state the turn acted in (e.g. a hash of the observation).
        episode_advantages: (N,) the trajectory's episode-level advantage (e.g. GRPO's), repeated per turn.
    Returns:
        (N,) combined per-turn advantages.
    """
    n = turn_returns.shape[0]
    for name, t in (
        ("turn_group_ids", turn_group_ids),
        ("turn_state_ids", turn_state_ids),
        ("episode_advantages", episode_advantages),
    ):
        if tuple(t.shape) != (n,):
            raise ValueError(f"{name} must have shape ({n},) like turn_returns, got {tuple(t.shape)}")
    keys = torch.stack([turn_group_ids.long(), turn_state_ids.long()], dim=1)  # (N, 2)
    anchor_ids = torch.unique(keys, dim=0, return_inverse=True)[1]  # (N,)
    step_adv = normalize_scores(turn_returns, anchor_ids, method)
    return episode_weight * episode_advantages + step_weight * step_adv


@register_advantage("gigpo", needs_groups=True, needs_turns=True)
@torch.no_grad()
def gigpo(
    inputs: AdvantageInputs,
    *,
    episode_adv_weight: float = 1.0,
    step_adv_weight: float = 1.0,
    step_adv_norm: str = "mean_std",
    episode_adv_norm: str = "mean_std",
) -> AdvantageOutputs:
    """GiGPO (Feng et al. 2025, arXiv:2505.10978): GRPO's episode advantage plus a step-level advantage per turn.

    Per turn k of sample i (``inputs.turns``): ``G_k`` = :func:`discounted_turn_returns` of the turn rewards
    (``gamma`` per turn); :func:`step_level_advantages` normalizes ``G`` among the turns of one group (``group_ids``)
    that acted in the same state (``step_adv_norm``: ``mean`` or ``mean_std``) and adds ``episode_adv_weight x``
    the sample's :func:`grpo` advantage (constant over its response tokens):
    ``A_k = episode_adv_weight * A_i + step_adv_weight * step_adv_k``. With ``episode_adv_norm="mean"`` the episode
    term is :func:`dr_grpo`'s ``R_i - mean_g`` (the paper's F_norm = 1; with ``step_adv_norm="mean"`` too it is
    verl-agent's ``mode: mean_norm``). Every generated token of turn k (``[start_k, end_k)`` of row i) gets ``A_k``;
    shapes (B, T). Returns equal the advantages.
    """
    _check_turn_args(step_adv_norm, episode_adv_norm, episode_adv_weight, step_adv_weight)
    if inputs.turns is None:
        raise ValueError(
            "adv_estimator 'gigpo' needs per-turn data (AdvantageInputs.turns): only multi-turn "
            "(agentic) batches have turns; use grpo for single-turn data"
        )
    mask, turns = inputs.response_mask, inputs.turns
    episode = EPISODE_NORMS[episode_adv_norm](inputs).advantages
    groups = inputs.group_ids if inputs.group_ids is not None else torch.zeros(mask.shape[0], dtype=torch.long)
    per_sample = masked_mean(episode, mask, dim=-1)  # (B,): the constant episode advantage of each sample
    out = torch.zeros_like(episode)
    if turns.sample.numel() == 0:
        return AdvantageOutputs(advantages=out, returns=out.clone())
    returns = discounted_turn_returns(turns.rewards, turns.sample, inputs.gamma)
    turn_adv = step_level_advantages(
        returns,
        groups[turns.sample],
        turns.state_ids,
        per_sample[turns.sample],
        episode_weight=episode_adv_weight,
        step_weight=step_adv_weight,
        method=step_adv_norm,
    )
    for i, start, end, adv in zip(turns.sample.tolist(), turns.start.tolist(), turns.end.tolist(), turn_adv.tolist()):
        out[i, start:end] = adv  # N turns: a plain loop is clear and fast enough
    out = out * mask
    return AdvantageOutputs(advantages=out, returns=out.clone())


@register_advantage("step_reinforce", needs_groups=True, needs_turns=True)
@torch.no_grad()
def step_reinforce(inputs: AdvantageInputs, *, step_adv_norm: str = "mean_std") -> AdvantageOutputs:
    """ROLL's ``step_reinforce``: REINFORCE on per-turn returns normalized within the rollout group.

    Per turn k of sample i: ``G_k`` = :func:`discounted_turn_returns` of the turn rewards (``gamma`` per turn);
    ``A_k`` = ``G_k`` normalized (``step_adv_norm``) among the turns of sample i's group (``group_ids``). Every
    generated token of turn k gets ``A_k``; shapes (B, T). Returns equal the advantages. (:func:`gigpo` with no
    episode term and the whole group, not the same-state turns, as the comparison set.)
    """
    _check_turn_args(step_adv_norm)
    if inputs.turns is None:
        raise ValueError(
            "adv_estimator 'step_reinforce' needs per-turn data (AdvantageInputs.turns): only "
            "multi-turn (agentic) batches have turns; use reinforce or grpo for single-turn data"
        )
    mask, turns = inputs.response_mask, inputs.turns
    groups = inputs.group_ids if inputs.group_ids is not None else torch.zeros(mask.shape[0], dtype=torch.long)
    out = torch.zeros_like(inputs.token_level_rewards)
    if turns.sample.numel() == 0:
        return AdvantageOutputs(advantages=out, returns=out.clone())
    returns = discounted_turn_returns(turns.rewards, turns.sample, inputs.gamma)
    turn_adv = normalize_scores(returns, groups[turns.sample], step_adv_norm)
    for i, start, end, adv in zip(turns.sample.tolist(), turns.start.tolist(), turns.end.tolist(), turn_adv.tolist()):
        out[i, start:end] = adv
    out = out * mask
    return AdvantageOutputs(advantages=out, returns=out.clone())


@torch.no_grad()
def whiten_and_clip_advantages(adv: Tensor, mask: Tensor, whiten: bool, clip: float | None) -> Tensor:
    """Optionally whiten advantages over masked tokens, then clamp them to ``[-clip, clip]``.

    Formula: ``A' = clamp((A - mean) / sqrt(var + 1e-8), -clip, clip)`` (each step optional). Shapes: (B, T),
    (B, T) -> (B, T), 0 where the mask is 0.
    """
    out = masked_whiten(adv, mask) if whiten else torch.where(mask.bool(), adv, torch.zeros_like(adv))
    if clip is not None:
        if clip <= 0:
            raise ValueError(f"advantage_clip must be positive or None, got {clip}; e.g. advantage_clip=5.0")
        out = out.clamp(-clip, clip)
    return out
