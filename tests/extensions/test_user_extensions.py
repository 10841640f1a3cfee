"""A user module (tests/extensions/user_plugins.py) adds an advantage estimator, a policy loss, a reward, an env, a
tracker and a training backend that configs name as ``"package.module:name"``, with no change to roll: the preflight
accepts them (and applies what
they declare), the pipeline pieces run them, and a local-mode agentic step trains with them end to end."""

from __future__ import annotations

import math

import pytest
import torch

from roll.config.errors import ConfigError
from roll.config.rlvr import RLVRConfig
from roll.data.batch import Batch
from roll.data.layout import trajectories_to_batch
from roll.data.trajectory import Trajectory, Turn
from roll.launch.command import load_checked
from roll.ppo.advantage_step import advantage_step
from roll.ppo.epochs import actor_loss_config
from roll.ppo.loss_fns import ppo_actor_loss

PLUGINS = "tests.extensions.user_plugins"
OFFLINE = ["pretrain=/nonexistent", "tiny_model=null", "sft_warmup.enabled=false"]


def agentic(*overrides: str):
    return load_checked("sokoban_tiny", overrides=[*OFFLINE, *overrides])


def test_user_estimator_is_looked_up_and_used():
    cfg = agentic(f"adv_estimator='{PLUGINS}:fixed_baseline'", "reward_normalization.method=identity")
    turns = [Turn([1, 2], [3, 4], [], "s", reward=r) for r in (1.0, 0.25)]
    batch = trajectories_to_batch(
        [Trajectory("a", 0, 0, "t", 0, turns=[turns[0]]), Trajectory("b", 1, 0, "t", 0, turns=[turns[1]])], pad_id=0
    )
    advantage_step(cfg, batch, kl_coef=0.0)
    # A = score - 0.5 on the two generated tokens (log-prob indices 1, 2) of each sample
    torch.testing.assert_close(batch["advantages"], torch.tensor([[0.0, 0.5, 0.5], [0.0, -0.25, -0.25]]))


def test_user_estimator_with_its_own_hyperparameters():
    cfg = agentic(
        f"adv_estimator='{PLUGINS}:scaled_baseline'",
        "reward_normalization.method=identity",
        "+adv_estimator_args.baseline=0.25",
        "+adv_estimator_args.scale=2.0",
    )
    turns = [Turn([1, 2], [3, 4], [], "s", reward=r) for r in (1.0, 0.25)]
    batch = trajectories_to_batch(
        [Trajectory("a", 0, 0, "t", 0, turns=[turns[0]]), Trajectory("b", 1, 0, "t", 0, turns=[turns[1]])], pad_id=0
    )
    advantage_step(cfg, batch, kl_coef=0.0)
    # A = 2 x (score - 0.25) on the two generated tokens (log-prob indices 1, 2) of each sample
    torch.testing.assert_close(batch["advantages"], torch.tensor([[0.0, 1.5, 1.5], [0.0, 0.0, 0.0]]))
    with pytest.raises(
        ConfigError,
        match=r"^adv_estimator_args.offset=1: not a hyperparameter of adv_estimator "
        r".*scaled_baseline; it has baseline, scale",
    ):
        agentic(f"adv_estimator='{PLUGINS}:scaled_baseline'", "+adv_estimator_args.offset=1")


def test_gigpo_knobs_are_estimator_args_with_their_top_level_and_roll_names():
    gigpo = agentic("adv_estimator=gigpo", "step_adv_weight=0.5", "+adv_estimator_args.episode_adv_norm=mean")
    assert gigpo.estimator_args() == {"step_adv_weight": 0.5, "episode_adv_norm": "mean"}
    roll_name = agentic("adv_estimator=gigpo", "+step_reward_weight=0.25")  # ROLL's name of the knob
    assert roll_name.estimator_args() == {"step_adv_weight": 0.25}
    with pytest.raises(
        ConfigError,
        match=r"^step_adv_weight=0.5: not a hyperparameter of adv_estimator grpo; it "
        r"has none",
    ):
        agentic("adv_estimator=grpo", "step_adv_weight=0.5")
    with pytest.raises(ConfigError, match=r"^step_adv_weight=0.5: adv_estimator_args.step_adv_weight=0.25 says "):
        agentic("adv_estimator=gigpo", "step_adv_weight=0.5", "+adv_estimator_args.step_adv_weight=0.25")


def test_what_a_user_estimator_declares_is_checked():
    with pytest.raises(ConfigError) as err:
        agentic(f"adv_estimator='{PLUGINS}:needs_a_critic'")
    assert err.value.key == "adv_estimator" and "needs a critic" in str(err.value)
    with pytest.raises(ConfigError, match="cannot import module 'tests.extensions.no_such_module'"):
        agentic("adv_estimator='tests.extensions.no_such_module:x'")
    with pytest.raises(ConfigError, match=r"unknown advantage estimator .*'package.module:nope'"):
        agentic(f"adv_estimator='{PLUGINS}:nope'")


def test_user_policy_loss_is_used_by_the_actor_loss():
    cfg = agentic(f"policy_loss='{PLUGINS}:vanilla_pg'")
    mb = Batch(
        tensors={
            "response_mask": torch.tensor([[0, 1, 1]]),
            "old_log_probs": torch.zeros(1, 2),
            "advantages": torch.ones(1, 2),
        }
    )
    log_probs = torch.tensor([[math.log(2.0), 0.0]])
    loss, metrics = ppo_actor_loss(log_probs, None, mb, cfg=actor_loss_config(cfg))
    # -A * ratio = [-2, -1]; seq-mean-token-mean (sokoban_tiny) of one sequence: -1.5, no clip at ratio 2
    assert loss.item() == pytest.approx(-1.5) and metrics["actor/pg_loss"] == pytest.approx(-1.5)


def test_user_reward_from_an_rlvr_config():
    from roll.launch.preflight import preflight
    from roll.rewards.workers import RewardWorker

    cfg = load_checked(
        "rlvr_tiny", overrides=[f"+rewards.tag_to_reward.math='{PLUGINS}:exact_text'"], schema=RLVRConfig
    )
    cfg.rewards.reward_options = {"exact_text": {"bonus": 2.0}}
    preflight(cfg)
    worker = RewardWorker(dict(cfg.rewards.reward_options), dict(cfg.rewards.tag_to_reward))
    assert [r.score for r in worker.compute([" 7 ", "8"], ["7", "7"], ["math", "math"])] == [2.0, 0.0]
    cfg.rewards.reward_options = {"exact_text": {"bogus": 1.0}}
    with pytest.raises(
        ConfigError,
        match=r"rewards.reward_options.exact_text.bogus=1.0: not an option of reward "
        r"'exact_text'; it accepts \['bonus'\]",
    ):
        preflight(cfg)


def test_score_normalization_through_registries():
    """Both pipelines pick their score normalizer from one registry (named by their config); RLVR's reward_norm
    scopes are a registry a user module adds to."""
    from roll.ppo.advantage_step import SCORE_NORMALIZERS, EpisodeScoreNorm, RLVRScoreNorm, score_normalizer

    assert SCORE_NORMALIZERS.names() == ["episode", "response"]
    assert isinstance(score_normalizer(agentic()), EpisodeScoreNorm)
    episode = score_normalizer(agentic(f"reward_normalization.method='{PLUGINS}:median_norm'"))
    batch = Batch(tensors={"scores": torch.tensor([1.0, 2.0, 4.0])}, meta={"group_id": [0, 0, 1]})
    torch.testing.assert_close(episode(batch), torch.tensor([-1.0, 0.0, 2.0]))  # the user's formula: minus 2
    cfg = load_checked("rlvr_tiny", overrides=[f"reward_norm='{PLUGINS}:median_scope'"], schema=RLVRConfig)
    norm = score_normalizer(cfg)
    assert isinstance(norm, RLVRScoreNorm)
    batch = Batch(tensors={"scores": torch.tensor([1.0, 2.0, 4.0])}, meta={"group_id": [0, 0, 1]})
    torch.testing.assert_close(norm(batch), torch.tensor([-1.0, 0.0, 2.0]))  # minus the median 2
    with pytest.raises(
        ConfigError,
        match=r"^reward_norm='prompt': unknown reward_norm scope 'prompt'; valid names: "
        r"\['batch', 'group', .*'running'\]",
    ):
        load_checked("rlvr_tiny", overrides=["reward_norm=prompt"], schema=RLVRConfig)


def test_a_data_tag_without_a_reward_is_a_config_error(tmp_path):
    data = tmp_path / "chess.jsonl"
    data.write_text('{"prompt": "Best move?", "ground_truth": "e4", "tag": "chess"}\n')
    with pytest.raises(ConfigError, match="data tag 'chess' has no reward"):
        load_checked(
            "rlvr_tiny",
            overrides=[f"actor_train.data_args.file_name=[{data}]", "validation.file_name=[]"],
            schema=RLVRConfig,
        )


def test_user_env_from_a_config():
    from roll.envs import make_env

    cfg = agentic(f"custom_envs.SimpleSokoban.env_type='{PLUGINS}:count_up'", "~custom_envs.SimpleSokoban.env_config")
    env = make_env(cfg.custom_envs["SimpleSokoban"].env_type, {})
    obs, _ = env.reset(seed=0)
    n = int(obs.split()[1].rstrip("."))
    assert env.step(f"<answer>{n}</answer>")[1] == 1.0
    with pytest.raises(ConfigError, match="custom_envs.SimpleSokoban.env_config"):
        agentic(f"custom_envs.SimpleSokoban.env_type='{PLUGINS}:count_up'")  # sokoban's kwargs are not count_up's


def test_user_tracker_from_a_config(tmp_path):
    from roll.tracking import make_tracker

    cfg = agentic(f"track_with='{PLUGINS}:tally'", "+tracker_kwargs.file_name=counts.json")
    with make_tracker(cfg.track_with, exp_name="e", log_dir=str(tmp_path), tracker_kwargs=cfg.tracker_kwargs) as t:
        t.log({"a/x": 1.0, "a/y": 2.0}, step=0)
    assert (tmp_path / "counts.json").read_text() == '{"0": 2}'
    with pytest.raises(ConfigError, match=r"track_with='mlflow': unknown tracker .*valid names: \[.*'tally'"):
        agentic("track_with=mlflow")
    with pytest.raises(
        ConfigError,
        match=r"track_with='.*:tally': tracker_kwargs \['flush_secs'\] are not "
        r"accepted by tracker",
    ):
        agentic(f"track_with='{PLUGINS}:tally'", "+tracker_kwargs.flush_secs=5")


def test_user_backend_from_a_config():
    from roll.strategies.registry import get_strategy_class

    name = f"{PLUGINS}:counting_deepspeed"
    cfg = agentic(f"actor_train.strategy_args.strategy_name='{name}'")
    assert (
        get_strategy_class(cfg.actor_train.strategy_args.strategy_name, "actor_train").__name__ == "CountingDeepSpeed"
    )
    with pytest.raises(
        ConfigError,
        match=r"reference.strategy_args.strategy_name='.*counting_deepspeed': .* cannot "
        r"serve reference",
    ):
        agentic(f"+reference.strategy_args.strategy_name='{name}'", "init_kl_coef=0.1")


@pytest.mark.slow
def test_one_agentic_step_with_every_user_extension(tiny_model_dir, tmp_path):
    from roll.pipelines.agentic_pipeline import AgenticPipeline

    cfg = load_checked(
        "sokoban_tiny",
        overrides=[
            f"pretrain={tiny_model_dir}",
            "tiny_model=null",
            "sft_warmup.enabled=false",
            "distributed=local",
            "max_steps=1",
            "eval_steps=0",
            "val_env_manager=null",
            f"track_with='{PLUGINS}:tally'",
            "trajectory_dump_steps=0",
            f"actor_train.strategy_args.strategy_name='{PLUGINS}:counting_deepspeed'",
            f"output_dir={tmp_path}/out",
            f"logging_dir={tmp_path}/logs",
            "rollout_batch_size=8",
            "train_env_manager.env_groups=2",
            "train_env_manager.group_size=4",
            "actor_train.training_args.per_device_train_batch_size=4",
            "actor_train.training_args.gradient_accumulation_steps=2",
            "actor_train.num_cpus_per_worker=1",
            "actor_infer.num_cpus_per_worker=1",
            "actor_train.strategy_args.strategy_config.zero_stage=0",
            f"adv_estimator='{PLUGINS}:fixed_baseline'",
            f"policy_loss='{PLUGINS}:vanilla_pg'",
            f"custom_envs.SimpleSokoban.env_type='{PLUGINS}:count_up'",
            "~custom_envs.SimpleSokoban.env_config",
            "custom_envs.SimpleSokoban.max_actions_per_traj=2",
            "custom_envs.SimpleSokoban.max_tokens_per_step=6",
        ],
    )
    metrics = AgenticPipeline(cfg).run()
    assert metrics["rollout/batch_size"] == 8 and metrics["rollout/mean_actions"] == 2.0
    assert math.isfinite(metrics["actor/pg_loss"]) and "actor/clip_frac" not in metrics  # vanilla_pg's metrics
    assert metrics["actor/user_steps"] == 1.0  # the user backend trained: one optimizer step (8 = 4 x 2 samples)
    assert (tmp_path / "logs" / "tally.json").exists()  # the user tracker logged the run
