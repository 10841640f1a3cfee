"""Every Python code block in docs/ (but the generated API signatures) runs: each in a fresh interpreter
(registries start empty), from a scratch directory, with the repository on the import path (``examples.*``
modules import as from a launch there)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def snippets() -> list[tuple[str, str]]:
    """``(id, code)`` of every fenced Python block of docs/ (the API pages' signatures excepted: generated from the
    code, they are signatures, not programs); id = ``file:line``."""
    found = []
    for path in sorted(p for p in REPO.glob("docs/**/*.md") if "api" not in p.relative_to(REPO / "docs").parts):
        text = path.read_text()
        for match in BLOCK.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append((f"{path.relative_to(REPO)}:{line}", match.group(1)))
    return found


def test_there_are_snippets():
    assert len(snippets()) >= 10


@pytest.mark.parametrize("where, code", snippets(), ids=[w for w, _ in snippets()])
def test_snippet_runs(where, code, tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "SDL_VIDEODRIVER": "dummy",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"{where}:\n{proc.stderr[-3000:]}"
