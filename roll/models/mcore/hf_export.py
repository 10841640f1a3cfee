"""Writing gathered megatron weights as a Hugging Face model directory (config, safetensors, tokenizer)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch

#: Tensors per safetensors file are grouped up to this many bytes (transformers' default shard size).
SHARD_BYTES = 5 * 2**30


def save_hf(path: str, weights: dict[str, torch.Tensor], hf_config, tokenizer=None, value_head: bool = False) -> None:
    """Write ``weights`` (HF names, full tensors) as ``model.safetensors`` (or shards plus an index), the config
    (a token-classification config with one label for a value head) and the tokenizer."""
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    config = copy.deepcopy(hf_config)
    if value_head:
        config.num_labels = 1
        config.architectures = [a.replace("ForCausalLM", "ForTokenClassification") for a in config.architectures or []]
    config.save_pretrained(out)
    shards: list[dict[str, torch.Tensor]] = [{}]
    used = 0
    for name, tensor in weights.items():
        size = tensor.numel() * tensor.element_size()
        if shards[-1] and used + size > SHARD_BYTES:
            shards.append({})
            used = 0
        shards[-1][name] = tensor.contiguous()
        used += size
    if len(shards) == 1:
        save_file(shards[0], out / "model.safetensors", metadata={"format": "pt"})
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, out / file, metadata={"format": "pt"})
            weight_map.update({name: file for name in shard})
        total = sum(t.numel() * t.element_size() for t in weights.values())
        (out / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
        )
    if tokenizer is not None:
        tokenizer.save_pretrained(out)
