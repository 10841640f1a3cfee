"""Every Python code block in docs/ (but the generated API signatures) runs: each in a fresh process that has not
imported roll (registries start empty), from a scratch directory, with the repository on the import path
(``examples.*`` modules import as from a launch there).

One interpreter imports torch (about 1.5 s, which most snippets pay) and forks a child per snippet, which runs it as
``python -c`` would: ``__name__ == "__main__"``, its exit code, stdout and stderr its own."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

# the parent imports torch (never roll), then forks one child per snippet; a child's exit code is the snippet's
RUNNER = r"""
import atexit, json, os, sys, traceback
import torch  # noqa: F401

snippets, results = json.load(open(sys.argv[1])), []
for code, cwd, log in snippets:
    pid = os.fork()
    if pid == 0:
        status = 0
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(cwd)
        sys.argv = ["-c"]
        try:
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        except SystemExit as exc:
            status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            status = 1
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    results.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
with open(sys.argv[2], "w") as f:
    json.dump(results, f)
"""


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


SNIPPETS = snippets()


def test_there_are_snippets():
    assert len(SNIPPETS) >= 10


@pytest.fixture(scope="module")
def exits(tmp_path_factory) -> list[tuple[int, str]]:
    """Each snippet's exit code and output, run by :data:`RUNNER` (each from its own scratch directory)."""
    root = tmp_path_factory.mktemp("snippets")
    runs = []
    for i, (_, code) in enumerate(SNIPPETS):
        (root / str(i)).mkdir()
        runs.append([code, str(root / str(i)), str(root / f"{i}.log")])
    (root / "snippets.json").write_text(json.dumps(runs))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "WANDB_MODE": "offline",
        "SDL_VIDEODRIVER": "dummy",
    }
    proc = subprocess.run(
        [sys.executable, "-c", RUNNER, str(root / "snippets.json"), str(root / "exits.json")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, f"the snippet runner failed:\n{proc.stderr[-3000:]}"
    codes = json.loads((root / "exits.json").read_text())
    return [(code, (root / f"{i}.log").read_text()) for i, code in enumerate(codes)]


@pytest.mark.parametrize("case", range(len(SNIPPETS)), ids=[where for where, _ in SNIPPETS])
def test_snippet_runs(exits, case):
    code, output = exits[case]
    assert code == 0, f"{SNIPPETS[case][0]}:\n{output[-3000:]}"
