"""``deepspeed_infer``: forward passes (reference log-probs) in a DeepSpeed engine without an optimizer.

ZeRO stage 0 keeps a full model copy per worker (a plain engine); stage 3 is ZeRO-Inference: parameters are
partitioned over the role's workers (optionally offloaded to CPU) and gathered layer by layer during the forward
pass, so a reference larger than one device fits. ``strategy_config``:
:class:`~roll.config.strategies.DeepSpeedInferOptions` (``zero_stage`` 0 or 3, ``offload_param``).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from roll.config.strategies import DeepSpeedInferOptions
from roll.data.batch import Batch
from roll.models.loading import load_causal_lm, scoring_attention
from roll.models.logprobs import token_log_probs
from roll.models.vision import vision_kwargs
from roll.strategies.base import ScoringStrategy, StrategyContext
from roll.strategies.deepspeed_train import init_deepspeed_distributed


def build_infer_ds_config(
    opts: DeepSpeedInferOptions,
    *,
    micro_batch: int,
    world_size: int,
    dtype: str,
) -> dict[str, Any]:
    """The DeepSpeed config of an inference engine (:class:`~roll.config.strategies.DeepSpeedInferOptions`): batch
    sizes (required by DeepSpeed, unused without an optimizer), ZeRO stage 0 or 3, precision."""
    zero: dict[str, Any] = {"stage": opts.zero_stage}
    if opts.offload_param == "cpu":
        zero["offload_param"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "gradient_accumulation_steps": 1,
        "train_batch_size": micro_batch * world_size,
        "zero_optimization": zero,
        "bf16": {"enabled": dtype == "bf16"},
        "fp16": {"enabled": dtype == "fp16"},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class DeepSpeedInferStrategy(ScoringStrategy):
    """A causal LM in a DeepSpeed engine (no optimizer) that scores sequences."""

    options: DeepSpeedInferOptions

    def initialize(self, ctx: StrategyContext) -> None:
        import deepspeed

        init_deepspeed_distributed(ctx.seed)
        margs = self.config.model_args
        self.ds_config = build_infer_ds_config(
            self.options,
            micro_batch=self.config.infer_batch_size,
            world_size=self.world_size,
            dtype=margs.dtype,
        )
        attention = scoring_attention(margs.attn_implementation, margs.dtype, self.config.use_sequence_packing)
        model = load_causal_lm(
            margs.model_name_or_path, margs.dtype, attention, margs.trust_remote_code, margs.use_liger_kernel
        )
        model.requires_grad_(False)
        self.engine, *_ = deepspeed.initialize(model=model, config=self.ds_config)
        self.engine.eval()
        self.device = self.engine.device

    @property
    def zero_stage(self) -> int:
        return int(self.ds_config["zero_optimization"]["stage"])

    def _num_forward_passes(self, n_micro: int) -> int:
        """Forward passes every rank makes: under ZeRO-3 each pass is collective (parameters are gathered from
        all ranks), so all ranks run as many as the busiest one."""
        if self.zero_stage != 3 or self.world_size == 1:
            return n_micro
        import torch.distributed as dist

        count = torch.tensor([n_micro], dtype=torch.long, device=self.device)
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return int(count.item())

    @torch.no_grad()
    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """``{"log_probs": (B, L-1)[, "entropy": (B, L-1)]}`` in micro-batches of ``infer_batch_size``."""
        micro = batch.split(self.config.infer_batch_size) if len(batch) else []
        parts, ents = [], []
        for i in range(self._num_forward_passes(len(micro))):
            if i < len(micro):
                mb = micro[i].to(self.device)
                ids, mask = mb["input_ids"], mb["attention_mask"]
                vision = vision_kwargs(mb, self.device)  # images: the padded forward
            else:  # padding pass that keeps this rank in step with the others' collective gathers
                ids = torch.zeros((1, 2), dtype=torch.long, device=self.device)
                mask, vision = torch.ones_like(ids), {}
            lp, ent = token_log_probs(
                self.engine,
                ids,
                mask,
                with_entropy=with_entropy,
                pack=self.config.use_sequence_packing and not vision,
                share_prefix=self.config.shares_prefixes() and not vision,
                compiled=self.config.model_args.compile_log_probs,
                vision=vision,
            )
            if i < len(micro):
                parts.append(lp.float().cpu())
                if ent is not None:
                    ents.append(ent.float().cpu())
        width = batch["input_ids"].shape[1] - 1 if "input_ids" in batch else 0
        out = {"log_probs": torch.cat(parts) if parts else torch.zeros((0, width))}
        if with_entropy:
            out["entropy"] = torch.cat(ents) if ents else torch.zeros((0, width))
        return out

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace weights (e.g. with the warm-started actor's); under ZeRO-3 rank 0's copy is broadcast."""
        import deepspeed

        params = dict(self.engine.module.named_parameters())
        named = list(named_tensors)
        unknown = [n for n, _ in named if n not in params]
        if unknown:
            raise KeyError(f"deepspeed_infer.load_weights: no parameters {unknown[:3]} in the model")
        gathered = deepspeed.zero.GatheredParameters(
            [params[n] for n, _ in named], modifier_rank=0, enabled=self.zero_stage == 3
        )
        with gathered, torch.no_grad():
            for name, tensor in named:
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
