"""The rollout scheduler: spreads env groups over env managers (Ray actors or in-process) and collects whole
groups of trajectories for a step; plus rollout metrics."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from roll.agentic.env_manager import EnvManager, plan_groups
from roll.agentic.trajectory import Trajectory
from roll.config.agentic import AgenticConfig, EnvManagerConfig
from roll.config.worker import GeneratingArgs
from roll.distributed.group import WorkerGroup
from roll.strategies.base import GenerationOutput


class GroupGenerator:
    """Sends a list of prompts to an inference worker group as one request per rank (data parallel)."""

    def __init__(self, group: WorkerGroup):
        self.group = group

    def generate(self, prompts: list[list[int]], args: GeneratingArgs,
                 max_new_tokens: int | None = None) -> list[GenerationOutput]:
        n = self.group.world_size
        bounds = [round(i * len(prompts) / n) for i in range(n + 1)]
        chunks = [prompts[bounds[i]:bounds[i + 1]] for i in range(n)]
        results = self.group.call_each("generate", [(c, args, max_new_tokens) for c in chunks])
        return [out for part in results for out in part]


class RolloutScheduler:
    """Runs the env managers of one phase ("train" or "val") and returns ``batch_size`` trajectories."""

    def __init__(self, cfg: AgenticConfig, manager: EnvManagerConfig, phase: str, tokenizer_path: str,
                 infer_group: WorkerGroup, use_ray: bool):
        self.manager, self.phase, self.use_ray = manager, phase, use_ray
        self.generator = GroupGenerator(infer_group)
        groups = plan_groups(manager, cfg.custom_envs)
        per = len(groups) // manager.num_env_managers
        args = cfg.actor_infer.generating_args
        make = (lambda gs: _remote_manager(manager, gs, tokenizer_path, args, cfg.sequence_length, cfg.seed, phase)) \
            if use_ray else (lambda gs: EnvManager(manager, gs, tokenizer_path, args, cfg.sequence_length,
                                                   cfg.seed, phase))
        self.managers = [make(groups[i * per:(i + 1) * per]) for i in range(manager.num_env_managers)]

    def rollout(self, step: int, batch_size: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Whole groups until ``batch_size`` trajectories; one round per ``max_traj_per_env``."""
        trajectories: list[Trajectory] = []
        timings: dict[str, float] = defaultdict(float)
        round_index = 0
        while len(trajectories) < batch_size:
            seed_step = step * 1000 + round_index  # each round of a step gets fresh group seeds
            if self.use_ray:
                import ray

                results = ray.get([m.rollout.remote(seed_step, self.generator) for m in self.managers])
            else:
                results = [m.rollout(seed_step, self.generator) for m in self.managers]
            for trajs, times in results:
                trajectories += trajs
                for k, v in times.items():
                    timings[k] += v
            round_index += 1
        return trajectories[:batch_size], dict(timings)


def _remote_manager(*args: Any) -> Any:
    import ray

    return ray.remote(num_cpus=0.5)(EnvManager).remote(*args)


def rollout_metrics(trajectories: list[Trajectory], prefix: str = "rollout") -> dict[str, float]:
    """Success rate, mean reward, invalid-action rate, actions per episode, truncations, env failures."""
    n = max(1, len(trajectories))
    actions = sum(len(t.turns) for t in trajectories)
    invalid = sum(1 for t in trajectories for turn in t.turns if not turn.action_is_valid)
    metrics = {
        f"{prefix}/success_rate": sum(t.success for t in trajectories) / n,
        f"{prefix}/mean_reward": sum(t.score for t in trajectories) / n,
        f"{prefix}/invalid_action_rate": invalid / max(1, actions),
        f"{prefix}/mean_actions": actions / n,
        f"{prefix}/truncated_by_length": sum(t.truncated_by_length for t in trajectories) / n,
        f"{prefix}/env_failures": float(sum(t.failure is not None for t in trajectories)),
        f"{prefix}/response_tokens_per_turn": sum(len(turn.response_ids) for t in trajectories for turn in t.turns)
        / max(1, actions),
    }
    by_tag: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_tag[t.tag].append(t)
    if len(by_tag) > 1:
        for tag, ts in by_tag.items():
            metrics[f"{prefix}/{tag}/success_rate"] = sum(t.success for t in ts) / len(ts)
    return metrics
