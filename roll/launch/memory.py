"""GPU memory of a role, term by term: the arithmetic of the memory planner (pure Python; no CUDA, no model load).

Each backend has a *memory model* (:data:`MEMORY_MODELS`, keyed by strategy name) that turns a worker block and
the model's shape (:class:`ModelShape`, from its ``config.json``) into the GiB the role holds on each of its GPUs,
as :class:`Term` s in three states (:class:`RoleMemory`): ``resident`` (held for the whole run unless offloaded),
``working`` (only while its phase runs) and ``offloaded`` (what stays after ``offload_states``).
:mod:`roll.launch.memory_plan` adds the roles up per GPU and phase. docs/memory.md has the table of terms.

Notation of the formulas: P parameters of the model, A those of the LoRA adapters, T the trained ones (P, or A
with LoRA), b bytes per element of ``model_args.dtype`` (fp32 4, bf16/fp16 2), d the role's ranks, n the tokens of
a micro-batch (:func:`train_tokens`, :func:`infer_tokens`), V vocabulary, h hidden size, I the MLP's intermediate
size, L layers. Every constant a measurement could correct is a named value below. A vision-language model
(Qwen2-VL, Qwen2.5-VL) adds its vision tower's parameters to P (:class:`VisionTower`); the tower's activations are
not counted (its images are a few hundred patches each here, against thousands of text tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from roll.registry import Registry

GIB = 2**30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}

# ---------------------------------------------------------------------------- calibration constants
#: Bytes of AdamW's two moments (exp_avg, exp_avg_sq) per trained parameter: fp32 in every backend.
ADAM_BYTES = 8
#: Bytes of an fp32 master weight, an fp32 gradient or AdamW's foreach temporary, per parameter.
FP32_BYTES = 4
#: GiB per process holding a CUDA context on a GPU: the context and cuBLAS's workspace (measured 0.67 GiB on an
#: H200 with torch 2.11 / CUDA 13: 621 MiB at the first allocation, 783 MiB after a bf16 matmul; docs/memory.md).
CUDA_CONTEXT_GIB = 0.7
#: What torch's caching allocator reserves beyond what a role has allocated (fragmentation), as a fraction of
#: the role's estimate; verified.md's H100 runs show reserved 3-8% above allocated peaks, 30% at worst.
FRAGMENTATION = 0.10
#: DeepSpeed's ``reduce_bucket_size`` (elements) when a config leaves it unset or ``auto``.
DEEPSPEED_REDUCE_BUCKET = 500_000_000
#: Decoder layers ZeRO-3 and FSDP2 hold gathered at once: the running one and the prefetched next.
GATHERED_LAYERS = 2
#: fp32 temporaries of one LM-head chunk in eager PyTorch (:mod:`roll.models.logprobs`; compiled: none): the
#: backward's fp32 logits, probabilities and gradient; the forward's fp32 logits and softmax.
EAGER_LOGIT_TEMPS_BACKWARD = 3
EAGER_LOGIT_TEMPS_FORWARD = 2
#: Bytes per (token, vocabulary / TP) element of Megatron's unchunked logits: the bf16 output, its fp32 copy
#: (``Float16Module``), and the shifted and exponentiated fp32 tensors kept for the backward.
MEGATRON_LOGIT_BYTES = 2 + 3 * 4
#: CUDA contexts an SGLang engine adds to a GPU beyond its pool: none, SGLang sizes its pool so that the scheduler's
#: whole use, context included, is ``mem_fraction_static`` of the GPU (verified.md: rollout roles 28.3 GiB at
#: 0.35 x 79.2 = 27.7 GiB, the 0.6 GiB left being the colocated trainer's own context).
SGLANG_PROCESSES = 0

#: The linear modules of one decoder layer (what LoRA's ``all-linear`` targets), plus the LM head.
LINEAR_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_MODULES = (*LINEAR_MODULES, "lm_head")
#: ``model_type`` s whose decoder has q/k/v biases without saying so (no ``attention_bias`` key).
QKV_BIAS_TYPES = ("qwen2", "qwen2_vl", "qwen2_vl_text", "qwen2_5_vl", "qwen2_5_vl_text")
#: The table row of every term of a role other than actor_train (actor_train's terms have rows of their own).
ROLE_ROWS = {"actor_infer": "engine", "reference": "reference", "critic": "critic"}


# ---------------------------------------------------------------------------- the model's shape
@dataclass(frozen=True)
class VisionTower:
    """The vision tower of a Qwen2-VL or Qwen2.5-VL model (transformers' ``model.visual``), read from its
    ``vision_config``: a patch embedding (Conv3d, no bias), ``blocks`` blocks of width w, and a merger of ``merge``
    patches into one token of the decoder's width."""

    blocks: int
    width: int  # w
    mlp: int  # the MLP's hidden size m
    out: int  # the decoder's width the merger projects to
    patch: int  # the Conv3d's inputs per patch: in_channels x temporal_patch_size x patch_size^2
    merge: int  # spatial_merge_size^2
    gated: bool  # Qwen2.5-VL: gate/up/down MLP and RMSNorms; Qwen2-VL: fc1/fc2 MLP and LayerNorms (with bias)

    @classmethod
    def from_config(cls, vc: dict[str, Any], model_type: str, where: str = "config.json") -> VisionTower:
        """The tower of a ``vision_config`` dict (``model_type`` its own, else the model's); a ValueError names what
        is missing or an unknown tower."""
        gated = model_type.startswith("qwen2_5_vl")
        if not gated and not model_type.startswith("qwen2_vl"):
            raise ValueError(
                f"{where} has a vision tower of type {model_type or 'unknown'!r}; the memory planner knows those of "
                "Qwen2-VL and Qwen2.5-VL"
            )
        keys = (
            ("depth", "hidden_size", "intermediate_size", "out_hidden_size")
            if gated
            else ("depth", "embed_dim", "mlp_ratio", "hidden_size")
        )
        missing = [k for k in keys if k not in vc]
        if missing:
            raise ValueError(f"{where}'s vision_config lacks {', '.join(missing)}")
        width = int(vc["hidden_size"] if gated else vc["embed_dim"])
        merge = int(vc.get("spatial_merge_size", 2))
        return cls(
            blocks=int(vc["depth"]),
            width=width,
            mlp=int(vc["intermediate_size"]) if gated else int(width * vc["mlp_ratio"]),
            out=int(vc["out_hidden_size"] if gated else vc["hidden_size"]),
            patch=int(vc.get("in_channels", vc.get("in_chans", 3)))
            * int(vc.get("temporal_patch_size", 2))
            * int(vc.get("patch_size", 14)) ** 2,
            merge=merge * merge,
            gated=gated,
        )

    def linears(self) -> dict[str, tuple[int, int]]:
        """``(d_in, d_out)`` of each linear module of one block (all with biases)."""
        w, m = self.width, self.mlp
        mlp = (
            {"gate_proj": (w, m), "up_proj": (w, m), "down_proj": (m, w)}
            if self.gated
            else {"fc1": (w, m), "fc2": (m, w)}
        )
        return {"qkv": (w, 3 * w), "proj": (w, w), **mlp}

    def norm_params(self) -> int:
        """One norm of width w: w (RMSNorm) or 2 w (LayerNorm, with bias)."""
        return self.width if self.gated else 2 * self.width

    def merger(self) -> dict[str, tuple[int, int]]:
        """The merger's two linears (with biases): w merge -> w merge -> the decoder's width."""
        wide = self.width * self.merge
        return {"mlp.0": (wide, wide), "mlp.2": (wide, self.out)}

    def params(self) -> int:
        """patch w (the Conv3d) + blocks x (sum of (d_in + 1) d_out over the block's linears + two norms) + the
        merger's norm and linears."""
        block = sum((a + 1) * b for a, b in self.linears().values()) + 2 * self.norm_params()
        merger = self.norm_params() + sum((a + 1) * b for a, b in self.merger().values())
        return self.patch * self.width + self.blocks * block + merger

    def lora_params(self, targets: Sequence[str]) -> int:
        """Adapter inputs plus outputs, d_in + d_out, of the tower's linears peft targets: those named (peft matches
        module names, so the decoder's ``gate_proj`` also names Qwen2.5-VL's tower MLP), and all of them, merger
        included, with every decoder linear (what ``all-linear`` gives; an upper bound for those seven names)."""
        every = set(LINEAR_MODULES) <= set(targets)
        block = sum(a + b for name, (a, b) in self.linears().items() if every or name in targets)
        return self.blocks * block + (sum(a + b for a, b in self.merger().values()) if every else 0)


@dataclass(frozen=True)
class ModelShape:
    """A dense decoder-only transformer with a gated MLP (Qwen2, Llama), read from its ``config.json``, and the
    vision tower of a vision-language model (Qwen2-VL, Qwen2.5-VL), if any."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool
    vision: VisionTower | None = None

    @classmethod
    def from_config(cls, hf: dict[str, Any], where: str = "config.json") -> ModelShape:
        """The shape of a ``config.json`` dict; a ValueError names what is missing or not a dense decoder. A
        vision-language model's decoder keys are read from its ``text_config`` (over the top-level ones), its
        tower from ``vision_config``."""
        text = hf.get("text_config") or {}
        dec = {**{k: v for k, v in hf.items() if k not in ("text_config", "vision_config")}, **text}
        keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
        missing = [k for k in keys if k not in dec]
        if missing:
            raise ValueError(f"{where} lacks {', '.join(missing)}: not a decoder the memory planner knows")
        if any(k in dec for k in ("num_experts", "num_local_experts", "n_routed_experts")):
            raise ValueError(f"{where} is a mixture-of-experts model; the memory planner knows dense decoders")
        vc = hf.get("vision_config")
        vision = None
        if vc is not None:
            vision = VisionTower.from_config(vc, str(vc.get("model_type") or hf.get("model_type") or ""), where)
        hidden, heads = int(dec["hidden_size"]), int(dec["num_attention_heads"])
        return cls(
            hidden=hidden,
            layers=int(dec["num_hidden_layers"]),
            heads=heads,
            kv_heads=int(dec.get("num_key_value_heads") or heads),
            head_dim=int(dec.get("head_dim") or hidden // heads),
            intermediate=int(dec["intermediate_size"]),
            vocab=int(dec["vocab_size"]),
            # transformers ties a vision-language model's head when either level says so
            tied=bool(hf.get("tie_word_embeddings") or text.get("tie_word_embeddings")),
            qkv_bias=bool(dec.get("attention_bias", dec.get("model_type") in QKV_BIAS_TYPES)),  # Qwen2 always has it
            vision=vision,
        )

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    def linears(self) -> dict[str, tuple[int, int]]:
        """``(d_in, d_out)`` of each linear module of one layer."""
        h, q, kv, i = self.hidden, self.q_dim, self.kv_dim, self.intermediate
        return {
            "q_proj": (h, q),
            "k_proj": (h, kv),
            "v_proj": (h, kv),
            "o_proj": (q, h),
            "gate_proj": (h, i),
            "up_proj": (h, i),
            "down_proj": (i, h),
        }

    def layer_params(self) -> int:
        """One layer: sum of d_in x d_out over its linears, + the q/k/v biases (Qwen2) + two norms (2h)."""
        bias = self.q_dim + 2 * self.kv_dim if self.qkv_bias else 0
        return sum(a * b for a, b in self.linears().values()) + bias + 2 * self.hidden

    def vision_params(self) -> int:
        """The vision tower's parameters (0 for a text-only model)."""
        return self.vision.params() if self.vision else 0

    def params(self, value_head: bool = False) -> int:
        """P = V h (embedding) + L x layer + h (final norm) + the head: V h (an untied LM head), 0 (tied), or
        h + 1 (a critic's value head in place of the LM head); + the vision tower's."""
        head = self.hidden + 1 if value_head else (0 if self.tied else self.vocab * self.hidden)
        decoder = self.vocab * self.hidden + self.layers * self.layer_params() + self.hidden + head
        return decoder + self.vision_params()

    def stage_params(self, pp: int) -> int:
        """Parameters of the largest of ``pp`` pipeline stages: ceil(L / pp) layers + the embedding (first stage)
        or the LM head and final norm (last stage; a tied head is a copy of the embedding there), + the vision
        tower (first stage)."""
        if pp <= 1:
            return self.params()
        layers = -(-self.layers // pp) * self.layer_params()
        return layers + self.vocab * self.hidden + self.hidden + self.vision_params()

    def lora_params(self, rank: int, targets: Sequence[str]) -> int:
        """A = r (d_in + d_out) per targeted module: each layer's targeted linears, ``lm_head`` (h -> V) when
        targeted, and the vision tower's (:meth:`VisionTower.lora_params`); names outside :meth:`lora_modules`
        count 0."""
        linears = self.linears()
        per_layer = sum(sum(linears[t]) for t in targets if t in linears)
        head = self.hidden + self.vocab if "lm_head" in targets else 0
        vision = self.vision.lora_params(targets) if self.vision else 0
        return rank * (self.layers * per_layer + head + vision)

    def lora_modules(self) -> tuple[str, ...]:
        """The module names :meth:`lora_params` counts: :data:`LORA_MODULES`, + the vision tower's."""
        return LORA_MODULES + (tuple(self.vision.linears()) if self.vision else ())

    def kv_bytes_per_token(self, b: int) -> int:
        """Keys and values of one token over all layers: 2 L kv_heads head_dim b."""
        return 2 * self.layers * self.kv_dim * b


# ---------------------------------------------------------------------------- LoRA (the one place to update)
def lora_of(model_args: Any) -> tuple[int, tuple[str, ...]]:
    """``(rank, target modules)`` of a worker's LoRA (:func:`roll.config.lora.lora_settings`: LoRA is on when
    ``lora_target`` is set; rank 0 = off). ``all-linear`` is every linear layer of the decoder; a regular expression
    target is counted as ``all-linear`` (an upper bound: which modules it matches depends on the model)."""
    from roll.config.lora import ALL_LINEAR, lora_settings

    settings = lora_settings(model_args)
    if settings is None:
        return 0, ()
    target = settings.target
    return settings.rank, LINEAR_MODULES if isinstance(target, str) or ALL_LINEAR in target else tuple(target)


def reference_from_adapters(cfg: Any) -> bool:
    """Whether the reference log-probs come from actor_train with its LoRA adapters off (no reference weights are
    counted): :func:`roll.config.lora.reference_from_actor`."""
    from roll.config.lora import reference_from_actor

    return reference_from_actor(cfg)


# ---------------------------------------------------------------------------- token budgets and working memory
def train_tokens(worker: Any, sequence_length: int) -> int:
    """Tokens of a training micro-batch: ``max_tokens_per_microbatch_in_train`` with dynamic batching, else
    ``per_device_train_batch_size x sequence_length``."""
    if worker.use_dynamic_batching_in_train and worker.max_tokens_per_microbatch_in_train > 0:
        return int(worker.max_tokens_per_microbatch_in_train)
    return int(worker.training_args.per_device_train_batch_size) * sequence_length


def infer_tokens(worker: Any, sequence_length: int) -> int:
    """Tokens of a log-prob micro-batch: ``max_tokens_per_microbatch_in_infer`` with dynamic batching, else
    ``infer_batch_size x sequence_length``."""
    if worker.use_dynamic_batching_in_infer and worker.max_tokens_per_microbatch_in_infer > 0:
        return int(worker.max_tokens_per_microbatch_in_infer)
    return int(worker.infer_batch_size) * sequence_length


def layer_activation_bytes(shape: ModelShape, b: int, liger: bool = False, tp: int = 1) -> float:
    """Bytes one decoder layer keeps per token for its backward, not checkpointed:
    b (4h + (2 q + 2 kv + 4 I) / TP): both norms' inputs and outputs, q and k after RoPE, v, the attention
    output, the MLP's gate, up, act(gate) and their product (the TP-split ones divided by TP); plus 2 x 4h of fp32
    copies in transformers' RMSNorm when b < 4. Liger's kernels recompute act(gate) (3 I) and fuse the norms."""
    mlp = (3 if liger else 4) * shape.intermediate
    split = (2 * shape.q_dim + 2 * shape.kv_dim + mlp) / tp
    fp32_norms = 0 if liger or b >= 4 else 2 * 4 * shape.hidden
    return b * (4 * shape.hidden + split) + fp32_norms


def activation_bytes(
    shape: ModelShape, b: int, tokens: int, checkpointing: bool, liger: bool = False, tp: int = 1
) -> float:
    """Activations a training micro-batch of n tokens keeps for its backward: n (L x layer + 2 b h); checkpointed
    n (L b h + 2 b h), each layer's input only. 2 b h: the embedding output and the final hidden states the LM
    head reads. (Measured on an H200, 0.5B shape, 4k-16k tokens: within 0.4% without checkpointing, 8% with.)
    A vision tower's activations are not counted; its image tokens count here as the decoder's tokens."""
    kept = shape.layers * (b * shape.hidden if checkpointing else layer_activation_bytes(shape, b, liger, tp))
    return tokens * (kept + 2 * b * shape.hidden)


def recompute_bytes(shape: ModelShape, b: int, tokens: int, liger: bool = False, tp: int = 1) -> float:
    """The one layer a checkpointed backward recomputes at a time: n x layer. It comes after the LM head's
    backward, so the two never coexist (the backward peaks at the larger)."""
    return tokens * layer_activation_bytes(shape, b, liger, tp)


def forward_bytes(shape: ModelShape, b: int, tokens: int, tp: int = 1) -> float:
    """Working memory of a no-grad forward of n tokens: n b (3h + 3 I / TP): the residual stream, a norm's output,
    and the MLP's gate, up and product (nothing is kept from layer to layer)."""
    return tokens * b * (3 * shape.hidden + 3 * shape.intermediate / tp)


def chunk_tokens(vocab: int) -> int:
    """Tokens per LM-head chunk of :mod:`roll.models.logprobs` (``CHUNK_ELEMENTS`` logits)."""
    from roll.models.logprobs import CHUNK_ELEMENTS

    return max(1, CHUNK_ELEMENTS // vocab)


def logit_bytes(shape: ModelShape, b: int, tokens: int, compiled: bool, backward: bool) -> float:
    """One LM-head chunk (roll never holds all of a micro-batch's logits): m = min(n, chunk tokens) rows of V.
    Backward: m V (2 b + 4 t) (the recomputed logits and their gradient, t fp32 temporaries when eager);
    forward: m V (b + 4 t). t = 0 compiled, else :data:`EAGER_LOGIT_TEMPS_BACKWARD` / ``_FORWARD`` (one fewer
    in fp32, where the logits are already fp32)."""
    rows = min(tokens, chunk_tokens(shape.vocab))
    temps = 0 if compiled else (EAGER_LOGIT_TEMPS_BACKWARD if backward else EAGER_LOGIT_TEMPS_FORWARD) - (b >= 4)
    return rows * shape.vocab * ((2 if backward else 1) * b + FP32_BYTES * temps)


# ---------------------------------------------------------------------------- what a memory model returns
@dataclass(frozen=True)
class Term:
    """GiB that ``role`` holds on each of its GPUs for one reason (``what``); ``row`` is its line in the table."""

    role: str
    row: str
    what: str
    gib: float


@dataclass(frozen=True)
class RoleMemory:
    """A role's memory on each of its GPUs, in the three states the phase switches move between."""

    role: str
    strategy: str
    resident: tuple[Term, ...]  # held for the whole run unless offloaded: weights, gradients, optimizer, pools
    working: tuple[Term, ...] = ()  # only while its phase runs: activations and logits, or the optimizer step's
    offloaded: tuple[Term, ...] = ()  # what stays on the GPU after offload_states (idle, colocated, offloading)
    processes: int = 1  # processes holding a CUDA context on each of its GPUs
    pooled: bool = False  # its memory is a fixed pool of its own (SGLang): no allocator fragmentation on top
    summary: str = ""  # how it was counted, one phrase


@dataclass(frozen=True)
class RoleInputs:
    """What a memory model reads: the role's worker block, its model's shape, and the run around it."""

    role: str
    worker: Any
    shape: ModelShape
    world: int  # the role's ranks (len(device_mapping) / num_gpus_per_worker)
    sequence_length: int
    gpu_gib: float
    lora: tuple[int, tuple[str, ...]] = (0, LINEAR_MODULES)  # (rank, targets); rank 0 = off
    max_running_requests: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def b(self) -> int:
        return DTYPE_BYTES[self.worker.model_args.dtype]

    @property
    def frozen_tower(self) -> bool:
        """Whether a trainer keeps its vision tower fixed (``model_args.freeze_vision_tower``): no gradients."""
        return bool(getattr(self.worker.model_args, "freeze_vision_tower", False)) and self.shape.vision is not None

    def term(self, row: str, what: str, nbytes: float) -> Term:
        """A :class:`Term` of ``nbytes`` bytes; a role other than actor_train files it under its own row."""
        return Term(self.role, ROLE_ROWS.get(self.role, row), what, nbytes / GIB)

    def options(self) -> Any:
        """The role's typed ``strategy_config`` (parsed once by the preflight, else here)."""
        from roll.strategies.registry import strategy_options

        return strategy_options(self.worker, f"{self.role}.strategy_args.strategy_config")

    def trained(self, value_head: bool = False) -> tuple[int, int]:
        """``(weights, trained)`` parameter counts: (P, P) in full training, (P, P - the vision tower) with
        ``freeze_vision_tower``; (P + A, A) with LoRA."""
        p = self.shape.params(value_head)
        rank, targets = self.lora
        if not rank:
            return p, p - (self.shape.vision_params() if self.frozen_tower else 0)
        unknown = sorted(set(targets) - set(self.shape.lora_modules()))
        if unknown:
            self.notes.append(f"lora_target modules {unknown} are not known to the planner and count 0")
        adapters = self.shape.lora_params(rank, targets)
        return p + adapters, adapters


#: One memory model per strategy name: ``(RoleInputs) -> RoleMemory``. A strategy without one is not estimated.
MEMORY_MODELS: Registry[Callable[[RoleInputs], RoleMemory]] = Registry("memory model", "register_memory_model")
register_memory_model = MEMORY_MODELS.register


def largest(*candidates: tuple[Term, ...]) -> tuple[Term, ...]:
    """The candidate working set with the most GiB (a role's passes do not overlap in time)."""
    return max(candidates, key=lambda terms: sum(t.gib for t in terms))


def training_passes(x: RoleInputs, step: tuple[Term, ...], tp: int = 1, megatron: bool = False) -> tuple[Term, ...]:
    """A trainer's working memory: the largest of its backward at the LM head (activations + one LM-head chunk, or
    Megatron's whole logits), its backward through a recomputed layer (checkpointing), its optimizer step
    (``step``: activations are freed by then) and its log-prob forward."""
    margs, b, shape, liger = x.worker.model_args, x.b, x.shape, x.worker.model_args.use_liger_kernel
    n, m = train_tokens(x.worker, x.sequence_length), infer_tokens(x.worker, x.sequence_length)
    checkpointing = _recomputes(x) if megatron else not margs.disable_gradient_checkpointing
    act = x.term("activations", f"activations ({n:,} tokens)", activation_bytes(shape, b, n, checkpointing, liger, tp))
    head: tuple[Term, ...] = (act,)
    forward: tuple[Term, ...] = (
        x.term("activations", f"log-prob forward ({m:,} tokens)", forward_bytes(shape, b, m, tp)),
    )
    if x.role != "critic":  # a value head has no vocabulary-wide logits
        if megatron:
            logits = (n * shape.vocab / tp * MEGATRON_LOGIT_BYTES, m * shape.vocab / tp * MEGATRON_LOGIT_BYTES)
        else:
            compiled = margs.compile_log_probs
            logits = (logit_bytes(shape, b, n, compiled, True), logit_bytes(shape, b, m, compiled, False))
        what = "logits" if megatron else "LM-head chunk"
        head += (x.term("logits", what, logits[0]),)
        forward += (x.term("logits", what, logits[1]),)
    layer = (act, x.term("activations", "recomputed layer", recompute_bytes(shape, b, n, liger, tp)))
    return largest(head, layer if checkpointing else (), step, forward)


def _recomputes(x: RoleInputs) -> bool:
    """Megatron checkpoints whole layers with ``recompute_granularity: full`` (``selective`` recomputes only
    core attention, which flash attention does not keep anyway)."""
    return x.options().recompute_granularity == "full"
