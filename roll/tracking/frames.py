"""The frames of vision-language episodes in trajectory dumps: what the model saw, as PNG files beside the dump.

An episode's turns carry the frames of their observations (``Turn.images``: H x W x 3 uint8 RGB arrays, or PIL
images). :class:`FrameWriter` writes them as optimized PNGs under ``<phase>/step_<step:05d>_frames/<traj id>/``
(``t<turn:02d>_<k>.png``, ``turn`` counted from 1) and returns each turn's ``frames`` entries for the record, within
two bounds (:class:`FrameBudget`, config keys ``trajectory_dump_frames`` and ``trajectory_dump_frame_kib``):

- at most ``max_frames`` frames per episode: when it has more, frames spread evenly over the episode are kept (the
  first and the last always), the others are dropped;
- at most ``max_kib`` KiB per PNG: a larger frame is downscaled (area average, aspect ratio kept) until it fits, and
  dropped when it would need a side under :data:`MIN_FRAME_SIDE` pixels.

A kept frame is ``{"src": <path relative to the dump file's folder>, "width", "height"}`` (the PNG's size), plus
``"source_size": [width, height]`` when it was downscaled; a dropped one is ``{"dropped": <why>, "source_size"}``.
The record counts them in ``frame_counts``: ``{"seen", "kept", "downscaled", "dropped"}``. Episodes without frames
get neither key, so text dumps are unchanged.

This module imports nothing of roll; Pillow and numpy are imported when an episode has frames.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: A frame is dropped rather than downscaled below this many pixels on its shorter side.
MIN_FRAME_SIDE = 8
#: Downscaling attempts per frame before it is dropped (each aims at the budget from the last PNG's size).
MAX_SHRINKS = 8


@dataclass(frozen=True)
class FrameBudget:
    """Bounds on the frames a dump keeps.

    Args:
        max_frames: frames per episode (0: none are kept, all are counted as dropped).
        max_kib: KiB per PNG file; a larger frame is downscaled until it fits.
    """

    max_frames: int
    max_kib: int

    def __post_init__(self) -> None:
        if self.max_frames < 0 or self.max_kib < 1:
            raise ValueError(
                f"FrameBudget(max_frames={self.max_frames}, max_kib={self.max_kib}): max_frames must be >= 0 and "
                f"max_kib >= 1 (trajectory_dump_frames, trajectory_dump_frame_kib)"
            )


def kept_indices(total: int, cap: int) -> list[int]:
    """Which of ``total`` frames to keep under a cap of ``cap``: all when they fit, else ``cap`` spread evenly, the
    first and the last included.

    >>> kept_indices(3, 16), kept_indices(10, 4), kept_indices(10, 1), kept_indices(5, 0)
    ([0, 1, 2], [0, 3, 6, 9], [0], [])
    """
    if total <= cap:
        return list(range(total))
    if cap <= 1:
        return list(range(cap))
    return sorted({round(i * (total - 1) / (cap - 1)) for i in range(cap)})


def to_rgb_image(frame: Any) -> Any:
    """A PIL RGB image of ``frame`` (a PIL image, or an H x W x 3 / H x W / H x W x 4 uint8 array).

    Raises:
        ValueError: ``frame`` is neither (the message names its type, shape and dtype).
    """
    import numpy as np
    from PIL import Image

    if isinstance(frame, Image.Image):
        return frame.convert("RGB")
    array = np.asarray(frame)
    if array.dtype != np.uint8 or not (array.ndim == 2 or (array.ndim == 3 and array.shape[2] in (3, 4))):
        raise ValueError(
            f"a frame must be a PIL image or an H x W x 3 uint8 array, got {type(frame).__name__} "
            f"shape={getattr(array, 'shape', None)} dtype={getattr(array, 'dtype', None)}"
        )
    if min(array.shape[:2]) < 1:
        raise ValueError(f"a frame must have at least one pixel, got shape={array.shape}")
    return Image.fromarray(array).convert("RGB")


def png_within(image: Any, max_bytes: int) -> tuple[bytes, Any] | None:
    """``(PNG bytes, the image encoded)`` of ``image`` or of a downscaled copy, at most ``max_bytes`` long; None when
    even a copy with a shorter side of :data:`MIN_FRAME_SIDE` pixels would not fit."""
    from PIL import Image

    for _ in range(MAX_SHRINKS + 1):
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", optimize=True)
        data = buffer.getvalue()
        if len(data) <= max_bytes:
            return data, image
        factor = min(0.9, 0.95 * (max_bytes / len(data)) ** 0.5)  # PNG size grows about with the area
        size = (int(image.width * factor), int(image.height * factor))
        if min(size) < MIN_FRAME_SIDE:
            return None
        image = image.resize(size, Image.Resampling.BOX)
    return None


class FrameWriter:
    """Writes the frames of one dump file's episodes under ``folder`` (see the module docstring).

    Args:
        folder: ``<phase>/step_<step:05d>_frames``; emptied first, created when the first frame is written.
        budget: the bounds; None keeps no frame (each is counted as dropped).
    """

    def __init__(self, folder: Path, budget: FrameBudget | None):
        self.folder, self.budget = folder, budget
        if folder.is_dir():  # frames of an earlier dump of this step (a resumed run)
            import shutil

            shutil.rmtree(folder)

    def episode(self, traj_id: str, turns: Sequence[Sequence[Any]]) -> tuple[list[list[dict[str, Any]]], dict]:
        """Each turn's ``frames`` entries and the episode's ``frame_counts``, for the frames ``turns[k]`` of each
        turn (empty counts when there is none)."""
        flat = [(k, i, frame) for k, frames in enumerate(turns) for i, frame in enumerate(frames)]
        entries: list[list[dict[str, Any]]] = [[] for _ in turns]
        if not flat:
            return entries, {}
        cap = self.budget.max_frames if self.budget else 0
        keep = set(kept_indices(len(flat), cap))
        counts = {"seen": len(flat), "kept": 0, "downscaled": 0, "dropped": 0}
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", traj_id)
        for n, (k, i, frame) in enumerate(flat):
            entry = self._frame(frame, f"{name}/t{k + 1:02d}_{i}.png", n in keep, cap)
            counts["dropped" if "dropped" in entry else "kept"] += 1
            counts["downscaled"] += "src" in entry and "source_size" in entry
            entries[k].append(entry)
        return entries, counts

    def _frame(self, frame: Any, rel: str, keep: bool, cap: int) -> dict[str, Any]:
        try:
            image = to_rgb_image(frame)
        except ValueError as err:
            return {"dropped": str(err)}
        size = [image.width, image.height]
        if not keep:
            return {
                "dropped": f"over the limit of {cap} frames per episode (trajectory_dump_frames)",
                "source_size": size,
            }
        assert self.budget is not None  # keep is False without a budget
        fitted = png_within(image, self.budget.max_kib * 1024)
        if fitted is None:
            return {
                "dropped": f"over {self.budget.max_kib} KiB even at {MIN_FRAME_SIDE} px (trajectory_dump_frame_kib)",
                "source_size": size,
            }
        data, image = fitted
        path = self.folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        entry: dict[str, Any] = {"src": f"{self.folder.name}/{rel}", "width": image.width, "height": image.height}
        if [image.width, image.height] != size:
            entry["source_size"] = size
        return entry
