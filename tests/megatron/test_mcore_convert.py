"""HF <-> megatron-core weight layout (pure tensor code): fused QKV by KV group, [gate; up] fc1, TP shards."""

from __future__ import annotations

import pytest
import torch

from roll.models.mcore import convert

SHAPE = convert.AttentionShape(num_heads=4, num_groups=2, head_dim=3)


def test_fuse_qkv_orders_each_group_as_its_queries_then_key_then_value():
    # rows of q: heads 0..3 x 3 dims, value = 100 + row; k: 200 + row; v: 300 + row (one column)
    q = 100 + torch.arange(12.0)[:, None]
    k = 200 + torch.arange(6.0)[:, None]
    v = 300 + torch.arange(6.0)[:, None]
    fused = convert.fuse_qkv(q, k, v, SHAPE)[:, 0].tolist()
    group0 = [100, 101, 102, 103, 104, 105, 200, 201, 202, 300, 301, 302]  # heads 0-1, k head 0, v head 0
    group1 = [106, 107, 108, 109, 110, 111, 203, 204, 205, 303, 304, 305]
    assert fused == group0 + group1


def test_split_qkv_inverts_fuse_and_works_on_one_tp_shard():
    q, k, v = torch.randn(12, 5), torch.randn(6, 5), torch.randn(6, 5)
    fused = convert.fuse_qkv(q, k, v, SHAPE)
    assert all(torch.equal(a, b) for a, b in zip(convert.split_qkv(fused, SHAPE), (q, k, v)))
    q1, k1, v1 = convert.split_qkv(convert.shard(fused, "qkv", 1, 2), SHAPE)  # TP rank 1 holds group 1
    assert torch.equal(q1, q[6:]) and torch.equal(k1, k[3:]) and torch.equal(v1, v[3:])


@pytest.mark.parametrize(
    "kind, shape", [("qkv", (24, 4)), ("vocab", (8, 4)), ("row", (4, 8)), ("fc1", (16, 4)), ("none", (4,))]
)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_shard_then_unshard_is_identity(kind, shape, tp):
    full = torch.randn(*shape)
    shards = [convert.shard(full, kind, r, tp) for r in range(tp)]
    assert torch.equal(convert.unshard(shards, kind), full)


def test_fc1_shard_holds_its_gate_rows_then_its_up_rows():
    gate, up = torch.arange(4.0)[:, None], 10 + torch.arange(4.0)[:, None]
    fc1 = convert.hf_to_mcore(
        "decoder.layers.0.mlp.linear_fc1.weight",
        {"model.layers.0.mlp.gate_proj.weight": gate, "model.layers.0.mlp.up_proj.weight": up},
        SHAPE,
    )
    assert convert.shard(fc1, "fc1", 1, 2)[:, 0].tolist() == [2, 3, 12, 13]


def test_hf_round_trip_of_every_weight_of_a_tiny_qwen2(tiny_model_dir):
    """HF state dict -> full mcore tensors -> TP=2 shards -> unshard -> HF: bit-identical, every name covered."""
    from transformers import AutoConfig, AutoModelForCausalLM

    hf_cfg = AutoConfig.from_pretrained(tiny_model_dir)
    state = dict(AutoModelForCausalLM.from_pretrained(tiny_model_dir).named_parameters())
    shape = convert.AttentionShape.from_hf(hf_cfg)
    names = convert.mcore_names(hf_cfg.num_hidden_layers, tied=hf_cfg.tie_word_embeddings, qkv_bias=True)
    back = {}
    for name in names:
        keys, kind = convert.hf_names(name)
        full = convert.hf_to_mcore(name, {k: state[k].detach() for k in keys}, shape)
        shards = [convert.shard(full, kind, r, 2) for r in range(2)]
        back.update(convert.mcore_to_hf(name, convert.unshard(shards, kind), shape))
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[n], state[n].detach()) for n in state)


def test_untied_llama_names_include_the_lm_head_and_no_qkv_bias():
    names = convert.mcore_names(1, tied=False, qkv_bias=False)
    assert "output_layer.weight" in names and not any(n.endswith("linear_qkv.bias") for n in names)
    assert convert.hf_names("output_layer.weight") == (("lm_head.weight",), "vocab")
    with pytest.raises(KeyError, match="no Hugging Face mapping"):
        convert.hf_names("decoder.layers.0.mlp.router.weight")


def test_vocab_is_padded_to_a_multiple_of_tp():
    assert convert.padded_vocab_size(151936, 8) == 151936 and convert.padded_vocab_size(10, 4) == 12
    assert convert.pad_vocab(torch.ones(10, 2), 12)[10:].abs().sum() == 0
