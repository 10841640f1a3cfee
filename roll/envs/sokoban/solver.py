"""Optimal Sokoban solver: A* over (player, boxes) states, counting every move as 1.

The heuristic is the sum, over boxes, of the fewest pushes that bring the box to its nearest target
(ignoring the player and other boxes). Each move pushes at most one box by one cell, so the
heuristic never overestimates and changes by at most 1 per move (consistent): A* returns a shortest
plan. Cells from which a box can never reach a target ("dead squares") are pruned.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

import numpy as np

from roll.envs.sokoban.room import MOVES, Room

_INF = 1 << 30


def _push_distances(free: list[bool], targets: list[int], width: int) -> list[int]:
    """Fewest pushes from each cell to the nearest target (``_INF`` for dead squares).

    A box at ``x`` can be pushed to ``x + d`` when ``x - d`` (the player) and ``x + d`` are free;
    so, searching backwards from targets, a box at ``y`` came from ``x = y - d`` if ``x`` and
    ``x - d`` are free.
    """
    dist = [_INF] * len(free)
    queue = deque(targets)
    for t in targets:
        dist[t] = 0
    while queue:
        y = queue.popleft()
        for d in (-width, width, -1, 1):
            x = y - d
            if free[x] and free[x - d] and dist[x] == _INF:
                dist[x] = dist[y] + 1
                queue.append(x)
    return dist


def solve(room: Room, max_states: int = 2_000_000) -> list[str] | None:
    """Return a shortest list of move words that solves ``room``, or ``None``.

    Args:
        room: the state to solve from (not modified).
        max_states: give up (return ``None``) after expanding this many states.

    Returns:
        ``[]`` if already solved, a shortest plan such as ``["Up", "Left"]``, or ``None`` if the
        room is unsolvable (or the search gave up).
    """
    walls = np.pad(room.walls, 1, constant_values=True)  # guard ring: neighbours never leave the grid
    width = walls.shape[1]
    free = (~walls.ravel()).tolist()

    def index(cell: tuple[int, int]) -> int:
        return (cell[0] + 1) * width + cell[1] + 1

    targets = sorted(index(t) for t in room.targets)
    push_dist = _push_distances(free, targets, width)
    boxes = tuple(sorted(index(b) for b in room.boxes))
    if any(push_dist[b] >= _INF for b in boxes):
        return None
    goal = tuple(targets)
    deltas = [(word, dr * width + dc) for word, (dr, dc) in MOVES.items()]

    start = (index(room.player), boxes)
    parents: dict[tuple[int, tuple[int, ...]], tuple[tuple[int, tuple[int, ...]], str] | None] = {start: None}
    best_g = {start: 0}
    counter = itertools.count()
    # Entries: (f = g + h, -g, tie counter, state); on equal f, deeper states first.
    heap = [(sum(push_dist[b] for b in boxes), 0, next(counter), start)]
    expanded = 0
    while heap:
        _, neg_g, _, state = heapq.heappop(heap)
        g = -neg_g
        if g > best_g[state]:
            continue
        player, boxes = state
        if boxes == goal:
            return _plan(parents, state)
        expanded += 1
        if expanded > max_states:
            return None
        for word, d in deltas:
            nxt = player + d
            if not free[nxt]:
                continue
            new_boxes = boxes
            if nxt in boxes:
                beyond = nxt + d
                if not free[beyond] or beyond in boxes or push_dist[beyond] >= _INF:
                    continue
                new_boxes = tuple(sorted(beyond if b == nxt else b for b in boxes))
            child = (nxt, new_boxes)
            if g + 1 < best_g.get(child, _INF):
                best_g[child] = g + 1
                parents[child] = (state, word)
                h = sum(push_dist[b] for b in new_boxes)
                heapq.heappush(heap, (g + 1 + h, -(g + 1), next(counter), child))
    return None


def _plan(parents: dict, state: tuple) -> list[str]:
    words = []
    while parents[state] is not None:
        state, word = parents[state]
        words.append(word)
    return words[::-1]
