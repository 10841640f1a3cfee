"""megatron-core models from Hugging Face checkpoints: config, model chunks, loading HF weights into TP/PP shards.

Imports megatron-core (only the ``megatron_*`` strategies import this module). Works with megatron-core 0.16 (the
newest on Python 3.11) and 0.19 (Python 3.12); layers come from ``get_gpt_layer_local_spec()`` unless the options
ask for Transformer Engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from roll.config.megatron import MegatronOptions
from roll.models.mcore import convert

#: Transformer Engine fuses the two norms into the following linear layer: mcore suffix there -> local suffix.
TE_NORM_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}


def transformer_config(hf, opts: MegatronOptions, dtype: str) -> Any:
    """A ``TransformerConfig`` equal in architecture to the transformers config ``hf`` (Qwen2 or Llama)."""
    from megatron.core.transformer import TransformerConfig

    rope_theta(hf)  # plain RoPE only
    shape = convert.AttentionShape.from_hf(hf)
    bf16 = dtype == "bf16"
    qkv_bias = hf.model_type == "qwen2" or bool(getattr(hf, "attention_bias", False))
    kwargs = dict(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        ffn_hidden_size=hf.intermediate_size,
        num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_groups,
        kv_channels=shape.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=hf.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=qkv_bias,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=getattr(hf, "initializer_range", 0.02),
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        attention_softmax_in_fp32=True,
        bf16=bf16,
        params_dtype=torch.bfloat16 if bf16 else torch.float32,
        pipeline_dtype=torch.bfloat16 if bf16 else torch.float32,
        # random init before the checkpoint overwrites it: megatron-core 0.16 marks tensor-parallel weights
        # (tensor_model_parallel, partition_dim) only while initializing them, and gradient norms need the marks
        use_cpu_initialization=not torch.cuda.is_available(),
        perform_initialization=True,
        tensor_model_parallel_size=opts.tensor_model_parallel_size,
        pipeline_model_parallel_size=opts.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=opts.virtual_pipeline_model_parallel_size,
        context_parallel_size=opts.context_parallel_size,
        sequence_parallel=opts.sequence_parallel,
        recompute_granularity=opts.recompute_granularity,
        recompute_method=opts.recompute_method,
        recompute_num_layers=opts.recompute_num_layers,
    )
    return TransformerConfig(**kwargs)


def rope_theta(hf) -> float:
    """RoPE base of ``hf`` (transformers 4 keeps it in ``rope_theta``, 5 in ``rope_parameters``); only plain
    RoPE (``rope_type`` default) converts."""
    params = dict(getattr(hf, "rope_parameters", None) or getattr(hf, "rope_scaling", None) or {})
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ValueError(
            f"megatron: RoPE type {kind!r} ({params}) is not converted; roll's Megatron models use "
            "plain RoPE (Qwen2/Qwen2.5, Llama 2/3.0)"
        )
    return float(params.get("rope_theta", getattr(hf, "rope_theta", 10000.0)))


def layer_spec(opts: MegatronOptions) -> Any:
    """The layer spec: megatron-core's local modules, or Transformer Engine's when asked for."""
    from megatron.core.models.gpt import gpt_layer_specs

    if opts.transformer_impl == "transformer_engine":
        return gpt_layer_specs.get_gpt_layer_with_transformer_engine_spec()
    return gpt_layer_specs.get_gpt_layer_local_spec()


class ValueHead(torch.nn.Module):
    """``hidden -> 1`` in place of ``GPTModel.output_layer`` (the critic), replicated on every TP rank; with
    sequence parallelism its input is gathered along the sequence first. Returns ``(values, None)`` like the
    output layer it replaces."""

    def __init__(self, hidden: int, sequence_parallel: bool, dtype: torch.dtype):
        super().__init__()
        self.linear = torch.nn.Linear(hidden, 1, dtype=dtype)
        torch.nn.init.zeros_(self.linear.weight)
        torch.nn.init.zeros_(self.linear.bias)
        self.sequence_parallel = sequence_parallel

    def forward(self, hidden: torch.Tensor, weight: Any = None, runtime_gather_output: Any = None, **_: Any):
        if self.sequence_parallel:
            from megatron.core import tensor_parallel

            hidden = tensor_parallel.gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
        return self.linear(hidden), None


def build_chunks(hf, opts: MegatronOptions, dtype: str, value_head: bool = False) -> list[torch.nn.Module]:
    """This rank's ``GPTModel`` chunks (one per virtual pipeline stage), on the current device, uninitialized
    (weights come from :func:`load_hf_weights`). ``value_head`` replaces the LM head by :class:`ValueHead`."""
    from megatron.core import parallel_state as mpu
    from megatron.core.models.gpt import GPTModel

    config = transformer_config(hf, opts, dtype)
    vocab = convert.padded_vocab_size(hf.vocab_size, opts.tensor_model_parallel_size)
    tied = bool(getattr(hf, "tie_word_embeddings", False)) and not value_head
    device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    chunks = []
    for vp in range(opts.virtual_pipeline_model_parallel_size or 1):
        vp_stage = vp if opts.virtual_pipeline_model_parallel_size else None
        model = GPTModel(
            config,
            layer_spec(opts),
            vocab_size=vocab,
            max_sequence_length=hf.max_position_embeddings,
            pre_process=mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
            post_process=mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
            share_embeddings_and_output_weights=tied,
            position_embedding_type="rope",
            rotary_base=rope_theta(hf),
            vp_stage=vp_stage,
        )
        if value_head and model.post_process:
            model.output_layer = ValueHead(hf.hidden_size, opts.sequence_parallel, config.params_dtype)
        chunks.append(model.to(device))
    return chunks


def global_names(chunk: torch.nn.Module) -> Iterator[tuple[str, str, torch.nn.Parameter]]:
    """``(mcore name with the global layer index and local-spec norm names, local name, parameter)`` of a chunk;
    the value head's parameters come as ``value_head.weight`` / ``value_head.bias``."""
    offsets = {str(i): str(layer.layer_number - 1) for i, layer in enumerate(chunk.decoder.layers)}
    for name, param in chunk.named_parameters():
        full = name
        m = convert.LAYER.match(name)
        if m:
            local, suffix = m.groups()
            full = convert.MC_LAYER.format(i=offsets[local]) + TE_NORM_NAMES.get(suffix, suffix)
        elif name.startswith("output_layer.linear."):
            full = "value_head." + name.rsplit(".", 1)[1]
        yield full, name, param


def load_hf_config(path: str, trust_remote_code: bool = False) -> Any:
    """The transformers config of ``path``."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
