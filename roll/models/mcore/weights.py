"""Hugging Face weights into and out of a TP/PP-sharded megatron-core model.

Loading (:func:`load_named`): every rank copies its TP shard of each of its weights from full HF tensors (a
checkpoint read lazily by :class:`HFCheckpoint`, or tensors sent by another role).

Export (:class:`WeightExporter`): full Hugging Face weights out of a TP/PP-sharded megatron-core model, one weight at a
time (collective).

Every rank of the role walks the same list of units (one mcore weight each: embedding, per layer QKV, QKV bias,
projection, fc1, fc2, two norms, final norm, LM or value head) in the same order. For each unit, the ranks of the
pipeline stage that holds it all-gather their TP shards and convert the full tensor to its HF tensors; with PP > 1
those are then broadcast over the pipeline group from the owning stage, so that every rank ends up with them (the
shapes and dtypes are known in advance from the HF config). Memory: one unit at a time.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from roll.models.mcore import convert
from roll.models.mcore.build import global_names


class HFCheckpoint:
    """Tensors of a Hugging Face safetensors checkpoint (one file or an index), read one at a time."""

    def __init__(self, path: str):
        root = Path(path)
        index = root / "model.safetensors.index.json"
        if index.is_file():
            self.files = {n: root / f for n, f in json.loads(index.read_text())["weight_map"].items()}
        elif (root / "model.safetensors").is_file():
            from safetensors import safe_open

            with safe_open(root / "model.safetensors", "pt") as f:
                self.files = {n: root / "model.safetensors" for n in f.keys()}
        else:
            raise FileNotFoundError(
                f"megatron: no model.safetensors(.index.json) in {path}; save the model with "
                "transformers' save_pretrained (safetensors) first"
            )

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def __getitem__(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        with safe_open(self.files[name], "pt") as f:
            return f.get_tensor(name)


@dataclass(frozen=True)
class Unit:
    """One mcore weight: its full-model name, TP split kind, owning pipeline rank and HF ``(name, shape)`` pairs."""

    name: str
    kind: str
    owner: int
    hf: tuple[tuple[str, tuple[int, ...]], ...]


def hf_shapes(name: str, hf, value_head: bool) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """HF names and shapes of mcore weight ``name`` (from the HF config: no tensor needed)."""
    if name.startswith("value_head."):
        return (("score." + name.split(".", 1)[1], (1, hf.hidden_size) if name.endswith("weight") else (1,)),)
    shape = convert.AttentionShape.from_hf(hf)
    h, d, f, v = hf.hidden_size, shape.head_dim, hf.intermediate_size, hf.vocab_size
    sizes = {"q_proj": shape.num_heads * d, "k_proj": shape.num_groups * d, "v_proj": shape.num_groups * d}
    names, _ = convert.hf_names(name)
    out = []
    for n in names:
        leaf = n.split(".")[-2]
        if n.endswith("bias"):
            dims: tuple[int, ...] = (sizes[leaf],)
        elif leaf in sizes:
            dims = (sizes[leaf], h)
        elif leaf == "o_proj":
            dims = (h, shape.num_heads * d)
        elif leaf in ("gate_proj", "up_proj"):
            dims = (f, h)
        elif leaf == "down_proj":
            dims = (h, f)
        elif leaf in ("embed_tokens", "lm_head"):
            dims = (v, h)
        else:  # norms
            dims = (h,)
        out.append((n, dims))
    return tuple(out)


class WeightExporter:
    """Walks a rank's model chunks and yields the full HF weights (see the module docstring)."""

    def __init__(self, chunks: list[torch.nn.Module], hf, value_head: bool = False):
        from megatron.core import parallel_state as mpu

        self.hf, self.value_head = hf, value_head
        self.shape = convert.AttentionShape.from_hf(hf)
        self.tp_group = mpu.get_tensor_model_parallel_group()
        self.tp_size = mpu.get_tensor_model_parallel_world_size()
        self.pp_group = mpu.get_pipeline_model_parallel_group()
        self.pp_size = mpu.get_pipeline_model_parallel_world_size()
        self.pp_rank = mpu.get_pipeline_model_parallel_rank()
        self.params: dict[str, torch.nn.Parameter] = {}
        for chunk in chunks:
            for name, _, param in global_names(chunk):
                if name == "output_layer.weight" and getattr(chunk, "share_embeddings_and_output_weights", False):
                    continue  # the tied head is the embedding, exported from the first stage
                self.params.setdefault(name, param)
        self.dtype = next(iter(self.params.values())).dtype
        self.units = self._plan()

    def _plan(self) -> list[Unit]:
        """Every unit of the full model in export order, with the pipeline rank that owns it."""
        import torch.distributed as dist

        owned = [None] * self.pp_size
        dist.all_gather_object(owned, sorted(self.params), group=self.pp_group)
        owner = {}
        for rank, names in enumerate(owned):
            for name in names:
                owner.setdefault(name, rank)
        tied = bool(getattr(self.hf, "tie_word_embeddings", False)) and not self.value_head
        order = convert.mcore_names(
            self.hf.num_hidden_layers, tied, "decoder.layers.0.self_attention.linear_qkv.bias" in owner
        )
        if self.value_head:
            order = [n for n in order if n != "output_layer.weight"] + ["value_head.weight", "value_head.bias"]
        missing = [n for n in order if n not in owner]
        if missing:
            raise RuntimeError(f"megatron export: no pipeline stage holds {missing[:3]}")
        return [
            Unit(
                n,
                "none" if n.startswith("value_head.") else convert.hf_names(n)[1],
                owner[n],
                hf_shapes(n, self.hf, self.value_head),
            )
            for n in order
        ]

    def specs(self) -> list[tuple[str, list[int], torch.dtype]]:
        """``(HF name, full shape, dtype)`` of every exported tensor, in export order (no communication)."""
        return [(n, list(s), self.dtype) for u in self.units for n, s in u.hf]

    def _full(self, unit: Unit) -> torch.Tensor:
        """The full mcore tensor of ``unit`` on its owning stage (TP shards all-gathered; vocab padding cut)."""
        import torch.distributed as dist

        local = self.params[unit.name].detach()
        if self.tp_size > 1 and unit.kind != "none":
            shards = [torch.empty_like(local) for _ in range(self.tp_size)]
            dist.all_gather(shards, local.contiguous(), group=self.tp_group)
            local = convert.unshard(shards, unit.kind)
        if unit.kind == "vocab":
            local = local[: self.hf.vocab_size]
        return local

    def _hf_tensors(self, unit: Unit) -> list[tuple[str, torch.Tensor]]:
        if unit.name.startswith("value_head."):
            ((name, shape),) = unit.hf
            return [(name, self._full(unit).reshape(shape))]
        return convert.mcore_to_hf(unit.name, self._full(unit), self.shape)

    def __iter__(self) -> Iterator[tuple[str, torch.Tensor]]:
        """``(HF name, full tensor)`` on every rank, in :meth:`specs` order; all ranks of the role must iterate."""
        import torch.distributed as dist

        device = next(iter(self.params.values())).device
        for unit in self.units:
            mine = self.pp_rank == unit.owner
            tensors = (
                [(n, t.contiguous()) for n, t in self._hf_tensors(unit)]
                if mine
                else [(n, torch.empty(s, dtype=self.dtype, device=device)) for n, s in unit.hf]
            )
            if self.pp_size > 1:
                src = dist.get_global_rank(self.pp_group, unit.owner)
                for _, t in tensors:
                    dist.broadcast(t, src=src, group=self.pp_group)
            yield from tensors


def local_targets(chunks: list[torch.nn.Module]) -> dict[str, tuple[str, torch.nn.Parameter]]:
    """mcore full name -> (local name, parameter) of this rank's chunks (where HF weights are loaded into)."""
    out: dict[str, tuple[str, torch.nn.Parameter]] = {}
    for chunk in chunks:
        for name, local, param in global_names(chunk):
            out.setdefault(name, (local, param))
    return out


@torch.no_grad()
def load_named(
    chunks: list[torch.nn.Module],
    named: Mapping[str, torch.Tensor],
    hf,
    tp_rank: int,
    tp_size: int,
    skip_missing: bool = False,
) -> int:
    """Copy HF-named full tensors into this rank's shards; returns the number of mcore weights set. A weight
    whose HF tensors are absent raises, unless ``skip_missing`` (e.g. a critic keeps its value head)."""
    shape = convert.AttentionShape.from_hf(hf)
    done = 0
    for name, (_local, param) in local_targets(chunks).items():
        if name.startswith("value_head."):
            key = "score." + name.split(".", 1)[1]
            if key not in named:
                continue
            param.copy_(named[key].reshape(param.shape).to(param.dtype))
            done += 1
            continue
        keys, kind = convert.hf_names(name)
        if name == "output_layer.weight" and keys[0] not in named:
            keys = ("model.embed_tokens.weight",)  # tied weights sent once
        if any(k not in named for k in keys):
            if skip_missing:
                continue
            raise KeyError(f"megatron load_weights: {[k for k in keys if k not in named][0]} (for {name}) missing")
        full = convert.hf_to_mcore(name, {k: named[k] for k in keys}, shape) if len(keys) > 1 else named[keys[0]]
        if kind == "vocab":
            full = convert.pad_vocab(full, convert.padded_vocab_size(hf.vocab_size, tp_size))
        param.copy_(convert.shard(full.to(param.device), kind, tp_rank, tp_size).to(param.dtype))
        done += 1
    return done


def load_checkpoint(chunks: list[torch.nn.Module], path: str, hf, tp_rank: int, tp_size: int) -> int:
    """Load this rank's shards from the HF safetensors checkpoint at ``path`` (a value head it lacks stays at
    zero); returns the number of mcore weights set."""
    return load_named(chunks, HFCheckpoint(path), hf, tp_rank, tp_size)
