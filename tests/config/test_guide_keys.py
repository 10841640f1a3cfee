"""Every key of ROLL's configuration guide loads with its documented meaning, or is rejected with a clear message."""

from __future__ import annotations

import copy

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.errors import ConfigError
from roll.config.validation import parse_device_mapping, validate
from roll.config.worker import StrategyArgs, WorkerConfig
from roll.launch.command import load_checked
from roll.launch.preflight import preflight


def load(overrides: list[str] | None = None) -> AgenticConfig:
    return load_checked("agentic_sokoban", "roll_style", overrides or [], AgenticConfig)


def get(cfg: object, dotted: str) -> object:
    for part in dotted.split("."):
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    return cfg


# (override, dotted key, value expected in the typed config): values from the guide's examples where it gives one.
GUIDE_VALUES = [
    ("exp_name=agentic_pipeline", "exp_name", "agentic_pipeline"),
    ("seed=7", "seed", 7),
    ("rpc_timeout=3600", "rpc_timeout", 3600),
    ("logging_dir=./output/logs", "logging_dir", "./output/logs"),
    ("output_dir=./output", "output_dir", "./output"),
    ("render_save_dir=/tmp/render", "render_save_dir", "/tmp/render"),
    ("+system_envs.USE_MODELSCOPE='1'", "system_envs.USE_MODELSCOPE", "1"),
    ("track_with=tensorboard", "track_with", "tensorboard"),
    ("+tracker_kwargs.log_dir=/tmp/tb", "tracker_kwargs.log_dir", "/tmp/tb"),
    ("max_steps=1024", "max_steps", 1024),
    ("save_steps=10000", "save_steps", 10000),
    ("logging_steps=1", "logging_steps", 1),
    ("eval_steps=10", "eval_steps", 10),
    ("resume_from_checkpoint=false", "resume_from_checkpoint", False),
    ("+checkpoint_config.max_to_keep=2", "checkpoint_config.max_to_keep", 2),
    ("val_batch_size=16", "val_batch_size", 16),
    ("prompt_length=2048", "prompt_length", 2048),
    ("response_length=4096", "response_length", 4096),
    ("sequence_length=8192", "sequence_length", 8192),
    ("num_return_sequences_in_group=8", "num_return_sequences_in_group", 8),
    ("local_rank=-1", "local_rank", -1),
    ("num_nodes=1", "num_nodes", 1),
    ("generate_opt_level=0", "generate_opt_level", 0),
    ("is_num_return_sequences_expand=true", "is_num_return_sequences_expand", True),
    ("max_running_requests=256", "max_running_requests", 256),
    ("is_use_additional_prompts=true", "is_use_additional_prompts", True),
    ("max_additional_running_prompts=8", "max_additional_running_prompts", 8),
    ("ppo_epochs=2", "ppo_epochs", 2),
    ("max_grad_norm=0.5", "max_grad_norm", 0.5),
    ("lambd=0.9", "lambd", 0.9),
    ("gamma=0.99", "gamma", 0.99),
    ("kl_penalty=abs", "kl_penalty", "abs"),
    ("init_kl_coef=0.1", "init_kl_coef", 0.1),
    ("kl_horizon=5000", "kl_horizon", 5000),
    ("reward_clip=5", "reward_clip", 5.0),
    ("whiten_rewards=true", "whiten_rewards", True),
    ("whiten_advantages=true", "whiten_advantages", True),
    ("advantage_clip=2.0", "advantage_clip", 2.0),
    ("adv_estimator=grpo", "adv_estimator", "grpo"),
    ("reward_norm=group", "reward_norm", "group"),
    ("reward_shift=true", "reward_shift", True),
    ("reward_scale=true", "reward_scale", True),
    ("entropy_loss_coef=0.01", "entropy_loss_coef", 0.01),
    ("dual_clip_loss=true", "dual_clip_loss", True),
    ("loss_agg_mode=seq-mean-token-sum-norm", "loss_agg_mode", "seq-mean-token-sum-norm"),
    ("reward_normalization.grouping=inductive", "reward_normalization.grouping", "inductive"),
    ("reward_normalization.method=asym_clip", "reward_normalization.method", "asym_clip"),
    ("train_env_manager.max_traj_per_env=-1", "train_env_manager.max_traj_per_env", -1),
    ("train_env_manager.format_penalty=-0.05", "train_env_manager.format_penalty", -0.05),
    ("actor_train.model_args.dtype=bf16", "actor_train.model_args.dtype", "bf16"),
    (
        "actor_train.model_args.disable_gradient_checkpointing=false",
        "actor_train.model_args.disable_gradient_checkpointing",
        False,
    ),
    ("actor_train.training_args.weight_decay=0", "actor_train.training_args.weight_decay", 0.0),
    ("actor_train.training_args.warmup_steps=20", "actor_train.training_args.warmup_steps", 20),
    ("actor_train.data_args.template=native", "actor_train.data_args.template", "native"),
    ("actor_train.data_args.file_name=xxx/train.json", "actor_train.data_args.file_name", ["xxx/train.json"]),
    ("actor_train.data_args.prompt=instruction", "actor_train.data_args.prompt", "instruction"),
    ("actor_infer.generating_args.temperature=0.99", "actor_infer.generating_args.temperature", 0.99),
    ("actor_infer.num_gpus_per_worker=1", "actor_infer.num_gpus_per_worker", 1),
    ("actor_train.infer_batch_size=4", "actor_train.infer_batch_size", 4),
    ("actor_infer.model_update_frequency=1", "actor_infer.model_update_frequency", 1),
]
#: ROLL's keys of features roll does not have (roll.config.roll_compat.UNSUPPORTED), at the value that changes
#: nothing: accepted and dropped (a ROLL file may list them), with a value that would do something: refused.
UNSUPPORTED_KEYS = [
    ("l2", 0.0, 0.01),
    ("use_reward_scaling", False, True),
    ("use_reward_norm", False, True),
    ("sft_loss_coef", 0.0, 0.1),
    ("rl_loss_coef", 1.0, 0.0),
    ("use_topr_loss", False, True),
    ("add_len_reward", False, True),
    ("difficulty_loss_weight", False, True),
    ("length_loss_weight", False, True),
    ("train_env_manager.worker_cls", None, "a.b:C"),
]


def _override(key: str, value: object) -> str:
    return f"{key}={'null' if value is None else str(value).lower() if isinstance(value, bool) else value}"


@pytest.fixture(scope="module")
def guide_cfg() -> AgenticConfig:
    """One load with every guide override at once (loading is the slow part), the unsupported keys at their
    harmless values among them."""
    harmless = [_override(key, off) for key, off, _ in UNSUPPORTED_KEYS]
    return load([override for override, _, _ in GUIDE_VALUES] + harmless)


@pytest.fixture(scope="module")
def base_cfg() -> AgenticConfig:
    return load()


@pytest.mark.parametrize("override, key, value", GUIDE_VALUES, ids=[k for _, k, _ in GUIDE_VALUES])
def test_guide_key_reaches_typed_config(guide_cfg, override, key, value):
    assert get(guide_cfg, key) == value


def test_roll_style_file_as_written(base_cfg):
    """Defaults list, DeepSpeed fragment block, ${} variables dropped, worker and env manager blocks typed."""
    cfg = base_cfg
    ds = cfg.actor_train.strategy_args.strategy_config
    assert ds["zero_optimization"]["stage"] == 2 and ds["train_batch_size"] == "auto"
    assert cfg.actor_infer.generating_args.max_new_tokens == 12  # ${max_tokens_per_step}
    assert cfg.custom_envs["SimpleSokoban"].max_actions_per_traj == 8  # ${max_actions_per_traj}
    assert cfg.actor_train.model_args.model_name_or_path == cfg.pretrain
    assert cfg.train_env_manager.n_groups == [4] and cfg.val_env_manager.env_groups == 32
    for name in ("deepspeed_zero", "deepspeed_zero3", "max_tokens_per_step", "hydra"):
        assert not hasattr(cfg, name)


@pytest.mark.parametrize(
    "fragment, stage, offload", [("deepspeed_zero", 0, False), ("deepspeed_zero3_cpuoffload", 3, True)]
)
def test_every_fragment_selectable_by_interpolation(fragment, stage, offload):
    cfg = load([f"actor_train.strategy_args.strategy_config=${{{fragment}}}"])
    zero = cfg.actor_train.strategy_args.strategy_config["zero_optimization"]
    assert zero["stage"] == stage
    assert ("offload_optimizer" in zero) == offload


def test_device_mapping_string_is_evaluated_safely():
    assert parse_device_mapping("list(range(0,16))") == list(range(16))
    assert parse_device_mapping("list(range(0, 8, 2))") == [0, 2, 4, 6]
    assert parse_device_mapping("[0, 1]") == [0, 1]
    for bad in ("__import__('os').system('true')", "list(map(int, '12'))", "range(0,4)"):
        with pytest.raises(ConfigError, match="device_mapping"):
            parse_device_mapping(bad)


def test_device_mapping_sets_world_size_on_gpu_config():
    cfg = load(
        [
            "num_gpus_per_node=8",
            "num_nodes=2",
            "actor_infer.device_mapping='list(range(0,16))'",
            "actor_infer.num_gpus_per_worker=2",
            "actor_train.device_mapping='list(range(0,16))'",
            "actor_train.training_args.per_device_train_batch_size=1",
            "actor_train.training_args.gradient_accumulation_steps=2",
        ]
    )  # 1 x 2 x 16 = the 32 samples
    assert cfg.actor_infer.world_size == 8  # 16 GPUs / 2 per worker
    assert cfg.actor_train.world_size == 16


@pytest.mark.parametrize(
    "role, name, words",
    [
        ("actor_train", "megatron_train", ["megatron"]),  # CPU config: needs GPUs (or megatron-core installed)
        ("reference", "megatron_infer", ["megatron"]),
        ("actor_infer", "vllm", ["vLLM", "hf_infer"]),
    ],
)
def test_unimplemented_backends_rejected_naming_backend(base_cfg, role, name, words):
    cfg = copy.deepcopy(base_cfg)
    setattr(cfg, role, WorkerConfig(strategy_args=StrategyArgs(strategy_name=name)))
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    assert str(err.value).startswith(f"{role}.strategy_args.strategy_name='{name}'")
    for word in words:
        assert word in str(err.value)


def test_uninstalled_backend_names_install_command():
    import importlib.util

    if importlib.util.find_spec("sglang") is not None:
        pytest.skip("sglang is installed here")
    with pytest.raises(ConfigError, match=r"pip install 'roll\[gpu\]'"):
        load(["actor_infer.strategy_args.strategy_name=sglang"])


@pytest.mark.parametrize("key, off, on", UNSUPPORTED_KEYS, ids=[k for k, _, _ in UNSUPPORTED_KEYS])
def test_unsupported_roll_keys_are_not_in_the_schema_and_refused_unless_harmless(guide_cfg, key, off, on):
    """Not fields of roll's schema (the typed config never carries them); the harmless value is dropped, any other
    is one line naming the key, the value and what to use instead."""
    from roll.config.roll_compat import translate

    *path, leaf = key.split(".")
    assert not hasattr(get(guide_cfg, ".".join(path)) if path else guide_cfg, leaf)
    tree: dict = {}
    node = tree
    for part in path:
        node = node.setdefault(part, {})
    node[leaf] = off
    assert translate(tree) == []
    assert (get(tree, ".".join(path)) if path else tree) == {}  # dropped
    node[leaf] = on
    with pytest.raises(ConfigError, match=rf"^{key}={on!r}: a ROLL key roll does not support: ") as info:
        translate(tree)
    assert "\n" not in str(info.value)


def test_unsupported_key_is_refused_by_the_loader_from_the_command_line():
    with pytest.raises(ConfigError, match=r"^sft_loss_coef=0.1: a ROLL key roll does not support: an SFT loss"):
        load(["sft_loss_coef=0.1"])


def test_rl_loss_coef_zero_is_not_taken_for_off():
    """0 is "off" for most unsupported keys, but rl_loss_coef: 0 would drop the RL loss: refused."""
    from roll.config.roll_compat import translate

    assert translate({"rl_loss_coef": 1}) == []
    for value in (0, 0.0, False, None, 0.5):
        with pytest.raises(ConfigError, match=r"^rl_loss_coef=.*: a ROLL key roll does not support"):
            translate({"rl_loss_coef": value})


def test_no_live_field_says_not_implemented():
    """The schema holds only what roll acts on: an unimplemented ROLL key belongs to roll_compat.UNSUPPORTED."""
    import dataclasses

    from roll.config.fields import nested_dataclasses
    from roll.config.rlvr import RLVRConfig

    said = [
        f"{cls.__name__}.{f.name}"
        for schema in (AgenticConfig, RLVRConfig)
        for cls in nested_dataclasses(schema)
        for f in dataclasses.fields(cls)
        if "not implemented" in f.metadata.get("help", "")
    ]
    assert said == []


@pytest.mark.parametrize(
    "dotted, value",
    [
        ("generate_opt_level", 2),
        ("max_running_requests", 0),
        ("max_additional_running_prompts", -1),
        ("actor_infer.model_update_frequency", 0),
    ],
)
def test_scheduling_and_choice_values_checked(base_cfg, dotted, value):
    cfg = copy.deepcopy(base_cfg)
    *path, leaf = dotted.split(".")
    setattr(get(cfg, ".".join(path)) if path else cfg, leaf, value)
    with pytest.raises(ConfigError, match=f"^{dotted}={value!r}"):
        validate(cfg)


def test_model_update_frequency_other_than_1_is_refused_by_the_agentic_pipeline(base_cfg):
    """The RLVR pipeline acts on it; the agentic pipeline syncs every step, so another value would be ignored."""
    cfg = copy.deepcopy(base_cfg)
    cfg.actor_infer.model_update_frequency = 2
    with pytest.raises(ConfigError, match=r"^actor_infer.model_update_frequency=2: not implemented in roll yet"):
        validate(cfg)


def test_keys_roll_does_not_act_on_warn_with_key_reason_and_fix(base_cfg, capsys):
    cfg = copy.deepcopy(base_cfg)
    cfg.generate_opt_level, cfg.is_num_return_sequences_expand = 0, False
    cfg.actor_train.strategy_args.strategy_config = {"zero_stage": 2, "optimizer": {"type": "AdamW"}}
    warnings = preflight(cfg)
    assert [w.split(" is ")[0] for w in warnings] == [
        "generate_opt_level=0",
        "is_num_return_sequences_expand=False",
        "prompt_length=512",
        "response_length=128",  # the ROLL-style example sets them; agentic does not read them
        "actor_train.strategy_args.strategy_config.optimizer",
    ]
    assert "set it to 1" in warnings[0] and "training_args" in warnings[4]
    assert "custom_envs.<tag>.max_tokens_per_step" in warnings[3]
    assert capsys.readouterr().err.count("roll: config warning: ") == 5


@pytest.mark.parametrize("value", [0, -2])
def test_max_traj_per_env_must_be_minus_one_or_positive(value):
    with pytest.raises(ConfigError, match=f"max_traj_per_env={value}: must be -1"):
        load([f"train_env_manager.max_traj_per_env={value}"])
