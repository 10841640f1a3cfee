"""The guides' worked examples run: the user reward of docs/rlvr.md (examples/custom_reward/tagged_integer.py) and
the user tool and task generator of docs/tool_use.md (examples/custom_tool/unit_convert.py), each scored or played
by hand, loaded from its example config through the preflight, and trained for one step."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.rlvr import RLVRConfig
from roll.launch.command import load_checked

REPO = Path(__file__).resolve().parents[2]
TINY = [
    "distributed=local",
    "max_steps=1",
    "eval_steps=0",
    "track_with=stdout",
    "actor_train.num_cpus_per_worker=1",
    "actor_infer.num_cpus_per_worker=1",
]


@pytest.fixture(autouse=True)
def repo_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(REPO))  # examples.* import from the repo root, like a launch there


@pytest.fixture(autouse=True, scope="module")
def unregister_examples():
    """The examples register a tool, a task and a reward on import: removed again after this module, so that other
    tests see the registries as they were (and a later import registers them afresh)."""
    yield
    from roll.envs.tool_use import tasks, tools
    from roll.rewards.registry import REWARDS, registered_rewards

    tools.TOOLS.unregister("unit_convert")
    tasks.TASKS.unregister("convert_length")
    if "tagged_integer" in registered_rewards():
        REWARDS.unregister("tagged_integer")
    for name in ("examples.custom_tool.unit_convert", "examples.custom_reward.tagged_integer"):
        sys.modules.pop(name, None)


def test_reward_example_scores_by_hand():
    from roll.rewards.workers import RewardWorker

    cfg = load_checked("rlvr_custom_reward_tiny", schema=RLVRConfig)  # imports and registers the reward
    worker = RewardWorker(dict(cfg.rewards.reward_options), dict(cfg.rewards.tag_to_reward))
    results = worker.compute(["<answer>7</answer>", "<answer> 8 </answer>", "7"], ["7", "7", "7"], ["math"] * 3)
    assert [(r.score, r.correct, r.extracted, r.format_ok) for r in results] == [
        (1.0, True, "7", True),
        (0.1, False, "8", True),
        (0.0, False, None, False),
    ]


def test_tool_and_task_example_play_an_episode():
    from roll.envs import make_env

    cfg = load_checked("unit_tool_tiny", schema=AgenticConfig)
    spec = cfg.custom_envs["ToolUse"]
    env = make_env(spec.env_type, dict(spec.env_config))
    question, info = env.reset(seed=3)
    assert '"name": "unit_convert"' in info["env_instruction"] and question.startswith("How many centimetres are")
    assert make_env(spec.env_type, dict(spec.env_config)).reset(seed=3)[0] == question  # the seed fixes the task
    assert env.task.answer == int(env.task.question.split()[4]) * 100_000 + int(env.task.question.split()[7]) * 100
    call = {"name": "unit_convert", "arguments": {"value": 2.5, "from_unit": "km", "to_unit": "cm"}}
    obs, reward, terminated, _, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert (obs, reward, terminated, info["message_role"]) == ("250000 cm", 0.0, False, "tool")
    call["arguments"]["value"] = "2.5"
    obs, reward, _, _, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert obs == "Error: argument 'value' must be a number, got string '2.5' (tool 'unit_convert')."
    assert reward == cfg.train_env_manager.format_penalty and info["metrics"]["tool_errors"] == 1.0
    obs, reward, terminated, _, info = env.step(f"<answer>{env.task.answer}</answer>")
    assert (reward, terminated, info["success"]) == (1.0, True, True)


def test_tool_and_task_named_by_module_path():
    """A tool and a task may be named ``"package.module:name"`` (imported first, as an env_type may be); the model
    calls the tool by its own name."""
    from roll.envs.tool_use import ToolUseEnv

    module = "examples.custom_tool.unit_convert"
    env = ToolUseEnv(tools=[f"{module}:unit_convert", "calculator"], tasks=[f"{module}:convert_length"])
    assert sorted(env.tools) == ["calculator", "unit_convert"]
    question, _ = env.reset(seed=3)
    assert question.startswith("How many centimetres are")
    call = {"name": "unit_convert", "arguments": {"value": 2, "from_unit": "m", "to_unit": "cm"}}
    obs, reward, terminated, _, info = env.step(f"<tool_call>{json.dumps(call)}</tool_call>")
    assert (obs, terminated, info["message_role"], info["metrics"]["tool_errors"]) == ("200 cm", False, "tool", 0.0)


@pytest.mark.slow
@pytest.mark.parametrize(
    "name, schema, extra",
    [
        (
            "rlvr_custom_reward_tiny",
            RLVRConfig,
            [
                "tiny_model=null",
                "sft_warmup.enabled=false",
                "validation.file_name=[]",
                "rollout_batch_size=2",
                "num_return_sequences_in_group=2",
                "dynamic_sampling.enabled=false",
                "is_use_additional_prompts=false",
                "rewards.num_workers=1",
                "actor_train.training_args.per_device_train_batch_size=4",
                "actor_train.training_args.gradient_accumulation_steps=1",
            ],
        ),
        (
            "unit_tool_tiny",
            AgenticConfig,
            [
                "val_env_manager=null",
                "rollout_batch_size=8",
                "train_env_manager.env_groups=2",
                "train_env_manager.group_size=4",
                "actor_train.training_args.per_device_train_batch_size=4",
                "actor_train.training_args.gradient_accumulation_steps=2",
                "custom_envs.ToolUse.max_tokens_per_step=8",
            ],
        ),
    ],
)
def test_example_trains_one_step(name, schema, extra, tiny_model_dir, tmp_path):
    from roll.pipelines.agentic_pipeline import AgenticPipeline
    from roll.pipelines.rlvr_pipeline import RLVRPipeline

    cfg = load_checked(
        name,
        overrides=[
            f"pretrain={tiny_model_dir}",
            f"output_dir={tmp_path}/out",
            f"logging_dir={tmp_path}/logs",
            *TINY,
            *extra,
        ],
        schema=schema,
    )
    metrics = (RLVRPipeline if schema is RLVRConfig else AgenticPipeline)(cfg).run()
    assert math.isfinite(metrics["actor/pg_loss"]) and metrics["actor/skipped_updates"] == 0.0
