"""``fsdp2_train``: training on PyTorch FSDP2 (``fully_shard``; gloo on CPU, NCCL on GPU), a drop-in for
``deepspeed_train`` (the same training step, weight sync, checkpoints and offload).

``strategy_config``: :class:`roll.config.fsdp2.FSDP2Options` (ROLL's keys: ``fsdp_size``, ``param_dtype``,
``reduce_dtype``, ``reshard_after_forward``, ``offload_policy``, ``wrap_policy``).

- Precision: the sharded parameters (the optimizer's master weights) are fp32; forward and backward run in
  ``param_dtype`` (default ``model_args.dtype``), gradients accumulate and reduce in ``reduce_dtype`` (fp32), the
  way DeepSpeed's bf16 mode keeps fp32 master weights of bf16 ones.
- Gradient accumulation: ``set_requires_gradient_sync`` is on only for a step's last micro-batch, so gradients are
  reduce-scattered once per optimizer step, not per micro-batch (FSDP2 accumulates them unsharded until then).
- Activation checkpointing: ``model_args.disable_gradient_checkpointing: false`` checkpoints every decoder layer
  (transformers' non-reentrant checkpointing, which FSDP2 supports).
- Checkpoints: ``torch.distributed.checkpoint`` (DCP) of the sharded model and optimizer states (every rank writes
  its shards) plus ``roll_state.json`` (``optimizer_steps``); exact resume with the same world size.
- Weights for sync and export: gathered from the shards one tensor at a time, in ``model_args.dtype``
  (``save_pretrained``: the full state dict, buffers included).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

from roll.config.fsdp2 import FSDP2Options, fsdp2_options
from roll.config.lora import lora_settings
from roll.data.batch import Batch
from roll.models.loading import DTYPES, load_causal_lm, load_tokenizer, scoring_attention
from roll.models.lora import ExportEntry, adapter_names, adapter_state_dict, add_adapters, export_plan
from roll.models.vision import copy_image_processor, freeze_vision_tower
from roll.strategies.accumulation import AccumulatingTrainer, ForwardLogProbs, move_module_and_optimizer
from roll.strategies.base import CriticStrategy, StrategyContext, TrainStrategy
from roll.strategies.critic import ValueHeadCritic
from roll.strategies.fsdp2_shard import (
    clip_grad_norm,
    compute_dtype_of,
    device_mesh,
    enable_activation_checkpointing,
    full_tensor,
    init_fsdp2_distributed,
    load_full,
    reshard_all,
    shard_model,
)
from roll.weights.buckets import BucketMeta, NamedTensors, plan_bucket_metas

#: File next to the DCP shards holding roll's own state of a checkpoint.
STATE_FILE = "roll_state.json"


class FSDP2Trainer(AccumulatingTrainer):
    """A model sharded by FSDP2 with a torch AdamW over its shards, the body both roles share; ``train_step`` is
    the shared one of :class:`~roll.strategies.accumulation.AccumulatingTrainer`."""

    name = "fsdp2_train"
    role = "actor_train"  # the worker block named in config errors
    options: FSDP2Options

    def _load_model(self, attention: str | None) -> torch.nn.Module:
        """The model to train, in fp32 (the master weights; the critic overrides this with a value model)."""
        margs = self.config.model_args
        return load_causal_lm(
            margs.model_name_or_path, "fp32", attention, margs.trust_remote_code, margs.use_liger_kernel
        )

    def initialize(self, ctx: StrategyContext) -> None:
        self.options = fsdp2_options(self.config, self.role, self.world_size, self.options)
        self.device = init_fsdp2_distributed(ctx.seed)
        margs, targs = self.config.model_args, self.config.training_args
        self.compute_dtype = compute_dtype_of(self.options, margs.dtype)
        model = self._load_model(
            scoring_attention(margs.attn_implementation, self.compute_dtype, self.config.use_sequence_packing)
        )
        if not margs.disable_gradient_checkpointing:
            enable_activation_checkpointing(model)
        if margs.freeze_vision_tower:
            freeze_vision_tower(model)
        self.lora = lora_settings(margs)
        if self.lora is not None:
            model = add_adapters(model, self.lora, checkpointing=not margs.disable_gradient_checkpointing)
        self.mesh = device_mesh(self.device, self.world_size, self.options.fsdp_size)
        self.model = shard_model(
            model, self.mesh, self.options, self.compute_dtype, reduce_dtype=self.options.reduce_dtype
        )
        self.export = export_plan(self.model) if self.lora is not None else None
        self.tokenizer = load_tokenizer(margs.model_name_or_path)
        self.optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],  # with LoRA: the adapters only
            lr=targs.learning_rate,
            foreach=True,
            betas=(targs.adam_beta1, targs.adam_beta2),
            weight_decay=targs.weight_decay,
        )
        self.max_grad_norm = ctx.max_grad_norm
        self.total_steps = targs.max_steps or ctx.total_steps
        self.optimizer_steps = 0
        self._offloaded = False

    # ------------------------------------------------------------------ hooks of the shared training step
    def _model(self) -> torch.nn.Module:
        return self.model

    def _collective_forward(self) -> bool:
        return True  # every unit's forward all-gathers its parameters from the ranks that shard it

    def _before_micro(self, boundary: bool) -> None:
        self.model.set_requires_gradient_sync(boundary)

    def _backward(self, loss: torch.Tensor, boundary: bool) -> None:
        loss.backward()

    def _optimizer_step(self) -> float:
        """Clip to ``max_grad_norm`` (0: no clipping), step, zero; returns the pre-clip global gradient norm (the
        shards' norms combined over the mesh)."""
        norm = clip_grad_norm(list(self.model.parameters()), self.max_grad_norm, self.mesh, self.device)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def reset_optimizer(self) -> None:
        """Drop the Adam moments (see :meth:`DeepSpeedTrainer.reset_optimizer` for why)."""
        self.optimizer.state.clear()

    # ------------------------------------------------------------------ weights out and in
    def forward_batch(self, batch: Batch, key: str, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        out = super().forward_batch(batch, key, with_entropy)
        reshard_all(self.model)  # free what a forward without backward leaves gathered
        return out

    def _params(self) -> dict[str, torch.Tensor]:
        """The sharded parameters by name (a tied LM head is not a separate parameter)."""
        reshard_all(self.model)
        return dict(self.model.named_parameters())

    def _entries(self) -> list[ExportEntry]:
        """What the weight export sends: every parameter, or with LoRA the plain model's merged weights."""
        return self.export or [ExportEntry(n, n) for n in self._params()]

    def _exported(self, entry: ExportEntry, params: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        """One exported weight, whole, on this worker's device in ``dtype`` (collective: every rank calls); a
        merged weight is computed from the fp32 master shards before the cast."""
        if entry.lora_a is None:
            return full_tensor(params[entry.source], self.device, dtype)
        return entry.merge({s: full_tensor(params[s], self.device) for s in entry.sources()}).to(dtype)

    def weight_bucket_metas(self, bucket_bytes: int) -> list[BucketMeta]:
        """Buckets of the full weights (names, ``model_args.dtype``, full shapes) in ``named_parameters`` order;
        the same on every rank. With LoRA: the plain model's weights, adapters merged in."""
        params, dtype = self._params(), DTYPES[self.config.model_args.dtype]
        return plan_bucket_metas([(e.name, params[e.source].shape, dtype) for e in self._entries()], bucket_bytes)

    def weight_buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        """The full weights on this worker's device in ``model_args.dtype``, one bucket of
        :meth:`weight_bucket_metas` at a time. Every rank must iterate (each tensor is gathered collectively); the
        tensors are fresh copies, valid until the next bucket is requested."""
        params, dtype = self._params(), DTYPES[self.config.model_args.dtype]
        entries = {e.name: e for e in self._entries()}
        for meta in self.weight_bucket_metas(bucket_bytes):
            yield [(name, self._exported(entries[name], params, dtype)) for name in meta.names]

    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Every rank must call this (gathers are collective); rank 0 returns CPU copies, the others ``[]``. With
        LoRA: the plain model's weights with the adapters merged in (:func:`roll.models.lora.export_plan`)."""
        params, dtype = self._params(), DTYPES[self.config.model_args.dtype]
        out = []
        for entry in self._entries():
            tensor = self._exported(entry, params, dtype)
            if self.rank == 0:
                out.append((entry.name, tensor.cpu()))
        return out

    def _adapter_tensors(self) -> dict[str, torch.Tensor]:
        """The adapter's parameters, whole, in ``model_args.dtype`` as CPU copies on rank 0 (``{}`` on the others;
        every rank must call: the gathers are collective)."""
        params, dtype = self._params(), DTYPES[self.config.model_args.dtype]
        tensors = {n: full_tensor(params[n], self.device, dtype).cpu() for n in adapter_names(self.model)}
        return tensors if self.rank == 0 else {}

    def adapter_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The LoRA adapter's tensors under peft's state-dict names (rank 0; ``[]`` on the others; collective)."""
        tensors = self._adapter_tensors()
        return list(adapter_state_dict(self.model, tensors).items()) if tensors else []

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace weights with whole tensors (each rank keeps its shard; no communication)."""
        params = self._params()
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"{self.name}.load_weights: no parameter {name!r} in the model")
            load_full(params[name], tensor)

    def save_pretrained(self, path: str) -> None:
        """The full state dict (parameters and persistent buffers, gathered tensor by tensor to rank 0's CPU) in
        ``model_args.dtype``, saved by rank 0 with the tokenizer; with LoRA, a peft adapter directory
        (``adapter_config.json``, ``adapter_model.safetensors``). Every rank must call it."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        reshard_all(self.model)
        if self.export is not None:
            adapter = self._adapter_tensors()
            if self.rank == 0:
                Path(path).mkdir(parents=True, exist_ok=True)
                self.model.save_pretrained(path, state_dict=adapter)
                self.tokenizer.save_pretrained(path)
                copy_image_processor(self.config.model_args.model_name_or_path, path)
            return
        full = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:
            dtype = DTYPES[self.config.model_args.dtype]
            state = {k: v.to(dtype) if v.is_floating_point() else v for k, v in full.items()}
            Path(path).mkdir(parents=True, exist_ok=True)
            self.model.save_pretrained(path, state_dict=state)
            self.tokenizer.save_pretrained(path)
            copy_image_processor(self.config.model_args.model_name_or_path, path)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, path: str) -> None:
        """DCP shards of the model (with LoRA: the adapter) and (when it has state) the optimizer, plus
        ``roll_state.json``. An optimizer without state (reset, no step since) is recorded as such rather than
        saved: DCP would first fill it by a zero step, and the resumed run would then count one Adam step too
        many."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        reshard_all(self.model)
        has_moments = bool(self.optimizer.state)
        state = {"model": self._model_state()}
        if has_moments:
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)
        dcp.save(state, checkpoint_id=path)
        if self.rank == 0:
            (Path(path) / STATE_FILE).write_text(
                json.dumps({"optimizer_steps": self.optimizer_steps, "optimizer_state": has_moments})
            )
        if torch.distributed.is_initialized():
            torch.distributed.barrier()  # rank 0's file exists before anyone reports the save done

    def load_checkpoint(self, path: str) -> None:
        """Restore :meth:`save_checkpoint` (with LoRA, the base weights stay those loaded at start)."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        info = json.loads((Path(path) / STATE_FILE).read_text())
        reshard_all(self.model)
        state = {"model": self._model_state()}
        self.optimizer.state.clear()
        if info["optimizer_state"]:
            state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)
        dcp.load(state, checkpoint_id=path)
        set_model_state_dict(self.model, state["model"], options=StateDictOptions(strict=self.export is None))
        if info["optimizer_state"]:
            set_optimizer_state_dict(self.model, self.optimizer, state["optimizer"])
        self.optimizer_steps = int(info["optimizer_steps"])

    def _model_state(self) -> dict[str, torch.Tensor]:
        """The model state a checkpoint holds (the shards): everything, or with LoRA the adapter only (the frozen
        base weights, a tied LM head included, are those loaded at start)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        state = get_model_state_dict(self.model)
        if self.export is None:
            return state
        keep = set(adapter_names(self.model))
        return {k: v for k, v in state.items() if k in keep}

    # ------------------------------------------------------------------ offload between phases (colocated GPUs)
    def offload_states(self) -> None:
        """GPU only: move the parameter shards and the optimizer states to CPU memory and free the CUDA cache; a
        no-op on CPU, when already offloaded, or under ``offload_policy`` (the shards already live on CPU)."""
        if self.device.type != "cuda" or self._offloaded or self.options.offload_policy:
            return
        self._move_states(torch.device("cpu"))
        torch.cuda.empty_cache()
        self._offloaded = True

    def reload_states(self) -> None:
        """Undo :meth:`offload_states`."""
        if not self._offloaded:
            return
        self._move_states(self.device)
        self._offloaded = False

    def _move_states(self, device: torch.device) -> None:
        move_module_and_optimizer(self.model, self.optimizer, device)  # FSDP2 re-registers the moved shards


class FSDP2TrainStrategy(ForwardLogProbs, FSDP2Trainer, TrainStrategy):
    """``fsdp2_train`` in the ``actor_train`` role: a causal LM that trains and scores; with LoRA keys, its
    adapters train and the base stays frozen (:mod:`roll.models.lora`)."""

    supports_lora = True


class FSDP2CriticStrategy(ValueHeadCritic, FSDP2Trainer, CriticStrategy):
    """``fsdp2_train`` in the ``critic`` role: a value model (:mod:`roll.models.value_model`) sharded by FSDP2,
    trained as :class:`~roll.strategies.critic.ValueHeadCritic` describes."""

    role = "critic"

    def _load_model(self, attention: str | None) -> torch.nn.Module:
        from roll.models.value_model import load_value_model

        margs = self.config.model_args
        return load_value_model(margs.model_name_or_path, "fp32", margs.attn_implementation, margs.trust_remote_code)

    def _value_module(self) -> torch.nn.Module:
        return self.model

    def _parameter_names(self) -> set[str]:
        return set(self._params())
