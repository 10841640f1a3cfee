"""``deepspeed_train``: DeepSpeed ZeRO 0-3 training (gloo on CPU, NCCL on GPU).

``strategy_config`` is :class:`~roll.config.strategies.DeepSpeedTrainOptions`: the sections of a DeepSpeed config
(as in ROLL's ``deepspeed_zero*`` fragments; ``"auto"`` values are filled from the worker block), plus shorthands:
``zero_stage`` (int), ``offload_optimizer`` and ``offload_param`` ("cpu" or "none"). The optimizer is torch AdamW,
so no DeepSpeed op has to be compiled for it.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from roll.config.lora import lora_settings
from roll.config.strategies import DeepSpeedTrainOptions
from roll.models.loading import load_causal_lm, load_tokenizer, scoring_attention
from roll.models.lora import ExportEntry, adapter_names, adapter_state_dict, add_adapters, export_plan
from roll.models.vision import copy_image_processor, freeze_vision_tower
from roll.strategies.accumulation import AccumulatingTrainer, ForwardLogProbs, move_module_and_optimizer
from roll.strategies.base import CriticStrategy, StrategyContext, TrainStrategy
from roll.strategies.build_locks import prepare_deepspeed_comm
from roll.strategies.critic import ValueHeadCritic
from roll.strategies.schedule import lr_at  # noqa: F401  (re-exported: the schedule of this backend)
from roll.weights.buckets import BucketMeta, NamedTensors, plan_bucket_metas

#: DeepSpeed config keys roll passes through when they are set (None / empty means: DeepSpeed's default).
PASSTHROUGH = (
    "zero_force_ds_cpu_optimizer",
    "zero_allow_untested_optimizer",
    "activation_checkpointing",
    "communication_data_type",
    "prescale_gradients",
)


def build_ds_config(
    opts: DeepSpeedTrainOptions,
    *,
    micro_batch: int,
    grad_accum: int,
    world_size: int,
    max_grad_norm: float,
    dtype: str,
    key: str = "deepspeed_train.strategy_config",
) -> dict[str, Any]:
    """A complete DeepSpeed config from the typed options: shorthands folded into ``zero_optimization``, ``auto``
    values resolved from the worker block, precision from ``dtype`` (``key`` names the options in errors)."""
    zero = copy.deepcopy(dict(opts.zero_optimization))
    if opts.zero_stage is not None:
        zero["stage"] = opts.zero_stage
    for name in ("offload_optimizer", "offload_param"):
        if getattr(opts, name) == "cpu":
            zero[name] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    zero.setdefault("stage", 0)
    cfg: dict[str, Any] = {"zero_optimization": {k: v for k, v in zero.items() if v != "auto"}}
    resolved = {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": grad_accum,
        "train_batch_size": micro_batch * grad_accum * world_size,
        "gradient_clipping": max_grad_norm,
    }
    for name, value in resolved.items():
        given = getattr(opts, name)
        if given != "auto" and given != value:
            raise ValueError(
                f"deepspeed_train: {key}.{name}={given} disagrees with the worker block ({value}); "
                f"set it to 'auto' or remove it"
            )
        cfg[name] = value
    for name, wanted in (("bf16", dtype == "bf16"), ("fp16", dtype == "fp16")):
        given = getattr(opts, name).get("enabled", "auto")
        if given != "auto" and bool(given) != wanted:
            raise ValueError(
                f"deepspeed_train: {key}.{name}.enabled={given} disagrees with model_args.dtype "
                f"({dtype}); set it to 'auto' or remove it"
            )
        cfg[name] = {"enabled": wanted}
    for name in PASSTHROUGH:
        value = getattr(opts, name)
        if value not in (None, {}):
            cfg[name] = copy.deepcopy(value)
    cfg["steps_per_print"], cfg["wall_clock_breakdown"] = opts.steps_per_print, opts.wall_clock_breakdown
    return cfg


def init_deepspeed_distributed(seed: int) -> None:
    """Seed torch, pick this worker's GPU (``LOCAL_RANK``) and join the role's process group (NCCL on GPU, gloo
    on CPU; the rendezvous variables are set by the worker)."""
    import deepspeed

    torch.manual_seed(seed)
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    prepare_deepspeed_comm(on_gpu)  # on CPU: no JIT build of DeepSpeed's shm comm op (roll/strategies/build_locks.py)
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo", auto_mpi_discovery=False)


class DeepSpeedTrainer(AccumulatingTrainer):
    """A model wrapped in a DeepSpeed engine, the body both roles share; ``train_step`` is the shared one of
    :class:`~roll.strategies.accumulation.AccumulatingTrainer` (DeepSpeed's own accumulation counter is
    overridden: the boundary is set per micro-batch and gradients are not divided by its accumulation steps)."""

    options: DeepSpeedTrainOptions

    def _load_model(self) -> torch.nn.Module:
        """The model to train (a causal LM; the critic overrides this with a value model)."""
        margs = self.config.model_args
        attention = scoring_attention(margs.attn_implementation, margs.dtype, self.config.use_sequence_packing)
        return load_causal_lm(
            margs.model_name_or_path, margs.dtype, attention, margs.trust_remote_code, margs.use_liger_kernel
        )

    def initialize(self, ctx: StrategyContext) -> None:
        import deepspeed

        init_deepspeed_distributed(ctx.seed)
        margs, targs = self.config.model_args, self.config.training_args
        self.lora = lora_settings(margs)
        model = self._load_model()
        if margs.freeze_vision_tower:
            freeze_vision_tower(model)
        if not margs.disable_gradient_checkpointing:
            model.gradient_checkpointing_enable()
            model.config.use_cache = False
        if self.lora is not None:
            model = add_adapters(model, self.lora, checkpointing=not margs.disable_gradient_checkpointing)
        self.tokenizer = load_tokenizer(margs.model_name_or_path)
        # foreach: one kernel per operation over all tensors (torch's default on CUDA only; on CPU the per-tensor
        # loop cost more than the rest of a small model's step), with the same results bit for bit
        optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],  # with LoRA: the adapters only
            lr=targs.learning_rate,
            foreach=True,
            betas=(targs.adam_beta1, targs.adam_beta2),
            weight_decay=targs.weight_decay,
        )
        self.ds_config = build_ds_config(
            self.options,
            micro_batch=targs.per_device_train_batch_size,
            grad_accum=targs.gradient_accumulation_steps,
            world_size=self.world_size,
            max_grad_norm=ctx.max_grad_norm,
            dtype=margs.dtype,
        )
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=self.ds_config
        )
        self.torch_optimizer = optimizer  # ZeRO wraps it; its per-parameter state is the Adam moments
        self.export = export_plan(self.engine.module) if self.lora is not None else None
        self.device = self.engine.device
        self.total_steps = targs.max_steps or ctx.total_steps
        self.optimizer_steps = 0

    @property
    def zero_stage(self) -> int:
        return int(self.ds_config["zero_optimization"]["stage"])

    # ------------------------------------------------------------------ hooks of the shared training step
    def _model(self) -> torch.nn.Module:
        return self.engine

    def _collective_forward(self) -> bool:
        return self.zero_stage == 3  # parameters are gathered from every rank in each forward

    def _before_micro(self, boundary: bool) -> None:
        self.engine.set_gradient_accumulation_boundary(boundary)

    def _backward(self, loss: torch.Tensor, boundary: bool) -> None:
        self.engine.backward(loss, scale_wrt_gas=False)

    def _optimizer_step(self) -> float:
        """``engine.step()`` at the boundary; the pre-clip norm from DeepSpeed's ZeRO optimizer, or computed here
        for stage 0, where DeepSpeed keeps none (it reported 0)."""
        norm = self._local_grad_norm() if self.zero_stage == 0 else None
        self.engine.step()
        if norm is None:
            value = self.engine.get_global_grad_norm()
            norm = float(value) if value is not None else float("nan")
        return norm

    def _local_grad_norm(self) -> float:
        """L2 norm of the module's gradients (after DeepSpeed's data-parallel all-reduce: already global)."""
        grads = [p.grad.detach().float().norm() for p in self.engine.module.parameters() if p.grad is not None]
        return float(torch.linalg.vector_norm(torch.stack(grads))) if grads else 0.0

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def reset_optimizer(self) -> None:
        """Drop the Adam moments; the next step starts them afresh. Without this, second moments built up by the
        warm start's large supervised gradients keep the first RL updates about as small as their ratio."""
        self.torch_optimizer.state.clear()

    def _gathered(self, names: list[str] | None = None):
        """Whole parameters (all, or those ``names``) inside the context: ZeRO-3 gathers them collectively."""
        import deepspeed

        params = dict(self.engine.module.named_parameters())
        chosen = list(params.values()) if names is None else [params[n] for n in names]
        return deepspeed.zero.GatheredParameters(chosen, modifier_rank=None, enabled=self.zero_stage == 3)

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Every rank must call this (ZeRO-3 gathers collectively); only rank 0 copies the weights out, the other
        ranks return an empty list rather than shipping identical copies. With LoRA: the plain model's weights with
        the adapters merged in (:func:`roll.models.lora.export_plan`)."""
        with self._gathered():
            if self.rank != 0:
                return []
            params = {n: p.detach() for n, p in self.engine.module.named_parameters()}
            if self.export is None:
                return [(n, p.to("cpu", copy=True)) for n, p in params.items()]
            return [(e.name, e.merge(params).to("cpu", copy=True)) for e in self.export]

    def weight_bucket_metas(self, bucket_bytes: int) -> list[BucketMeta]:
        """Buckets of the full weights (names, dtypes, full shapes; ZeRO-3 shards report ``ds_shape``), in
        ``named_parameters`` order; the same on every rank. A tied ``lm_head`` is not a separate parameter. With
        LoRA: the plain model's weights (the merged export of :meth:`named_weights`)."""
        params = dict(self.engine.module.named_parameters())
        entries = self.export or [ExportEntry(n, n) for n in params]
        specs = [
            (e.name, getattr(params[e.source], "ds_shape", params[e.source].shape), params[e.source].dtype)
            for e in entries
        ]
        return plan_bucket_metas(specs, bucket_bytes)

    def weight_buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        """The full weights on this worker's device, one bucket of :meth:`weight_bucket_metas` at a time.

        Every rank must iterate (ZeRO-3 gathers each bucket collectively). The tensors are the parameters
        themselves (with LoRA, merged weights are new tensors): valid, and not to be modified, until the next
        bucket is requested."""
        params = dict(self.engine.module.named_parameters())
        entries = {e.name: e for e in self.export or [ExportEntry(n, n) for n in params]}
        for meta in self.weight_bucket_metas(bucket_bytes):
            chosen = [entries[n] for n in meta.names]
            with self._gathered([s for e in chosen for s in e.sources()]):
                tensors = [e.merge({s: params[s].data for s in e.sources()}) for e in chosen]
                for name, shape, t in zip(meta.names, meta.shapes, tensors):
                    if list(t.shape) != shape:
                        raise RuntimeError(
                            f"deepspeed_train: weight {name} has shape {list(t.shape)} after the "
                            f"gather, its bucket plan says {shape}"
                        )
                yield list(zip(meta.names, tensors))

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.engine.module.named_parameters())
        with self._gathered(), torch.no_grad():
            for name, tensor in named_tensors:
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))

    def save_pretrained(self, path: str) -> None:
        """The model and tokenizer in Hugging Face format, written by rank 0 (every rank must call it); with LoRA,
        a peft adapter directory (``adapter_config.json``, ``adapter_model.safetensors``)."""
        weights = self._adapter_tensors() if self.export is not None else dict(self.named_weights())
        if self.rank == 0:
            Path(path).mkdir(parents=True, exist_ok=True)
            self.engine.module.save_pretrained(path, state_dict=weights)
            self.tokenizer.save_pretrained(path)
            copy_image_processor(self.config.model_args.model_name_or_path, path)

    def _adapter_tensors(self) -> dict[str, torch.Tensor]:
        """The adapter's parameters, whole, as CPU copies on rank 0 (``{}`` on the others; ZeRO-3 gathers them
        collectively, so every rank must call)."""
        names = adapter_names(self.engine.module)
        with self._gathered(names):
            if self.rank != 0:
                return {}
            params = dict(self.engine.module.named_parameters())
            return {n: params[n].detach().to("cpu", copy=True) for n in names}

    def adapter_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The LoRA adapter's tensors under peft's state-dict names, as CPU copies on rank 0 (``[]`` on the
        others); every rank must call."""
        tensors = self._adapter_tensors()
        return list(adapter_state_dict(self.engine.module, tensors).items()) if tensors else []

    def save_checkpoint(self, path: str) -> None:
        """DeepSpeed's checkpoint; with LoRA without the frozen base weights: the adapter and its optimizer states
        (``exclude_frozen_parameters``, and a state-dict hook for what that keeps: a tied LM head, which
        ``named_parameters`` does not list)."""
        lora = self.export is not None
        keep = set(adapter_names(self.engine.module)) if lora else set()

        def adapter_only(module, state, prefix, metadata) -> None:
            for name in [n for n in state if n.removeprefix(prefix) not in keep]:
                del state[name]

        hook = self.engine.module.register_state_dict_post_hook(adapter_only) if lora else None
        try:
            self.engine.save_checkpoint(
                path,
                tag="engine",
                client_state={"optimizer_steps": self.optimizer_steps},
                exclude_frozen_parameters=lora,
            )
        finally:
            if hook is not None:
                hook.remove()

    def load_checkpoint(self, path: str) -> None:
        """Restore :meth:`save_checkpoint` (with LoRA, the base weights stay those loaded at start)."""
        _, client = self.engine.load_checkpoint(path, tag="engine", load_module_strict=self.export is None)
        self.optimizer_steps = int((client or {}).get("optimizer_steps", 0))

    def offload_states(self) -> None:
        """GPU only: move parameters, gradients and optimizer states to CPU memory (ZeRO 1-3 through DeepSpeed's
        ``engine.offload_states``, stage 0 by moving the module and the optimizer state tensors), then free the
        CUDA cache; a no-op on CPU, when already offloaded, or when ZeRO already keeps parameters on CPU."""
        if self.device.type != "cuda" or getattr(self, "_offloaded", False):
            return
        zero = self.ds_config["zero_optimization"]
        if zero.get("offload_param", {}).get("device") == "cpu":
            return  # DeepSpeed cannot move states of CPU-offloaded parameters; they already live on CPU
        if self.zero_stage > 0:
            self.engine.offload_states(include=self._offloadable_states())
        else:
            self._move_stage0(torch.device("cpu"))
        torch.cuda.empty_cache()
        self._offloaded = True

    def reload_states(self) -> None:
        """Undo :meth:`offload_states`."""
        if not getattr(self, "_offloaded", False):
            return
        if self.zero_stage > 0:
            self.engine.reload_states()
        else:
            self._move_stage0(self.device)
        self._offloaded = False

    def _offloadable_states(self) -> list | None:
        """What ``engine.offload_states`` may move: everything (None), except under ZeRO-3 with an optimizer other
        than DeepSpeed's FusedAdam, where DeepSpeed moves only bf16 weights, gradients and the gradient buffer
        (the fp32 master weights and Adam states then stay on the GPU)."""
        if self.zero_stage != 3 or type(getattr(self.engine.optimizer, "optimizer", None)).__name__ == "FusedAdam":
            return None
        from deepspeed.runtime.zero.offload_config import OffloadStateTypeEnum as State

        return [State.lp_params, State.lp_grads, State.contiguous_grad_buffer]

    def _move_stage0(self, device: torch.device) -> None:
        move_module_and_optimizer(self.engine.module, self.optimizer, device)


class DeepSpeedTrainStrategy(ForwardLogProbs, DeepSpeedTrainer, TrainStrategy):
    """``deepspeed_train`` in the ``actor_train`` role: a causal LM that trains and scores; with LoRA keys, its
    adapters train and the base stays frozen (:mod:`roll.models.lora`)."""

    supports_lora = True


class DeepSpeedCriticStrategy(ValueHeadCritic, DeepSpeedTrainer, CriticStrategy):
    """``deepspeed_train`` in the ``critic`` role: a value model (:mod:`roll.models.value_model`) in a DeepSpeed
    engine, trained as :class:`~roll.strategies.critic.ValueHeadCritic` describes."""

    def _load_model(self) -> torch.nn.Module:
        from roll.models.value_model import load_value_model

        margs = self.config.model_args
        return load_value_model(
            margs.model_name_or_path, margs.dtype, margs.attn_implementation, margs.trust_remote_code
        )

    def _value_module(self) -> torch.nn.Module:
        return self.engine

    def _parameter_names(self) -> set[str]:
        return {n for n, _ in self.engine.module.named_parameters()}
