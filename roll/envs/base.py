"""The contract every text environment follows: :class:`TextEnv`.

The base class owns everything shared by all envs: seeding, parsing the raw model text, the format
penalty for unparseable or invalid actions, the step budget (``max_steps`` -> ``truncated``), the
info keys and rendering to text. A subclass writes only the game, through small hooks:

- :meth:`TextEnv._reset` builds a start state from the seeded generator and returns the observation;
- :meth:`TextEnv._apply` applies one *valid* action and returns a :class:`Transition`;
- :meth:`TextEnv._observation` renders the current state as text;
- :meth:`TextEnv.instruction` states the task rules (``info["env_instruction"]``);
- validity: declare ``valid_actions`` (matched case-insensitively) or override
  :meth:`TextEnv._canonical_action` for free-form answers;
- :meth:`TextEnv._metrics` adds per-env numbers to ``info["metrics"]``;
- :meth:`TextEnv._frame` draws the state as an RGB image (envs that list ``"rgb_array"`` in
  ``metadata["render_modes"]``).

Observations are text. An env built with ``render_mode="rgb_array"`` sees too: ``reset``/``step`` return an
:class:`Observation` (the text plus the frame) instead of a string, for vision-language actors.
"""

from __future__ import annotations

import string
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, SupportsFloat

import gymnasium
import numpy as np
from gymnasium import spaces

from roll.envs.parsing import ActionParser

#: Every character an env may emit or receive; grids are ASCII only.
TEXT_CHARSET: str = string.printable
#: Upper bound on observation length, in characters (a Text space needs one).
MAX_OBSERVATION_CHARS: int = 16_384
#: Upper bound on action text length, in characters.
MAX_ACTION_CHARS: int = 16_384


@dataclass(frozen=True)
class Observation:
    """An observation with images: the text plus frames (H x W x 3 uint8 RGB arrays or PIL images).

    What ``reset``/``step`` return in place of a string when an env shows images (gymnasium-style: an env in
    ``render_mode="rgb_array"``, or a user's env that returns one). The env manager puts the images into the
    turn's prompt, before the text, in order."""

    text: str
    images: tuple[Any, ...] = ()


def observation_text(observation: str | Observation) -> str:
    """The text of an observation (a string, or an :class:`Observation`'s ``text``)."""
    return observation.text if isinstance(observation, Observation) else observation


def observation_images(observation: str | Observation) -> list[np.ndarray]:
    """The images of an observation as H x W x 3 uint8 RGB arrays (none for a string).

    Raises:
        ValueError: an image is neither a PIL image nor an (H, W, 3) / (H, W) array of values in 0..255.
    """
    if not isinstance(observation, Observation):
        return []
    out = []
    for k, image in enumerate(observation.images):
        if hasattr(image, "convert"):  # a PIL image
            image = image.convert("RGB")
        array = np.asarray(image)
        if array.ndim == 2:
            array = np.repeat(array[:, :, None], 3, axis=2)
        if array.ndim != 3 or array.shape[2] != 3 or min(array.shape[:2]) < 1:
            raise ValueError(
                f"Observation.images[{k}] has shape {array.shape}; expected an H x W x 3 RGB array or a PIL image."
            )
        if array.dtype != np.uint8:
            if array.size and (array.min() < 0 or array.max() > 255):
                raise ValueError(f"Observation.images[{k}] has values outside 0..255; expected uint8 RGB.")
            array = array.astype(np.uint8)
        out.append(np.ascontiguousarray(array))
    return out


class Transition(NamedTuple):
    """What :meth:`TextEnv._apply` returns for one valid action."""

    observation: str
    reward: float
    terminated: bool
    success: bool = False
    info: dict[str, Any] | None = None


class TextEnv(gymnasium.Env[str | Observation, str], ABC):
    """Base class of all roll text environments (a ``gymnasium.Env`` with text spaces).

    Action space:
        ``Text(max_length=MAX_ACTION_CHARS, charset=string.printable)``: the raw model text. It is
        parsed with :class:`~roll.envs.parsing.ActionParser` (``action_format``) and then checked by
        the subclass; text that yields no valid action costs ``format_penalty`` and leaves the state
        unchanged.

    Observation space:
        ``Text(min_length=0, max_length=MAX_OBSERVATION_CHARS, charset=string.printable)``.

    Episode end:
        ``terminated`` when the subclass says so (goal reached, failure, answer given);
        ``truncated`` when ``max_steps`` actions (valid or not) were taken without termination
        (``terminated`` instead for envs that set ``max_steps_terminates``).
        Stepping a finished episode raises ``RuntimeError``: call ``reset()``.

    Info (every step): ``action_is_valid`` (bool), ``success`` (bool), ``parsed_action``
    (str | None, the text the parser extracted), ``metrics`` (dict[str, float], with at least
    ``num_steps`` and ``invalid_actions``), ``message_role`` (str, ``"user"`` unless an env answers as
    ``"tool"``), plus anything the subclass adds. ``reset`` returns ``env_instruction`` (the task
    rules, constant for an env config), ``message_role``, ``success`` and ``metrics``.

    Args:
        max_steps: actions per episode; reaching it without termination sets ``truncated=True``.
        format_penalty: reward for an unparseable or invalid action (usually negative).
        action_format: ``"answer"``, ``"think_answer"`` or a regex with one capture group.
        render_mode: ``None`` or one of ``metadata["render_modes"]``. ``"rgb_array"``: ``reset``/``step`` return
            ``Observation(text, (frame,))`` with the frame of :meth:`_frame`, and ``render()`` returns the frame.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi"], "render_fps": 4}
    #: Canonical action words; the parsed text is matched case-insensitively. Empty: override
    #: :meth:`_canonical_action` instead.
    valid_actions: ClassVar[tuple[str, ...]] = ()
    #: Chat role of the env's observation messages ("user"; a tool env sets "tool").
    message_role: ClassVar[str] = "user"
    #: True for answer-budget tasks (Countdown: a fixed number of attempts is a rule of the game):
    #: the last allowed action then sets ``terminated`` instead of ``truncated``, so learners do
    #: not bootstrap a value past the end of the task.
    max_steps_terminates: ClassVar[bool] = False
    #: For envs whose observation is a text grid: symbol -> what it shows (``{"#": "wall", ...}``). Viewers
    #: (``roll view``) draw such observations as boards, colored by these names; None: plain text.
    grid_symbols: ClassVar[dict[str, str] | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """An env that draws itself (overrides :meth:`_frame`) offers ``render_mode="rgb_array"``."""
        super().__init_subclass__(**kwargs)
        modes = list(cls.metadata.get("render_modes", []))
        if cls._frame is not TextEnv._frame and "rgb_array" not in modes:
            cls.metadata = {**cls.metadata, "render_modes": [*modes, "rgb_array"]}

    def __init__(
        self,
        *,
        max_steps: int,
        format_penalty: float = -0.1,
        action_format: str = "answer",
        render_mode: str | None = None,
    ) -> None:
        if not isinstance(max_steps, (int, np.integer)) or isinstance(max_steps, bool) or max_steps < 1:
            raise ValueError(f"max_steps={max_steps!r} must be an integer >= 1 (actions per episode).")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode={render_mode!r} is not supported by {type(self).__name__}; "
                f"use None or one of {self.metadata['render_modes']}."
            )
        self.max_steps = int(max_steps)
        self.format_penalty = float(format_penalty)
        self.action_format = action_format
        self.parser = ActionParser(action_format)
        self.render_mode = render_mode
        self.observation_space = spaces.Text(min_length=0, max_length=MAX_OBSERVATION_CHARS, charset=TEXT_CHARSET)
        self.action_space = spaces.Text(min_length=0, max_length=MAX_ACTION_CHARS, charset=TEXT_CHARSET)
        self._valid_lookup = {a.lower(): a for a in self.valid_actions}
        self._num_steps = 0
        self._invalid_actions = 0
        self._episode_over = True
        self._success = False

    # ----------------------------------------------------------------- hooks for subclasses
    @abstractmethod
    def instruction(self) -> str:
        """The task rules shown once at the start of a conversation (``info["env_instruction"]``)."""

    @abstractmethod
    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> str:
        """Build a new start state from ``rng`` (already seeded) and return its observation."""

    @abstractmethod
    def _apply(self, action: str) -> Transition:
        """Apply one valid, canonical ``action`` to the state and return the transition."""

    @abstractmethod
    def _observation(self) -> str:
        """The current state as text (returned again after an invalid action, and by ``render``)."""

    def _canonical_action(self, parsed: str) -> str | None:
        """Map parsed text to a canonical action, or ``None`` if it is not a valid action.

        The default matches ``valid_actions`` case-insensitively; free-form envs override this.
        """
        return self._valid_lookup.get(parsed.strip().lower())

    def _frame(self) -> np.ndarray:
        """The current state as an H x W x 3 uint8 RGB image (``render_mode="rgb_array"``).

        Envs that draw themselves override this and list ``"rgb_array"`` in ``metadata["render_modes"]``."""
        raise NotImplementedError(
            f"{type(self).__name__} does not draw frames; override _frame() and add 'rgb_array' to "
            "metadata['render_modes']."
        )

    def _shown(self, text: str) -> str | Observation:
        """What the agent sees: ``text``, or with ``render_mode="rgb_array"`` the text and the current frame."""
        return Observation(text, (self._frame(),)) if self.render_mode == "rgb_array" else text

    def _reset_info(self) -> dict[str, Any]:
        """Extra keys for the info dict returned by ``reset`` (e.g. the optimal solution length)."""
        return {}

    def _metrics(self) -> dict[str, float]:
        """Per-env metrics merged into ``info["metrics"]`` (e.g. ``boxes_on_target``)."""
        return {}

    # ----------------------------------------------------------------- gymnasium API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str | Observation, dict[str, Any]]:
        """Start a new episode; the same ``seed`` (and config) always gives the same start state.

        Returns:
            observation: the start state as text (an :class:`Observation` with its frame for
                ``render_mode="rgb_array"``).
            info: ``env_instruction``, ``message_role``, ``success`` (False) and ``metrics``.
        """
        super().reset(seed=seed)
        self._num_steps = 0
        self._invalid_actions = 0
        self._success = False
        self._episode_over = False
        observation = self._reset(self.np_random, dict(options or {}))
        info = {
            **self._reset_info(),
            "env_instruction": self.instruction(),
            "message_role": self.message_role,
            "success": False,
            "metrics": self._all_metrics(),
        }
        return self._shown(observation), info

    def step(self, action: str) -> tuple[str | Observation, SupportsFloat, bool, bool, dict[str, Any]]:
        """Parse ``action`` (raw model text) and advance the env by one action.

        Returns:
            observation (str | Observation): the state after the action (unchanged after an invalid action); an
                :class:`Observation` with the frame for ``render_mode="rgb_array"``.
            reward (float): the env's reward, or ``format_penalty`` for an invalid action.
            terminated (bool): the episode ended inside the task (goal, failure, final answer).
            truncated (bool): ``max_steps`` actions were used without termination.
            info (dict): ``action_is_valid``, ``success``, ``parsed_action``, ``metrics``,
                ``message_role`` and any subclass keys.

        Raises:
            RuntimeError: the episode is over (or never started); call ``reset()`` first.
        """
        if self._episode_over:
            raise RuntimeError(
                f"{type(self).__name__}.step() called on a finished or unstarted episode; call reset() first."
            )
        self._num_steps += 1
        parsed = self.parser.parse(action)
        canonical = None if parsed is None else self._canonical_action(parsed)
        extra: dict[str, Any] = {}
        if canonical is None:
            self._invalid_actions += 1
            observation, reward, terminated = self._observation(), self.format_penalty, False
        else:
            result = self._apply(canonical)
            observation, reward, terminated = result.observation, float(result.reward), bool(result.terminated)
            self._success = self._success or bool(result.success)
            extra = dict(result.info or {})
        out_of_steps = not terminated and self._num_steps >= self.max_steps
        terminated = terminated or (out_of_steps and self.max_steps_terminates)
        truncated = out_of_steps and not self.max_steps_terminates
        self._episode_over = terminated or truncated
        info = {
            **extra,
            "action_is_valid": canonical is not None,
            "success": self._success,
            "parsed_action": parsed,
            "metrics": self._all_metrics(),
            "message_role": self.message_role,
        }
        return self._shown(observation), reward, terminated, truncated, info

    def render(self) -> str | np.ndarray | None:
        """Render per ``render_mode``: ``"ansi"`` returns the text state, ``"rgb_array"`` the frame (H x W x 3
        uint8); ``None`` renders nothing."""
        if self.render_mode is None:
            gymnasium.logger.warn(
                f"{type(self).__name__}.render() called without a render_mode; pass render_mode='ansi'."
            )
            return None
        if self.render_mode == "ansi":
            return self._observation()
        if self.render_mode == "rgb_array":
            return self._frame()
        raise NotImplementedError(f"render_mode={self.render_mode!r} is not implemented by {type(self).__name__}.")

    def solution(self) -> list[str] | None:
        """Canonical actions that solve the task from the current state (for demonstrations).

        Envs with a solver override this (Sokoban, FrozenLake, Countdown); ``None`` means unsolvable.

        Raises:
            NotImplementedError: this env has no solver.
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no solver; solution() is available for "
            "envs that ship one (sokoban, frozen_lake, countdown)."
        )

    # ----------------------------------------------------------------- helpers
    @property
    def num_steps(self) -> int:
        """Actions taken in the current episode (valid or not)."""
        return self._num_steps

    def _all_metrics(self) -> dict[str, float]:
        metrics = {"num_steps": float(self._num_steps), "invalid_actions": float(self._invalid_actions)}
        metrics.update({k: float(v) for k, v in self._metrics().items()})
        return metrics
