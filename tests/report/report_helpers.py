"""Span files with chosen numbers, written by the real SDK spans and modtrace's file exporter.

Each test picks per-request numbers (counts, measured seconds, recorded
attribution and dollars), writes them as real ``ReadableSpan`` objects
through :class:`modtrace.export.OtlpJsonFileSpanExporter` (the OTLP JSON
encoder the reports read), and computes its expected figures by hand from
the same numbers.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from modtrace import semconv
from modtrace.export import OtlpJsonFileSpanExporter

_ids = itertools.count(1)


def ns(when: str) -> int:
    """An ISO date-time (UTC) as ns since the epoch."""
    moment = datetime.fromisoformat(when).replace(tzinfo=timezone.utc)
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1000


def inference(
    *,
    units: Mapping[str, float] | None = None,
    measured: float | None = None,
    components: Mapping[str, float] | None = None,
    attributed: Mapping[str, float] | None = None,
    version: str | None = None,
    usd: Mapping[str, float] | None = None,
    usd_per_gpu_hour: float | None = None,
    rate_id: str | None = None,
    counters: Mapping[str, str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The attributes of one inference span, as the instrumentation and processor set them."""
    attrs: dict[str, Any] = {
        semconv.GEN_AI_OPERATION_NAME: "chat",
        semconv.GEN_AI_REQUEST_MODEL: "Qwen/Qwen2.5-VL-7B-Instruct",
    }
    for unit, count in (units or {}).items():
        attrs[semconv.unit(unit)] = count
    for modality, ref in (counters or {}).items():
        attrs[semconv.unit_counter(modality)] = ref
    if measured is not None:
        attrs[semconv.GPU_SECONDS] = measured
    for component, seconds in (components or {}).items():
        attrs[semconv.gpu_seconds_component(component)] = seconds
    if attributed is not None:
        attrs[semconv.ATTRIBUTED_METHOD] = "weights"
        attrs[semconv.RECONCILE_FACTOR] = 1.0
        for modality, seconds in attributed.items():
            attrs[semconv.attributed_gpu_seconds(modality)] = seconds
    if version is not None:
        attrs[semconv.CALIBRATION_VERSION] = version
    if usd is not None:
        for modality, dollars in usd.items():
            attrs[semconv.cost_usd(modality)] = dollars
        attrs[semconv.COST_USD_TOTAL] = sum(usd.values())
        attrs[semconv.COST_HYPOTHETICAL] = True
    if usd_per_gpu_hour is not None:
        attrs[semconv.COST_USD_PER_GPU_HOUR] = usd_per_gpu_hour
    if rate_id is not None:
        attrs[semconv.COST_RATE_ID] = rate_id
    attrs.update(extra or {})
    return attrs


def span(
    start: str,
    attributes: Mapping[str, Any],
    *,
    name: str = "chat Qwen/Qwen2.5-VL-7B-Instruct",
    resource: Mapping[str, Any] | None = None,
    duration_s: float = 1.0,
) -> ReadableSpan:
    """A finished SDK span starting at ``start`` (ISO, UTC)."""
    span_id = next(_ids)
    context = SpanContext(
        trace_id=0x5EED0000 + span_id,
        span_id=span_id,
        is_remote=False,
        trace_flags=TraceFlags(TraceFlags.SAMPLED),
    )
    begin = ns(start)
    return ReadableSpan(
        name=name,
        context=context,
        resource=Resource(dict(resource or {"service.name": "gateway"})),
        attributes=dict(attributes),
        kind=SpanKind.CLIENT,
        start_time=begin,
        end_time=begin + int(duration_s * 1e9),
        instrumentation_scope=InstrumentationScope("modtrace", "0.1.0"),
    )


def write_spans(path: Path, spans: Iterable[ReadableSpan], per_line: int = 1) -> Path:
    """Write ``spans`` with the real file exporter, ``per_line`` spans per export (one line)."""
    exporter = OtlpJsonFileSpanExporter(path)
    batch: list[ReadableSpan] = []
    for s in spans:
        batch.append(s)
        if len(batch) == per_line:
            exporter.export(batch)
            batch = []
    if batch:
        exporter.export(batch)
    exporter.shutdown()
    return path
