"""The agentic pipeline: grouped multi-turn rollouts -> batch -> log-probs -> advantages -> PPO update -> sync.

:meth:`AgenticPipeline.train_step` is the whole step, in CleanRL's order; it only produces the batch and calls the
shared pieces: rollouts in ``roll.agentic``, the token layout in ``roll.data.layout``, the update in
``roll.ppo`` (math in ``roll.algorithms``), the roles behind typed proxies (``roll.distributed.roles``).
"""

from __future__ import annotations

import time
from dataclasses import asdict

import torch

from roll.agentic.failures import RolloutFailed
from roll.agentic.render_dump import dump_val_renders, env_descriptions
from roll.agentic.scheduler import RolloutScheduler, manager_cpus, rollout_metrics
from roll.config.agentic import AgenticConfig
from roll.data.checks import check_batch_if
from roll.data.layout import rollout_log_probs, trajectories_to_batch
from roll.data.trajectory import Trajectory, Turn
from roll.models.vision import ImageInputs, add_pixel_values
from roll.pipelines.base import Pipeline
from roll.pipelines.step_metrics import logprob_mismatch, perf_metrics
from roll.tracking.dumps import TrajectoryDumps
from roll.tracking.frames import FrameBudget


class AgenticPipeline(Pipeline):
    """Grouped multi-turn rollouts and PPO-style updates; ``run()`` (see :class:`Pipeline`) returns the last
    step's metrics."""

    cfg: AgenticConfig

    def image_inputs(self) -> ImageInputs:
        """The actor's image processor and image tokens (loaded at the first batch with images)."""
        if getattr(self, "_image_inputs", None) is None:
            self._image_inputs = ImageInputs(str(self.cfg.actor_train.model_args.model_name_or_path), self.tokenizer)
        return self._image_inputs

    # ------------------------------------------------------------------ setup
    def setup(self, run_id: str | None = None) -> None:
        """Build the tiny model if asked, start the roles and the update, the rollout schedulers and the tracker
        (``run_id``: continue that tracker run, when resuming)."""
        from roll.models.loading import load_tokenizer

        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        self.build_tiny_model()
        self.start_roles(extra_cpus=manager_cpus(cfg))
        self.tokenizer = load_tokenizer(cfg.actor_train.model_args.model_name_or_path)
        self.dumps = TrajectoryDumps(
            self.log_dir,
            cfg.trajectory_dump_steps,
            cfg.trajectory_dump_max,
            self.tokenizer,
            "agentic",
            env_descriptions(cfg),
            FrameBudget(cfg.trajectory_dump_frames, cfg.trajectory_dump_frame_kib),
        )
        use_ray, infer = cfg.distributed == "ray", self.roles.actor_infer
        path = cfg.actor_infer.model_args.model_name_or_path
        self.train_rollout = RolloutScheduler(cfg, cfg.train_env_manager, "train", path, infer, use_ray)
        self.val_rollout = (
            RolloutScheduler(cfg, cfg.val_env_manager, "val", path, infer, use_ray)
            if cfg.val_env_manager is not None
            else None
        )
        self.start_tracker(run_id)

    # ------------------------------------------------------------------ phases
    def warm_start(self) -> dict[str, float]:
        """Supervised warm start on solver demonstrations (``sft_warmup``), then sync to inference."""
        from roll.pipelines.sft_warmup import demo_env, make_demo_batches

        cfg, sft = self.cfg, self.cfg.sft_warmup
        tag, spec, kwargs = demo_env(cfg)
        batches = make_demo_batches(
            spec,
            kwargs,
            self.tokenizer,
            tag,
            sft.num_demos,
            sft.batch_size,
            sft.steps,
            sft.seed,
            cfg.actor_train.model_args.model_name_or_path,
            sft.demo_noise,
        )
        return self.train_sft(batches, len(batches), sft.learning_rate, sft.reset_optimizer)

    def validate(self, step: int) -> dict[str, float]:
        """Validation rollouts on fixed seeds (comparable across steps)."""
        start = time.perf_counter()
        self.phases.activate(self.groups, {"actor_infer"})
        manager = self.cfg.val_env_manager
        size = self.cfg.val_batch_size or manager.env_groups * manager.group_size
        trajs, rollout_stats = self.val_rollout.rollout(0, size)
        dump_val_renders(self.cfg, trajs, step)
        self.dumps.agentic("val", step, trajs, failed=self.val_rollout.failed)
        metrics = rollout_metrics(trajs, prefix="val")
        metrics.update(rollout_stats)
        metrics["time/val"] = time.perf_counter() - start
        return metrics

    def train_step(self, step: int) -> dict[str, float]:
        """One rollout batch and one PPO update; returns the step's metrics."""
        cfg, groups, timings, trainer = self.cfg, self.groups, {}, self.trainer
        t0 = time.perf_counter()
        # 1. rollout: every env group plays with the current policy until rollout_batch_size trajectories are done
        self.phases.activate(groups, {"actor_infer"})
        timings["time/offload_reload"] = time.perf_counter() - t0
        t = time.perf_counter()
        try:
            trajs, rollout_times = self.rollout(step)
        except RolloutFailed:  # nothing to train on: the failed episodes are dumped for `roll view`, then the stop
            self.dumps.agentic("train", step, [], failed=self.train_rollout.failed, force=True)
            raise
        timings["time/rollout"] = time.perf_counter() - t
        t = time.perf_counter()
        self.phases.activate(groups, {"actor_train", "reference", "critic"})
        timings["time/offload_reload"] += time.perf_counter() - t
        timings.update(rollout_times)  # time/rollout_{generate,env,idle}, rollout/env_failures, ...
        # 2. the training batch: the samples of every trajectory (one, or one per turn: trajectory_mode), in the
        # token layout of roll.data.layout
        modes = {tag: spec.trajectory_mode for tag, spec in cfg.custom_envs.items()}
        batch = trajectories_to_batch(trajs, self.tokenizer.pad_token_id, modes)
        if "images" in batch:  # a vision-language actor: pixel values and grids beside the token ids
            add_pixel_values(batch, batch["images"], self.image_inputs())
        batch["rollout_log_probs"], batch["rollout_log_prob_mask"] = rollout_log_probs(
            trajs, batch["input_ids"].shape[1], modes
        )
        timings["rollout/template_breaks"] = float(sum(t.template_breaks for t in trajs))
        check_batch_if(cfg.strict_data_check, batch, "rollout")
        # 3. log-probs (old, reference) and values under the policy that acted
        timings.update(trainer.log_probs(step, batch))
        # 4. advantages: episode scores normalized per group -> rewards (- KL) -> the registered estimator
        metrics = trainer.advantages(batch, step)
        self.dumps.agentic("train", step, trajs, batch, self.train_rollout.failed)  # for `roll view`
        # 5. update: critic, then actor epochs; KL controller; weight sync to the inference engine
        metrics.update(trainer.update(step, batch, metrics.get("actor/reward_kl")))
        # 6. metrics: train-inference log-prob mismatch (the trainer's pre-update log-probs), throughput, rollouts
        metrics.update(logprob_mismatch(batch))
        metrics.update(perf_metrics(self.roles, batch, metrics, cfg.ppo_epochs))  # reads time/train
        timings["time/step"] = time.perf_counter() - t0
        metrics.update(rollout_metrics(trajs))
        metrics.update(timings)
        return metrics

    def rollout(self, step: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Step ``step``'s trajectories and rollout metrics: played now, or the oldest finished groups of the
        asynchronous producers (``async_generation_ratio``), which play on across steps."""
        cfg, rollout = self.cfg, self.train_rollout
        if not cfg.async_generation_ratio:
            return rollout.rollout(step, cfg.rollout_batch_size)
        producers = self.start_producers(
            rollout.produce, rollout.units, cfg.rollout_batch_size // cfg.train_env_manager.group_size, decode_groups
        )
        return rollout.take(producers.buffer, step, cfg.rollout_batch_size)

    def can_validate(self) -> bool:
        return self.val_rollout is not None

    def driver_state(self) -> dict:
        """Rollout seeds are a pure function of (seed, phase, step or round, group): the step counter is the seed
        state; asynchronous rollouts add the producers' rounds and the finished groups waiting
        (:meth:`~roll.rollout.buffer.Producers.state_dict`)."""
        state: dict = {"rollout": {"seed": self.cfg.seed}}
        if self.producers is not None:
            state["async"] = self.producers.state_dict(lambda ts: [asdict(t) for t in ts])
        return state

    def load_driver_state(self, state: dict) -> None:
        self.async_state = state.get("async")


def decode_groups(items: list[dict]) -> list[Trajectory]:
    """A checkpointed group's trajectories (``dataclasses.asdict`` form) back as :class:`Trajectory` objects."""
    return [Trajectory(**{**d, "turns": [Turn(**turn) for turn in d["turns"]]}) for d in items]
