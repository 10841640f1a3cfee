"""The Sokoban text environment."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from roll.envs.base import TextEnv, Transition
from roll.envs.frames import draw_grid
from roll.envs.registry import register_env
from roll.envs.sokoban.generator import generate_room
from roll.envs.sokoban.room import (
    BOX,
    BOX_ON_TARGET,
    FLOOR,
    MOVES,
    PLAYER,
    PLAYER_ON_TARGET,
    SYMBOLS,
    TARGET,
    WALL,
    Room,
)
from roll.envs.sokoban.solver import solve

#: RGB colour per symbol for ``render_mode="rgb_array"``.
TILE_COLORS: dict[str, tuple[int, int, int]] = {
    "#": (70, 70, 70),
    "_": (225, 225, 210),
    "O": (225, 120, 120),
    "X": (170, 110, 40),
    "*": (80, 170, 80),
    "P": (60, 90, 220),
    "S": (140, 60, 200),
}
#: What a cell's background shows: objects stand on floor, a box or the player on a target stands on the target.
TILE_GROUND: dict[str, str] = {"X": "_", "P": "_", "*": "O", "S": "O"}
TILE_PIXELS = 16


@register_env("sokoban")
class SokobanEnv(TextEnv):
    """Push every box onto a target in a procedurally generated room.

    Action space:
        Model text whose answer is one of ``Up``, ``Down``, ``Left``, ``Right`` (case-insensitive).

    Observation space:
        The room as a text grid, one line per row: ``#`` wall, ``_`` floor, ``O`` target, ``X`` box,
        ``*`` box on target, ``P`` player, ``S`` player on target. ``show_border=False`` drops the
        outer ring (always wall).

    Starting state:
        A room generated from the reset seed by breadth-first reverse play from a solved state
        (see :mod:`roll.envs.sokoban.generator`): every room is solvable in at most
        ``min(search_depth, max_solution_length)`` moves, and no box starts on a target.
        ``reset(options={"room": text})`` plays a given room instead.

    Rewards:
        -0.1 per valid action; +1 when a push puts a box on a target; -1 when a push moves a box off
        a target; +10 when the room is solved. An unparseable or unknown action gets
        ``format_penalty`` instead and changes nothing. Walking into a wall is valid (-0.1).

    Episode end:
        Terminated (``success=True``) when all boxes are on targets; truncated after ``max_steps``
        actions.

    Info:
        The base keys; ``reset`` adds ``optimal_solution_length``; ``metrics`` has ``boxes_on_target``, ``num_boxes``,
        ``num_steps`` and
        ``invalid_actions``.

    Args:
        dim_room: ``(rows, cols)`` including the border wall; each at least 5.
        num_boxes: number of boxes (and targets).
        max_steps: actions per episode.
        search_depth: depth of the reverse-play search, i.e. the longest optimal solution generated.
        max_solution_length: if set, only rooms whose optimal solution has at most this many moves
            (easy curricula).
        show_border: include the outer wall ring in observations.
        grid_lookup: ROLL's cell codes -> the symbols observations use instead of roll's (codes 0 wall, 1 floor,
            2 target, 3 box on target, 4 box, 5 player, 6 player on target), e.g. ``{0: "W", 1: "."}``.
        grid_vocab: symbol -> name for the instruction's legend (with ``grid_lookup``).
        tile_pixels: side of a cell in ``render_mode="rgb_array"`` frames, in pixels (a 6x6 room at 16: 96x96).
        format_penalty, action_format, render_mode: see :class:`~roll.envs.base.TextEnv`; with
            ``render_mode="rgb_array"`` observations are ``Observation(text, (frame,))`` (the whole room, border
            included, one ``tile_pixels`` square per cell).
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["ansi", "rgb_array"], "render_fps": 4}
    valid_actions: ClassVar[tuple[str, ...]] = tuple(MOVES)
    grid_symbols: ClassVar[dict[str, str] | None] = SYMBOLS
    STEP_PENALTY = -0.1
    BOX_ON_TARGET_REWARD = 1.0
    SOLVED_REWARD = 10.0

    def __init__(
        self,
        dim_room: Sequence[int] = (6, 6),
        num_boxes: int = 1,
        max_steps: int = 10,
        search_depth: int = 30,
        max_solution_length: int | None = None,
        show_border: bool = True,
        grid_lookup: dict[int, str] | None = None,
        grid_vocab: dict[str, str] | None = None,
        tile_pixels: int = TILE_PIXELS,
        format_penalty: float = -0.1,
        action_format: str = "answer",
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            max_steps=max_steps, format_penalty=format_penalty, action_format=action_format, render_mode=render_mode
        )
        self.dim_room = tuple(int(d) for d in dim_room)
        if len(self.dim_room) != 2 or min(self.dim_room) < 5:
            raise ValueError(f"dim_room={tuple(dim_room)!r} must be (rows, cols) with both >= 5 (border included).")
        interior = (self.dim_room[0] - 2) * (self.dim_room[1] - 2)
        if not 1 <= num_boxes <= interior // 3:
            raise ValueError(f"num_boxes={num_boxes!r} must be in [1, {interior // 3}] for dim_room={self.dim_room}.")
        if search_depth < 1:
            raise ValueError(f"search_depth={search_depth!r} must be >= 1.")
        if max_solution_length is not None and max_solution_length < 1:
            raise ValueError(f"max_solution_length={max_solution_length!r} must be None or >= 1.")
        if not isinstance(tile_pixels, (int, np.integer)) or isinstance(tile_pixels, bool) or tile_pixels < 1:
            raise ValueError(f"tile_pixels={tile_pixels!r} must be an integer >= 1 (pixels per cell of a frame).")
        self.tile_pixels = int(tile_pixels)
        self.num_boxes = int(num_boxes)
        self.search_depth = int(search_depth)
        self.max_solution_length = max_solution_length
        self.show_border = bool(show_border)
        self.symbols = _symbols(grid_lookup)
        self.legend = dict(grid_vocab) if grid_vocab else {self.symbols[k]: v for k, v in SYMBOLS.items()}
        self.room: Room | None = None
        self.optimal_solution_length: int | None = None

    def instruction(self) -> str:
        """The rules of Sokoban, the symbols and the answer words."""
        legend = ", ".join(f"{s} {name}" for s, name in self.legend.items())
        return (
            "You are solving Sokoban. Push every box onto a target. You can push a box but not pull it, "
            "and you cannot push two boxes or push into a wall. "
            f"Symbols: {legend}. Actions: Up, Down, Left, Right. "
            "Answer with exactly one action, e.g. <answer>Left</answer>."
        )

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> str:
        """Generate a room (or take ``options["room"]``: a text grid or :class:`Room`)."""
        if "room" in options:
            given = options["room"]
            self.room = Room.from_text(given) if isinstance(given, str) else given.copy()
            plan = solve(self.room)
            self.optimal_solution_length = None if plan is None else len(plan)
            return self._observation()
        generated = generate_room(self.dim_room, self.num_boxes, self.search_depth, rng, self.max_solution_length)
        self.room, self.optimal_solution_length = generated.room, generated.solution_length
        return self._observation()

    def _reset_info(self) -> dict[str, Any]:
        return {"optimal_solution_length": self.optimal_solution_length}

    def _apply(self, action: str) -> Transition:
        room = self._require_room()
        before = room.boxes_on_target
        room.move(action)
        after = room.boxes_on_target
        solved = room.solved
        reward = self.STEP_PENALTY + self.BOX_ON_TARGET_REWARD * (after - before)
        if solved:
            reward += self.SOLVED_REWARD
        return Transition(self._observation(), round(reward, 10), solved, success=solved)

    def _observation(self) -> str:
        text = self._require_room().to_text(self.show_border)
        return text if self.symbols == _IDENTITY else "".join(self.symbols.get(ch, ch) for ch in text)

    def _metrics(self) -> dict[str, float]:
        room = self._require_room()
        return {"boxes_on_target": room.boxes_on_target, "num_boxes": len(room.boxes)}

    def _require_room(self) -> Room:
        if self.room is None:
            raise RuntimeError("SokobanEnv has no room yet; call reset() first.")
        return self.room

    def solution(self) -> list[str] | None:
        """A shortest list of action words that solves the room from the current state."""
        return solve(self._require_room())

    def _frame(self) -> np.ndarray:
        """The room (border included) as colored tiles: ``tile_pixels`` per cell, colors :data:`TILE_COLORS`."""
        grid = self._require_room().to_text(show_border=True).splitlines()
        return draw_grid(grid, TILE_COLORS, TILE_GROUND, self.tile_pixels)


#: ROLL's Sokoban cell codes, in order, as roll's symbols.
_ROLL_CODES = (WALL, FLOOR, TARGET, BOX_ON_TARGET, BOX, PLAYER, PLAYER_ON_TARGET)
_IDENTITY = {s: s for s in SYMBOLS}


def _symbols(grid_lookup: dict[int, str] | None) -> dict[str, str]:
    """roll's symbol -> the observation's symbol, from ROLL's ``grid_lookup`` (code -> symbol)."""
    if not grid_lookup:
        return dict(_IDENTITY)
    out = dict(_IDENTITY)
    for code, symbol in grid_lookup.items():
        if int(code) not in range(len(_ROLL_CODES)) or not isinstance(symbol, str) or len(symbol) != 1:
            raise ValueError(f"grid_lookup entry {code!r}: {symbol!r} must map a code 0-6 to one character")
        out[_ROLL_CODES[int(code)]] = symbol
    if len(set(out.values())) != len(out):
        raise ValueError(f"grid_lookup={dict(grid_lookup)!r} gives two cells the same symbol")
    return out
