"""In-memory telemetry for tests: real SDK providers, the attribution processor, memory sinks."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from modtrace.processor import AttributionSpanProcessor

#: A caller's trace: the W3C ``traceparent`` of its span ``PARENT_ID`` in trace ``TRACE_ID``.
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
PARENT_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@dataclass
class Telemetry:
    """A tracer and a meter provider exporting to memory.

    Attributes:
        tracers: The tracer provider.
        meters: The meter provider.
        exporter: The finished spans.
        reader: The metrics (``None`` for :meth:`plain`).
        processor: The attribution processor (``None`` for :meth:`plain`).
    """

    tracers: TracerProvider
    meters: MeterProvider
    exporter: InMemorySpanExporter
    reader: InMemoryMetricReader | None = None
    processor: AttributionSpanProcessor | None = None

    @classmethod
    def attributed(
        cls, *, background: bool = False, limits: SpanLimits | None = None, **options: Any
    ) -> Telemetry:
        """Spans attributed by the modtrace processor (inline unless ``background``).

        Args:
            background: Attribute on the processor's worker thread.
            limits: The span limits of the tracer provider and the processor.
            **options: More :class:`AttributionSpanProcessor` arguments
                (``calibration``, ``rate``...).
        """
        exporter = InMemorySpanExporter()
        reader = InMemoryMetricReader()
        meters = MeterProvider(metric_readers=[reader])
        processor = AttributionSpanProcessor(
            SimpleSpanProcessor(exporter),
            meter_provider=meters,
            background=background,
            span_limits=limits,
            **options,
        )
        tracers = TracerProvider(span_limits=limits) if limits else TracerProvider()
        tracers.add_span_processor(processor)
        return cls(tracers, meters, exporter, reader, processor)

    @classmethod
    def plain(cls) -> Telemetry:
        """Spans exported as they are (an engine's service)."""
        exporter = InMemorySpanExporter()
        tracers = TracerProvider()
        tracers.add_span_processor(SimpleSpanProcessor(exporter))
        return cls(tracers, MeterProvider(), exporter)

    def spans(self) -> tuple[ReadableSpan, ...]:
        """Every finished span so far."""
        return self.exporter.get_finished_spans()

    def clear(self) -> None:
        """Forget the spans so far."""
        self.exporter.clear()

    def shutdown(self) -> None:
        """Stop both providers."""
        self.tracers.shutdown()
        self.meters.shutdown()


def wait_for_spans(telemetry: Telemetry, count: int, timeout: float = 10.0) -> list[ReadableSpan]:
    """The first ``count`` finished spans, waiting for them.

    An engine ends its span just after the last byte of its response, so a
    client may read the response a moment before the span is exported.
    """
    deadline = time.monotonic() + timeout
    while len(telemetry.spans()) < count:
        assert time.monotonic() < deadline, f"expected {count} spans, got {len(telemetry.spans())}"
        time.sleep(0.01)
    return list(telemetry.spans())
