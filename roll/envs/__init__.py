"""Text environments for LLM agents (gymnasium API, text spaces) and their registry.

Importing ``roll.envs`` registers the built-in envs; build one with
``make_env("sokoban", {"dim_room": (6, 6)})`` or ``gymnasium.make("roll/Sokoban-v0")``.
Envs import neither torch nor ray.
"""

# Built-in envs: importing a module registers its env.
# --- envs contributed by other components: add one import line each, below this marker ---
from roll.envs import (  # noqa: E402,F401  (register themselves)
    countdown,
    frozen_lake,
    gsm8k,  # noqa: E402,F401  (registers "gsm8k")
    sokoban,
    tool_use,  # noqa: E402,F401  (registers "tool_use")
)
from roll.envs.base import Observation, TextEnv, Transition
from roll.envs.parsing import ActionParser
from roll.envs.registry import ENVS, get_env_class, list_envs, make_env, register_env

# --- end of contributed envs ---

__all__ = [
    "ENVS",
    "ActionParser",
    "Observation",
    "TextEnv",
    "Transition",
    "get_env_class",
    "list_envs",
    "make_env",
    "register_env",
]
