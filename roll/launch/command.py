"""Command-line entry shared by the start scripts: parse ROLL/Hydra-style arguments, load, validate, run.

Accepts ``--config-name``/``--config_name``, ``--config-path``/``--config_path`` and Hydra's overrides: ``key=value``,
``+key=value`` (add), ``++key=value`` (add or replace) and ``~key`` / ``~key=value`` (delete).
A bad config prints one line naming the key and exits with code 2, before any worker starts; a run that stops
because it cannot usefully go on (:class:`~roll.pipelines.base.RunStopped`) prints one line and exits with code 1.
SIGTERM is handled like Ctrl-C (exit code 130, no traceback, named in the stop line), so a killed run prints how to
resume it, whatever phase it was in.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

from roll.config.errors import ConfigError
from roll.launch.preflight import preflight, visible_gpus


def parse_args(argv: Sequence[str] | None, default_config: str) -> argparse.Namespace:
    """``--config-name``, ``--config-path`` (either spelling) and the remaining ``key=value`` overrides."""
    parser = argparse.ArgumentParser(description="Run a roll pipeline from a YAML config.")
    parser.add_argument(
        "--config-name",
        "--config_name",
        dest="config_name",
        default=default_config,
        help="config file name in the config path (without .yaml)",
    )
    parser.add_argument(
        "--config-path",
        "--config_path",
        dest="config_path",
        default=None,
        help="config directory (default: examples/config)",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides: key=value, +key=value, ++key=value, ~key")
    args = parser.parse_args(argv)
    for ov in args.overrides:
        if "=" not in ov and not ov.startswith("~"):
            parser.error(f"override {ov!r} is not key=value, +key=value, ++key=value or ~key")
    return args


def load_checked(
    config_name: str,
    config_path: str | None = None,
    overrides: Sequence[str] | None = None,
    schema: type | None = None,
    gpus: int | None = None,
) -> Any:
    """:func:`roll.config.loader.load_config` (the config's own rules), then the :func:`preflight` (registries,
    packages, envs, data files; device mappings against ``gpus`` GPUs when given): everything a launch checks
    before any worker starts."""
    from roll.config.loader import load_config

    cfg = load_config(config_name, config_path, list(overrides or []), schema=schema)
    preflight(cfg, gpus)
    return cfg


def run_pipeline(argv: Sequence[str] | None, schema: type, pipeline_factory: Callable, default_config: str) -> int:
    """Load ``schema`` from the command line, run the preflight and the pipeline; exit code 2 on a config error, 1
    when the run stopped for want of a learning signal (``zero_signal_patience``)."""
    from roll.config.loader import apply_system_envs

    args = parse_args(argv, default_config)
    _drop_script_dir()
    if os.getcwd() not in sys.path:  # user modules (custom envs, rewards) import from the launch directory
        sys.path.insert(0, os.getcwd())
    try:
        cfg = load_checked(args.config_name, args.config_path, args.overrides, schema=schema, gpus=visible_gpus())
    except ConfigError as exc:
        print(f"roll: config error: {exc}", file=sys.stderr)
        return 2
    apply_system_envs(cfg.system_envs)
    from roll.errors import RunStopped

    previous = signal.signal(signal.SIGTERM, _interrupt)  # a kill stops the run like Ctrl-C: the resume line is printed
    try:
        pipeline_factory(cfg).run()
    except RunStopped as exc:
        print(f"roll: run stopped: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the pipeline printed where it stopped and how to resume
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0


def _drop_script_dir() -> None:
    """Python puts a script's own folder first on ``sys.path``; the start scripts' folder (``examples/``) holds
    packages named like installed ones (``examples/agents`` would hide the OpenAI Agents SDK, ``agents``), so it is
    not an import root: user modules import from the launch directory (and ``PYTHONPATH``)."""
    script = os.path.dirname(os.path.abspath(sys.argv[0])) if sys.argv and sys.argv[0] else ""
    if script and script != os.getcwd() and sys.path and os.path.abspath(sys.path[0] or ".") == script:
        sys.path.pop(0)


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)  # the stop line names it: "stopped by SIGTERM"
