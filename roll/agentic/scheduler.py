"""The rollout scheduler: spreads env groups over env managers (Ray actors or in-process threads), merges their
generation requests (dynamic batching), collects whole groups of trajectories for a step; plus rollout metrics.

Failed trajectories (an env that raised or hung, see :class:`~roll.agentic.env_manager.EnvManager`) never reach the
training batch. Their group keeps its other members and is normalized without them; a group left with fewer than
2 members (when ``group_size >= 2``) is dropped, since a one-member group has no baseline. If that leaves the batch
short, up to ``max_refill_rounds`` extra rounds (fresh seeds) refill it; whatever is still missing makes the batch
smaller, trimmed to a multiple of the train mini-batch so the update still runs. Every round gives each env one
trajectory; ``max_traj_per_env`` (when > 0) caps the rounds of a step, refills included. Counts go to
``rollout/env_failures``, ``rollout/env_timeouts``, ``rollout/env_errors/<type>`` and
``rollout/dropped_trajectories``; each distinct failure is printed once per step on one line
(:mod:`roll.agentic.failures`), and the failed trajectories are kept in :attr:`RolloutScheduler.failed` for the dumps.
"""

from __future__ import annotations

import math
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from roll.agentic.env_manager import ManagerResult, plan_groups
from roll.agentic.failures import RolloutFailed, distinct, failure_details, failure_report, print_lines
from roll.agentic.gateway.manager import env_manager_class
from roll.config.agentic import AgenticConfig, EnvManagerConfig
from roll.config.validation import global_train_batch
from roll.data.trajectory import Trajectory
from roll.distributed.roles import InferProxy
from roll.rollout.batcher import DynamicBatcher, RemoteBatcher
from roll.rollout.buffer import Group, GroupBuffer
from roll.rollout.client import GenerationBackend, GenerationClient, RoleBackend, generation_client

#: CPUs each env manager actor reserves in Ray mode (its envs or agent harnesses and, for agents, a gateway).
MANAGER_CPUS = 0.5
#: Seconds env manager actors may take to start before the run stops (a cluster short of CPUs leaves them pending).
STARTUP_TIMEOUT_S = 300.0


def manager_cpus(cfg: AgenticConfig) -> float:
    """CPUs that the env manager actors of ``cfg`` (train and validation) reserve in Ray mode."""
    managers = [m for m in (cfg.train_env_manager, cfg.val_env_manager) if m is not None]
    return MANAGER_CPUS * sum(m.num_env_managers for m in managers)


def _await_started(actors: list[Any], phase: str, name: str, timeout_s: float) -> None:
    """Wait until every actor has started; a cluster without room for them fails here, naming what they need,
    instead of leaving the first rollout waiting forever."""
    import ray

    ready, pending = ray.wait([a.__ray_ready__.remote() for a in actors], num_returns=len(actors), timeout=timeout_s)
    if pending:
        raise RuntimeError(
            f"{len(pending)} of {len(actors)} {phase} {name} actors did not start within {timeout_s:.0f}s; each "
            f"reserves {MANAGER_CPUS} CPU. Ray has {ray.available_resources().get('CPU', 0):g} of "
            f"{ray.cluster_resources().get('CPU', 0):g} CPUs free: lower num_env_managers, or give Ray more CPUs "
            f"(ray_num_cpus, or more nodes)"
        )
    ray.get(ready)  # an actor whose constructor raised raises here


def train_batch_multiple(cfg: AgenticConfig) -> int:
    """Samples of one optimizer step of actor_train (and critic): the batch size must stay a multiple of it."""
    multiple = 1
    for worker in (cfg.actor_train, cfg.critic):
        if worker is not None:
            multiple = math.lcm(multiple, global_train_batch(worker))
    return multiple


class RolloutScheduler:
    """Runs the env managers of one phase ("train" or "val") and returns up to ``batch_size`` trajectories."""

    def __init__(
        self,
        cfg: AgenticConfig,
        manager: EnvManagerConfig,
        phase: str,
        tokenizer_path: str,
        infer: InferProxy,
        use_ray: bool,
    ):
        self.manager, self.phase, self.use_ray = manager, phase, use_ray
        self.custom_envs = cfg.custom_envs
        self.prefix = "rollout" if phase == "train" else phase
        self.batch_multiple = train_batch_multiple(cfg) if phase == "train" else 1
        self.min_group = 2 if manager.group_size >= 2 else 1
        n = manager.num_env_managers
        submit = infer.spec is not None and infer.spec.can("submit")  # per-env requests when the engine takes them
        self.batcher: Any = None
        inner: GenerationBackend = RoleBackend(infer)
        if n > 1 and not submit:  # merge the managers' per-turn requests
            if use_ray:
                import ray

                self.batcher = ray.remote(num_cpus=0, max_concurrency=n + 4)(DynamicBatcher).remote(
                    inner, manager.batch_max_size, manager.batch_max_wait_ms
                )
                inner = RemoteBatcher(self.batcher)
            else:
                self.batcher = DynamicBatcher(inner, manager.batch_max_size, manager.batch_max_wait_ms)
                inner = self.batcher
        self.generator: GenerationClient = generation_client(infer, inner)
        raise_errors = manager.raise_env_errors
        self.failed: list[Trajectory] = []  # the failed trajectories of the last rollout (for the dumps)
        self._failed_since_take: list[Trajectory] = []  # asynchronous: what the producers' rounds left out
        self._failed_lock = threading.Lock()
        groups = plan_groups(manager, cfg.custom_envs)
        per = len(groups) // n
        sampling = manager.generating_args or cfg.actor_infer.generating_args
        args = (tokenizer_path, sampling, cfg.sequence_length, cfg.seed, phase, raise_errors)
        manager_cls = env_manager_class(manager, cfg.custom_envs)  # EnvManager, or ProxyEnvManager (agents)
        if use_ray:
            import ray

            cls = ray.remote(num_cpus=MANAGER_CPUS)(manager_cls)
            self.managers = [cls.remote(manager, groups[i * per : (i + 1) * per], *args) for i in range(n)]
            _await_started(self.managers, phase, manager_cls.__name__, STARTUP_TIMEOUT_S)
        else:
            self.managers = [manager_cls(manager, groups[i * per : (i + 1) * per], *args) for i in range(n)]
        self._threads = ThreadPoolExecutor(n, thread_name_prefix="roll-manager") if n > 1 and not use_ray else None

    def _round(self, seed_step: int) -> list[ManagerResult]:
        """Every manager rolls out its groups once, concurrently."""
        n = len(self.managers)
        if self.use_ray:
            import ray

            if self.batcher is not None:
                ray.get(self.batcher.open.remote(n))
            return ray.get([m.rollout.remote(seed_step, self.generator) for m in self.managers])
        if self.batcher is not None:
            self.batcher.open(n)
        if self._threads is None:
            return [m.rollout(seed_step, self.generator) for m in self.managers]
        futures = [self._threads.submit(m.rollout, seed_step, self.generator) for m in self.managers]
        return [f.result() for f in futures]

    def _engine_stats(self) -> dict[str, float] | None:
        if self.batcher is None:
            return None
        if self.use_ray:
            import ray

            return ray.get(self.batcher.get_stats.remote())
        return self.batcher.get_stats()

    def rollout(self, step: int, batch_size: int) -> tuple[list[Trajectory], dict[str, float]]:
        """Rounds of all groups until ``batch_size`` usable trajectories (or refills run out); returns the
        trajectories and metrics (``{prefix}/...`` counts and ``time/{prefix}_...`` seconds)."""
        import time

        start = time.perf_counter()
        self._engine_stats()  # reset the batcher's counters
        results: list[ManagerResult] = []
        produced, refills, round_index = 0, 0, 0
        while True:
            seed_step = step * 1000 + round_index  # each round of a step gets fresh group seeds
            for r in self._round(seed_step):
                for t in r.trajectories:  # group ids unique across rounds (normalization groups by group_id)
                    t.group_id += round_index * self.manager.env_groups
                results.append(r)
                produced += len(r.trajectories)
            round_index += 1
            usable = keep_groups([t for r in results for t in r.trajectories], self.min_group)
            if len(usable) >= batch_size or 0 < self.manager.max_traj_per_env <= round_index:
                break
            if produced >= batch_size:
                if refills >= self.manager.max_refill_rounds:
                    break
                refills += 1
        batch = fit_batch(usable, batch_size, self.batch_multiple, self.min_group)
        everything = [t for r in results for t in r.trajectories]
        self.failed = [t for t in everything if t.failure]
        lines, error_counts = failure_report(self.failed, self.phase, step, self.prefix)
        print_lines(lines)
        if not batch:
            raise self._empty_batch(step, everything, len(usable))
        metrics = self._metrics(results, batch, refills, time.perf_counter() - start)
        metrics.update(error_counts)
        return batch, metrics

    # ------------------------------------------------------------------ asynchronous (async_generation_ratio >= 1)
    @property
    def units(self) -> list[int]:
        """Groups each manager plays per round: the producers' admission units (roll.rollout.buffer)."""
        return [self.manager.env_groups // len(self.managers)] * len(self.managers)

    def produce(self, i: int, round_: int, version: int) -> list[Group]:
        """Manager ``i`` plays round ``round_`` of its groups (the seeds of synchronous step ``round_``'s first
        round; group ids offset by the round so that they stay unique); its usable groups, each with the oldest
        policy version of its tokens (``version``: the one it was admitted under, for a group without tokens)."""
        seed_step = round_ * 1000
        manager = self.managers[i]
        if self.use_ray:
            import ray

            if self.batcher is not None:
                ray.get(self.batcher.open.remote(1))
            result = ray.get(manager.rollout.remote(seed_step, self.generator))
        else:
            if self.batcher is not None:
                self.batcher.open(1)
            result = manager.rollout(seed_step, self.generator)
        by_group: dict[int, list[Trajectory]] = defaultdict(list)
        for t in result.trajectories:
            t.group_id += round_ * self.manager.env_groups
        for t in keep_groups(result.trajectories, self.min_group):
            by_group[t.group_id].append(t)
        with self._failed_lock:
            self._failed_since_take += [t for t in result.trajectories if t.failure]
        return [
            Group(
                ts,
                min((turn.policy_version for t in ts for turn in t.turns), default=version),
                sum(turn.generated for t in ts for turn in t.turns) / len(ts),
            )
            for ts in by_group.values()
        ]

    def take(self, buffer: GroupBuffer, step: int, batch_size: int) -> tuple[list[Trajectory], dict[str, float]]:
        """The oldest finished groups of ``buffer`` for a batch of ``batch_size`` (a multiple of the train
        mini-batch; failed trajectories left out) and their metrics, as :meth:`rollout` returns them, plus the
        staleness metrics of :meth:`GroupBuffer.take`."""
        import time

        start = time.perf_counter()
        groups, metrics = buffer.take(batch_size // self.manager.group_size)
        trajectories = [t for g in groups for t in g.items]
        batch = fit_batch(trajectories, batch_size, self.batch_multiple, self.min_group)
        with self._failed_lock:
            failed = self.failed = self._failed_since_take
            self._failed_since_take = []
        lines, error_counts = failure_report(failed, self.phase, step, self.prefix)
        print_lines(lines)
        if not batch:
            raise self._empty_batch(step, trajectories + failed, len(trajectories))
        p = self.prefix
        metrics.update(
            {
                **failure_counts(failed, p),
                f"{p}/dropped_trajectories": float(len(trajectories) - len(batch)),
                f"{p}/batch_size": float(len(batch)),
                f"time/{p}_wait": time.perf_counter() - start,
            }
        )
        metrics.update(error_counts)
        return batch, metrics

    def _empty_batch(self, step: int, trajectories: list[Trajectory], usable: int) -> RolloutFailed:
        """Why a rollout gave no batch, in one line: what failed (by kind, with the limit that applies to each tag)
        and what was left, and the fix that fits the case; the failures' tracebacks ride along for the error log."""
        failed = [t for t in trajectories if t.failure]
        kinds = {kind: [t for t in failed if t.failure_kind == kind] for kind in ("error", "timeout")}
        left = len(trajectories) - len(failed)
        limits = ", ".join(sorted({self._time_limit(t.tag) for t in kinds["timeout"]}))
        what = (
            f"{len(failed)} of {len(trajectories)} trajectories failed ({len(kinds['error'])} raised or returned a "
            f"non-finite reward, {len(kinds['timeout'])} timed out{' after ' + limits if limits else ''}); {left} "
            f"finished, {usable} of them in groups of >= {self.min_group}, too few for a batch (a multiple of "
            f"{self.batch_multiple})"
        )
        first = f"first failure: {failed[0].failure}" if failed else "no episode failed"
        harness = any(self.custom_envs[t.tag].uses_gateway for t in failed if t.tag in self.custom_envs)
        who = "harness" if harness else "env"
        if len(kinds["error"]) >= len(kinds["timeout"]):
            fix = f"fix the {who} (its failures are listed above)"
            if failed and len({distinct(t) for t in failed}) == 1:
                fix = f"fix the {who}: the same failure ended every failed episode"
        elif harness:
            fix = (
                f"raise agent_timeout ({limits}) if the harness is only slow, or fix what it waits for (a model call "
                f"that never returns, a tool that hangs)"
            )
        else:
            fix = "fix the env's hanging call, or raise env_step_timeout if it is only slow"
        if left and failed:  # refills help only where episodes can succeed
            fix += ", or raise max_refill_rounds (each refill round plays every group again)"
        message = f"{self.phase} rollout at step {step}: no usable trajectories: {what}; {first}. To go on: {fix}."
        return RolloutFailed(message, failure_details(failed))

    def _time_limit(self, tag: str) -> str:
        """The limit whose expiry times out an episode of ``tag``: ``agent_timeout`` (harness) or
        ``env_step_timeout`` (env)."""
        spec = self.custom_envs.get(tag)
        if spec is not None and spec.uses_gateway:
            return f"agent_timeout={spec.agent_timeout:g}s (custom_envs.{tag})"
        return f"env_step_timeout={self.manager.env_step_timeout:g}s"

    def _metrics(
        self, results: list[ManagerResult], batch: list[Trajectory], refills: int, wall: float
    ) -> dict[str, float]:
        p, n = self.prefix, len(self.managers)
        all_trajs = [t for r in results for t in r.trajectories]
        failed = sum(t.failure is not None for t in all_trajs)
        checked = sum(r.conformance_checked for r in results)
        engine = self._engine_stats()
        generate = engine["busy_s"] if engine else sum(r.generate_s for r in results) / n
        metrics = {
            **failure_counts(all_trajs, p),
            f"{p}/dropped_trajectories": float(len(all_trajs) - failed - len(batch)),
            f"{p}/envs_replaced": float(sum(r.envs_replaced for r in results)),
            f"{p}/batch_size": float(len(batch)),
            f"{p}/refill_rounds": float(refills),
            f"time/{p}_generate": generate,
            f"time/{p}_env": sum(r.env_s for r in results) / n,
            f"time/{p}_idle": max(0.0, wall - generate),
        }
        if checked:
            metrics[f"{p}/template_mismatch_rate"] = sum(r.conformance_mismatches for r in results) / checked
        if engine and engine["calls"]:
            metrics[f"{p}/generate_calls"] = float(engine["calls"])
            metrics[f"{p}/prompts_per_generate_call"] = engine["prompts"] / engine["calls"]
        return metrics


def failure_counts(trajectories: list[Trajectory], prefix: str) -> dict[str, float]:
    """``{prefix}/env_failures`` and ``{prefix}/env_timeouts``: the failed trajectories among ``trajectories``."""
    return {
        f"{prefix}/env_failures": float(sum(t.failure_kind == "error" for t in trajectories)),
        f"{prefix}/env_timeouts": float(sum(t.failure_kind == "timeout" for t in trajectories)),
    }


def keep_groups(trajectories: list[Trajectory], min_group: int) -> list[Trajectory]:
    """Drop failed trajectories, then groups with fewer than ``min_group`` members left (order kept)."""
    ok = [t for t in trajectories if t.failure is None]
    sizes: dict[int, int] = defaultdict(int)
    for t in ok:
        sizes[t.group_id] += 1
    return [t for t in ok if sizes[t.group_id] >= min_group]


def fit_batch(trajectories: list[Trajectory], target: int, multiple: int, min_group: int) -> list[Trajectory]:
    """The most trajectories, at most ``target`` and a multiple of ``multiple``, with every group that is used
    keeping >= ``min_group`` members (groups are taken in order; a group may be taken in part)."""
    groups: dict[int, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[t.group_id].append(t)
    goal = min(target, len(trajectories)) // multiple * multiple
    while goal > 0:
        out, need = [], goal
        for members in groups.values():
            take = min(len(members), need)
            if 0 < need - take < min_group:  # leave room for a next group of at least min_group
                take -= min_group - (need - take)
            if take >= min_group:
                out += members[:take]
                need -= take
            if need == 0:
                return out
        goal -= multiple
    return []


def rollout_metrics(trajectories: list[Trajectory], prefix: str = "rollout") -> dict[str, float]:
    """Success rate, mean reward, invalid-action rate, actions per episode, truncations (per tag when several),
    and each env metric (``info["metrics"]``) as its mean per tag: ``env/<tag>/<name>`` (validation:
    ``val/env/<tag>/<name>``)."""
    n = max(1, len(trajectories))
    actions = sum(len(t.turns) for t in trajectories)
    invalid = sum(1 for t in trajectories for turn in t.turns if not turn.action_is_valid)
    metrics = {
        f"{prefix}/success_rate": sum(t.success for t in trajectories) / n,
        f"{prefix}/mean_reward": sum(t.score for t in trajectories) / n,
        f"{prefix}/invalid_action_rate": invalid / max(1, actions),
        f"{prefix}/mean_actions": actions / n,
        f"{prefix}/truncated_by_length": sum(t.truncated_by_length for t in trajectories) / n,
        f"{prefix}/response_tokens_per_turn": sum(turn.generated for t in trajectories for turn in t.turns)
        / max(1, actions),
        f"{prefix}/generated_tokens": float(sum(turn.generated for t in trajectories for turn in t.turns)),
    }
    by_tag: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_tag[t.tag].append(t)
    if len(by_tag) > 1:
        for tag, ts in by_tag.items():
            metrics[f"{prefix}/{tag}/success_rate"] = sum(t.success for t in ts) / len(ts)
    env = "env" if prefix == "rollout" else f"{prefix}/env"
    for tag, ts in by_tag.items():  # the env's own metrics (info["metrics"] of its last step), mean per tag
        values: dict[str, list[float]] = defaultdict(list)
        for t in ts:
            for name, value in t.env_metrics.items():
                if isinstance(value, (int, float)):
                    values[name].append(float(value))
        for name, vs in sorted(values.items()):
            metrics[f"{env}/{tag}/{name}"] = sum(vs) / len(vs)
    return metrics
