"""The pipelines reach every algorithm by config: example configs, config errors, the advantage and loss steps
against direct calls of roll.algorithms (and hand-computed numbers), the critic and deepspeed_infer strategies,
and 2 local-mode steps of algo_ppo end to end."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from roll.algorithms.advantages import AdvantageInputs, compute_advantage, whiten_and_clip_advantages
from roll.algorithms.kl import apply_kl_penalty
from roll.algorithms.losses import ActorLossConfig, actor_loss, value_loss
from roll.algorithms.masking import masked_whiten
from roll.algorithms.reward_norm import normalize_episode_scores
from roll.config.errors import ConfigError
from roll.config.validation import validate
from roll.data.layout import trajectories_to_batch
from roll.data.trajectory import Trajectory, Turn
from roll.launch.command import load_checked
from roll.launch.preflight import check_algorithms, preflight
from roll.ppo.advantage_step import advantage_step
from roll.ppo.epochs import actor_loss_config
from roll.ppo.loss_fns import critic_value_loss, loss_mask, ppo_actor_loss
from tests.config_cache import cached_config

REPO = Path(__file__).resolve().parents[2]
ALGOS = ["ppo", "grpo", "dr_grpo", "dapo", "reinforce_plus_plus", "rloo", "gigpo"]
R = 1 / math.sqrt(2)  # 0.7071...: a two-sample group {1, 0} standardized with the sample std


# ---------------------------------------------------------------- example configs and config errors
def algo_cfg(name: str, overrides: dict | None = None):
    """``examples/config/algo_<name>.yaml`` (loaded once) with ``overrides`` (dotted keys) set, re-validated."""
    cfg = cached_config(f"algo_{name}")
    for dotted, value in (overrides or {}).items():
        *parents, leaf = dotted.split(".")
        obj = cfg
        for part in parents:
            obj = getattr(obj, part)
        setattr(obj, leaf, value)
    validate(cfg)
    preflight(cfg)
    return cfg


@pytest.mark.parametrize("name", ALGOS)
def test_every_algo_config_loads_with_its_recipe(name):
    cfg = cached_config(f"algo_{name}")
    assert cfg.adv_estimator == {"ppo": "gae", "dapo": "grpo"}.get(name, name)
    assert (cfg.critic is not None) == (name == "ppo")
    assert cfg.exp_name == f"algo_{name}" and cfg.train_env_manager.tags == ["SimpleSokoban"]  # from sokoban_tiny
    recipe = {
        "ppo": dict(add_token_level_kl=True, whiten_advantages=True, value_clip=0.5, target_kl=0.1),
        "grpo": dict(use_kl_loss=True, kl_loss_coef=0.001, loss_agg_mode="seq-mean-token-mean"),
        "dr_grpo": dict(loss_agg_mode="seq-mean-token-sum-norm", use_kl_loss=False),
        "dapo": dict(pg_clip_low=0.2, pg_clip_high=0.28, use_kl_loss=False, add_token_level_kl=False),
        "reinforce_plus_plus": dict(add_token_level_kl=True, init_kl_coef=0.01),
        "rloo": dict(add_token_level_kl=True, init_kl_coef=0.05),
        "gigpo": dict(gamma=0.95),
    }[name]
    for key, value in recipe.items():
        assert getattr(cfg, key) == value, key
    if name == "gigpo":
        assert cfg.estimator_args() == {"episode_adv_weight": 1.0, "step_adv_weight": 1.0, "step_adv_norm": "mean_std"}


@pytest.mark.parametrize(
    "name, overrides, key",
    [
        ("ppo", {"critic": None}, "adv_estimator"),  # gae without a critic
        ("ppo", {"adv_estimator": "grpo"}, "critic"),  # a critic nobody uses
        ("ppo", {"kl_penalty": "full"}, "kl_penalty"),  # vocabulary KL: rejected
        ("ppo", {"use_kl_loss": True}, "use_kl_loss"),  # KL in reward and loss
        ("ppo", {"critic_warmup": -1}, "critic_warmup"),
        ("ppo", {"value_clip": 0.0}, "value_clip"),
        ("ppo", {"pg_clip_low": 1.0}, "pg_clip_low"),
        ("grpo", {"kl_loss_coef": 0.0}, "kl_loss_coef"),  # use_kl_loss with nothing to weigh
        ("grpo", {"critic_warmup": 2}, "critic_warmup"),  # warm-up of a critic that does not exist
        ("grpo", {"adv_estimator": "bogus"}, "adv_estimator"),
    ],
)
def test_contradictory_settings_are_config_errors(name, overrides, key):
    with pytest.raises(ConfigError) as err:
        algo_cfg(name, overrides)
    assert err.value.key == key


def test_config_errors_through_the_loader():
    with pytest.raises(ConfigError, match="kl_penalty='full'"):
        load_checked("algo_ppo", overrides=["kl_penalty=full"])
    from roll.config.rlvr import RLVRConfig

    with pytest.raises(ConfigError, match="multi-turn"):  # RLVR samples have no turns
        check_algorithms(RLVRConfig(adv_estimator="gigpo"))


# ---------------------------------------------------------------- a small real batch
def _traj(group: int, k: int, turns: list[tuple[str, float]], eos_on_first: bool = False) -> Trajectory:
    """Turns of 3 prompt tokens + 2 generated tokens (+1 appended end token on the first turn if asked)."""
    out = []
    for j, (obs, reward) in enumerate(turns):
        appended = eos_on_first and j == 0
        out.append(
            Turn(
                prompt_ids=[5, 6, 7],
                response_ids=[8, 9] + ([2] if appended else []),
                response_log_probs=[-1.0, -1.0],
                observation=obs,
                reward=reward,
                appended_eos=appended,
            )
        )
    return Trajectory(traj_id=f"t-{group}-{k}", env_id=k, group_id=group, tag="SimpleSokoban", seed=group, turns=out)


def make_batch():
    """Group 0: A (S0 -> S1, reward 1 on turn 2) and B (S0 -> S2, no reward); group 1: C, D with no reward,
    their first turn in a state with the same text S0 (a different group, so never compared with A/B)."""
    trajs = [
        _traj(0, 0, [("S0", 0.0), ("S1", 1.0)]),
        _traj(0, 1, [("S0", 0.0), ("S2", 0.0)], eos_on_first=True),
        _traj(1, 0, [("S0", 0.0), ("S3", 0.0)]),
        _traj(1, 1, [("S0", 0.0), ("S3", 0.0)]),
    ]
    batch = trajectories_to_batch(trajs, pad_id=0)
    gen = torch.Generator().manual_seed(0)
    shape = batch["token_level_scores"].shape
    batch["old_log_probs"] = -torch.rand(shape, generator=gen) * 2
    batch["ref_log_probs"] = -torch.rand(shape, generator=gen) * 2
    batch["values"] = torch.randn(shape, generator=gen)
    return batch


def turn_tokens(batch, i: int) -> list[torch.Tensor]:
    """Indices (log-prob frame) of each turn's trained tokens of sample i."""
    mask = loss_mask(batch)[i]
    return [torch.arange(s, e)[mask[s:e] > 0] for s, e in batch["turn_spans"][i]]


def test_turn_spans_cover_exactly_the_trained_tokens():
    batch = make_batch()
    mask = loss_mask(batch)
    for i in range(len(batch)):
        covered = torch.zeros_like(mask[i])
        for s, e in batch["turn_spans"][i]:
            covered[s:e] = 1
        assert torch.equal(covered, mask[i])  # the appended end token of B's first turn is outside its span


def direct_advantages(cfg, batch, kl_coef):
    """The documented order of operations (docs/algorithms.md), written with direct calls."""
    mask = loss_mask(batch)
    grouping = {"state": batch["group_id"], "batch": None, "inductive": batch["tag"]}[cfg.reward_normalization.grouping]
    ids = None if grouping is None else torch.tensor([sorted(set(grouping)).index(g) for g in grouping])
    norm = cfg.reward_normalization
    scores = normalize_episode_scores(batch["scores"], ids, norm.method, norm.norm_mean_type, norm.norm_std_type)
    if cfg.reward_clip is not None:
        scores = scores.clamp(-cfg.reward_clip, cfg.reward_clip)
    rewards = torch.zeros_like(mask)
    for i in range(len(batch)):
        rewards[i, mask[i].nonzero().max()] = scores[i]
    if cfg.add_token_level_kl:
        rewards, _ = apply_kl_penalty(
            rewards, batch["old_log_probs"], batch["ref_log_probs"], mask, kl_coef, cfg.kl_penalty
        )
    if cfg.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    values = batch["values"] if cfg.adv_estimator == "gae" else None
    out = compute_advantage(
        cfg.adv_estimator,
        AdvantageInputs(
            rewards, mask, values=values, group_ids=torch.tensor(batch["group_id"]), gamma=cfg.gamma, lambd=cfg.lambd
        ),
    )
    return whiten_and_clip_advantages(out.advantages, mask, cfg.whiten_advantages, cfg.advantage_clip), out.returns


def pipeline_advantages(name, overrides, kl_coef=0.3):
    cfg = algo_cfg(name, overrides)
    batch = make_batch()
    if cfg.critic is None:
        del batch.tensors["values"]
    metrics = advantage_step(cfg, batch, kl_coef)
    return cfg, batch, metrics


ADV_CASES = [
    ("grpo", {}),
    ("dr_grpo", {}),
    ("rloo", {}),
    ("reinforce_plus_plus", {}),
    ("ppo", {}),
    ("ppo", {"lambd": 0.5, "gamma": 0.9, "whiten_advantages": False}),
    ("ppo", {"kl_penalty": "abs"}),
    ("ppo", {"kl_penalty": "mse"}),
    ("ppo", {"kl_penalty": "low_var_kl"}),
    ("grpo", {"whiten_rewards": True, "adv_estimator": "reinforce"}),
    ("grpo", {"whiten_advantages": True}),
    ("grpo", {"advantage_clip": 0.3}),
    (
        "grpo",
        {
            "reward_normalization.method": "mean_std",
            "reward_normalization.grouping": "batch",
            "adv_estimator": "reinforce",
            "reward_clip": 0.5,
        },
    ),
    (
        "grpo",
        {
            "reward_normalization.method": "asym_clip",
            "reward_normalization.grouping": "inductive",
            "adv_estimator": "reinforce",
        },
    ),
    (
        "grpo",
        {
            "reward_normalization.norm_mean_type": "group",
            "reward_normalization.norm_std_type": "batch",
            "adv_estimator": "reinforce",
        },
    ),
]


@pytest.mark.parametrize("name, overrides", ADV_CASES)
def test_advantage_step_equals_direct_calls(name, overrides):
    cfg, batch, metrics = pipeline_advantages(name, overrides)
    expected_adv, expected_ret = direct_advantages(cfg, batch, 0.3)
    torch.testing.assert_close(batch["advantages"], expected_adv)
    torch.testing.assert_close(batch["returns"], expected_ret)
    assert math.isfinite(metrics["critic/advantages_mean"]) and "critic/returns_max" in metrics
    if overrides:  # the override reaches the math: the result differs from the recipe's
        _, base, _ = pipeline_advantages(name, {})
        assert not torch.allclose(base["advantages"], batch["advantages"])
    if cfg.add_token_level_kl:
        assert metrics["actor/reward_kl_coef"] == 0.3 and "actor/reward_kl" in metrics
    if cfg.critic is not None:
        assert math.isfinite(metrics["critic/explained_variance"])


def test_grpo_and_reward_clip_hand_computed():
    # grpo, identity normalization: group 0 scores {1, 0} -> mean 0.5, sample std 1/sqrt(2) -> +-1/sqrt(2);
    # group 1 scores {0, 0} -> std 0 -> 0.
    _, batch, _ = pipeline_advantages("grpo", {})
    mask = loss_mask(batch)
    for i, want in enumerate([R, -R, 0.0, 0.0]):
        torch.testing.assert_close(batch["advantages"][i][mask[i] > 0], torch.full((4,), want), atol=1e-5, rtol=0)
    assert float(batch["advantages"][mask == 0].abs().max()) == 0.0
    # batch mean_std of {1, 0, 0, 0}: mean 0.25, sample std 0.5 -> {1.5, -0.5, -0.5, -0.5}; reward_clip 0.5 after
    # normalization -> {0.5, -0.5, -0.5, -0.5}; reinforce with gamma 1 puts the return on every response token
    _, batch, _ = pipeline_advantages(
        "grpo",
        {
            "reward_normalization.method": "mean_std",
            "reward_clip": 0.5,
            "reward_normalization.grouping": "batch",
            "adv_estimator": "reinforce",
            "gamma": 1.0,
        },
    )
    for i, want in enumerate([0.5, -0.5, -0.5, -0.5]):
        torch.testing.assert_close(batch["advantages"][i][mask[i] > 0], torch.full((4,), want), atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "mean, std, want",
    [
        # ROLL's agentic_val_sokoban_native: group means {0.5, 0}, the batch's sample std of {1, 0, 0, 0} is 0.5
        ("group", "batch", [1.0, -1.0, 0.0, 0.0]),
        ("batch", None, [0.75, -0.25, -0.25, -0.25]),  # minus the batch mean 0.25, no division
        ("group", "group", [R, -R, 0.0, 0.0]),  # GRPO's: group 1 {0, 0} has no spread
    ],
)
def test_norm_types_reach_the_advantages_hand_computed(mean, std, want):
    """reward_normalization's two scopes set in the config (method identity derives nothing) reach the advantages:
    reinforce with gamma 1 puts each normalized score on every response token."""
    _, batch, _ = pipeline_advantages(
        "grpo",
        {
            "reward_normalization.norm_mean_type": mean,
            "reward_normalization.norm_std_type": std,
            "adv_estimator": "reinforce",
            "gamma": 1.0,
        },
    )
    mask = loss_mask(batch)
    for i, value in enumerate(want):
        torch.testing.assert_close(batch["advantages"][i][mask[i] > 0], torch.full((4,), value), atol=1e-5, rtol=0)


def test_gigpo_hand_computed():
    # Turn returns with gamma 0.5: A: G1 = 0 + 0.5 * 1 = 0.5, G2 = 1; B, C, D: 0.
    # Anchor (group 0, S0) = {A1: 0.5, B1: 0}: mean_std -> +-1/sqrt(2); every other anchor has one turn or no
    # spread -> 0. Episode (grpo): A +1/sqrt(2), B -1/sqrt(2), C = D = 0. Combined = 1.0 * episode + 0.5 * step.
    _, batch, _ = pipeline_advantages("gigpo", {"gamma": 0.5, "adv_estimator_args": {"step_adv_weight": 0.5}})
    want = [[R + 0.5 * R, R], [-R - 0.5 * R, -R], [0.0, 0.0], [0.0, 0.0]]
    for i in range(4):
        for turn, idx in enumerate(turn_tokens(batch, i)):
            torch.testing.assert_close(
                batch["advantages"][i, idx], torch.full((len(idx),), want[i][turn]), atol=1e-5, rtol=0
            )
    assert float(batch["advantages"][loss_mask(batch) == 0].abs().max()) == 0.0
    torch.testing.assert_close(batch["returns"], batch["advantages"])


def test_gigpo_without_turns_is_a_clear_error():
    cfg = algo_cfg("gigpo")
    batch = make_batch()
    for key in ("turn_spans", "turn_states"):
        del batch.meta[key]
    with pytest.raises(ValueError, match="per-turn"):
        advantage_step(cfg, batch, 0.0)


# ---------------------------------------------------------------- the loss step
LOSS_CASES = [
    {},
    {"pg_clip": 0.1},
    {"pg_clip_low": 0.1, "pg_clip_high": 0.05},
    {"dual_clip_loss": True, "dual_clip_c": 1.5},
    {"loss_agg_mode": "token-mean"},
    {"loss_agg_mode": "seq-mean-token-sum"},
    {"loss_agg_mode": "seq-mean-token-sum-norm"},
    {"entropy_loss_coef": 0.1},
    {"kl_loss_coef": 0.5, "kl_loss_type": "mse"},
    {"use_kl_loss": False},
    {"policy_loss": "gspo", "pg_clip": 0.01},
]


@pytest.mark.parametrize("overrides", LOSS_CASES)
def test_actor_loss_step_equals_direct_call(overrides):
    cfg = algo_cfg("grpo", overrides)  # base: KL loss 0.001 low_var_kl, seq-mean-token-mean
    batch = make_batch()
    first = int(batch["response_mask"][0].nonzero()[0])
    batch["response_mask"][0, first] = 0  # rows with different token counts: token- and sequence-means differ
    mask = loss_mask(batch)
    gen = torch.Generator().manual_seed(1)
    batch["advantages"] = torch.randn(mask.shape, generator=gen) * 3 * mask
    log_probs = batch["old_log_probs"] + torch.randn(mask.shape, generator=gen) * 0.5  # ratios far outside 1 +- 0.2
    entropy = torch.rand(mask.shape, generator=gen)
    loss, metrics = ppo_actor_loss(log_probs, entropy, batch, cfg=actor_loss_config(cfg))
    direct = ActorLossConfig(
        pg_clip=cfg.pg_clip,
        pg_clip_low=cfg.pg_clip_low,
        pg_clip_high=cfg.pg_clip_high,
        dual_clip_loss=cfg.dual_clip_loss,
        dual_clip_c=cfg.dual_clip_c,
        loss_agg_mode=cfg.loss_agg_mode,
        norm_len=cfg.sequence_length,
        entropy_loss_coef=cfg.entropy_loss_coef,
        use_kl_loss=cfg.use_kl_loss,
        kl_loss_coef=cfg.kl_loss_coef,
        kl_loss_type=cfg.kl_loss_type,
        policy_loss=cfg.policy_loss,
    )
    want, want_metrics = actor_loss(
        log_probs,
        batch["old_log_probs"],
        batch["advantages"],
        mask,
        direct,
        entropy=entropy,
        ref_log_probs=batch["ref_log_probs"],
    )
    torch.testing.assert_close(loss, want)
    assert metrics == want_metrics
    for key in ("actor/pg_loss", "actor/clip_frac", "actor/approx_kl", "actor/entropy", "actor/ref_kl"):
        assert math.isfinite(metrics[key]), key
    if overrides:
        base, _ = ppo_actor_loss(log_probs, entropy, batch, cfg=actor_loss_config(algo_cfg("grpo")))
        assert not torch.isclose(base, loss)


def test_critic_value_loss_uses_value_clip():
    cfg = algo_cfg("ppo")
    batch = make_batch()
    mask = loss_mask(batch)
    gen = torch.Generator().manual_seed(2)
    batch["returns"] = torch.randn(mask.shape, generator=gen) * mask
    values = batch["values"] + 2 * torch.randn(mask.shape, generator=gen)  # moves beyond value_clip = 0.5
    loss, metrics = critic_value_loss(values, None, batch, value_clip=cfg.value_clip)
    want, want_metrics = value_loss(values, batch["values"], batch["returns"], mask, value_clip=0.5)
    torch.testing.assert_close(loss, want)
    assert metrics == want_metrics and metrics["critic/vf_clip_frac"] > 0


# ---------------------------------------------------------------- critic and deepspeed_infer strategies


def _worker_config(model_dir, strategy, **strategy_config):
    from roll.config.worker import WorkerConfig

    cfg = WorkerConfig()
    cfg.model_args.model_name_or_path = model_dir
    cfg.model_args.disable_gradient_checkpointing = True
    cfg.strategy_args.strategy_name = strategy
    cfg.strategy_args.strategy_config = dict(strategy_config)
    cfg.training_args.per_device_train_batch_size = 2
    cfg.training_args.gradient_accumulation_steps = 1
    cfg.training_args.learning_rate = 1e-2
    cfg.infer_batch_size = 2
    return cfg


def _sequences():
    from roll.data.batch import Batch

    ids = torch.tensor([[3, 4, 5, 6, 7], [8, 9, 10, 0, 0], [11, 12, 13, 14, 0]])
    mask = (torch.arange(5)[None] < torch.tensor([[5], [3], [4]])).long()
    return Batch({"input_ids": ids, "attention_mask": mask, "response_mask": mask})


@pytest.mark.parametrize("stage", [0, 3])
def test_deepspeed_infer_log_probs_equal_transformers(tiny_model_dir, dist_env, stage):
    from transformers import AutoModelForCausalLM

    from roll.models.logprobs import token_log_probs
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import build_strategy

    strategy = build_strategy(_worker_config(tiny_model_dir, "deepspeed_infer", zero_stage=stage), "reference")
    strategy.initialize(StrategyContext())
    batch = _sequences()
    got = strategy.compute_log_probs(batch)["log_probs"]
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        want, _ = token_log_probs(model, batch["input_ids"], batch["attention_mask"])
    torch.testing.assert_close(got * batch["attention_mask"][:, 1:], want * batch["attention_mask"][:, 1:])
    # weights can be replaced (the pipeline loads the warm-started actor into the reference)
    strategy.load_weights([(n, torch.zeros_like(p)) for n, p in model.named_parameters()])
    flat = strategy.compute_log_probs(batch)["log_probs"]
    scored = batch["attention_mask"][:, 1:] * batch["attention_mask"][:, :-1]  # padding positions hold 0
    torch.testing.assert_close(flat, scored * -math.log(model.config.vocab_size))


def test_deepspeed_infer_rejects_bad_settings():
    from roll.strategies.registry import strategy_options

    for bad in ({"zero_stage": 2}, {"offload_param": "cpu"}, {"optimizer": {}}):
        with pytest.raises(ConfigError, match="reference.strategy_args.strategy_config"):
            strategy_options(_worker_config("/m", "deepspeed_infer", **bad), "reference.strategy_args.strategy_config")
    with pytest.raises(ConfigError, match="cannot serve actor_infer"):  # it scores, it does not generate
        algo_cfg("grpo", {"actor_infer.strategy_args.strategy_name": "deepspeed_infer"})


def test_critic_strategy_values_training_and_backbone_sync(tiny_model_dir, dist_env):
    from transformers import AutoModelForCausalLM

    from roll.strategies.base import StrategyContext
    from roll.strategies.deepspeed_train import DeepSpeedCriticStrategy
    from roll.strategies.registry import build_strategy, get_strategy_class

    cls = get_strategy_class("deepspeed_train", "critic")
    assert cls is DeepSpeedCriticStrategy and get_strategy_class("deepspeed_train", "actor_train") is not cls
    critic = build_strategy(_worker_config(tiny_model_dir, "deepspeed_train", zero_stage=0), "critic")
    assert type(critic) is cls
    critic.initialize(StrategyContext(total_steps=10))
    batch = _sequences()
    values = critic.compute_values(batch)["values"]
    assert values.shape == (3, 4) and float(values.abs().max()) == 0.0  # a new head starts at zero
    batch["values"] = values
    batch["returns"] = torch.ones(3, 4)
    losses = [
        critic.train_step(batch.select([0, 1]), lambda v, e, mb: critic_value_loss(v, e, mb, None)) for _ in range(5)
    ]
    assert losses[-1]["critic/vf_loss"] < losses[0]["critic/vf_loss"]
    assert {"critic/grad_norm", "critic/lr", "critic/vf_clip_frac"} <= set(losses[0])
    actor = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    named = [(n, p.detach() + 1.0) for n, p in actor.named_parameters()]
    critic.load_weights(named)  # backbone loaded, value head kept
    got = dict(critic.named_weights())
    torch.testing.assert_close(got["model.norm.weight"], dict(named)["model.norm.weight"])
    with pytest.raises(ValueError, match="architecture"):
        critic.load_weights([("not.a.param", torch.zeros(1))])


# ---------------------------------------------------------------- end to end
#: Backends of the three torch roles: the config's DeepSpeed ones, or FSDP2 for all (strategy names only: the
#: DeepSpeed strategy_config's zero_stage is ignored with a warning).
FSDP2_ROLES = [
    "actor_train.strategy_args.strategy_name=fsdp2_train",
    "critic.strategy_args.strategy_name=fsdp2_train",
    "reference.strategy_args.strategy_name=fsdp2_infer",
]


@pytest.mark.slow
@pytest.mark.parametrize("backends", [[], FSDP2_ROLES], ids=["deepspeed", "fsdp2"])
def test_algo_ppo_two_local_steps(tmp_path, tiny_model_dir, backends):
    overrides = [
        "distributed=local",
        f"pretrain={tiny_model_dir}",
        f"output_dir={tmp_path}/out",
        f"logging_dir={tmp_path}/logs",
        "max_steps=2",
        "eval_steps=0",
        "track_with=stdout",
        "val_env_manager=null",
        "sft_warmup.steps=3",
        "sft_warmup.num_demos=16",
        "sft_warmup.batch_size=8",
        "rollout_batch_size=8",
        "train_env_manager.env_groups=2",
        "train_env_manager.group_size=4",
        "sequence_length=512",
        "custom_envs.SimpleSokoban.max_actions_per_traj=3",
        "custom_envs.SimpleSokoban.max_tokens_per_step=6",
        "actor_train.training_args.per_device_train_batch_size=4",
        "actor_train.training_args.gradient_accumulation_steps=1",
        "critic.training_args.per_device_train_batch_size=4",
        "critic.training_args.gradient_accumulation_steps=1",
        *backends,
    ]
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_agentic_pipeline.py"),
        "--config-name",
        "algo_ppo",
        *overrides,
    ]
    proc = subprocess.run(
        cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"}
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "logs" / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if r["step"] >= 1]
    assert [r["step"] for r in steps] == [1, 2]
    for row in steps:
        for key in (
            "actor/pg_loss",
            "actor/clip_frac",
            "actor/approx_kl",
            "actor/ref_kl",
            "actor/entropy",
            "actor/grad_norm",
            "actor/reward_kl",
            "actor/kl_coef",
            "critic/advantages_mean",
            "critic/advantages_max",
            "critic/returns_mean",
            "critic/returns_min",
            "critic/vf_loss",
            "critic/vf_clip_frac",
            "critic/explained_variance",
            "critic/grad_norm",
            "critic/values_mean",
        ):
            assert key in row and math.isfinite(row[key]), key
    # the reference is the warm-started actor, so the first rollout's KL is 0, and the adaptive controller
    # (target 0.1, horizon 10000) moves the coefficient by e = -0.2 over 8 samples: 0.2 * (1 - 0.2 * 8 / 10000)
    assert steps[0]["actor/reward_kl"] == pytest.approx(0.0, abs=1e-6)
    assert steps[0]["actor/kl_coef"] == pytest.approx(0.2 * (1 - 0.2 * 8 / 10000), rel=1e-6)
    assert steps[0]["critic/values_mean"] == 0.0  # zero-initialized value head
    assert steps[1]["critic/values_mean"] != 0.0  # ... which the first critic update moved
