"""LoRA keys (roll.config.lora and the preflight): ROLL's spellings and defaults, and every refusal as one
ConfigError line before any worker starts: keys without lora_target, LoRA on the critic or the reference, an
engine whose keys differ from actor_train's, a strategy that builds no adapters (megatron_train); a KL term needs no
reference block when the reference is the actor with its adapters off."""

from __future__ import annotations

import pytest

from roll.config.errors import ConfigError
from roll.config.lora import LoraSettings, lora_settings, parse_target, reference_from_actor, wants_reference
from roll.config.worker import ModelArgs
from roll.launch.command import load_checked

LORA = "sokoban_tiny_lora"
SAME = ["actor_infer.model_args.lora_rank=16", "actor_infer.model_args.lora_alpha=32"]


@pytest.mark.parametrize(
    "value, want",
    [
        ("all-linear", "all-linear"),
        ("all", "all-linear"),  # ROLL's name
        ("q_proj, v_proj,q_proj", ("q_proj", "v_proj")),
        (["v_proj", "o_proj"], ("o_proj", "v_proj")),
        (r".*\.(q|v)_proj$", r".*\.(q|v)_proj$"),  # a regex over module paths, kept whole
    ],
)
def test_target_spellings(value, want):
    assert parse_target(value, "k") == want


@pytest.mark.parametrize("value", [[], ",", 3, ["q_proj", 1], ["all-linear", "q_proj"]])
def test_bad_targets_are_refused(value):
    with pytest.raises(ConfigError, match=r"^k=.*: expected all-linear, module names"):
        parse_target(value, "k")


def test_defaults_are_rolls():
    """No lora_target: full fine-tuning; with it, rank 8 and alpha 2 x rank (ROLL's defaults)."""
    assert lora_settings(ModelArgs()) is None
    margs = ModelArgs(lora_target="q_proj,v_proj")
    assert lora_settings(margs) == LoraSettings(rank=8, alpha=16.0, dropout=0.0, target=("q_proj", "v_proj"))
    margs.lora_rank, margs.lora_alpha, margs.lora_dropout = 32, 8, 0.1
    assert lora_settings(margs) == LoraSettings(rank=32, alpha=8.0, dropout=0.1, target=("q_proj", "v_proj"))


def test_the_example_config_turns_lora_on():
    cfg = load_checked(LORA)
    assert lora_settings(cfg.actor_train.model_args) == LoraSettings(16, 32.0, 0.0, "all-linear")
    assert reference_from_actor(cfg) and not wants_reference(cfg)  # sokoban_tiny has no KL term, no reference block
    assert load_checked("sokoban_tiny").actor_train.model_args.lora_target is None


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["actor_train.model_args.lora_target=null"],
            "actor_train.model_args.lora_rank=16: LoRA is off without actor_train.model_args.lora_target",
        ),
        (
            ["+critic.model_args.lora_target=all-linear"],
            "critic.model_args.lora_target='all-linear': LoRA applies to actor_train only; a critic stays full-weight",
        ),
        (
            ["+reference.model_args.lora_rank=8"],
            "reference.model_args.lora_rank=8: LoRA applies to actor_train only; the reference is the base model",
        ),
        (
            ["actor_infer.model_args.lora_target=all-linear", "actor_infer.model_args.lora_rank=8"],
            "actor_infer.model_args.lora_rank=8: differs from actor_train.model_args.lora_rank (16)",
        ),
        (
            ["actor_infer.model_args.lora_target=all-linear", *SAME, "actor_infer.model_args.lora_dropout=0.1"],
            "actor_infer.model_args.lora_dropout=0.1: differs from actor_train.model_args.lora_dropout (0.0)",
        ),
        (
            [
                "actor_train.model_args.lora_target=[q_proj,v_proj]",
                "actor_infer.model_args.lora_target=[q_proj]",
                *SAME,
            ],
            "actor_infer.model_args.lora_target='q_proj': differs from actor_train.model_args.lora_target "
            "(q_proj,v_proj)",
        ),
        (
            ["actor_infer.model_args.lora_reference=separate"],
            "actor_infer.model_args.lora_reference='separate': read on actor_train only",
        ),
        (
            ["actor_train.model_args.lora_rank=0"],
            "actor_train.model_args.lora_rank=0: must be >= 1",
        ),
        (
            ["use_kl_loss=true", "kl_loss_coef=0.01", "actor_train.model_args.lora_reference=separate"],
            "reference=None: a KL term is on",
        ),
        (
            [
                "actor_train.strategy_args.strategy_name=megatron_train",
                "~actor_train.strategy_args.strategy_config.zero_stage",
                "actor_train.use_prefix_sharing=auto",
                "num_gpus_per_node=1",  # megatron-core runs on GPUs only
                "actor_train.device_mapping=[0]",
                "actor_infer.device_mapping=[0]",
            ],
            "actor_train.strategy_args.strategy_name='megatron_train': LoRA (actor_train.model_args.lora_target) "
            "trains on deepspeed_train or fsdp2_train; this strategy builds no adapters",
        ),
    ],
)
def test_refusals_are_one_line(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_checked(LORA, overrides=overrides)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_engine_keys_equal_to_the_trainers_are_accepted(tiny_model_dir):
    """ROLL's example writes all-linear on actor_train and the seven projections on actor_infer: the same modules of
    a Qwen2 model, compared on the model; six of them are not."""
    load_checked(LORA, overrides=["actor_infer.model_args.lora_target=all-linear", *SAME])
    names = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
    load_checked(LORA, overrides=[f"pretrain={tiny_model_dir}", f"actor_infer.model_args.lora_target=[{names}]", *SAME])
    with pytest.raises(ConfigError, match=r"all-linear is down_proj,gate_proj,k_proj,o_proj,q_proj,up_proj,v_proj"):
        load_checked(
            LORA, overrides=[f"pretrain={tiny_model_dir}", f"actor_infer.model_args.lora_target=[{names[:-10]}]", *SAME]
        )
    with pytest.raises(ConfigError, match="the model cannot be read before start; write the same lora_target on both"):
        load_checked(LORA, overrides=["pretrain=/nonexistent", f"actor_infer.model_args.lora_target=[{names}]", *SAME])
    with pytest.raises(ConfigError, match="the engine serves actor_train's adapter, and actor_train has no LoRA"):
        load_checked("sokoban_tiny", overrides=["actor_infer.model_args.lora_target=all-linear"])


def test_kl_needs_no_reference_block_when_the_actor_is_the_reference():
    cfg = load_checked(LORA, overrides=["use_kl_loss=true", "kl_loss_coef=0.01"])
    assert cfg.reference is None and reference_from_actor(cfg) and wants_reference(cfg)
    with pytest.raises(ConfigError, match="no `reference:` worker block"):
        load_checked("sokoban_tiny", overrides=["use_kl_loss=true", "kl_loss_coef=0.01"])


def test_started_roles_leave_out_the_reference():
    """With the adapters-off reference a reference block starts no worker; with lora_reference: separate it does."""
    from roll.launch.startup import started_workers

    for reference, expected in (("adapters_off", set()), ("separate", {"reference"})):
        cfg = load_checked(
            LORA,
            overrides=[
                "+reference.strategy_args.strategy_name=hf_infer",
                f"actor_train.model_args.lora_reference={reference}",
            ],
        )
        assert set(started_workers(cfg)) == {"actor_train", "actor_infer"} | expected, reference
