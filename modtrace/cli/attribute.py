"""``modtrace attribute``: the what-if calculator of the allocation key."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..attribution import Attribution, attribute
from ..calibration import Calibration, load_calibration
from ..cost import Cost, price
from ..report.render import plain_table as table
from ..timers import COMPONENTS, GpuTimers
from ..units import UNIT_NAMES
from ._options import add_outlier_band, add_rate_options, attribution_config, parse_pairs, rate_of

__all__ = ["register", "result_json", "run"]

HELP = "split measured GPU seconds across modalities (what-if calculator)"
EPILOG = f"""\
units:      {", ".join(UNIT_NAMES)}
components: {", ".join(COMPONENTS)}

example (the worked example of the method):
  modtrace attribute --unit text.tokens=600 --unit image.tiles=8 --unit audio.seconds=20 \\
      --weight text.tokens=0.0008 --weight image.tiles=0.012 --weight audio.seconds=0.05 \\
      --measured 1.70 --usd-per-gpu-hour 2.00
"""


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``attribute`` sub-command."""
    p = commands.add_parser(
        "attribute",
        help=HELP,
        description=(
            "Split a request's measured GPU seconds across text, image, audio and video "
            "with the allocation key (component timers first, else calibrated weights), "
            "reconciled to the measured total with one factor, and price it at a "
            "hypothetical rate."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--unit",
        action="append",
        default=[],
        metavar="NAME=COUNT",
        help="a unit count of the request, e.g. image.tiles=8 (repeatable)",
    )
    p.add_argument(
        "--weight",
        action="append",
        default=[],
        metavar="NAME=SECONDS",
        help="GPU seconds per unit, e.g. image.tiles=0.012; overrides --calibration (repeatable)",
    )
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help="a calibration JSON file with versioned weights",
    )
    p.add_argument(
        "--measured",
        type=float,
        metavar="SECONDS",
        help="the measured GPU seconds of the request; without it the estimates are unreconciled",
    )
    p.add_argument(
        "--timer",
        action="append",
        default=[],
        metavar="COMPONENT=SECONDS",
        help="a component timer, e.g. vision_encoder=0.1 (repeatable)",
    )
    add_rate_options(p, "hypothetical price of one GPU hour; omit to skip dollars")
    add_outlier_band(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(run=run)


def _calibration(args: argparse.Namespace) -> Calibration | None:
    base = load_calibration(args.calibration) if args.calibration else None
    weights = parse_pairs(args.weight, "--weight")
    if not weights:
        return base
    if base is None:
        return Calibration.from_weights(weights, version="adhoc")
    # A hand-edited weight makes a new, traceable version of the file's weights.
    data = base.model_dump()
    data["weights"].update(weights)
    data["version"] = f"{base.version}+adhoc"
    return Calibration.model_validate(data)


def result_json(result: Attribution, cost: Cost | None) -> dict[str, Any]:
    """The documented JSON object of ``modtrace attribute --json``."""
    out: dict[str, Any] = {
        "method": result.method,
        "factor": result.factor,
        "predicted_gpu_seconds": result.predicted_gpu_seconds,
        "measured_gpu_seconds": result.measured_gpu_seconds,
        "gpu_seconds": result.gpu_seconds,
        "share": result.share,
        "usd": cost.usd if cost else None,
        "usd_total": cost.usd_total if cost else None,
        "usd_per_gpu_hour": cost.usd_per_gpu_hour if cost else None,
        "rate_id": cost.rate_id if cost else None,
        "hypothetical": True,
        "calibration_version": result.calibration_version,
        "reconciled": result.reconciled,
        "outlier": result.outlier,
        "estimates": result.estimates,
        "components": result.components,
        "unweighted_units": result.unweighted_units,
        "notes": result.notes,
    }
    return out


def run(args: argparse.Namespace) -> int:
    """Run ``modtrace attribute``."""
    units = parse_pairs(args.unit, "--unit")
    components = parse_pairs(args.timer, "--timer")
    for name in components:
        if name not in COMPONENTS:
            msg = f"--timer {name}: unknown component; expected one of {', '.join(COMPONENTS)}"
            raise ValueError(msg)
    timers = GpuTimers(total=args.measured, source="cli", **components)
    result = attribute(units, timers, _calibration(args), config=attribution_config(args))
    rate = rate_of(args)
    cost = price(result.gpu_seconds, rate) if rate is not None else None
    if args.json:
        print(json.dumps(result_json(result, cost), indent=2))
    else:
        print(render(result, cost))
    return 0


def render(result: Attribution, cost: Cost | None) -> str:
    """A readable table of one attribution."""
    rows = []
    for modality, seconds in result.gpu_seconds.items():
        row = [
            modality,
            f"{result.estimates.get(modality, 0.0):.6g}",
            f"{seconds:.6g}",
            f"{result.share[modality]:.1%}",
        ]
        if cost:
            row.append(f"{cost.usd[modality]:.6g}")
        rows.append(row)
    header = ["modality", "estimate s", "attributed s", "share"] + (
        ["usd (hypothetical)"] if cost else []
    )
    measured = "—" if result.measured_gpu_seconds is None else f"{result.measured_gpu_seconds:.6g}"
    lines = [
        table(header, rows),
        "",
        f"method {result.method}   factor {result.factor:.4f}"
        f"{'  (OUTLIER)' if result.outlier else ''}"
        f"   predicted {result.predicted_gpu_seconds:.6g} s"
        f"   measured {measured} s   calibration {result.calibration_version or '—'}",
    ]
    if cost:
        lines.append(
            f"total {cost.usd_total:.6g} USD at a hypothetical {cost.usd_per_gpu_hour:g} USD "
            f"per GPU hour (rate {cost.rate_id})"
        )
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)
