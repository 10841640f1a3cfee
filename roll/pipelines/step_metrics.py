"""Metrics of a step both pipelines log: the train-inference log-prob mismatch, throughput and memory."""

from __future__ import annotations

from roll.data.batch import Batch
from roll.distributed.roles import Roles


def logprob_mismatch(batch: Batch) -> dict[str, float]:
    """``mean |logp_inference - logp_train|`` over the generated tokens with an engine log-prob
    (``rollout_log_prob_mask``), and the max, against the trainer's ``old_log_probs`` of the same tokens (log-prob
    frame, :mod:`roll.data.layout`). Empty when no token has an engine log-prob, and when the old log-probs are
    the engine's own (``old_log_probs_source: engine``)."""
    mask = batch["rollout_log_prob_mask"]
    count = float(mask.sum())
    if not count or batch.info.get("old_log_probs_of_engine"):
        return {}
    diff = (batch["rollout_log_probs"] - batch["old_log_probs"].float()).abs() * mask
    return {"rollout/logprob_mismatch": float(diff.sum()) / count, "rollout/logprob_mismatch_max": float(diff.max())}


def perf_metrics(roles: Roles, batch: Batch, timings: dict[str, float], ppo_epochs: int) -> dict[str, float]:
    """Throughput and memory of one step: ``perf/tokens`` (attention-mask tokens of the batch),
    ``perf/train_tokens_per_s`` = tokens x ppo_epochs / time/train, and on GPU
    ``perf/<role>_peak_{allocated,reserved}_gib`` (rank 0 of each role, peak since the worker started) and
    ``perf/gpu_used_gib`` (the GPU's use by all processes, seen from actor_train's rank 0, at the end of the step)."""
    tokens = float(batch["attention_mask"].sum())
    out = {
        "perf/tokens": tokens,
        "perf/samples": float(len(batch)),
        "perf/train_tokens_per_s": tokens * ppo_epochs / max(timings.get("time/train", 0.0), 1e-9),
    }
    for role, proxy in roles.items():
        stats = proxy.memory_stats()
        for key in ("peak_allocated_gib", "peak_reserved_gib"):
            if key in stats:
                out[f"perf/{role}_{key}"] = stats[key]
        if role == "actor_train" and "gpu_used_gib" in stats:
            out["perf/gpu_used_gib"] = stats["gpu_used_gib"]
    return out
