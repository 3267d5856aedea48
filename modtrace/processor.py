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
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from opentelemetry.context import Context
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanLimits, SpanProcessor

from . import semconv
from .attribution import Attribution, AttributionConfig, attribute
from .calibration import Calibration
from .cost import Cost, Rate, price
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
from .units import UnitCounts

__all__ = ["AttributionSpanProcessor", "EnrichedSpan", "merge_attributes"]

_log = logging.getLogger(__name__)


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
    ) -> None:
        if max_queue_size < 1:
            msg = f"max_queue_size: must be at least 1, got {max_queue_size}"
            raise ValueError(msg)
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
        """Queue an inference span for attribution; forward any other span as it is."""
        ctx = span.context
        inputs = _take_inputs((ctx.trace_id, ctx.span_id)) if ctx is not None else None
        if inputs is None and not is_inference_span(span.attributes):
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
