"""The training step and log-prob pass that torch training backends share (DeepSpeed, FSDP2).

:class:`AccumulatingTrainer` owns the semantics: a ``train_step`` makes one optimizer step per
``per_device_train_batch_size x gradient_accumulation_steps`` samples it is given; each step's samples are cut into
micro-batches (fixed or token-budget, padded or packed: :mod:`roll.strategies.microbatch`) and accumulated with
exact weights, so the gradient equals that of the whole step's loss, on one rank or many (the unit counts are
summed over the data-parallel ranks). A backend implements the hooks: the model to run, backward, the boundary and
the optimizer step (which returns the pre-clip global gradient norm). :class:`ScheduledSteps`, the outer loop over
optimizer steps with the learning-rate schedule, is every training backend's (Megatron's too).

Metrics of a step are averaged over micro-batches with the accumulation weights; keys ending in ``_max`` / ``_min``
take the max / min instead.
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import torch

from roll.data.batch import Batch
from roll.models.logprobs import token_log_probs
from roll.models.lora import adapter_config, adapters_off, is_peft
from roll.models.vision import vision_kwargs
from roll.strategies.base import LossFn, TrainingStrategy
from roll.strategies.microbatch import accumulation_weights, micro_batches, scatter_rows
from roll.strategies.schedule import lr_at


def merge_metrics(parts: list[tuple[float, dict[str, float]]]) -> dict[str, float]:
    """Weighted mean of metric dicts (``(weight, metrics)`` pairs); ``*_max`` / ``*_min`` keys take max / min."""
    out: dict[str, float] = {}
    for weight, metrics in parts:
        for key, value in metrics.items():
            value = float(value)
            if key.endswith("_max"):
                out[key] = max(out.get(key, value), value)
            elif key.endswith("_min"):
                out[key] = min(out.get(key, value), value)
            else:
                out[key] = out.get(key, 0.0) + weight * value
    return out


class BatchedForward:
    """Forward passes over micro-batches (``forward_batch``) for a torch backend that implements :meth:`_model`;
    mixed into a :class:`~roll.strategies.base.Strategy`, whose ``config``, ``device`` and ``world_size`` it
    reads."""

    #: whether the model's forward can run packed rows (the value model cannot)
    supports_packing = True

    @abstractmethod
    def _model(self) -> torch.nn.Module:
        """What the forward calls (the engine or wrapped module)."""

    def _collective_forward(self) -> bool:
        """Whether every forward is a collective over the data-parallel ranks (parameter gathering), so all ranks
        must run the same number of micro-batches."""
        return False

    def _forward(self, mb: Batch, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Log-probs (B, L-1) and entropy of a micro-batch on the device (the critic returns values). A micro-batch
        with images (a vision-language actor) runs padded: packing and shared prefixes do not apply to it."""
        vision = vision_kwargs(mb, mb["input_ids"].device)
        return token_log_probs(
            self._model(),
            mb["input_ids"],
            mb["attention_mask"],
            with_entropy=with_entropy,
            pack=self.config.use_sequence_packing and self.supports_packing and not vision,
            share_prefix=self.config.shares_prefixes() and self.supports_packing and not vision,
            compiled=self.config.model_args.compile_log_probs,
            vision=vision,
        )

    # ------------------------------------------------------------------ helpers
    def _data_parallel_sum(self, value: float) -> float:
        if self.world_size == 1 or not torch.distributed.is_initialized():
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(t)
        return float(t.item())

    def _data_parallel_max(self, value: int) -> int:
        if self.world_size == 1 or not torch.distributed.is_initialized():
            return value
        t = torch.tensor([value], dtype=torch.long, device=self.device)
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.MAX)
        return int(t.item())

    def _micro(self, batch: Batch, train: bool) -> list[tuple[list[int], Batch]]:
        cfg = self.config
        dynamic = cfg.use_dynamic_batching_in_train if train else cfg.use_dynamic_batching_in_infer
        budget = cfg.max_tokens_per_microbatch_in_train if train else cfg.max_tokens_per_microbatch_in_infer
        samples = cfg.training_args.per_device_train_batch_size if train else cfg.infer_batch_size
        return micro_batches(
            batch, samples, budget if dynamic else None, packed=cfg.use_sequence_packing and self.supports_packing
        )

    def _padded_to(self, micro: list[tuple[list[int], Batch]]) -> list[tuple[list[int], Batch]]:
        """Under collective forwards, dummy micro-batches (no sample, weight 0) so every rank runs as many."""
        if not self._collective_forward() or self.world_size == 1:
            return micro
        extra = self._data_parallel_max(len(micro)) - len(micro)
        if extra <= 0:
            return micro
        if micro:
            dummy = micro[-1][1].select([0])
            dummy = Batch(
                {k: torch.zeros_like(v) for k, v in dummy.tensors.items()}, dict(dummy.meta), dict(dummy.info)
            )
        else:  # this rank got no samples (a forward-only pass): two tokens are enough to join the gathers
            dummy = Batch(
                {
                    "input_ids": torch.zeros((1, 2), dtype=torch.long),
                    "attention_mask": torch.zeros((1, 2), dtype=torch.long),
                }
            )
        dummy["attention_mask"][:, :2] = 1  # two tokens: one scored position
        return micro + [([], dummy)] * extra

    def _train_mode(self, training: bool) -> None:
        self._model().train(training)

    @torch.no_grad()
    def forward_batch(self, batch: Batch, key: str, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """``{key: (B, L-1)[, "entropy": (B, L-1)]}`` from :meth:`_forward` over inference micro-batches
        (``infer_batch_size`` samples or a token budget), padded back to the batch's width."""
        self._train_mode(False)
        micro = self._padded_to(self._micro(batch, train=False) if len(batch) else [])
        outs, ents = [], []
        for idx, mb in micro:
            values, entropy = self._forward(mb.to(self.device), with_entropy)
            if idx:
                outs.append((idx, values.float().cpu()))
                if entropy is not None:
                    ents.append((idx, entropy.float().cpu()))
        width = batch["input_ids"].shape[1] - 1 if "input_ids" in batch else 0
        if not outs:
            empty = torch.zeros((0, width))
            return {key: empty, **({"entropy": empty} if with_entropy else {})}
        out = {key: scatter_rows(outs, len(batch), width)}
        if with_entropy:
            out["entropy"] = scatter_rows(ents, len(batch), width)
        return out


class ForwardLogProbs:
    """``compute_log_probs`` as :meth:`BatchedForward.forward_batch` (the scoring side of a torch backend); with
    LoRA, also the base model's log-probs and the adapter's peft config."""

    def compute_log_probs(self, batch: Batch, with_entropy: bool = False) -> dict[str, torch.Tensor]:
        """``{"log_probs": (B, L-1)[, "entropy": (B, L-1)]}`` over inference micro-batches."""
        return self.forward_batch(batch, "log_probs", with_entropy)  # type: ignore[attr-defined]

    def compute_base_log_probs(self, batch: Batch) -> dict[str, torch.Tensor]:
        """``{"log_probs": (B, L-1)}`` of the base model: the LoRA adapters disabled (peft's ``disable_adapter``),
        the reference log-probs of a LoRA run without a reference worker."""
        model = self._model()  # type: ignore[attr-defined]
        if not is_peft(model):
            raise TypeError(f"{type(self).__name__}: compute_base_log_probs needs LoRA (model_args.lora_target)")
        with adapters_off(model):
            return self.forward_batch(batch, "log_probs")  # type: ignore[attr-defined]

    def adapter_config(self) -> dict[str, Any]:
        """The LoRA adapter's peft config as a plain dict (what an engine's ``load_adapter`` takes)."""
        return adapter_config(self._model())  # type: ignore[attr-defined]


class ScheduledSteps:
    """The optimizer steps of a training backend: the outer loop of ``train_step`` every backend shares
    (:meth:`run_steps`) and the learning rate of its next step (:meth:`scheduled_lr`). Mixed into a
    :class:`~roll.strategies.base.TrainingStrategy`, which sets ``total_steps`` and ``optimizer_steps`` when it
    initializes (and restores ``optimizer_steps`` from a checkpoint)."""

    metric_prefix = "actor"  # prefix of train_step's grad_norm / lr metrics
    config: Any  # the worker block (a WorkerConfig), set by the strategy
    total_steps: int  # optimizer steps the schedule spans
    optimizer_steps: int  # optimizer steps taken on the schedule (the warm start's fixed-lr steps do not count)

    def scheduled_lr(self) -> float:
        """The learning rate of the next optimizer step: ``training_args``' warmup and decay
        (:func:`roll.strategies.schedule.lr_at`) after ``optimizer_steps`` steps of ``total_steps``."""
        targs = self.config.training_args
        return lr_at(
            self.optimizer_steps, targs.learning_rate, targs.warmup_steps, self.total_steps, targs.lr_scheduler_type
        )

    def run_steps(
        self, batch: Batch, lr: float | None, return_log_probs: bool, name: str, one_step: Any
    ) -> dict[str, Any]:
        """``batch`` cut into optimizer steps of ``per_device_train_batch_size x gradient_accumulation_steps``
        samples (a ValueError naming ``name`` otherwise), or, when ``batch.info["one_optimizer_step"]`` (the
        samples of a batch of episodes), one step of all of them; each run by ``one_step(step_batch, rate) ->
        (metrics, log_probs (S, L-1) or None)``. ``lr`` (warm start) replaces :meth:`scheduled_lr` and does not
        advance ``optimizer_steps``. Adds ``<metric_prefix>/lr`` per step; returns the steps' mean metrics (and
        ``"log_probs"`` in batch order)."""
        targs = self.config.training_args
        per_step = targs.per_device_train_batch_size * targs.gradient_accumulation_steps
        if batch.info.get("one_optimizer_step"):  # samples of a batch of whole episodes (trajectory_mode step): their
            per_step = max(1, len(batch))  # count varies with the turns; the schedule counts batches of episodes
        if len(batch) % per_step:
            raise ValueError(
                f"{name} train_step: {len(batch)} samples are not a whole number of optimizer steps of "
                f"per_device_train_batch_size x gradient_accumulation_steps = "
                f"{targs.per_device_train_batch_size} x {targs.gradient_accumulation_steps}"
            )
        step_metrics, kept = [], []
        for start in range(0, len(batch), per_step):
            rate = lr if lr is not None else self.scheduled_lr()
            metrics, lps = one_step(batch.select(range(start, start + per_step)), rate)
            metrics[f"{self.metric_prefix}/lr"] = rate
            if lr is None:
                self.optimizer_steps += 1
            step_metrics.append((1.0 / (len(batch) // per_step), metrics))
            if lps is not None:
                kept.append(lps)
        out: dict[str, Any] = merge_metrics(step_metrics)
        if return_log_probs:
            out["log_probs"] = torch.cat(kept) if kept else torch.zeros((0, batch["input_ids"].shape[1] - 1))
        return out


class AccumulatingTrainer(BatchedForward, ScheduledSteps, TrainingStrategy):
    """``train_step`` over hooks a torch backend implements (both training roles: the actor adds
    :class:`ForwardLogProbs`, the critic :class:`~roll.strategies.critic.ValueHeadCritic`)."""

    # ------------------------------------------------------------------ hooks
    @abstractmethod
    def _backward(self, loss: torch.Tensor, boundary: bool) -> None:
        """Accumulate ``loss``'s gradient; ``boundary``: the last micro-batch of an optimizer step."""

    @abstractmethod
    def _optimizer_step(self) -> float:
        """Clip, step and zero the gradients; returns the pre-clip global gradient norm."""

    @abstractmethod
    def _set_lr(self, lr: float) -> None:
        """Learning rate of the next optimizer step."""

    def _before_micro(self, boundary: bool) -> None:
        """Called before each training micro-batch's forward; ``boundary``: it is the step's last."""

    # ------------------------------------------------------------------ the interface
    def train_step(
        self,
        batch: Batch,
        loss_fn: LossFn,
        lr: float | None = None,
        with_entropy: bool = False,
        return_log_probs: bool = False,
    ) -> dict[str, Any]:
        """One optimizer step per ``per_device_train_batch_size x gradient_accumulation_steps`` samples (see the
        module docstring and :meth:`~ScheduledSteps.run_steps`). ``return_log_probs``: also return ``"log_probs"``
        (B, L-1), the detached log-probs of each sample's forward (CPU float32, in ``batch`` order)."""
        self._train_mode(True)

        def one_step(step: Batch, rate: float) -> tuple[dict[str, float], torch.Tensor | None]:
            self._set_lr(rate)
            metrics, lps = self._accumulate(step, loss_fn, with_entropy, return_log_probs)
            metrics[f"{self.metric_prefix}/grad_norm"] = self._optimizer_step()
            return metrics, lps

        return self.run_steps(batch, lr, return_log_probs, self.metric_prefix, one_step)

    def _accumulate(
        self, batch: Batch, loss_fn: LossFn, with_entropy: bool, keep: bool
    ) -> tuple[dict[str, float], torch.Tensor | None]:
        """Forward/backward of one optimizer step's micro-batches, weighted exactly (the module docstring)."""
        micro = self._padded_to(self._micro(batch, train=True))
        normalizer = getattr(loss_fn, "normalizer", None)
        real = [mb for idx, mb in micro if idx]
        local = accumulation_weights(real, normalizer)
        counts = [float(normalizer(mb)) if normalizer else float(len(mb)) for mb in real]
        total_local = sum(counts)
        total = self._data_parallel_sum(total_local)
        # w_k = n_k / (n summed over ranks) x ranks: the backend averages gradients over the ranks
        scale = self.world_size * total_local / total if total > 0 else 1.0
        parts, kept = [], []
        for k, (idx, mb) in enumerate(micro):
            weight = local[k] * scale if idx else 0.0
            mb = mb.to(self.device)
            self._before_micro(k == len(micro) - 1)
            log_probs, entropy = self._forward(mb, with_entropy)
            loss, metrics = loss_fn(log_probs, entropy, mb)
            self._backward(loss * weight, boundary=k == len(micro) - 1)
            if idx:
                parts.append((local[k], metrics))
                if keep:
                    kept.append((idx, log_probs.detach().float().cpu()))
        lps = scatter_rows(kept, len(batch), batch["input_ids"].shape[1] - 1) if keep else None
        return merge_metrics(parts), lps


def move_module_and_optimizer(module: torch.nn.Module, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
    """Move a model and its optimizer's tensor states (not the ``step`` counters) to ``device``: the offload and
    reload of a strategy whose backend has no ``offload_states`` of its own (ZeRO-0, FSDP2)."""
    module.to(device)
    for state in optimizer.state.values():
        for key, value in state.items():
            if torch.is_tensor(value) and key != "step":
                state[key] = value.to(device, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
