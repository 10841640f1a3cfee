"""Sokoban: procedurally generated, always solvable rooms as a text environment."""

from roll.envs.sokoban.env import SokobanEnv
from roll.envs.sokoban.generator import generate_room
from roll.envs.sokoban.room import MOVES, SYMBOLS, Room
from roll.envs.sokoban.solver import solve

__all__ = ["MOVES", "Room", "SYMBOLS", "SokobanEnv", "generate_room", "solve"]
