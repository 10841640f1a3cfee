"""``max_steps: 0`` is a run of the warm start and one validation only; a negative count is a config error."""

from __future__ import annotations

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.errors import ConfigError
from roll.config.loader import load_config


def test_max_steps_zero_is_accepted():
    cfg = load_config("sokoban_tiny", None, ["max_steps=0"], schema=AgenticConfig)
    assert cfg.max_steps == 0


def test_negative_max_steps_names_the_key():
    with pytest.raises(ConfigError, match=r"max_steps=-1: must be >= 0"):
        load_config("sokoban_tiny", None, ["max_steps=-1"], schema=AgenticConfig)
