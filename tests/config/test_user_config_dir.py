"""A config in the user's own folder inherits the shipped configs (and their fragments) by name; a missing parent
is named in one line, and the start script exits with code 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from roll.config.errors import ConfigError
from roll.config.loader import DEFAULT_CONFIG_DIR, load_config

REPO = Path(__file__).resolve().parents[2]


def write(folder: Path, name: str, parent: str) -> None:
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.yaml").write_text(f"defaults:\n  - {parent}\n  - _self_\nexp_name: {name}\nmax_steps: 3\n")


def test_a_user_folder_config_inherits_a_shipped_one(tmp_path):
    write(tmp_path / "mine", "hangman", "sokoban_tiny")
    cfg = load_config("hangman", str(tmp_path / "mine"))
    shipped = load_config("sokoban_tiny")
    assert (cfg.exp_name, cfg.max_steps) == ("hangman", 3)  # the user's own keys win
    assert cfg.custom_envs == shipped.custom_envs and cfg.rollout_batch_size == shipped.rollout_batch_size


def test_a_missing_parent_config_is_named(tmp_path):
    write(tmp_path / "mine", "typo", "sokoban_tinyy")
    with pytest.raises(ConfigError) as info:
        load_config("typo", str(tmp_path / "mine"))
    assert str(info.value).startswith(
        f"defaults='sokoban_tinyy': typo.yaml inherits a config that is neither in "
        f"{tmp_path / 'mine'} nor shipped in {DEFAULT_CONFIG_DIR} (shipped: "
    )
    assert "sokoban_tiny," in str(info.value)
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "examples" / "start_agentic_pipeline.py"),
            "--config-path",
            str(tmp_path / "mine"),
            "--config-name",
            "typo",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [f"roll: config error: {info.value}"]
