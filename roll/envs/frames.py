"""Frames of grid games: a text grid drawn as colored tiles (numpy only), for ``render_mode="rgb_array"``.

Each cell is a ``tile`` x ``tile`` square: the background color of its ground, and objects (a box, the player) as
an inset square of their own color, so that the frame shows exactly what the text grid shows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

RGB = tuple[int, int, int]


def draw_grid(grid: Sequence[str], colors: Mapping[str, RGB], ground: Mapping[str, str], tile: int) -> np.ndarray:
    """``grid`` (rows of one-character cells) -> an (rows*tile, cols*tile, 3) uint8 RGB image.

    ``colors``: cell symbol -> its color; ``ground``: symbol -> the symbol whose color fills the cell's background
    (the symbol itself where absent). A cell whose ground differs from itself (an object standing on floor) is
    drawn as its ground with an inset square (a quarter of the tile from each side, at least one pixel) of its color.

    >>> draw_grid(["#P"], {"#": (0, 0, 0), "_": (9, 9, 9), "P": (1, 2, 3)}, {"P": "_"}, 4)[:, 4:, 0].tolist()
    [[9, 9, 9, 9], [9, 1, 1, 9], [9, 1, 1, 9], [9, 9, 9, 9]]
    """
    if tile < 1:
        raise ValueError(f"tile={tile!r} pixels per cell must be >= 1.")
    rows, cols = len(grid), max((len(line) for line in grid), default=0)
    image = np.zeros((rows * tile, cols * tile, 3), dtype=np.uint8)
    inset = max(1, tile // 4) if tile >= 3 else 0
    for r, line in enumerate(grid):
        for c, symbol in enumerate(line):
            cell = image[r * tile : (r + 1) * tile, c * tile : (c + 1) * tile]
            base = ground.get(symbol, symbol)
            cell[:] = colors[base]
            if base != symbol:
                cell[inset : tile - inset, inset : tile - inset] = colors[symbol]
    return image
