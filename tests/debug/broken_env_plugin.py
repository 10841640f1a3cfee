"""Importing this module registers the deliberately broken env and reward (``env_type`` module for Ray actors)."""

from tests.debug.broken_user_code import register

register()
