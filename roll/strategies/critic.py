"""The critic side shared by the training strategies: a value model trained through the same accumulating loop.

``train_step`` hands the loss function values (B, L-1) in place of log-probs (entropy None); the value pass runs
padded rows (no packing). A backend's critic is ``class XCritic(ValueHeadCritic, XTrainer, CriticStrategy)``, where
``XTrainer`` is the backend's training body (an :class:`~roll.strategies.accumulation.AccumulatingTrainer`) that its
actor ``XTrainStrategy`` shares, with its own ``_load_model`` and the two hooks below. It has no token log-probs:
:class:`~roll.strategies.base.CriticStrategy` declares ``compute_values`` only.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from roll.data.batch import Batch


class ValueHeadCritic:
    """Mixin for a training strategy in the ``critic`` role. Hooks: ``_value_module()`` (what runs the forward)
    and ``_parameter_names()`` (the value model's parameter names)."""

    metric_prefix = "critic"
    supports_packing = False  # the value pass runs padded rows

    def _value_module(self) -> torch.nn.Module:
        raise NotImplementedError

    def _parameter_names(self) -> set[str]:
        raise NotImplementedError

    def _forward(self, mb: Batch, with_entropy: bool) -> tuple[torch.Tensor, None]:
        from roll.models.value_model import sequence_values

        return sequence_values(self._value_module(), mb["input_ids"], mb["attention_mask"]), None

    def compute_values(self, batch: Batch) -> dict[str, torch.Tensor]:
        """``{"values": (B, L-1)}``, aligned with the log-probs (see :func:`sequence_values`)."""
        return self.forward_batch(batch, "values")  # type: ignore[attr-defined]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the backbone from policy weights (e.g. after the warm start): names the critic lacks (the LM head)
        are skipped, the value head is kept. Raises when no name matches (a different architecture)."""
        names = self._parameter_names()
        matched = [(n, t) for n, t in named_tensors if n in names]
        if not matched:
            raise ValueError(
                "critic.load_weights: none of the given weight names exist in the value model; "
                "the critic must share the policy's architecture"
            )
        super().load_weights(matched)  # type: ignore[misc]
