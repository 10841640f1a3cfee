"""``strategy_name: vllm`` (ROLL's default inference backend): not available in roll; the error names the SGLang
options that do the same, translated from the vLLM options the config sets.

Why no vLLM: roll has no vLLM backend, and ``pip install vllm`` replaces the installed torch with the exact
version vllm pins (vllm 0.33: torch 2.14.0), which the trainer then runs on. SGLang (``strategy_name: sglang``)
covers the same ground: continuous batching, prefix cache, tensor parallelism, memory release while colocated,
weight updates from the trainer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Why, in the registry's words (``strategy_name: vllm`` -> "vllm <this>"); the preflight's error adds the options.
VLLM_UNAVAILABLE = (
    "is not available in roll (no vLLM backend, and `pip install vllm` replaces torch with the "
    "version vllm pins); use sglang on GPU (gpu_memory_utilization -> mem_fraction_static, "
    "tensor_parallel_size -> tp_size, ...; docs/sglang.md) or hf_infer on CPU"
)

#: vLLM engine argument -> the SGLang ``Engine`` argument that does the same (same value).
VLLM_TO_SGLANG = {
    "gpu_memory_utilization": "mem_fraction_static",
    "tensor_parallel_size": "tp_size",
    "max_model_len": "context_length",
    "max_num_seqs": "max_running_requests",
    "max_num_batched_tokens": "chunked_prefill_size",
    "block_size": "page_size",
    "enforce_eager": "disable_cuda_graph",
    "quantization": "quantization",
    "load_format": "load_format",
    "kv_cache_dtype": "kv_cache_dtype",
}
#: vLLM arguments whose SGLang counterpart takes the negated value.
NEGATED = {"enable_prefix_caching": "disable_radix_cache"}
#: vLLM arguments roll sets or handles itself with SGLang: drop them.
HANDLED = {
    "sleep_level": "memory release (release_tags)",
    "enable_sleep_mode": "memory release (release_tags)",
    "seed": "the seed (from the run's seed)",
    "dtype": "the dtype (from model_args.dtype)",
    "trust_remote_code": "model_args.trust_remote_code",
    "distributed_executor_backend": "the process layout",
}


def sglang_equivalent(vllm_config: Mapping[str, Any] | None) -> tuple[dict[str, Any], list[str], list[str]]:
    """``(sglang strategy_config, dropped keys, keys without a known equivalent)`` of a vLLM ``strategy_config``.

    >>> sglang_equivalent({"gpu_memory_utilization": 0.8, "enable_prefix_caching": False, "seed": 1})
    ({'mem_fraction_static': 0.8, 'engine_args': {'disable_radix_cache': True}}, ['seed'], [])
    """
    import dataclasses

    from roll.config.strategies import SGLangOptions

    typed = {f.name for f in dataclasses.fields(SGLangOptions)}
    out: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    dropped, unknown = [], []
    for key, value in (vllm_config or {}).items():
        if key in VLLM_TO_SGLANG or key in NEGATED:
            name = VLLM_TO_SGLANG.get(key) or NEGATED[key]
            (out if name in typed else engine)[name] = value if key in VLLM_TO_SGLANG else not value
        elif key in HANDLED:
            dropped.append(key)
        else:
            unknown.append(key)
    if engine:  # Engine arguments SGLangOptions does not type go through engine_args
        out["engine_args"] = engine
    return out, dropped, unknown


def vllm_instead(vllm_config: Mapping[str, Any] | None) -> str:
    """The one-line error for ``strategy_name: vllm``: why not, and the sglang settings to use instead."""
    config, dropped, unknown = sglang_equivalent(vllm_config)
    renamed = [
        f"{k} -> {VLLM_TO_SGLANG.get(k) or NEGATED[k]}"
        for k in (vllm_config or {})
        if k in VLLM_TO_SGLANG or k in NEGATED
    ]
    if not renamed:  # nothing set: name the usual ones
        renamed = [
            f"{k} -> {VLLM_TO_SGLANG[k]}" for k in ("gpu_memory_utilization", "tensor_parallel_size", "max_model_len")
        ]
    body = ", ".join(
        f"{k}: {{{', '.join(f'{a}: {b}' for a, b in v.items())}}}" if k == "engine_args" else f"{k}: {v}"
        for k, v in config.items()
    )
    parts = [
        f"vLLM is not available in roll (no vLLM backend, and `pip install vllm` replaces torch with the "
        f"version vllm pins); use strategy_name: sglang with strategy_config {{{body}}} "
        f"({', '.join(renamed)})"
    ]
    if dropped:
        parts.append(f"drop {', '.join(dropped)} (roll sets {', '.join(sorted({HANDLED[k] for k in dropped}))})")
    if unknown:
        parts.append(f"check {', '.join(unknown)} against sglang's Engine arguments (docs/sglang.md)")
    return "; ".join(parts) + "; on CPU use hf_infer"
