"""The agentic pipeline: grouped multi-turn rollouts -> batch -> log-probs -> advantages -> PPO update -> sync.

Orchestration only: rollouts live in ``roll.agentic``, math in ``roll.algorithms``, backends behind
``roll.strategies`` and placement in ``roll.distributed``.
"""

from __future__ import annotations

import time

import torch

from roll.agentic.render_dump import dump_val_renders, env_descriptions
from roll.agentic.rollout import RolloutScheduler, rollout_metrics
from roll.agentic.trajectory import Trajectory, trajectories_to_batch
from roll.algorithms.kl import make_kl_controller
from roll.algorithms.reward_norm import normalize_scores
from roll.config.agentic import AgenticConfig
from roll.config.loader import to_dict
from roll.data.batch import Batch
from roll.data.checks import check_batch_if
from roll.pipelines.base import Pipeline
from roll.pipelines.common import (colocation_phases, compute_advantages, forward_log_probs, forward_values,
                                   group_keys, perf_metrics, skip_old_log_probs, start_workers, sync_weights)
from roll.pipelines.loss_fns import SFT_LOSS
from roll.tracking.dumps import TrajectoryDumps


class AgenticPipeline(Pipeline):
    """Grouped multi-turn rollouts and PPO-style updates; ``run()`` (see :class:`Pipeline`) returns the last
    step's metrics."""

    cfg: AgenticConfig

    # ------------------------------------------------------------------ setup
    def setup(self, run_id: str | None = None) -> None:
        """Build the tiny model if asked, start workers, rollout schedulers, KL controller and tracker
        (``run_id``: continue that tracker run, when resuming)."""
        from roll.models.loading import load_tokenizer
        from roll.tracking import make_tracker

        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        if cfg.tiny_model is not None:
            from roll.models.tiny import ensure_tiny_model

            if not cfg.pretrain:
                raise ValueError("tiny_model is set but pretrain (the path to build it at) is empty")
            ensure_tiny_model(cfg.pretrain, **vars(cfg.tiny_model))
        self.groups = start_workers(cfg)
        self.phases = colocation_phases(cfg)
        self.tokenizer = load_tokenizer(cfg.actor_train.model_args.model_name_or_path)
        self.dumps = TrajectoryDumps(self.log_dir, cfg.trajectory_dump_steps, cfg.trajectory_dump_max,
                                     self.tokenizer, "agentic", env_descriptions(cfg))
        use_ray = cfg.distributed == "ray"
        infer = self.groups["actor_infer"]
        path = cfg.actor_infer.model_args.model_name_or_path
        self.train_rollout = RolloutScheduler(cfg, cfg.train_env_manager, "train", path, infer, use_ray)
        self.val_rollout = (RolloutScheduler(cfg, cfg.val_env_manager, "val", path, infer, use_ray)
                            if cfg.val_env_manager is not None else None)
        self.kl_ctl = make_kl_controller(cfg.init_kl_coef, cfg.target_kl, cfg.kl_horizon)
        self.tracker = make_tracker(cfg.track_with, exp_name=cfg.exp_name, log_dir=str(self.log_dir),
                                    config=to_dict(cfg), tracker_kwargs=dict(cfg.tracker_kwargs), run_id=run_id)

    # ------------------------------------------------------------------ phases
    def warm_start(self) -> dict[str, float]:
        """Supervised warm start on solver demonstrations (``sft_warmup``), then sync to inference."""
        from roll.pipelines.sft_warmup import make_demo_batches

        cfg, sft = self.cfg, self.cfg.sft_warmup
        tag = sft.tag or cfg.train_env_manager.tags[0]
        spec = cfg.custom_envs[tag]
        kwargs = {"format_penalty": cfg.train_env_manager.format_penalty,
                  "action_format": cfg.train_env_manager.action_format, **dict(spec.env_config)}
        batches = make_demo_batches(spec, kwargs, self.tokenizer, tag, sft.num_demos, sft.batch_size, sft.steps,
                                    sft.seed)
        start, losses = time.perf_counter(), []
        train = self.groups["actor_train"]
        for i, batch in enumerate(batches):
            parts = train.call_dp("train_step", batch, loss_fn=SFT_LOSS, lr=sft.learning_rate)
            losses.append(sum(p["sft/loss"] for p in parts) / len(parts))
            if (i + 1) % max(1, len(batches) // 10) == 0:
                print(f"[sft warm start] step {i + 1}/{len(batches)} loss {losses[-1]:.4f}", flush=True)
        if sft.reset_optimizer:
            train.call("reset_optimizer")
        synced = self.sync_infer()
        for role in ("reference", "critic"):  # KL is measured to, and values are learned on, the warm-started model
            if role in self.groups:
                sync_weights(train, self.groups[role])
        return {"sft/final_loss": losses[-1], "sft/first_loss": losses[0], "time/sft": time.perf_counter() - start,
                "time/sft_sync": synced["time/sync"]}

    def validate(self, step: int) -> dict[str, float]:
        """Validation rollouts on fixed seeds (comparable across steps)."""
        start = time.perf_counter()
        self.phases.activate(self.groups, {"actor_infer"})
        manager = self.cfg.val_env_manager
        size = self.cfg.val_batch_size or manager.env_groups * manager.group_size
        trajs, rollout_stats = self.val_rollout.rollout(0, size)
        dump_val_renders(self.cfg, trajs, step)
        self.dumps.agentic("val", step, trajs)
        metrics = rollout_metrics(trajs, prefix="val")
        metrics.update(rollout_stats)
        metrics["time/val"] = time.perf_counter() - start
        return metrics

    def train_step(self, step: int) -> dict[str, float]:
        """One rollout batch and one PPO update; returns the step's metrics."""
        cfg, groups, timings = self.cfg, self.groups, {}
        t0 = time.perf_counter()
        self.phases.activate(groups, {"actor_infer"})
        timings["time/offload_reload"] = time.perf_counter() - t0
        t = time.perf_counter()
        trajs, rollout_times = self.train_rollout.rollout(step, cfg.rollout_batch_size)
        timings["time/rollout"] = time.perf_counter() - t
        t = time.perf_counter()
        self.phases.activate(groups, {"actor_train", "reference", "critic"})
        timings["time/offload_reload"] += time.perf_counter() - t
        timings.update(rollout_times)  # time/rollout_{generate,env,idle}, rollout/env_failures, ...
        batch = trajectories_to_batch(trajs, self.tokenizer.pad_token_id)
        check_batch_if(cfg.strict_data_check, batch, "rollout")
        skip_old = skip_old_log_probs(cfg, len(batch), step)
        if not skip_old:  # else the update's forward provides them (the same values)
            t = time.perf_counter()
            batch["old_log_probs"] = forward_log_probs(groups["actor_train"], batch)
            check_batch_if(cfg.strict_data_check, batch, "old_log_probs", required=("old_log_probs",))
            timings["time/old_log_probs"] = time.perf_counter() - t
        if "reference" in groups:
            t = time.perf_counter()
            batch["ref_log_probs"] = forward_log_probs(groups["reference"], batch)
            check_batch_if(cfg.strict_data_check, batch, "ref_log_probs", required=("ref_log_probs",))
            timings["time/ref_log_probs"] = time.perf_counter() - t
        if "critic" in groups:
            t = time.perf_counter()
            batch["values"] = forward_values(groups["critic"], batch)
            timings["time/values"] = time.perf_counter() - t
        for key, value in turn_metadata(trajs).items():
            batch[key] = value
        metrics = advantage_step(cfg, batch, self.kl_ctl.value)
        self.dumps.agentic("train", step, trajs, batch)
        self.update(step, batch, metrics, timings)
        # train-inference mismatch, with the trainer's log-probs before the update (sets batch["rollout_log_probs"])
        metrics.update(logprob_mismatch(trajs, batch))
        metrics.update(perf_metrics(groups, batch, timings, cfg.ppo_epochs))
        timings["time/step"] = time.perf_counter() - t0
        metrics.update(rollout_metrics(trajs))
        metrics.update(timings)
        return metrics

    def can_validate(self) -> bool:
        return self.val_rollout is not None

    def driver_state(self) -> dict:
        # rollout seeds are a pure function of (seed, phase, step, group): the step counter is the seed state
        return {"rollout": {"seed": self.cfg.seed}}


def turn_metadata(trajectories: list[Trajectory]) -> dict[str, list]:
    """Per-turn metadata for step-level advantages, aligned with :func:`trajectories_to_batch`'s layout.

    ``turn_spans[i]``: one ``(start, end)`` per turn, the index range of the turn's generated tokens in the
    log-prob frame (a token at position p of ``input_ids`` is scored at index p - 1); ``turn_states[i]``: the
    observation text each turn acted on (equal text = equal env state).
    """
    spans, states = [], []
    for traj in trajectories:
        offset, traj_spans = 0, []
        for turn in traj.turns:
            start = offset + len(turn.prompt_ids)
            generated = len(turn.response_ids) - (1 if turn.appended_eos else 0)
            traj_spans.append((start - 1, start - 1 + generated))
            offset = start + len(turn.response_ids)
        spans.append(traj_spans)
        states.append([turn.observation for turn in traj.turns])
    return {"turn_spans": spans, "turn_states": states}


def advantage_step(cfg: AgenticConfig, batch: Batch, kl_coef: float) -> dict[str, float]:
    """Episode scores -> ``reward_normalization`` -> ``reward_clip`` -> :func:`compute_advantages` (KL penalty,
    estimator, whitening, clipping); writes ``advantages``/``returns`` into ``batch`` and returns metrics."""
    norm = normalize_scores(batch["scores"], group_keys(cfg.reward_normalization.grouping, batch),
                            cfg.reward_normalization.method)
    if cfg.reward_clip is not None:
        norm = norm.clamp(-cfg.reward_clip, cfg.reward_clip)
    return compute_advantages(cfg, batch, norm, group_keys("state", batch), kl_coef)


# ---------------------------------------------------------------------------- train-inference mismatch (issue 8)
def rollout_log_probs(trajectories: list[Trajectory], width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The inference engine's sampling log-probs, aligned like ``old_log_probs`` with ``input_ids[:, 1:]``.

    Returns ``values`` (B, width-1) and ``mask`` (B, width-1): 1 where a generated token has an engine log-prob
    (never on an appended end-of-turn token). Token positions follow :func:`trajectories_to_batch`.
    """
    values = torch.zeros(len(trajectories), width - 1)
    mask = torch.zeros_like(values)
    for i, traj in enumerate(trajectories):
        pos = 0
        for turn in traj.turns:
            pos += len(turn.prompt_ids)
            lps = turn.response_log_probs[:len(turn.response_ids) - int(turn.appended_eos)]
            values[i, pos - 1:pos - 1 + len(lps)] = torch.tensor(lps, dtype=values.dtype)
            mask[i, pos - 1:pos - 1 + len(lps)] = 1.0  # log-prob index t predicts token t + 1
            pos += len(turn.response_ids)
    return values, mask


def logprob_mismatch(trajectories: list[Trajectory], batch) -> dict[str, float]:
    """``mean |logp_inference - logp_train|`` over generated tokens (and the max), with the trainer's
    ``old_log_probs`` of the same tokens; stores ``batch["rollout_log_probs"]`` for importance-sampling use."""
    values, mask = rollout_log_probs(trajectories, batch["input_ids"].shape[1])
    batch["rollout_log_probs"] = values
    diff = (values - batch["old_log_probs"].float()).abs() * mask
    count = float(mask.sum())
    return {"rollout/logprob_mismatch": float(diff.sum()) / max(1.0, count),
            "rollout/logprob_mismatch_max": float(diff.max()) if count else 0.0}
