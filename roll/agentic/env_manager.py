"""Env managers: run groups of envs through multi-turn episodes, batching every turn's generation requests.

Seeds (documented where computed): group ``g`` of rollout ``step`` starts from
``group_seed(seed, phase, step, g)``; every env of a group gets that seed, so a group's envs start from the same
state. Training passes the step number (seeds change every step); validation passes step 0 (fixed seeds, so
validation is comparable across steps).
"""

from __future__ import annotations

import hashlib
import math
import time
from dataclasses import dataclass, field
from typing import Any

from roll.agentic.chat import ChatFormatter, next_turn
from roll.agentic.failures import record_error, record_failure
from roll.calls import CallOutcome, CallPool, TooManyHungCalls
from roll.config.agentic import CustomEnvConfig, EnvManagerConfig
from roll.config.worker import GeneratingArgs
from roll.data.trajectory import ImagePrompt, Trajectory, Turn
from roll.envs.base import observation_images, observation_text
from roll.rollout.client import GenerationClient
from roll.strategies.base import GenerationOutput


def group_seed(seed: int, phase: str, step: int, group_id: int) -> int:
    """A 31-bit seed from (run seed, phase, step, group): stable across processes and Python versions."""
    digest = hashlib.blake2b(f"{seed}/{phase}/{step}/{group_id}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "little") & 0x7FFFFFFF


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
    """An episode in progress; ``slot`` = (group index in this manager, env index in the group)."""

    env: Any
    traj: Trajectory
    spec: GroupSpec
    slot: tuple[int, int]
    next_prompt: list[int] = field(default_factory=list)
    starts: bool = False  # next_prompt is a whole new prompt (turn_prompt: fresh), not a delta
    done: bool = False
    observation: str = ""
    instruction: str = ""
    images: list[Any] = field(default_factory=list)  # the images of next_prompt (the observation's)


@dataclass
class ManagerResult:
    """What one manager's rollout returns: its trajectories (failed ones included) and its timings."""

    trajectories: list[Trajectory]
    wall_s: float = 0.0
    generate_s: float = 0.0  # seconds inside generator.generate (engine time + batching wait)
    env_s: float = 0.0  # seconds of env reset/step phases (concurrent calls, wall time)
    conformance_checked: int = 0
    conformance_mismatches: int = 0
    envs_replaced: int = 0


class EnvManager:
    """Owns ``group_size`` envs for each of its groups and rolls them out in lock-step turns.

    The envs' turns go to the generator as requests (:meth:`rollout`); the envs step concurrently on an
    :class:`CallPool`. Fault isolation: an env call that raises, or returns a reward that is NaN or infinite,
    ends its trajectory with ``failure_kind="error"`` (or re-raises with its traceback when ``raise_env_errors``);
    one that exceeds ``env_step_timeout`` ends it with ``failure_kind="timeout"`` and the env is replaced by a fresh
    instance (built on the pool too, under the same deadline). See :mod:`roll.agentic.failures` for what is recorded.
    """

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
        self.args, self.sequence_length, self.raise_env_errors = generating_args, sequence_length, raise_env_errors
        self.tokenizer = load_tokenizer(tokenizer_path)
        self.formatters = {g.tag: ChatFormatter(self.tokenizer, g.env.system_prompt) for g in groups}
        self.pool = CallPool(manager.env_threads)
        self.envs = [self._build([spec] * manager.group_size) for spec in groups]
        self.tokenizer_path = tokenizer_path
        self._image_inputs: Any = None

    def image_inputs(self) -> Any:
        """The model's :class:`~roll.models.vision.ImageInputs` (loaded at the first image an env shows)."""
        if self._image_inputs is None:
            from roll.models.vision import ImageInputs

            self._image_inputs = ImageInputs(self.tokenizer_path, self.tokenizer)
        return self._image_inputs

    def _request(self, x: _Live) -> list[int]:
        """The ids to generate from; with the images of the whole sample where it has some (an ImagePrompt)."""
        ids = x.traj.pending_ids(x.next_prompt, x.starts)
        images = x.images if x.starts else x.traj.sample_images() + x.images
        return ImagePrompt(ids, images) if images else ids

    def _make_env(self, spec: GroupSpec) -> Any:
        from roll.envs import make_env

        return make_env(spec.env.env_type, spec.env.env_kwargs(self.cfg.format_penalty, self.cfg.action_format))

    def _build(self, specs: list[GroupSpec]) -> list[Any]:
        """Fresh envs for ``specs``, built concurrently under ``env_step_timeout`` (constructors are user code)."""
        outcomes = self.pool.run_all(
            [lambda spec=spec: self._make_env(spec) for spec in specs], self.cfg.env_step_timeout
        )
        for spec, outcome in zip(specs, outcomes):
            if outcome.error is not None:
                raise outcome.error
            if outcome.timed_out:
                raise RuntimeError(
                    f"env tag {spec.tag!r}: building the env did not return within "
                    f"env_step_timeout={self.cfg.env_step_timeout}s"
                )
        return [outcome.value for outcome in outcomes]

    def _run(self, xs: list[_Live], calls: list, what: str) -> list[CallOutcome]:
        """``calls`` on the pool under ``env_step_timeout``; too many calls that never return stop the run."""
        try:
            return self.pool.run_all(calls, self.cfg.env_step_timeout)
        except TooManyHungCalls as exc:
            tags = sorted({x.spec.tag for x in xs})
            raise RuntimeError(
                f"env {what} of tag(s) {tags} never returns: {exc}, each abandoned after "
                f"env_step_timeout={self.cfg.env_step_timeout}s. Fix the env (or its tool) so that "
                f"its calls return."
            ) from None

    def _call_envs(self, xs: list[_Live], calls: list, what: str, result: ManagerResult) -> list[CallOutcome]:
        """Run env calls concurrently; record errors/timeouts on the trajectories; replace hung envs."""
        timeout = self.cfg.env_step_timeout
        outcomes = self._run(xs, calls, what)
        hung = []
        for x, outcome in zip(xs, outcomes):
            if outcome.error is not None:
                if self.raise_env_errors:
                    raise outcome.error  # keeps the env's own traceback (debug mode)
                record_error(x.traj, f"env.{what}", outcome.error)
                x.done = True
            elif outcome.timed_out:
                record_failure(
                    x.traj,
                    "timeout",
                    "Timeout",
                    f"env.{what}: no return within env_step_timeout={timeout}s (the env was replaced)",
                )
                x.done = True
                hung.append(x)
        if hung:  # the hung instances stay with their abandoned threads; fresh ones, built under the deadline too
            for x, env in zip(hung, self._build([x.spec for x in hung])):
                gi, ei = x.slot
                self.envs[gi][ei] = env
                result.envs_replaced += 1
        return outcomes

    def _reset_all(self, step: int, result: ManagerResult) -> list[_Live]:
        live = []
        for gi, (spec, envs) in enumerate(zip(self.groups, self.envs)):
            seed = group_seed(self.seed, self.phase, step, spec.group_id)
            for ei, env in enumerate(envs):
                traj = Trajectory(
                    f"{self.phase}-{step}-g{spec.group_id}-e{ei}-t0",
                    env_id=ei,
                    group_id=spec.group_id,
                    tag=spec.tag,
                    seed=seed,
                )
                live.append(_Live(env, traj, spec, (gi, ei)))
        t = time.perf_counter()
        outcomes = self._call_envs(live, [lambda x=x: x.env.reset(seed=x.traj.seed) for x in live], "reset", result)
        result.env_s += time.perf_counter() - t
        for x, outcome in zip(live, outcomes):
            if not outcome.ok:
                continue
            obs, info = outcome.value
            x.instruction = info["env_instruction"]
            self._next_prompt(x, obs, 0.0, info.get("message_role", "user"))
        return live

    def _by_budget(self, active: list[_Live]) -> dict[int, list[_Live]]:
        out: dict[int, list[_Live]] = {}
        for x in active:
            out.setdefault(x.spec.env.max_tokens_per_step, []).append(x)
        return out

    def _too_long(self, x: _Live) -> bool:
        """Whether the next turn could exceed ``sequence_length``."""
        return len(x.traj.pending_ids(x.next_prompt, x.starts)) + x.spec.env.max_tokens_per_step > self.sequence_length

    def _check_length(self, x: _Live) -> None:
        """End the episode if the next turn could exceed ``sequence_length``."""
        if self._too_long(x):
            x.done, x.traj.truncated_by_length = True, True

    def _step_batch(self, batch: list[_Live], outputs: list[GenerationOutput], result: ManagerResult) -> None:
        """Record each env's reply, then step the envs concurrently (timed as env time)."""
        for x, out in zip(batch, outputs):
            self._record_turn(x, out)
            self._refuse_image_tokens(x)
        batch = [x for x in batch if not x.done]
        t = time.perf_counter()
        outcomes = self._call_envs(
            batch, [lambda x=x: x.env.step(x.traj.turns[-1].response_text) for x in batch], "step", result
        )
        result.env_s += time.perf_counter() - t
        for x, outcome in zip(batch, outcomes):
            if outcome.ok:
                self._after_step(x, *outcome.value)

    def _record_turn(self, x: _Live, out: GenerationOutput) -> None:
        """Append the model's reply (token ids as generated; an end-of-turn token added after a length cut)."""
        fmt = self.formatters[x.spec.tag]
        ids = list(out.token_ids)
        # the reply's text: every generated token but the end-of-turn one; markup tokens (<answer>, <think>) may be
        # special tokens of the tokenizer, so skip_special_tokens would drop them
        text = self.tokenizer.decode(ids[:-1] if ids and ids[-1] == fmt.eos_id else ids, skip_special_tokens=False)
        turn = Turn(
            prompt_ids=x.next_prompt,
            response_ids=ids,
            response_log_probs=list(out.log_probs),
            observation=x.observation,
            response_text=text,
            finish_reason=out.finish_reason,
            policy_version=out.policy_version,
            starts_sample=x.starts,
            images=list(x.images),
        )
        if out.finish_reason != "stop" or not ids or ids[-1] != fmt.eos_id:
            turn.response_ids = ids + [fmt.eos_id]
            turn.appended_eos = True
        x.traj.turns.append(turn)
        x.traj.messages.append({"role": "assistant", "content": text})

    def _refuse_image_tokens(self, x: _Live) -> None:
        """End the episode as failed (counted, never trained) when a reply of a sample with images holds an image
        token: the model would count it as an image the sample does not have (docs/vlm.md, known limitation)."""
        if self._image_inputs is None:  # no env has shown an image: nothing to miscount
            return
        vision = self._image_inputs
        found = {vision.vision_start_id, vision.image_pad_id, vision.vision_end_id} & set(x.traj.turns[-1].response_ids)
        if found:
            names = ", ".join(sorted(self.tokenizer.convert_ids_to_tokens(sorted(found))))
            message = (
                f"the reply holds the image token(s) {names}, which a sample with images cannot be trained on (the "
                "model would count them as images); warm-start the model on the answer format (docs/vlm.md)"
            )
            record_failure(x.traj, "error", "ImageTokenInReply", message)
            x.done = True

    def _after_step(
        self, x: _Live, obs: str, reward: float, terminated: bool, truncated: bool, info: dict[str, Any]
    ) -> None:
        turn = x.traj.turns[-1]
        try:
            value = float(reward)
        except (TypeError, ValueError):  # None, a string: no number at all
            value = math.nan
        if not math.isfinite(value):  # named at its source; never reaches the scores
            message = (
                f"env.step of {type(x.env).__qualname__} returned reward={reward} for the reply "
                f"{turn.response_text[:80]!r}"
            )
            if self.raise_env_errors:
                raise ValueError(message)
            cls = type(x.env)
            record_failure(x.traj, "error", "NonFiniteReward", message, f"{cls.__module__}.{cls.__qualname__}.step")
            x.done = True
            return
        turn.reward, turn.parsed_action = value, info.get("parsed_action")
        turn.action_is_valid = bool(info.get("action_is_valid", False))
        x.traj.success = bool(info.get("success", False))
        x.traj.terminated = bool(terminated)
        x.traj.env_metrics = dict(info.get("metrics", {}))
        x.traj.final_observation = observation_text(obs)
        if terminated or truncated or len(x.traj.turns) >= x.spec.env.max_actions_per_traj:
            x.done = True
            return
        self._next_prompt(x, obs, reward, info.get("message_role", "user"))

    def _next_prompt(self, x: _Live, observation: Any, reward: float, role: str) -> None:
        """The next turn's user message and prompt ids: the first prompt, a delta after the last reply
        (``turn_prompt: append``), or a new conversation that starts a sample (``fresh``: ROLL's step prompt
        with a summary of the last turns; ``overflow: restart``: where the delta would exceed sequence_length).
        An observation's images go where the template says ``{image}``, else first in the message, one
        ``<|vision_start|><|image_pad|><|vision_end|>`` each, the pad repeated to the image's token count in the ids
        (:meth:`~roll.models.vision.ImageInputs.expand`).
        """
        from roll.models.vision import with_image_placeholders

        env, turns, fmt = x.spec.env, x.traj.turns, self.formatters[x.spec.tag]
        obs, x.images = observation_text(observation), observation_images(observation)
        fields: dict[str, Any] = dict(
            instruction=x.instruction,
            reward=reward,
            image_text=with_image_placeholders("", len(x.images)),
            role=role,
        )
        text, ids, x.starts = next_turn(env, fmt, turns, obs, **fields)
        x.traj.messages.append({"role": role, "content": text})
        x.next_prompt = self._expand(x, ids)
        x.observation = obs
        if turns and not x.starts and env.overflow == "restart" and self._too_long(x):  # continue, not truncate
            text, ids, x.starts = next_turn(env, fmt, turns, obs, restart=True, **fields)
            x.traj.messages[-1] = {"role": role, "content": text}
            x.next_prompt = self._expand(x, ids)
        self._check_length(x)

    def _expand(self, x: _Live, ids: list[int]) -> list[int]:
        """Prompt ids with each image's pad token repeated to its token count."""
        return self.image_inputs().expand(ids, x.images) if x.images else ids

    def _conformance(self, trajectories: list[Trajectory]) -> tuple[int, int]:
        """(checked, mismatched) over up to ``conformance_samples`` evenly spaced finished trajectories."""
        ok = [t for t in trajectories if t.failure is None and t.turns and not t.template_breaks]
        k = min(self.cfg.conformance_samples, len(ok))
        if k == 0:
            return 0, 0
        sample = [ok[i * len(ok) // k] for i in range(k)]
        bad = 0
        for t in sample:
            images = t.sample_images()
            expand = (lambda ids, images=images: self.image_inputs().expand(ids, images)) if images else None
            t.template_conforms = self.formatters[t.tag].conformance(t.messages, t.token_ids(), expand)
            bad += not t.template_conforms
        return k, bad

    def rollout(self, step: int, generator: GenerationClient) -> ManagerResult:
        """One trajectory per env, seeds from ``step``; failed trajectories are returned with ``failure`` set.

        Each env's turn is submitted (``generator.submit``) as soon as the env is ready, grouped by token budget, and
        the replies are stepped as they finish (``generator.poll``). With a batched client every poll generates
        all pending turns in one call per budget (lock-step turns); an engine that takes single requests
        (``submit`` ability) batches whatever is in flight, and no env waits for the others. Requests left in
        flight are aborted."""
        start = time.perf_counter()
        result = ManagerResult([])
        pending: dict[str, _Live] = {}

        def send(xs: list[_Live]) -> None:
            for max_new, batch in self._by_budget(xs).items():
                requests = [(f"{x.traj.traj_id}/turn{len(x.traj.turns)}", self._request(x)) for x in batch]
                pending.update({rid: x for (rid, _), x in zip(requests, batch)})
                generator.submit(requests, self.args, max_new)

        live: list[_Live] = []
        try:
            live = self._reset_all(step, result)
            send([x for x in live if not x.done])
            while pending:
                t = time.perf_counter()
                done = generator.poll(list(pending))
                result.generate_s += time.perf_counter() - t
                batch = [pending.pop(rid) for rid in done]
                self._step_batch(batch, list(done.values()), result)
                send([x for x in batch if not x.done])
        finally:
            if pending:
                generator.abort(list(pending))
            generator.leave()
        result.trajectories = [x.traj for x in live]
        result.conformance_checked, result.conformance_mismatches = self._conformance(result.trajectories)
        result.wall_s = time.perf_counter() - start
        return result
