"""Shared test setup: offline, quiet environment variables and one tiny model per test session."""

from __future__ import annotations

import importlib.util
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
if importlib.util.find_spec("torch") is None or not __import__("torch").cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # on a GPU machine DeepSpeed picks CUDA (GPU-only tests)

TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=512, seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A tiny Qwen2 model + local tokenizer saved as a Hugging Face directory (built once per session)."""
    from roll.models.tiny import build_tiny_model

    return str(build_tiny_model(tmp_path_factory.mktemp("models") / "tiny-qwen2", **TINY))
