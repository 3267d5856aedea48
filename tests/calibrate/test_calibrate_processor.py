"""The span processor's calibration checks: staleness marks, interval attributes, drift alarm."""

from __future__ import annotations

import logging
import math
import time
from datetime import datetime, timedelta, timezone
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from telemetry_helpers import Telemetry

from modtrace import Calibration, attribute
from modtrace.calibrate.drift import DriftTracker
from modtrace.calibrate.intervals import attribution_intervals
from modtrace.calibrate.plan import ImageItem, ProbePlan, build_request
from modtrace.calibrate.staleness import StalenessCheck, staleness_reasons
from modtrace.counting.counter import CountingConfig, RequestCounter
from modtrace.environment_variables import (
    MODTRACE_ATTRIBUTION_INTERVALS,
    MODTRACE_CALIBRATION_MAX_AGE_DAYS,
)
from modtrace.processor import AttributionSpanProcessor
from modtrace.spans import inference_span

MODEL = "Qwen/Qwen2.5-Omni-7B"
PROFILE = "qwen2.5-omni"
NOW = datetime.now(timezone.utc)
WEIGHTS = {"text.tokens": 1.0e-4, "image.tokens": 2.0e-4, "audio.seconds": 5.0e-3}
COUNTS = {"text.tokens": 600, "image.tokens": 1369, "audio.seconds": 20.0}
#: Every modality with prompt tokens: a component split needs no weights.
TOKEN_COUNTS = {"text.tokens": 600, "image.tokens": 1369, "audio.tokens": 500}
COMPONENT_TIMERS = {"total": 1.0, "vision_encoder": 0.3, "audio_encoder": 0.2, "prefill": 0.5}
STALE = "modtrace.calibration.stale"
REASONS = "modtrace.calibration.stale_reasons"
PROCESSOR_LOG = "modtrace.processor"


def calibration(
    *,
    version: str = "cal-1",
    created: datetime = NOW,
    model: str | None = MODEL,
    preprocessor: str | None = PROFILE,
    counters: dict[str, str] | None = None,
    stderr: float = 0.05,
) -> Calibration:
    """A calibration whose weights carry ``stderr`` relative standard errors."""
    extra = {"counters": counters} if counters is not None else {}
    return Calibration(
        version=version,
        created=created,
        model=model,
        preprocessor=preprocessor,
        weights={u: {"value": w, "stderr": w * stderr} for u, w in WEIGHTS.items()},
        **extra,
    )


@pytest.fixture
def make():
    """Build processors; shut every provider down afterwards."""
    made = []

    def build(**options):
        ns = Telemetry.attributed(**options)
        made.append(ns)
        return ns

    yield build
    for ns in made:
        ns.tracers.shutdown()
        ns.meters.shutdown()


def send(otel, counts=COUNTS, timers=None, model=MODEL, **span):
    """One inference span with ready counts; returns the exported copy's attributes."""
    with inference_span(model, counts=counts, tracer_provider=otel.tracers, **span) as s:
        s.set_timers(timers if timers is not None else {"total": 1.0})
    return dict(otel.exporter.get_finished_spans()[-1].attributes)


def gauges(otel) -> dict[str, list]:
    """{metric name: data points} of the drift gauges."""
    out: dict[str, list] = {}
    data = otel.reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name.startswith("modtrace.calibration.drift"):
                    out.setdefault(metric.name, []).extend(metric.data.data_points)
    return out


def omni_request() -> dict:
    """A real chat body with a real PNG (the plan's request builder), counted by qwen2.5-omni."""
    plan = ProbePlan(
        profile=PROFILE,
        model=MODEL,
        modalities=("text", "image"),
        images=(ImageItem(width=448, height=448),),
        text_words=(8, 16),
        repeats=1,
        warmup=0,
        holdout=(),
    )
    spec = next(s for s in plan.probes() if s.modality == "image")
    return build_request(spec, plan).body


class TestStaleness:
    def test_fresh_calibration_is_marked_fresh(self, make, caplog):
        """A calibration of today, for the span's model: no mark, no reasons, no warning."""
        otel = make(calibration=calibration())
        with caplog.at_level(logging.WARNING, logger=PROCESSOR_LOG):
            attrs = send(otel)
        assert STALE not in attrs
        assert REASONS not in attrs
        assert not caplog.records

    def test_old_calibration_is_stale_and_warned_once(self, make, caplog):
        """Older than 30 days: every span is marked; the log warns once for the version."""
        otel = make(calibration=calibration(created=NOW - timedelta(days=45)))
        with caplog.at_level(logging.WARNING, logger=PROCESSOR_LOG):
            first = send(otel)
            second = send(otel)
        for attrs in (first, second):
            assert attrs[STALE] is True
            (reason,) = attrs[REASONS]
            assert "45 days old" in reason and "max 30 days" in reason
        assert len(caplog.records) == 1
        assert "cal-1" in caplog.records[0].getMessage()

    def test_age_is_taken_at_the_span_time(self, make):
        """A span that ended 40 days ago is judged by its own time, not the clock's."""
        cal = calibration(created=NOW - timedelta(days=45))
        otel = make(calibration=cal)
        ended = NOW - timedelta(days=40)
        start_ns = int(ended.timestamp() * 1e9) - 1_000_000
        with inference_span(
            MODEL, counts=COUNTS, tracer_provider=otel.tracers, start_time=start_ns
        ) as span:
            span.set_timers({"total": 1.0})
            span.end_time = int(ended.timestamp() * 1e9)
        attrs = otel.exporter.get_finished_spans()[-1].attributes
        assert STALE not in attrs

    def test_other_model_is_stale(self, make):
        """Measured on another model than the span's: the reason names both."""
        otel = make(calibration=calibration(model="Qwen/Qwen2.5-Omni-3B"))
        attrs = send(otel)
        assert attrs[STALE] is True
        (reason,) = attrs[REASONS]
        assert "Qwen/Qwen2.5-Omni-3B" in reason and MODEL in reason

    def test_other_counter_version_is_stale(self, make):
        """A span counted by a counter version the calibration was not fitted on is stale."""
        body = omni_request()
        counted = RequestCounter(CountingConfig(profile=PROFILE)).count(body)
        ref = counted.counters["image"]
        same = calibration(preprocessor=f"{PROFILE} (image {ref})", counters={"image": ref})
        other = calibration(
            version="cal-old-counter",
            preprocessor=f"{PROFILE} (image {ref}-old)",
            counters={"image": ref + "-old"},
        )
        fresh = make(calibration=same)
        with inference_span(request=body, profile=PROFILE, tracer_provider=fresh.tracers) as s:
            s.set_timers({"total": 0.5})
        attrs = fresh.exporter.get_finished_spans()[-1].attributes
        assert attrs["modtrace.units.image.counter"] == ref
        assert STALE not in attrs
        stale = make(calibration=other)
        with inference_span(request=body, profile=PROFILE, tracer_provider=stale.tracers) as s:
            s.set_timers({"total": 0.5})
        attrs = stale.exporter.get_finished_spans()[-1].attributes
        assert attrs[STALE] is True
        assert any(ref in r and "-old" in r for r in attrs[REASONS])

    def test_other_profile_is_stale(self, make):
        """A span counted with another profile than the calibration's is stale."""
        otel = make(calibration=calibration(preprocessor="qwen2.5-vl (image qwen2.5-vl.image@1)"))
        with inference_span(request=omni_request(), profile=PROFILE, tracer_provider=otel.tracers):
            pass
        attrs = otel.exporter.get_finished_spans()[-1].attributes
        assert attrs[STALE] is True
        assert any("qwen2.5-vl" in r and PROFILE in r for r in attrs[REASONS])

    def test_max_age_option_and_environment(self, make, monkeypatch):
        """The max age comes from the option, else the environment variable, else 30 days."""
        cal = calibration(created=NOW - timedelta(days=3))
        assert STALE not in send(make(calibration=cal))
        assert send(make(calibration=cal, calibration_max_age=timedelta(days=2)))[STALE] is True
        monkeypatch.setenv(MODTRACE_CALIBRATION_MAX_AGE_DAYS, "2.5")
        otel = make(calibration=cal)
        assert otel.processor.calibration_max_age == timedelta(days=2.5)
        assert send(otel)[STALE] is True

    @pytest.mark.parametrize("value", ["0", "-3", "thirty", "inf", "nan"])
    def test_bad_max_age_environment(self, monkeypatch, value):
        """A max age that is not a positive number of days is refused by name."""
        monkeypatch.setenv(MODTRACE_CALIBRATION_MAX_AGE_DAYS, value)
        with pytest.raises(ValueError, match=MODTRACE_CALIBRATION_MAX_AGE_DAYS):
            AttributionSpanProcessor(background=False, record_metrics=False)

    def test_no_calibration_no_mark(self, make):
        """Without a calibration there is nothing to be stale."""
        attrs = send(make(), timers={"total": 1.0, "prefill": 0.6, "vision_encoder": 0.4})
        assert STALE not in attrs

    def test_swapping_calibration_is_checked_afresh(self, make):
        """A calibration set at run time is judged on its own dates."""
        otel = make(calibration=calibration(created=NOW - timedelta(days=60)))
        assert send(otel)[STALE] is True
        otel.processor.calibration = calibration(version="cal-2")
        assert STALE not in send(otel)


class TestStalenessCheck:
    def test_matches_staleness_reasons(self):
        """The cached check gives the same reasons as the plain function, day by day."""
        cal = calibration(created=datetime(2026, 1, 1, tzinfo=timezone.utc), model="a")
        check = StalenessCheck()
        for days in (0, 10, 29, 31, 45, 45.5, 400, -1):
            when = cal.created + timedelta(days=days)
            at_ns = int(when.timestamp() * 1e9)
            for model in ("a", "b", None):
                got = check.reasons(cal, at_ns=at_ns, model=model)
                assert list(got) == staleness_reasons(cal, now=when, model=model), (days, model)

    def test_cheap(self):
        """A fresh span costs well under 10 microseconds (one lock, one look-up)."""
        cal = calibration()
        check = StalenessCheck()
        counters = (("image", "qwen2.5-omni.image@1"),)
        at_ns = time.time_ns()
        n, rounds = 5_000, []
        for _ in range(5):  # the best round: a loaded machine only slows some down
            start = time.perf_counter()
            for _ in range(n):
                check.reasons(
                    cal, at_ns=at_ns, model=MODEL, preprocessor=PROFILE, counters=counters
                )
            rounds.append((time.perf_counter() - start) / n)
        assert min(rounds) < 10e-6


class TestIntervals:
    def test_off_by_default(self, make, monkeypatch):
        """No interval attributes unless asked for."""
        monkeypatch.delenv(MODTRACE_ATTRIBUTION_INTERVALS, raising=False)
        attrs = send(make(calibration=calibration()))
        assert not [k for k in attrs if k.endswith((".low", ".high"))]
        assert "modtrace.attributed.interval.confidence" not in attrs

    @pytest.mark.parametrize("how", ["option", "environment"])
    def test_weights_attribution_carries_delta_intervals(self, make, monkeypatch, how):
        """Weights-only spans get the delta-method bounds of attribution_intervals()."""
        cal = calibration()
        if how == "environment":
            monkeypatch.setenv(MODTRACE_ATTRIBUTION_INTERVALS, "true")
            otel = make(calibration=cal, interval_confidence=0.9)
        else:
            otel = make(calibration=cal, intervals=True, interval_confidence=0.9)
        attrs = send(otel, timers={"total": 1.0})
        expected = attribution_intervals(COUNTS, {"total": 1.0}, cal, confidence=0.9)
        point = attribute(COUNTS, {"total": 1.0}, cal)
        assert attrs["modtrace.attributed.interval.confidence"] == 0.9
        assert attrs["modtrace.attributed.interval.method"] == "delta"
        for m in ("text", "image", "audio"):
            low, high = expected.gpu_seconds[m]
            assert attrs[f"modtrace.attributed.gpu_seconds.{m}.low"] == low
            assert attrs[f"modtrace.attributed.gpu_seconds.{m}.high"] == high
            assert low < point.gpu_seconds[m] < high
            s_low, s_high = expected.share[m]
            assert attrs[f"modtrace.attributed.share.{m}.low"] == s_low
            assert attrs[f"modtrace.attributed.share.{m}.high"] == s_high
            assert s_low < attrs[f"modtrace.attributed.share.{m}"] < s_high

    def test_width_follows_the_standard_errors(self, make):
        """Twice the weights' standard errors: twice the interval half-width (first order)."""
        widths = []
        for stderr in (0.02, 0.04):
            otel = make(calibration=calibration(stderr=stderr), intervals=True)
            attrs = send(otel)
            key = "modtrace.attributed.share.image"
            widths.append(attrs[key + ".high"] - attrs[key + ".low"])
        assert math.isclose(widths[1], 2 * widths[0], rel_tol=1e-9)

    def test_component_attribution_is_exact(self, make):
        """A split by component timers does not depend on the weights: zero width."""
        otel = make(calibration=calibration(), intervals=True)
        attrs = send(otel, counts=TOKEN_COUNTS, timers=COMPONENT_TIMERS)
        assert attrs["modtrace.attributed.method"] == "components"
        assert attrs["modtrace.attributed.interval.method"] == "exact"
        for m in ("text", "image", "audio"):
            value = attrs[f"modtrace.attributed.gpu_seconds.{m}"]
            assert attrs[f"modtrace.attributed.gpu_seconds.{m}.low"] == value
            assert attrs[f"modtrace.attributed.gpu_seconds.{m}.high"] == value

    def test_mixed_attribution_has_none(self, make):
        """A component split that fell back to weights would need Monte Carlo: no bounds."""
        otel = make(calibration=calibration(), intervals=True)
        # The prefill split needs audio tokens, which are missing: it falls back to weights.
        attrs = send(otel, counts=COUNTS, timers={"total": 1.0, "prefill": 0.7, "decode": 0.3})
        assert attrs["modtrace.attributed.method"] == "mixed"
        assert not [k for k in attrs if k.endswith((".low", ".high"))]

    def test_bad_environment_value(self, monkeypatch):
        """An unreadable switch is refused by name."""
        monkeypatch.setenv(MODTRACE_ATTRIBUTION_INTERVALS, "maybe")
        with pytest.raises(ValueError, match=MODTRACE_ATTRIBUTION_INTERVALS):
            AttributionSpanProcessor(background=False, record_metrics=False)

    def test_bad_confidence(self):
        """A confidence outside (0, 1) is refused."""
        with pytest.raises(ValueError, match="interval_confidence"):
            AttributionSpanProcessor(background=False, record_metrics=False, interval_confidence=1)


class TestDrift:
    def weights_span(self, otel, factor: float):
        """A weights-only span whose measured total is ``factor`` x the weights' prediction."""
        predicted = sum(WEIGHTS[u] * c for u, c in COUNTS.items())
        return send(otel, timers={"total": predicted * factor})

    def test_alarm_logs_once_and_the_gauges_follow(self, make, caplog):
        """Median out of the band: one warning, gauges at the median and state 1; then back."""
        otel = make(calibration=calibration(), drift=DriftTracker(min_samples=5, window=9))
        with caplog.at_level(logging.INFO, logger=PROCESSOR_LOG):
            for _ in range(12):
                attrs = self.weights_span(otel, 1.3)
            assert math.isclose(attrs["modtrace.reconcile.factor"], 1.3)
            warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
            assert len(warnings) == 1
            assert "1.300" in warnings[0].getMessage() and "above" in warnings[0].getMessage()
            points = gauges(otel)
            (median,) = points["modtrace.calibration.drift.median_factor"]
            (state,) = points["modtrace.calibration.drift.state"]
            assert math.isclose(median.value, 1.3) and state.value == 1
            assert median.attributes == {"modtrace.calibration.version": "cal-1"}
            for _ in range(9):
                self.weights_span(otel, 1.0)
        cleared = [r for r in caplog.records if "drift cleared" in r.getMessage()]
        assert len(cleared) == 1 and cleared[0].levelno == logging.INFO
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
        points = gauges(otel)
        assert math.isclose(points["modtrace.calibration.drift.median_factor"][0].value, 1.0)
        assert points["modtrace.calibration.drift.state"][0].value == 0

    def test_default_tracker_and_band(self, make):
        """By default: band 0.9-1.1 over at least 20 weights-attributed requests."""
        otel = make(calibration=calibration())
        tracker = otel.processor.drift
        assert tracker.band == (0.9, 1.1) and tracker.min_samples == 20
        for _ in range(19):
            self.weights_span(otel, 0.8)
        assert tracker.status() is None and not gauges(otel)
        self.weights_span(otel, 0.8)
        status = tracker.status()
        assert status.drifting and math.isclose(status.median, 0.8)

    def test_component_spans_do_not_feed_it(self, make):
        """A component split's factor says nothing about the weights: not tracked."""
        otel = make(calibration=calibration(), drift=DriftTracker(min_samples=1, window=5))
        attrs = send(otel, counts=TOKEN_COUNTS, timers=COMPONENT_TIMERS)
        assert attrs["modtrace.attributed.method"] == "components"
        assert otel.processor.drift.status() is None

    def test_disabled(self, make):
        """drift=False: no tracker, no gauges."""
        otel = make(calibration=calibration(), drift=False)
        assert otel.processor.drift is None
        for _ in range(25):
            self.weights_span(otel, 2.0)
        assert not gauges(otel)

    def test_two_processors_share_the_gauges(self, caplog):
        """Two processors on one meter provider: both trackers observed, no duplicate instrument."""
        reader = InMemoryMetricReader()
        meters = MeterProvider(metric_readers=[reader])
        tracers = []
        with caplog.at_level(logging.WARNING):
            for version in ("cal-a", "cal-b"):
                exporter = InMemorySpanExporter()
                processor = AttributionSpanProcessor(
                    SimpleSpanProcessor(exporter),
                    calibration=calibration(version=version),
                    meter_provider=meters,
                    background=False,
                    drift=DriftTracker(min_samples=1, window=3),
                )
                provider = TracerProvider()
                provider.add_span_processor(processor)
                tracers.append(provider)
                otel = SimpleNamespace(tracers=provider, exporter=exporter)
                send(otel, timers={"total": 0.5})
        assert not [r for r in caplog.records if "duplicate" in r.getMessage().lower()]
        otel = SimpleNamespace(reader=reader)
        versions = {
            p.attributes["modtrace.calibration.version"]
            for p in gauges(otel)["modtrace.calibration.drift.median_factor"]
        }
        assert versions == {"cal-a", "cal-b"}
        for provider in tracers:
            provider.shutdown()
        meters.shutdown()
