"""Command-line entry shared by the start scripts: parse ROLL/Hydra-style arguments, load, validate, run.

Accepts ``--config-name``/``--config_name``, ``--config-path``/``--config_path`` and ``key=value`` overrides.
A bad config prints one line naming the key and exits with code 2, before any worker starts.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Callable, Sequence

from roll.config.errors import ConfigError


def parse_args(argv: Sequence[str] | None, default_config: str) -> argparse.Namespace:
    """``--config-name``, ``--config-path`` (either spelling) and the remaining ``key=value`` overrides."""
    parser = argparse.ArgumentParser(description="Run a roll pipeline from a YAML config.")
    parser.add_argument("--config-name", "--config_name", dest="config_name", default=default_config,
                        help="config file name in the config path (without .yaml)")
    parser.add_argument("--config-path", "--config_path", dest="config_path", default=None,
                        help="config directory (default: examples/config)")
    parser.add_argument("overrides", nargs="*", help="Hydra-style overrides, e.g. max_steps=3")
    args = parser.parse_args(argv)
    for ov in args.overrides:
        if "=" not in ov:
            parser.error(f"override {ov!r} is not key=value")
    return args


def run_pipeline(argv: Sequence[str] | None, schema: type, pipeline_factory: Callable, default_config: str) -> int:
    """Load ``schema`` from the command line and run the pipeline; exit code 2 on a config error."""
    from roll.config.loader import apply_system_envs, load_config

    args = parse_args(argv, default_config)
    if os.getcwd() not in sys.path:  # user modules (custom envs, rewards) import from the launch directory
        sys.path.insert(0, os.getcwd())
    try:
        cfg = load_config(args.config_name, args.config_path, args.overrides, schema=schema)
    except ConfigError as exc:
        print(f"roll: config error: {exc}", file=sys.stderr)
        return 2
    apply_system_envs(cfg.system_envs)
    pipeline_factory(cfg).run()
    return 0
