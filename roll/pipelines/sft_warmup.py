"""Supervised warm start: solver demonstrations rendered exactly like rollouts, trained with an NLL loss.

Demonstrations go through the same chat formatter and trajectory -> batch conversion as RL rollouts, so the model
learns the very token layout it will later be sampled in.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Any, overload

from roll.agentic.chat import ChatFormatter, next_turn
from roll.agentic.env_manager import group_seed
from roll.config.agentic import AgenticConfig, CustomEnvConfig
from roll.data.batch import Batch
from roll.data.layout import several_samples, trajectories_to_batch
from roll.data.trajectory import Trajectory, Turn
from roll.envs.base import observation_images, observation_text
from roll.models.vision import ImageInputs, add_pixel_values, with_image_placeholders

#: Why a seed gave no demonstration (counted in the error when none does).
NO_PLAN = "solution() returned no plan"
TOO_LONG = "the plan was longer than max_actions_per_traj"
NO_SUCCESS = (
    "the plan did not reach success (no step reported info['success']=True before the episode ended or "
    "the plan ran out)"
)


def demo_env(cfg: AgenticConfig) -> tuple[str, CustomEnvConfig, dict[str, Any]]:
    """``(tag, spec, env kwargs)`` of the env the warm start's demonstrator plays: ``sft_warmup.tag`` (default: the
    first train tag), with the train env manager's format penalty and action format."""
    tag = cfg.sft_warmup.tag or cfg.train_env_manager.tags[0]
    spec = cfg.custom_envs[tag]
    manager = cfg.train_env_manager
    return tag, spec, spec.env_kwargs(manager.format_penalty, manager.action_format)


def demo_seed(seed: int, index: int) -> int:
    """The room of the warm start's ``index``-th demonstration attempt under ``sft_warmup.seed`` = ``seed``."""
    return group_seed(seed, "sft", 0, index)


def demo_trajectory(
    env,
    spec: CustomEnvConfig,
    formatter: ChatFormatter,
    seed: int,
    tag: str,
    images: ImageInputs | None = None,
    noise: float = 0.0,
) -> Trajectory | str:
    """Play the env's ``solution()`` from ``reset(seed)`` as a conversation, each action written in the env's own
    action format (``env.parser.render``); the reason (:data:`NO_PLAN`, :data:`TOO_LONG`, :data:`NO_SUCCESS`) when
    it gives no demonstration. Observations with images (``render_mode: rgb_array``) are shown as rollouts show them
    (the frames before the text, their tokens expanded by ``images``), and each turn keeps its frames.

    ``noise`` > 0 makes the demonstrator an imperfect expert: before each move, with probability ``noise`` it takes
    a uniformly random action of ``env.valid_actions`` (seeded by ``seed``) instead of its plan's next move, then
    plans again from where it stands. Its successful episodes keep those detours, so a policy imitating it makes
    them too; RL has to learn to do better. ``noise`` = 0 follows the first plan.

    The turns are prompted as the env manager prompts them (:func:`~roll.agentic.chat.next_turn`, the env's
    instruction in every turn's template): with ``turn_prompt: fresh`` each later turn is a new conversation (its
    ``{history}`` summarising the last turns) that starts a sample, else a delta after the reply.

    Raises:
        ValueError: the env does not accept a rendered solution action (the format or the solver is broken).
    """
    obs, info = env.reset(seed=seed)
    plan = env.solution()
    if not plan:
        return NO_PLAN
    if noise == 0 and len(plan) > spec.max_actions_per_traj:
        return TOO_LONG
    rng = random.Random(seed)
    traj = Trajectory(f"sft-{seed}", env_id=0, group_id=0, tag=tag, seed=seed)
    instruction = info["env_instruction"]

    def prompt_of(obs: Any, reward: float = 0.0) -> tuple[list[int], bool, list]:
        """The next turn's prompt ids (frames expanded), whether it starts a sample, and its frames."""
        frames = observation_images(obs)
        placeholders = with_image_placeholders("", len(frames))
        text = observation_text(obs)
        _, ids, starts = next_turn(
            spec, formatter, traj.turns, text, instruction=instruction, reward=reward, image_text=placeholders
        )
        return _with_frames(ids, frames, images), starts, frames

    prompt, starts, frames = prompt_of(obs)
    while plan and len(traj.turns) < spec.max_actions_per_traj:
        detour = noise > 0 and rng.random() < noise
        action = rng.choice(env.valid_actions) if detour else plan[0]
        written = env.parser.render(action)
        reply = formatter.encode(written) + [formatter.eos_id]
        turn = Turn(
            prompt_ids=prompt,
            response_ids=reply,
            response_log_probs=[],
            observation=observation_text(obs),
            response_text=written,
            starts_sample=starts,
        )
        turn.images = frames
        traj.turns.append(turn)
        obs, reward, terminated, truncated, info = env.step(written)
        if not info.get("action_is_valid", True):
            raise ValueError(
                f"sft_warmup: env {spec.env_type!r} rejected its own solution action {action!r} written "
                f"as {written!r} (action_format={env.action_format!r})"
            )
        traj.turns[-1].reward, traj.turns[-1].parsed_action = float(reward), info.get("parsed_action")
        traj.turns[-1].action_is_valid = True
        if terminated or truncated:
            traj.success = bool(info.get("success"))
            break
        plan = env.solution() if noise > 0 else plan[1:]
        prompt, starts, frames = prompt_of(obs, float(reward))
    return traj if traj.success else NO_SUCCESS


def _with_frames(ids: list[int], frames: list, images: ImageInputs | None) -> list[int]:
    """Prompt ids with each frame's image tokens (:meth:`ImageInputs.expand`); ``ids`` when there are none."""
    if not frames:
        return ids
    if images is None:
        raise ValueError("sft_warmup: the env shows images; demonstrations with images need the model's ImageInputs")
    return images.expand(ids, frames)


def make_demo_batches(
    spec: CustomEnvConfig,
    env_kwargs: dict,
    tokenizer,
    tag: str,
    num_demos: int,
    batch_size: int,
    steps: int,
    seed: int,
    model_path: str | None = None,
    noise: float = 0.0,
) -> DemoBatches:
    """``steps`` batches of ``batch_size`` demonstration episodes (cycling through ``num_demos`` of them; made by a
    demonstrator that deviates from its plan with probability ``noise``, see :func:`demo_trajectory`); for an env
    that shows images, with ``pixel_values`` / ``image_grid_thw`` from the image processor at ``model_path``."""
    from roll.envs import make_env

    env = make_env(spec.env_type, env_kwargs)
    formatter = ChatFormatter(tokenizer, spec.system_prompt)
    images = ImageInputs(model_path, tokenizer) if env_kwargs.get("render_mode") == "rgb_array" and model_path else None
    demos: list[Trajectory] = []
    missed: Counter = Counter()
    index = 0
    while len(demos) < num_demos and index < num_demos * 5:
        traj = demo_trajectory(env, spec, formatter, demo_seed(seed, index), tag, images, noise)
        index += 1
        if isinstance(traj, str):
            missed[traj] += 1
        else:
            demos.append(traj)
    if not demos:
        why = "; ".join(f"{n} of {index}: {reason}" for reason, n in missed.most_common())
        raise RuntimeError(
            f"sft_warmup: env {spec.env_type!r} gave no demonstration from {index} seeds ({why}; "
            f"max_actions_per_traj={spec.max_actions_per_traj})"
        )
    rng = random.Random(seed)
    picks: list[list[int]] = []
    order: list[int] = []
    for _ in range(steps):
        while len(order) < batch_size:
            extra = list(range(len(demos)))
            rng.shuffle(extra)
            order += extra
        picked, order = order[:batch_size], order[batch_size:]
        picks.append(picked)
    return DemoBatches(demos, picks, tokenizer.pad_token_id, images, spec.trajectory_mode)


class DemoBatches(Sequence[Batch]):
    """The warm start's batches, each built when it is read: batch ``k`` is the demonstrations ``picks[k]`` in the
    token layout (and, for an env with images, their pixel values: built ahead for every step they would hold
    gigabytes). Episodes become samples as rollouts do (``mode``: the tag's ``trajectory_mode``); a batch whose
    episodes have several samples (``step`` mode, ``turn_prompt: fresh``) is one optimizer step, as in RL."""

    def __init__(
        self,
        demos: list[Trajectory],
        picks: list[list[int]],
        pad_id: int,
        images: ImageInputs | None,
        mode: str = "traj",
    ):
        self.demos, self.picks, self.pad_id, self.images, self.mode = demos, picks, pad_id, images, mode

    def __len__(self) -> int:
        return len(self.picks)

    @overload
    def __getitem__(self, k: int) -> Batch: ...

    @overload
    def __getitem__(self, k: slice) -> list[Batch]: ...

    def __getitem__(self, k: int | slice) -> Batch | list[Batch]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        batch = trajectories_to_batch([self.demos[i] for i in self.picks[k]], self.pad_id, self.mode)
        if several_samples(batch):
            batch.info["one_optimizer_step"] = True
        if "images" in batch and self.images is not None:
            add_pixel_values(batch, batch["images"], self.images)
        return batch
