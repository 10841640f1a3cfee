"""The training loop both pipelines share: resume or warm start, steps with validation, logging and
checkpoints, then the final export and plot. A pipeline supplies the phases (``setup``, ``warm_start``,
``validate``, ``train_step``) and the driver state it checkpoints (``driver_state`` / ``load_driver_state``); the
setup pieces both need (:meth:`Pipeline.start_roles`, :meth:`Pipeline.start_tracker`), the supervised warm-start
loop (:meth:`Pipeline.train_sft`) and the PPO update (:class:`~roll.ppo.trainer.PPOTrainer`) live here once."""

from __future__ import annotations

import contextlib
import json
import math
import shlex
import sys
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from roll.data.batch import Batch
from roll.distributed.roles import Roles
from roll.errors import RunStopped
from roll.launch.startup import colocation_phases, start_roles, sync_weights
from roll.launch.weight_sync import weight_sync
from roll.pipelines import checkpoint as ckpt
from roll.ppo.loss_fns import SFT_LOSS
from roll.ppo.trainer import PPOTrainer
from roll.rollout.buffer import Group, Producers
from roll.tracking.health import RunHealth
from roll.tracking.rewind import prune_step_dumps
from roll.weights.sync import WeightSync


def resume_command(argv: list[str] | None = None) -> str:
    """The command line that resumes this run: the launch's own arguments plus ``resume_from_checkpoint=true``."""
    args = [a for a in (sys.argv if argv is None else argv) if not a.lstrip("+").startswith("resume_from_checkpoint=")]
    return shlex.join(["python", *args, "resume_from_checkpoint=true"])


def stop_cause(exc: BaseException) -> str:
    """What stopped a run, for its stop line: a signal by name (``SIGTERM``: the launcher raises KeyboardInterrupt
    with the signal's name; Ray's own handler exits with the signal number), ``Ctrl-C``, or the exception's class."""
    import signal

    if isinstance(exc, KeyboardInterrupt):
        return str(exc.args[0]) if exc.args else "Ctrl-C"
    if isinstance(exc, SystemExit) and exc.code == signal.SIGTERM:
        return "SIGTERM"
    return type(exc).__name__


class Pipeline(ABC):
    """Runs ``cfg.max_steps`` training steps; ``run()`` returns the last step's metrics."""

    #: metrics shown on the progress bar; None = the tracker's defaults
    headline_keys: list[str] | None = None
    #: metric patterns plotted at the end; None = the plot's defaults
    plot_keys: list[str] | None = None
    #: what the "seed" in a checkpoint determines (named in the error when a resume changes it)
    seed_determines = "rollout seeds"

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.output_dir = Path(cfg.output_dir)
        self.log_dir = Path(cfg.logging_dir)
        self._weight_sync: WeightSync | None = None
        self.train_seconds = 0.0  # training time so far, for max_train_minutes (checkpointed)
        self.skipped_in_a_row = 0  # steps in a row whose actor update had a non-finite gradient norm
        self.policy_version = 0  # weight syncs to actor_infer so far (checkpointed): the version tokens carry
        self.phase = "setup"  # what the run is doing, for the stop line: setup, the warm start, validation, training
        self.producers: Producers | None = None  # async_generation_ratio >= 1 (roll.rollout.buffer)
        self.async_state: dict[str, Any] | None = None  # the producers' checkpointed state, until they start
        self.health = RunHealth(cfg.run_health, self.log_dir)  # is the run learning? (checkpointed)
        self.roles: Roles
        self.trainer: PPOTrainer

    # ------------------------------------------------------------------ setup pieces
    def build_tiny_model(self, corpus: list[str] | None = None) -> None:
        """Build the tiny model at ``pretrain`` when ``tiny_model`` is set and none is there (``corpus``: extra text
        for its tokenizer)."""
        cfg = self.cfg
        if cfg.tiny_model is None:
            return
        from roll.models.tiny_vl import ensure_tiny_model_of

        if not cfg.pretrain:
            raise ValueError("tiny_model is set but pretrain (the path to build it at) is empty")
        kwargs: dict[str, Any] = dict(vars(cfg.tiny_model))
        if corpus is not None:
            kwargs["corpus"] = corpus
        ensure_tiny_model_of(cfg.pretrain, **kwargs)

    def start_roles(self, extra_cpus: float = 0.0) -> None:
        """Start the roles (typed proxies), the colocation phases and the PPO update (``extra_cpus``: see
        :func:`~roll.launch.startup.start_roles`)."""
        self.roles = start_roles(self.cfg, extra_cpus)
        self.groups = self.roles.groups
        self.phases = colocation_phases(self.cfg)
        self.trainer = PPOTrainer(
            self.cfg, self.roles, self.sync_infer, infer_released=lambda: "actor_infer" in self.phases.offloaded
        )

    def start_tracker(self, run_id: str | None, **tracker_kwargs: Any) -> None:
        """The tracker of ``track_with`` (``run_id``: continue that run, when resuming)."""
        from roll.config.loader import to_dict
        from roll.tracking import make_tracker

        cfg = self.cfg
        self.tracker = make_tracker(
            cfg.track_with,
            exp_name=cfg.exp_name,
            log_dir=str(self.log_dir),
            config=to_dict(cfg),
            tracker_kwargs={**tracker_kwargs, **dict(cfg.tracker_kwargs)},
            run_id=run_id,
        )

    @property
    def kl_ctl(self) -> Any:
        """The KL controller of the update (checkpointed with the driver state)."""
        return self.trainer.kl_ctl

    def train_sft(self, batches: Iterable[Batch], steps: int, lr: float, reset_optimizer: bool) -> dict[str, float]:
        """The supervised warm start: one NLL ``train_step`` per batch at learning rate ``lr``, then (optionally)
        fresh Adam moments, the weight sync to actor_infer, and the warm-started weights into the reference and the
        critic (KL is measured to, and values are learned on, the model RL starts from). ``max_train_minutes``
        also bounds it: it ends after the step at which its own training time reaches the budget. It runs in the
        training phase: a colocated engine is released first, as for an RL update (it held its KV pool through the
        warm start before: a 7B LoRA run's warm start peaked 11 GiB above its RL training steps, on an H200)."""
        start, losses, train = time.perf_counter(), [], self.roles.actor_train
        self.phases.activate(self.groups, {"actor_train", "reference", "critic"}, measure=False)
        budget = 60 * self.cfg.max_train_minutes
        for i, batch in enumerate(batches):
            parts = train.train_step(batch, SFT_LOSS, lr=lr)
            losses.append(sum(p["sft/loss"] for p in parts) / len(parts))
            if (i + 1) % max(1, steps // 10) == 0:
                print(f"[sft warm start] step {i + 1}/{steps} loss {losses[-1]:.4f}", flush=True)
            if budget and time.perf_counter() - start >= budget and i + 1 < steps:
                print(
                    f"[sft warm start] max_train_minutes={self.cfg.max_train_minutes} reached after step {i + 1}",
                    flush=True,
                )
                break
        if reset_optimizer:
            train.reset_optimizer()
        synced = self.sync_infer()
        for role in (self.roles.reference, self.roles.critic):
            if role is not None:
                sync_weights(train, role)
        return {
            "sft/final_loss": losses[-1],
            "sft/first_loss": losses[0],
            "sft/steps": len(losses),
            "time/sft": time.perf_counter() - start,
            "time/sft_sync": synced["time/sync"],
        }

    @abstractmethod
    def setup(self, run_id: str | None = None) -> None:
        """Start workers, data/rollouts and the tracker (``run_id``: continue that tracker run)."""

    @abstractmethod
    def warm_start(self) -> dict[str, float]:
        """The supervised warm start (called only when ``cfg.sft_warmup.enabled``)."""

    @abstractmethod
    def can_validate(self) -> bool:
        """Whether validation data or envs are configured."""

    @abstractmethod
    def validate(self, step: int) -> dict[str, float]:
        """One validation round; returns ``val/...`` metrics."""

    @abstractmethod
    def train_step(self, step: int) -> dict[str, float]:
        """One rollout batch and one update; returns the step's metrics."""

    def driver_state(self) -> dict[str, Any]:
        """Driver-side state a checkpoint keeps besides the seed, KL controller and tracker run id."""
        return {}

    def load_driver_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`driver_state` returned."""

    def finish(self) -> None:
        """Release pipeline-specific resources at the end of a run."""

    def sync_infer(self) -> dict[str, float]:
        """Sync actor_train's weights to actor_infer: CUDA IPC, NCCL broadcast or copy, chosen once from placement (see
        :class:`~roll.weights.sync.WeightSync`, set up by :func:`roll.launch.weight_sync.weight_sync`); returns
        ``time/sync`` and ``sync/*`` metrics."""
        stats = self.push_weights()
        self.policy_version += 1
        self.roles.actor_infer.set_policy_version(self.policy_version)
        if self.producers is not None:
            self.producers.buffer.set_version(self.policy_version)
        return stats

    def start_producers(
        self,
        produce: Callable[[int, int, int], list[Group]],
        units: list[int],
        batch_groups: int,
        decode: Callable[[Any], Any] = lambda x: x,
    ) -> Producers:
        """Start the asynchronous rollout producers (once; from the checkpointed state when resuming)."""
        if self.producers is None:
            self.producers = Producers.start(
                int(self.cfg.async_generation_ratio),
                batch_groups,
                self.policy_version,
                produce,
                units,
                self.async_state,
                decode,
            )
            self.async_state = None
        return self.producers

    def stop_producers(self, interrupted: bool = False) -> None:
        """Admit no more groups and, in local mode (unless ``interrupted``), wait for the producers' current rounds:
        their threads run in this process, and leaving them in native code aborted the interpreter's exit
        ("terminate called without an active exception", exit -6). In Ray mode a round in flight (minutes of long
        episodes) is not waited for; its actors go with Ray."""
        if self.producers is not None:
            if self.cfg.distributed != "ray" and not interrupted:
                self.producers.close()
            else:
                self.producers.buffer.close()

    def push_weights(self) -> dict[str, float]:
        """The weight push of :meth:`sync_infer` without a new policy version (a resume re-sends the same weights)."""
        if self._weight_sync is None:
            roles = self.roles
            self._weight_sync = weight_sync(self.cfg, roles.actor_train.weights_out, roles.actor_infer.weights_in)
        return self._weight_sync()

    # ------------------------------------------------------------------ the loop
    def begin(self) -> tuple[int, int, bool]:
        """Set up (or resume), warm start and validate at step 0: ``(first step, last step, validating)``."""
        cfg = self.cfg
        resume = ckpt.resolve_resume(cfg.resume_from_checkpoint, self.output_dir)
        self.setup(run_id=ckpt.read_state(resume)["tracker_run_id"] if resume else None)
        first = self.resume(resume) + 1 if resume else 1
        if resume is None:  # a new run in a used logging_dir: older dumps go, as metrics.jsonl starts afresh
            self.prune_dumps(0)
        if resume is None and cfg.sft_warmup.enabled:
            self.phase = "the warm start"
            warm = self.warm_start()
            self.train_seconds += warm.get("time/sft", 0.0)
            self.tracker.log(warm, step=0)
        last_step = first - 1 if self.out_of_time() else cfg.max_steps  # a warm start that used the budget: no RL step
        validating = self.can_validate() and cfg.eval_steps > 0
        if resume is None and validating:
            self.phase = "validation"
            start = self.validate(0)  # the level RL starts from: the health check's first validation reading
            self.tracker.log({**start, **self.health(0, start)}, step=0)
        return first, last_step, validating

    def stopped(self, step: int, exc: BaseException) -> None:
        """A run that stops early: stop the producers, flush the tracker, write the error log, print the stop line."""
        self.stop_producers(interrupted=isinstance(exc, KeyboardInterrupt))
        with contextlib.suppress(Exception):  # flush what was logged; the original error is the one to show
            self.tracker.finish()
        print(self.resume_hint(step, exc, self.write_error_log(exc)), flush=True)

    def run(self) -> dict[str, float]:
        """Set up (or resume), warm start, train with validation and checkpoints, save the final actor. A stop at
        any phase prints where it stopped and the command that resumes the run (:meth:`resume_hint`)."""
        from roll.tracking import progress

        cfg, step = self.cfg, 0
        try:
            first, last_step, validating = self.begin()
        except BaseException as exc:
            self.stopped(step, exc)
            raise
        last: dict[str, float] = {}
        bar_keys = {"postfix_keys": self.headline_keys} if self.headline_keys else {}
        step = first - 1
        try:
            with progress(cfg.max_steps, desc=f"{cfg.exp_name}", initial=first - 1, **bar_keys) as bar:
                for step in range(first, last_step + 1):
                    self.phase = "training"
                    metrics = self.train_step(step)
                    stop = self.count_skipped_update(step, metrics)
                    self.train_seconds += metrics.get("time/step", 0.0)
                    out_of_time = self.out_of_time()
                    final_step = step == cfg.max_steps or out_of_time
                    if validating and (step % cfg.eval_steps == 0 or final_step) and not stop:
                        metrics.update(self.validate(step))
                    metrics.update(self.health(step, metrics))
                    if step % cfg.logging_steps == 0 or final_step or stop:
                        self.tracker.log(metrics, step=step)
                    if cfg.save_steps and step % cfg.save_steps == 0 and not stop:
                        self.save(step)
                    bar.advance(metrics)
                    last = metrics
                    if stop:
                        raise RunStopped(stop)
                    if out_of_time and step < cfg.max_steps:
                        print(
                            f"[roll] max_train_minutes={cfg.max_train_minutes} reached after step {step} "
                            f"({self.train_seconds:.0f} s of training)",
                            flush=True,
                        )
                        break
        except BaseException as exc:  # Ctrl-C, a kill's KeyboardInterrupt, a crash or a RunStopped: say how to resume
            self.stopped(step, exc)
            raise
        final = self.output_dir / "final"
        self.roles.actor_train.save_pretrained(str(final))
        self.tracker.finish()
        self.stop_producers()
        self.finish()
        self.plot()
        print(self.health.summary(), flush=True)
        print(f"[roll] final actor saved to {final}", flush=True)
        return last

    def count_skipped_update(self, step: int, metrics: dict[str, float]) -> str | None:
        """Add ``actor/skipped_updates`` (1 when this step's actor update had a non-finite gradient norm, which
        the optimizer skips) and return why the run must stop once ``max_skipped_updates`` steps in a row did."""
        norm = metrics.get("actor/grad_norm")
        if norm is None:
            return None
        skipped = not math.isfinite(norm)
        metrics["actor/skipped_updates"] = float(skipped)
        self.skipped_in_a_row = self.skipped_in_a_row + 1 if skipped else 0
        limit = self.cfg.max_skipped_updates
        if not limit or self.skipped_in_a_row < limit:
            return None
        return (
            f"the actor's last {self.skipped_in_a_row} updates (steps {step - self.skipped_in_a_row + 1}-{step}) "
            f"had a non-finite gradient norm (actor/grad_norm={norm}), which the optimizer skips: nothing is being "
            f"learned. "
            f"Look for NaN/inf in rewards, advantages or the loss (strict_data_check=true checks every batch), "
            f"or lower the learning rate; max_skipped_updates={limit} sets this limit (0 = never stop)"
        )

    def resume_hint(self, step: int, exc: BaseException, error_log: Path | None = None) -> str:
        """One line for a run that stopped early: why (a signal by name), in which phase and at which step, where
        the traceback went, and the command that resumes it from the newest checkpoint (or starts it again)."""
        why = f"stopped by {stop_cause(exc)}"
        where = f"at step {step}" if self.phase == "training" else f"during {self.phase} (step {step})"
        logged = f" (traceback in {error_log})" if error_log else ""
        found = ckpt.list_checkpoints(self.output_dir)
        if not found:
            return (
                f"[roll] run {why} {where}{logged}; no checkpoint yet (save_steps={self.cfg.save_steps}): start it "
                f"again with: {resume_command()}"
            )
        return (
            f"[roll] run {why} {where}{logged}; resume from the step-{found[-1][0]} checkpoint with: {resume_command()}"
        )

    def write_error_log(self, exc: BaseException) -> Path | None:
        """``<logging_dir>/error.log``: the traceback of a run stopped by an error, and what the error carries
        (``details``: e.g. the tracebacks of a rollout's failed episodes); None for a signal, Ctrl-C or a
        :class:`RunStopped` that carries nothing (its one line says it all)."""
        details = getattr(exc, "details", "")
        if (
            isinstance(exc, KeyboardInterrupt)
            or stop_cause(exc) == "SIGTERM"
            or (isinstance(exc, RunStopped) and not details)
        ):
            return None
        import traceback

        try:
            self.log_dir.mkdir(parents=True, exist_ok=True)
            path = self.log_dir / "error.log"
            path.write_text("".join(traceback.format_exception(exc)) + (f"\n{details}" if details else ""))
        except OSError:
            return None
        return path

    def out_of_time(self) -> bool:
        """Whether ``max_train_minutes`` (0 = off) has been spent."""
        return bool(self.cfg.max_train_minutes) and self.train_seconds >= 60 * self.cfg.max_train_minutes

    def save(self, step: int) -> None:
        """Write checkpoint ``step`` (see :mod:`roll.pipelines.checkpoint`)."""
        state = {
            "seed": self.cfg.seed,
            "kl_ctl": self.kl_ctl.state_dict(),
            "tracker_run_id": self.tracker.run_id,
            "train_seconds": self.train_seconds,
            "policy_version": self.policy_version,
            "health": self.health.state_dict(),
            **self.driver_state(),
        }
        try:
            path = ckpt.save_checkpoint(
                self.output_dir, step, self.roles, state, int(self.cfg.checkpoint_config.get("max_to_keep", 0))
            )
        finally:
            if self.producers is not None:  # drained by driver_state: admit again once the workers are saved
                self.producers.buffer.release()
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        seconds = json.loads((path / ckpt.COMPLETE).read_text())["seconds"]
        print(f"[roll] checkpoint step {step} saved to {path} ({size / 2**20:.1f} MiB in {seconds:.1f} s)", flush=True)

    def resume(self, path: Path) -> int:
        """Restore checkpoint ``path`` into the workers and the driver, sync the actor; returns its step."""
        state = ckpt.load_checkpoint(path, self.roles)
        if state["seed"] != self.cfg.seed:
            raise ValueError(
                f"seed={self.cfg.seed} but checkpoint {path} was written with seed={state['seed']}; "
                f"resume with the same seed ({self.seed_determines} derive from it)"
            )
        # the steps after the checkpoint are replayed: each log and dump keeps them once
        self.tracker.rewind(int(state["step"]))
        self.prune_dumps(int(state["step"]))
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        self.train_seconds = float(state.get("train_seconds", 0.0))  # older checkpoints: counted from the resume
        self.policy_version = int(state.get("policy_version", 0))
        self.health.load_state_dict(state.get("health", {}))
        self.load_driver_state(state)
        self.push_weights()
        self.roles.actor_infer.set_policy_version(self.policy_version)
        print(f"[roll] resumed from {path} (step {state['step']}, tracker run {state['tracker_run_id']})", flush=True)
        return int(state["step"])

    def prune_dumps(self, step: int) -> None:
        """Remove the per-step dumps (trajectories, rollouts, validation renders) and run-health events of steps
        after ``step``."""
        renders = getattr(self.cfg, "render_save_dir", None)  # agentic only
        prune_step_dumps(self.log_dir, step, [renders] if renders else [])
        self.health.rewind(step)

    def plot(self) -> None:
        """``metrics.png`` next to ``metrics.jsonl``; a plot never fails a finished run."""
        from roll.tracking.plot import load_metrics, plot_metrics, select_keys

        jsonl = self.log_dir / "metrics.jsonl"
        if not jsonl.exists():
            return
        try:
            keys = None
            if self.plot_keys:
                keys = select_keys(list(load_metrics(str(jsonl)).columns), self.plot_keys, strict=False) or None
            plot_metrics(str(jsonl), str(self.log_dir / "metrics.png"), keys=keys)
        except Exception as exc:
            print(f"[roll] could not plot metrics: {exc}")
