"""Turns and trajectories of multi-turn episodes: what a rollout produces and what becomes a training sample.

Plain dataclasses (no torch): the env managers fill them, :mod:`roll.data.layout` turns them into token layouts
and batches, the pipelines and the SFT warm start read them.

Ids: ``traj_id = "{phase}-{step}-g{group_id}-e{env_index}-t{k}"`` (k-th trajectory of that env in the step);
``env_id`` is the env's index within its group; ``group_id`` is the global group index.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


class ImagePrompt(list[int]):
    """Prompt token ids together with the images their ``<|image_pad|>`` runs stand for, in order (H x W x 3 uint8
    arrays). A ``list[int]``, so every generation path that carries prompts (clients, batcher, Ray) carries it
    unchanged; an engine that serves a vision-language model reads :attr:`images` (``hf_infer``, ``sglang``), and
    one that does not refuses a prompt that has images."""

    def __init__(self, ids: Iterable[int] = (), images: Iterable[Any] = ()):
        super().__init__(ids)
        self.images: tuple[Any, ...] = tuple(images)


def prompt_images(prompt: list[int]) -> tuple[Any, ...]:
    """The images of a prompt (an :class:`ImagePrompt`'s; none for plain token ids)."""
    return getattr(prompt, "images", ())


@dataclass
class Turn:
    """One model turn: the tokens given before it, the tokens it produced, and what the env made of them."""

    prompt_ids: list[int]  # tokens appended before this reply (first prompt, or the delta after the last reply)
    response_ids: list[int]  # generated tokens, ending with the end-of-turn token unless cut by length
    response_log_probs: list[float]
    observation: str  # the observation shown in prompt_ids
    response_text: str = ""
    parsed_action: str | None = None
    action_is_valid: bool = False
    reward: float = 0.0
    finish_reason: str = "stop"
    appended_eos: bool = False  # an end-of-turn token was added after a length-cut reply (not trained on)
    policy_version: int = 0  # the policy version (weight syncs) that generated this reply (async rollouts)
    #: prompt_ids is the complete prompt of a new sample, not a delta after the previous reply: the engine was given
    #: exactly prompt_ids (a chat template that rewrote the history, or a step template's self-contained prompt)
    starts_sample: bool = False
    #: the images of this turn's observation (H x W x 3 uint8 arrays), shown in prompt_ids in this order (each as
    #: ``<|vision_start|><|image_pad|>*n<|vision_end|>``); empty for a text observation
    images: list[Any] = field(default_factory=list)

    @property
    def generated(self) -> int:
        """How many of ``response_ids`` the model generated (all but an appended end-of-turn token)."""
        return len(self.response_ids) - (1 if self.appended_eos else 0)


@dataclass
class Trajectory:
    """One episode of one env: its turns, outcome and ids."""

    traj_id: str
    env_id: int
    group_id: int
    tag: str
    seed: int
    turns: list[Turn] = field(default_factory=list)
    messages: list[dict[str, str]] = field(default_factory=list)  # the conversation (for conformance/dumps)
    success: bool = False
    terminated: bool = False
    truncated_by_length: bool = False
    failure: str | None = None  # an env error or timeout, recorded instead of crashing the rollout (one line)
    failure_kind: str | None = None  # "error" (reset/step raised) or "timeout" (no return within env_step_timeout)
    failure_type: str | None = None  # the exception's class name, "Timeout" or "NonFiniteReward"
    failure_at: str | None = None  # "file:line in function" that raised (the user's code when it is in the traceback)
    failure_turn: int | None = None  # model turns before the failure (0: in reset, k: in the step after reply k)
    failure_traceback: str | None = None  # the exception's whole traceback, chained causes included (for the log)
    template_conforms: bool | None = None  # token ids == chat template of the whole conversation (None: unchecked)
    env_metrics: dict[str, float] = field(default_factory=dict)
    final_observation: str | None = None  # what the env showed after the last action (None: no step completed)

    @property
    def score(self) -> float:
        """Episode score: the sum of the env's rewards (format penalties included)."""
        return float(sum(t.reward for t in self.turns))

    @property
    def num_actions(self) -> int:
        return sum(1 for t in self.turns if t.parsed_action is not None or t.response_ids)

    def token_ids(self) -> list[int]:
        """The current sample as token ids, exactly as the model saw and produced them: the turns from the last one
        that ``starts_sample`` on (the whole conversation when no later turn starts a sample)."""
        ids: list[int] = []
        for turn in self.turns:
            if turn.starts_sample:
                ids = []
            ids += turn.prompt_ids + turn.response_ids
        return ids

    def sample_images(self) -> list[Any]:
        """The images of the current sample (:meth:`token_ids`), in the order their tokens appear."""
        images: list[Any] = []
        for turn in self.turns:
            if turn.starts_sample:
                images = []
            images += turn.images
        return images

    def pending_ids(self, next_prompt: list[int], starts_sample: bool = False) -> list[int]:
        """The ids to generate from: ``next_prompt`` appended to :meth:`token_ids`, or ``next_prompt`` alone when
        it ``starts_sample``."""
        return list(next_prompt) if starts_sample else self.token_ids() + next_prompt

    @property
    def template_breaks(self) -> int:
        """Turns after the first that start a new sample (``rollout/template_breaks``)."""
        return sum(turn.starts_sample for turn in self.turns[1:])
