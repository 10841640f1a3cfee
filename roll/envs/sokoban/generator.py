"""Procedural Sokoban rooms by reverse play.

1. Carve a connected floor inside a wall border with a random walk.
2. Put the boxes on random targets: a solved room (the player may stand on any other floor cell).
3. Play backwards, breadth-first, up to ``search_depth`` moves: the player walks or *pulls* the box
   behind it, the exact inverse of walking and pushing. A state first reached after ``k`` reverse
   moves can be solved forwards in exactly ``k`` moves and no fewer, so every generated room is
   solvable and its optimal solution length is known.
4. Pick a start uniformly among the states with no box on a target and an optimal solution of at
   most ``max_solution_length`` moves (if given).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roll.envs.sokoban.room import Cell, Room

_DIRS: tuple[Cell, ...] = ((-1, 0), (1, 0), (0, -1), (0, 1))
#: Fraction of the interior the random walk turns into floor.
FLOOR_FRACTION = 0.6
#: Reverse-play states kept per topology before the search stops at the last complete depth.
MAX_REVERSE_STATES = 200_000

State = tuple[int, tuple[int, ...]]  # (player index, sorted box indices) on the flattened grid


@dataclass
class GeneratedRoom:
    """A generated start room and the length of its optimal solution."""

    room: Room
    solution_length: int


def carve_floor(rows: int, cols: int, num_free: int, rng: np.random.Generator) -> np.ndarray:
    """Walls of a ``(rows, cols)`` room whose interior has ``num_free`` connected floor cells."""
    walls = np.ones((rows, cols), dtype=bool)
    cell = (int(rng.integers(1, rows - 1)), int(rng.integers(1, cols - 1)))
    walls[cell] = False
    direction = _DIRS[int(rng.integers(4))]
    while (~walls).sum() < num_free:
        if rng.random() < 0.35:
            direction = _DIRS[int(rng.integers(4))]
        nxt = (cell[0] + direction[0], cell[1] + direction[1])
        if 1 <= nxt[0] < rows - 1 and 1 <= nxt[1] < cols - 1:
            cell = nxt
            walls[cell] = False
        else:
            direction = _DIRS[int(rng.integers(4))]
    return walls


def reverse_distances(walls: np.ndarray, targets: list[int], max_depth: int) -> dict[State, int]:
    """Optimal forward solution length of every state within ``max_depth`` reverse moves.

    Multi-source breadth-first search from all solved states (boxes on ``targets``, player on any
    other floor cell) over reverse moves: walk to a free cell, or walk away from an adjacent box
    and pull it along. Stops early at the last complete depth past ``MAX_REVERSE_STATES``.
    """
    width = walls.shape[1]
    free = (~walls.ravel()).tolist()
    boxes0 = tuple(sorted(targets))
    frontier = [(p, boxes0) for p in range(len(free)) if free[p] and p not in boxes0]
    dist: dict[State, int] = {s: 0 for s in frontier}
    for depth in range(1, max_depth + 1):
        if len(dist) > MAX_REVERSE_STATES:
            break
        nxt_frontier = []
        for player, boxes in frontier:
            for d in (-width, width, -1, 1):
                dest = player + d
                if not free[dest] or dest in boxes:
                    continue
                children = [(dest, boxes)]
                if player - d in boxes:  # pull the box behind the player onto the player's cell
                    children.append((dest, tuple(sorted(player if b == player - d else b for b in boxes))))
                for child in children:
                    if child not in dist:
                        dist[child] = depth
                        nxt_frontier.append(child)
        frontier = nxt_frontier
    return dist


def generate_room(
    dim_room: tuple[int, int],
    num_boxes: int,
    search_depth: int,
    rng: np.random.Generator,
    max_solution_length: int | None = None,
    max_tries: int = 1000,
) -> GeneratedRoom:
    """A solvable room of ``dim_room`` (border included) with ``num_boxes`` boxes, none on a target.

    Raises:
        RuntimeError: no acceptable room after ``max_tries`` topologies.
    """
    rows, cols = dim_room
    interior = (rows - 2) * (cols - 2)
    num_free = min(interior, max(2 * num_boxes + 3, round(FLOOR_FRACTION * interior)))
    limit = search_depth if max_solution_length is None else min(search_depth, max_solution_length)
    for _ in range(max_tries):
        walls = carve_floor(rows, cols, num_free, rng)
        floor = np.flatnonzero(~walls.ravel())
        targets = sorted(int(t) for t in rng.choice(floor, size=num_boxes, replace=False))
        dist = reverse_distances(walls, targets, limit)
        target_set = set(targets)
        candidates = [s for s, k in dist.items() if k >= 1 and not target_set.intersection(s[1])]
        if not candidates:
            continue
        player, boxes = candidates[int(rng.integers(len(candidates)))]

        def to_cell(i: int) -> Cell:
            return (int(i) // cols, int(i) % cols)

        room = Room(walls, frozenset(map(to_cell, targets)), set(map(to_cell, boxes)), to_cell(player))
        return GeneratedRoom(room, dist[(player, boxes)])
    raise RuntimeError(
        f"could not generate a {tuple(dim_room)} room with {num_boxes} boxes within {limit} moves in {max_tries} "
        "tries; use a larger dim_room, fewer boxes or a larger search_depth / max_solution_length."
    )
