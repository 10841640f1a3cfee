"""Logs of a resumed run hold each step once: per-step dump files and step-keyed JSONL logs cut back to a step.

A run killed after its step-30 checkpoint may have logged steps 31-35; the resumed run replays them from step 31.
:meth:`roll.tracking.base.Tracker.rewind` drops the logged records of steps after 30 (``metrics.jsonl``,
``texts.jsonl`` through :func:`truncate_jsonl`; TensorBoard purges its events), and :func:`prune_step_dumps` removes
the per-step dump files of those steps, so that every log holds each step exactly once.

Per-step dumps are :mod:`roll.tracking.dumps`' ``<log_dir>/trajectories/<phase>/step_<NNNNN>.jsonl`` (phases
``train`` and ``val``) and the validation renders ``<render_save_dir>/step_<NNNNN>/``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Iterable
from pathlib import Path

from roll.tracking.dumps import DUMP_DIR, PHASES

_STEP_NAME = re.compile(r"^step_(\d+)(?:\.jsonl)?$")


def truncate_jsonl(path: str | Path, last_step: int) -> int:
    """Keep the records of ``path`` (JSON objects with a ``step``) whose step is <= ``last_step``; the file is
    replaced atomically. A torn last line (the writer was killed mid-write) is dropped too. Returns the number of
    lines dropped (0 when the file does not exist)."""
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > last_step:
            dropped += 1
        else:
            kept.append(line)
    if dropped:
        tmp = path.with_name(f".{path.name}.rewind")
        tmp.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped


def prune_step_dumps(log_dir: str | Path, last_step: int, render_dirs: Iterable[str | Path] = ()) -> list[Path]:
    """Remove the per-step dumps of steps after ``last_step``: ``<log_dir>/trajectories/<phase>/step_N.jsonl``
    and ``<render_dir>/step_N/`` of each of ``render_dirs``. Returns what was removed."""
    removed = []
    roots = [Path(log_dir) / DUMP_DIR / phase for phase in PHASES] + [Path(d) for d in render_dirs]
    for root in roots:
        if not root.is_dir():
            continue
        for entry in sorted(root.iterdir()):
            match = _STEP_NAME.match(entry.name)
            if not match or int(match.group(1)) <= last_step:
                continue
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed.append(entry)
    return removed
