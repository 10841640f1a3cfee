"""roll: reinforcement learning of large language models in multi-turn, agentic environments."""

__version__ = "0.1.0"
