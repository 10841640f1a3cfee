"""EnvManager with a scripted generator: group seeding, masks, truncation, template conformance, fault isolation."""

from __future__ import annotations

import traceback

import pytest
import torch

from roll.agentic.env_manager import EnvManager, group_seed, plan_groups
from roll.data.layout import trajectories_to_batch
from roll.models.loading import load_tokenizer
from tests.agentic.conftest import make_cfg
from tests.agentic.helpers import FlakyEnv, ScriptedGenerator


def _manager(cfg, tok_dir: str, phase: str = "train", raise_errors: bool = False) -> EnvManager:
    m = cfg.train_env_manager
    return EnvManager(
        m,
        plan_groups(m, cfg.custom_envs),
        tok_dir,
        cfg.actor_infer.generating_args,
        cfg.sequence_length,
        cfg.seed,
        phase,
        raise_errors,
    )


def _first_obs(traj) -> str:
    return traj.turns[0].observation


def test_group_seeding(qwen_tokenizer_dir):
    FlakyEnv.reset_log()
    manager = _manager(make_cfg(), qwen_tokenizer_dir)
    gen = ScriptedGenerator(manager.tokenizer)
    step1 = manager.rollout(1, gen).trajectories
    step2 = manager.rollout(2, gen).trajectories
    by_group = {}
    for t in step1:
        by_group.setdefault(t.group_id, set()).add((t.seed, _first_obs(t)))
    assert all(len(v) == 1 for v in by_group.values())  # one seed, one start state per group
    starts = [next(iter(v)) for v in by_group.values()]
    assert len(set(starts)) == 4  # groups differ
    assert [t.seed for t in step1][0] == group_seed(42, "train", 1, 0)
    assert {t.seed for t in step1}.isdisjoint({t.seed for t in step2})  # training seeds change every step
    val = _manager(make_cfg(), qwen_tokenizer_dir, phase="val")
    first, again = val.rollout(0, gen).trajectories, val.rollout(0, gen).trajectories
    assert [(t.seed, _first_obs(t)) for t in first] == [(t.seed, _first_obs(t)) for t in again]  # val fixed


def test_masks_and_score_position(qwen_tokenizer_dir):
    manager = _manager(make_cfg(group_size=2, env_groups=2, max_actions=3), qwen_tokenizer_dir)
    gen = ScriptedGenerator(manager.tokenizer, cut_every=3)
    trajs = manager.rollout(1, gen).trajectories
    batch = trajectories_to_batch(trajs, manager.tokenizer.pad_token_id)
    for i, t in enumerate(trajs):
        ids, mask = batch["input_ids"][i], batch["response_mask"][i]
        expected_ids, expected_mask = [], []
        for turn in t.turns:  # hand-built reference: prompts 0, generated 1, appended end-of-turn 0
            expected_ids += turn.prompt_ids + turn.response_ids
            gen_len = len(turn.response_ids) - turn.appended_eos
            expected_mask += [0] * len(turn.prompt_ids) + [1] * gen_len + [0] * turn.appended_eos
        n = len(expected_ids)
        assert ids[:n].tolist() == expected_ids and mask[:n].tolist() == expected_mask
        assert mask[n:].sum() == 0 and batch["attention_mask"][i].sum() == n
        last = max(j for j, v in enumerate(expected_mask) if v)
        scores = batch["token_level_scores"][i]
        assert scores[last - 1] == pytest.approx(t.score) and torch.count_nonzero(scores) == (t.score != 0)
        assert batch["step_rewards"][i] == [turn.reward for turn in t.turns]
    assert any(turn.appended_eos for t in trajs for turn in t.turns)  # the length-cut case was exercised


def test_truncation_at_sequence_length(qwen_tokenizer_dir):
    manager = _manager(make_cfg(max_actions=50, sequence_length=120, env_config={"max_steps": 50}), qwen_tokenizer_dir)
    trajs = manager.rollout(1, ScriptedGenerator(manager.tokenizer)).trajectories
    for t in trajs:
        assert t.truncated_by_length and not t.failure
        assert len(t.token_ids()) <= 120
        assert t.turns[-1].response_ids[-1] == manager.tokenizer.eos_token_id  # ends on a whole reply
        assert t.turns  # at least one turn fit


@pytest.mark.parametrize(
    "template, reply, expected",
    [
        ("qwen", "<think>hmm</think><answer>go</answer>", 0.0),
        ("think_strip", "<answer>go</answer>", 0.0),
        ("think_strip", "<think>hmm</think><answer>go</answer>", 1.0),
    ],
)
def test_template_conformance(template, reply, expected, qwen_tokenizer_dir, think_strip_tokenizer_dir):
    tok_dir = qwen_tokenizer_dir if template == "qwen" else think_strip_tokenizer_dir
    cfg = make_cfg(
        group_size=2,
        env_groups=2,
        max_actions=3,
        conformance_samples=4,
        action_format="think_answer" if "think" in reply else "answer",
    )
    manager = _manager(cfg, tok_dir)
    result = manager.rollout(1, ScriptedGenerator(load_tokenizer(tok_dir), reply))
    assert result.conformance_checked == 4
    assert result.conformance_mismatches / result.conformance_checked == expected
    assert all(len(t.turns) == 3 for t in result.trajectories)  # multi-turn, so earlier <think> blocks exist


def test_faults_recorded_and_env_replaced(qwen_tokenizer_dir):
    FlakyEnv.reset_log()
    cfg = make_cfg(env_config={"fail_every": 10, "hang_every": 10, "hang_s": 3.0}, env_step_timeout=1.0)
    manager = _manager(cfg, qwen_tokenizer_dir)
    before = [e for envs in manager.envs for e in envs]
    result = manager.rollout(1, ScriptedGenerator(manager.tokenizer))
    kinds = [t.failure_kind for t in result.trajectories if t.failure]
    assert kinds.count("error") == FlakyEnv.faults.count("error") > 0
    assert kinds.count("timeout") == FlakyEnv.faults.count("timeout") == result.envs_replaced > 0
    after = [e for envs in manager.envs for e in envs]
    assert sum(a is not b for a, b in zip(before, after)) == result.envs_replaced  # hung envs were replaced
    for t in result.trajectories:
        assert (t.failure is None) == (t.failure_kind is None)
        if t.failure is None:
            assert len(t.turns) == 3  # the others ran to the end


@pytest.mark.parametrize("reward", [float("nan"), float("inf")])
def test_non_finite_env_reward_ends_the_trajectory_named(reward, qwen_tokenizer_dir):
    FlakyEnv.reset_log()
    manager = _manager(make_cfg(env_config={"reward": reward}, group_size=2, env_groups=1), qwen_tokenizer_dir)
    result = manager.rollout(1, ScriptedGenerator(manager.tokenizer))
    for t in result.trajectories:
        assert (t.failure_kind, t.failure_type, t.failure_turn) == ("error", "NonFiniteReward", 1)
        assert (
            t.failure == f"env.step of FlakyEnv returned reward={reward} for the reply '<answer>go</answer>' "
            f"(at tests.agentic.helpers.FlakyEnv.step)"
        )
        assert all(turn.reward == 0.0 for turn in t.turns)  # the non-finite value never reaches a score
    with pytest.raises(ValueError, match=f"returned reward={reward}"):  # debugging: raised where it happened
        _manager(make_cfg(env_config={"reward": reward}), qwen_tokenizer_dir, raise_errors=True).rollout(
            1, ScriptedGenerator(manager.tokenizer)
        )


def test_raise_env_errors_keeps_the_env_traceback(qwen_tokenizer_dir):
    FlakyEnv.reset_log()
    manager = _manager(make_cfg(env_config={"fail_every": 5}), qwen_tokenizer_dir, raise_errors=True)
    with pytest.raises(RuntimeError, match="injected env failure") as info:
        manager.rollout(1, ScriptedGenerator(manager.tokenizer))
    frames = [f.name for f in traceback.extract_tb(info.value.__traceback__)]
    assert "_fault" in frames  # points at the user's env code


def test_env_steps_run_concurrently(qwen_tokenizer_dir):
    FlakyEnv.reset_log()
    cfg = make_cfg(env_config={"step_sleep": 0.05}, max_actions=2, env_threads=8)
    result = _manager(cfg, qwen_tokenizer_dir).rollout(1, ScriptedGenerator(load_tokenizer(qwen_tokenizer_dir)))
    assert FlakyEnv.max_active >= 2  # several envs were inside step() at once
    assert result.env_s >= 2 * 0.05  # two turns of sleeping steps were timed as env time
