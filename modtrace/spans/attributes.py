"""Counts, timers and results as span attributes, and back.

Pure functions, no OpenTelemetry state: the inference span writes the
inputs with them, the attribution processor reads the inputs back and writes
the results, and reports read finished spans from a file with them.

Attribute types are fixed per name so that backends see one type per key:
unit counts are ``int`` (``double`` for ``*.seconds`` units, and for a count
that a counter made fractional), seconds are ``double``, flags ``bool``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from .. import semconv
from ..attribution import Attribution
from ..cost import Cost
from ..counting.result import RequestCount
from ..errors import one_line
from ..timers import COMPONENTS, GpuTimers
from ..units import MODALITIES, UNIT_NAMES, UNKNOWN, UnitCounts, check_number

__all__ = [
    "AttributeValue",
    "Attributes",
    "Counts",
    "Timers",
    "attributed_from_attributes",
    "attribution_attributes",
    "cost_attributes",
    "cost_from_attributes",
    "count_attributes",
    "genai_request_attributes",
    "genai_usage_attributes",
    "is_inference_span",
    "short_error",
    "timer_attributes",
    "timers_from_attributes",
    "to_timers",
    "to_units",
    "units_attributes",
    "units_from_attributes",
]

AttributeValue = str | bool | int | float
Attributes = dict[str, AttributeValue]
#: What the span API accepts as counts.
Counts = RequestCount | UnitCounts | Mapping[str, float]
#: What the span API accepts as timers.
Timers = GpuTimers | Mapping[str, object]

#: Longest ``modtrace.error`` / ``modtrace.units.error`` value: a reason, not a log.
MAX_ERROR_LENGTH = 200

# Key tables built once: the span path runs per request.
_UNIT_KEYS: dict[str, str] = {u: semconv.unit(u) for u in UNIT_NAMES}
_KEY_UNITS: dict[str, str] = {k: u for u, k in _UNIT_KEYS.items()}
_SECONDS_UNITS = frozenset(u for u in UNIT_NAMES if u.endswith(".seconds"))
_UNIT_PARTS: dict[str, tuple[str, bool]] = {
    u: (u.partition(".")[0], u.endswith(".tokens")) for u in UNIT_NAMES
}
_TOKEN_UNITS: dict[str, str] = {m: f"{m}.tokens" for m in MODALITIES}
_GENAI_TOKEN_KEYS: dict[str, str] = {m: semconv.gen_ai_usage_input_tokens(m) for m in MODALITIES}
_COMPONENT_KEYS: dict[str, str] = {c: semconv.gpu_seconds_component(c) for c in COMPONENTS}
_RESULT_MODALITIES: tuple[str, ...] = (*MODALITIES, UNKNOWN)
_ATTRIBUTED_KEYS: dict[str, str] = {
    m: semconv.attributed_gpu_seconds(m) for m in _RESULT_MODALITIES
}
_SHARE_KEYS: dict[str, str] = {m: semconv.attributed_share(m) for m in _RESULT_MODALITIES}
_COST_KEYS: dict[str, str] = {m: semconv.cost_usd(m) for m in _RESULT_MODALITIES}
_COUNTER_KEYS: dict[str, str] = {m: semconv.unit_counter(m) for m in MODALITIES}
_DEFAULTED_KEYS: dict[str, str] = {m: semconv.unit_defaulted(m) for m in MODALITIES}
_INPUT_MARKERS = frozenset((*_KEY_UNITS, semconv.GPU_SECONDS, *_COMPONENT_KEYS.values()))


def short_error(stage: str, exc: BaseException | str) -> str:
    """One line ``"<stage>: <reason>"``, cut to :data:`MAX_ERROR_LENGTH` characters."""
    reason = exc if isinstance(exc, str) else one_line(exc) or type(exc).__name__
    text = f"{stage}: {reason}"
    return text if len(text) <= MAX_ERROR_LENGTH else text[: MAX_ERROR_LENGTH - 1] + "…"


# --- Inputs: objects -> attributes ------------------------------------------------
def to_units(counts: Counts) -> tuple[UnitCounts, RequestCount | None]:
    """Validate ``counts`` into :class:`UnitCounts`, keeping the :class:`RequestCount` if any.

    Raises:
        ValueError: an unknown unit name, or a negative, NaN or non-number count.
    """
    if isinstance(counts, RequestCount):
        return counts.units, counts
    if isinstance(counts, UnitCounts):
        return counts, None
    return UnitCounts(counts), None


def to_timers(timers: Timers) -> GpuTimers:
    """Validate ``timers`` into :class:`GpuTimers`.

    Raises:
        ValueError: a negative, NaN or non-number timer, an unknown key, or a
            GPU count below 1.
    """
    return timers if isinstance(timers, GpuTimers) else GpuTimers.model_validate(timers)


def units_attributes(units: UnitCounts) -> Attributes:
    """``modtrace.units.<modality>.<unit>`` for every unit in ``units``.

    Counts are whole numbers except seconds; a fractional count is kept as it
    is rather than rounded.
    """
    return {
        _UNIT_KEYS[u]: c if u in _SECONDS_UNITS or not c.is_integer() else int(c)
        for u, c in units.root.items()
    }


def count_attributes(counts: Counts) -> Attributes:
    """Raw-count attributes of ready counts or of a counted request.

    A :class:`RequestCount` adds the profile, each modality's counter
    (``id@version``) and defaulted flag, and the number of items that could
    not be counted with the first reason.

    Raises:
        ValueError: the counts do not validate (see :func:`to_units`).
    """
    units, request = to_units(counts)
    attrs = units_attributes(units)
    if request is None:
        return attrs
    attrs[semconv.UNITS_PROFILE] = request.profile
    for modality, ref in request.counters.items():
        if modality in _COUNTER_KEYS:
            attrs[_COUNTER_KEYS[modality]] = ref
    for modality, defaulted in request.defaulted.items():
        if modality in _DEFAULTED_KEYS:
            attrs[_DEFAULTED_KEYS[modality]] = bool(defaulted)
    if request.errors:
        attrs[semconv.UNITS_ERRORS] = len(request.errors)
        attrs[semconv.UNITS_ERROR] = short_error("count", request.errors[0])
    return attrs


def genai_request_attributes(
    *,
    operation: str,
    model: str | None,
    provider: str | None,
    convention: str = semconv.GENAI_SEMCONV_DEVELOPMENT,
) -> Attributes:
    """The GenAI attributes known when the request starts.

    Args:
        operation: ``gen_ai.operation.name`` (``chat``, ``text_completion``...).
        model: ``gen_ai.request.model``; omitted when ``None``.
        provider: ``gen_ai.provider.name`` (``gen_ai.system`` for ``v1.36``).
        convention: One of :data:`modtrace.semconv.GENAI_SEMCONV_VERSIONS`.
    """
    if convention == semconv.GENAI_SEMCONV_NONE:
        return {}
    attrs: Attributes = {semconv.GEN_AI_OPERATION_NAME: operation}
    if model:
        attrs[semconv.GEN_AI_REQUEST_MODEL] = model
    if provider:
        key = (
            semconv.GEN_AI_SYSTEM
            if convention == semconv.GENAI_SEMCONV_LEGACY
            else semconv.GEN_AI_PROVIDER_NAME
        )
        attrs[key] = provider
    return attrs


def genai_usage_attributes(
    units: UnitCounts, convention: str = semconv.GENAI_SEMCONV_DEVELOPMENT
) -> Attributes:
    """``gen_ai.usage.*input_tokens`` from the counts that are tokens.

    ``development`` sets ``gen_ai.usage.<modality>.input_tokens`` for every
    modality with a token count; both conventions set
    ``gen_ai.usage.input_tokens`` when every modality present has one (a total
    that left a modality out would be wrong).
    """
    if convention == semconv.GENAI_SEMCONV_NONE:
        return {}
    tokens: dict[str, int] = {}
    counted: set[str] = set()
    for unit, count in units.root.items():
        modality, is_tokens = _UNIT_PARTS[unit]
        if is_tokens:
            tokens[modality] = int(count)
        elif count > 0:
            counted.add(modality)
    attrs: Attributes = {}
    if convention == semconv.GENAI_SEMCONV_DEVELOPMENT:
        attrs = {_GENAI_TOKEN_KEYS[m]: n for m, n in tokens.items()}
    if tokens and counted.issubset(tokens):
        attrs[semconv.GEN_AI_USAGE_INPUT_TOKENS] = sum(tokens.values())
    return attrs


def timer_attributes(timers: GpuTimers) -> Attributes:
    """``modtrace.gpu.*``: the measured total, component timers, GPU count and source."""
    attrs: Attributes = {}
    if timers.total is not None:
        attrs[semconv.GPU_SECONDS] = timers.total
    for name, key in _COMPONENT_KEYS.items():
        value = getattr(timers, name)
        if value is not None:
            attrs[key] = value
    attrs[semconv.GPU_COUNT] = timers.gpu_count
    attrs[semconv.GPU_SOURCE] = timers.source
    return attrs


# --- Results: objects -> attributes -------------------------------------------------
def attribution_attributes(attribution: Attribution) -> Attributes:
    """``modtrace.attributed.*``, ``modtrace.reconcile.*`` and the calibration version."""
    attrs: Attributes = {
        semconv.ATTRIBUTED_METHOD: attribution.method,
        semconv.RECONCILE_FACTOR: attribution.factor,
        semconv.RECONCILE_OUTLIER: attribution.outlier,
    }
    for modality, seconds in attribution.gpu_seconds.items():
        attrs[_ATTRIBUTED_KEYS[modality]] = seconds
    for modality, share in attribution.share.items():
        attrs[_SHARE_KEYS[modality]] = share
    if attribution.calibration_version is not None:
        attrs[semconv.CALIBRATION_VERSION] = attribution.calibration_version
    return attrs


def cost_attributes(cost: Cost) -> Attributes:
    """``modtrace.cost.*``: hypothetical dollars per modality, total, rate and its id."""
    attrs: Attributes = {_COST_KEYS[m]: usd for m, usd in cost.usd.items()}
    attrs[semconv.COST_USD_TOTAL] = cost.usd_total
    attrs[semconv.COST_USD_PER_GPU_HOUR] = cost.usd_per_gpu_hour
    attrs[semconv.COST_RATE_ID] = cost.rate_id
    attrs[semconv.COST_HYPOTHETICAL] = cost.hypothetical
    return attrs


# --- Attributes -> objects -------------------------------------------------------------
def is_inference_span(attributes: Mapping[str, object]) -> bool:
    """Whether ``attributes`` carry modtrace inputs (a unit count or a GPU timer)."""
    return not _INPUT_MARKERS.isdisjoint(attributes)


def _number(key: str, value: object, errors: list[str] | None) -> float | None:
    try:
        return check_number(key, value)
    except ValueError as exc:
        if errors is None:
            raise
        errors.append(one_line(exc))
        return None


def units_from_attributes(
    attributes: Mapping[str, object], *, errors: list[str] | None = None
) -> UnitCounts:
    """The unit counts carried by ``modtrace.units.<modality>.<unit>`` attributes.

    Args:
        attributes: A span's attributes.
        errors: When given, a bad value is skipped and its reason appended here
            (the other counts still land); otherwise it raises.

    Raises:
        ValueError: a count is negative, NaN or not a number (without ``errors``).
    """
    counts: dict[str, float] = {}
    for key, value in attributes.items():
        unit = _KEY_UNITS.get(key)
        if unit is not None:
            number = _number(key, value, errors)
            if number is not None:
                counts[unit] = number
    return UnitCounts(counts)


def timers_from_attributes(
    attributes: Mapping[str, object], *, errors: list[str] | None = None
) -> GpuTimers | None:
    """The GPU timers carried by ``modtrace.gpu.*`` attributes, or ``None`` if there are none.

    Args:
        attributes: A span's attributes.
        errors: When given, a bad value is skipped and its reason appended here;
            otherwise it raises.

    Raises:
        ValueError: a timer is negative, NaN or not a number, or the GPU count
            is not a whole number of at least 1 (without ``errors``).
    """
    fields: dict[str, object] = {}
    total = attributes.get(semconv.GPU_SECONDS)
    if total is not None:
        fields["total"] = _number(semconv.GPU_SECONDS, total, errors)
    for name, key in _COMPONENT_KEYS.items():
        value = attributes.get(key)
        if value is not None:
            fields[name] = _number(key, value, errors)
    fields = {k: v for k, v in fields.items() if v is not None}
    if not fields:
        return None
    count = attributes.get(semconv.GPU_COUNT)
    if count is not None:
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            msg = f"{semconv.GPU_COUNT}: expected a whole number of at least 1, got {count!r}"
            if errors is None:
                raise ValueError(msg)
            errors.append(msg)
        else:
            fields["gpu_count"] = count
    source = attributes.get(semconv.GPU_SOURCE)
    if isinstance(source, str):
        fields["source"] = source
    return GpuTimers(**fields)  # type: ignore[arg-type]


def _per_modality(attributes: Mapping[str, object], keys: Mapping[str, str]) -> dict[str, float]:
    out = {}
    for modality, key in keys.items():
        value = attributes.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[modality] = float(value)
    return out


def attributed_from_attributes(attributes: Mapping[str, object]) -> dict[str, float]:
    """GPU seconds attributed per modality (``unknown`` included), read from a finished span."""
    return _per_modality(attributes, _ATTRIBUTED_KEYS)


def cost_from_attributes(attributes: Mapping[str, object]) -> dict[str, float]:
    """Hypothetical dollars per modality, read from a finished span."""
    return _per_modality(attributes, _COST_KEYS)
