"""The attribution span processor: enrichment, limits, faults, background work, concurrency."""

from __future__ import annotations

import asyncio
import math
import random
from concurrent.futures import ThreadPoolExecutor

import pytest
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from seed_helpers import PLAN, SEED, SEED_COUNTS
from telemetry_helpers import Telemetry

from modtrace import Calibration, attribute, price
from modtrace.processor import merge_attributes
from modtrace.spans import current_inference_span, inference_span, trace_inference
from modtrace.spans import inference as inference_module
from modtrace.spans.attributes import attribution_attributes, cost_attributes


@pytest.fixture
def otel():
    """Inline processor with the seed calibration and a 2 $/GPU-hour plan."""
    ns = Telemetry.attributed(calibration=SEED, rate=PLAN)
    yield ns
    ns.tracers.shutdown()
    ns.meters.shutdown()


def spans_of(otel):
    return list(otel.exporter.get_finished_spans())


def metric_points(otel):
    """{metric name: [data points]}."""
    out = {}
    data = otel.reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


class TestEnrichment:
    def test_results_equal_the_core(self, otel):
        """The enriched span carries exactly attribute() and price() of its inputs."""
        with inference_span("m", counts=SEED_COUNTS, tracer_provider=otel.tracers) as span:
            span.set_timers({"total": 1.70})
        (got,) = spans_of(otel)
        expected = attribute(SEED_COUNTS, {"total": 1.70}, SEED)
        want = attribution_attributes(expected) | cost_attributes(price(expected.gpu_seconds, PLAN))
        for key, value in want.items():
            assert got.attributes[key] == value, key
        # The seed's worked example: factor 1.079; 0.52 / 0.10 / 1.08 s; 0.00094 $.
        assert round(got.attributes["modtrace.reconcile.factor"], 3) == 1.079
        assert round(got.attributes["modtrace.attributed.gpu_seconds.text"], 2) == 0.52
        assert round(got.attributes["modtrace.attributed.gpu_seconds.image"], 2) == 0.10
        assert round(got.attributes["modtrace.attributed.gpu_seconds.audio"], 2) == 1.08
        assert round(got.attributes["modtrace.cost.usd.total"], 5) == 0.00094
        assert got.attributes["modtrace.cost.rate_id"] == "plan-2usd"
        assert got.attributes["modtrace.units.audio.seconds"] == 20.0

    def test_skip_marker_leaves_the_seconds_to_another_span(self, otel):
        """An engine span marked modtrace.attribution.skip is forwarded as is, with no metrics."""
        with inference_span(
            "m",
            timers={"total": 1.0},
            attributes={"modtrace.attribution.skip": True},
            tracer_provider=otel.tracers,
        ):
            pass
        (got,) = spans_of(otel)
        assert got.attributes["modtrace.gpu.seconds"] == 1.0
        assert not any(k.startswith("modtrace.attributed.") for k in got.attributes)
        assert "modtrace.attributed.gpu_seconds" not in metric_points(otel)

    def test_spans_set_up_by_other_code(self, otel):
        """A plain span with modtrace.* inputs set by hand is attributed too."""
        tracer = otel.tracers.get_tracer("gateway")
        with tracer.start_as_current_span("proxy") as span:
            span.set_attributes(
                {
                    "gen_ai.request.model": "m",
                    "modtrace.units.text.tokens": 100,
                    "modtrace.units.image.tokens": 300,
                    "modtrace.gpu.seconds": 2.0,
                    "modtrace.gpu.seconds.vision_encoder": 0.5,
                }
            )
        (got,) = spans_of(otel)
        expected = attribute(
            {"text.tokens": 100, "image.tokens": 300}, {"total": 2.0, "vision_encoder": 0.5}, SEED
        )
        assert got.attributes["modtrace.attributed.method"] == expected.method == "components"
        assert (
            got.attributes["modtrace.attributed.gpu_seconds.image"]
            == (expected.gpu_seconds["image"])
        )

    def test_other_spans_pass_through_untouched(self, otel):
        """A span without modtrace inputs is forwarded as the very same object."""
        seen = []

        class Keep(SpanExporter):
            def export(self, spans):
                seen.extend(spans)
                return SpanExportResult.SUCCESS

        otel.processor.add_delegate(SimpleSpanProcessor(Keep()))
        with otel.tracers.get_tracer("x").start_as_current_span("db.query") as span:
            span.set_attribute("db.system", "postgresql")
        (inner,) = spans_of(otel)
        assert seen[0] is inner
        assert dict(inner.attributes) == {"db.system": "postgresql"}

    def test_calibration_swap_applies_to_later_spans(self, otel):
        """A new calibration set on the processor stamps spans that end afterwards."""
        with inference_span("m", counts=SEED_COUNTS, tracer_provider=otel.tracers) as span:
            span.set_timers({"total": 1.0})
        otel.processor.calibration = Calibration.from_weights(
            {"text.tokens": 0.001, "image.tiles": 0.01, "audio.seconds": 0.01}, version="v2"
        )
        with inference_span("m", counts=SEED_COUNTS, tracer_provider=otel.tracers) as span:
            span.set_timers({"total": 1.0})
        versions = [s.attributes["modtrace.calibration.version"] for s in spans_of(otel)]
        assert versions == ["seed-1", "v2"]


class TestAttributeLimit:
    def test_inputs_survive_a_small_limit(self, monkeypatch):
        """OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT=8: the SDK alone evicts inputs; the copy keeps all."""
        monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "8")
        counts = {"text.tokens": 600, "image.count": 2, "image.tiles": 8, "image.tokens": 512}
        user = {f"app.tag{i}": i for i in range(6)}

        # Baseline, SDK only: the same span loses inputs to the limit.
        plain = InMemorySpanExporter()
        baseline = TracerProvider()
        baseline.add_span_processor(SimpleSpanProcessor(plain))
        with inference_span("m", counts=counts, tracer_provider=baseline) as span:
            span.span.set_attributes(user)
            span.set_timers({"total": 1.0, "prefill": 0.6, "decode": 0.3})
        (sdk_only,) = plain.get_finished_spans()
        assert len(sdk_only.attributes) == 8
        assert sdk_only.dropped_attributes > 0
        assert "gen_ai.request.model" not in sdk_only.attributes

        otel = Telemetry.attributed(calibration=SEED)  # SpanLimits() reads the variable too
        try:
            with inference_span("m", counts=counts, tracer_provider=otel.tracers) as span:
                span.span.set_attributes(user)
                span.set_timers({"total": 1.0, "prefill": 0.6, "decode": 0.3})
            (got,) = spans_of(otel)
        finally:
            otel.tracers.shutdown()
        attrs = got.attributes
        for unit, count in counts.items():
            assert attrs[f"modtrace.units.{unit}"] == count
        assert attrs["modtrace.gpu.seconds"] == 1.0
        assert attrs["modtrace.gpu.seconds.decode"] == 0.3
        assert attrs["gen_ai.request.model"] == "m"
        assert attrs["modtrace.attributed.method"] == "components"
        assert not any(k.startswith("app.") for k in attrs)  # others made room
        # Every attribute set that is not on the copy is counted as dropped.
        assert got.dropped_attributes == len(user)

    def test_merge_keeps_ours_and_evicts_oldest_others(self):
        """Past the limit the oldest other keys go first; ours stay even beyond it."""
        source = {"a": 1, "b": 2, "m.in": 3}
        merged, dropped = merge_attributes(source, {"m.in": 3, "m.out": 4}, limit=3)
        assert merged == {"b": 2, "m.in": 3, "m.out": 4}
        assert dropped == 1
        merged, dropped = merge_attributes(source, {"x": 1, "y": 2, "z": 3, "w": 4}, limit=2)
        assert merged == {"x": 1, "y": 2, "z": 3, "w": 4}
        assert dropped == 3
        assert merge_attributes(source, {"z": 0}, limit=None) == ({**source, "z": 0}, 0)


class TestNothingToAttribute:
    def test_a_span_without_units_or_timers_is_forwarded_unchanged(self, otel):
        """An inference span with neither counts nor timers (a probe) is not attributed."""
        with inference_span("probe", tracer_provider=otel.tracers):
            pass
        (got,) = spans_of(otel)
        assert not any(k.startswith("modtrace.attributed.") for k in got.attributes)
        assert "modtrace.units.text.tokens" not in got.attributes
        assert "modtrace.attributed.gpu_seconds" not in metric_points(otel)

    def test_units_or_timers_alone_are_still_attributed(self, otel):
        """Counts without timers, or timers without counts: attributed as before."""
        with inference_span("a", counts={"text.tokens": 3}, tracer_provider=otel.tracers):
            pass
        with inference_span("b", timers={"total": 1.0}, tracer_provider=otel.tracers):
            pass
        for got in spans_of(otel):
            assert "modtrace.attributed.method" in got.attributes, got.name


class TestFaults:
    def test_bad_inputs_from_other_code(self, otel):
        """A negative timer on a hand-made span: modtrace.error, counted, counts still used."""
        with otel.tracers.get_tracer("x").start_as_current_span("proxy") as span:
            span.set_attributes({"modtrace.units.text.tokens": 1000, "modtrace.gpu.seconds": -2.0})
        (got,) = spans_of(otel)
        assert got.attributes["modtrace.error"].startswith("attributes: modtrace.gpu.seconds")
        assert got.attributes["modtrace.attributed.method"] == "unreconciled"
        assert math.isclose(got.attributes["modtrace.attributed.gpu_seconds.text"], 0.8)
        (point,) = metric_points(otel)["modtrace.errors"]
        assert point.attributes == {"modtrace.error.stage": "attributes"} and point.value == 1

    def test_a_failing_delegate_does_not_stop_the_others(self, otel):
        """One delegate raising in on_end: the next still receives the span."""

        class Broken(SimpleSpanProcessor):
            def on_end(self, span):
                raise RuntimeError("disk full")

        otel.processor._delegates = (Broken(InMemorySpanExporter()), *otel.processor.delegates)
        with inference_span("m", counts={"text.tokens": 1}, tracer_provider=otel.tracers):
            pass
        assert len(spans_of(otel)) == 1

    def test_strict_processor_raises(self):
        """strict=True: a failure inside the processor raises out of span.end()."""
        ns = Telemetry.attributed(strict=True)
        try:
            span = ns.tracers.get_tracer("x").start_span("proxy")
            span.set_attribute("modtrace.gpu.seconds", -1.0)
            with pytest.raises(ValueError, match="negative"):
                span.end()
        finally:
            ns.tracers.shutdown()


class TestBackground:
    def test_force_flush_attributes_everything_queued(self):
        """With the worker idle (long delay), force_flush processes the queue."""
        ns = Telemetry.attributed(background=True, schedule_delay_millis=60_000, calibration=SEED)
        try:
            for i in range(5):
                with inference_span(
                    "m", counts={"text.tokens": 10 * (i + 1)}, tracer_provider=ns.tracers
                ) as span:
                    span.set_timers({"total": 0.1 * (i + 1)})
            assert spans_of(ns) == []
            assert ns.tracers.force_flush()
            got = sorted(s.attributes["modtrace.units.text.tokens"] for s in spans_of(ns))
            assert got == [10, 20, 30, 40, 50]
        finally:
            ns.tracers.shutdown()

    def test_full_queue_processes_inline(self):
        """max_queue_size=1 with the worker stuck: later spans are attributed inline, none lost."""
        ns = Telemetry.attributed(background=True, schedule_delay_millis=60_000, max_queue_size=1)
        try:
            with ns.processor._drain_lock:  # the worker cannot drain meanwhile
                for i in range(4):
                    with inference_span(
                        "m", counts={"text.tokens": i + 1}, tracer_provider=ns.tracers
                    ) as span:
                        span.set_timers({"total": 1.0})
                assert len(spans_of(ns)) == 3  # the first one waits in the queue
            ns.tracers.force_flush()
            assert len(spans_of(ns)) == 4
            assert all("modtrace.attributed.method" in s.attributes for s in spans_of(ns))
        finally:
            ns.tracers.shutdown()

    def test_after_fork_starts_a_fresh_worker(self):
        """The fork hook gives the child its own worker and an empty queue."""
        ns = Telemetry.attributed(background=True, schedule_delay_millis=60_000)
        try:
            with inference_span("m", counts={"text.tokens": 2}, tracer_provider=ns.tracers):
                pass
            parent_worker = ns.processor._worker
            ns.processor._after_fork()
            assert len(ns.processor._queue) == 0
            assert ns.processor._worker is not parent_worker
            assert ns.processor._worker.is_alive()
        finally:
            ns.tracers.shutdown()

    def test_shutdown_drains_and_stops_listening(self):
        """shutdown attributes what is queued and stops the hand-over of inputs."""
        ns = Telemetry.attributed(background=True, schedule_delay_millis=60_000)
        before = inference_module._listeners
        with inference_span("m", counts={"text.tokens": 2}, tracer_provider=ns.tracers) as span:
            span.set_timers({"total": 1.0})
        ns.tracers.shutdown()
        assert len(spans_of(ns)) == 1
        assert inference_module._listeners == before - 1


def test_exemplars_point_at_the_inference_span(otel):
    """Metric exemplars carry the inference span's ids, not its parent's."""
    tracer = otel.tracers.get_tracer("server")
    with (
        tracer.start_as_current_span("http POST /v1/chat/completions"),
        inference_span("m", counts=SEED_COUNTS, tracer_provider=otel.tracers) as span,
    ):
        span.set_timers({"total": 1.70})
    ids = span.span.get_span_context()
    points = metric_points(otel)
    for name in ("modtrace.attributed.gpu_seconds", "modtrace.units.tokens"):
        for point in points[name]:
            assert point.exemplars, name
            for exemplar in point.exemplars:
                assert (exemplar.trace_id, exemplar.span_id) == (ids.trace_id, ids.span_id)


N_ASYNC = 240
N_THREADED = 400


def _check_isolated(spans, expected_count):
    """Every span carries its own request's numbers only (request id -> counts -> results)."""
    assert len(spans) == expected_count
    seen = set()
    for got in spans:
        attrs = got.attributes
        rid = attrs["app.request_id"]
        seen.add(rid)
        tokens, tiles = rid + 1, rid % 7 + 1
        total = 0.001 * (rid + 1)
        assert attrs["modtrace.units.text.tokens"] == tokens
        assert attrs["modtrace.units.image.tiles"] == tiles
        assert attrs["modtrace.gpu.seconds"] == total
        expected = attribute({"text.tokens": tokens, "image.tiles": tiles}, {"total": total}, SEED)
        assert attrs["modtrace.attributed.gpu_seconds.text"] == expected.gpu_seconds["text"]
        assert attrs["modtrace.attributed.gpu_seconds.image"] == expected.gpu_seconds["image"]
    assert seen == set(range(expected_count))


def test_concurrent_asyncio_requests_stay_separate():
    """240 concurrent asyncio requests, interleaved at awaits, each with its own numbers."""
    ns = Telemetry.attributed(background=True, calibration=SEED, schedule_delay_millis=50)

    @trace_inference("m", tracer_provider=ns.tracers, meter_provider=ns.meters)
    async def handle(rid, delay):
        span = current_inference_span()
        span.span.set_attribute("app.request_id", rid)
        await asyncio.sleep(delay)
        span.set_counts({"text.tokens": rid + 1, "image.tiles": rid % 7 + 1})
        await asyncio.sleep(delay)
        span.set_timers({"total": 0.001 * (rid + 1)})
        return rid

    async def main():
        rng = random.Random(7)
        return await asyncio.gather(*(handle(i, rng.random() / 100) for i in range(N_ASYNC)))

    try:
        assert asyncio.run(main()) == list(range(N_ASYNC))
        ns.tracers.force_flush()
        _check_isolated(spans_of(ns), N_ASYNC)
    finally:
        ns.tracers.shutdown()


def test_thread_pool_requests_stay_separate():
    """400 requests on 8 threads, each with its own numbers; metric totals add up exactly."""
    ns = Telemetry.attributed(background=True, calibration=SEED, schedule_delay_millis=20)

    def handle(rid):
        with inference_span("m", tracer_provider=ns.tracers, meter_provider=ns.meters) as span:
            span.span.set_attribute("app.request_id", rid)
            span.set_counts({"text.tokens": rid + 1, "image.tiles": rid % 7 + 1})
            span.set_timers({"total": 0.001 * (rid + 1)})
        return rid

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            assert sorted(pool.map(handle, range(N_THREADED))) == list(range(N_THREADED))
        ns.tracers.force_flush()
        spans = spans_of(ns)
        _check_isolated(spans, N_THREADED)
        points = metric_points(ns)
        (tokens,) = points["modtrace.units.tokens"]
        assert tokens.value == sum(range(1, N_THREADED + 1))
        gpu = sum(p.value for p in points["modtrace.attributed.gpu_seconds"])
        assert math.isclose(gpu, sum(0.001 * (r + 1) for r in range(N_THREADED)), rel_tol=1e-12)
        (factor,) = points["modtrace.reconcile.factor"]
        assert factor.count == N_THREADED
    finally:
        ns.tracers.shutdown()


def test_limits_argument_is_respected():
    """An explicit SpanLimits on provider and processor bounds the copy the same way."""
    limits = SpanLimits(max_span_attributes=6)
    ns = Telemetry.attributed(limits=limits)
    try:
        with inference_span("m", counts={"text.tokens": 3}, tracer_provider=ns.tracers) as span:
            span.span.set_attribute("app.keep", "x")
        (got,) = spans_of(ns)
    finally:
        ns.tracers.shutdown()
    assert got.attributes["modtrace.units.text.tokens"] == 3
    assert "app.keep" not in got.attributes  # modtrace keys alone fill 6
    assert got.dropped_attributes == 1
