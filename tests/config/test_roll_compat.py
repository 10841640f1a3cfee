"""ROLL v0.3+ key names (roll.config.roll_compat): aliases with ROLL's meaning, one warning line for keys without
meaning in roll, one-line errors for unsupported keys and for a key set under both names; Hydra's override grammar
(``~key``, ``+key``, ``++key``) through the start scripts' entry."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.errors import ConfigError
from roll.config.loader import load_config
from roll.config.roll_compat import translate
from roll.launch.command import parse_args

REPO = Path(__file__).resolve().parents[2]
CONFIGS = str(REPO / "tests" / "config" / "roll_format")
CPU = [
    "pretrain=/nonexistent/model",
    "num_gpus_per_node=0",
    "~actor_train.device_mapping",
    "~actor_infer.device_mapping",
    "~reference.device_mapping",
    "actor_infer.strategy_args.strategy_name=hf_infer",
    "~actor_infer.strategy_args.strategy_config",
]


def _load(name: str = "agentic_sokoban", extra: list[str] | None = None) -> AgenticConfig:
    return load_config(name, CONFIGS, CPU + (extra or []), AgenticConfig)


def test_roll_layout_loads_with_roll_meaning(capsys):
    cfg = _load()
    train, val = cfg.train_env_manager, cfg.val_env_manager
    assert (train.env_groups, train.n_groups, train.env_threads, train.group_size) == (2, [2], 8, 4)
    assert (val.env_groups, val.n_groups, val.tags) == (8, [4, 4], ["SimpleSokoban", "SokobanLetters"])
    assert cfg.reward_normalization.grouping == "state"  # traj_group_id
    env = cfg.custom_envs["SokobanLetters"]
    assert env.max_actions_per_traj == 4 and env.max_tokens_per_step == 12  # the config's override of the env file
    assert env.system_prompt == "You play a grid game. Reply with one move."
    assert env.env_config["action_format"] == "answer" and "action_pattern" not in env.env_config
    assert env.env_config["grid_lookup"][0] == "W"
    assert env.turn_text(1, "OBS") == (
        "Turn 2:\nOBS\nAnswer as <answer>move</answer>. 3 moves left, at most 12 tokens.\n"
    )
    assert env.turn_text(0, "OBS", instruction="RULES").startswith("RULES\nTurn 1:\nOBS\n")
    assert cfg.system_envs == {"ROLL_FORMAT_TEST": "1"}
    assert cfg.checkpoint_config == {"max_to_keep": 2}  # ROLL's keys dropped, roll's default kept
    assert cfg.reference.strategy_args.strategy_config == {}  # strategy_config: ~
    assert cfg.actor_infer.strategy_args.strategy_config == {}  # deleted by ~key
    lines = [line for line in capsys.readouterr().err.splitlines() if "ROLL keys" in line]
    assert len(lines) == 1
    for key in (
        "checkpoint_config.type",
        "custom_envs.SimpleSokoban.env_manager_cls",
        "custom_envs.SokobanLetters.use_thread_lock",
    ):
        assert key in lines[0]
    assert "model_type" not in lines[0]  # null: nothing set, nothing to name
    assert "actor_train.model_args.attn_implementation=fa2 (flash-attn is not installed here" in lines[0]
    assert cfg.actor_train.model_args.attn_implementation is None


def test_gigpo_variant_and_grouping_values():
    cfg = _load("agentic_sokoban_gigpo")
    assert (cfg.adv_estimator, cfg.step_adv_weight, cfg.episode_adv_weight, cfg.gamma) == ("gigpo", 1.0, 1.0, 0.95)
    assert _load("agentic_frozen_lake").reward_normalization.grouping == "batch"
    assert _load(extra=["reward_normalization.grouping=tags"]).reward_normalization.grouping == "inductive"
    assert _load(extra=["adv_estimator=step_reinforce"]).adv_estimator == "step_reinforce"


def test_alias_on_the_command_line():
    cfg = _load(
        extra=[
            "train_env_manager.num_env_groups=4",
            "rollout_batch_size=16",
            "train_env_manager.num_groups_partition=[4]",
        ]
    )
    assert (cfg.train_env_manager.env_groups, cfg.train_env_manager.n_groups) == (4, [4])


@pytest.mark.parametrize(
    "extra, match",
    [
        (
            ["+train_env_manager.env_groups=2"],
            r"^train_env_manager.num_env_groups=2: ROLL's name for train_env_manager.env_groups, which is set too",
        ),
        (
            ["+train_env_manager.generating_args.temperature=0.5"],
            r"^train_env_manager.generating_args.temperature=0.5: differs from actor_infer.generating_args.temperature",
        ),
        (
            ["+reward_normalization.norm_mean_type=running"],
            r"^reward_normalization.norm_mean_type='running': must be one of None, batch, group",
        ),
        (
            ["+actor_train.model_args.freeze_module_prefix=embed"],
            r"^actor_train.model_args.freeze_module_prefix='embed': .*other prefixes are not implemented",
        ),
        (
            ["async_generation_ratio=0.5"],
            r"^async_generation_ratio=0.5: must be a whole number >= 0; the policy versions",
        ),
        (
            ["+custom_env.SimpleSokoban.turn_template=x"],
            r"^custom_envs.SimpleSokoban.agent_template=.*set too; keep one",
        ),
    ],
)
def test_conflicts_and_unsupported_keys_are_one_line(extra, match):
    with pytest.raises(ConfigError, match=match) as err:
        _load(extra=extra)
    assert "\n" not in str(err.value)


def test_off_values_of_unsupported_keys_pass():
    assert _load(extra=["async_generation_ratio=0", "+actor_train.model_args.freeze_module_prefix=null"])


def test_translate_leaves_roll_names_and_backend_sections_alone():
    tree = {
        "train_env_manager": {"env_groups": 2, "tags": ["a"]},
        "actor_train": {"strategy_args": {"strategy_config": {"max_steps": 3, "use_thread_lock": True}}},
        "custom_envs": {"a": {"max_actions_per_traj": 2}},
    }
    before = repr(tree)
    assert translate(tree) == [] and repr(tree) == before


def test_hydra_override_grammar_in_the_entry():
    args = parse_args(["~reference", "+foo.bar=1", "++max_steps=2", "~a.b=3", "x=1"], "sokoban_tiny")
    assert args.overrides == ["~reference", "+foo.bar=1", "++max_steps=2", "~a.b=3", "x=1"]
    with pytest.raises(SystemExit):
        parse_args(["max_steps"], "sokoban_tiny")


def test_hydra_overrides_load():
    cfg = load_config(
        "sokoban_tiny", None, ["~val_env_manager", "++seed=7", "++strict_data_check=true", "+trajectory_dump_max=3"]
    )
    assert cfg.val_env_manager is None and cfg.seed == 7 and cfg.strict_data_check and cfg.trajectory_dump_max == 3


def test_start_script_takes_deletion_overrides(tmp_path):
    """The real start script parses ``~key`` and reaches the config's own rules (a bad value: exit code 2)."""
    cmd = [
        sys.executable,
        str(REPO / "examples" / "start_agentic_pipeline.py"),
        "--config-path",
        CONFIGS,
        "--config-name",
        "agentic_sokoban",
        *CPU,
        "max_steps=-1",
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "roll: config error: max_steps=-1: must be >= 0" in proc.stderr


def test_per_manager_sampling():
    """ROLL's train_env_manager.generating_args is the training rollouts' sampling (actor_infer's); the validation
    manager keeps its own."""
    cfg = _load(
        extra=[
            "+train_env_manager.generating_args.repetition_penalty=1.1",
            "+val_env_manager.generating_args.temperature=0.2",
        ]
    )
    assert cfg.actor_infer.generating_args.repetition_penalty == 1.1 and cfg.train_env_manager.generating_args is None
    assert cfg.val_env_manager.generating_args.temperature == 0.2


@pytest.mark.parametrize(
    "mean, std, grouping_after",
    [("group", "batch", "state"), ("group", None, "state"), (None, "batch", "state"), ("batch", "batch", "state")],
)
def test_roll_norm_types_are_kept_with_rolls_default_method(mean, std, grouping_after):
    """ROLL's norm types are roll's keys; a block that sets one and no method gets ROLL's default method (identity),
    so a type left null means none, as in ROLL (roll's own default, mean_std, would derive a group std)."""
    block = {"grouping": "traj_group_id", "norm_mean_type": mean, "norm_std_type": std}
    tree = {"reward_normalization": dict(block)}
    translate(tree)
    assert tree["reward_normalization"] == {**block, "grouping": grouping_after, "method": "identity"}


def test_a_written_method_stays_and_no_norm_type_leaves_the_block_alone():
    with_method = {"reward_normalization": {"grouping": "tags", "method": "mean", "norm_std_type": "batch"}}
    translate(with_method)
    assert with_method["reward_normalization"] == {"grouping": "inductive", "method": "mean", "norm_std_type": "batch"}
    untouched = {"reward_normalization": {"grouping": "batch", "norm_mean_type": None, "norm_std_type": None}}
    translate(untouched)
    assert "method" not in untouched["reward_normalization"]  # roll's default method (mean_std) applies


def test_rolls_native_example_scopes_load():
    """ROLL's agentic_val_sokoban_native sets a group mean with a batch std: roll loads it as written."""
    cfg = _load(extra=["+reward_normalization.norm_mean_type=group", "+reward_normalization.norm_std_type=batch"])
    norm = cfg.reward_normalization
    assert (norm.grouping, norm.norm_mean_type, norm.norm_std_type) == ("state", "group", "batch")
    assert norm.method == "mean_std"  # written in the file: it derives nothing here, both types are set


def test_step_variant_keys_are_named_once():
    tree = {"batch_adjust_mode": "copy", "custom_envs": {"S": {"history_length": 5, "env_manager_cls": "x.Y"}}}
    assert translate(tree) == ["batch_adjust_mode", "custom_envs.S.env_manager_cls"]
    assert tree == {"custom_envs": {"S": {"history_length": 5}}}  # a window of the step prompts (turn_prompt: fresh)


def test_step_env_manager_means_fresh_prompts_and_step_samples():
    """ROLL's StepEnvManager: every turn a new conversation from the one agent_template (which holds
    {env_instruction} itself), one sample per turn; ROLL's proxy manager's env_config.trajectory_mode moves up."""
    step = "roll.pipeline.agentic.env_manager.step_env_manager.StepEnvManager"
    tree = {
        "custom_envs": {
            "S": {"env_manager_cls": step, "history_length": 3, "agent_template": "{env_instruction}"},
            "T": {"agent_template": "{observation}", "env_config": {"trajectory_mode": "step"}},
        }
    }
    assert translate(tree) == []
    assert tree["custom_envs"]["S"] == {
        "turn_prompt": "fresh",
        "trajectory_mode": "step",
        "history_length": 3,
        "turn_template": "{env_instruction}",
        "first_turn_template": "{env_instruction}",
    }
    assert tree["custom_envs"]["T"] == {
        "env_config": {},
        "trajectory_mode": "step",
        "turn_template": "{observation}",
        "first_turn_template": "{instruction}\n{observation}",
    }
    with pytest.raises(ConfigError, match="differs from custom_envs.S.trajectory_mode='step'"):
        translate({"custom_envs": {"S": {"env_manager_cls": step, "env_config": {"trajectory_mode": "traj"}}}})


def test_vl_env_manager_is_roll_s_env_manager_with_frames():
    """ROLL's VLTrajEnvManager: roll's env manager plays the tag (it shows an env's images to a vision-language
    model); the env's render_mode: rgb_array stays in env_config, so observations carry frames (docs/vlm.md)."""
    vl = "roll.pipeline.agentic.env_manager.vl_traj_env_manager.VLTrajEnvManager"
    tree = {
        "custom_envs": {"S": {"env_manager_cls": vl, "env_type": "sokoban", "env_config": {"render_mode": "rgb_array"}}}
    }
    assert translate(tree) == ["custom_envs.S.env_manager_cls"]  # dropped, named in the warning line
    env = tree["custom_envs"]["S"]
    assert "env_manager_cls" not in env and env["env_config"] == {"render_mode": "rgb_array"}


def test_vl_templates_frame_the_image_as_roll_s_vl_manager_writes_it():
    """ROLL's VLTrajEnvManager: a turn is pre_step_template, the frame, next_step_template, the first after the
    env's instruction; ROLL v0.2's reward_template goes before later turns, env_config.env_instruction replaces the
    env's instruction, dim_x / dim_y are dim_room, and the env's max_steps counts the turns (no max_steps of the
    block)."""
    from roll.config.agentic import CustomEnvConfig
    from roll.models.vision import IMAGE_PLACEHOLDER

    block = {
        "env_type": "sokoban",
        "pre_step_template": "\nTurn {turn_idx}:\nState:\n",
        "next_step_template": "{actions_left} left, {max_response_length} tokens.",
        "reward_template": "Reward: {reward}\n",
        "user_prompt_format": "<answer> [your answer] </answer>",
        "env_config": {"env_instruction": "RULES", "dim_x": 7, "dim_y": 6, "max_steps": 4, "render_mode": "rgb_array"},
    }
    tree = {"custom_envs": {"S": block}}
    assert translate(tree) == ["custom_envs.S.user_prompt_format"]
    env = CustomEnvConfig(**tree["custom_envs"]["S"])
    assert env.env_config == {"dim_room": [7, 6], "max_steps": 4, "render_mode": "rgb_array"}
    assert env.instruction == "RULES" and env.max_actions_per_traj == 4
    env.check_templates("custom_envs.S")
    first = env.turn_text(0, "GRID", instruction="the env's own", image_text=IMAGE_PLACEHOLDER)
    assert first == f"RULES\nTurn 1:\nState:\n{IMAGE_PLACEHOLDER}4 left, 64 tokens."
    later = env.turn_text(1, "GRID", reward=-0.1, image_text=IMAGE_PLACEHOLDER * 2)
    assert later == f"Reward: -0.1\n\nTurn 2:\nState:\n{IMAGE_PLACEHOLDER * 2}3 left, 64 tokens."
    assert env.turn_text(1, "GRID", reward=0.0) == "Reward: 0.0\n\nTurn 2:\nState:\n3 left, 64 tokens."  # no frame
    plain = CustomEnvConfig(turn_template="{observation}")  # no {image}: the images go first
    assert plain.turn_text(1, "GRID", image_text=IMAGE_PLACEHOLDER) == IMAGE_PLACEHOLDER + "GRID"


@pytest.mark.parametrize(
    "block, match",
    [
        ({"agent_template": "{observation}", "pre_step_template": "x"}, r"pre_step_template=.*agent_template is set"),
        ({"next_step_template": "x", "turn_template": "y"}, r"pre_step_template=None: .*turn_template is set too"),
        ({"reward_template": "{reward}"}, r"reward_template=.*neither is set"),
        ({"env_config": {"dim_x": 6}}, r"env_config.dim_x=6: .*set both"),
        ({"env_config": {"dim_x": 6, "dim_y": 6, "dim_room": [6, 6]}}, r"dim_x=6: .*dim_room alone"),
        ({"instruction": "a", "env_config": {"env_instruction": "b"}}, r"env_instruction='b': .*keep one"),
    ],
)
def test_vl_and_v02_keys_set_twice_are_one_line_errors(block, match):
    with pytest.raises(ConfigError, match=match) as info:
        translate({"custom_envs": {"S": block}})
    assert "\n" not in str(info.value)


def test_an_image_placeholder_is_placed_once():
    from roll.config.agentic import CustomEnvConfig

    with pytest.raises(ConfigError, match=r"turn_template=.*\{image\} more than once"):
        CustomEnvConfig(turn_template="{image}{image}").check_templates("custom_envs.S")


def test_freeze_module_prefix_of_the_vision_tower_is_freeze_vision_tower():
    tree = {"actor_train": {"model_args": {"freeze_module_prefix": "vision_model"}}}
    assert translate(tree) == [] and tree["actor_train"]["model_args"] == {"freeze_vision_tower": True}
    with pytest.raises(ConfigError, match="freeze_module_prefix.*other prefixes are not implemented"):
        translate({"actor_train": {"model_args": {"freeze_module_prefix": "model.layers.0"}}})


@pytest.mark.parametrize("manager, words", [("StepConcatEnvManager", "GEM")])
def test_env_managers_roll_does_not_build_are_one_line_errors(manager, words):
    with pytest.raises(ConfigError, match=f"custom_envs.S.env_manager_cls.*{words}") as info:
        translate({"custom_envs": {"S": {"env_manager_cls": f"roll.pipeline.agentic.env_manager.x.{manager}"}}})
    assert "\n" not in str(info.value)


def test_migration_guide_names_every_key_of_the_table():
    """docs/migrating_from_roll.md has a row (or mention) for every alias, ignored and unsupported key."""
    from roll.config import roll_compat as rc

    guide = (REPO / "docs" / "migrating_from_roll.md").read_text()
    keys = (
        [k for block in rc.ALIASES.values() for k in block]
        + [k.rpartition(".")[2] for k in rc.IGNORED]
        + [k.rpartition(".")[2] for k in rc.UNSUPPORTED]
        + [v for v in rc.VALUE_ALIASES["reward_normalization.grouping"]]
    )
    missing = [k for k in keys if k not in guide]
    assert not missing, missing


def test_block_system_envs_join_the_top_level():
    tree = {
        "system_envs": {"A": "1"},
        "actor_train": {"system_envs": {"NVTE_FLASH_ATTN": "1"}},
        "train_env_manager": {"system_envs": {"A": "1"}},
    }
    translate(tree)
    assert tree == {"system_envs": {"A": "1", "NVTE_FLASH_ATTN": "1"}, "actor_train": {}, "train_env_manager": {}}
    with pytest.raises(ConfigError, match=r"^reference.system_envs.A='2': differs from system_envs.A='1'"):
        translate({"system_envs": {"A": "1"}, "reference": {"system_envs": {"A": "2"}}})
