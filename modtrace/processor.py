"""The attribution span processor: inference span in, enriched span and metrics out.

The SDK freezes a span's attributes before any processor's ``on_end`` sees
it, and hands the same read-only span to every processor in turn, so a
processor cannot add attributes for the ones after it. This one therefore
**owns** the downstream processors: registered once on the provider, it
forwards every span to them, and an inference span as an enriched copy
carrying the attribution results::

    processor = AttributionSpanProcessor(
        BatchSpanProcessor(OTLPSpanExporter()), calibration=load_calibration("cal.json")
    )
    tracer_provider.add_span_processor(processor)

For an inference span it reads the counts and timers (handed over by
:func:`modtrace.spans.inference_span`, or read from ``modtrace.*`` attributes
set by other code), applies the current calibration with reconciliation
(:func:`modtrace.attribute`), prices it when a rate is set, and records the
metrics of :mod:`modtrace.metrics` with the span as exemplar.

By default that work runs on a worker thread: ``span.end()`` only queues
the span (about a microsecond). When the queue is full the span is processed
on the caller's thread instead of dropped: memory stays bounded and no
attribution is lost. ``background=False`` does it all inside ``on_end``.

The enriched copy keeps every modtrace attribute whatever the attribute-count
limit: when the copy would exceed it, the oldest other attributes are dropped
first (and counted in ``dropped_attributes_count``); if modtrace's own
attributes alone exceed it, the copy carries them all.

No failure inside the processor reaches the request: it is recorded on the
span as ``modtrace.error`` and in the ``modtrace.errors`` counter, and the
span is forwarded all the same. ``strict=True`` raises instead (and implies
``background=False``).

Calibration checks, on every span a calibration was applied to (see
``docs/calibration.md``):

* **staleness**: a calibration older than ``calibration_max_age`` (default
  30 days) at the span's end, or measured on another model, profile or
  counter version than the span's, marks the span
  (``modtrace.calibration.stale``, ``modtrace.calibration.stale_reasons``)
  and logs one warning per calibration version;
* **intervals** (off by default; ``intervals=True`` or
  :envvar:`MODTRACE_ATTRIBUTION_INTERVALS`): ``.low`` / ``.high`` bounds on
  the attributed seconds and shares from the weights' standard errors, by the
  delta method;
* **drift**: the reconciliation factor of every request attributed by
  weights feeds a :class:`~modtrace.calibrate.drift.DriftTracker`; when the
  window's median leaves the band (default 0.9 to 1.1) one warning is logged
  (and one info line when it returns), and the gauges
  ``modtrace.calibration.drift.median_factor`` and
  ``modtrace.calibration.drift.state`` follow it at each collection.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
import weakref
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any

from opentelemetry import metrics as otel_metrics
from opentelemetry.context import Context
from opentelemetry.metrics import CallbackOptions, MeterProvider, Observation
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, SpanProcessor

from . import semconv
from ._version import __version__
from .attribution import Attribution, AttributionConfig, attribute
from .calibrate.drift import DriftTracker
from .calibrate.intervals import attribution_intervals
from .calibrate.staleness import DEFAULT_MAX_AGE, StalenessCheck
from .calibration import Calibration
from .cost import Cost, Rate, price
from .environment_variables import (
    MODTRACE_ATTRIBUTION_INTERVALS,
    MODTRACE_CALIBRATION_MAX_AGE_DAYS,
)
from .metrics import Instruments, MetricBatch, instruments_for, measurements, record_now
from .spans.attributes import (
    MAX_ERROR_LENGTH,
    Attributes,
    attribution_attributes,
    cost_attributes,
    is_inference_span,
    short_error,
    timers_from_attributes,
    units_from_attributes,
)
from .spans.inference import SpanInputs, _register_listener, _strict_from_env, _take_inputs
from .timers import GpuTimers
from .units import MODALITIES, UnitCounts

__all__ = ["AttributionSpanProcessor", "EnrichedSpan", "merge_attributes"]

_log = logging.getLogger(__name__)

#: The span attributes that name each modality's counter ``id@version``.
_COUNTER_KEYS: tuple[tuple[str, str], ...] = tuple((m, semconv.unit_counter(m)) for m in MODALITIES)
#: Calibration versions a staleness warning was logged for, per processor, at most.
_WARNED_MAX = 256
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def _intervals_from_env() -> bool:
    raw = os.environ.get(MODTRACE_ATTRIBUTION_INTERVALS, "").strip().lower()
    if raw not in _TRUE + _FALSE:
        msg = f"{MODTRACE_ATTRIBUTION_INTERVALS}={raw!r}: expected true or false"
        raise ValueError(msg)
    return raw in _TRUE


def _max_age_from_env() -> timedelta:
    raw = os.environ.get(MODTRACE_CALIBRATION_MAX_AGE_DAYS, "").strip()
    if not raw:
        return DEFAULT_MAX_AGE
    try:
        days = float(raw)
    except ValueError:
        days = float("nan")
    if not days > 0 or days == float("inf"):
        msg = f"{MODTRACE_CALIBRATION_MAX_AGE_DAYS}={raw!r}: expected a positive number of days"
        raise ValueError(msg)
    return timedelta(days=days)


class _DriftGauges:
    """The drift gauges on one meter provider, observing every live processor's tracker.

    Observable gauges cost nothing per request: the SDK reads the trackers
    when it collects. One pair per provider, whatever the number of
    processors, so that instruments are never registered twice.
    """

    def __init__(self, meter: otel_metrics.Meter) -> None:
        self.trackers: weakref.WeakSet[DriftTracker] = weakref.WeakSet()
        meter.create_observable_gauge(
            semconv.METRIC_DRIFT_MEDIAN_FACTOR,
            callbacks=[self._median],
            unit="1",
            description=(
                "Median reconciliation factor (measured / predicted by weights) of the "
                "recent requests attributed by weights."
            ),
        )
        meter.create_observable_gauge(
            semconv.METRIC_DRIFT_STATE,
            callbacks=[self._state],
            unit="1",
            description="1 while that median is outside the drift band: recalibrate.",
        )

    def _statuses(self) -> Iterable[tuple[Any, dict[str, str]]]:
        for tracker in list(self.trackers):
            status = tracker.status()
            if status is not None:
                yield status, {semconv.CALIBRATION_VERSION: status.calibration_version or ""}

    def _median(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(s.median, labels) for s, labels in self._statuses()]

    def _state(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(int(s.drifting), labels) for s, labels in self._statuses()]


_drift_gauges: weakref.WeakKeyDictionary[object, _DriftGauges] = weakref.WeakKeyDictionary()
_drift_gauges_lock = threading.Lock()


def _watch_drift(provider: MeterProvider | None, tracker: DriftTracker) -> None:
    """Report ``tracker`` through the drift gauges of ``provider`` (the global one when None)."""
    provider = provider or otel_metrics.get_meter_provider()
    with _drift_gauges_lock:
        gauges = _drift_gauges.get(provider)
        if gauges is None:
            gauges = _drift_gauges[provider] = _DriftGauges(
                provider.get_meter("modtrace", __version__)
            )
        gauges.trackers.add(tracker)


class EnrichedSpan(ReadableSpan):
    """An immutable copy of a finished span with other attributes.

    Exported exactly like the SDK's own spans: the OTLP encoders read only
    the public properties.

    Args:
        source: The finished span.
        attributes: The copy's attributes (already within limits).
        dropped_attributes: Attributes lost to the count limit, source's included.
    """

    def __init__(
        self, source: ReadableSpan, attributes: Attributes, dropped_attributes: int
    ) -> None:
        super().__init__(
            name=source.name,
            context=source.context,
            parent=source.parent,
            resource=source.resource,
            attributes=attributes,
            events=source.events,
            links=source.links,
            kind=source.kind,
            status=source.status,
            start_time=source.start_time,
            end_time=source.end_time,
            instrumentation_scope=source.instrumentation_scope,
        )
        self._dropped = (dropped_attributes, source.dropped_events, source.dropped_links)

    @property
    def dropped_attributes(self) -> int:
        """Attributes dropped by the count limit, in the source span and in this copy."""
        return self._dropped[0]

    @property
    def dropped_events(self) -> int:
        """Events the source span dropped."""
        return self._dropped[1]

    @property
    def dropped_links(self) -> int:
        """Links the source span dropped."""
        return self._dropped[2]


def merge_attributes(
    source: Mapping[str, Any], ours: Mapping[str, Any], limit: int | None
) -> tuple[Attributes, int]:
    """The source attributes updated with ``ours``, within ``limit`` keys.

    Keys of ``ours`` are always kept. Past the limit, the oldest other keys
    go first (as the SDK evicts); if ``ours`` alone exceed the limit, all of
    them are kept anyway.

    Returns:
        The merged attributes and how many source keys were dropped.
    """
    merged: Attributes = dict(source)
    merged.update(ours)
    excess = len(merged) - limit if limit is not None else 0
    if excess <= 0:
        return merged, 0
    dropped = 0
    for key in list(merged):
        if dropped == excess:
            break
        if key not in ours:
            del merged[key]
            dropped += 1
    return merged, dropped


class AttributionSpanProcessor(SpanProcessor):
    """Attributes the GPU seconds of inference spans and forwards enriched copies.

    Args:
        *delegates: The processors it owns and forwards to (e.g.
            ``BatchSpanProcessor(OTLPSpanExporter())``). Register only this one
            on the provider.
        calibration: Weights in GPU seconds per unit; replace at run time with
            :attr:`calibration`.
        rate: A hypothetical price of a GPU hour; no cost attributes when ``None``.
        config: Outlier band and other attribution knobs.
        meter_provider: Where metrics are recorded; the global one when ``None``.
        span_limits: The provider's limits, for the enriched copy; default
            :class:`SpanLimits` from the ``OTEL_*`` variables.
        record_metrics: Record the metrics of :mod:`modtrace.metrics`.
        background: Do the attribution on a worker thread (``span.end()`` only
            queues); ``False`` does it inside ``on_end``.
        max_queue_size: Spans queued for the worker before ``on_end`` processes
            inline.
        schedule_delay_millis: The worker's longest wait between batches.
        strict: Raise failures instead of recording them (implies
            ``background=False``); default :envvar:`MODTRACE_STRICT`.
        calibration_max_age: A calibration older than this at a span's end is
            stale; default :envvar:`MODTRACE_CALIBRATION_MAX_AGE_DAYS`, else 30 days.
        intervals: Add ``.low`` / ``.high`` interval attributes from the
            weights' standard errors; default
            :envvar:`MODTRACE_ATTRIBUTION_INTERVALS`, else off.
        interval_confidence: The intervals' two-sided confidence level.
        drift: The drift tracker fed with the reconciliation factor of each
            request attributed by weights: ``True`` for a default
            :class:`~modtrace.calibrate.drift.DriftTracker` (band 0.9 to 1.1,
            window 200, at least 20 requests), a tracker of your own, or
            ``False`` for none.

    Raises:
        ValueError: an invalid option or environment variable.
    """

    def __init__(
        self,
        *delegates: SpanProcessor,
        calibration: Calibration | None = None,
        rate: Rate | None = None,
        config: AttributionConfig | None = None,
        meter_provider: MeterProvider | None = None,
        span_limits: SpanLimits | None = None,
        record_metrics: bool = True,
        background: bool = True,
        max_queue_size: int = 2048,
        schedule_delay_millis: float = 200.0,
        strict: bool | None = None,
        calibration_max_age: timedelta | None = None,
        intervals: bool | None = None,
        interval_confidence: float = 0.95,
        drift: DriftTracker | bool = True,
    ) -> None:
        if max_queue_size < 1:
            msg = f"max_queue_size: must be at least 1, got {max_queue_size}"
            raise ValueError(msg)
        if not 0.0 < interval_confidence < 1.0:
            msg = f"interval_confidence: must be between 0 and 1, got {interval_confidence}"
            raise ValueError(msg)
        self._staleness = StalenessCheck(calibration_max_age or _max_age_from_env())
        self._stale_warned: set[str] = set()
        self._intervals = _intervals_from_env() if intervals is None else intervals
        self._confidence = interval_confidence
        if drift is True:
            drift = DriftTracker()
        self._drift: DriftTracker | None = drift or None
        self._delegates: tuple[SpanProcessor, ...] = tuple(delegates)
        self._calibration = calibration
        self._rate = rate
        self._config = config or AttributionConfig()
        limits = span_limits or SpanLimits()
        self._limit: int | None = limits.max_span_attributes
        self._meter_provider = meter_provider
        self._instruments: Instruments | None = (
            instruments_for(meter_provider) if record_metrics else None
        )
        if record_metrics and self._drift is not None:
            _watch_drift(meter_provider, self._drift)
        self._strict = strict if strict is not None else _strict_from_env()
        self._background = background and not self._strict
        self._max_queue = max_queue_size
        self._wake_at = max(1, min(512, max_queue_size // 4))
        self._delay = schedule_delay_millis / 1000.0
        self._closed = False
        self._queue: collections.deque[tuple[ReadableSpan, SpanInputs | None]] = collections.deque()
        self._drain_lock = threading.Lock()
        self._wake = threading.Event()
        self._worker: threading.Thread | None = None
        if self._background:
            self._start_worker()
            # A forked child has the queue but not the thread: start a fresh one.
            ref = weakref.WeakMethod(self._after_fork)
            os.register_at_fork(after_in_child=lambda: (m := ref()) and m())
        _register_listener(+1)

    # --- configuration -------------------------------------------------------------
    @property
    def calibration(self) -> Calibration | None:
        """The calibration applied to spans that end from now on."""
        return self._calibration

    @calibration.setter
    def calibration(self, value: Calibration | None) -> None:
        # One reference swap: a span sees the old or the new calibration, never a mix.
        self._calibration = value

    @property
    def rate(self) -> Rate | None:
        """The hypothetical GPU-hour price; ``None`` for no cost attributes."""
        return self._rate

    @rate.setter
    def rate(self, value: Rate | None) -> None:
        self._rate = value

    @property
    def drift(self) -> DriftTracker | None:
        """The drift tracker (``status()`` gives the current median), or ``None``."""
        return self._drift

    @property
    def calibration_max_age(self) -> timedelta:
        """The age past which a calibration is stale."""
        return self._staleness.max_age

    @property
    def delegates(self) -> tuple[SpanProcessor, ...]:
        """The processors spans are forwarded to."""
        return self._delegates

    def add_delegate(self, processor: SpanProcessor) -> None:
        """Forward spans to ``processor`` too, from now on."""
        self._delegates = (*self._delegates, processor)

    # --- SpanProcessor --------------------------------------------------------------
    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        """Forward to the delegates."""
        for delegate in self._delegates:
            try:
                delegate.on_start(span, parent_context=parent_context)
            except Exception:
                if self._strict:
                    raise
                _log.exception("span processor %r failed in on_start", delegate)

    def _on_ending(self, span: Span) -> None:
        # The SDK's private hook (``Span.end`` calls it before ``on_end``): pass it on.
        for delegate in self._delegates:
            hook = getattr(delegate, "_on_ending", None)
            if hook is not None:
                try:
                    hook(span)
                except Exception:
                    _log.exception("span processor %r failed in _on_ending", delegate)

    def on_end(self, span: ReadableSpan) -> None:
        """Queue an inference span for attribution; forward any other span as it is.

        Forwarded unchanged: spans marked ``modtrace.attribution.skip``, and
        spans with neither unit counts nor GPU timers (a health probe that
        went through an inference span has nothing to attribute).
        """
        ctx = span.context
        inputs = _take_inputs((ctx.trace_id, ctx.span_id)) if ctx is not None else None
        skip = span.attributes.get(semconv.ATTRIBUTION_SKIP) is True
        if (
            inputs is not None
            and inputs.units is None
            and inputs.timers is None
            and not is_inference_span(span.attributes)
        ):
            skip = True
        if skip or (inputs is None and not is_inference_span(span.attributes)):
            self._forward(span)
            return
        if self._background and not self._closed and len(self._queue) < self._max_queue:
            self._queue.append((span, inputs))
            if len(self._queue) == self._wake_at:
                self._wake.set()
            return
        # Inline: background off, shut down, or the queue is full (bounded memory,
        # and no attribution lost).
        self._process(span, inputs, None)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Attribute every queued span, then flush the delegates."""
        self._drain()
        ok = True
        for delegate in self._delegates:
            try:
                ok = delegate.force_flush(timeout_millis) and ok
            except Exception:
                _log.exception("span processor %r failed in force_flush", delegate)
                ok = False
        return ok

    def shutdown(self) -> None:
        """Attribute what is queued, stop the worker, shut the delegates down."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        worker = self._worker
        if worker is not None and worker is not threading.current_thread():
            worker.join(timeout=5.0)
        self._drain()
        _register_listener(-1)
        for delegate in self._delegates:
            try:
                delegate.shutdown()
            except Exception:
                _log.exception("span processor %r failed in shutdown", delegate)

    # --- the work ------------------------------------------------------------------
    def _start_worker(self) -> None:
        self._worker = threading.Thread(target=self._run, name="ModtraceAttribution", daemon=True)
        self._worker.start()

    def _after_fork(self) -> None:
        self._drain_lock = threading.Lock()
        self._wake = threading.Event()
        self._queue.clear()
        if self._background and not self._closed:
            self._start_worker()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._delay)
            self._wake.clear()
            try:
                self._drain()
            except Exception:  # keep the worker alive whatever happens
                _log.exception("modtrace attribution worker failed")

    def _drain(self) -> None:
        # One drainer at a time, so that force_flush returns only after the
        # worker's batch in flight was forwarded.
        with self._drain_lock:
            batch = MetricBatch() if self._instruments is not None else None
            queue = self._queue
            while queue:
                try:
                    span, inputs = queue.popleft()
                except IndexError:
                    break
                self._process(span, inputs, batch)
            if batch is not None and self._instruments is not None:
                try:
                    batch.record(self._instruments)
                except Exception:
                    _log.exception("modtrace metrics failed")

    def _forward(self, span: ReadableSpan) -> None:
        for delegate in self._delegates:
            try:
                delegate.on_end(span)
            except Exception:
                if self._strict:
                    raise
                _log.exception("span processor %r failed in on_end", delegate)

    def _fail(self, errors: list[str], stage: str, exc: BaseException) -> None:
        if self._strict:
            raise exc
        errors.append(short_error(stage, exc))
        if self._instruments is not None:
            try:
                self._instruments.record_error(stage, Context())
            except Exception:
                _log.exception("modtrace error counter failed")

    def _process(
        self, span: ReadableSpan, inputs: SpanInputs | None, batch: MetricBatch | None
    ) -> None:
        """Attribute one inference span, forward the enriched copy, record its metrics."""
        try:
            out, items = self._enrich(span, inputs)
        except Exception:
            if self._strict:
                raise
            _log.exception("modtrace could not enrich span %s", span.name)
            out, items = span, []
        self._forward(out)
        if not items or self._instruments is None or span.context is None:
            return
        try:
            if batch is None:
                record_now(self._instruments, items, span.context)
            else:
                batch.add(items, span.context)
        except Exception:
            if self._strict:
                raise
            _log.exception("modtrace metrics failed")

    def _enrich(
        self, span: ReadableSpan, inputs: SpanInputs | None
    ) -> tuple[ReadableSpan, list[Any]]:
        errors: list[str] = []
        source = span.attributes or {}
        if inputs is not None:
            units, timers, ours, model = (
                inputs.units,
                inputs.timers,
                dict(inputs.attributes),
                inputs.model,
            )
        else:
            # A span set up by other code: read the inputs from its attributes.
            units = timers = None
            bad: list[str] = []
            try:
                units = units_from_attributes(source, errors=bad)
                timers = timers_from_attributes(source, errors=bad)
            except Exception as exc:
                self._fail(errors, "attributes", exc)
            for reason in bad:
                self._fail(errors, "attributes", ValueError(reason))
            ours = {}
            found = source.get(semconv.GEN_AI_REQUEST_MODEL)
            model = found if isinstance(found, str) else None

        attribution: Attribution | None = None
        cost: Cost | None = None
        calibration, rate = self._calibration, self._rate
        try:
            attribution = attribute(
                units if units is not None else UnitCounts({}),
                timers,
                calibration,
                config=self._config,
            )
            ours.update(attribution_attributes(attribution))
        except Exception as exc:
            self._fail(errors, "attribute", exc)
        if attribution is not None and rate is not None:
            try:
                cost = price(attribution.gpu_seconds, rate)
                ours.update(cost_attributes(cost))
            except Exception as exc:
                self._fail(errors, "cost", exc)
        if attribution is not None and calibration is not None:
            try:
                self._check_calibration(span, source, ours, calibration, attribution, model)
            except Exception as exc:
                self._fail(errors, "calibration", exc)
            if self._intervals:
                try:
                    ours.update(self._interval_attributes(units, timers, attribution, calibration))
                except Exception as exc:
                    self._fail(errors, "intervals", exc)
        if errors:
            earlier = ours.get(semconv.ERROR, source.get(semconv.ERROR))
            message = "; ".join([earlier, *errors] if isinstance(earlier, str) else errors)
            if len(message) > MAX_ERROR_LENGTH:
                message = message[: MAX_ERROR_LENGTH - 1] + "…"
            ours[semconv.ERROR] = message

        merged, dropped_now = merge_attributes(source, ours, self._limit)
        dropped = span.dropped_attributes
        if dropped and inputs is not None:
            # Inputs the SDK evicted from the source and the copy put back are not lost.
            restored = sum(1 for key in inputs.attributes if key not in source)
            dropped = max(dropped - restored, 0)
        dropped += dropped_now
        items = (
            measurements(model=model, units=units, attribution=attribution, cost=cost)
            if self._instruments is not None
            else []
        )
        return EnrichedSpan(span, merged, dropped), items

    # --- calibration checks -------------------------------------------------------------
    def _check_calibration(
        self,
        span: ReadableSpan,
        source: Mapping[str, Any],
        ours: dict[str, Any],
        calibration: Calibration,
        attribution: Attribution,
        model: str | None,
    ) -> None:
        """Mark the span when the calibration is stale for it; feed the drift tracker."""

        def read(key: str) -> Any:
            found = ours.get(key)
            return source.get(key) if found is None else found

        profile = read(semconv.UNITS_PROFILE)
        counters = tuple(
            (m, ref) for m, key in _COUNTER_KEYS if isinstance(ref := read(key), str) and ref
        )
        reasons = self._staleness.reasons(
            calibration,
            at_ns=span.end_time or time.time_ns(),
            model=model,
            preprocessor=profile if isinstance(profile, str) else None,
            counters=counters,
        )
        if reasons:
            # Only stale spans are marked: a fresh one carries nothing more.
            ours[semconv.CALIBRATION_STALE] = True
            ours[semconv.CALIBRATION_STALE_REASONS] = list(reasons)
            version = calibration.version
            if version not in self._stale_warned:
                if len(self._stale_warned) >= _WARNED_MAX:
                    self._stale_warned.clear()
                self._stale_warned.add(version)
                _log.warning("modtrace: stale calibration: %s", "; ".join(reasons))
        drift = self._drift
        if (
            drift is not None
            and attribution.method == "weights"
            and attribution.reconciled
            and attribution.predicted_gpu_seconds > 0
        ):
            # Only a weights-attributed request says how well the weights predict the
            # engine; a component split's factor measures the timers' coverage instead.
            signal = drift.observe(
                attribution.factor, calibration_version=attribution.calibration_version
            )
            if signal is not None:
                _log.log(logging.WARNING if signal.drifting else logging.INFO, signal.message)

    def _interval_attributes(
        self,
        units: UnitCounts | None,
        timers: GpuTimers | None,
        attribution: Attribution,
        calibration: Calibration,
    ) -> Attributes:
        """``.low`` / ``.high`` bounds of the attributed seconds and shares (delta method)."""
        if attribution.method == "mixed":
            # Only Monte Carlo handles a split that fell back to weights, too slow per span.
            return {}
        found = attribution_intervals(
            units if units is not None else UnitCounts({}),
            timers,
            calibration,
            attribution=attribution,
            confidence=self._confidence,
            method="delta",
        )
        out: Attributes = {
            semconv.ATTRIBUTED_INTERVAL_CONFIDENCE: found.confidence,
            semconv.ATTRIBUTED_INTERVAL_METHOD: found.method,
        }
        for modality, (low, high) in found.gpu_seconds.items():
            out[semconv.attributed_gpu_seconds_bound(modality, "low")] = low
            out[semconv.attributed_gpu_seconds_bound(modality, "high")] = high
        for modality, (low, high) in found.share.items():
            out[semconv.attributed_share_bound(modality, "low")] = low
            out[semconv.attributed_share_bound(modality, "high")] = high
        return out
