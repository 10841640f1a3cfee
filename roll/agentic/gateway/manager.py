"""``ProxyEnvManager``: plays env groups with agent runners through the gateway, the way
:class:`~roll.agentic.env_manager.EnvManager` plays them with envs, and returns the same
:class:`~roll.agentic.env_manager.ManagerResult` (so grouping, reward normalization, failure counting, refills,
dumps and the viewer apply unchanged).

Per rollout: every env slot of every group gets a gateway session and one episode of the tag's runner (envs of a
group share ``group_seed(seed, phase, step, group)``, as env groups do); the episodes run concurrently on a
:class:`~roll.calls.CallPool` under ``agent_timeout``; the session's turns become the trajectory. A runner that
raises, returns a non-finite reward, never calls the model or runs past ``agent_timeout`` ends its trajectory as a
failure (its session is closed, so a hung harness's later requests get 401). The gateway enforces the tag's
``max_actions_per_traj``: the call past it is refused (``max_turns_exceeded``) and the episode ends truncated, even
when the harness raises on that answer (its posted rewards count). Trajectory metrics (``env/<tag>/...``):
``turns``, ``template_breaks``, ``tool_parse_errors``, ``turn_limit_reached``, ``policy_version_min`` and what an
:class:`AgentResult` reports.
"""

from __future__ import annotations

import math
import time
from typing import Any

from roll.agentic.env_manager import EnvManager, GroupSpec, ManagerResult, group_seed
from roll.agentic.failures import record_error, record_failure
from roll.agentic.gateway.runners import AgentResult, AgentRunner, AgentTask, load_runner
from roll.agentic.gateway.server import Gateway
from roll.agentic.gateway.session import Session
from roll.calls import CallPool, TooManyHungCalls
from roll.config.agentic import CustomEnvConfig, EnvManagerConfig
from roll.config.worker import GeneratingArgs
from roll.data.trajectory import Trajectory
from roll.rollout.client import GenerationClient


def env_manager_class(manager: EnvManagerConfig, custom_envs: dict[str, CustomEnvConfig]) -> type:
    """The manager class of an env-manager block: :class:`ProxyEnvManager` when its tags use the gateway (config
    validation keeps a block from mixing both kinds), else :class:`~roll.agentic.env_manager.EnvManager`."""
    if any(custom_envs[tag].uses_gateway for tag in manager.tags):
        return ProxyEnvManager
    return EnvManager


def lockstep_wait(manager: EnvManagerConfig, groups: list[GroupSpec]) -> float:
    """How long a turn's batch waits for late harnesses: ``gateway_wait_s``, at most a quarter of the shortest
    ``agent_timeout`` of the manager's tags (so that waiting for a hung harness never times out the others)."""
    limits = [g.env.agent_timeout / 4 for g in groups if g.env.agent_timeout > 0]
    return min([manager.gateway_wait_s, *limits])


def image_inputs_of(path: str, tokenizer: Any) -> Any:
    """The :class:`~roll.models.vision.ImageInputs` of the model at ``path`` when it is a vision-language model
    (its config has a ``vision_config``), else None: the gateway then refuses image parts."""
    from transformers import AutoConfig

    from roll.models.loading import is_vision_config

    if not is_vision_config(AutoConfig.from_pretrained(path)):
        return None
    from roll.models.vision import ImageInputs

    return ImageInputs(path, tokenizer)


class ProxyEnvManager:
    """Owns ``group_size`` episode slots per group, one gateway and the runners of its tags (same constructor and
    :meth:`rollout` as :class:`~roll.agentic.env_manager.EnvManager`)."""

    def __init__(
        self,
        manager: EnvManagerConfig,
        groups: list[GroupSpec],
        tokenizer_path: str,
        generating_args: GeneratingArgs,
        sequence_length: int,
        seed: int,
        phase: str,
        raise_env_errors: bool = False,
    ):
        from roll.models.loading import load_tokenizer

        self.cfg, self.groups, self.phase, self.seed = manager, groups, phase, seed
        self.raise_env_errors = raise_env_errors
        tokenizer = load_tokenizer(tokenizer_path)
        self.gateway = Gateway(
            tokenizer,
            generating_args,
            sequence_length,
            honor_temperature=False,
            wait_s=lockstep_wait(manager, groups),
            image_inputs=image_inputs_of(tokenizer_path, tokenizer),
        )
        self.gateway.start()
        self.runners: dict[str, AgentRunner] = {
            g.tag: load_runner(g.env.agent_runner_cls or "", g.env.agent_runner_kwargs) for g in groups
        }
        self.pool = CallPool(max(1, len(groups) * manager.group_size))

    def _task(self, spec: GroupSpec, traj: Trajectory, key: str) -> AgentTask:
        return AgentTask(
            self.gateway.base_url,
            key,
            self.gateway.model_name,
            traj.seed,
            spec.tag,
            spec.env,
            self.cfg.format_penalty,
            self.cfg.action_format,
            traj.group_id,
            traj.env_id,
            self.phase,
        )

    def rollout(self, step: int, generator: GenerationClient) -> ManagerResult:
        """One episode per slot, seeds from ``step``; failed trajectories are returned with ``failure`` set."""
        start, busy = time.perf_counter(), self.gateway.engine.busy_s
        episodes: list[tuple[GroupSpec, Trajectory, str]] = []
        sessions: list[Session] = []
        calls = []
        self.gateway.engine.use(generator)
        try:
            for spec in self.groups:
                seed = group_seed(self.seed, self.phase, step, spec.group_id)
                for ei in range(self.cfg.group_size):
                    traj = Trajectory(
                        f"{self.phase}-{step}-g{spec.group_id}-e{ei}-t0",
                        env_id=ei,
                        group_id=spec.group_id,
                        tag=spec.tag,
                        seed=seed,
                    )
                    sid, key = self.gateway.start_session(
                        spec.env.max_tokens_per_step,
                        spec.env.tool_parser,
                        name=traj.traj_id,
                        max_turns=spec.env.max_actions_per_traj,
                    )
                    task = self._task(spec, traj, key)
                    episodes.append((spec, traj, sid))
                    sessions.append(self.gateway.session(sid))
                    runner = self.runners[spec.tag]
                    calls.append(lambda runner=runner, task=task, sid=sid: self._episode(runner, task, sid))
            timeout = max(spec.env.agent_timeout for spec in self.groups) if self.groups else 0.0
            try:
                outcomes = self.pool.run_all(calls, timeout)
            except TooManyHungCalls as exc:
                raise RuntimeError(
                    f"agent runners of tag(s) {sorted(self.runners)} never return: {exc}, each "
                    f"abandoned after agent_timeout={timeout}s; fix the harness"
                ) from None
        finally:
            for _, _, sid in episodes:  # those still open: abandoned (timed out) or never run
                self.gateway.end_session(sid)
            self.gateway.engine.use(None)
            generator.leave()
        for (spec, traj, _), session, outcome in zip(episodes, sessions, outcomes):
            if outcome.error is not None and self.raise_env_errors:
                raise outcome.error
            self._fill(traj, session, spec)
            if outcome.error is not None and session.turn_limit_hit:  # it ended on the turn-limit answer: truncated
                self._score(traj, session, None)
            elif outcome.error is not None:
                record_error(traj, "agent.run", outcome.error)
            elif outcome.timed_out:
                record_failure(
                    traj,
                    "timeout",
                    "Timeout",
                    f"agent.run: no return within agent_timeout={spec.env.agent_timeout}s (its session was closed)",
                )
            else:
                self._score(traj, session, outcome.value)
        result = ManagerResult([t for _, t, _ in episodes], wall_s=time.perf_counter() - start)
        result.generate_s = self.gateway.engine.busy_s - busy
        result.env_s = max(0.0, result.wall_s - result.generate_s)
        return result

    def _episode(self, runner: AgentRunner, task: AgentTask, session_id: str) -> Any:
        """One runner call; its session closes when it returns, so the gateway stops waiting for its requests."""
        try:
            return runner.run(task)
        finally:
            self.gateway.end_session(session_id)

    def _fill(self, traj: Trajectory, session: Session, spec: GroupSpec) -> None:
        """The session's turns and conversation on the trajectory (rewards come with :meth:`_score`); an image the
        harness sent is an ``[image]`` marker in the conversation and the turns' observations (its pixels are the
        turn's ``images``)."""
        traj.turns = list(session.turns)
        traj.truncated_by_length = session.truncated
        marker = self.gateway.renderer.placeholder
        for turn in traj.turns:  # the message each reply answered, as the dumps show it
            turn.observation = _shown(turn.observation, marker)
        traj.messages = [
            {"role": m["role"], "content": _shown(m["content"], marker) or _calls_text(m)} for m in session.messages
        ]
        traj.env_metrics = {
            "turns": float(len(session.turns)),
            "template_breaks": float(session.template_breaks),
            "tool_parse_errors": float(session.parse_errors),
            "turn_limit_reached": float(session.turn_limit_hit),
        }
        if session.turns:
            traj.env_metrics["policy_version_min"] = float(min(t.policy_version for t in session.turns))

    def _score(self, traj: Trajectory, session: Session, value: Any) -> None:
        """The runner's return value as the episode reward (None: what the harness posted)."""
        result = value if isinstance(value, AgentResult) else AgentResult(session.reward if value is None else value)
        try:
            reward = float(result.reward if result.reward is not None else 0.0)
        except (TypeError, ValueError):
            reward = math.nan
        if not math.isfinite(reward):
            record_failure(traj, "error", "NonFiniteReward", f"agent.run returned reward={result.reward!r}")
            return
        if not session.turns:
            record_failure(
                traj,
                "error",
                "NoModelCall",
                "agent.run returned without calling the model (no turn "
                "to train on): check the harness's base_url and api_key",
            )
            return
        session.reward = reward
        traj.turns = list(session.scored_turns())
        traj.success = bool(result.success) if result.success is not None else reward > 0
        traj.terminated = not (session.truncated or session.turn_limit_hit)
        traj.env_metrics.update({k: float(v) for k, v in result.metrics.items()})


def _shown(content: str, placeholder: str) -> str:
    """Message text with each image placeholder (a vision-language actor's; the gateway refuses it as text, so each
    one is an image part) as ``[image]``."""
    return content.replace(placeholder, "[image]") if placeholder and content else content


def _calls_text(message: dict[str, Any]) -> str:
    """Tool calls as text for the viewer (content is empty when a reply only calls tools)."""
    import json

    return "".join(
        f"<tool_call>{json.dumps({'name': c['function']['name'], 'arguments': c['function']['arguments']})}</tool_call>"
        for c in message.get("tool_calls", [])
    )
