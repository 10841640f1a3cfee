"""Env managers: run groups of envs through multi-turn episodes, batching every turn's generation requests.

Seeds (documented where computed): group ``g`` of rollout ``step`` starts from
``group_seed(seed, phase, step, g)``; every env of a group gets that seed, so a group's envs start from the same
state. Training passes the step number (seeds change every step); validation passes step 0 (fixed seeds, so
validation is comparable across steps).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from roll.agentic.chat import ChatFormatter
from roll.agentic.trajectory import Trajectory, Turn
from roll.config.agentic import CustomEnvConfig, EnvManagerConfig
from roll.config.worker import GeneratingArgs
from roll.strategies.base import GenerationOutput


def group_seed(seed: int, phase: str, step: int, group_id: int) -> int:
    """A 31-bit seed from (run seed, phase, step, group): stable across processes and Python versions."""
    digest = hashlib.blake2b(f"{seed}/{phase}/{step}/{group_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


class Generator(Protocol):
    """Anything that turns prompts (token ids) into generations: an inference worker group client."""

    def generate(self, prompts: list[list[int]], args: GeneratingArgs,
                 max_new_tokens: int | None = None) -> list[GenerationOutput]: ...


@dataclass
class GroupSpec:
    """One env group of a manager: global group index, tag and env settings."""

    group_id: int
    tag: str
    env: CustomEnvConfig


def plan_groups(manager: EnvManagerConfig, custom_envs: dict[str, CustomEnvConfig]) -> list[GroupSpec]:
    """Assign every group a tag: ``n_groups`` per tag, or ``env_groups`` split evenly across tags."""
    counts = manager.n_groups or [manager.env_groups // len(manager.tags)] * len(manager.tags)
    specs, gid = [], 0
    for tag, count in zip(manager.tags, counts):
        for _ in range(count):
            specs.append(GroupSpec(gid, tag, custom_envs[tag]))
            gid += 1
    return specs


@dataclass
class _Live:
    """An episode in progress."""

    env: Any
    traj: Trajectory
    spec: GroupSpec
    next_prompt: list[int]
    done: bool = False
    max_actions: int = 0
    info: dict[str, Any] = field(default_factory=dict)


class EnvManager:
    """Owns ``group_size`` envs for each of its groups and rolls them out in lock-step turns."""

    def __init__(self, manager: EnvManagerConfig, groups: list[GroupSpec], tokenizer_path: str,
                 generating_args: GeneratingArgs, sequence_length: int, seed: int, phase: str):
        from roll.envs import make_env
        from roll.models.loading import load_tokenizer

        self.cfg, self.groups, self.phase, self.seed = manager, groups, phase, seed
        self.args, self.sequence_length = generating_args, sequence_length
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.formatters = {g.tag: ChatFormatter(self.tokenizer, g.env.system_prompt) for g in groups}
        self.envs = []
        for spec in groups:
            kwargs = {"format_penalty": manager.format_penalty, "action_format": manager.action_format,
                      **dict(spec.env.env_config)}
            self.envs.append([make_env(spec.env.env_type, kwargs) for _ in range(manager.group_size)])

    def rollout(self, step: int, generator: Generator) -> tuple[list[Trajectory], dict[str, float]]:
        """One trajectory per env; returns the trajectories and timing metrics."""
        timings = {"generate": 0.0, "env": 0.0}
        live = self._reset_all(step, timings)
        while True:
            active = [x for x in live if not x.done]
            if not active:
                break
            for max_new, batch in self._by_budget(active).items():
                start = time.perf_counter()
                outputs = generator.generate([x.traj.pending_ids(x.next_prompt) for x in batch], self.args, max_new)
                timings["generate"] += time.perf_counter() - start
                start = time.perf_counter()
                for x, out in zip(batch, outputs):
                    self._apply(x, out)
                timings["env"] += time.perf_counter() - start
        return [x.traj for x in live], timings

    def _reset_all(self, step: int, timings: dict[str, float]) -> list[_Live]:
        start = time.perf_counter()
        live = []
        for spec, envs in zip(self.groups, self.envs):
            seed = group_seed(self.seed, self.phase, step, spec.group_id)
            for i, env in enumerate(envs):
                traj = Trajectory(f"{self.phase}-{step}-g{spec.group_id}-e{i}-t0", env_id=i, group_id=spec.group_id,
                                  tag=spec.tag, seed=seed)
                obs, info = env.reset(seed=seed)
                text = spec.env.first_turn_template.format(instruction=info["env_instruction"], observation=obs)
                role = info.get("message_role", "user")
                traj.messages.append({"role": role, "content": text})
                prompt = self.formatters[spec.tag].first_prompt(text, role)
                x = _Live(env, traj, spec, prompt, max_actions=spec.env.max_actions_per_traj)
                x.info = {"observation": obs}
                self._check_length(x)
                live.append(x)
        timings["env"] += time.perf_counter() - start
        return live

    def _by_budget(self, active: list[_Live]) -> dict[int, list[_Live]]:
        out: dict[int, list[_Live]] = {}
        for x in active:
            out.setdefault(x.spec.env.max_tokens_per_step, []).append(x)
        return out

    def _check_length(self, x: _Live) -> None:
        """End the episode if the next turn could exceed ``sequence_length``."""
        needed = len(x.traj.token_ids()) + len(x.next_prompt) + x.spec.env.max_tokens_per_step
        if needed > self.sequence_length:
            x.done, x.traj.truncated_by_length = True, True

    def _apply(self, x: _Live, out: GenerationOutput) -> None:
        fmt = self.formatters[x.spec.tag]
        ids = list(out.token_ids)
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        turn = Turn(prompt_ids=x.next_prompt, response_ids=ids, response_log_probs=list(out.log_probs),
                    observation=x.info["observation"], response_text=text, finish_reason=out.finish_reason)
        if out.finish_reason != "stop" or not ids or ids[-1] != fmt.eos_id:
            turn.response_ids = ids + [fmt.eos_id]
            turn.appended_eos = True
        x.traj.turns.append(turn)
        x.traj.messages.append({"role": "assistant", "content": text})
        try:
            obs, reward, terminated, truncated, info = x.env.step(text)
        except Exception as exc:  # an env bug ends this trajectory, not the rollout
            x.traj.failure = f"{type(exc).__name__}: {exc}"
            x.done = True
            return
        turn.reward, turn.parsed_action = float(reward), info.get("parsed_action")
        turn.action_is_valid = bool(info.get("action_is_valid", False))
        x.traj.success = bool(info.get("success", False))
        x.traj.terminated = bool(terminated)
        x.traj.env_metrics = dict(info.get("metrics", {}))
        if terminated or truncated or len(x.traj.turns) >= x.max_actions:
            x.done = True
            return
        role = info.get("message_role", "user")
        user_text = x.spec.env.turn_template.format(observation=obs, reward=reward)
        x.traj.messages.append({"role": role, "content": user_text})
        x.next_prompt = fmt.turn_delta(user_text, role)
        x.info = {"observation": obs}
        self._check_length(x)
