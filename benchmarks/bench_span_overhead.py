"""Per-request overhead of a modtrace inference span against a bare OpenTelemetry span.

Both run in the same process, interleaved round by round, on the same
SDK pipeline (a ``BatchSpanProcessor`` in front of an exporter that drops
everything, so the network is not measured):

* **bare**: ``start_as_current_span`` (the span is made current, as the
  inference span is) and one ``set_attributes`` with as many attributes as
  the exported modtrace span carries;
* **modtrace**: ``inference_span`` with the counts of a text + 2-image
  request, ``set_timers`` with total and component timers, then the
  attribution processor (calibration, reconciliation, hypothetical cost,
  enriched copy) and the metrics (units, GPU seconds, cost, factor, with
  exemplars), in its default background mode and with ``background=False``.

Three figures per case, per span: the **request path** (CPU time of the
request thread: what the calling code spends, free of other threads and of
other processes on the machine), the **total CPU** (the whole process,
worker threads included, to the last ``force_flush``: what the machine pays)
and the **wall** time of the request loop (inflated by worker threads holding
the GIL and by a loaded machine). Goal: modtrace under 2x the bare span.

Run: ``.venv/bin/python benchmarks/bench_span_overhead.py [--spans 2000] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from modtrace import Calibration, GpuTimers, Rate, UnitCounts
from modtrace.processor import AttributionSpanProcessor
from modtrace.spans import inference_span

MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
COUNTS = UnitCounts(
    {
        "text.tokens": 600,
        "image.count": 2,
        "image.pixels": 1_605_632,
        "image.tiles": 8,
        "image.tokens": 2048,
    }
)
TIMERS = GpuTimers(total=1.7, vision_encoder=0.2, prefill=1.0, decode=0.5, source="wall_clock")
CALIBRATION = Calibration.from_weights(
    {"text.tokens": 0.0008, "image.tiles": 0.012, "image.tokens": 0.0005}, version="bench-1"
)
RATE = Rate(usd_per_gpu_hour=2.0, id="bench")
BIG_QUEUE = 1_000_000  # nothing dropped in either pipeline


class Discard(SpanExporter):
    """Accepts every batch and keeps nothing."""

    def export(self, spans: object) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def attributing(
    delegate: SpanProcessor, meters: MeterProvider, *, background: bool, **options: Any
) -> TracerProvider:
    """A tracer provider whose spans the attribution processor hands on to ``delegate``."""
    processor = AttributionSpanProcessor(
        delegate,
        calibration=CALIBRATION,
        rate=RATE,
        meter_provider=meters,
        background=background,
        **options,
    )
    tracers = TracerProvider()
    tracers.add_span_processor(processor)
    return tracers


def modtrace_pipeline(background: bool) -> tuple[TracerProvider, MeterProvider, Callable[[], None]]:
    """Tracer and meter providers with the attribution processor; returns one request."""
    meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
    batch = BatchSpanProcessor(Discard(), max_queue_size=BIG_QUEUE, schedule_delay_millis=200)
    tracers = attributing(batch, meters, background=background, max_queue_size=BIG_QUEUE)

    def request() -> None:
        with inference_span(
            MODEL, counts=COUNTS, tracer_provider=tracers, meter_provider=meters
        ) as span:
            span.set_timers(TIMERS)

    return tracers, meters, request


def exported_attribute_count() -> int:
    """How many attributes the exported modtrace span carries (the bare span gets as many)."""
    sink = InMemorySpanExporter()
    meters = MeterProvider()
    tracers = attributing(SimpleSpanProcessor(sink), meters, background=False)
    with inference_span(MODEL, counts=COUNTS, tracer_provider=tracers) as span:
        span.set_timers(TIMERS)
    (exported,) = sink.get_finished_spans()
    tracers.shutdown()
    meters.shutdown()
    return len(exported.attributes)


def bare_pipeline(n_attributes: int) -> tuple[TracerProvider, None, Callable[[], None]]:
    """A plain SDK pipeline; one request sets ``n_attributes`` attributes of mixed types."""
    tracers = TracerProvider()
    tracers.add_span_processor(
        BatchSpanProcessor(Discard(), max_queue_size=BIG_QUEUE, schedule_delay_millis=200)
    )
    tracer = tracers.get_tracer("bench")
    values: list[object] = [600, 1.7, "wall_clock", True]
    attributes = {f"bench.attr.{i}": values[i % len(values)] for i in range(n_attributes)}

    def request() -> None:
        # As current span, like inference_span: children opened inside nest under it.
        with tracer.start_as_current_span(f"chat {MODEL}") as span:
            span.set_attributes(attributes)

    return tracers, None, request


def measure(
    build: Callable[[], tuple[TracerProvider, MeterProvider | None, Callable[[], None]]],
    spans: int,
) -> tuple[float, float, float]:
    """One round, µs per span: request-thread CPU, whole-process CPU, request-loop wall."""
    tracers, meters, request = build()
    for _ in range(200):  # warm caches and lazy imports
        request()
    tracers.force_flush()
    thread0, cpu0, wall0 = time.thread_time(), time.process_time(), time.perf_counter()
    for _ in range(spans):
        request()
    thread, wall = time.thread_time() - thread0, time.perf_counter() - wall0
    tracers.force_flush()  # the worker threads' share is paid by here
    cpu = time.process_time() - cpu0
    tracers.shutdown()
    if meters is not None:
        meters.shutdown()
    return thread / spans * 1e6, cpu / spans * 1e6, wall / spans * 1e6


def main(argv: list[str] | None = None) -> int:
    """Run the rounds and print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=2000, help="spans per round")
    parser.add_argument("--rounds", type=int, default=7, help="rounds per case")
    args = parser.parse_args(argv)

    n_attributes = exported_attribute_count()
    cases: dict[str, Callable[[], tuple[TracerProvider, MeterProvider | None, Callable[[], None]]]]
    cases = {
        f"bare OTel span ({n_attributes} attributes)": lambda: bare_pipeline(n_attributes),
        "modtrace span, background processor": lambda: modtrace_pipeline(True),
        "modtrace span, inline processor": lambda: modtrace_pipeline(False),
    }
    results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, build in cases.items():  # interleaved: drift hits every case alike
            results[name].append(measure(build, args.spans))

    print(f"python {sys.version.split()[0]}, {args.rounds} rounds x {args.spans} spans")
    print(
        "request path = CPU of the request thread; total = CPU of the process to the last "
        "flush (workers included); wall = the request loop, which a loaded machine inflates"
    )
    header = f"{'case':42} {'request path':>13} {'total CPU':>10} {'wall':>9}  ratios"
    for label, pick in (("median", statistics.median), ("best", min)):
        print(f"\n{label} of rounds, us per span\n{header}")
        bare = [pick(row[i] for row in next(iter(results.values()))) for i in range(3)]
        for name, rows in results.items():
            path, cpu, wall = (pick(row[i] for row in rows) for i in range(3))
            print(
                f"{name:42} {path:10.1f} us {cpu:7.1f} us {wall:6.1f} us  "
                f"path {path / bare[0]:.2f}x, total {cpu / bare[1]:.2f}x"
            )
    print("\ngoal: modtrace under 2x the bare span")
    return 0


if __name__ == "__main__":
    sys.exit(main())
