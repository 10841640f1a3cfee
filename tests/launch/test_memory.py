"""The GPU memory planner (roll.launch.memory, memory_models, memory_plan): each term against its formula computed
by hand here, for Qwen2.5-0.5B- and 7B-shaped models (config.json only), full weights and LoRA, ZeRO 0/2/3, FSDP2,
Megatron, colocated with SGLang; the 7B full-weight config refused in one line at launch, its LoRA twin accepted."""

from __future__ import annotations

import argparse
import re

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.errors import ConfigError
from roll.config.worker import ModelArgs
from roll.launch import doctor, memory_plan
from roll.launch.command import run_pipeline
from roll.launch.memory import (
    CUDA_CONTEXT_GIB,
    FRAGMENTATION,
    GIB,
    LINEAR_MODULES,
    ModelShape,
    activation_bytes,
    chunk_tokens,
    layer_activation_bytes,
    logit_bytes,
    lora_of,
    recompute_bytes,
)
from roll.launch.memory_plan import MemoryPlanError, changed, plan_memory, suggestions, what_ifs
from roll.launch.preflight import preflight
from tests.launch.memory_configs import QWEN_05B, QWEN_7B, gpu_config, load, save, worker, write_model

GPU = 79.2  # GiB of an 80 GB H100
SHAPE_05B = ModelShape.from_config(QWEN_05B)
SHAPE_7B = ModelShape.from_config(QWEN_7B)

# ---------------------------------------------------------------------------- parameter counts, by hand
# Qwen2.5-0.5B: h 896, q 14 x 64 = 896, kv 2 x 64 = 128, I 4864, V 151936, 24 layers, tied LM head
LAYER_05B = (
    (896 * 896 + 896)  # q_proj + bias
    + 2 * (896 * 128 + 128)  # k_proj, v_proj + biases
    + 896 * 896  # o_proj
    + 3 * 896 * 4864  # gate, up, down
    + 2 * 896  # two RMSNorms
)
P_05B = 151936 * 896 + 24 * LAYER_05B + 896  # embedding (tied head) + layers + final norm
# Qwen2.5-7B: h 3584, q 28 x 128 = 3584, kv 4 x 128 = 512, I 18944, 28 layers, untied LM head
LAYER_7B = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 3584 * 18944 + 2 * 3584
P_7B = 2 * 151936 * 3584 + 28 * LAYER_7B + 3584
# LoRA r=32 on all seven linears of each layer: r (d_in + d_out) per module
ADAPTERS_7B = 32 * 28 * ((3584 + 3584) + 2 * (3584 + 512) + (3584 + 3584) + 2 * (3584 + 18944) + (18944 + 3584))


def gib(nbytes: float) -> float:
    return nbytes / 2**30


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("models")
    return {"0.5b": write_model(root, "qwen05b", QWEN_05B), "7b": write_model(root, "qwen7b", QWEN_7B)}


@pytest.fixture(autouse=True)
def no_gpu_here(monkeypatch):
    """The planner reads the GPU's memory from the config's gpu_memory_gib, whatever GPU the test machine has."""
    monkeypatch.setattr(memory_plan, "detected_gpu_gib", lambda: None)


def terms(plan, role: str, state: str = "resident") -> dict[str, float]:
    return {t.what: t.gib for t in getattr(plan.roles[role], state)}


def column(plan, phase: str):
    return next(c for c in plan.columns if c.phase == phase)


def test_shapes_count_parameters_of_the_published_models():
    assert P_05B == 494_032_768  # Qwen2.5-0.5B's parameter count
    assert SHAPE_05B.params() == P_05B
    assert SHAPE_7B.params() == P_7B == 7_614_699_008
    assert SHAPE_7B.lora_params(32, LINEAR_MODULES) == ADAPTERS_7B == 80_740_352
    assert SHAPE_7B.lora_params(8, ("q_proj", "v_proj")) == 8 * 28 * ((3584 + 3584) + (3584 + 512))
    assert SHAPE_05B.params(value_head=True) == P_05B + 896 + 1  # the critic's head h -> 1 (tied: no LM head)


def test_shape_refuses_what_it_cannot_count():
    with pytest.raises(ValueError, match="lacks vocab_size"):
        ModelShape.from_config({k: v for k, v in QWEN_05B.items() if k != "vocab_size"})
    with pytest.raises(ValueError, match="mixture-of-experts"):
        ModelShape.from_config({**QWEN_05B, "num_experts": 64})


def test_lora_fields_read_in_one_place():
    assert lora_of(ModelArgs()) == (0, ())  # no lora_target: full fine-tuning
    assert lora_of(ModelArgs(lora_rank=8, lora_target="q_proj, v_proj")) == (8, ("q_proj", "v_proj"))
    assert lora_of(ModelArgs(lora_rank=8, lora_target=["o_proj"])) == (8, ("o_proj",))
    assert lora_of(ModelArgs(lora_rank=16, lora_target="all-linear")) == (16, LINEAR_MODULES)
    assert lora_of(ModelArgs(lora_target="all-linear")) == (8, LINEAR_MODULES)  # ROLL's default rank


# ---------------------------------------------------------------------------- activations and logits, by hand
def test_activations_of_a_layer_and_a_micro_batch():
    # bf16, per token of one layer: norm1 in/out 2h, q and k after RoPE (896 + 128), v 128, attention out 896,
    # norm2 in/out 2h, MLP gate, up, act, product 4 x 4864; plus two fp32 copies of h in transformers' RMSNorm
    layer = 2 * (2 * 896 + 896 + 128 + 128 + 896 + 2 * 896 + 4 * 4864) + 2 * 4 * 896
    assert layer == 57344
    assert layer_activation_bytes(SHAPE_05B, 2) == layer
    assert layer_activation_bytes(SHAPE_05B, 2, liger=True) == 2 * (4 * 896 + 2 * 896 + 2 * 128 + 3 * 4864)
    assert layer_activation_bytes(SHAPE_05B, 4) == 4 * (4 * 896 + 2 * 896 + 2 * 128 + 4 * 4864)  # no fp32 copy
    n, extra = 4096, 2 * 2 * 896  # + embedding output and final hidden states
    assert activation_bytes(SHAPE_05B, 2, n, checkpointing=False) == n * (24 * layer + extra)
    assert activation_bytes(SHAPE_05B, 2, n, checkpointing=True) == n * (24 * 2 * 896 + extra)  # layer inputs
    assert recompute_bytes(SHAPE_05B, 2, n) == n * layer  # the one layer a checkpointed backward recomputes
    mlp_tp2 = 2 * (4 * 896 + (2 * 896 + 2 * 128 + 4 * 4864) / 2) + 8 * 896
    assert layer_activation_bytes(SHAPE_05B, 2, tp=2) == mlp_tp2


def test_logits_are_one_chunk_of_the_lm_head():
    rows = 2**28 // 151936  # roll.models.logprobs.CHUNK_ELEMENTS logits per chunk
    assert chunk_tokens(151936) == rows == 1766
    assert logit_bytes(SHAPE_05B, 2, 8192, compiled=True, backward=True) == rows * 151936 * 2 * 2
    assert logit_bytes(SHAPE_05B, 2, 8192, compiled=False, backward=True) == rows * 151936 * (2 * 2 + 3 * 4)
    assert logit_bytes(SHAPE_05B, 2, 100, compiled=True, backward=False) == 100 * 151936 * 2
    assert logit_bytes(SHAPE_05B, 4, 8192, compiled=False, backward=True) == rows * 151936 * (2 * 4 + 2 * 4)


# ---------------------------------------------------------------------------- deepspeed_train, ZeRO 0 / 2 / 3
@pytest.mark.parametrize("stage,world", [(0, 1), (2, 4), (3, 4)])
def test_zero_stages_shard_states_over_the_ranks(tmp_path, models, stage, world):
    train = worker(
        "deepspeed_train",
        {"zero_stage": stage},
        list(range(world)),
        training_args={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4},
    )
    infer = worker("hf_infer", {}, [world])  # a GPU of its own: the trainer's GPUs hold the trainer only
    cfg = load(tmp_path, "zero", gpu_config(models["0.5b"], train, infer))
    plan = plan_memory(cfg, GPU)
    d = world if stage >= 1 else 1  # ranks the optimizer states are sharded over
    expected = {
        "weights": gib(P_05B * 2 / (world if stage == 3 else 1)),
        "gradients": gib(P_05B * 2 / (world if stage >= 2 else 1)),
        "ZeRO reduce bucket": gib(0 if stage == 0 else 500_000_000 * 2 * (2 if stage == 3 else 1)),
        "fp32 master weights": gib(P_05B * 4 / d),
        "Adam moments": gib(P_05B * 8 / d),
    }
    if stage == 3:
        expected["gathered layers"] = gib(2 * LAYER_05B * 2)
    assert terms(plan, "actor_train") == pytest.approx(expected, rel=1e-12)
    offloaded = {0: {"fp32 master weights"}, 2: set(), 3: {"fp32 master weights", "Adam moments"}}[stage]
    assert set(terms(plan, "actor_train", "offloaded")) == offloaded


def test_fp32_training_has_a_master_copy_only_where_deepspeed_makes_one(tmp_path, models):
    for stage, master in ((0, 0), (2, P_05B * 4), (3, 0)):
        train = worker("deepspeed_train", {"zero_stage": stage}, [0], model_args={"dtype": "fp32"})
        plan = plan_memory(load(tmp_path, "fp32", gpu_config(models["0.5b"], train)), GPU)
        assert terms(plan, "actor_train")["fp32 master weights"] == gib(master)
        assert terms(plan, "actor_train")["weights"] == gib(P_05B * 4)


def test_optimizer_offload_leaves_the_reduce_bucket(tmp_path, models):
    train = worker("deepspeed_train", {"zero_stage": 2, "offload_optimizer": "cpu"}, [0])
    got = terms(plan_memory(load(tmp_path, "off", gpu_config(models["0.5b"], train)), GPU), "actor_train")
    assert got["gradients"] == got["fp32 master weights"] == got["Adam moments"] == 0
    assert got["ZeRO reduce bucket"] == gib(500_000_000 * 2)


def test_working_memory_is_the_larger_of_backward_and_optimizer_step(tmp_path, models):
    # no checkpointing, 2 x 2048 tokens: the backward's activations + LM-head chunk beat the step's fp32 copies
    train = worker(
        "deepspeed_train",
        {"zero_stage": 2},
        [0],
        model_args={"disable_gradient_checkpointing": True},
        training_args={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4},
    )
    plan = plan_memory(load(tmp_path, "nock", gpu_config(models["0.5b"], train)), GPU)
    layer = 57344  # test_activations_of_a_layer_and_a_micro_batch
    assert terms(plan, "actor_train", "working") == pytest.approx(
        {
            "activations (4,096 tokens)": gib(4096 * (24 * layer + 2 * 2 * 896)),
            "LM-head chunk": gib(1766 * 151936 * 2 * 2),
        }
    )
    # with checkpointing the step is larger: the fp32 gradient copy and AdamW's foreach temporary, P x 4 each
    plan = plan_memory(load(tmp_path, "ck", gpu_config(models["0.5b"])), GPU)
    assert terms(plan, "actor_train", "working") == pytest.approx(
        {"fp32 gradients at the step": gib(P_05B * 4), "AdamW step temporaries": gib(P_05B * 4)}
    )


def test_checkpointed_backward_peaks_at_the_larger_of_head_and_recomputed_layer(tmp_path, models):
    # LoRA makes the optimizer step small; 8 x 2048 tokens: one recomputed layer (16,384 x 57,344 B = 0.88 GiB)
    # is smaller than the LM-head chunk (1.0 GiB); 32 x 2048: the layer (3.5 GiB) is larger
    for size, peak in ((8, "LM-head chunk"), (32, "recomputed layer")):
        train = worker(
            "deepspeed_train",
            {"zero_stage": 2},
            [0],
            training_args={"per_device_train_batch_size": size, "gradient_accumulation_steps": 1},
        )
        cfg = load(tmp_path, "ckpt", gpu_config(models["0.5b"], train, rollout_batch_size=size * 8))
        cfg.actor_train.model_args.lora_target, cfg.actor_train.model_args.lora_rank = "all-linear", 8
        n = size * 2048
        working = terms(plan_memory(cfg, GPU), "actor_train", "working")
        expected = {"LM-head chunk": gib(1766 * 151936 * 2 * 2), "recomputed layer": gib(n * 57344)}
        assert working == pytest.approx(
            {f"activations ({n:,} tokens)": gib(n * (24 * 2 * 896 + 2 * 2 * 896)), peak: expected[peak]}
        )


# ---------------------------------------------------------------------------- LoRA
def test_lora_freezes_the_base_and_drops_the_reference(tmp_path, models):
    cfg = load(tmp_path, "lora", gpu_config(models["7b"], reference=worker("hf_infer", {}, [0])))
    full = plan_memory(cfg, GPU)
    assert "reference" in full.roles
    cfg.actor_train.model_args.lora_target, cfg.actor_train.model_args.lora_rank = "all-linear", 32
    plan = plan_memory(cfg, GPU)
    assert terms(plan, "actor_train") == pytest.approx(
        {
            "weights": gib((P_7B + ADAPTERS_7B) * 2),  # frozen base + adapters, bf16
            "gradients": gib(ADAPTERS_7B * 2 / 1),
            "ZeRO reduce bucket": gib(500_000_000 * 2),
            "fp32 master weights": gib(ADAPTERS_7B * 4),
            "Adam moments": gib(ADAPTERS_7B * 8),
        },
        rel=1e-12,
    )
    assert "reference" not in plan.roles
    assert any("LoRA computes it" in n for n in plan.notes)


# ---------------------------------------------------------------------------- colocated with SGLang
def sglang_config(model: str, **options) -> dict:
    infer = worker("sglang", {"mem_fraction_static": 0.35, **options}, [0])
    return gpu_config(model, infer=infer)


def test_colocated_sglang_phases(tmp_path, models):
    plan = plan_memory(load(tmp_path, "sgl", sglang_config(models["0.5b"])), GPU)
    rollout, training = column(plan, "rollout"), column(plan, "training")
    engine_weights = P_05B * 2 / GIB
    assert terms(plan, "actor_infer") == pytest.approx(
        {"weights": engine_weights, "KV cache and CUDA graphs": 0.35 * GPU - engine_weights}
    )
    contexts = CUDA_CONTEXT_GIB  # the trainer's process (SGLang's pool includes its scheduler's context)
    # rollout: the engine's pool; the ZeRO-2 trainer offloaded everything; no torch memory to fragment
    assert rollout.row("engine") == pytest.approx(0.35 * GPU)
    assert rollout.row("optimizer") is None
    assert rollout.total == pytest.approx(0.35 * GPU + contexts)
    # training: the engine released all; the trainer's resident + working, 10% fragmentation on top
    trainer = sum(t.gib for t in plan.roles["actor_train"].resident + plan.roles["actor_train"].working)
    assert training.row("engine") is None
    assert training.total == pytest.approx(trainer * (1 + FRAGMENTATION) + contexts)


def test_deepspeed_lora_keeps_its_frozen_base_on_the_gpu_while_offloaded(tmp_path, models):
    """DeepSpeed's offload_states moves what its optimizer holds (the adapters), not the frozen base: the rollout
    column holds it beside the engine's pool (an H200 run measured it there); FSDP2 moves the whole module."""
    cfg = load(tmp_path, "lora-sgl", sglang_config(models["7b"]))
    cfg.actor_train.model_args.lora_target, cfg.actor_train.model_args.lora_rank = "all-linear", 32
    plan = plan_memory(cfg, GPU)
    base = (P_7B + ADAPTERS_7B) * 2 / GIB
    assert [(t.what, t.gib) for t in plan.roles["actor_train"].offloaded] == [
        ("frozen base weights (not offloaded)", pytest.approx(base))
    ]
    rollout = column(plan, "rollout")
    assert rollout.row("weights") == pytest.approx(base)
    # the trainer's context (SGLang's pool includes its own); torch memory (the base) fragments, the pool does not
    assert rollout.total == pytest.approx(0.35 * GPU + base * (1 + FRAGMENTATION) + CUDA_CONTEXT_GIB)
    cfg.actor_train.model_args.lora_target = cfg.actor_train.model_args.lora_rank = None  # full weights: all moves
    assert plan_memory(cfg, GPU).roles["actor_train"].offloaded == ()


def test_colocated_offload_never_keeps_everything(tmp_path, models):
    plan = plan_memory(load(tmp_path, "never", {**sglang_config(models["0.5b"]), "colocated_offload": "never"}), GPU)
    resident = sum(t.gib for t in plan.roles["actor_train"].resident)
    working = sum(t.gib for t in plan.roles["actor_train"].working)
    contexts = CUDA_CONTEXT_GIB
    assert column(plan, "rollout").total == pytest.approx(0.35 * GPU + resident * (1 + FRAGMENTATION) + contexts)
    training = 0.35 * GPU + (resident + working) * (1 + FRAGMENTATION) + contexts
    assert column(plan, "training").total == pytest.approx(training)


def test_release_tags_keep_what_they_do_not_release(tmp_path, models):
    plan = plan_memory(load(tmp_path, "tags", sglang_config(models["0.5b"], release_tags=["kv_cache"])), GPU)
    assert column(plan, "training").row("engine") == pytest.approx(P_05B * 2 / GIB)  # the weights stay


# ---------------------------------------------------------------------------- FSDP2, Megatron, hf_infer
def test_fsdp2_accumulating_keeps_unsharded_fp32_gradients(tmp_path, models):
    train = worker(
        "fsdp2_train",
        {},
        [0, 1, 2, 3],
        training_args={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 2},
    )
    plan = plan_memory(load(tmp_path, "fsdp", gpu_config(models["0.5b"], train, worker("hf_infer", {}, [4]))), GPU)
    assert terms(plan, "actor_train") == pytest.approx(
        {
            "fp32 parameter shards": gib(P_05B * 4 / 4),
            "gathered layers": gib(2 * LAYER_05B * 2),
            "gradient shards": gib(P_05B * 4 / 4),
            "unsharded accumulated gradients": gib(P_05B * 4),
            "Adam moments": gib(P_05B * 8 / 4),
        }
    )


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_megatron_splits_the_model_by_tp_and_pp(tmp_path, models, tp, pp):
    options = {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp}
    train = worker("megatron_train", options, [0, 1])
    plan = plan_memory(load(tmp_path, "mcore", gpu_config(models["7b"], train, worker("hf_infer", {}, [2]))), GPU)
    rank = P_7B / 2 if pp == 1 else 14 * LAYER_7B + 151936 * 3584 + 3584  # TP half, or the larger stage
    assert terms(plan, "actor_train") == pytest.approx(
        {
            "weights": gib(rank * 2),
            "fp32 gradient buffer": gib(rank * 4),
            "fp32 master weights": gib(rank * 4),
            "Adam moments": gib(rank * 8),
        }
    )


def test_megatron_logits_are_not_chunked_and_the_refusal_offers_a_smaller_log_prob_batch(tmp_path, models):
    train = worker(
        "megatron_train",
        {},
        [0],
        training_args={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4},
        infer_batch_size=16,
    )
    cfg = load(tmp_path, "mlogits", gpu_config(models["0.5b"], train, worker("hf_infer", {}, [1])))
    plan = plan_memory(cfg, GPU)
    m = 16 * 2048  # the log-prob forward's tokens: (m, V) logits in fp32 plus its shifted and exp copies
    assert terms(plan, "actor_train", "working") == pytest.approx(
        {
            f"log-prob forward ({m:,} tokens)": gib(m * 2 * (3 * 896 + 3 * 4864)),
            "logits": gib(m * 151936 * (2 + 3 * 4)),
        }
    )
    assert not plan.fits
    assert "a smaller log-prob micro-batch (actor_train.infer_batch_size=8) -> " in memory_plan.refusal(cfg, plan)


def test_hf_infer_generation_holds_its_batch_kv_cache(tmp_path, models):
    plan = plan_memory(load(tmp_path, "hf", gpu_config(models["0.5b"])), GPU)
    kv_per_token = 2 * 24 * 128 * 2  # keys and values, 24 layers, 2 KV heads x 64, bf16
    assert terms(plan, "actor_infer", "working") == pytest.approx(
        {"KV cache of 64 sequences": gib(64 * 2048 * kv_per_token), "kept turns' KV": gib(1024 * 2**20)}
    )
    assert terms(plan, "actor_infer") == pytest.approx({"weights": gib(P_05B * 2)})


def test_critic_is_a_trainer_with_a_value_head_in_its_own_row(tmp_path, models):
    critic = worker(
        "deepspeed_train",
        {"zero_stage": 2},
        [0],
        training_args={"per_device_train_batch_size": 2, "gradient_accumulation_steps": 4},
    )
    cfg = load(tmp_path, "gae", {**gpu_config(models["0.5b"]), "critic": critic, "adv_estimator": "gae"})
    plan = plan_memory(cfg, GPU)
    p = P_05B + 896 + 1  # the value head h -> 1 in place of the (tied) LM head
    assert terms(plan, "critic") == pytest.approx(
        {
            "weights": gib(p * 2),
            "gradients": gib(p * 2),
            "ZeRO reduce bucket": gib(500_000_000 * 2),
            "fp32 master weights": gib(p * 4),
            "Adam moments": gib(p * 8),
        }
    )
    assert "LM-head chunk" not in {t.what for t in plan.roles["critic"].working}  # values, not logits
    critic_total = sum(t.gib for t in plan.roles["critic"].resident + plan.roles["critic"].working)
    assert column(plan, "training").row("critic") == pytest.approx(critic_total)


def test_a_strategy_without_memory_model_is_named_not_guessed(tmp_path, models):
    cfg = load(tmp_path, "unk", gpu_config(models["0.5b"], reference=worker("hf_infer", {}, [0])))
    cfg.reference.strategy_args.strategy_name = "my_backend"
    plan = plan_memory(cfg, GPU)
    assert "reference" not in plan.roles
    assert any("reference not estimated: strategy 'my_backend' has no memory model" in n for n in plan.notes)


# ---------------------------------------------------------------------------- the refusal at launch
def test_7b_full_weights_on_one_80gb_gpu_refused_in_one_line(tmp_path, models, monkeypatch, capsys):
    config_path, name = save(tmp_path, "full7b", gpu_config(models["7b"], num_gpus_per_node=1))
    monkeypatch.setattr("roll.launch.command.visible_gpus", lambda: 1)

    def never_started(cfg):
        raise AssertionError("the pipeline started")

    assert run_pipeline(["--config-name", name, "--config-path", config_path], AgenticConfig, never_started, "") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert re.match(
        r"roll: config error: memory: \d+\.\d GiB needed on GPU 0 in the training phase "
        r"\(actor_train Adam moments 56\.7 GiB the largest\) > 79\.2 GiB: .*"
        r"LoRA \(actor_train\.model_args\.lora_target=all-linear "
        r"actor_train\.model_args\.lora_rank=32\) -> \d+\.\d GiB",
        err[0],
    ), err[0]
    assert gib(P_7B * 8) == pytest.approx(56.73, abs=0.005)


def test_7b_lora_accepted_and_estimate_printed(tmp_path, models, capsys):
    cfg = load(tmp_path, "lora7b", gpu_config(models["7b"]))
    cfg.actor_train.model_args.lora_target, cfg.actor_train.model_args.lora_rank = "all-linear", 32
    preflight(cfg)
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("[roll] memory estimate: "))
    assert re.search(r"peak \d+\.\d of 79\.2 GiB on GPU 0 in the (rollout|training) phase", line)


def test_each_proposed_change_shows_the_estimate_of_that_change(tmp_path, models):
    cfg = load(tmp_path, "full7b", gpu_config(models["7b"]))
    plan = plan_memory(cfg, GPU)
    assert not plan.fits
    proposals = dict(suggestions(cfg, plan))
    by_label = {w.label: w for w in what_ifs(cfg, plan)}
    assert "LoRA (actor_train.model_args.lora_target=all-linear actor_train.model_args.lora_rank=32)" in proposals
    for label, peak in proposals.items():
        assert plan_memory(changed(cfg, by_label[label].changes), GPU).peak().total == pytest.approx(peak)
        assert peak < plan.peak().total
    assert cfg.actor_train.strategy_args.strategy_config == {"zero_stage": 2}  # the what-ifs changed copies


def test_memory_check_warn_and_off(tmp_path, models, capsys):
    cfg = load(tmp_path, "warn", {**gpu_config(models["7b"]), "memory_check": "warn"})
    warnings = preflight(cfg)
    assert [w for w in warnings if w.startswith("memory: ")]
    assert "roll: config warning: memory: " in capsys.readouterr().err
    cfg = load(tmp_path, "off", {**gpu_config(models["7b"]), "memory_check": "off"})
    preflight(cfg)
    assert "memory" not in capsys.readouterr().out
    with pytest.raises(MemoryPlanError, match=r"^memory: .* needed on GPU 0"):
        memory_plan.check_memory(load(tmp_path, "ref", gpu_config(models["7b"])))


def test_memory_check_is_a_config_key_with_choices(tmp_path, models):
    with pytest.raises(ConfigError, match="memory_check"):
        load(tmp_path, "bad", {**gpu_config(models["0.5b"]), "memory_check": "sometimes"})


def test_gpu_memory_sources_in_order(tmp_path, models, monkeypatch):
    cfg = load(tmp_path, "src", gpu_config(models["0.5b"]))
    assert memory_plan.gpu_memory(cfg) == (79.2, "gpu_memory_gib")
    assert memory_plan.gpu_memory(cfg, 139.8) == (139.8, "--gpu-memory-gib")
    monkeypatch.setattr(memory_plan, "detected_gpu_gib", lambda: 93.1)
    assert memory_plan.gpu_memory(cfg) == (93.1, "this machine's GPU 0")
    monkeypatch.setattr(memory_plan, "detected_gpu_gib", lambda: None)
    cfg.gpu_memory_gib = None
    assert memory_plan.gpu_memory(cfg) == (None, "")
    assert memory_plan.check_memory(cfg) == [
        "memory_check: no GPU is visible here and gpu_memory_gib is unset: the memory estimate was skipped"
    ]


# ---------------------------------------------------------------------------- roll doctor
def test_doctor_prints_the_table_and_fails_a_refused_config(tmp_path, models, capsys):
    config_path, name = save(tmp_path, "full7b", gpu_config(models["7b"]))
    args = argparse.Namespace(config_name=name, config_path=config_path, overrides=[], gpu_memory_gib=79.2)
    assert doctor.run(args) == 1
    out = capsys.readouterr().out
    table = out[out.index("roll doctor: GPU memory estimate") :]
    header = table.splitlines()[2]
    assert header.split() == ["term", "GPU", "0", "rollout", "GPU", "0", "training"]
    rows = [line.split()[0] for line in table.splitlines()[3:14]]
    assert rows == [*memory_plan.ROWS, "total", "free"]
    assert re.search(
        r"^gpu memory\s+estimated peak <= GPU memory\s+\d+\.\d GiB on GPU 0 \(training\)\s+error", out, re.M
    )
    assert "LoRA (actor_train.model_args.lora_target=all-linear actor_train.model_args.lora_rank=32)" in out


def test_doctor_row_of_a_fitting_config_and_of_an_unknown_gpu(tmp_path, models):
    cfg = load(tmp_path, "small", gpu_config(models["0.5b"]))
    table, row = doctor.memory_check(cfg, 79.2)
    assert row.status is doctor.Status.OK and "total" in table
    cfg.gpu_memory_gib = None
    table, row = doctor.memory_check(cfg, None)
    assert row.status is doctor.Status.OPTIONAL_MISSING and "--gpu-memory-gib" in row.fix and table == ""
