"""Every value is checked before any worker starts (issue 19, point 2): a bad value is one ConfigError naming the key,
the value and what is allowed, raised by the path a launch takes (the loader's rules, then the preflight), and the
start scripts turn it into one stderr line with exit code 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.errors import ConfigError
from roll.config.fields import in_range
from roll.config.rlvr import RLVRConfig
from roll.launch.command import load_checked
from tests.start_scripts import run_start_scripts

REPO = Path(__file__).resolve().parents[2]
AGENTIC, RLVR = "sokoban_tiny", "rlvr_tiny"
#: the SGLang example; ray_address skips the install check (a driver joining a cluster), so its options parse here
SGLANG = "sokoban_qwen05b_sglang ray_address=auto"
DS, INFER = "actor_train.strategy_args.strategy_config", "actor_infer.strategy_args.strategy_config"

# (config and overrides, the start of the one-line message: "key=value: what is allowed")
CASES = [
    # sampling
    (
        f"{AGENTIC} actor_infer.generating_args.temperature=-1",
        "actor_infer.generating_args.temperature=-1.0: must be >= 0",
    ),
    (f"{AGENTIC} actor_infer.generating_args.top_p=1.7", "actor_infer.generating_args.top_p=1.7: must be in (0, 1]"),
    (f"{AGENTIC} actor_infer.generating_args.top_p=0", "actor_infer.generating_args.top_p=0.0: must be in (0, 1]"),
    (f"{AGENTIC} actor_infer.generating_args.top_k=-2", "actor_infer.generating_args.top_k=-2: must be >= -1"),
    (
        f"{AGENTIC} actor_infer.generating_args.max_new_tokens=0",
        "actor_infer.generating_args.max_new_tokens=0: must be >= 1",
    ),
    (
        f"{AGENTIC} actor_infer.generating_args.num_beams=4",
        "actor_infer.generating_args.num_beams=4: must be == 1; RL samples",
    ),
    (
        f"{AGENTIC} actor_infer.generating_args.num_return_sequences=0",
        "actor_infer.generating_args.num_return_sequences=0: must be >= 1",
    ),
    (
        f"{AGENTIC} actor_infer.generating_args.repetition_penalty=0",
        "actor_infer.generating_args.repetition_penalty=0.0: must be > 0",
    ),
    (
        f"{AGENTIC} actor_infer.generating_args.stop_token_ids=[-3]",
        "actor_infer.generating_args.stop_token_ids=[-3]: must be token ids",
    ),
    (
        f"{RLVR} actor_infer.generating_args.temperature=-0.5",
        "actor_infer.generating_args.temperature=-0.5: must be >= 0",
    ),
    (f"{RLVR} validation.generating_args.top_p=2", "validation.generating_args.top_p=2.0: must be in (0, 1]"),
    (f"{RLVR} validation.generating_args.top_k=-5", "validation.generating_args.top_k=-5: must be >= -1"),
    # optimizer and schedule
    (
        f"{AGENTIC} actor_train.training_args.learning_rate=-1e-5",
        "actor_train.training_args.learning_rate=-1e-05: must be > 0",
    ),
    (
        f"{AGENTIC} actor_train.training_args.learning_rate=0",
        "actor_train.training_args.learning_rate=0.0: must be > 0",
    ),
    (f"{RLVR} actor_train.training_args.learning_rate=-1", "actor_train.training_args.learning_rate=-1.0: must be > 0"),
    (f"{AGENTIC} actor_train.training_args.warmup_steps=-1", "actor_train.training_args.warmup_steps=-1: must be >= 0"),
    (f"{AGENTIC} actor_train.training_args.max_steps=-1", "actor_train.training_args.max_steps=-1: must be >= 0"),
    (
        f"{AGENTIC} actor_train.training_args.weight_decay=-0.1",
        "actor_train.training_args.weight_decay=-0.1: must be >= 0",
    ),
    (
        f"{AGENTIC} actor_train.training_args.adam_beta1=1.5",
        "actor_train.training_args.adam_beta1=1.5: must be in [0, 1)",
    ),
    (
        f"{AGENTIC} actor_train.training_args.adam_beta2=1",
        "actor_train.training_args.adam_beta2=1.0: must be in [0, 1)",
    ),
    (
        f"{AGENTIC} actor_train.training_args.lr_scheduler_type=step",
        "actor_train.training_args.lr_scheduler_type='step': must be one of constant, linear, cosine",
    ),
    (f"{AGENTIC} sft_warmup.learning_rate=0", "sft_warmup.learning_rate=0.0: must be > 0"),
    (f"{AGENTIC} sft_warmup.steps=-1", "sft_warmup.steps=-1: must be >= 0"),
    (f"{AGENTIC} sft_warmup.num_demos=0", "sft_warmup.num_demos=0: must be >= 1"),
    (f"{RLVR} sft_warmup.learning_rate=-3e-3", "sft_warmup.learning_rate=-0.003: must be > 0"),
    (f"{RLVR} sft_warmup.max_examples=-1", "sft_warmup.max_examples=-1: must be >= 0"),
    # clip, KL and advantage coefficients
    (f"{AGENTIC} max_grad_norm=-1", "max_grad_norm=-1.0: must be >= 0"),
    (f"{AGENTIC} pg_clip=1.5", "pg_clip=1.5: must be in (0, 1)"),
    (f"{AGENTIC} pg_clip_high=0", "pg_clip_high=0.0: must be > 0"),
    (f"{AGENTIC} dual_clip_loss=true dual_clip_c=0.5", "dual_clip_c=0.5: must be > 1"),
    (f"{AGENTIC} init_kl_coef=-1", "init_kl_coef=-1.0: must be >= 0"),
    (f"{AGENTIC} target_kl=0", "target_kl=0.0: must be > 0; null = off"),
    (f"{AGENTIC} entropy_loss_coef=-0.01", "entropy_loss_coef=-0.01: must be >= 0"),
    (f"{AGENTIC} gamma=1.2", "gamma=1.2: must be in [0, 1]"),
    (f"{AGENTIC} step_adv_weight=-1", "step_adv_weight=-1.0: must be >= 0"),
    (f"{RLVR} reward_clip=-2", "reward_clip=-2.0: must be > 0"),
    # run control and cluster
    (f"{AGENTIC} logging_steps=0", "logging_steps=0: must be >= 1"),
    (f"{AGENTIC} eval_steps=-1", "eval_steps=-1: must be >= 0"),
    (f"{AGENTIC} rpc_timeout=0", "rpc_timeout=0: must be >= 1"),
    (f"{AGENTIC} num_nodes=0", "num_nodes=0: must be >= 1"),
    (f"{AGENTIC} num_gpus_per_node=-1", "num_gpus_per_node=-1: must be >= 0"),
    (f"{AGENTIC} ray_num_cpus=0", "ray_num_cpus=0: must be >= 1"),
    (f"{AGENTIC} val_batch_size=-1", "val_batch_size=-1: must be >= 0"),
    (f"{AGENTIC} actor_train.num_cpus_per_worker=0", "actor_train.num_cpus_per_worker=0.0: must be > 0"),
    (
        f"{AGENTIC} tiny_model.num_attention_heads=3",
        "tiny_model.hidden_size=128: must be a multiple of num_attention_heads (3)",
    ),
    (f"{AGENTIC} tiny_model.vocab_size=0", "tiny_model.vocab_size=0: must be >= 1"),
    # DeepSpeed options (actor_train of sokoban_tiny: deepspeed_train, zero_stage 2, fp32)
    (f"{AGENTIC} {DS}.zero_stage=7", f"{DS}.zero_stage=7: must be one of None, 0, 1, 2, 3"),
    (f"{AGENTIC} ~{DS}.zero_stage +{DS}.zero_optimization.stage=5", f"{DS}.zero_optimization.stage=5: must be one of"),
    (f"{AGENTIC} {DS}.zero_stage=2 +{DS}.offload_param=cpu", f"{DS}.offload_param='cpu': needs ZeRO stage 3"),
    (f"{AGENTIC} {DS}.zero_stage=0 +{DS}.offload_optimizer=cpu", f"{DS}.offload_optimizer='cpu': needs ZeRO stage 1"),
    (f"{AGENTIC} +{DS}.offload_optimizer=disk", f"{DS}.offload_optimizer='disk': must be one of None, cpu, none"),
    (f"{AGENTIC} +{DS}.train_batch_size=3", f"{DS}.train_batch_size=3: disagrees with the worker block (16"),
    (f"{AGENTIC} +{DS}.gradient_accumulation_steps=0", f"{DS}.gradient_accumulation_steps=0: must be 'auto'"),
    (
        f"{AGENTIC} +{DS}.gradient_clipping=-1",
        f"{DS}.gradient_clipping=-1: must be 'auto' (= max_grad_norm) or a number",
    ),
    (f"{AGENTIC} +{DS}.bf16.enabled=true", f"{DS}.bf16.enabled=True: disagrees with model_args.dtype (fp32)"),
    (f"{AGENTIC} +{DS}.communication_data_type=fp8", f"{DS}.communication_data_type='fp8': must be one of"),
    (f"{AGENTIC} +{DS}.zero_stag=2", f"{DS}.zero_stag=2: not a key of DeepSpeedTrainOptions"),
    # hf_infer and SGLang options
    (f"{AGENTIC} {INFER}.generate_batch_size=0", f"{INFER}.generate_batch_size=0: must be >= 1"),
    (f"{AGENTIC} +{INFER}.kv_cache_mb=0", f"{INFER}.kv_cache_mb=0.0: must be > 0"),
    (f"{SGLANG} {INFER}.mem_fraction_static=1.5", f"{INFER}.mem_fraction_static=1.5: must be in (0, 1)"),
    (f"{SGLANG} +{INFER}.release_tags=[weights,kv]", f"{INFER}.release_tags=['weights', 'kv']: unknown tags ['kv']"),
    (f"{SGLANG} +{INFER}.log_level=loud", f"{INFER}.log_level='loud': must be one of debug, info"),
    (f"{SGLANG} +{INFER}.context_length=0", f"{INFER}.context_length=0: must be >= 1"),
    (f"{SGLANG} +{INFER}.chunked_prefill_size=0", f"{INFER}.chunked_prefill_size=0: must be >= 1, -1"),
    (f"{SGLANG} +{INFER}.weight_sync=rdma", f"{INFER}.weight_sync='rdma': must be one of auto, nccl, cuda_ipc, copy"),
    # keys the chosen pipeline does not use: where the equivalent lives
    (
        f"{AGENTIC} response_length=0",
        "response_length=0: must be >= 1, and is not used: the agentic pipeline limits "
        "each turn instead: use custom_envs.<tag>.max_tokens_per_step",
    ),
    (f"{AGENTIC} prompt_length=-5", "prompt_length=-5: must be >= 1, and is not used"),
    (
        f"{AGENTIC} +rollout_dump_steps=4",
        "rollout_dump_steps='<unknown key>': not a key of AgenticConfig; RLVR's; the "
        "agentic equivalent is trajectory_dump_steps",
    ),
    (
        f"{AGENTIC} +dynamic_sampling.enabled=true",
        "dynamic_sampling='<unknown key>': not a key of AgenticConfig; RLVR only",
    ),
    (
        f"{RLVR} +custom_envs.math.max_tokens_per_step=32",
        "custom_envs='<unknown key>': not a key of RLVRConfig; agentic only; an RLVR response is limited by "
        "response_length",
    ),
    (
        f"{RLVR} +trajectory_dump_steps=4",
        "trajectory_dump_steps='<unknown key>': not a key of RLVRConfig; agentic's; the RLVR equivalent is "
        "rollout_dump_steps",
    ),
    (
        f"{RLVR} +reward_normalization.method=mean",
        "reward_normalization='<unknown key>': not a key of RLVRConfig; "
        "agentic only; RLVR normalizes rewards with reward_norm",
    ),
]


def _load(case: str, gpus: int | None = None):
    name, *overrides = case.split()
    return load_checked(name, None, overrides, RLVRConfig if name.startswith("rlvr") else AgenticConfig, gpus=gpus)


@pytest.mark.parametrize("case, message", CASES, ids=[c.split(" ", 1)[1] for c, _ in CASES])
def test_bad_value_is_one_line_naming_key_value_and_allowed(case, message):
    with pytest.raises(ConfigError) as info:
        _load(case)
    text = str(info.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_the_table_covers_forty_cases_and_the_bases_load():
    assert len(CASES) >= 40
    for base in (AGENTIC, RLVR, SGLANG):
        _load(base)


@pytest.mark.parametrize(
    "overrides, gpus, message",
    [
        # per_device_train_batch_size keeps the batch arithmetic whole with 1 or 2 GPUs (world_size follows the mapping)
        (
            "actor_train.device_mapping=[0] actor_infer.device_mapping=[0] num_gpus_per_node=1",
            0,
            "actor_train.device_mapping=[0]: this machine has 0 visible GPU(s)",
        ),
        (
            "actor_train.device_mapping=[0,1] actor_infer.device_mapping=[0,1] num_gpus_per_node=2 "
            "actor_train.training_args.per_device_train_batch_size=4",
            1,
            "actor_train.device_mapping=[0, 1]: this machine has 1 visible GPU(s)",
        ),
        (
            "actor_train.device_mapping=[0] actor_infer.device_mapping=[0] num_gpus_per_node=4",
            2,
            "num_gpus_per_node=4: this machine has 2 visible GPU(s)",
        ),
    ],
)
def test_device_mappings_are_checked_against_the_gpus_present(overrides, gpus, message):
    case = f"{AGENTIC} actor_train.training_args.per_device_train_batch_size=8 {overrides}"
    with pytest.raises(ConfigError) as info:
        _load(case, gpus=gpus)
    assert str(info.value).startswith(message), str(info.value)
    _load(case)  # the GPU count is only known at launch: without it the config is fine
    _load(f"{case} ray_address=auto", gpus=gpus)  # a cluster's GPUs are Ray's to count


def test_agentic_warns_for_shared_keys_it_does_not_read(capsys):
    _load(f"{AGENTIC} response_length=100 num_return_sequences_in_group=4 reward_norm=group")
    err = capsys.readouterr().err
    assert (
        "response_length=100 is not used by the agentic pipeline: the agentic pipeline limits each turn instead: "
        "use custom_envs.<tag>.max_tokens_per_step" in err
    )
    assert (
        "num_return_sequences_in_group=4 is not used by the agentic pipeline: the agentic group size is "
        "train_env_manager.group_size" in err
    )
    assert (
        "reward_norm='group' is not used by the agentic pipeline: agentic scores are normalized by "
        "reward_normalization" in err
    )


def test_rlvr_warns_for_shared_keys_it_does_not_read(capsys):
    _load(f"{RLVR} val_batch_size=4 render_save_dir=/tmp/frames")
    err = capsys.readouterr().err
    assert "val_batch_size=4 is not used by the RLVR pipeline: RLVR validates validation.max_samples prompts" in err
    assert "render_save_dir='/tmp/frames' is not used by the RLVR pipeline: agentic only" in err
    _load(RLVR)
    assert "is not used by" not in capsys.readouterr().err  # the defaults warn about nothing


# (start script, config and overrides, the one stderr line's start)
SCRIPT_CASES = [
    (
        "start_agentic_pipeline.py",
        f"{AGENTIC} actor_infer.generating_args.temperature=-1",
        "roll: config error: actor_infer.generating_args.temperature=-1.0: must be >= 0",
    ),
    (
        "start_agentic_pipeline.py",
        f"{AGENTIC} {DS}.zero_stage=7",
        f"roll: config error: {DS}.zero_stage=7: must be one",
    ),
    (
        "start_agentic_pipeline.py",
        f"{AGENTIC} actor_train.training_args.learning_rate=-1e-5",
        "roll: config error: actor_train.training_args.learning_rate=-1e-05: must be > 0",
    ),
    (
        "start_agentic_pipeline.py",
        f"{AGENTIC} actor_train.device_mapping=[0] actor_infer.device_mapping=[0] "
        "num_gpus_per_node=1 actor_train.training_args.per_device_train_batch_size=8",
        "roll: config error: actor_train.device_mapping=[0]: this machine has 0 visible GPU(s)",
    ),
    (
        "start_rlvr_pipeline.py",
        f"{RLVR} actor_infer.generating_args.top_p=1.7",
        "roll: config error: actor_infer.generating_args.top_p=1.7: must be in (0, 1]",
    ),
]


@pytest.fixture(scope="module")
def script_exits(tmp_path_factory):
    """Every SCRIPT_CASES' exit code and stderr (one interpreter runs them all: tests/start_scripts.py)."""
    runs = []
    for script, case, _ in SCRIPT_CASES:
        name, *overrides = case.split()
        runs.append((REPO / "examples" / script, ["--config-name", name, *overrides]))
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, whatever the machine has
    return run_start_scripts(runs, tmp_path_factory.mktemp("scripts"), env)


@pytest.mark.parametrize("case", range(len(SCRIPT_CASES)), ids=[c for _, c, _ in SCRIPT_CASES])
def test_start_script_exits_2_with_one_line(script_exits, case):
    line, proc = SCRIPT_CASES[case][2], script_exits[case]
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith("roll: config warning")]
    assert len(lines) == 1 and lines[0].startswith(line), proc.stderr[-2000:]


def test_an_allowed_range_is_its_own_rule():
    assert in_range(0, ">= 0") and not in_range(0, "> 0") and in_range(1, "== 1; RL samples")
    assert in_range(1, "in (0, 1]") and not in_range(0, "in (0, 1]") and not in_range(1, "in [0, 1)")
    assert in_range(-1, ">= -1") and not in_range(-1.5, ">= -1")
    assert in_range(2.0, "a whole number >= 0") and not in_range(0.5, "a whole number >= 0; note")
    assert not in_range(-1, "a whole number >= 0") and not in_range(float("inf"), "a whole number >= 0")
    with pytest.raises(ValueError):
        in_range(0, "in {0, 1}")


@pytest.mark.parametrize(
    "template, placeholder",
    [("{env_instructions}\n{observation}", "{env_instructions}"), ("{history_summary}", "{history_summary}")],
)
def test_unknown_template_placeholder_is_a_config_error(template, placeholder):
    """A placeholder roll does not fill (a misspelt one of ROLL's step env manager's) is one line before any
    worker, naming the known ones (ROLL's step fields among them)."""
    from roll.config.agentic import AgenticConfig
    from roll.config.errors import ConfigError
    from roll.config.loader import load_config

    with pytest.raises(ConfigError) as info:
        load_config(
            "sokoban_tiny", overrides=[f"custom_envs.SimpleSokoban.turn_template='{template}'"], schema=AgenticConfig
        )
    message = str(info.value)
    assert info.value.key == "custom_envs.SimpleSokoban.turn_template"
    assert f"unknown placeholder {placeholder}" in message and "{observation}" in message and "\n" not in message
    assert "{env_instruction}" in message and "{history}" in message


#: (schema, dotted key, a value just outside the field's range, the message, the nearest allowed value): the range
#: rules that were written by hand in the validators, now each on its field (``allowed=``).
FIELD_RULES = [
    ("agentic", "ppo_epochs", 0, "must be >= 1", 1),
    ("agentic", "async_generation_ratio", 1.5, "must be a whole number >= 0; the policy versions", 2.0),
    ("agentic", "async_generation_ratio", -1.0, "must be a whole number >= 0", 0.0),
    ("agentic", "gamma", -0.1, "must be in [0, 1]", 0.0),
    ("agentic", "lambd", 1.01, "must be in [0, 1]", 1.0),
    ("agentic", "pg_clip", 0.0, "must be in (0, 1); the ratio is clipped at 1 - value", 0.5),
    ("agentic", "pg_clip_low", 1.0, "must be in (0, 1)", 0.9),
    ("agentic", "pg_clip_high", 0.0, "must be > 0; DAPO clip-higher uses 0.28", 0.28),
    ("agentic", "value_clip", 0.0, "must be > 0; null = off", None),
    ("agentic", "advantage_clip", -1.0, "must be > 0; null = off", 1.0),
    ("agentic", "reward_clip", 0.0, "must be > 0; null = off", None),
    ("agentic", "target_kl", -0.1, "must be > 0; null = off", 0.1),
    ("agentic", "entropy_loss_coef", -0.1, "must be >= 0", 0.0),
    ("agentic", "init_kl_coef", -0.1, "must be >= 0", 0.0),
    ("agentic", "kl_loss_coef", -0.1, "must be >= 0", 0.0),
    ("agentic", "kl_horizon", 0, "must be >= 1; samples over which the coefficient adapts", 1),
    ("agentic", "critic_warmup", -1, "must be >= 0", 0),
    ("agentic", "max_running_requests", 0, "must be >= 1", None),
    ("agentic", "max_additional_running_prompts", -1, "must be >= 0", 0),
    ("agentic", "num_return_sequences_in_group", 0, "must be >= 1, and is not used: the agentic group size", 1),
    ("agentic", "actor_train.world_size", 0, "must be >= 1", 1),
    ("agentic", "critic.num_gpus_per_worker", 0, "must be >= 1", 1),
    ("agentic", "reference.infer_batch_size", 0, "must be >= 1", 1),
    ("agentic", "actor_infer.model_update_frequency", 0, "must be >= 1", 1),
    ("agentic", "actor_train.training_args.gradient_accumulation_steps", 0, "must be >= 1", 1),
    ("agentic", "train_env_manager.group_size", 0, "must be >= 1", 1),
    ("agentic", "train_env_manager.env_groups", 0, "must be >= 1", 1),
    ("agentic", "train_env_manager.num_env_managers", 0, "must be >= 1", 1),
    ("agentic", "train_env_manager.env_step_timeout", -1.0, "must be >= 0; seconds, 0 = no limit", 0.0),
    ("agentic", "val_env_manager.env_threads", 0, "must be >= 1", 1),
    ("agentic", "val_env_manager.max_refill_rounds", -1, "must be >= 0", 0),
    ("agentic", "val_env_manager.conformance_samples", -1, "must be >= 0; 0 = off", 0),
    ("agentic", "val_env_manager.batch_max_size", 0, "must be >= 1", 1),
    ("agentic", "val_env_manager.batch_max_wait_ms", -1.0, "must be >= 0", 0.0),
    ("agentic", "custom_envs.S.max_actions_per_traj", 0, "must be >= 1", 1),
    ("agentic", "custom_envs.S.max_tokens_per_step", 0, "must be >= 1", 1),
    ("agentic", "custom_envs.S.agent_timeout", -1.0, "must be >= 0; seconds, 0 = no limit", 0.0),
    ("agentic", "trajectory_dump_steps", -1, "must be >= 0", 0),
    ("agentic", "trajectory_dump_max", -1, "must be >= 0", 0),
    ("RLVR", "prompt_length", 0, "must be >= 1", 1),
    ("RLVR", "response_length", 0, "must be >= 1", 1),
    ("RLVR", "rollout_dump_steps", -1, "must be >= 0", 0),
    ("RLVR", "rollout_dump_max", -1, "must be >= 0", 0),
    ("RLVR", "rewards.num_workers", 0, "must be >= 1", 1),
    ("RLVR", "dynamic_sampling.std_min", -0.1, "must be >= 0", 0.0),
]


def _default_config(schema: str):
    """The schema's defaults with every optional block filled (critic, reference, val_env_manager, one env tag)."""
    from roll.config.agentic import CustomEnvConfig, EnvManagerConfig
    from roll.config.worker import WorkerConfig

    cfg = AgenticConfig() if schema == "agentic" else RLVRConfig()
    cfg.critic, cfg.reference = WorkerConfig(), WorkerConfig()
    if schema == "agentic":
        cfg.val_env_manager, cfg.custom_envs = EnvManagerConfig(), {"S": CustomEnvConfig()}
    return cfg


def _set(cfg, dotted: str, value) -> None:
    *path, leaf = dotted.split(".")
    for part in path:
        cfg = cfg[part] if isinstance(cfg, dict) else getattr(cfg, part)
    setattr(cfg, leaf, value)


@pytest.mark.parametrize(
    "schema, key, bad, message, good", FIELD_RULES, ids=[f"{k}={b}" for _, k, b, _, _ in FIELD_RULES]
)
def test_single_field_rules_live_on_the_field(schema, key, bad, message, good):
    """Each field's range is checked from its declaration (before the rules across fields run); the nearest allowed
    value passes."""
    from roll.config.validation import check_fields

    cfg = _default_config(schema)
    check_fields(cfg)
    _set(cfg, key, bad)
    with pytest.raises(ConfigError) as info:
        check_fields(cfg)
    assert str(info.value).startswith(f"{key}={bad!r}: {message}"), str(info.value)
    _set(cfg, key, good)
    check_fields(cfg)


def test_worker_blocks_are_the_configured_roles_in_order():
    """The one definition of "the roles this config has" (preflight, startup, placement rules, roll doctor)."""
    from types import SimpleNamespace

    from roll.config.validation import worker_blocks
    from roll.config.worker import WorkerConfig

    cfg = AgenticConfig()
    assert list(worker_blocks(cfg)) == ["actor_train", "actor_infer"]  # reference and critic are null by default
    cfg.critic = WorkerConfig()
    blocks = worker_blocks(cfg)
    assert list(blocks) == ["actor_train", "actor_infer", "critic"] and blocks["critic"] is cfg.critic
    assert worker_blocks(SimpleNamespace(reference="r", critic=None)) == {"reference": "r"}  # duck-typed configs
