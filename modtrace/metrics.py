"""The OpenTelemetry metrics modtrace records, next to the spans.

The attribution span processor records them from the same numbers it puts
on the span, so spans and metrics cannot disagree:

* ``modtrace.attributed.gpu_seconds`` (counter, ``s``) and
  ``modtrace.attributed.cost`` (counter, ``{USD}``, hypothetical) per modality;
* ``modtrace.units.<kind>`` (counters: ``tokens``, ``count``, ``pixels``,
  ``tiles``, ``frames``, ``seconds``) per modality: one instrument per kind
  of unit so that each has one unit;
* ``modtrace.reconcile.factor`` (histogram) per request that was reconciled;
* ``modtrace.errors`` (counter) per failure inside modtrace, by stage.

Labels are the modality, ``gen_ai.request.model`` and the calibration
version (the cost adds the rate id). Measurements carry the inference span
as their context, so exemplars point at it (``on_end`` runs after the span
was detached, so the current span would be its parent).

Under load, :class:`MetricBatch` sums the counters of many requests per
series before recording them: one ``add`` per series per batch instead of
one per request and unit, and the last request of each series still
carries its exact value as the exemplar.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

from opentelemetry import metrics, trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan, SpanContext

from . import semconv
from ._version import __version__
from .attribution import Attribution
from .cost import Cost
from .units import UNIT_NAMES, UnitCounts

__all__ = [
    "FACTOR_BUCKETS",
    "Instruments",
    "Measurement",
    "MetricBatch",
    "instruments_for",
    "measurements",
    "record_now",
    "span_context",
]

#: Histogram buckets of the reconciliation factor: dense around 1, where a good
#: calibration keeps it.
FACTOR_BUCKETS: tuple[float, ...] = (
    0.25,
    0.5,
    0.67,
    0.8,
    0.9,
    0.95,
    1.0,
    1.05,
    1.1,
    1.25,
    1.5,
    2.0,
    4.0,
)

_UNIT_OF_KIND = {
    "tokens": "{token}",
    "count": "{item}",
    "pixels": "{pixel}",
    "tiles": "{tile}",
    "frames": "{frame}",
    "seconds": "s",
}

#: ``(instrument, value, labels)``; the instrument is an :class:`Instruments` slot name
#: or ``units.<kind>``; labels are sorted ``(name, value)`` pairs so they hash.
Measurement = tuple[str, float, tuple[tuple[str, str], ...]]


class Instruments:
    """modtrace's instruments on one meter.

    Args:
        meter: The meter to create them on.
    """

    __slots__ = ("cost", "errors", "gpu_seconds", "reconcile_factor", "units")

    def __init__(self, meter: metrics.Meter) -> None:
        self.gpu_seconds = meter.create_counter(
            semconv.METRIC_ATTRIBUTED_GPU_SECONDS,
            unit="s",
            description="GPU seconds attributed to a modality of the requests.",
        )
        self.cost = meter.create_counter(
            semconv.METRIC_ATTRIBUTED_USD,
            unit="{USD}",
            description="Hypothetical US dollars attributed to a modality (a planning rate).",
        )
        self.units = {
            kind: meter.create_counter(
                semconv.metric_units(kind),
                unit=unit,
                description=f"Preprocessed input units ({kind}) of the requests, per modality.",
            )
            for kind, unit in _UNIT_OF_KIND.items()
        }
        self.reconcile_factor = meter.create_histogram(
            semconv.METRIC_RECONCILE_FACTOR,
            unit="1",
            description="Measured over predicted GPU seconds of each reconciled request.",
            explicit_bucket_boundaries_advisory=list(FACTOR_BUCKETS),
        )
        self.errors = meter.create_counter(
            semconv.METRIC_ERRORS,
            unit="{error}",
            description="Failures inside modtrace, by stage; the request itself went on.",
        )

    def record_error(self, stage: str, context: Context | None = None) -> None:
        """Count one failure inside modtrace at ``stage`` (``count``, ``timers``, ...)."""
        self.errors.add(1, {semconv.LABEL_ERROR_STAGE: stage}, context=context)

    def record(self, measurement: Measurement, context: Context | None = None) -> None:
        """Record one measurement, with ``context`` as the exemplar's span."""
        name, value, labels = measurement
        attributes = dict(labels)
        if name == "reconcile_factor":
            self.reconcile_factor.record(value, attributes, context=context)
        elif name == "gpu_seconds":
            self.gpu_seconds.add(value, attributes, context=context)
        elif name == "cost":
            self.cost.add(value, attributes, context=context)
        else:
            self.units[name.partition(".")[2]].add(value, attributes, context=context)


_cache: weakref.WeakKeyDictionary[object, Instruments] = weakref.WeakKeyDictionary()


def instruments_for(meter_provider: metrics.MeterProvider | None = None) -> Instruments:
    """The instruments on ``meter_provider`` (the global one when ``None``), created once."""
    provider = meter_provider or metrics.get_meter_provider()
    found = _cache.get(provider)
    if found is None:
        found = Instruments(provider.get_meter("modtrace", __version__))
        _cache[provider] = found
    return found


def span_context(ctx: SpanContext) -> Context:
    """A context whose current span is ``ctx``: the exemplar points at that span."""
    return trace.set_span_in_context(NonRecordingSpan(ctx))


# unit name -> (instrument, modality): "image.tiles" -> ("units.tiles", "image")
_UNIT_INSTRUMENTS: dict[str, tuple[str, str]] = {
    u: ("units." + u.partition(".")[2], u.partition(".")[0]) for u in UNIT_NAMES
}


def measurements(
    *,
    model: str | None,
    units: UnitCounts | None = None,
    attribution: Attribution | None = None,
    cost: Cost | None = None,
) -> list[Measurement]:
    """The measurements of one request: units, attributed seconds, cost, factor.

    Args:
        model: ``gen_ai.request.model`` (``""`` when unknown).
        units: The request's unit counts (zero counts are skipped).
        attribution: The attribution; its calibration version labels the results.
        cost: The hypothetical cost; its rate id labels the cost.
    """
    model = model or ""
    out: list[Measurement] = []
    if units is not None:
        for unit, count in units.root.items():
            if count > 0:
                name, modality = _UNIT_INSTRUMENTS[unit]
                out.append((name, count, _labels(model, modality)))
    if attribution is None:
        return out
    version = attribution.calibration_version or ""
    for modality, seconds in attribution.gpu_seconds.items():
        out.append(("gpu_seconds", seconds, _labels(model, modality, version)))
    if cost is not None:
        for modality, usd in cost.usd.items():
            out.append(("cost", usd, _labels(model, modality, version, cost.rate_id)))
    if attribution.reconciled and attribution.predicted_gpu_seconds > 0:
        out.append(("reconcile_factor", attribution.factor, _labels(model, None, version)))
    return out


_LABEL_CACHE: dict[tuple[str, str | None, str | None, str | None], tuple[tuple[str, str], ...]] = {}


def _labels(
    model: str, modality: str | None, version: str | None = None, rate_id: str | None = None
) -> tuple[tuple[str, str], ...]:
    """The label pairs of one series, built once (the same few series recur per request)."""
    key = (model, modality, version, rate_id)
    found = _LABEL_CACHE.get(key)
    if found is None:
        pairs = [(semconv.LABEL_MODEL, model)]
        if modality is not None:
            pairs.append((semconv.LABEL_MODALITY, modality))
        if version is not None:
            pairs.append((semconv.CALIBRATION_VERSION, version))
        if rate_id is not None:
            pairs.append((semconv.COST_RATE_ID, rate_id))
        if len(_LABEL_CACHE) > 4096:  # many models or versions: start over, stay bounded
            _LABEL_CACHE.clear()
        found = _LABEL_CACHE[key] = tuple(pairs)
    return found


@dataclass
class MetricBatch:
    """Measurements of many requests, summed per series before they are recorded.

    Counters are summed per ``(instrument, labels)``; the last request of
    each series is recorded on its own, with its span as the exemplar
    context, so an exemplar carries one real request's value. Histogram
    values are recorded one by one (a distribution cannot be pre-summed).
    """

    _sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = field(default_factory=dict)
    _last: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, SpanContext]] = field(
        default_factory=dict
    )
    _points: list[tuple[Measurement, SpanContext]] = field(default_factory=list)

    def add(self, items: list[Measurement], ctx: SpanContext) -> None:
        """Add one request's measurements, made under span ``ctx``."""
        sums, last = self._sums, self._last
        for item in items:
            name, value, labels = item
            if name == "reconcile_factor":
                self._points.append((item, ctx))
                continue
            key = (name, labels)
            previous = last.get(key)
            if previous is not None:
                sums[key] = sums.get(key, 0.0) + previous[0]
            last[key] = (value, ctx)

    def record(self, instruments: Instruments) -> None:
        """Record everything added, then forget it."""
        for (name, labels), total in self._sums.items():
            # No context: the sum of many requests must not become an exemplar.
            instruments.record((name, total, labels), Context())
        for (name, labels), (value, ctx) in self._last.items():
            instruments.record((name, value, labels), span_context(ctx))
        for item, ctx in self._points:
            instruments.record(item, span_context(ctx))
        self._sums.clear()
        self._last.clear()
        self._points.clear()


def record_now(instruments: Instruments, items: list[Measurement], ctx: SpanContext) -> None:
    """Record one request's measurements right away, with its span as exemplar context."""
    context = span_context(ctx)
    for item in items:
        instruments.record(item, context)
