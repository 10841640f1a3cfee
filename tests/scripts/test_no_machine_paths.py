"""No tracked file names an absolute path of the machine it was made on: the shared folder is ``../shared``, outputs
and recorded run folders are repository-relative (``output/...``).

Checked in every tracked text file (this one excepted): no path under a checkout or home folder (``/work/``,
``/root/``, ``/home/``; a path inside another one, such as ``/proc/self/root/``, is not one). ``/tmp/`` only in the
documented scratch locations of :data:`SCRATCH`, or in one of :data:`VALUES` (``/dev/shm`` is never flagged).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HOME_OR_CHECKOUT = re.compile(r"(?<![\w.~/-])/(?:work|root|home)/")
TMP = re.compile(r"(?<![\w.~/-])/tmp/[^\s\"'`)\]},;]*")
#: ``/tmp`` folders that are scratch by design, and where they are documented.
SCRATCH = {
    "/tmp/roll-": "scratch folders named for roll: the GPU machine's model (scripts/build_qwen05b_rand.py), the GPU "
    "scripts' OUT and WORK defaults (their headers, scripts/smoke_mode.sh), example commands (docs/verified.md)",
    "/tmp/site": "the lent GPU machine's unpacked bundles (../shared/device/README.md, scripts/vs_verl_gpu.sh)",
}
#: ``/tmp`` paths that are config values a test passes through (never created) or a how-to's scratch checkout.
VALUES = {
    ("tests/config/test_guide_keys.py", "/tmp/render"),
    ("tests/config/test_guide_keys.py", "/tmp/tb"),
    ("tests/config/test_value_checks.py", "/tmp/frames"),
    ("tests/pipelines/test_async_k0_unchanged.py", "/tmp/f07da49"),
    ("tests/pipelines/test_async_k0_unchanged.py", "/tmp/f07da49/roll/models/prefix_sharing.py"),
}


def machine_paths(path: str, text: str) -> list[str]:
    """``line: path`` for every absolute path of a machine in ``text`` (the rules of the module docstring)."""
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        found += [f"{number}: {m.group(0)}" for m in HOME_OR_CHECKOUT.finditer(line)]
        found += [
            f"{number}: {m.group(0)}"
            for m in TMP.finditer(line)
            if not m.group(0).startswith(tuple(SCRATCH)) and (path, m.group(0)) not in VALUES
        ]
    return found


def tracked_files() -> list[str]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files are unknown")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    return [p for p in out.decode().split("\0") if p]


def test_rules_by_example():
    assert machine_paths("x.md", "see /work/shared/device/README.md") == ["1: /work/"]
    assert machine_paths("x.json", '"final": "/root/out"\n"x": "/home/me/out"') == ["1: /root/", "2: /home/"]
    assert machine_paths("x.md", "`/tmp/al` and /tmp/w/rlvr") == ["1: /tmp/al", "1: /tmp/w/rlvr"]
    ok = "../shared/device, output/vs_trl, /tmp/roll-models/x, /tmp/site/activate.sh, /dev/shm, /proc/self/root/x"
    assert machine_paths("x.md", ok) == []
    assert machine_paths("tests/config/test_value_checks.py", "render_save_dir=/tmp/frames") == []
    assert machine_paths("tests/other.py", "render_save_dir=/tmp/frames") == ["1: /tmp/frames"]


def test_no_tracked_file_names_a_machine_path():
    me = str(Path(__file__).resolve().relative_to(ROOT))
    bad = {}
    for path in tracked_files():
        file = ROOT / path
        if path == me or not file.is_file():
            continue
        data = file.read_bytes()
        if b"\0" in data[:8192]:  # binary
            continue
        found = machine_paths(path, data.decode("utf-8", errors="replace"))
        if found:
            bad[path] = found[:5]
    assert not bad, (
        "absolute paths of a machine (use ../shared, a repository-relative path, or a /tmp/roll-* scratch folder): "
        + "; ".join(f"{p}: {', '.join(lines)}" for p, lines in sorted(bad.items()))
    )
