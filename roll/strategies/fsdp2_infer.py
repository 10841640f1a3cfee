"""``fsdp2_infer``: forward passes (reference log-probs) of a model sharded by PyTorch FSDP2, without an optimizer.

Parameters are stored in the compute dtype (``param_dtype``, default ``model_args.dtype``) and sharded over the
role's workers (or over ``fsdp_size`` of them, HSDP), so a reference larger than one device fits; each unit is
gathered for its forward and freed after it (``reshard_after_forward``). ``offload_policy: true`` keeps the shards
in CPU memory. Log-probs use the micro-batches of ``infer_batch_size`` or the ``use_dynamic_batching_in_infer``
token budget, packed with ``use_sequence_packing``; every rank runs as many forwards as the busiest one (the
gathers are collective). ``strategy_config``: :class:`roll.config.fsdp2.FSDP2Options`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from roll.config.fsdp2 import FSDP2Options, fsdp2_options
from roll.data.batch import Batch
from roll.models.loading import load_causal_lm, scoring_attention
from roll.strategies.accumulation import BatchedForward, ForwardLogProbs
from roll.strategies.base import ScoringStrategy, StrategyContext
from roll.strategies.fsdp2_shard import (
    compute_dtype_of,
    device_mesh,
    init_fsdp2_distributed,
    load_full,
    reshard_all,
    shard_model,
)


class FSDP2InferStrategy(ForwardLogProbs, BatchedForward, ScoringStrategy):
    """A causal LM sharded by FSDP2 that scores sequences."""

    options: FSDP2Options

    def initialize(self, ctx: StrategyContext) -> None:
        self.options = fsdp2_options(self.config, "reference", self.world_size, self.options)
        self.device = init_fsdp2_distributed(ctx.seed)
        margs = self.config.model_args
        dtype = compute_dtype_of(self.options, margs.dtype)
        attention = scoring_attention(margs.attn_implementation, dtype, self.config.use_sequence_packing)
        model = load_causal_lm(
            margs.model_name_or_path, dtype, attention, margs.trust_remote_code, margs.use_liger_kernel
        )
        model.requires_grad_(False)
        self.mesh = device_mesh(self.device, self.world_size, self.options.fsdp_size)
        self.model = shard_model(model, self.mesh, self.options, dtype)
        self.model.eval()

    def _model(self) -> torch.nn.Module:
        return self.model

    def _collective_forward(self) -> bool:
        return True  # every unit's forward all-gathers its parameters

    def forward_batch(self, batch: Batch, key: str, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        out = super().forward_batch(batch, key, with_entropy)
        reshard_all(self.model)  # the root stays gathered after a forward without backward
        return out

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace weights (e.g. with the warm-started actor's) with whole tensors; each rank keeps its shard."""
        reshard_all(self.model)
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            if name not in params:
                raise KeyError(f"fsdp2_infer.load_weights: no parameter {name!r} in the model")
            load_full(params[name], tensor)
