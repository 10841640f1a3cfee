"""A complete custom env in a few dozen lines: guess a hidden number with higher/lower hints.

Importing this module registers it as ``guess_number``; a config then names it with
``env_type: guess_number`` (or ``env_type: "examples.custom_env.guess_number:guess_number"``,
which imports this module first).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from roll.envs import TextEnv, Transition, register_env


@register_env("guess_number")
class GuessNumberEnv(TextEnv):
    """Find a hidden integer in ``[1, max_number]``; after each wrong guess the env says higher or lower.

    Action space: an answer holding an integer, e.g. ``<answer>8</answer>``.
    Observation space: a hint line, e.g. ``"8 is too low. Guess a number from 1 to 16."``.
    Starting state: the hidden number is drawn uniformly from the reset seed.
    Rewards: 1 for the right number, 0 for a wrong one, ``format_penalty`` for a non-number.
    Episode end: terminated on the right number; truncated after ``max_steps`` guesses.
    Info: the base keys; ``metrics`` has ``distance`` (from the last valid guess).

    Args:
        max_number: largest possible hidden number.
        max_steps, format_penalty, action_format, render_mode: see ``TextEnv``.
    """

    def __init__(self, max_number: int = 16, max_steps: int = 5, **kwargs: Any) -> None:
        super().__init__(max_steps=max_steps, **kwargs)
        self.max_number = max_number
        self.secret, self.last_guess = 0, 0

    def instruction(self) -> str:
        return f"Guess the hidden number from 1 to {self.max_number}. Answer like <answer>8</answer>."

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> str:
        self.secret = int(options.get("secret", rng.integers(1, self.max_number + 1)))
        self.last_guess = 0
        return self._observation()

    def _canonical_action(self, parsed: str) -> str | None:
        text = parsed.strip()
        return text if text.isdigit() and 1 <= int(text) <= self.max_number else None

    def _apply(self, action: str) -> Transition:
        self.last_guess = int(action)
        correct = self.last_guess == self.secret
        return Transition(self._observation(), float(correct), correct, success=correct)

    def _observation(self) -> str:
        prompt = f"Guess a number from 1 to {self.max_number}."
        if self.last_guess == 0:
            return prompt
        if self.last_guess == self.secret:
            return f"{self.last_guess} is correct!"
        hint = "too low" if self.last_guess < self.secret else "too high"
        return f"{self.last_guess} is {hint}. {prompt}"

    def _metrics(self) -> dict[str, float]:
        return {"distance": abs(self.secret - self.last_guess) if self.last_guess else float(self.max_number)}
