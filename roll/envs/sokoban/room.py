"""Sokoban room state and its text form.

Symbols (ASCII only):

====== ===================
symbol meaning
====== ===================
``#``  wall
``_``  floor
``O``  target
``X``  box
``*``  box on a target
``P``  player
``S``  player on a target
====== ===================
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

Cell = tuple[int, int]

WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "*", "P", "S"
SYMBOLS: dict[str, str] = {
    WALL: "wall",
    FLOOR: "floor",
    TARGET: "target",
    BOX: "box",
    BOX_ON_TARGET: "box on target",
    PLAYER: "player",
    PLAYER_ON_TARGET: "player on target",
}
#: Action word -> (row delta, column delta).
MOVES: dict[str, Cell] = {"Up": (-1, 0), "Down": (1, 0), "Left": (0, -1), "Right": (0, 1)}


@dataclass
class Room:
    """A Sokoban room: static walls and targets, moving boxes and player.

    Attributes:
        walls: bool array of shape ``(rows, cols)``, True where a wall is.
        targets: target cells ``(row, col)``; as many as boxes.
        boxes: box cells.
        player: the player's cell.
    """

    walls: np.ndarray
    targets: frozenset[Cell]
    boxes: set[Cell] = field(default_factory=set)
    player: Cell = (0, 0)

    @property
    def shape(self) -> tuple[int, int]:
        """``(rows, cols)`` including the border."""
        return self.walls.shape  # type: ignore[return-value]

    def copy(self) -> Room:
        """A deep copy (walls are shared: they never change)."""
        return Room(self.walls, self.targets, set(self.boxes), self.player)

    def is_free(self, cell: Cell) -> bool:
        """True if ``cell`` is inside the room, not a wall and holds no box."""
        r, c = cell
        rows, cols = self.shape
        return 0 <= r < rows and 0 <= c < cols and not self.walls[r, c] and cell not in self.boxes

    @property
    def boxes_on_target(self) -> int:
        """Number of boxes that sit on a target."""
        return len(self.boxes & self.targets)

    @property
    def solved(self) -> bool:
        """True when every box is on a target."""
        return self.boxes == set(self.targets)

    def move(self, action: str) -> bool:
        """Apply a move word (``Up``/``Down``/``Left``/``Right``); return True if a box was pushed.

        Moving into a wall, or pushing a box into a wall or another box, leaves the room unchanged.
        """
        dr, dc = MOVES[action]
        r, c = self.player
        nxt, beyond = (r + dr, c + dc), (r + 2 * dr, c + 2 * dc)
        if nxt in self.boxes:
            if not self.is_free(beyond):
                return False
            self.boxes.remove(nxt)
            self.boxes.add(beyond)
            self.player = nxt
            return True
        if self.is_free(nxt):
            self.player = nxt
        return False

    def to_text(self, show_border: bool = True) -> str:
        """The grid as text, one line per row (see the module docstring for symbols)."""
        grid = np.where(self.walls, WALL, FLOOR).astype("<U1")
        for cell in self.targets:
            grid[cell] = TARGET
        for cell in self.boxes:
            grid[cell] = BOX_ON_TARGET if cell in self.targets else BOX
        grid[self.player] = PLAYER_ON_TARGET if self.player in self.targets else PLAYER
        if not show_border:
            grid = grid[1:-1, 1:-1]
        return "\n".join("".join(row) for row in grid)

    @classmethod
    def from_text(cls, text: str) -> Room:
        """Parse a grid written with the module's symbols (lines of equal length, one player).

        Raises:
            ValueError: unequal line lengths, an unknown symbol, not exactly one player, or a box
                count different from the target count.
        """
        lines = [line for line in text.strip().splitlines() if line.strip()]
        if len({len(line) for line in lines}) != 1:
            raise ValueError(f"room lines must have equal lengths, got {[len(x) for x in lines]}.")
        walls = np.zeros((len(lines), len(lines[0])), dtype=bool)
        targets, boxes, players = set(), set(), []
        for r, line in enumerate(lines):
            for c, ch in enumerate(line):
                if ch not in SYMBOLS:
                    raise ValueError(f"unknown room symbol {ch!r} at ({r}, {c}); allowed: {''.join(SYMBOLS)}.")
                walls[r, c] = ch == WALL
                if ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
                    targets.add((r, c))
                if ch in (BOX, BOX_ON_TARGET):
                    boxes.add((r, c))
                if ch in (PLAYER, PLAYER_ON_TARGET):
                    players.append((r, c))
        if len(players) != 1:
            raise ValueError(f"a room needs exactly one player (P or S), found {len(players)}.")
        if len(boxes) != len(targets) or not boxes:
            raise ValueError(
                f"a room needs as many boxes as targets (at least one); got {len(boxes)} and {len(targets)}."
            )
        return cls(walls, frozenset(targets), boxes, players[0])
