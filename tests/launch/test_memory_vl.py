"""The memory planner on vision-language models (Qwen2.5-VL, Qwen2-VL): the decoder read from ``text_config``, the
vision tower's parameters from ``vision_config``, counted by hand and against transformers' own count (models built
on the meta device: no weights), in every place the planner counts weights; ``roll doctor`` on the 3B config."""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import pytest
import torch

from roll.launch import doctor, memory_plan
from roll.launch.memory import GIB, LINEAR_MODULES, ModelShape
from roll.launch.memory_plan import plan_memory
from tests.launch.memory_configs import gpu_config, load, worker, write_model

ROOT = Path(__file__).resolve().parents[2]
GPU = 79.2


def _published_shapes() -> tuple[dict, dict]:
    """Qwen2.5-VL-3B's ``text_config`` and ``vision_config`` (scripts/build_qwen05b_rand.py: VL3B_TEXT, VL3B_VISION)."""
    spec = importlib.util.spec_from_file_location("build_rand", ROOT / "scripts" / "build_qwen05b_rand.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.VL3B_TEXT, module.VL3B_VISION


VL3B_TEXT, VL3B_VISION = _published_shapes()
#: Qwen2.5-VL-3B's config.json as transformers 5 writes it: the decoder under text_config, the tower under
#: vision_config, tie_word_embeddings at both levels.
VL3B = {
    "model_type": "qwen2_5_vl",
    "tie_word_embeddings": True,
    "text_config": {**VL3B_TEXT, "model_type": "qwen2_5_vl_text"},
    "vision_config": {**VL3B_VISION, "model_type": "qwen2_5_vl_vision"},
}
#: A tiny Qwen2.5-VL with every width distinct (a dropped or swapped term changes the count) and an untied head.
TINY_TEXT = dict(
    hidden_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=160,
    vocab_size=1000,
    tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 1]},
    bos_token_id=None,
    eos_token_id=1,
)
TINY_VISION = dict(
    depth=2,
    hidden_size=48,
    intermediate_size=72,
    num_heads=2,
    out_hidden_size=96,
    patch_size=7,
    spatial_merge_size=2,
    temporal_patch_size=2,
    fullatt_block_indexes=[1],
)
#: A tiny Qwen2-VL: its tower's width is embed_dim (hidden_size is the decoder's), MLP fc1/fc2 of embed_dim x
#: mlp_ratio, LayerNorms with biases.
TINY_QWEN2_VISION = dict(
    depth=2, embed_dim=48, mlp_ratio=3, num_heads=2, hidden_size=96, patch_size=7, spatial_merge_size=2
)

# ---------------------------------------------------------------------------- Qwen2.5-VL-3B, by hand
# the decoder: h 2048, q 16 x 128 = 2048, kv 2 x 128 = 256, I 11008, V 151936, 36 layers, q/k/v biases, tied head
LAYER_VL3B = (2048 * 2048 + 2048) + 2 * (2048 * 256 + 256) + 2048 * 2048 + 3 * 2048 * 11008 + 2 * 2048
DECODER_VL3B = 151936 * 2048 + 36 * LAYER_VL3B + 2048
# the tower: w 1280, m 3420, 32 blocks; every linear with its bias, RMSNorms of weight only
BLOCK_VL3B = (
    (1280 + 1) * 3 * 1280  # qkv
    + (1280 + 1) * 1280  # proj
    + 2 * (1280 + 1) * 3420  # gate_proj, up_proj
    + (3420 + 1) * 1280  # down_proj
    + 2 * 1280  # norm1, norm2
)
PATCH_VL3B = 3 * 2 * 14 * 14 * 1280  # Conv3d (in_channels x temporal x patch x patch -> w), no bias
MERGER_VL3B = 1280 + (4 * 1280 + 1) * 4 * 1280 + (4 * 1280 + 1) * 2048  # ln_q, w 4 -> w 4 -> decoder's h
VISION_VL3B = PATCH_VL3B + 32 * BLOCK_VL3B + MERGER_VL3B
P_VL3B = DECODER_VL3B + VISION_VL3B


def transformers_count(config) -> int:
    """``sum(p.numel())`` of the transformers model of ``config``, built on the meta device."""
    from transformers import AutoModelForImageTextToText

    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    return sum(p.numel() for p in model.parameters())


def qwen25_vl(text: dict, vision: dict):
    from transformers import Qwen2_5_VLConfig

    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=text["tie_word_embeddings"])


@pytest.fixture(autouse=True)
def no_gpu_here(monkeypatch):
    monkeypatch.setattr(memory_plan, "detected_gpu_gib", lambda: None)


def test_vl3b_counts_the_decoder_and_the_vision_tower_by_hand():
    shape = ModelShape.from_config(VL3B)
    assert VISION_VL3B == 668_684_288 and P_VL3B == 3_754_622_976  # transformers' counts of Qwen2.5-VL-3B
    assert (shape.hidden, shape.layers, shape.kv_dim, shape.intermediate, shape.vocab) == (2048, 36, 256, 11008, 151936)
    assert shape.tied and shape.qkv_bias  # qwen2_5_vl_text: biases like qwen2
    assert shape.vision_params() == VISION_VL3B
    assert shape.params() == P_VL3B
    assert shape.params(value_head=True) == P_VL3B + 2048 + 1
    # the vision tower sits on the first pipeline stage, with the embedding
    assert shape.stage_params(2) == 18 * LAYER_VL3B + 151936 * 2048 + 2048 + VISION_VL3B
    # tie_word_embeddings at either level ties the head, as transformers does; neither: an untied head
    top_only = {**VL3B, "text_config": {**VL3B["text_config"], "tie_word_embeddings": False}}
    assert ModelShape.from_config(top_only).params() == P_VL3B
    untied = {**top_only, "tie_word_embeddings": False}
    assert ModelShape.from_config(untied).params() == P_VL3B + 151936 * 2048


@pytest.mark.parametrize(
    "name",
    ["qwen2.5-vl-3b", "qwen2.5-vl-tiny", "qwen2-vl-tiny"],
)
def test_parameters_equal_transformers_count(name):
    """The planner's P against transformers' model of the same config.json (as saved, and its dict)."""
    from transformers import Qwen2VLConfig

    if name == "qwen2.5-vl-3b":
        config = qwen25_vl(VL3B_TEXT, VL3B_VISION)
    elif name == "qwen2.5-vl-tiny":
        config = qwen25_vl(TINY_TEXT, TINY_VISION)
    else:
        config = Qwen2VLConfig(text_config=TINY_TEXT, vision_config=TINY_QWEN2_VISION, tie_word_embeddings=False)
    expected = transformers_count(config)
    assert ModelShape.from_config(config.to_dict()).params() == expected
    if name == "qwen2.5-vl-3b":
        assert expected == P_VL3B
        assert ModelShape.from_config(VL3B).params() == expected


def test_qwen2_vl_tower_by_hand():
    """Qwen2-VL's tower: fc1/fc2 MLP of w x mlp_ratio, LayerNorms with biases; a flat config.json (the decoder's keys
    at the top, as Qwen2-VL's published files are) reads the same."""
    w, m, out = 48, 3 * 48, 96
    block = (w + 1) * 3 * w + (w + 1) * w + (w + 1) * m + (m + 1) * w + 2 * 2 * w
    merger = 2 * w + (4 * w + 1) * 4 * w + (4 * w + 1) * out
    vision = 3 * 2 * 7 * 7 * w + 2 * block + merger
    flat = {"model_type": "qwen2_vl", **TINY_TEXT, "vision_config": {**TINY_QWEN2_VISION, "in_chans": 3}}
    shape = ModelShape.from_config(flat)
    assert shape.vision_params() == vision
    assert shape.qkv_bias and not shape.tied


def test_vision_towers_it_does_not_know_are_refused_in_one_line():
    clip = {**VL3B, "model_type": "llava", "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024}}
    with pytest.raises(ValueError, match="vision tower of type 'clip_vision_model'; the memory planner knows"):
        ModelShape.from_config(clip)
    lacking = {**VL3B, "vision_config": {k: v for k, v in VL3B["vision_config"].items() if k != "depth"}}
    with pytest.raises(ValueError, match="vision_config lacks depth"):
        ModelShape.from_config(lacking)
    with pytest.raises(ValueError, match="lacks hidden_size"):  # no decoder keys at either level
        ModelShape.from_config({"model_type": "qwen2_5_vl", "vision_config": VL3B["vision_config"]})


@pytest.mark.parametrize("target", ["all-linear", "q_proj,v_proj", "gate_proj,up_proj", "qkv,o_proj"])
def test_lora_adapters_equal_peft_count(target):
    """peft targets the tower's linears too: all of them (merger included) with all-linear, and by name (the tower's
    MLP shares the decoder's gate/up/down names)."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    from roll.config.lora import LoraSettings, parse_target
    from roll.models.lora import add_adapters

    config = qwen25_vl(TINY_TEXT, TINY_VISION)
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(config)
    names = parse_target(target, "lora_target")
    wrapped = add_adapters(model, LoraSettings(rank=4, alpha=8.0, dropout=0.0, target=names))
    adapters = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
    shape = ModelShape.from_config(config.to_dict())
    assert shape.lora_params(4, LINEAR_MODULES if isinstance(names, str) else names) == adapters


def test_lora_on_the_tower_by_hand():
    shape = ModelShape.from_config(VL3B)
    decoder = 36 * ((2048 + 2048) + 2 * (2048 + 256) + (2048 + 2048) + 2 * (2048 + 11008) + (11008 + 2048))
    tower = 32 * ((1280 + 3 * 1280) + (1280 + 1280) + 2 * (1280 + 3420) + (3420 + 1280))
    merger = (4 * 1280 + 4 * 1280) + (4 * 1280 + 2048)
    assert shape.lora_params(32, LINEAR_MODULES) == 32 * (decoder + tower + merger)
    assert shape.lora_params(8, ("q_proj", "v_proj")) == 8 * 36 * ((2048 + 2048) + (2048 + 256))  # decoder only


# ---------------------------------------------------------------------------- the plan: weights, states, engine
@pytest.fixture(scope="module")
def vl3b(tmp_path_factory) -> str:
    return write_model(tmp_path_factory.mktemp("models"), "vl3b", VL3B)


def sglang_config(model: str) -> dict:
    return gpu_config(model, infer=worker("sglang", {"mem_fraction_static": 0.3}, [0]))


def terms(plan, role: str, state: str = "resident") -> dict[str, float]:
    return {t.what: t.gib for t in getattr(plan.roles[role], state)}


def test_plan_counts_the_tower_in_weights_states_and_engine(tmp_path, vl3b):
    cfg = load(tmp_path, "vl", sglang_config(vl3b))
    plan = plan_memory(cfg, GPU)
    p = P_VL3B
    assert terms(plan, "actor_train") == pytest.approx(
        {
            "weights": p * 2 / GIB,  # 6.99 GiB in bf16
            "gradients": p * 2 / GIB,
            "ZeRO reduce bucket": 500_000_000 * 2 / GIB,
            "fp32 master weights": p * 4 / GIB,
            "Adam moments": p * 8 / GIB,
        },
        rel=1e-12,
    )
    assert terms(plan, "actor_infer")["weights"] == pytest.approx(p * 2 / GIB, rel=1e-12)


def test_frozen_vision_tower_has_no_gradients_or_optimizer_state(tmp_path, vl3b):
    """freeze_vision_tower: the tower's weights stay, its gradients and Adam states go; DeepSpeed's offload_states
    (ZeRO 1-3) moves what its optimizer holds, so the frozen tower stays on the GPU in the rollout phase."""
    cfg = load(tmp_path, "frozen", sglang_config(vl3b))
    cfg.actor_train.model_args.freeze_vision_tower = True
    plan = plan_memory(cfg, GPU)
    trained = DECODER_VL3B
    resident = terms(plan, "actor_train")
    assert resident["weights"] == pytest.approx(P_VL3B * 2 / GIB, rel=1e-12)
    assert resident["gradients"] == pytest.approx(trained * 2 / GIB, rel=1e-12)
    assert resident["fp32 master weights"] == pytest.approx(trained * 4 / GIB, rel=1e-12)
    assert resident["Adam moments"] == pytest.approx(trained * 8 / GIB, rel=1e-12)
    assert terms(plan, "actor_train", "offloaded") == pytest.approx(
        {"frozen vision tower (not offloaded)": VISION_VL3B * 2 / GIB}, rel=1e-12
    )


def test_lora_counts_the_tower_in_the_frozen_base(tmp_path, vl3b):
    cfg = load(tmp_path, "lora", sglang_config(vl3b))
    cfg.actor_train.model_args.lora_target, cfg.actor_train.model_args.lora_rank = "all-linear", 32
    plan = plan_memory(cfg, GPU)
    adapters = ModelShape.from_config(VL3B).lora_params(32, LINEAR_MODULES)
    resident = terms(plan, "actor_train")
    assert resident["weights"] == pytest.approx((P_VL3B + adapters) * 2 / GIB, rel=1e-12)
    assert resident["Adam moments"] == pytest.approx(adapters * 8 / GIB, rel=1e-12)


def test_reference_holds_the_tower_once(tmp_path, vl3b):
    cfg = load(tmp_path, "ref", gpu_config(vl3b, reference=worker("hf_infer", {}, [0])))
    plan = plan_memory(cfg, GPU)
    assert terms(plan, "reference")["weights"] == pytest.approx(P_VL3B * 2 / GIB, rel=1e-12)


def test_doctor_plans_the_vl3b_config(vl3b, capsys):
    """The shipped sokoban_vl3b_sglang.yaml: planned (no 'not estimated' note), 7.0 GiB of bf16 weights."""
    args = argparse.Namespace(
        config_name="sokoban_vl3b_sglang", config_path=None, overrides=[f"pretrain={vl3b}"], gpu_memory_gib=GPU
    )
    doctor.run(args)
    out = capsys.readouterr().out
    table = out[out.index("roll doctor: GPU memory estimate") :]
    assert "not estimated" not in out
    weights = next(line for line in table.splitlines() if line.startswith("weights"))
    assert weights.split()[-1] == f"{P_VL3B * 2 / GIB:.1f}" == "7.0"
