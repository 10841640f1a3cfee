"""``megatron_train`` / ``megatron_infer``: megatron-core training and scoring with TP / PP (and the critic).

``strategy_config`` is :class:`roll.config.megatron.MegatronOptions` (ROLL's Megatron keys). The model is a
``GPTModel`` built from the HF config (``roll.models.mcore.build``) and filled from the HF checkpoint; Adam runs in
megatron-core's optimizer (bf16 with fp32 master weights, optional distributed optimizer) behind its DDP wrapper;
micro-batches go through megatron-core's forward-backward schedule (plain for PP = 1, 1F1B / interleaved for
PP > 1). A role of ``world_size`` ranks holds ``world_size / (TP x PP)`` data-parallel replicas: every rank of a
replica gets the same chunk of a batch, and only its collector (TP rank 0 of the last pipeline stage) returns
results (:meth:`data_parallel_info`). Weights leave in HF names and dtype (``roll.models.mcore.weights``).

Checkpoints are megatron-core distributed checkpoints (model and optimizer, sharded over ranks) plus each rank's
megatron RNG tracker state and the step count.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from functools import partial
from typing import Any

import torch

from roll.config.megatron import MegatronOptions, check_megatron_options
from roll.data.batch import Batch
from roll.models.loading import load_tokenizer
from roll.models.mcore.vocab_parallel import vocab_parallel_log_probs
from roll.strategies.accumulation import ScheduledSteps, merge_metrics
from roll.strategies.base import (
    CriticStrategy,
    LossFn,
    ScoringStrategy,
    Strategy,
    StrategyContext,
    TrainingStrategy,
    TrainStrategy,
)
from roll.strategies.microbatch import accumulation_weights, scatter_rows
from roll.weights.buckets import NamedTensors, iter_buckets


def init_megatron(opts, seed: int) -> None:
    """Join the role's process group (NCCL on GPU, gloo on CPU; rendezvous variables set by the worker) and
    build megatron-core's TP/PP/DP groups; seed torch and megatron's CUDA RNG tracker. A process that already
    did this (another megatron role in ``distributed=local``) must use the same sizes."""
    import torch.distributed as dist
    from megatron.core import parallel_state as mpu

    torch.manual_seed(seed)
    on_gpu = torch.cuda.is_available()
    if on_gpu:
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if not dist.is_initialized():
        dist.init_process_group("nccl" if on_gpu else "gloo", init_method="env://")
    sizes = (opts.tensor_model_parallel_size, opts.pipeline_model_parallel_size)
    if mpu.model_parallel_is_initialized():
        have = (mpu.get_tensor_model_parallel_world_size(), mpu.get_pipeline_model_parallel_world_size())
        if have != sizes:
            raise RuntimeError(
                f"megatron: this process already has TP x PP = {have}; a second megatron role in "
                f"it asks for {sizes} (use distributed=ray, or the same sizes)"
            )
        return
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=sizes[0],
        pipeline_model_parallel_size=sizes[1],
        virtual_pipeline_model_parallel_size=opts.virtual_pipeline_model_parallel_size,
        context_parallel_size=opts.context_parallel_size,
    )
    if on_gpu:
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(seed)


def attention_mask(mask: torch.Tensor) -> torch.Tensor:
    """megatron's boolean mask (True = not attended) from a padding mask (B, L): causal and no padded keys,
    (B, 1, L, L)."""
    length = mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=mask.device).triu(1)
    return causal[None, None] | ~mask.bool()[:, None, None, :]


def pad_width(batch: Batch, multiple: int) -> Batch:
    """``batch`` with ``input_ids`` / ``attention_mask`` right-padded to a multiple of ``multiple`` tokens
    (sequence parallelism splits the sequence over TP ranks); other keys unchanged."""
    width = batch["input_ids"].shape[1]
    extra = -width % multiple
    if not extra:
        return batch
    out = Batch(dict(batch.tensors), dict(batch.meta), dict(batch.info))
    for key in ("input_ids", "attention_mask"):
        out[key] = torch.nn.functional.pad(batch[key], (0, extra))
    return out


class MegatronModel(Strategy):
    """A megatron-core model on this rank (TP / PP shards), its forward passes and weights in and out: the body
    of every megatron role (``value_head``: the critic's ``hidden -> 1`` head in place of the LM head)."""

    value_head = False
    options: MegatronOptions

    def initialize(self, ctx: StrategyContext) -> None:
        from megatron.core import parallel_state as mpu

        from roll.config.megatron import read_hf_config
        from roll.models.mcore import build, weights

        margs = self.config.model_args
        key = "strategy_args.strategy_config"  # parsed (and errors named by role) at launch
        check_megatron_options(
            self.options, key, self.world_size, margs.dtype, read_hf_config(margs.model_name_or_path)
        )
        init_megatron(self.options, ctx.seed)
        self.hf = build.load_hf_config(margs.model_name_or_path, margs.trust_remote_code)
        self.chunks = build.build_chunks(self.hf, self.options, margs.dtype, value_head=self.value_head)
        self.tp_rank, self.tp_size = mpu.get_tensor_model_parallel_rank(), self.options.tensor_model_parallel_size
        weights.load_checkpoint(self.chunks, margs.model_name_or_path, self.hf, self.tp_rank, self.tp_size)
        self.device = next(self.chunks[0].parameters()).device
        self.tokenizer = load_tokenizer(margs.model_name_or_path)
        self.model = self._wrap(self.chunks)
        self.exporter = weights.WeightExporter(self.chunks, self.hf, self.value_head)
        self.collector = mpu.get_tensor_model_parallel_rank() == 0 and mpu.is_pipeline_last_stage()

    def _wrap(self, chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
        """The modules the schedule runs: bf16 chunks behind ``Float16Module`` (fp32 outputs)."""
        from megatron.core.transformer.module import Float16Module

        if self.config.model_args.dtype != "bf16":
            return chunks
        return [Float16Module(chunk.config, chunk) for chunk in chunks]

    def data_parallel_info(self) -> tuple[int, int, bool]:
        """``(data-parallel rank, data-parallel size, whether this rank returns results)`` for ``call_dp``."""
        from megatron.core import parallel_state as mpu

        return mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size(), self.collector

    # ------------------------------------------------------------------ forward passes
    def _token_outputs(self, output: torch.Tensor, mb: Batch, with_entropy: bool) -> tuple[torch.Tensor, Any]:
        """Last-stage output (B, L, V/TP) -> log-probs of ``input_ids[:, 1:]`` (B, L-1) [and entropy]; the
        value head's (B, L, 1) -> values (B, L-1)."""
        if self.value_head:
            return output[:, :-1, 0].float(), None
        from megatron.core import parallel_state as mpu

        logits = output[:, :-1]
        width = logits.shape[-1]
        start = mpu.get_tensor_model_parallel_rank() * width
        if start + width > self.hf.vocab_size:  # vocab padded to a multiple of TP: padding never predicted
            ids = torch.arange(start, start + width, device=logits.device)
            logits = logits.float().masked_fill(ids >= self.hf.vocab_size, -1e30)
        group = mpu.get_tensor_model_parallel_group() if self.tp_size > 1 else None
        return vocab_parallel_log_probs(logits, mb["input_ids"][:, 1:], start, group, with_entropy)

    def _forward_step(self, loss_fn: LossFn | None, with_entropy: bool, data_iterator: Iterator[Batch], model):
        """megatron's ``forward_step_func``: run one micro-batch, hand the schedule a loss function."""
        mb = next(data_iterator).to(self.device)
        ids, mask = mb["input_ids"], mb["attention_mask"]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        output = model(ids, positions, attention_mask(mask))
        return output, partial(self._micro_loss, loss_fn, with_entropy, mb)

    def _micro_loss(self, loss_fn: LossFn | None, with_entropy: bool, mb: Batch, output: torch.Tensor):
        """Last stage: ``(loss, metrics)`` for training; ``(0, {"out": (B, L-1), "entropy": ...})`` forward-only."""
        width = mb["input_ids"].shape[1] - 1
        out, entropy = self._token_outputs(output[:, : width + 1], mb, with_entropy)
        if loss_fn is None:
            return output.new_zeros(()), {"out": out.detach().cpu(), "entropy": entropy}
        loss, metrics = loss_fn(out, entropy, mb)
        metrics = {k: float(v) for k, v in metrics.items()}
        if mb.info.get("keep_log_probs"):
            metrics["log_probs"] = out.detach().float().cpu()
        # megatron divides each micro-batch's loss by their number: scale to the exact accumulation weight
        return loss * mb.info.get("loss_scale", 1.0), metrics

    def _schedule(self, micro: list[Batch], loss_fn: LossFn | None, with_entropy: bool) -> list[dict]:
        """All micro-batches through megatron's forward(-backward) schedule; the last stage's per-micro outputs."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        step = partial(self._forward_step, loss_fn, with_entropy)
        iterators = [iter(micro) for _ in self.model]
        return get_forward_backward_func()(
            forward_step_func=step,
            data_iterator=iterators if len(self.model) > 1 else iterators[0],
            model=self.model if len(self.model) > 1 else self.model[0],
            num_microbatches=len(micro),
            seq_length=micro[0]["input_ids"].shape[1],
            micro_batch_size=len(micro[0]),
            forward_only=loss_fn is None,
        )

    def _padded(self, batch: Batch) -> Batch:
        return pad_width(batch, self.tp_size if self.options.sequence_parallel else 1)

    @torch.no_grad()
    def _forward_only(self, batch: Batch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        width = batch["input_ids"].shape[1] - 1
        for m in self.model:
            m.eval()
        outs = self._schedule(self._padded(batch).split(self.config.infer_batch_size), None, with_entropy)
        if not self.collector:
            return torch.zeros((0, width)), (torch.zeros((0, width)) if with_entropy else None)
        values = torch.cat([o["out"] for o in outs])[:, :width]
        entropy = torch.cat([o["entropy"].float().cpu() for o in outs])[:, :width] if with_entropy else None
        return values, entropy

    # ------------------------------------------------------------------ weights
    def named_weights(self) -> list[tuple[str, torch.Tensor]]:
        """Full HF-named weights on CPU at rank 0 (every rank must call: TP/PP gathers are collective)."""
        out = [(n, t.to("cpu", copy=True)) for n, t in self.exporter]
        return out if self.rank == 0 else []

    def weight_buckets(self, bucket_bytes: int) -> Iterator[NamedTensors]:
        """The full HF weights on this worker's device, bucket by bucket (every rank must iterate)."""
        return iter_buckets(iter(self.exporter), bucket_bytes)

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Set weights from full HF-named tensors (each rank takes its TP shard of the weights it holds)."""
        from roll.models.mcore.weights import load_named

        named = dict(named_tensors)
        if not load_named(self.chunks, named, self.hf, self.tp_rank, self.tp_size, skip_missing=self.value_head):
            raise ValueError("megatron load_weights: none of the given weight names map to this model")
        self._after_load()

    def _after_load(self) -> None:
        """Hook: a training strategy refreshes its fp32 master weights."""


class MegatronLogProbs:
    """``compute_log_probs`` of a megatron model with its LM head (the actor and the reference)."""

    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """``{"log_probs": (B, L-1)[, "entropy"]}`` on the collector rank (empty elsewhere)."""
        log_probs, entropy = self._forward_only(batch, with_entropy)  # type: ignore[attr-defined]
        return {"log_probs": log_probs, **({"entropy": entropy} if with_entropy else {})}


class MegatronInferStrategy(MegatronLogProbs, MegatronModel, ScoringStrategy):
    """``megatron_infer``: a megatron-core model without optimizer that scores sequences (the reference)."""


class MegatronTrainer(MegatronModel, ScheduledSteps, TrainingStrategy):
    """A megatron-core model trained with megatron-core's DDP, optimizer and schedules (both training roles)."""

    def initialize(self, ctx: StrategyContext) -> None:
        super().initialize(ctx)
        from megatron.core.distributed import finalize_model_grads
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        targs, bf16 = self.config.training_args, self.config.model_args.dtype == "bf16"
        self.optimizer = get_megatron_optimizer(
            OptimizerConfig(
                optimizer="adam",
                lr=targs.learning_rate,
                weight_decay=targs.weight_decay,
                adam_beta1=targs.adam_beta1,
                adam_beta2=targs.adam_beta2,
                bf16=bf16,
                params_dtype=torch.bfloat16 if bf16 else torch.float32,
                clip_grad=ctx.max_grad_norm,
                use_distributed_optimizer=self.options.use_distributed_optimizer,
            ),
            self.model,
        )
        config = self.chunks[0].config
        config.finalize_model_grads_func = finalize_model_grads
        config.grad_scale_func = self.optimizer.scale_loss
        if self.options.overlap_grad_reduce:
            syncs = [m.no_sync for m in self.model]
            config.no_sync_func = syncs[0] if len(syncs) == 1 else syncs
        if self.options.overlap_param_gather:
            params = [m.start_param_sync for m in self.model]
            config.param_sync_func = params[0] if len(params) == 1 else params
        self.total_steps = targs.max_steps or ctx.total_steps
        self.optimizer_steps = 0

    def _wrap(self, chunks: list[torch.nn.Module]) -> list[torch.nn.Module]:
        """Float16Module (bf16) inside megatron's DDP (gradient buffers, data-parallel reduce)."""
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

        ddp = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True,
            overlap_grad_reduce=self.options.overlap_grad_reduce,
            use_distributed_optimizer=self.options.use_distributed_optimizer,
            overlap_param_gather=self.options.overlap_param_gather,
        )
        return [
            DistributedDataParallel(chunk.config, ddp, module, disable_bucketing=i > 0)
            for i, (chunk, module) in enumerate(zip(chunks, super()._wrap(chunks)))
        ]

    def train_step(
        self,
        batch: Batch,
        loss_fn: LossFn,
        lr: float | None = None,
        with_entropy: bool = False,
        return_log_probs: bool = False,
    ) -> dict[str, Any]:
        """One optimizer step per ``per_device_train_batch_size x gradient_accumulation_steps`` samples
        (:meth:`~roll.strategies.accumulation.ScheduledSteps.run_steps`, the loop every training backend shares),
        each through megatron's schedule, accumulated exactly like ``AccumulatingTrainer`` (each micro-batch
        weighted by its share of the loss's unit, summed over the data-parallel replicas)."""
        for m in self.model:
            m.train()
        width = batch["input_ids"].shape[1] - 1

        def one_step(step: Batch, rate: float) -> tuple[dict[str, float], torch.Tensor | None]:
            for group in self.optimizer.param_groups:
                group["lr"] = rate
            for m in self.model:
                m.zero_grad_buffer()
            self.optimizer.zero_grad()
            micro = self._weighted(self._padded(step), loss_fn, return_log_probs)
            outs = self._schedule(micro, loss_fn, with_entropy)
            kept = None
            if return_log_probs and outs:
                kept = scatter_rows(
                    [
                        (list(range(i * len(micro[0]), (i + 1) * len(micro[0]))), o.pop("log_probs")[:, :width])
                        for i, o in enumerate(outs)
                    ],
                    len(step),
                    width,
                )
            metrics = merge_metrics([(m.info["local_weight"], o) for m, o in zip(micro, outs)])
            _, grad_norm, _ = self.optimizer.step()
            metrics[f"{self.metric_prefix}/grad_norm"] = float(grad_norm or 0.0)
            return metrics, kept

        return self.run_steps(batch, lr, return_log_probs, self.config.strategy_args.strategy_name, one_step)

    def _weighted(self, batch: Batch, loss_fn: LossFn, keep: bool) -> list[Batch]:
        """Micro-batches of ``per_device_train_batch_size`` carrying their accumulation weight
        (``info["loss_scale"]``, megatron's division by their number undone) and local metric weight."""
        from megatron.core import parallel_state as mpu

        micro = batch.split(self.config.training_args.per_device_train_batch_size)
        normalizer = getattr(loss_fn, "normalizer", None)
        local = accumulation_weights(micro, normalizer)
        total_local = sum(float(normalizer(m)) if normalizer else float(len(m)) for m in micro)
        total = torch.tensor([total_local], dtype=torch.float64, device=self.device)
        dp = mpu.get_data_parallel_world_size()
        if dp > 1:
            torch.distributed.all_reduce(total, group=mpu.get_data_parallel_group())
        scale = dp * total_local / float(total) if float(total) > 0 else 1.0
        for m, w in zip(micro, local):
            m.info.update(loss_scale=w * scale * len(micro), local_weight=w, keep_log_probs=keep)
        return micro

    def _inner_optimizers(self) -> list[Any]:
        """The torch optimizers inside megatron's (chained) optimizer."""
        return [o.optimizer for o in getattr(self.optimizer, "chained_optimizers", [self.optimizer])]

    def reset_optimizer(self) -> None:
        """Drop the Adam moments; the next step starts them afresh (see ``TrainStrategy.reset_optimizer``)."""
        for inner in self._inner_optimizers():
            inner.state.clear()

    def _after_load(self) -> None:
        self.optimizer.reload_model_params()

    def save_pretrained(self, path: str) -> None:
        """Hugging Face directory: config, safetensors (rank 0 writes; every rank takes part in the gathers)."""
        from roll.models.mcore.hf_export import save_hf

        weights = self.named_weights()
        if self.rank == 0:
            save_hf(path, dict(weights), self.hf, self.tokenizer, value_head=self.value_head)

    def save_checkpoint(self, path: str) -> None:
        from roll.models.mcore.checkpoint import save

        save(path, self.chunks, self.optimizer, {"optimizer_steps": self.optimizer_steps})

    def load_checkpoint(self, path: str) -> None:
        from roll.models.mcore.checkpoint import load

        self.optimizer_steps = int(load(path, self.chunks, self.optimizer).get("optimizer_steps", 0))

    def offload_states(self) -> None:
        """GPU only: model weights, gradient buffers and optimizer states to CPU, then free the CUDA cache."""
        if self.device.type != "cuda" or getattr(self, "_offloaded", None):
            return
        from roll.models.mcore.offload import offload

        self._offloaded = offload(self.model, self._inner_optimizers())
        torch.cuda.empty_cache()

    def reload_states(self) -> None:
        """Undo :meth:`offload_states`."""
        if not getattr(self, "_offloaded", None):
            return
        from roll.models.mcore.offload import reload

        reload(self._offloaded, self.device)
        self._offloaded = None


class MegatronTrainStrategy(MegatronLogProbs, MegatronTrainer, TrainStrategy):
    """``megatron_train`` in the ``actor_train`` role: trains the policy and scores sequences."""


class MegatronCriticStrategy(MegatronTrainer, CriticStrategy):
    """``megatron_train`` in the ``critic`` role: the LM head replaced by a zero-initialised ``hidden -> 1``
    value head; ``train_step`` hands the loss function values (B, L-1) in place of log-probs."""

    metric_prefix = "critic"
    value_head = True

    def compute_values(self, batch: Batch) -> dict[str, torch.Tensor]:
        """``{"values": (B, L-1)}`` on the collector rank (empty elsewhere), aligned with the log-probs."""
        return {"values": self._forward_only(batch, False)[0]}
