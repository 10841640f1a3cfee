"""The one `Registry` class behind every extension point: entry types, lookup errors, and the four registries of
envs, trackers, tool-use tools and tasks built on it (decorators, duplicates, failed lookups, user modules)."""

from __future__ import annotations

import pytest

from roll.registry import Registry, UnknownNameError


class Base:
    """An entry type."""


class Child(Base):
    """A valid entry."""


def test_failed_lookup_is_a_key_error_and_a_value_error_with_the_message_unquoted():
    reg: Registry[int] = Registry("widget", "register_widget")
    reg.register("a")(1)
    with pytest.raises(UnknownNameError) as info:
        reg.get("b")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert str(info.value) == (
        "unknown widget 'b'; valid names: ['a']. Use one of these, register a new one with "
        "@register_widget('b'), or name it as 'package.module:b'"
    )


def test_base_class_is_checked_before_anything_is_registered():
    reg: Registry[type[Base]] = Registry("widget", "register_widget", base=Base)
    assert reg.register("child")(Child) is Child
    for bad in (int, Child()):
        with pytest.raises(TypeError, match=r"register_widget\('bad'\) needs a Base subclass, got "):
            reg.register("bad")(bad)
    assert reg.names() == ["child"]


def test_how_to_add_names_the_registration_users_write():
    reg: Registry[int] = Registry("widget", "register_widget", how_to_add="a class with name = {name!r}")
    with pytest.raises(KeyError, match="register a new one with a class with name = 'z', or name it as"):
        reg.get("z")


def _registries() -> dict[str, tuple]:
    """kind -> (register(name, entry), lookup(name), list(), unregister(name), a new valid entry) of the env, tracker,
    tool and task registries, through their public functions."""
    from roll.envs import TextEnv, get_env_class, list_envs, register_env
    from roll.envs.registry import unregister_env
    from roll.envs.tool_use import TASKS, TOOLS, Tool, list_tasks, list_tools, make_tool, register_task, register_tool
    from roll.envs.tool_use.tasks import get_task_generator
    from roll.tracking import TRACKERS, StdoutTracker, get_tracker_class, list_trackers, register_tracker

    def env():
        return type("E", (TextEnv,), {})

    def tracker():
        return type("K", (StdoutTracker,), {})

    def tool():
        return type("T", (Tool,), {"name": "reg_test_entry", "run": lambda self, arguments: None})

    def task():
        return lambda rng: None

    return {
        "env": (lambda n, e: register_env(n)(e), get_env_class, list_envs, unregister_env, env),
        "tracker": (
            lambda n, e: register_tracker(n)(e),
            get_tracker_class,
            list_trackers,
            TRACKERS.unregister,
            tracker,
        ),
        "tool": (lambda n, e: register_tool(e), lambda n: type(make_tool(n)), list_tools, TOOLS.unregister, tool),
        "tool_use task": (lambda n, e: register_task(n)(e), get_task_generator, list_tasks, TASKS.unregister, task),
    }


@pytest.mark.parametrize("kind", ["env", "tracker", "tool", "tool_use task"])
def test_each_registry_registers_refuses_duplicates_and_lists_names(kind):
    register, lookup, names, unregister, entry = _registries()[kind]
    first, second = entry(), entry()
    try:
        assert register("reg_test_entry", first) is first
        assert lookup("reg_test_entry") is first and "reg_test_entry" in names()
        with pytest.raises(ValueError, match="'reg_test_entry' is already registered"):
            register("reg_test_entry", second)
        assert lookup("reg_test_entry") is first
        with pytest.raises(ValueError, match=rf"unknown {kind} 'reg_test_missing'; valid names: \[.*'reg_test_entry'"):
            lookup("reg_test_missing")
        with pytest.raises(ImportError, match="cannot import module 'no_such_module_xyz'"):
            lookup("no_such_module_xyz:reg_test_missing")
    finally:
        unregister("reg_test_entry")
    assert "reg_test_entry" not in names()
