"""Compose a config with Hydra, type it against a dataclass schema, and validate it.

Steps: Hydra composes the YAML (defaults lists, ``@_here_`` fragments, ``key=value`` overrides); the result is
merged over the schema's defaults and resolved; top-level keys the schema does not know but that other values
reference by interpolation (``${deepspeed_zero2}``, ``${max_actions}``) are YAML variables and are dropped; the rest
is merged into the structured schema, where an unknown key or a wrong type is a :class:`ConfigError`; finally the
dataclass is validated (choices and cross-field rules). Before the merge, ROLL's key names and values become roll's
(:mod:`roll.config.roll_compat`; keys without meaning in roll are named in one warning line).
"""

from __future__ import annotations

import difflib
import functools
import os
import re
import sys
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any, TypeVar

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import MissingConfigException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

from roll.config.errors import ConfigError
from roll.config.roll_compat import is_alias_key, translate, warning_line

T = TypeVar("T")
_REF = re.compile(r"\$\{([A-Za-z_][\w-]*)(?=[.}\[])")
DEFAULT_CONFIG_DIR = Path(__file__).resolve().parents[2] / "examples" / "config"


@functools.cache
def register_schemas() -> None:
    """Register the pipeline schemas with Hydra's ConfigStore (``roll_agentic``, ``roll_rlvr``); once per process,
    the store keeps them."""
    from roll.config.agentic import AgenticConfig

    cs = ConfigStore.instance()
    cs.store(name="roll_agentic", node=AgenticConfig)
    try:
        from roll.config.rlvr import RLVRConfig
    except ImportError:  # the RLVR schema is optional in a partial install
        return
    cs.store(name="roll_rlvr", node=RLVRConfig)


def resolve_config_dir(config_path: str | None) -> Path:
    """A config directory: as given (absolute or relative to the cwd), else under ``examples/``."""
    if not config_path:
        return DEFAULT_CONFIG_DIR
    for base in (Path.cwd(), DEFAULT_CONFIG_DIR.parent, DEFAULT_CONFIG_DIR.parent.parent):
        candidate = (base / config_path).resolve()
        if candidate.is_dir():
            return candidate
    raise ConfigError(
        "--config-path", config_path, f"no such directory (looked in the cwd and {DEFAULT_CONFIG_DIR.parent})"
    )


def is_fragment(path: str | Path) -> bool:
    """Whether a YAML file is a fragment for defaults lists (one top-level block named like the file, e.g.
    ``deepspeed_zero2.yaml`` holding ``deepspeed_zero2:``), not a pipeline config."""
    tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return isinstance(tree, dict) and list(tree) == [Path(path).stem] and isinstance(tree[Path(path).stem], dict)


def _compose(config_dir: Path, config_name: str, overrides: list[str]) -> DictConfig:
    """Hydra's compose of ``config_name``; a config outside ``examples/config`` may also name the shipped configs
    and fragments in its defaults list (they are on the search path after its own folder)."""
    GlobalHydra.instance().clear()
    shipped = [] if config_dir == DEFAULT_CONFIG_DIR else [f"hydra.searchpath=[file://{DEFAULT_CONFIG_DIR}]"]
    with initialize_config_dir(config_dir=str(config_dir), version_base=None), warnings.catch_warnings():
        # ROLL configs list fragments without `_self_`; Hydra then merges the file itself last, which is intended.
        warnings.filterwarnings("ignore", message=".*Defaults list is missing `_self_`")
        try:
            return compose(config_name=config_name, overrides=shipped + overrides)
        except MissingConfigException as exc:
            missing = re.search(r"Could not load '([^']+)'", str(exc))
            if missing is None:
                raise
            shipped_names = sorted(p.stem for p in DEFAULT_CONFIG_DIR.glob("*.yaml"))
            raise ConfigError(
                "defaults",
                missing.group(1),
                f"{config_name}.yaml inherits a config that is neither in "
                f"{config_dir} nor shipped in {DEFAULT_CONFIG_DIR} "
                f"(shipped: {', '.join(shipped_names)})",
            ) from None


def _referenced_roots(node: Any) -> set[str]:
    """First path segments of every ``${...}`` interpolation in a container tree."""
    found: set[str] = set()
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            found.update(_REF.findall(item))
    return found


def _fragment_blocks(config_dir: Path, name: str) -> set[str]:
    """Top-level mapping keys merged in by ``<path>@_here_`` / ``@_global_`` entries of the defaults lists.

    Such a block (``deepspeed_zero3:`` from ``- ../config/deepspeed_zero3@_here_``) is a YAML variable whether or
    not the config references it, as in ROLL's guide, which lists all DeepSpeed fragments and uses one. Entries are
    relative to the directory of the file that lists them, like Hydra's own resolution.
    """
    blocks: set[str] = set()
    todo, seen = [config_dir / f"{name}.yaml"], set()
    while todo:
        path = todo.pop().resolve()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        tree = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        if not isinstance(tree, dict):
            continue
        if path != (config_dir / f"{name}.yaml").resolve():  # ROLL's env files: every top-level key is a variable
            blocks.update(k for k in tree if k != "defaults")
        for entry in tree.get("defaults") or []:
            if isinstance(entry, dict) and len(entry) == 1:
                group, option = next(iter(entry.items()))
                entry = f"{str(group).split('@')[0]}/{option}@{str(group).partition('@')[2]}"
            if not isinstance(entry, str) or "@" not in entry:
                continue
            target, _, package = entry.partition("@")
            if package in ("_here_", "_global_"):
                todo.append(path.parent / f"{target.strip()}.yaml")
    return blocks


@functools.cache
def schema_skeleton(schema: type) -> DictConfig:
    """The schema's defaults with every optional block (``critic: None``) filled with its own defaults, so an
    override like ``critic.world_size=2`` is recognised as a key of the schema (built once per schema, read-only)."""
    node = OmegaConf.structured(_filled(schema))
    OmegaConf.set_readonly(node, True)
    return node


def _filled(cls: type) -> Any:
    import dataclasses
    import typing

    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        inner = [a for a in typing.get_args(hints[f.name]) if dataclasses.is_dataclass(a)]
        default_is_none = f.default is None and f.default_factory is dataclasses.MISSING
        if inner and default_is_none:
            values[f.name] = _filled(inner[0])
    return cls(**values)


def _key_exists(cfg: DictConfig, dotted: str) -> bool:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
    return True


def _prepare_overrides(raw: DictConfig, schema_defaults: DictConfig, overrides: Iterable[str]) -> list[str]:
    """Turn ``key=value`` for a key the YAML lacks but the schema has into Hydra's ``+key=value``."""
    out = []
    for ov in overrides:
        key = ov.split("=", 1)[0]
        if "=" in ov and not key.startswith(("+", "~")) and "@" not in key and "/" not in key:
            if not _key_exists(raw, key):
                if (
                    not _key_exists(schema_defaults, key)
                    and not _under_free_dict(schema_defaults, key)
                    and not is_alias_key(key)
                ):
                    raise _unknown_key(schema_defaults, key)
                ov = "+" + ov
        out.append(ov)
    return out


def _under_free_dict(cfg: DictConfig, dotted: str) -> bool:
    """Whether ``dotted`` lies inside a free-form dict field (e.g. ``strategy_config``, ``custom_envs``)."""
    node: Any = cfg
    for part in dotted.split(".")[:-1]:
        if not isinstance(node, DictConfig) or part not in node:
            return False
        node = node._get_node(part)
        if isinstance(node, DictConfig) and OmegaConf.get_type(node) is dict:
            return True
    return False


def _unknown_key(cfg: DictConfig, dotted: str) -> ConfigError:
    """A ConfigError for an override key the schema does not have, with the allowed keys of its parent."""
    node: Any = cfg
    parts = dotted.split(".")
    for part in parts[:-1]:
        if not isinstance(node, DictConfig) or part not in node:
            break
        node = node._get_node(part)
    allowed = sorted(node.keys()) if isinstance(node, DictConfig) else []
    close = difflib.get_close_matches(parts[-1], allowed, n=1)
    hint = f"did you mean '{close[0]}'? " if close else ""
    return ConfigError(
        dotted,
        "<unknown key>",
        f"not a config key; {_elsewhere(OmegaConf.get_type(cfg), dotted)}{hint}Allowed here: {', '.join(allowed)}",
    )


def _elsewhere(schema: Any, dotted: str) -> str:
    """Where the other pipeline's key ``dotted`` has its equivalent (the schema's ``ELSEWHERE``), or ''."""
    where = getattr(schema, "ELSEWHERE", {}).get(dotted.split(".")[0])
    return f"{where}; " if where else ""


def _one_line(exc: OmegaConfBaseException, schema: type) -> ConfigError:
    key = getattr(exc, "full_key", None) or "?"
    if isinstance(exc, ConfigKeyError):
        parent_type = getattr(exc, "object_type", None) or schema
        allowed = sorted(getattr(parent_type, "__dataclass_fields__", {}).keys())
        leaf = key.rsplit(".", 1)[-1]
        close = difflib.get_close_matches(leaf, allowed, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        if parent_type is schema and _elsewhere(schema, key):
            hint = f"; {_elsewhere(schema, key)[:-2]}."
        return ConfigError(
            key, "<unknown key>", f"not a key of {parent_type.__name__}{hint} Allowed: {', '.join(allowed)}"
        )
    msg = str(exc).splitlines()[0]
    value = getattr(exc, "value", None)
    return ConfigError(key, value if value is not None else "?", msg)


def _drop_nulls(node: dict, defaults: dict) -> None:
    """Remove ``key: null`` where the schema's value is a mapping (ROLL writes ``strategy_config: ~`` for "none"):
    the block keeps its defaults."""
    for key in list(node):
        default = defaults.get(key) if isinstance(defaults, dict) else None
        if node[key] is None and isinstance(default, dict):
            del node[key]
        elif isinstance(node[key], dict) and isinstance(default, dict):
            _drop_nulls(node[key], default)


def load_config(
    config_name: str, config_path: str | None = None, overrides: list[str] | None = None, schema: type[T] | None = None
) -> T:
    """Load ``<config_path>/<config_name>.yaml`` with ``overrides`` into a validated ``schema`` dataclass.

    Only the config's own rules run here; the checks that need registries, packages, envs or data files run in
    the launch's preflight (:func:`roll.launch.command.load_checked`).

    Raises:
        ConfigError: unknown key, wrong type, bad choice or inconsistent sizes (one line, names the key).
    """
    from roll.config.validation import normalize, validate

    if schema is None:
        from roll.config.agentic import AgenticConfig as schema  # type: ignore[no-redef]
    register_schemas()
    config_dir = resolve_config_dir(config_path)
    name = config_name[:-5] if config_name.endswith(".yaml") else config_name
    if not (config_dir / f"{name}.yaml").is_file():
        found = sorted(p.stem for p in config_dir.glob("*.yaml"))
        raise ConfigError("--config-name", config_name, f"no {name}.yaml in {config_dir}; found: {', '.join(found)}")
    if is_fragment(config_dir / f"{name}.yaml"):
        raise ConfigError(
            "--config-name",
            config_name,
            f"{name}.yaml is a fragment for defaults lists (use it as "
            f"`- ../config/{name}@_here_` and `${{{name}}}`), not a "
            f"pipeline config",
        )
    schema_defaults = OmegaConf.structured(schema)
    try:
        raw = _compose(config_dir, name, [])
        raw = _compose(config_dir, name, _prepare_overrides(raw, schema_skeleton(schema), overrides or []))
    except ConfigError:
        raise
    except OmegaConfBaseException as exc:
        raise _one_line(exc, schema) from None
    except Exception as exc:  # Hydra's override / defaults-list errors
        raise ConfigError("overrides", overrides, " ".join(str(exc).split())) from None  # Hydra's hint too
    raw_tree = OmegaConf.to_container(raw, resolve=False)
    candidates = _referenced_roots(raw_tree) | _fragment_blocks(config_dir, name)
    variables = (candidates & set(raw_tree)) - set(schema.__dataclass_fields__)
    try:
        untyped = OmegaConf.merge(OmegaConf.create(OmegaConf.to_container(schema_defaults)), raw)
        resolved = OmegaConf.to_container(untyped, resolve=True)
        for var in variables:
            resolved.pop(var, None)
        ignored = translate(resolved, raw_tree)  # ROLL's key names and values -> roll's (roll.config.roll_compat)
        _drop_nulls(resolved, OmegaConf.to_container(schema_skeleton(schema)))
        typed = OmegaConf.merge(schema_defaults, resolved)
        cfg = OmegaConf.to_object(typed)
    except OmegaConfBaseException as exc:
        raise _one_line(exc, schema) from None
    if ignored:
        print(f"roll: config warning: {warning_line(ignored)}", file=sys.stderr, flush=True)
    normalize(cfg)
    validate(cfg)
    return cfg


def to_dict(cfg: Any) -> dict:
    """A plain nested dict of a config dataclass (for trackers and checkpoints)."""
    return OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True)


def apply_system_envs(envs: dict[str, str]) -> None:
    """Export ``system_envs`` into this process (workers inherit them through Ray's runtime env)."""
    for k, v in envs.items():
        os.environ[str(k)] = str(v)


__all__ = [
    "load_config",
    "is_fragment",
    "register_schemas",
    "resolve_config_dir",
    "to_dict",
    "ConfigError",
    "ValidationError",
]
