"""FrozenLake as a text environment, on Gymnasium's map generator and transition model."""

from __future__ import annotations

from collections import deque
from typing import Any, ClassVar

import numpy as np
from gymnasium.envs.toy_text.frozen_lake import FrozenLakeEnv, generate_random_map

from roll.envs.base import TextEnv, Transition
from roll.envs.frames import draw_grid
from roll.envs.registry import register_env

#: Action words in Gymnasium's order (0 Left, 1 Down, 2 Right, 3 Up).
ACTIONS: tuple[str, ...] = ("Left", "Down", "Right", "Up")
SYMBOLS: dict[str, str] = {
    "P": "player",
    "_": "frozen ice",
    "O": "hole",
    "G": "goal",
    "X": "player fallen into a hole",
    "*": "player on the goal",
}
_TILE_TEXT = {b"S": "_", b"F": "_", b"H": "O", b"G": "G"}
#: RGB color per symbol for ``render_mode="rgb_array"``.
TILE_COLORS: dict[str, tuple[int, int, int]] = {
    "_": (200, 230, 250),
    "O": (20, 40, 110),
    "G": (240, 200, 40),
    "P": (200, 40, 40),
    "X": (200, 40, 40),
    "*": (200, 40, 40),
}
#: A cell's background: the player stands on ice, in a hole or on the goal.
TILE_GROUND: dict[str, str] = {"P": "_", "X": "O", "*": "G"}


@register_env("frozen_lake")
class FrozenLakeTextEnv(TextEnv):
    """Walk from the top-left corner to the goal across a frozen lake without falling into a hole.

    Action space:
        Model text whose answer is one of ``Left``, ``Down``, ``Right``, ``Up`` (case-insensitive).

    Observation space:
        The map as a text grid: ``P`` player, ``_`` frozen ice (the start cell too), ``O`` hole,
        ``G`` goal, ``X`` player in a hole, ``*`` player on the goal.

    Starting state:
        A random ``size`` x ``size`` map from Gymnasium's ``generate_random_map`` (seeded from the
        reset seed): start at the top-left, goal at the bottom-right, each other cell frozen with
        probability ``p``, and always a path from start to goal. The player starts top-left.

    Rewards:
        1 for reaching the goal, 0 otherwise; ``format_penalty`` for an unparseable or unknown
        action (the state does not change). Walking into the edge is valid and changes nothing.

    Episode end:
        Terminated on the goal (``success=True``) or in a hole; truncated after ``max_steps``.

    Transitions:
        Gymnasium's model: with ``is_slippery=True`` the player moves in the intended direction with
        probability 1/3 and to either perpendicular direction with 1/3 each.

    Info:
        The base keys; ``metrics`` has ``distance_to_goal`` (Manhattan) besides ``num_steps`` and
        ``invalid_actions``.

    Args:
        size: side of the square map (>= 2).
        p: probability that a generated cell is frozen (not a hole), in (0, 1].
        is_slippery: use Gymnasium's slippery transition model.
        max_steps: actions per episode.
        tile_pixels: side of a cell in ``render_mode="rgb_array"`` frames, in pixels.
        format_penalty, action_format, render_mode: see :class:`~roll.envs.base.TextEnv`; with
            ``render_mode="rgb_array"`` observations are ``Observation(text, (frame,))``.
    """

    valid_actions: ClassVar[tuple[str, ...]] = ACTIONS
    grid_symbols: ClassVar[dict[str, str] | None] = SYMBOLS

    def __init__(
        self,
        size: int = 4,
        p: float = 0.8,
        is_slippery: bool = False,
        max_steps: int = 20,
        tile_pixels: int = 16,
        format_penalty: float = -0.1,
        action_format: str = "answer",
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            max_steps=max_steps, format_penalty=format_penalty, action_format=action_format, render_mode=render_mode
        )
        if not isinstance(size, (int, np.integer)) or size < 2:
            raise ValueError(f"size={size!r} must be an integer >= 2.")
        if not 0.0 < p <= 1.0:
            raise ValueError(f"p={p!r} (probability of a frozen cell) must be in (0, 1].")
        if not isinstance(tile_pixels, (int, np.integer)) or isinstance(tile_pixels, bool) or tile_pixels < 1:
            raise ValueError(f"tile_pixels={tile_pixels!r} must be an integer >= 1 (pixels per cell of a frame).")
        self.size, self.p, self.is_slippery = int(size), float(p), bool(is_slippery)
        self.tile_pixels = int(tile_pixels)
        self.lake: FrozenLakeEnv | None = None
        self.state = 0

    def instruction(self) -> str:
        """The rules, the symbols and the answer words."""
        legend = ", ".join(f"{s} {name}" for s, name in SYMBOLS.items())
        slip = " The ice is slippery: you may slide sideways instead of moving as intended." if self.is_slippery else ""
        return (
            "You are walking on a frozen lake. Reach the goal G without falling into a hole O."
            + slip
            + f" Symbols: {legend}. Actions: Left, Down, Right, Up. "
            "Answer with exactly one action, e.g. <answer>Down</answer>."
        )

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> str:
        """Generate a map (or use ``options["desc"]``, a list of rows of S/F/H/G)."""
        desc = options.get("desc") or generate_random_map(self.size, self.p, seed=int(rng.integers(2**31)))
        self.lake = FrozenLakeEnv(desc=desc, is_slippery=self.is_slippery)
        self.state = int(np.flatnonzero(self.lake.desc.ravel() == b"S")[0])
        return self._observation()

    def _apply(self, action: str) -> Transition:
        lake = self._require_lake()
        transitions = lake.P[self.state][ACTIONS.index(action)]
        i = int(self.np_random.choice(len(transitions), p=[t[0] for t in transitions])) if len(transitions) > 1 else 0
        _, self.state, reward, terminated = transitions[i]
        success = lake.desc.ravel()[self.state] == b"G"
        return Transition(self._observation(), float(reward), bool(terminated), success=bool(success))

    def _observation(self) -> str:
        lake = self._require_lake()
        grid = [[_TILE_TEXT[bytes(t)] for t in row] for row in lake.desc]
        r, c = divmod(self.state, lake.ncol)
        grid[r][c] = {"O": "X", "G": "*"}.get(grid[r][c], "P")
        return "\n".join("".join(row) for row in grid)

    def _frame(self) -> np.ndarray:
        """The map as colored tiles, ``tile_pixels`` per cell (the player an inset square)."""
        return draw_grid(self._observation().splitlines(), TILE_COLORS, TILE_GROUND, self.tile_pixels)

    def _metrics(self) -> dict[str, float]:
        lake = self._require_lake()
        r, c = divmod(self.state, lake.ncol)
        goal_r, goal_c = divmod(int(np.flatnonzero(lake.desc.ravel() == b"G")[0]), lake.ncol)
        return {"distance_to_goal": abs(goal_r - r) + abs(goal_c - c)}

    def _require_lake(self) -> FrozenLakeEnv:
        if self.lake is None:
            raise RuntimeError("FrozenLakeTextEnv has no map yet; call reset() first.")
        return self.lake

    def solution(self) -> list[str] | None:
        """A shortest list of action words from the current cell to the goal, avoiding holes.

        Breadth-first search on the non-slippery moves; with ``is_slippery=True`` it is the plan
        that would work if the ice did not slip. ``None`` if the goal cannot be reached.
        """
        lake = self._require_lake()
        desc, ncol = lake.desc.ravel(), lake.ncol
        parents: dict[int, tuple[int, str] | None] = {self.state: None}
        queue = deque([self.state])
        while queue:
            s = queue.popleft()
            if desc[s] == b"G":
                plan = []
                while parents[s] is not None:
                    s, word = parents[s]
                    plan.append(word)
                return plan[::-1]
            if desc[s] == b"H":
                continue
            r, c = divmod(s, ncol)
            for word, (dr, dc) in zip(ACTIONS, ((0, -1), (1, 0), (0, 1), (-1, 0))):
                nr, nc = r + dr, c + dc
                if 0 <= nr < lake.nrow and 0 <= nc < ncol and nr * ncol + nc not in parents:
                    parents[nr * ncol + nc] = (s, word)
                    queue.append(nr * ncol + nc)
        return None
