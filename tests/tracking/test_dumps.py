"""Trajectory dumps: token advantages and masks land on the right tokens (checked against hand-computed
positions), the cap keeps whole groups, files are written only when due, and RLVR responses dump alike."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from transformers import AutoTokenizer

from roll.agentic.render_dump import env_descriptions
from roll.config.agentic import CustomEnvConfig
from roll.data.layout import trajectories_to_batch
from roll.data.rlvr_dataset import RLVRExample
from roll.data.trajectory import Trajectory, Turn
from roll.envs.sokoban import SYMBOLS
from roll.pipelines.rlvr_pipeline import PromptGroup, groups_to_batch
from roll.tracking.dumps import TrajectoryDumps, pick_whole_groups


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


def make_trajectory(tokenizer, group: int, env: int, success: bool) -> Trajectory:
    """Two turns; the second reply was cut by length and got an end-of-turn token appended (not trained on)."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    first = Turn(
        prompt_ids=encode(tokenizer, "#_P\n_OX"),
        response_ids=encode(tokenizer, "<answer>Up</answer>") + [eos],
        response_log_probs=[-0.5] * 4,
        observation="#_P\n_OX",
        response_text="<answer>Up</answer>",
        parsed_action="Up",
        action_is_valid=True,
        reward=-0.1,
    )
    second = Turn(
        prompt_ids=encode(tokenizer, "\n#P_"),
        response_ids=encode(tokenizer, "<answer>") + [eos],
        response_log_probs=[-1.25],
        observation="#P_",
        response_text="<answer>",
        reward=-0.1,
        finish_reason="length",
        appended_eos=True,
    )
    return Trajectory(
        traj_id=f"train-1-g{group}-e{env}-t0",
        env_id=env,
        group_id=group,
        tag="SimpleSokoban",
        seed=1000 + group,
        turns=[first, second],
        success=success,
        env_metrics={"boxes_on_target": 0},
        final_observation="#P_\n_OX",
    )


def test_pick_whole_groups() -> None:
    assert pick_whole_groups([0, 0, 1, 1, 2, 2], 4) == [0, 1, 2, 3]
    assert pick_whole_groups([0, 0, 1, 1, 2, 2], 3) == [0, 1]
    assert pick_whole_groups([0, 0, 1, 1], 1) == [0]  # one group larger than the cap is cut
    assert pick_whole_groups([0, 1, 0, 1], 2) == [0, 2]  # members of a group need not be adjacent
    assert pick_whole_groups([0, 0, 1], 0) == [0, 1, 2]


def test_agentic_dump_aligns_advantages_and_masks(tmp_path, tokenizer) -> None:
    trajs = [make_trajectory(tokenizer, g, e, success=g == 0) for g in range(3) for e in range(2)]
    batch = trajectories_to_batch(trajs, tokenizer.pad_token_id)
    rows, width = batch["input_ids"].shape
    # advantage of log-prob index t in row i = 100 i + t, so every dumped value names where it came from
    batch["advantages"] = torch.arange(width - 1).repeat(rows, 1).float() + 100 * torch.arange(rows)[:, None]
    envs = env_descriptions(SimpleNamespace(custom_envs={"SimpleSokoban": CustomEnvConfig(env_type="sokoban")}))
    dumps = TrajectoryDumps(tmp_path, every=2, cap=4, tokenizer=tokenizer, pipeline="agentic", envs=envs)

    assert dumps.agentic("train", 1, trajs, batch) is None  # not due: every 2 steps
    path = dumps.agentic("train", 2, trajs, batch)
    assert path == tmp_path / "trajectories" / "train" / "step_00002.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in records] == [t.traj_id for t in trajs[:4]]  # cap 4: groups 0 and 1 whole
    meta = json.loads((tmp_path / "trajectories" / "meta.json").read_text())
    assert meta == {
        "format": 1,
        "pipeline": "agentic",
        "envs": {"SimpleSokoban": {"env_type": "sokoban", "grid_symbols": SYMBOLS}},
    }

    p1, r1 = len(trajs[0].turns[0].prompt_ids), len(trajs[0].turns[0].response_ids)
    p2 = len(trajs[0].turns[1].prompt_ids)
    for i, record in enumerate(records):
        first, second = record["turns"]
        # turn 1's reply starts at position p1: log-prob index p1 - 1; turn 2's at p1 + r1 + p2
        assert first["adv"] == [100 * i + p1 - 1 + j for j in range(r1)]
        assert second["adv"] == [100 * i + p1 + r1 + p2 - 1 + j for j in range(2)]
        assert first["mask"] == [1, 1, 1, 1] and second["mask"] == [1, 0]
        assert first["logp"] == [-0.5] * 4 and second["logp"] == [-1.25]
    rec = records[0]
    assert "".join(rec["turns"][0]["tokens"]) == "<answer>Up</answer><|im_end|>"
    assert rec["turns"][0]["prompt"] == "#_P\n_OX" and rec["turns"][1]["finish"] == "length"
    assert (rec["case"], rec["group"], rec["score"], rec["success"]) == ("SimpleSokoban/1000", 0, -0.2, True)
    assert rec["turns"][0]["action"] == "Up" and rec["turns"][1]["valid"] is False
    assert rec["final_observation"] == "#P_\n_OX" and rec["metrics"] == {"boxes_on_target": 0.0}


def test_capped_dump_reads_the_kept_rows(tmp_path, tokenizer) -> None:
    trajs = [make_trajectory(tokenizer, g, e, success=False) for e in range(2) for g in range(2)]  # groups 0 1 0 1
    batch = trajectories_to_batch(trajs, tokenizer.pad_token_id)
    rows, width = batch["input_ids"].shape
    batch["advantages"] = torch.arange(width - 1).repeat(rows, 1).float() + 100 * torch.arange(rows)[:, None]
    path = TrajectoryDumps(tmp_path, 1, 2, tokenizer, "agentic").agentic("train", 1, trajs, batch)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in records] == [trajs[0].traj_id, trajs[2].traj_id]  # group 0: rows 0 and 2
    p1 = len(trajs[0].turns[0].prompt_ids)
    assert [r["turns"][0]["adv"][0] for r in records] == [p1 - 1, 200 + p1 - 1]


def test_non_finite_values_become_null(tmp_path, tokenizer) -> None:
    traj = make_trajectory(tokenizer, 0, 0, success=False)
    traj.turns[0].response_log_probs = [float("-inf"), -0.5, float("nan"), 0.0]
    path = TrajectoryDumps(tmp_path, 1, 0, tokenizer, "agentic").agentic("val", 1, [traj])
    line = path.read_text()
    assert "Infinity" not in line and "NaN" not in line
    assert json.loads(line)["turns"][0]["logp"] == [None, -0.5, None, 0.0]


def test_validation_dump_without_batch(tmp_path, tokenizer) -> None:
    trajs = [make_trajectory(tokenizer, g, 0, success=False) for g in range(3)]
    dumps = TrajectoryDumps(tmp_path, every=5, cap=2, tokenizer=tokenizer, pipeline="agentic")
    path = dumps.agentic("val", 3, trajs)  # validation is dumped whenever it runs
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert path.parent.name == "val" and len(records) == 2
    assert records[0]["turns"][1]["mask"] == [1, 0] and "adv" not in records[0]["turns"][0]
    assert TrajectoryDumps(tmp_path / "off", 0, 2, tokenizer, "agentic").agentic("val", 3, trajs) is None
    assert not (tmp_path / "off").exists()
    with pytest.raises(ValueError, match="phase='test': expected one of"):
        dumps.agentic("test", 5, trajs)


def test_rlvr_dump(tmp_path, tokenizer) -> None:
    examples = [
        RLVRExample("1+1?", "2", "math", row=7, source="/data/a.jsonl"),
        RLVRExample("2+2?", "4", "math", row=8, source="/data/a.jsonl"),
    ]
    prompt = encode(tokenizer, "1+1?")
    groups = [
        PromptGroup(
            0,
            prompt,
            [encode(tokenizer, "2"), encode(tokenizer, "3")],
            ["2", "3"],
            [1.0, 0.0],
            [True, False],
            [True, True],
            [False, True],
        )
    ]
    batch = groups_to_batch(groups, examples, tokenizer.pad_token_id)
    batch["advantages"] = torch.tensor([[0.5], [-0.5]]).expand(2, batch["input_ids"].shape[1] - 1).clone()
    path = TrajectoryDumps(tmp_path, 1, 0, tokenizer, "rlvr").rlvr("train", 4, groups, examples, batch)
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["id"], r["case"], r["success"], r["truncated"], r["ground_truth"]) for r in records] == [
        ("train-4-p0-r0", "a.jsonl:7", True, False, "2"),
        ("train-4-p0-r1", "a.jsonl:7", False, True, "2"),
    ]
    (turn,) = records[1]["turns"]
    assert turn["tokens"] == ["3"] and turn["mask"] == [1] and turn["adv"] == [-0.5] and turn["finish"] == "length"
    assert turn["prompt"] == "1+1?"


def test_failed_trajectories_follow_the_batch_with_their_error(tmp_path, tokenizer) -> None:
    from roll.agentic.failures import record_error

    trajs = [make_trajectory(tokenizer, 0, e, success=False) for e in range(2)]
    batch = trajectories_to_batch(trajs, tokenizer.pad_token_id)
    batch["advantages"] = torch.zeros(batch["input_ids"].shape[0], batch["input_ids"].shape[1] - 1)
    failed = make_trajectory(tokenizer, 0, 2, success=False)
    try:
        {}["board"]
    except KeyError as exc:
        record_error(failed, "env.step", exc)
    path = TrajectoryDumps(tmp_path, 1, 0, tokenizer, "agentic").agentic("train", 1, trajs, batch, [failed])
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["id"] for r in records] == [t.traj_id for t in trajs] + [failed.traj_id]
    assert all(r["failure"] is None and "error" not in r for r in records[:2])
    line = next(i for i, text in enumerate(open(__file__).read().splitlines(), 1) if '{}["board"]' in text)
    assert (
        records[2]["failure"] == f"env.step: KeyError: 'board' (at {__file__}:{line} in "
        f"test_failed_trajectories_follow_the_batch_with_their_error)"
    )
    at = f"{__file__}:{line} in test_failed_trajectories_follow_the_batch_with_their_error"
    error = records[2]["error"]
    assert error.pop("traceback").endswith("KeyError: 'board'\n") and '{}["board"]' in failed.failure_traceback
    assert error == {"kind": "error", "type": "KeyError", "turn": 2, "at": at}
    assert "adv" not in records[2]["turns"][0] and records[2]["turns"][1]["mask"] == [1, 0]  # not trained on


def test_harness_episodes_are_labelled_as_such(tmp_path, tokenizer) -> None:
    """A tag played by an agent harness is no env of its ``env_type`` (the default, sokoban, included): meta.json names
    its runner and no grid symbols, and its records carry the runner and the conversation the harness sent."""
    harness = CustomEnvConfig(env_manager_cls="proxy", agent_runner_cls="my_agents.guess.play")
    envs = env_descriptions(SimpleNamespace(custom_envs={"Guess": harness, "SimpleSokoban": CustomEnvConfig()}))
    assert envs["Guess"] == {"env_type": None, "agent_runner": "my_agents.guess.play", "grid_symbols": None}
    assert envs["SimpleSokoban"]["grid_symbols"] == SYMBOLS
    agent, env = make_trajectory(tokenizer, 0, 0, success=False), make_trajectory(tokenizer, 1, 0, success=False)
    agent.tag = "Guess"
    agent.messages = [{"role": "user", "content": "Find the number."}, {"role": "assistant", "content": "7"}]
    path = TrajectoryDumps(tmp_path, 1, 0, tokenizer, "agentic", envs).agentic("val", 1, [agent, env])
    first, second = [json.loads(line) for line in path.read_text().splitlines()]
    assert first["harness"] == "my_agents.guess.play" and first["messages"] == agent.messages
    assert "harness" not in second and "messages" not in second
    meta = json.loads((tmp_path / "trajectories" / "meta.json").read_text())
    assert meta["envs"]["Guess"]["env_type"] is None and meta["envs"]["Guess"]["grid_symbols"] is None


def three_turn_trajectory(tokenizer, group: int, env: int, breaks: bool) -> Trajectory:
    """Three turns with rewards 0 / 1 / env-dependent (so that GiGPO's turn groups differ); with ``breaks``, the
    second turn starts a new sample (a template break: its prompt is a whole new prompt)."""
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    turns = []
    for k in range(3):
        reply = encode(tokenizer, ["<answer>Up</answer>", "<answer>Left</answer>", "<answer>Down</answer>"][k])
        turns.append(
            Turn(
                prompt_ids=encode(tokenizer, f"#_P\n_O{'X' * (k + 1)}"),
                response_ids=reply + [eos],
                response_log_probs=[-0.5] * (len(reply) + 1),
                observation=f"state {k}",
                response_text="",
                reward=[0.0, 1.0, float(env)][k],
                starts_sample=breaks and k == 1,
            )
        )
    return Trajectory(f"train-1-g{group}-e{env}-t0", env, group, "SimpleSokoban", 7 + group, turns=turns)


def hand_places(trajs: list[Trajectory], mode: str) -> dict[str, list[tuple[int, int]]]:
    """Each reply's (row, token position) worked out from the sample rules: ``step``: a row per turn holding the
    history since the last break; ``traj``: a row per run of turns between breaks."""
    places, row = {}, 0
    for t in trajs:
        places[t.traj_id], context = [], 0
        for turn in t.turns:
            if turn.starts_sample:
                context = 0
                row += mode == "traj"
            places[t.traj_id].append((row, context + len(turn.prompt_ids)))
            context += len(turn.prompt_ids) + len(turn.response_ids)
            row += mode == "step"
        row += mode == "traj"
    return places


@pytest.mark.parametrize("mode, breaks", [("step", False), ("traj", True), ("step", True)])
def test_every_reply_keeps_its_advantage_when_an_episode_trains_as_several_samples(tmp_path, tokenizer, mode, breaks):
    trajs = [three_turn_trajectory(tokenizer, g, e, breaks) for g in range(2) for e in range(2)]
    batch = trajectories_to_batch(trajs, tokenizer.pad_token_id, mode)
    rows, width = batch["input_ids"].shape
    assert rows > len(trajs)  # several samples per episode
    batch["advantages"] = torch.arange(width - 1).repeat(rows, 1).float() + 1000 * torch.arange(rows)[:, None]
    path = TrajectoryDumps(tmp_path, 1, 0, tokenizer, "agentic").agentic("train", 1, trajs, batch)
    places = hand_places(trajs, mode)
    for record in map(json.loads, path.read_text().splitlines()):
        for turn, (row, pos) in zip(record["turns"], places[record["id"]], strict=True):
            assert turn["adv"] == [1000 * row + pos - 1 + j for j in range(4)]  # log-prob index of position pos
            assert turn["mask"] == [1, 1, 1, 1]


def test_gigpo_step_mode_dump_has_every_turns_advantage(tmp_path, tokenizer):
    """The real advantage step (GiGPO: episode plus per-turn advantages, computed on the episodes and given back to
    each turn's sample) on a step-mode batch: the dump shows, on each reply, the advantage its sample trains with."""
    from roll.config.agentic import AgenticConfig
    from roll.ppo.advantage_step import advantage_step

    trajs = [three_turn_trajectory(tokenizer, g, e, False) for g in range(2) for e in range(2)]
    batch = trajectories_to_batch(trajs, tokenizer.pad_token_id, "step")
    cfg = AgenticConfig()
    cfg.adv_estimator = "gigpo"
    advantage_step(cfg, batch, 0.0)
    path = TrajectoryDumps(tmp_path, 1, 0, tokenizer, "agentic").agentic("train", 1, trajs, batch)
    places, seen = hand_places(trajs, "step"), set()
    for record in map(json.loads, path.read_text().splitlines()):
        for turn, (row, pos) in zip(record["turns"], places[record["id"]], strict=True):
            expected = batch["advantages"][row, pos - 1 : pos + 3].tolist()
            assert turn["adv"] == pytest.approx(expected, abs=1e-4) and len(set(turn["adv"])) == 1
            seen.add(round(turn["adv"][0], 4))
    assert len(seen) > 1 and any(v != 0 for v in seen)  # a learning signal, different per turn
