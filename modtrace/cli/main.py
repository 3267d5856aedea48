"""Entry point of the ``modtrace`` command: one sub-command per module."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import one_line
from . import attribute, calibrate, count, demo, report

__all__ = ["CliError", "build_parser", "main"]

_COMMANDS = (demo, attribute, count, calibrate, report)


class CliError(Exception):
    """Bad input on the command line: printed as one line, exit status 2."""


def build_parser() -> argparse.ArgumentParser:
    """The full argument parser, one sub-parser per command module."""
    parser = argparse.ArgumentParser(
        prog="modtrace",
        description=(
            "Attribute the GPU seconds of multimodal LLM requests to text, image, "
            "audio and video, and price them hypothetically."
        ),
    )
    parser.add_argument("--version", action="version", version=_version())
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _COMMANDS:
        module.register(commands)
    return parser


def _version() -> str:
    from .._version import __version__

    return f"modtrace {__version__}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``modtrace`` command; return its exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    try:
        return int(args.run(args) or 0)
    except (CliError, ValueError) as exc:
        print(f"modtrace {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # e.g. `modtrace ... | head`
        return 0
