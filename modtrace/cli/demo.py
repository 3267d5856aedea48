"""``modtrace demo``: the main job, a simulated week from request to report."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

__all__ = ["register", "run"]


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``demo`` sub-command."""
    p = commands.add_parser(
        "demo",
        help="simulate a week of mixed traffic through modtrace and report it",
        description=(
            "Simulate a week of multimodal traffic that turns image-heavy after a feature "
            "launch mid-week while tokens per request stay flat. Every request is counted, "
            "timed, traced and attributed by the real library path; the spans land in a local "
            "OTLP JSON lines file, then the weekly shares and drift reports are read back from "
            "it. No network, no GPU. Engine timings come from the reference engine when "
            "modtrace[engine] is installed, else from a documented cost model; both are "
            "SIMULATED, and every dollar is hypothetical."
        ),
    )
    p.add_argument(
        "--out",
        default="modtrace-demo",
        metavar="DIR",
        help="output folder (default: modtrace-demo)",
    )
    p.add_argument(
        "--engine",
        choices=("auto", "reference", "model"),
        default="auto",
        help="timings from the reference engine, the cost model, or auto (default)",
    )
    p.add_argument(
        "--requests-per-day",
        type=int,
        default=60,
        metavar="N",
        help="mean requests per simulated day (default: 60)",
    )
    p.add_argument("--seed", type=int, default=7, help="random seed (default: 7)")
    p.add_argument(
        "--usd-per-gpu-hour",
        type=float,
        default=2.0,
        metavar="USD",
        help="hypothetical price of a GPU hour (default: 2.00)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Run ``modtrace demo``."""
    from ..demo import DemoConfig, run_demo

    if args.requests_per_day < 1:
        msg = f"--requests-per-day: must be at least 1, got {args.requests_per_day}"
        raise ValueError(msg)
    config = DemoConfig(
        out=Path(args.out),
        engine=args.engine,
        requests_per_day=args.requests_per_day,
        seed=args.seed,
        usd_per_gpu_hour=args.usd_per_gpu_hour,
    )

    def progress(done: int, total: int) -> None:
        if not args.quiet and (done == total or done % 25 == 0):
            end = "\n" if done == total else ""
            print(f"\rsimulating the week: {done}/{total} requests", end=end, file=sys.stderr)

    started = time.perf_counter()
    result = run_demo(config, progress=progress)
    print(result.summary)
    print()
    print(f"engine timings: {result.engine}; {result.requests} requests; dollars are hypothetical")
    print(f"spans:  {result.spans}")
    print(f"report: {result.report}")
    if result.chart:
        print(f"chart:  {result.chart}")
    else:
        print("chart:  skipped (pip install 'modtrace[plots]' for matplotlib)")
    print(f"done in {time.perf_counter() - started:.1f} s")
    return 0
