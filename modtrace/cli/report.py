"""``modtrace report``: shares, drift, restate, compare and subsidy over finished spans."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ._options import add_outlier_band, add_rate_options, attribution_config, rate_of

if TYPE_CHECKING:
    from ..report import ReadStats, Report, SpanRecord

__all__ = ["register", "run"]

#: Inputs smaller than this get no progress bar unless --progress asks for one.
PROGRESS_MIN_BYTES = 16 * 2**20

HELP = "reports over finished spans: shares, drift, restate, compare, subsidy"
DESCRIPTION = """\
Read finished spans (OTLP JSON lines, as modtrace's file exporter and the
OpenTelemetry collector's file exporter write them; gzip is fine; - is
standard input) and report per modality. Broken lines, spans without modtrace
attributes and mixed calibration versions are counted and reported, never
silently mixed. Dollars are hypothetical.
"""
EPILOG = """\
examples:
  modtrace report shares spans.otlp.jsonl --bucket week --by gen_ai.request.model
  modtrace report shares --clickhouse clickhouse://default:@localhost:8123/otel --bucket day
  modtrace report drift spans.otlp.jsonl --chart drift.png
  modtrace report restate spans.otlp.jsonl --calibration 2026-02.json --usd-per-gpu-hour 2.5
  modtrace report compare spans.otlp.jsonl --a 2026-01-05..2026-01-12 --b 2026-01-12..2026-01-19
  modtrace report subsidy spans.otlp.jsonl --pricing pricing.json --usd-per-gpu-hour 2
"""


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``report`` command and its sub-commands."""
    p = commands.add_parser(
        "report",
        help=HELP,
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(run=lambda args: _help(p))
    reports = p.add_subparsers(dest="report", metavar="REPORT")

    shares = _add(
        reports,
        "shares",
        "GPU seconds, hypothetical USD and share per modality, per day or week",
        "Sum the attribution recorded on each span into GPU seconds, hypothetical dollars and "
        "share per modality, per time bucket, overall or grouped by any span attribute "
        "(model, route, tenant). Rows are split by calibration version. With --clickhouse the "
        "sums run as SQL in ClickHouse on the collector's otel_traces table.",
    )
    _buckets(shares)
    _rate(shares)
    shares.add_argument(
        "--clickhouse",
        metavar="DSN",
        help="run in ClickHouse instead of reading files, e.g. "
        "clickhouse://user:password@host:8123/database (needs clickhouse-connect)",
    )
    shares.add_argument(
        "--table",
        default="otel_traces",
        help="the collector exporter's traces table, NAME or DATABASE.NAME (default: otel_traces)",
    )
    shares.set_defaults(run=_run_shares)

    drift = _add(
        reports,
        "drift",
        "units per request and shares over time, with shifts flagged",
        "Follow units per request (text tokens, vision tokens, audio seconds...), tokens per "
        "request (the blended view), GPU seconds per request and modality shares per bucket, "
        "compare each bucket with a baseline (the first buckets) and flag shifts beyond a "
        "threshold, with the evidence.",
    )
    _buckets(drift, allow_all=False)
    drift.add_argument(
        "--threshold",
        type=float,
        default=0.25,
        help="flag a per-request metric that moves by more than this fraction (default: 0.25)",
    )
    drift.add_argument(
        "--share-threshold",
        type=float,
        default=0.10,
        help="flag a share that moves by more than this many points, as a fraction "
        "(default: 0.10 = 10 points)",
    )
    drift.add_argument(
        "--min-requests",
        type=int,
        default=30,
        help="never flag (nor use as baseline) a bucket with fewer requests (default: 30)",
    )
    drift.add_argument(
        "--baseline-buckets",
        type=int,
        default=1,
        help="how many of the first buckets, pooled, make the baseline (default: 1)",
    )
    drift.add_argument(
        "--fail-on-drift", action="store_true", help="exit with status 1 when a shift is flagged"
    )
    drift.set_defaults(run=_run_drift)

    restate = _add(
        reports,
        "restate",
        "recompute attribution with any calibration and rate, beside the recorded figures",
        "Recompute each span's attribution from its raw counts and timers with a calibration "
        "(and price it at a rate), beside the figures recorded at the time. Without "
        "--calibration only the price is restated; without --usd-per-gpu-hour each span's "
        "recorded rate is kept.",
    )
    _buckets(restate)
    _rate(restate)
    _calibration(restate)
    restate.set_defaults(run=_run_restate)

    compare = _add(
        reports,
        "compare",
        "two windows or two attribute values, modality line by modality line",
        "Compare side A with side B per request, modality line by modality line: GPU seconds, "
        "share, dollars and units. A side is a window START..END (either end may be left "
        "out), KEY=VALUE (a span or resource attribute), or both separated by commas.",
    )
    compare.add_argument("--a", required=True, metavar="SPEC", help="side A (before)")
    compare.add_argument("--b", required=True, metavar="SPEC", help="side B (after)")
    _rate(compare)
    _calibration(compare, "restate both sides with this calibration first")
    compare.set_defaults(run=_run_compare)

    subsidy = _add(
        reports,
        "subsidy",
        "revenue against attributed cost per modality: who subsidises whom",
        "Set the revenue of each request (a price per request, or per tier chosen by a span "
        "attribute) against its attributed cost per modality, per tier and modality mix, and "
        "show who subsidises whom.",
    )
    subsidy.add_argument(
        "--pricing",
        required=True,
        metavar="FILE",
        help='pricing JSON: {"usd_per_request": 0.002} or {"tier_attribute": "app.plan", '
        '"tiers": {"free": 0, "pro": 0.004}}',
    )
    _rate(subsidy, "cost every attributed GPU second at this hypothetical rate")
    subsidy.set_defaults(run=_run_subsidy)


def _add(reports: argparse._SubParsersAction, name: str, help_: str, description: str) -> Any:
    p = reports.add_parser(
        name,
        help=help_,
        description=description + " Dollars are hypothetical.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="OTLP JSON lines span files (gzip is fine; - is standard input)",
    )
    p.add_argument(
        "--format", choices=("table", "json", "csv"), default="table", help="output format"
    )
    p.add_argument("--output", "-o", metavar="PATH", help="write the report here (default: stdout)")
    p.add_argument("--chart", metavar="PNG", help="also draw a chart (needs matplotlib)")
    p.add_argument("--since", metavar="TIME", help="only spans starting at or after (ISO, UTC)")
    p.add_argument("--until", metavar="TIME", help="only spans starting before (ISO, UTC)")
    progress = p.add_mutually_exclusive_group()
    progress.add_argument(
        "--progress",
        dest="progress",
        action="store_true",
        default=None,
        help="show a progress bar on standard error (default: on a terminal, for inputs "
        "of 16 MiB or more)",
    )
    progress.add_argument("--no-progress", dest="progress", action="store_false")
    return p


def _buckets(p: argparse.ArgumentParser, *, allow_all: bool = True) -> None:
    p.add_argument(
        "--bucket",
        choices=("day", "week", "all") if allow_all else ("day", "week"),
        default="day",
        help="time bucket, UTC; weeks start on Monday (default: day)",
    )
    p.add_argument(
        "--by",
        metavar="ATTRIBUTE",
        help="group by a span (else resource) attribute, e.g. gen_ai.request.model",
    )


def _rate(p: argparse.ArgumentParser, help_: str | None = None) -> None:
    add_rate_options(
        p,
        help_
        or "price every GPU second at this hypothetical rate "
        "(default: the dollars recorded on the spans)",
    )


def _calibration(p: argparse.ArgumentParser, help_: str | None = None) -> None:
    p.add_argument(
        "--calibration",
        metavar="FILE",
        help=help_ or "restate with this calibration JSON file (versioned weights)",
    )
    add_outlier_band(p)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


# --- Running ------------------------------------------------------------------------------------
def _files(args: argparse.Namespace) -> list[str]:
    if not args.files:
        msg = "give one or more span files (OTLP JSON lines; - is standard input)"
        raise ValueError(msg)
    return list(args.files)


@contextmanager
def _progress(args: argparse.Namespace, files: list[str]) -> Iterator[Callable[[int], None] | None]:
    """A callback that shows bytes read on standard error, or ``None`` when hidden."""
    sizes = [os.path.getsize(f) for f in files if f != "-" and os.path.isfile(f)]
    total = sum(sizes) if len(sizes) == len(files) else None
    show = args.progress
    if show is None:  # by default, only on a terminal and for inputs that take a while
        show = sys.stderr.isatty() and (total is None or total >= PROGRESS_MIN_BYTES)
    if not show:
        yield None
        return
    try:
        from rich.console import Console
        from rich.progress import Progress
    except ImportError:
        yield from _plain_progress(total)
        return
    with Progress(transient=True, console=Console(file=sys.stderr)) as bar:
        task = bar.add_task("reading spans", total=total)
        yield lambda done: bar.update(task, completed=done)


def _plain_progress(total: int | None) -> Iterator[Callable[[int], None]]:
    """A one-line progress on standard error, rewritten in place."""

    def plain(done: int) -> None:
        read = f"{done / 2**20:,.1f} MiB"
        if total:
            read = f"{done / total:.0%} ({read} of {total / 2**20:,.1f})"
        print(f"\rreading spans: {read}", end="", file=sys.stderr)

    try:
        yield plain
    finally:
        print(file=sys.stderr)


def _read(args: argparse.Namespace, stats: ReadStats) -> Iterator[SpanRecord]:
    from ..report import read_spans

    files = _files(args)
    with _progress(args, files) as progress:
        yield from read_spans(files, stats, progress=progress)


def _window(args: argparse.Namespace) -> Any:
    from ..report import Window

    return Window.parse(args.since, args.until)


def _calibration_of(args: argparse.Namespace) -> Any:
    from ..calibration import load_calibration

    return load_calibration(args.calibration) if args.calibration else None


def _emit(args: argparse.Namespace, report: Report) -> None:
    """Write the report in the asked format, and the chart if asked."""
    from ..report import render, write_chart

    to_terminal = args.output is None and sys.stdout.isatty()
    text = render(report, args.format, use_rich=args.format == "table" and to_terminal)
    if args.output:
        Path(args.output).write_text(text + ("\n" if not text.endswith("\n") else ""))
    else:
        sys.stdout.write(text + ("\n" if not text.endswith("\n") else ""))
    if args.format != "table":
        # Warnings would be lost in a machine format read by a person: repeat them.
        for warning in report.warnings:
            print(f"modtrace report {report.kind}: warning: {warning}", file=sys.stderr)
    if args.chart:
        write_chart(report, args.chart)
        print(f"chart written to {args.chart}", file=sys.stderr)


def _run_shares(args: argparse.Namespace) -> int:
    from ..report import ReadStats, shares_report

    if args.clickhouse:
        if args.files:
            msg = "give span files or --clickhouse, not both"
            raise ValueError(msg)
        from ..report.clickhouse import connect, shares_clickhouse

        report = shares_clickhouse(
            connect(args.clickhouse),
            table=args.table,
            bucket=args.bucket,
            by=args.by,
            rate=rate_of(args),
            window=_window(args),
        )
    else:
        stats = ReadStats()
        report = shares_report(
            _read(args, stats),
            stats,
            bucket=args.bucket,
            by=args.by,
            rate=rate_of(args),
            window=_window(args),
        )
    _emit(args, report)
    return 0


def _run_drift(args: argparse.Namespace) -> int:
    from ..report import DriftConfig, ReadStats, drift_report

    config = DriftConfig(
        threshold=args.threshold,
        share_threshold=args.share_threshold,
        min_requests=args.min_requests,
        baseline_buckets=args.baseline_buckets,
    )
    stats = ReadStats()
    report = drift_report(
        _read(args, stats),
        stats,
        bucket=args.bucket,
        by=args.by,
        config=config,
        window=_window(args),
    )
    _emit(args, report)
    return 1 if args.fail_on_drift and report.extra["drift_detected"] else 0


def _run_restate(args: argparse.Namespace) -> int:
    from ..report import ReadStats, restate_report

    calibration, rate = _calibration_of(args), rate_of(args)
    if calibration is None and rate is None:
        msg = "nothing to restate: give --calibration FILE, --usd-per-gpu-hour USD or both"
        raise ValueError(msg)
    stats = ReadStats()
    report = restate_report(
        _read(args, stats),
        stats,
        calibration=calibration,
        rate=rate,
        bucket=args.bucket,
        by=args.by,
        window=_window(args),
        config=attribution_config(args),
    )
    _emit(args, report)
    return 0


def _run_compare(args: argparse.Namespace) -> int:
    from ..report import ReadStats, Side, compare_report

    a, b = Side.parse(args.a), Side.parse(args.b)
    stats = ReadStats()
    window = _window(args)
    records = _read(args, stats)
    if window.bounded:
        records = (r for r in records if r.start_ns in window)
    report = compare_report(
        records,
        stats,
        a=a,
        b=b,
        calibration=_calibration_of(args),
        rate=rate_of(args),
        config=attribution_config(args),
    )
    _emit(args, report)
    return 0


def _run_subsidy(args: argparse.Namespace) -> int:
    from ..report import ReadStats, load_pricing, subsidy_report

    pricing = load_pricing(args.pricing)
    stats = ReadStats()
    report = subsidy_report(
        _read(args, stats), stats, pricing=pricing, rate=rate_of(args), window=_window(args)
    )
    _emit(args, report)
    return 0


def run(args: argparse.Namespace) -> int:
    """Run the ``report`` sub-command chosen on the command line."""
    return int(args.run(args) or 0)
