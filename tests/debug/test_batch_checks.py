"""Strict batch validation: a valid batch passes, and each rule catches its own deliberately corrupted batch."""

from __future__ import annotations

import pytest
import torch

from roll.data.batch import Batch
from roll.data.checks import ENV_VAR, BatchCheckError, check_batch, check_batch_if, strict_enabled
from roll.data.layout import trajectories_to_batch
from roll.data.trajectory import Trajectory, Turn


def _traj(i: int, prompt: int, reply: int, score: float, appended_eos: bool = False) -> Trajectory:
    turn = Turn(
        prompt_ids=list(range(1, prompt + 1)),
        response_ids=list(range(10, 10 + reply)),
        response_log_probs=[-0.5] * reply,
        observation="o",
        reward=score,
        appended_eos=appended_eos,
    )
    return Trajectory(f"train-1-g{i}-e0-t0", env_id=0, group_id=i, tag="T", seed=i, turns=[turn])


def valid_batch() -> Batch:
    """3 samples, L = 7: (3 prompt + 4 reply), (2 + 2), (4 + 2 with an appended eos); log-prob keys (3, 6)."""
    batch = trajectories_to_batch([_traj(0, 3, 4, 1.0), _traj(1, 2, 2, -0.5), _traj(2, 4, 2, 0.25, True)], 0)
    n, width = batch["input_ids"].shape
    for key in ("old_log_probs", "ref_log_probs", "advantages", "returns"):
        batch[key] = torch.full((n, width - 1), -0.1)
    return batch


def test_valid_batch_passes_and_layout_is_as_documented():
    batch = valid_batch()
    assert batch["input_ids"].shape == (3, 7)
    # sample 0: response tokens at 3..6 -> last log-prob index 5; sample 2: generated 4 (eos at 5 untrained) -> 3
    assert batch["token_level_scores"][0].nonzero().flatten().tolist() == [5]
    assert batch["token_level_scores"][2].nonzero().flatten().tolist() == [3]
    check_batch(batch, "rollout", required=("input_ids", "advantages"))


def _expect(batch: Batch, key: str, *fragments: str) -> BatchCheckError:
    with pytest.raises(BatchCheckError) as info:
        check_batch(batch, "my_stage")
    err = info.value
    assert err.stage == "my_stage" and err.key == key
    for fragment in ("'my_stage'", f"'{key}'", *fragments):
        assert fragment in str(err), (fragment, str(err))
    return err


def test_missing_required_key():
    with pytest.raises(BatchCheckError, match=r"'advantages' expected to be present.*present keys"):
        check_batch(trajectories_to_batch([_traj(0, 3, 4, 1.0)], 0), "old_log_probs", required=("advantages",))


def test_batch_size_disagrees():
    batch = valid_batch()
    batch.tensors["old_log_probs"] = batch["old_log_probs"][:2]  # bypasses Batch.__setitem__'s own check
    _expect(batch, "old_log_probs", "B=3", "(2, 6)")


def test_metadata_length_disagrees():
    batch = valid_batch()
    batch.meta["tag"] = ["T", "T"]
    _expect(batch, "tag", "B=3", "2 entries")


def test_log_probs_with_L_columns_instead_of_L_minus_1():
    batch = valid_batch()
    batch["old_log_probs"] = torch.zeros(3, 7)
    err = _expect(batch, "old_log_probs", "(B=3, L-1=6)", "(3, 7)", "token t+1")
    assert err.expected == "shape (B=3, L-1=6)" and err.actual == "shape (3, 7)"


def test_mask_with_wrong_length():
    batch = valid_batch()
    batch["attention_mask"] = batch["attention_mask"][:, :6]
    _expect(batch, "attention_mask", "(B=3, L=7)", "(3, 6)")


def test_scores_with_wrong_rank():
    batch = valid_batch()
    batch["scores"] = batch["scores"][:, None]
    _expect(batch, "scores", "(B=3)", "(3, 1)")


@pytest.mark.parametrize(
    "key,dtype",
    [
        ("input_ids", torch.int32),
        ("response_mask", torch.bool),
        ("advantages", torch.float64),
        ("old_log_probs", torch.bfloat16),
    ],
)
def test_dtype_not_as_declared(key, dtype):
    batch = valid_batch()
    batch[key] = batch[key].to(dtype)
    _expect(batch, key, "dtype torch.", str(dtype))


def test_nan_in_advantages():
    batch = valid_batch()
    batch["advantages"][1, 2] = float("nan")
    _expect(batch, "advantages", "finite", "nan at index (1, 2)")


def test_mask_not_binary():
    batch = valid_batch()
    batch["response_mask"][0, 4] = 2
    _expect(batch, "response_mask", "{0, 1}", "2 at index (0, 4)")


def test_response_mask_on_padding():
    batch = valid_batch()
    batch["response_mask"][1, 6] = 1  # sample 1 has 4 real tokens; index 6 is padding
    _expect(batch, "response_mask", "only where attention_mask is 1", "index (1, 6)")


def test_score_not_on_last_response_token():
    batch = valid_batch()
    tls = batch["token_level_scores"]
    tls[0, 5], tls[0, 6 - 1 - 1] = 0.0, 1.0  # moved one token early (an off-by-one in the L-1 layout)
    _expect(batch, "token_level_scores", "index 5", "1.0 at index 4", "shifted by one")


def test_score_disagrees_with_scores():
    batch = valid_batch()
    batch["token_level_scores"][1, 2] = 0.75  # right place (tokens 2..3 -> index 2), wrong value (scores[1] = -0.5)
    _expect(batch, "token_level_scores", "scores[1]=-0.5", "0.75")


def test_score_on_sample_without_response():
    traj = Trajectory("t", 0, 0, "T", 0, turns=[Turn([1, 2, 3], [], [], "o")])
    batch = trajectories_to_batch([traj, _traj(1, 2, 2, 1.0)], 0)
    check_batch(batch, "rollout")
    batch["token_level_scores"][0, 1] = 1.0
    _expect(batch, "token_level_scores", "nowhere")


def test_switch_flag_and_env_var(monkeypatch):
    batch = valid_batch()
    batch["response_mask"][0, 0] = 5
    monkeypatch.delenv(ENV_VAR, raising=False)
    assert not strict_enabled(False)
    check_batch_if(False, batch, "off")  # off by default: no check, no error
    with pytest.raises(BatchCheckError):
        check_batch_if(True, batch, "flag")
    monkeypatch.setenv(ENV_VAR, "1")
    assert strict_enabled(False)
    with pytest.raises(BatchCheckError, match="'env'"):
        check_batch_if(False, batch, "env")
    monkeypatch.setenv(ENV_VAR, "0")
    assert not strict_enabled(False)


def _strict_cfg(strict: bool):
    from roll.config.agentic import AgenticConfig

    cfg = AgenticConfig(strict_data_check=strict, adv_estimator="reinforce")
    cfg.actor_train.training_args.per_device_train_batch_size = 3
    cfg.actor_train.training_args.gradient_accumulation_steps = 1
    return cfg


def test_pipeline_hand_offs_check_when_strict(monkeypatch):
    from roll.ppo.advantage_step import compute_advantages
    from roll.ppo.epochs import train_actor

    monkeypatch.delenv(ENV_VAR, raising=False)
    batch = valid_batch()
    batch.tensors["old_log_probs"] = torch.zeros(3, 7)  # (B, L) instead of (B, L-1)
    scores = batch["scores"]
    compute_advantages(_strict_cfg(False), batch, scores, None, 0.0)  # off: the bad key goes unnoticed
    with pytest.raises(BatchCheckError) as info:
        compute_advantages(_strict_cfg(True), batch, scores, None, 0.0)
    assert (info.value.stage, info.value.key) == ("advantages", "old_log_probs")

    class NoWorkers:  # the check must fire before any worker is called
        world_size = 1

        def train_step(self, *args, **kwargs):
            raise AssertionError("train_step reached the workers")

    good = valid_batch()
    del good.tensors["advantages"]
    with pytest.raises(BatchCheckError, match="'train_step': key 'advantages' expected to be present"):
        train_actor(_strict_cfg(True), NoWorkers(), good, seed=0)
    monkeypatch.setenv(ENV_VAR, "1")  # the env var alone turns it on
    with pytest.raises(BatchCheckError, match="'train_step'"):
        train_actor(_strict_cfg(False), NoWorkers(), good, seed=0)
