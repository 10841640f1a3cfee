"""The ``roll`` command line: ``roll <command> [args]``.

Subcommands register themselves with :func:`command`; ``roll --help`` lists them. Today: ``doctor``, ``view`` and
``merge-lora``.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Sequence

AddArguments = Callable[[argparse.ArgumentParser], None]
Handler = Callable[[argparse.Namespace], int]


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: its name, one-line help, how to declare its arguments, and the handler returning an exit code."""

    name: str
    help: str
    add_arguments: AddArguments
    handler: Handler


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, add_arguments: AddArguments) -> Callable[[Handler], Handler]:
    """Decorator registering ``handler`` as subcommand ``name``; a duplicate name raises ``ValueError``."""

    def register(handler: Handler) -> Handler:
        if name in COMMANDS:
            raise ValueError(
                f"roll subcommand {name!r} is already registered (by "
                f"{COMMANDS[name].handler.__module__}); pick another name"
            )
        COMMANDS[name] = Command(name, help, add_arguments, handler)
        return handler

    return register


def _doctor_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``roll doctor`` (defined in :mod:`roll.launch.doctor`)."""
    from roll.launch import doctor

    doctor.add_arguments(parser)


@command(
    "doctor",
    help="check that this machine can run roll (and a config: --config-name X)",
    add_arguments=_doctor_arguments,
)
def _doctor(args: argparse.Namespace) -> int:
    """Run ``roll doctor``."""
    from roll.launch import doctor

    return doctor.run(args)


def _view_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``roll view`` (defined in :mod:`roll.tracking.viewer.build`)."""
    from roll.tracking.viewer import build

    build.add_arguments(parser)


@command(
    "view",
    help="build the trajectory viewer of a run (a static HTML folder; opens from disk)",
    add_arguments=_view_arguments,
)
def _view(args: argparse.Namespace) -> int:
    """Run ``roll view``."""
    from roll.tracking.viewer import build

    return build.run(args)


def _merge_lora_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``roll merge-lora``."""
    parser.add_argument("adapter_dir", help="a peft adapter directory (a LoRA run's output_dir/final)")
    parser.add_argument("--out", required=True, help="where to write the merged Hugging Face model")
    parser.add_argument(
        "--base", default=None, help="the base model (default: base_model_name_or_path of adapter_config.json)"
    )


@command(
    "merge-lora",
    help="merge a LoRA adapter into its base model: a plain Hugging Face model that loads without peft",
    add_arguments=_merge_lora_arguments,
)
def _merge_lora(args: argparse.Namespace) -> int:
    """Run ``roll merge-lora`` (:func:`roll.models.lora.merge_adapter_dir`)."""
    import sys

    from roll.models.lora import merge_adapter_dir

    try:
        out = merge_adapter_dir(args.adapter_dir, args.out, args.base)
    except (FileNotFoundError, ValueError) as exc:
        print(f"roll merge-lora: {exc}", file=sys.stderr)
        return 2
    print(f"[roll] merged {args.adapter_dir} into a plain model at {out}", flush=True)
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``roll`` parser with one subparser per registered command."""
    parser = argparse.ArgumentParser(prog="roll", description="RL for LLMs in multi-turn agentic environments.")
    subparsers = parser.add_subparsers(dest="command", metavar="command", required=True)
    for cmd in COMMANDS.values():
        sub = subparsers.add_parser(cmd.name, help=cmd.help, description=cmd.help)
        cmd.add_arguments(sub)
        sub.set_defaults(handler=cmd.handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``roll`` console script and ``python -m roll``; returns the exit code."""
    args = build_parser().parse_args(argv)
    return args.handler(args)
