"""Reports over finished spans: shares, drift, restatement, comparison and subsidy.

Spans come from OTLP JSON lines files (:func:`read_spans`, streamed with
bounded memory) or, for the shares report, from the collector's ClickHouse
``otel_traces`` table (:mod:`modtrace.report.clickhouse`)::

    from modtrace.report import ReadStats, read_spans, shares_report, render

    stats = ReadStats()
    report = shares_report(read_spans("spans.otlp.jsonl", stats), stats, bucket="week")
    print(render(report, "table"))

Dollars are hypothetical throughout: planning figures, never invoices.
"""

from __future__ import annotations

from .base import BUCKETS, Report, Window, parse_time
from .compare import Side, compare_report
from .drift import DriftConfig, drift_report
from .render import FORMATS, render, render_csv, render_json, render_table, write_chart
from .restate import RestatedSpan, restate_report, restate_span
from .shares import SharesSums, finish_shares, shares_report
from .spans import ReadStats, SpanRecord, read_spans
from .subsidy import PricingConfig, TierPrice, load_pricing, subsidy_report, transfers

__all__ = [
    "BUCKETS",
    "FORMATS",
    "DriftConfig",
    "PricingConfig",
    "ReadStats",
    "Report",
    "RestatedSpan",
    "SharesSums",
    "Side",
    "SpanRecord",
    "TierPrice",
    "Window",
    "compare_report",
    "drift_report",
    "finish_shares",
    "load_pricing",
    "parse_time",
    "read_spans",
    "render",
    "render_csv",
    "render_json",
    "render_table",
    "restate_report",
    "restate_span",
    "shares_report",
    "subsidy_report",
    "transfers",
    "write_chart",
]
