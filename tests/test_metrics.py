"""modtrace's metric instruments, the per-request measurements and their batching."""

from __future__ import annotations

import math

import pytest
from opentelemetry.sdk.metrics import Counter, Histogram, MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.trace import SpanContext, TraceFlags
from seed_helpers import SEED

from modtrace import Rate, UnitCounts, attribute, price, semconv
from modtrace.metrics import (
    FACTOR_BUCKETS,
    Instruments,
    MetricBatch,
    instruments_for,
    measurements,
    record_now,
)


def span_ctx(span_id: int) -> SpanContext:
    """A sampled span context with a fixed trace id."""
    return SpanContext(
        trace_id=0xABC, span_id=span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED)
    )


@pytest.fixture
def meters():
    """A meter provider with an in-memory reader, and its instruments."""
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    yield provider, reader, instruments_for(provider)
    provider.shutdown()


def collected(reader):
    """{metric name: metric} of one collection."""
    data = reader.get_metrics_data()
    return {
        m.name: m for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
    }


class TestInstruments:
    def test_names_units_and_kinds(self, meters):
        """Every instrument has its semconv name, one unit, and the right kind."""
        _, reader, instruments = meters
        ctx = span_ctx(1)
        for kind in semconv.METRIC_UNIT_KINDS:
            record_now(instruments, [(f"units.{kind}", 1.0, ())], ctx)
        record_now(instruments, [("gpu_seconds", 1.0, ()), ("cost", 1.0, ())], ctx)
        record_now(instruments, [("reconcile_factor", 1.0, ())], ctx)
        instruments.record_error("count")
        got = collected(reader)
        units = {
            "modtrace.attributed.gpu_seconds": "s",
            "modtrace.attributed.cost": "{USD}",
            "modtrace.reconcile.factor": "1",
            "modtrace.errors": "{error}",
            "modtrace.units.tokens": "{token}",
            "modtrace.units.seconds": "s",
            "modtrace.units.pixels": "{pixel}",
        }
        for name, unit in units.items():
            assert got[name].unit == unit, name
        assert {f"modtrace.units.{k}" for k in semconv.METRIC_UNIT_KINDS} <= set(got)
        (point,) = got["modtrace.reconcile.factor"].data.data_points
        assert tuple(point.explicit_bounds) == FACTOR_BUCKETS

    def test_instruments_are_created_once_per_provider(self, meters):
        """instruments_for returns the same instruments for the same provider."""
        provider, _, instruments = meters
        assert instruments_for(provider) is instruments
        assert isinstance(instruments, Instruments)
        assert isinstance(instruments.errors, Counter)
        assert isinstance(instruments.reconcile_factor, Histogram)


class TestMeasurements:
    def test_one_request(self):
        """Units by kind, seconds and cost by modality, one factor: labels as documented."""
        units = UnitCounts({"text.tokens": 600, "image.tiles": 8, "image.count": 0})
        result = attribute(units, {"total": 1.0}, SEED)
        cost = price(result.gpu_seconds, Rate(usd_per_gpu_hour=3.6, id="r"))
        items = measurements(model="m", units=units, attribution=result, cost=cost)
        by_name = {}
        for name, value, labels in items:
            by_name.setdefault(name, []).append((value, dict(labels)))
        assert by_name["units.tokens"] == [
            (600, {"gen_ai.request.model": "m", "modtrace.modality": "text"})
        ]
        assert "units.count" not in by_name  # zero counts are not recorded
        seconds = {lab["modtrace.modality"]: v for v, lab in by_name["gpu_seconds"]}
        assert seconds == result.gpu_seconds
        assert all(lab["modtrace.calibration.version"] == "seed-1" for _, lab in by_name["cost"])
        assert all(lab["modtrace.cost.rate_id"] == "r" for _, lab in by_name["cost"])
        assert math.isclose(sum(v for v, _ in by_name["cost"]), 0.001)  # 1 s at 3.6 $/h
        assert by_name["reconcile_factor"] == [
            (result.factor, {"gen_ai.request.model": "m", "modtrace.calibration.version": "seed-1"})
        ]

    def test_no_factor_when_unreconciled(self):
        """Without a measured total nothing was reconciled: no factor measurement."""
        result = attribute({"text.tokens": 10}, None, SEED)
        items = measurements(model=None, attribution=result)
        assert [name for name, _, _ in items] == ["gpu_seconds"]
        assert dict(items[0][2])["gen_ai.request.model"] == ""


class TestMetricBatch:
    def test_sums_are_exact_and_the_exemplar_is_one_real_request(self, meters):
        """Three requests in one series: total = sum; exemplar = last request, its own value."""
        _, reader, instruments = meters
        batch = MetricBatch()
        labels = (("gen_ai.request.model", "m"), ("modtrace.modality", "text"))
        for span_id, value in ((1, 10.0), (2, 20.0), (3, 30.0)):
            batch.add([("units.tokens", value, labels)], span_ctx(span_id))
        batch.record(instruments)
        (point,) = collected(reader)["modtrace.units.tokens"].data.data_points
        assert point.value == 60.0
        assert [(e.span_id, e.value) for e in point.exemplars] == [(3, 30.0)]

    def test_histogram_values_are_kept_one_by_one(self, meters):
        """Factors are recorded per request, each with its own span as exemplar."""
        _, reader, instruments = meters
        batch = MetricBatch()
        labels = (("gen_ai.request.model", "m"), ("modtrace.calibration.version", "v"))
        for span_id, factor in ((1, 0.9), (2, 1.2), (3, 3.0)):
            batch.add([("reconcile_factor", factor, labels)], span_ctx(span_id))
        batch.record(instruments)
        (point,) = collected(reader)["modtrace.reconcile.factor"].data.data_points
        assert point.count == 3
        assert math.isclose(point.sum, 5.1)
        assert sorted(e.span_id for e in point.exemplars) == [1, 2, 3]
