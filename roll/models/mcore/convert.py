"""Hugging Face <-> megatron-core weights for decoder-only Qwen2/Qwen2.5 and Llama models (pure tensor code).

Names on the megatron side are those of ``GPTModel`` built with ``get_gpt_layer_local_spec()`` (separate norm
modules, no Transformer Engine fusion). Per layer ``i`` (global index):

| Hugging Face (``model.layers.i.``)                    | megatron-core (``decoder.layers.i.``)      | TP split |
| ---                                                   | ---                                        | ---      |
| ``self_attn.{q,k,v}_proj.weight`` / ``.bias``         | ``self_attention.linear_qkv.weight/bias``  | by query group |
| ``self_attn.o_proj.weight``                           | ``self_attention.linear_proj.weight``      | dim 1    |
| ``mlp.gate_proj.weight``, ``mlp.up_proj.weight``      | ``mlp.linear_fc1.weight`` ([gate; up])     | each dim 0 |
| ``mlp.down_proj.weight``                              | ``mlp.linear_fc2.weight``                  | dim 1    |
| ``input_layernorm.weight``                            | ``input_layernorm.weight``                 | none     |
| ``post_attention_layernorm.weight``                   | ``pre_mlp_layernorm.weight``               | none     |

plus ``model.embed_tokens.weight`` -> ``embedding.word_embeddings.weight`` (vocab on dim 0), ``model.norm.weight``
-> ``decoder.final_layernorm.weight`` and, untied only, ``lm_head.weight`` -> ``output_layer.weight`` (vocab on
dim 0). The fused QKV weight holds, for each of the ``G`` query groups, the group's ``H/G`` query heads then its
key head then its value head (each ``head_dim`` rows): shape ``(G * (H/G + 2) * head_dim, hidden)``. A TP rank
holds ``G / TP`` whole groups; the fused fc1 of a TP rank holds its gate rows then its up rows.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
HF_LAYER = "model.layers.{i}."
MC_LAYER = "decoder.layers.{i}."
#: mcore suffix -> (HF suffixes in HF order, TP split kind); "qkv" and "fc1" fuse several HF tensors.
LAYER_MAP: dict[str, tuple[tuple[str, ...], str]] = {
    "self_attention.linear_qkv.weight": (
        ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"),
        "qkv",
    ),
    "self_attention.linear_qkv.bias": (
        ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"),
        "qkv",
    ),
    "self_attention.linear_proj.weight": (("self_attn.o_proj.weight",), "row"),
    "mlp.linear_fc1.weight": (("mlp.gate_proj.weight", "mlp.up_proj.weight"), "fc1"),
    "mlp.linear_fc2.weight": (("mlp.down_proj.weight",), "row"),
    "input_layernorm.weight": (("input_layernorm.weight",), "none"),
    "pre_mlp_layernorm.weight": (("post_attention_layernorm.weight",), "none"),
}
#: Weights outside the layers: mcore name -> (HF name, TP split kind).
GLOBAL_MAP: dict[str, tuple[str, str]] = {
    "embedding.word_embeddings.weight": ("model.embed_tokens.weight", "vocab"),
    "decoder.final_layernorm.weight": ("model.norm.weight", "none"),
    "output_layer.weight": ("lm_head.weight", "vocab"),
}


@dataclass(frozen=True)
class AttentionShape:
    """Head layout of a model: ``num_heads`` query heads in ``num_groups`` KV groups of ``head_dim``."""

    num_heads: int
    num_groups: int
    head_dim: int

    @classmethod
    def from_hf(cls, hf_config) -> AttentionShape:
        """From a transformers config (``num_key_value_heads`` defaults to the head count: no GQA)."""
        heads = int(hf_config.num_attention_heads)
        groups = int(getattr(hf_config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads)
        return cls(heads, groups, head_dim)


def hf_names(mcore_name: str) -> tuple[tuple[str, ...], str]:
    """HF names of the tensors that mcore weight ``mcore_name`` holds (global layer index), and its TP split kind."""
    m = LAYER.match(mcore_name)
    if m:
        i, suffix = m.groups()
        if suffix not in LAYER_MAP:
            raise KeyError(f"megatron weight {mcore_name!r} has no Hugging Face mapping (Qwen2/Llama layers)")
        names, kind = LAYER_MAP[suffix]
        return tuple(HF_LAYER.format(i=i) + n for n in names), kind
    if mcore_name not in GLOBAL_MAP:
        raise KeyError(f"megatron weight {mcore_name!r} has no Hugging Face mapping; known: {sorted(GLOBAL_MAP)}")
    name, kind = GLOBAL_MAP[mcore_name]
    return (name,), kind


def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: AttentionShape) -> torch.Tensor:
    """HF q (H*d, ...), k (G*d, ...), v (G*d, ...) -> mcore fused QKV (G*(H/G+2)*d, ...), grouped per KV group."""
    g, d = shape.num_groups, shape.head_dim
    rest = q.shape[1:]
    q = q.reshape(g, (shape.num_heads // g) * d, *rest)  # (G, H/G*d, ...)
    k, v = k.reshape(g, d, *rest), v.reshape(g, d, *rest)
    return torch.cat([q, k, v], dim=1).reshape(-1, *rest)


def split_qkv(qkv: torch.Tensor, shape: AttentionShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inverse of :func:`fuse_qkv` for ``qkv`` holding ``n`` whole groups (any n <= G): q (n*H/G*d, ...), k, v."""
    d, per = shape.head_dim, shape.num_heads // shape.num_groups
    rest = qkv.shape[1:]
    grouped = qkv.reshape(-1, (per + 2) * d, *rest)  # (n, (H/G + 2) * d, ...)
    q, k, v = grouped.split([per * d, d, d], dim=1)
    return q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)


def hf_to_mcore(mcore_name: str, hf: dict[str, torch.Tensor], shape: AttentionShape) -> torch.Tensor:
    """The full (unsharded) mcore tensor ``mcore_name`` built from the HF tensors ``hf`` (a name -> tensor map)."""
    names, kind = hf_names(mcore_name)
    parts = [hf[n] for n in names]
    if kind == "qkv":
        return fuse_qkv(*parts, shape)
    if kind == "fc1":
        return torch.cat(parts, dim=0)
    return parts[0]


def mcore_to_hf(mcore_name: str, full: torch.Tensor, shape: AttentionShape) -> list[tuple[str, torch.Tensor]]:
    """``(HF name, tensor)`` pairs held by the full mcore tensor ``mcore_name`` (views where possible)."""
    names, kind = hf_names(mcore_name)
    if kind == "qkv":
        parts = split_qkv(full, shape)
    elif kind == "fc1":
        parts = full.chunk(2, dim=0)
    else:
        parts = (full,)
    return list(zip(names, parts))


def shard(full: torch.Tensor, kind: str, tp_rank: int, tp_size: int) -> torch.Tensor:
    """TP rank ``tp_rank``'s shard of a full mcore tensor of split ``kind`` (see the module table)."""
    if tp_size == 1 or kind == "none":
        return full
    if kind in ("qkv", "vocab"):  # whole groups (qkv rows are grouped) / vocab rows: contiguous dim-0 blocks
        return full.chunk(tp_size, dim=0)[tp_rank]
    if kind == "row":
        return full.chunk(tp_size, dim=1)[tp_rank]
    if kind == "fc1":
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp_size, dim=0)[tp_rank], up.chunk(tp_size, dim=0)[tp_rank]], dim=0)
    raise ValueError(f"unknown TP split kind {kind!r}")


def unshard(shards: list[torch.Tensor], kind: str) -> torch.Tensor:
    """The full mcore tensor from all TP ranks' shards (in TP rank order); inverse of :func:`shard`."""
    if len(shards) == 1 or kind == "none":
        return shards[0]
    if kind in ("qkv", "vocab"):
        return torch.cat(shards, dim=0)
    if kind == "row":
        return torch.cat(shards, dim=1)
    if kind == "fc1":
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    raise ValueError(f"unknown TP split kind {kind!r}")


def pad_vocab(full: torch.Tensor, padded_vocab: int) -> torch.Tensor:
    """Rows appended (zeros) so that a vocab-split weight has ``padded_vocab`` rows (a multiple of TP)."""
    extra = padded_vocab - full.shape[0]
    if extra <= 0:
        return full
    return torch.cat([full, full.new_zeros(extra, *full.shape[1:])], dim=0)


def padded_vocab_size(vocab: int, tp_size: int) -> int:
    """The smallest multiple of ``tp_size`` >= ``vocab`` (vocab-parallel layers split the vocab evenly)."""
    return -(-vocab // tp_size) * tp_size


def mcore_names(num_layers: int, tied: bool, qkv_bias: bool) -> list[str]:
    """Every full-model mcore weight name (global layer indices), embedding first."""
    names = ["embedding.word_embeddings.weight"]
    for i in range(num_layers):
        for suffix in LAYER_MAP:
            if suffix.endswith("linear_qkv.bias") and not qkv_bias:
                continue
            names.append(MC_LAYER.format(i=i) + suffix)
    names.append("decoder.final_layernorm.weight")
    if not tied:
        names.append("output_layer.weight")
    return names
