"""The memory model of each built-in backend: how its strategy holds weights, gradients, optimizer states, KV
caches and working memory on a GPU, read from the strategy's code (``roll/strategies/<name>.py``); notation and
constants in :mod:`roll.launch.memory`. A backend registered elsewhere registers its own with
``@register_memory_model("<strategy name>")``; a strategy without one is reported as not estimated.
"""

from __future__ import annotations

from typing import Any

from roll.config.lora import lora_settings
from roll.launch.memory import (
    ADAM_BYTES,
    DEEPSPEED_REDUCE_BUCKET,
    DTYPE_BYTES,
    FP32_BYTES,
    GATHERED_LAYERS,
    GIB,
    MEGATRON_LOGIT_BYTES,
    SGLANG_PROCESSES,
    RoleInputs,
    RoleMemory,
    Term,
    forward_bytes,
    infer_tokens,
    logit_bytes,
    register_memory_model,
    training_passes,
)


def _on_cpu(options: Any, name: str) -> bool:
    """A DeepSpeed offload (``offload_optimizer`` / ``offload_param``) to CPU, by shorthand or by section (what
    ``build_ds_config`` passes to DeepSpeed)."""
    section = options.zero_optimization.get(name) or {}
    return getattr(options, name) == "cpu" or (isinstance(section, dict) and section.get("device") == "cpu")


def _lora(x: RoleInputs) -> str:
    rank = x.lora[0]
    return f", LoRA r={rank} on {','.join(x.lora[1])}" if rank else ""


@register_memory_model("deepspeed_train")
def deepspeed_train(x: RoleInputs) -> RoleMemory:
    """ZeRO stage z over the role's d ranks, torch AdamW inside DeepSpeed's wrapper (``deepspeed_train.py``).

    - weights: (P + A) b; / d at stage 3, plus the gathered layers; the gathered layers only with offload_param;
    - gradients: T b at stages 0-1, T b / d at 2-3 (0 with offload_optimizer), plus the reduce bucket at stages 1-3
      (``reduce_bucket_size`` x b, twice with ``overlap_comm``, DeepSpeed's default at stage 3);
    - fp32 master weights: T x 4 / d' where b < 4 or at stage 1-2 (DeepSpeed copies fp32 partitions there too);
      Adam moments: T x 8 / d'; d' = d at stages 1-3, else 1; both 0 with offload_optimizer;
    - the optimizer step (activations freed): the fp32 gradient copy T x 4 / d' (where there is a master copy) and
      AdamW's foreach temporary T x 4 / d';
    - offloaded (``offload_states``): nothing at stages 1-2; the fp32 master at stage 0 (DeepSpeed's fp32 copies
      are neither module parameters nor optimizer state); master and moments at stage 3 (with torch AdamW
      DeepSpeed moves only the bf16 weights, gradients and gradient buffer); with offload_param it does nothing.
      With LoRA the frozen base weights stay too: DeepSpeed moves the parameters its optimizer holds, the adapters
      (measured on an H200: a 7B LoRA run's rollout phase held the trainer's 14.3 GiB base beside SGLang's pool).
      A vision tower frozen by ``freeze_vision_tower`` stays at stages 1-3 for the same reason (not measured).
    """
    opts, b, d = x.options(), x.b, x.world
    stage, zero = int(opts.stage), opts.zero_optimization
    off_opt, off_param = _on_cpu(opts, "offload_optimizer"), _on_cpu(opts, "offload_param")
    weights, trained = x.trained(x.role == "critic")
    d_opt = d if stage >= 1 else 1
    gathered = GATHERED_LAYERS * x.shape.layer_params() * b if stage == 3 else 0
    w = x.term("weights", "weights", 0 if off_param else weights * b / (d if stage == 3 else 1))
    g_bytes = trained * b if stage <= 1 else (0 if off_opt else trained * b / d)
    bucket = zero.get("reduce_bucket_size") if isinstance(zero.get("reduce_bucket_size"), int) else None
    overlap = zero.get("overlap_comm") if isinstance(zero.get("overlap_comm"), bool) else stage == 3
    bucket_bytes = (bucket or DEEPSPEED_REDUCE_BUCKET) * b * (2 if overlap else 1) if stage >= 1 else 0
    has_master = (b < 4 or stage in (1, 2)) and not off_opt
    master = x.term("optimizer", "fp32 master weights", trained * FP32_BYTES / d_opt if has_master else 0)
    moments = x.term("optimizer", "Adam moments", 0 if off_opt else trained * ADAM_BYTES / d_opt)
    resident = [w, x.term("grads", "gradients", g_bytes), x.term("grads", "ZeRO reduce bucket", bucket_bytes)]
    if gathered:
        resident.append(x.term("weights", "gathered layers", gathered))
    resident += [master, moments]
    step_copy = trained * FP32_BYTES / d_opt if has_master else 0
    step = (
        x.term("grads", "fp32 gradients at the step", step_copy),
        x.term("optimizer", "AdamW step temporaries", 0 if off_opt else trained * FP32_BYTES / d_opt),
    )
    offloaded: tuple[Term, ...] = () if stage in (1, 2) else (master,) if stage == 0 else (master, moments)
    if off_param:  # offload_states does nothing; the gathered layers are freed after each pass
        offloaded = tuple(t for t in resident if t.what != "gathered layers")
    elif x.lora[0]:  # the frozen base is no optimizer parameter: offload_states leaves it on the GPU
        offloaded = (x.term("weights", "frozen base weights (not offloaded)", w.gib * GIB), *offloaded)
    elif x.frozen_tower and stage >= 1:  # likewise a frozen vision tower (ZeRO-0 moves the whole module)
        tower = x.shape.vision_params() * b / (d if stage == 3 else 1)
        offloaded = (x.term("weights", "frozen vision tower (not offloaded)", tower), *offloaded)
    return RoleMemory(
        x.role,
        "deepspeed_train",
        tuple(resident),
        training_passes(x, step),
        offloaded,
        summary=f"ZeRO-{stage} over {d} rank(s) in {x.worker.model_args.dtype}"
        + (", optimizer on CPU" if off_opt else "")
        + (", parameters on CPU" if off_param else "")
        + _lora(x),
    )


@register_memory_model("fsdp2_train")
def fsdp2_train(x: RoleInputs) -> RoleMemory:
    """FSDP2 over s ranks (``fsdp_size``; 0, 1 or >= d: all d), ``fsdp2_train.py``: fp32 sharded parameters (also
    AdamW's master weights), forward and backward in ``param_dtype`` (default b).

    - weights: (P + A) x 4 / s + the gathered layers in the compute dtype; the gathered layers only with
      ``offload_policy``;
    - gradients: T r / s (r: bytes of ``reduce_dtype``, fp32 by default), plus T r unsharded when a step
      accumulates micro-batches (gradient_accumulation_steps > 1 or dynamic batching: FSDP2 keeps them unsharded
      until the last micro-batch reduce-scatters them);
    - Adam moments: T x 8 / s (0 with ``offload_policy``); the step: AdamW's foreach temporary T x 4 / s;
    - offloaded: nothing (``offload_states`` moves the shards and the optimizer states).
    """
    from roll.config.fsdp2 import dtype_name

    opts, d = x.options(), x.world
    s = d if opts.fsdp_size in (0, 1) or opts.fsdp_size >= d else opts.fsdp_size
    compute = DTYPE_BYTES[dtype_name(opts.param_dtype) or x.worker.model_args.dtype]
    r = DTYPE_BYTES[dtype_name(opts.reduce_dtype) or "fp32"]
    weights, trained = x.trained(x.role == "critic")
    cpu = opts.offload_policy
    ta = x.worker.training_args
    accumulates = ta.gradient_accumulation_steps > 1 or x.worker.use_dynamic_batching_in_train
    resident = (
        x.term("weights", "fp32 parameter shards", 0 if cpu else weights * FP32_BYTES / s),
        x.term("weights", "gathered layers", GATHERED_LAYERS * x.shape.layer_params() * compute),
        x.term("grads", "gradient shards", 0 if cpu else trained * r / s),
        x.term("grads", "unsharded accumulated gradients", trained * r if accumulates else 0),
        x.term("optimizer", "Adam moments", 0 if cpu else trained * ADAM_BYTES / s),
    )
    step = (x.term("optimizer", "AdamW step temporaries", 0 if cpu else trained * FP32_BYTES / s),)
    return RoleMemory(
        x.role,
        "fsdp2_train",
        resident,
        training_passes(x, step),
        (),
        summary=f"FSDP2 over {s} of {d} rank(s), fp32 shards, compute {dtype_name(opts.param_dtype) or 'model dtype'}"
        + (", offload_policy" if cpu else "")
        + _lora(x),
    )


@register_memory_model("megatron_train")
def megatron_train(x: RoleInputs) -> RoleMemory:
    """TP x PP model parallel, dp = d / (TP x PP) replicas (``megatron_train.py``); a rank holds P_r = the largest
    pipeline stage's parameters / TP (T_r likewise).

    - weights: P_r b; gradients: T_r x 4 (megatron's DDP reduces in fp32: ``grad_reduce_in_fp32``);
    - fp32 master weights T_r x 4 / dp' (bf16 only); Adam moments T_r x 8 / dp' (dp' = dp with
      ``use_distributed_optimizer``, else 1);
    - activations with the TP-split parts / TP over all L layers (1F1B keeps PP micro-batches of L / PP layers on
      the first stage), checkpointed with ``recompute_granularity: full``; logits unchunked: n V / TP x
      :data:`MEGATRON_LOGIT_BYTES`;
    - offloaded: nothing (``roll.models.mcore.offload`` moves weights, gradient buffers and optimizer states).
    """
    opts, b, d = x.options(), x.b, x.world
    tp, pp = opts.tensor_model_parallel_size, opts.pipeline_model_parallel_size
    dp = max(1, d // (tp * pp))
    d_opt = dp if opts.use_distributed_optimizer else 1
    full, trained = x.trained(x.role == "critic")
    share = x.shape.stage_params(pp) / x.shape.params() / tp  # this rank's fraction of the model
    resident = (
        x.term("weights", "weights", full * share * b),
        x.term("grads", "fp32 gradient buffer", trained * share * FP32_BYTES),
        x.term("optimizer", "fp32 master weights", trained * share * FP32_BYTES / d_opt if b < 4 else 0),
        x.term("optimizer", "Adam moments", trained * share * ADAM_BYTES / d_opt),
    )
    return RoleMemory(
        x.role,
        "megatron_train",
        resident,
        training_passes(x, (), tp=tp, megatron=True),
        (),
        summary=f"Megatron TP={tp} PP={pp} DP={dp}"
        + (", distributed optimizer" if opts.use_distributed_optimizer else "")
        + _lora(x),
    )


def _scoring(x: RoleInputs, weights: tuple[Term, ...], strategy: str, summary: str, tp: int = 1, megatron=False):
    """A role that only scores (the reference): its weights, and the working memory of a log-prob forward.
    ``offload_states`` of hf_infer moves the model to CPU; the other scoring backends have none."""
    m = infer_tokens(x.worker, x.sequence_length)
    logits = (
        m * x.shape.vocab / tp * MEGATRON_LOGIT_BYTES
        if megatron
        else logit_bytes(x.shape, x.b, m, x.worker.model_args.compile_log_probs, False)
    )
    working = (
        x.term("activations", f"forward ({m:,} tokens)", forward_bytes(x.shape, x.b, m, tp)),
        x.term("logits", "logits" if megatron else "LM-head chunk", logits),
    )
    offloaded = () if strategy == "hf_infer" else weights
    return RoleMemory(x.role, strategy, weights, working, offloaded, summary=summary)


@register_memory_model("deepspeed_infer")
def deepspeed_infer(x: RoleInputs) -> RoleMemory:
    """weights P b (``zero_stage`` 0), P b / d + the gathered layers (3), the gathered layers only with
    ``offload_param``; plus a log-prob forward (:func:`_scoring`)."""
    opts, b, p = x.options(), x.b, x.shape.params()
    gathered = GATHERED_LAYERS * x.shape.layer_params() * b if opts.zero_stage == 3 else 0
    own = 0 if opts.offload_param == "cpu" else p * b / (x.world if opts.zero_stage == 3 else 1)
    weights = (x.term("weights", "weights", own), x.term("weights", "gathered layers", gathered))
    return _scoring(x, weights, "deepspeed_infer", f"ZeRO-{opts.zero_stage} inference over {x.world} rank(s)")


@register_memory_model("fsdp2_infer")
def fsdp2_infer(x: RoleInputs) -> RoleMemory:
    """weights P c / s in the compute dtype c (``param_dtype``) + the gathered layers (the gathered layers only
    with ``offload_policy``); plus a log-prob forward (:func:`_scoring`)."""
    from roll.config.fsdp2 import dtype_name

    opts, d = x.options(), x.world
    s = d if opts.fsdp_size in (0, 1) or opts.fsdp_size >= d else opts.fsdp_size
    c = DTYPE_BYTES[dtype_name(opts.param_dtype) or x.worker.model_args.dtype]
    weights = (
        x.term("weights", "weight shards", 0 if opts.offload_policy else x.shape.params() * c / s),
        x.term("weights", "gathered layers", GATHERED_LAYERS * x.shape.layer_params() * c),
    )
    return _scoring(x, weights, "fsdp2_infer", f"FSDP2 inference over {s} of {d} rank(s)")


@register_memory_model("megatron_infer")
def megatron_infer(x: RoleInputs) -> RoleMemory:
    """weights P_r b (the largest pipeline stage / TP); plus a log-prob forward with Megatron's logits."""
    opts = x.options()
    tp, pp = opts.tensor_model_parallel_size, opts.pipeline_model_parallel_size
    weights = (x.term("weights", "weights", x.shape.stage_params(pp) / tp * x.b),)
    return _scoring(x, weights, "megatron_infer", f"Megatron TP={tp} PP={pp} inference", tp=tp, megatron=True)


@register_memory_model("hf_infer")
def hf_infer(x: RoleInputs) -> RoleMemory:
    """The reference: weights P b and a log-prob forward. actor_infer: weights P b; while generating, the KV cache
    of one ``generate`` call (min(``generate_batch_size``, ``max_running_requests``) x ``sequence_length`` x
    2 L kv_dim b) and the kept turns' keys and values (``kv_cache_mb``, with ``reuse_kv_cache``).
    ``offload_states`` moves the model to CPU (and a weight sync clears the kept turns)."""
    weights = (x.term("weights", "weights", x.shape.params() * x.b),)
    if x.role != "actor_infer":
        return _scoring(x, weights, "hf_infer", "transformers forward")
    opts = x.options()
    batch = min(opts.generate_batch_size, x.max_running_requests or opts.generate_batch_size)
    kv = batch * x.sequence_length * x.shape.kv_bytes_per_token(x.b)
    kept = opts.kv_cache_mb * 2**20 if opts.reuse_kv_cache else 0
    working = (
        x.term("engine", f"KV cache of {batch} sequences", kv),
        x.term("engine", "kept turns' KV", kept),
    )
    return RoleMemory(x.role, "hf_infer", weights, working, (), summary=f"transformers generate, {batch} at a time")


@register_memory_model("sglang")
def sglang(x: RoleInputs) -> RoleMemory:
    """``mem_fraction_static`` x the GPU on each GPU of an engine (SGLang's static pool: the weights' TP shard
    P b / tp, then the KV cache and CUDA graphs; its scheduler's CUDA context included), released while the
    colocated trainer runs except what ``release_tags`` keep (null = all released)."""
    opts = x.options()
    tp = opts.tp_size or x.worker.num_gpus_per_worker
    b = {"float32": 4, "bfloat16": 2, "float16": 2, "half": 2}.get(opts.dtype or "", x.b)
    pool = opts.mem_fraction_static * x.gpu_gib * GIB
    weights = x.shape.params() * b / tp
    resident = (
        x.term("engine", "weights", min(weights, pool)),
        x.term("engine", "KV cache and CUDA graphs", max(0.0, pool - weights)),
    )
    released = opts.released(lora_settings(x.worker.model_args, f"{x.role}.model_args") is not None)
    released = opts.RELEASE_TAGS if released is None else released
    offloaded = tuple(t for t, tag in zip(resident, ("weights", "kv_cache")) if tag not in released)
    return RoleMemory(
        x.role,
        "sglang",
        resident,
        (),
        offloaded,
        processes=SGLANG_PROCESSES,
        pooled=True,
        summary=f"mem_fraction_static {opts.mem_fraction_static:g} x {x.gpu_gib:.1f} GiB, TP={tp}",
    )
