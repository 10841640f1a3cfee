"""The FSDP2 strategies' options (ROLL's strategy_config keys) at launch, and the one-line answer to
``strategy_name: vllm`` with the SGLang options that replace the config's vLLM options."""

from __future__ import annotations

import copy

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.errors import ConfigError
from roll.config.fsdp2 import FSDP2Options
from roll.config.loader import load_config
from roll.config.strategies import parse_options
from roll.config.vllm_compat import sglang_equivalent
from roll.launch.preflight import preflight


def parse_fsdp2_options(raw):
    options = parse_options(FSDP2Options, raw, "strategy_config")
    return options, options.ignored()


#: strategy_config of ROLL's FSDP2 guide (training example) and of its NPU example (keys roll ignores).
ROLL_TRAIN = {
    "fsdp_size": 16,
    "param_dtype": "bf16",
    "reduce_dtype": "float32",
    "reshard_after_forward": True,
    "offload_policy": False,
}
ROLL_NPU = {
    "fsdp_size": 1,
    "param_dtype": "bf16",
    "reduce_dtype": "bf16",
    "reshard_after_forward": True,
    "offload_policy": False,
    "use_batched_model_update": False,
    "async_save_ckpt": True,
}


@pytest.fixture(scope="module")
def base_cfg() -> AgenticConfig:
    return load_config("agentic_sokoban", "roll_style", [], AgenticConfig)


def _with(base: AgenticConfig, role: str, name: str, strategy_config: dict | None, **worker) -> AgenticConfig:
    cfg = copy.deepcopy(base)
    block = getattr(cfg, role) or copy.deepcopy(cfg.actor_train)  # a role the file lacks: like the actor's
    setattr(cfg, role, block)
    block.strategy_args.strategy_name = name
    block.strategy_args.strategy_config = strategy_config
    for key, value in worker.items():
        setattr(block, key, value)
    return cfg


def test_roll_keys_parse_with_their_meaning():
    options, ignored = parse_fsdp2_options(ROLL_TRAIN)
    assert options == FSDP2Options(fsdp_size=16, param_dtype="bf16", reduce_dtype="float32")
    assert ignored == []
    assert parse_fsdp2_options(None) == (FSDP2Options(), [])  # ROLL's `strategy_config: ~`
    verl, _ = parse_fsdp2_options({"mixed_precision": {"param_dtype": "bf16", "reduce_dtype": "fp32"}})
    assert (verl.param_dtype, verl.reduce_dtype) == ("bf16", "fp32")
    wrap, _ = parse_fsdp2_options({"wrap_policy": {"transformer_layer_cls_to_wrap": ["Qwen2DecoderLayer"]}})
    assert wrap.wrap_policy.transformer_layer_cls_to_wrap == ["Qwen2DecoderLayer"]


def test_launch_accepts_fsdp2_roles_and_names_ignored_keys(base_cfg, capsys):
    cfg = _with(base_cfg, "actor_train", "fsdp2_train", ROLL_NPU)
    cfg = _with(cfg, "reference", "fsdp2_infer", dict(ROLL_TRAIN, async_save_ckpt=False))
    warnings = preflight(cfg)
    lines = [line for line in capsys.readouterr().err.splitlines() if "config warning" in line]
    assert len(lines) == len(warnings)
    for key in (
        "actor_train.strategy_args.strategy_config.use_batched_model_update",
        "actor_train.strategy_args.strategy_config.async_save_ckpt",
        "reference.strategy_args.strategy_config.async_save_ckpt",
    ):
        assert sum(line.startswith(f"roll: config warning: {key} is ignored: ") for line in lines) == 1, key


def test_deepspeed_stage_keys_are_ignored_with_a_warning(base_cfg, capsys):
    """Switching a DeepSpeed role to fsdp2_train by its strategy_name alone works: the stage has no meaning there."""
    preflight(_with(base_cfg, "actor_train", "fsdp2_train", {"zero_stage": 2, "offload_param": "none"}))
    out = capsys.readouterr().err
    assert "zero_stage is ignored: a deepspeed_train key; FSDP2 shards parameters" in out
    assert "offload_param is ignored: off; a deepspeed_train key" in out


@pytest.mark.parametrize(
    "role, name, strategy_config, worker, match",
    [
        (
            "actor_train",
            "fsdp2_train",
            {"zero_stages": 2},
            {},
            r"strategy_config.zero_stages=2: unknown FSDP2Options key; known: fsdp_size, offload_policy, param_dtype",
        ),
        (
            "actor_train",
            "fsdp2_train",
            {"zero_stage": 2, "offload_optimizer": "cpu"},
            {},
            r"offload_optimizer='cpu': not supported .*: a deepspeed_train key; "
            r"for CPU offload use offload_policy: true",
        ),
        (
            "actor_train",
            "fsdp2_train",
            {"fsdp_size": 3},
            {"world_size": 4},
            r"fsdp_size=3: must be 0 \(shard over all 4 ranks\) or a divisor of the world size 4",
        ),
        (
            "actor_train",
            "fsdp2_train",
            {"param_dtype": "fp16"},
            {},
            r"param_dtype='fp16': fsdp2_train trains in bf16 or fp32 \(fp16 needs loss scaling",
        ),
        (
            "actor_train",
            "fsdp2_train",
            {"apply_tiled_mlp": True},
            {},
            r"apply_tiled_mlp=True: not supported by roll's FSDP2 strategies: "
            r"TiledMLP .*disable_gradient_checkpointing",
        ),
        ("actor_train", "fsdp2_train", {"param_offload": True}, {}, r"param_offload=True: .*use offload_policy: true"),
        (
            "actor_train",
            "fsdp2_train",
            {"reshard_after_forward": "yes"},
            {},
            r"reshard_after_forward='yes': expected bool",
        ),
        ("actor_train", "fsdp2_train", {"reduce_dtype": "int8"}, {}, r"reduce_dtype='int8': must be one of fp32"),
        (
            "actor_train",
            "fsdp2_train",
            {"param_dtype": "bf16", "mixed_precision": {"param_dtype": "bf16"}},
            {},
            r"mixed_precision.param_dtype='bf16': also set as .*param_dtype; set it in one place",
        ),
        (
            "actor_train",
            "fsdp2_train",
            {"wrap_policy": {"moe_experts": ["Qwen3MoeMLP"]}},
            {},
            r"wrap_policy.moe_experts=\['Qwen3MoeMLP'\]: not supported",
        ),
        ("reference", "fsdp2_train", {}, {}, r"fsdp2_train cannot serve reference; valid for reference: .*fsdp2_infer"),
    ],
)
def test_bad_fsdp2_config_is_one_line(base_cfg, role, name, strategy_config, worker, match):
    cfg = _with(base_cfg, role, name, strategy_config, **worker)
    with pytest.raises(ConfigError, match=match) as err:
        preflight(cfg)
    assert str(err.value).startswith(role) and "\n" not in str(err.value)


def test_vllm_answer_names_the_sglang_options(base_cfg):
    """ROLL's usual vLLM block becomes the sglang block the message spells out, which roll's sglang strategy takes."""
    from roll.config.strategies import SGLangOptions
    from roll.strategies.sglang import engine_kwargs

    vllm = {
        "gpu_memory_utilization": 0.8,
        "block_size": 16,
        "load_format": "auto",
        "sleep_level": 2,
        "enable_prefix_caching": False,
        "swap_space": 4,
    }
    cfg = _with(base_cfg, "actor_infer", "vllm", vllm)
    with pytest.raises(ConfigError) as err:
        preflight(cfg)
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("actor_infer.strategy_args.strategy_name='vllm': vLLM is not available")
    assert (
        "use strategy_name: sglang with strategy_config {mem_fraction_static: 0.8, load_format: auto, "
        "engine_args: {page_size: 16, disable_radix_cache: True}}"
    ) in msg
    assert "gpu_memory_utilization -> mem_fraction_static" in msg and "block_size -> page_size" in msg
    assert "drop sleep_level" in msg and "check swap_space" in msg and "hf_infer" in msg
    config, dropped, unknown = sglang_equivalent(vllm)
    assert (dropped, unknown) == (["sleep_level"], ["swap_space"])
    options = parse_options(SGLangOptions, config, "actor_infer.strategy_args.strategy_config")  # it parses
    kwargs = engine_kwargs("/m", "bf16", options, seed=0)
    assert (kwargs["mem_fraction_static"], kwargs["page_size"], kwargs["disable_radix_cache"]) == (0.8, 16, True)


def test_vllm_without_options_names_the_usual_ones(base_cfg):
    with pytest.raises(
        ConfigError,
        match=r"strategy_config \{\} \(gpu_memory_utilization -> mem_fraction_static, "
        r"tensor_parallel_size -> tp_size, max_model_len -> context_length\)",
    ):
        preflight(_with(base_cfg, "actor_infer", "vllm", {}))


def test_sglang_guide_lists_every_vllm_translation():
    from pathlib import Path

    from roll.config.vllm_compat import HANDLED, NEGATED, VLLM_TO_SGLANG

    guide = (Path(__file__).resolve().parents[2] / "docs" / "sglang.md").read_text()
    for vllm, sglang in VLLM_TO_SGLANG.items():
        assert f"`{vllm}`" in guide and (f"`{sglang}`" in guide or vllm == sglang), vllm
    for vllm, sglang in NEGATED.items():
        assert f"`{vllm}: false` | `{sglang}: true`" in guide
    for key in HANDLED:
        assert f"`{key}`" in guide, key
