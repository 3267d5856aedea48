"""Getting spans and metrics out: OTLP to a collector, or OTLP JSON lines to a file.

:func:`configure` sets everything up from the ``OTEL_*`` variables in one
call; :func:`span_exporters`, :func:`metric_exporters` and
:func:`attribution_processor` are the pieces, for code with its own
providers. :func:`iter_spans` reads a span file back.
"""

from __future__ import annotations

from .file import (
    OtlpJsonFileMetricExporter,
    OtlpJsonFileSpanExporter,
    SpanRecord,
    iter_spans,
    read_otlp_json_lines,
    to_otlp_json,
)
from .setup import (
    Telemetry,
    attribution_processor,
    configure,
    metric_exporters,
    span_exporters,
)

__all__ = [
    "OtlpJsonFileMetricExporter",
    "OtlpJsonFileSpanExporter",
    "SpanRecord",
    "Telemetry",
    "attribution_processor",
    "configure",
    "iter_spans",
    "metric_exporters",
    "read_otlp_json_lines",
    "span_exporters",
    "to_otlp_json",
]
