"""Every shipped example config's ``strategy_config`` blocks parse into their strategy's typed options, also for
the GPU configs whose backends (SGLang, megatron-core) are not installed here: the preflight of a CPU machine stops
at the missing package first, so without this test a GPU config's bad option is found only on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from roll.config.agentic import AgenticConfig
from roll.config.errors import ConfigError
from roll.config.loader import is_fragment
from roll.config.rlvr import RLVRConfig
from roll.config.validation import ROLES
from roll.strategies.registry import strategy_options
from tests.config_cache import cached_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "examples" / "config"
CONFIGS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml") if not is_fragment(p))


@pytest.mark.parametrize("name", CONFIGS)
def test_strategy_options_of_example_config_parse(name):
    cfg = cached_config(name, schema=RLVRConfig if name.startswith("rlvr") else AgenticConfig)
    roles = [r for r in ROLES if getattr(cfg, r, None) is not None]
    assert roles
    for role in roles:
        strategy_options(getattr(cfg, role), f"{role}.strategy_args.strategy_config")


def test_unknown_sglang_key_points_to_engine_args():
    cfg = cached_config("sokoban_qwen05b_sglang", schema=AgenticConfig)
    cfg.actor_infer.strategy_args.strategy_config["cuda_graph_max_bs_decode"] = 512
    with pytest.raises(
        ConfigError,
        match=r"strategy_config\.cuda_graph_max_bs_decode=512: not a key of "
        r"SGLangOptions.*go under actor_infer\.strategy_args\.strategy_config"
        r"\.engine_args",
    ):
        strategy_options(cfg.actor_infer, "actor_infer.strategy_args.strategy_config")
