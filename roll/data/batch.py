"""The batch container that crosses layers: per-sample tensors, per-sample metadata and batch-level info.

Declared keys of the agentic/RLVR training batch (B samples, L tokens, right-padded):

- ``input_ids`` (B, L) long: the whole conversation (prompt and every turn).
- ``attention_mask`` (B, L) long: 1 on real tokens.
- ``response_mask`` (B, L) long: 1 only on tokens the model generated (every turn).
- ``scores`` (B,) float: episode score (after the format penalty).
- ``old_log_probs`` / ``ref_log_probs`` (B, L-1) float: log p(input_ids[:, 1:]) under the rollout policy
  and the reference.
- ``advantages`` / ``returns`` (B, L-1) float, aligned with ``input_ids[:, 1:]``.

Metadata (lists of length B): ``env_id``, ``group_id``, ``tag``, ``traj_id``, ``step_rewards``, ...

Images (vision-language actors; see :mod:`roll.models.vision`), metadata because a sample's image count varies:
``images`` (per sample, its observation images as H x W x 3 uint8 arrays, in the order their tokens appear),
``pixel_values`` (per sample, a (P_i, D) float tensor: the patches of its images) and ``image_grid_thw`` (per
sample, a (K_i, 3) long tensor: each image's patch grid). Samples without images hold an empty list / empty tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Batch:
    """Tensors and metadata of B samples; every tensor's first dim and every metadata list has length B."""

    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, list] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.meta.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"batch keys disagree in batch size: {sizes}")

    def __len__(self) -> int:
        for v in self.tensors.values():
            return int(v.shape[0])
        for items in self.meta.values():
            return len(items)
        return 0

    def __getitem__(self, key: str) -> Any:
        return self.tensors[key] if key in self.tensors else self.meta[key]

    def __setitem__(self, key: str, value: Any) -> None:
        n = len(self)
        size = value.shape[0] if isinstance(value, torch.Tensor) else len(value)
        if (self.tensors or self.meta) and size != n:
            raise ValueError(f"key {key!r} has batch size {size}, the batch has {n}")
        if isinstance(value, torch.Tensor):
            self.tensors[key] = value
        else:
            self.meta[key] = list(value)

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.meta

    def select(self, index: Sequence[int] | torch.Tensor) -> Batch:
        """The samples at ``index`` (order kept)."""
        idx = torch.as_tensor(index, dtype=torch.long)
        ids = idx.tolist()
        return Batch(
            {k: v[idx] for k, v in self.tensors.items()},
            {k: [v[i] for i in ids] for k, v in self.meta.items()},
            dict(self.info),
        )

    def split(self, size: int) -> list[Batch]:
        """Consecutive chunks of ``size`` samples (the last may be smaller)."""
        n = len(self)
        return [self.select(range(i, min(i + size, n))) for i in range(0, n, size)]

    def chunk(self, parts: int) -> list[Batch]:
        """``parts`` near-equal consecutive chunks (for data-parallel workers)."""
        n = len(self)
        bounds = [round(i * n / parts) for i in range(parts + 1)]
        return [self.select(range(bounds[i], bounds[i + 1])) for i in range(parts)]

    def to(self, device: torch.device | str) -> Batch:
        """A copy with tensors on ``device``."""
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, dict(self.meta), dict(self.info))

    def iter_keys(self) -> Iterator[str]:
        """Tensor keys then metadata keys."""
        yield from self.tensors
        yield from self.meta

    @staticmethod
    def concat(batches: Sequence[Batch]) -> Batch:
        """Concatenate along the batch dim; tensors of different widths are right-padded with 0."""
        batches = [b for b in batches if len(b)]
        if not batches:
            return Batch()
        tensors = {}
        for key in batches[0].tensors:
            parts = [b.tensors[key] for b in batches]
            if parts[0].dim() > 1:
                width = max(p.shape[1] for p in parts)
                parts = [
                    torch.nn.functional.pad(p, (0, width - p.shape[1])) if p.shape[1] < width else p for p in parts
                ]
            tensors[key] = torch.cat(parts)
        meta = {k: [x for b in batches for x in b.meta[k]] for k in batches[0].meta}
        return Batch(tensors, meta, dict(batches[0].info))
