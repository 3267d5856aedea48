"""Options several ``modtrace`` commands share, and how their values are read.

Imports of the library stay inside the functions that read values, so that
building the parser loads nothing more than ``argparse``.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..attribution import AttributionConfig
    from ..cost import Rate

__all__ = [
    "add_counting_options",
    "add_outlier_band",
    "add_rate_options",
    "attribution_config",
    "parse_headers",
    "parse_pairs",
    "rate_of",
]


# --- Adding options --------------------------------------------------------------------------
def add_rate_options(p: argparse.ArgumentParser, help_: str) -> None:
    """``--usd-per-gpu-hour USD`` (help ``help_``) and ``--rate-id``; read with :func:`rate_of`."""
    p.add_argument("--usd-per-gpu-hour", type=float, metavar="USD", help=help_)
    p.add_argument("--rate-id", default="cli", help="id recorded with the rate (default: cli)")


def add_outlier_band(p: argparse.ArgumentParser) -> None:
    """``--outlier-band LOW HIGH``; read with :func:`attribution_config`."""
    p.add_argument(
        "--outlier-band",
        nargs=2,
        type=float,
        default=(0.5, 2.0),
        metavar=("LOW", "HIGH"),
        help="flag a reconciliation factor outside [LOW, HIGH] (default: 0.5 2.0)",
    )


def add_counting_options(p: argparse.ArgumentParser, set_help: str) -> None:
    """``--set KEY=VALUE`` (help ``set_help``) and ``--config FILE``: counting overrides.

    Read with :func:`modtrace.cli.count.build_config`.
    """
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        dest="settings",
        help=set_help,
    )
    p.add_argument("--config", metavar="FILE", help="a counting configuration JSON file")


# --- Reading values --------------------------------------------------------------------------
def rate_of(args: argparse.Namespace) -> Rate | None:
    """The hypothetical rate of ``--usd-per-gpu-hour`` and ``--rate-id``, or ``None``."""
    from ..cost import Rate

    if args.usd_per_gpu_hour is None:
        return None
    return Rate(usd_per_gpu_hour=args.usd_per_gpu_hour, id=args.rate_id)


def attribution_config(args: argparse.Namespace) -> AttributionConfig:
    """The allocation key's knobs from ``--outlier-band``."""
    from ..attribution import AttributionConfig

    return AttributionConfig(outlier_band=tuple(args.outlier_band))


def parse_pairs(pairs: list[str], option: str) -> dict[str, float]:
    """Parse repeated ``NAME=NUMBER`` options into a dict, with a clear error."""
    out: dict[str, float] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            msg = f"{option} {pair!r}: expected NAME=NUMBER"
            raise ValueError(msg)
        try:
            out[name.strip()] = float(value)
        except ValueError:
            msg = f"{option} {name}: {value!r} is not a number"
            raise ValueError(msg) from None
    return out


def parse_headers(pairs: list[str], *, echo: bool = True) -> dict[str, str]:
    """Parse repeated ``--header NAME:VALUE`` options into a dict, with a clear error.

    Args:
        pairs: The option values.
        echo: Quote a malformed value in the error; off where a header may
            hold a secret (``Authorization``).
    """
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition(":")
        if not sep or not name.strip():
            msg = (
                f"--header {pair!r}: expected NAME:VALUE"
                if echo
                else "--header: expected NAME:VALUE (a name, a colon, a value)"
            )
            raise ValueError(msg)
        out[name.strip()] = value.strip()
    return out
