"""Every attribute and metric name modtrace emits, in one place.

Names are documented in ``docs/attributes.md``. Functions build the
per-modality and per-unit names so that no module spells them inline.
"""

from __future__ import annotations

from functools import cache

__all__ = [
    "ATTRIBUTED_METHOD",
    "CALIBRATION_VERSION",
    "COST_HYPOTHETICAL",
    "COST_RATE_ID",
    "COST_USD_PER_GPU_HOUR",
    "COST_USD_TOTAL",
    "ERROR",
    "ERROR_TYPE",
    "GENAI_SEMCONV_DEVELOPMENT",
    "GENAI_SEMCONV_LEGACY",
    "GENAI_SEMCONV_NONE",
    "GENAI_SEMCONV_VERSIONS",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_PROVIDER_NAME",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_SYSTEM",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GPU_COUNT",
    "GPU_SECONDS",
    "GPU_SOURCE",
    "LABEL_ERROR_STAGE",
    "LABEL_MODALITY",
    "LABEL_MODEL",
    "METRIC_ATTRIBUTED_GPU_SECONDS",
    "METRIC_ATTRIBUTED_USD",
    "METRIC_ERRORS",
    "METRIC_RECONCILE_FACTOR",
    "METRIC_UNITS",
    "METRIC_UNIT_KINDS",
    "RECONCILE_FACTOR",
    "RECONCILE_OUTLIER",
    "UNITS_ERROR",
    "UNITS_ERRORS",
    "UNITS_PROFILE",
    "attributed_gpu_seconds",
    "attributed_share",
    "cost_usd",
    "gen_ai_usage_input_tokens",
    "gpu_seconds_component",
    "metric_units",
    "unit",
    "unit_counter",
    "unit_defaulted",
]

# --- Raw counts (set by the instrumentation) -------------------------------
UNITS_PREFIX = "modtrace.units."
UNITS_PROFILE = "modtrace.units.profile"
#: How many content items or parts could not be counted (their units are missing).
UNITS_ERRORS = "modtrace.units.errors"
#: The first reason an item could not be counted, one line.
UNITS_ERROR = "modtrace.units.error"


@cache
def unit(name: str) -> str:
    """``image.tokens`` -> ``modtrace.units.image.tokens``."""
    return UNITS_PREFIX + name


@cache
def unit_counter(modality: str) -> str:
    """The ``id@version`` of the counter that produced a modality's units."""
    return f"{UNITS_PREFIX}{modality}.counter"


@cache
def unit_defaulted(modality: str) -> str:
    """True when some item of the modality was counted from configured defaults."""
    return f"{UNITS_PREFIX}{modality}.defaulted"


# --- GPU timers --------------------------------------------------------------
GPU_SECONDS = "modtrace.gpu.seconds"
GPU_COUNT = "modtrace.gpu.count"
GPU_SOURCE = "modtrace.gpu.source"


@cache
def gpu_seconds_component(component: str) -> str:
    """``prefill`` -> ``modtrace.gpu.seconds.prefill``."""
    return f"{GPU_SECONDS}.{component}"


# --- Attribution results (added by the span processor) -----------------------
ATTRIBUTED_METHOD = "modtrace.attributed.method"
RECONCILE_FACTOR = "modtrace.reconcile.factor"
RECONCILE_OUTLIER = "modtrace.reconcile.outlier"
CALIBRATION_VERSION = "modtrace.calibration.version"
COST_USD_TOTAL = "modtrace.cost.usd.total"
COST_USD_PER_GPU_HOUR = "modtrace.cost.usd_per_gpu_hour"
COST_RATE_ID = "modtrace.cost.rate_id"
COST_HYPOTHETICAL = "modtrace.cost.hypothetical"
ERROR = "modtrace.error"


@cache
def attributed_gpu_seconds(modality: str) -> str:
    """GPU seconds attributed to ``modality``."""
    return f"modtrace.attributed.gpu_seconds.{modality}"


@cache
def attributed_share(modality: str) -> str:
    """Fraction of the request's GPU seconds attributed to ``modality``."""
    return f"modtrace.attributed.share.{modality}"


@cache
def cost_usd(modality: str) -> str:
    """Hypothetical dollars attributed to ``modality``."""
    return f"modtrace.cost.usd.{modality}"


# --- OpenTelemetry GenAI conventions -----------------------------------------
# open-telemetry/semantic-conventions-genai, model/gen-ai/registry.yaml @002c8a6.
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
#: The pre-1.37 spelling of ``gen_ai.provider.name``.
GEN_AI_SYSTEM = "gen_ai.system"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
#: The exception class of a failed request (OpenTelemetry general convention).
ERROR_TYPE = "error.type"

#: ``gen_ai.provider.name`` and ``gen_ai.usage.{text,image,audio,video}.input_tokens``
#: (registry @002c8a6, all Development).
GENAI_SEMCONV_DEVELOPMENT = "development"
#: What instrumentations on GenAI conventions v1.36 and earlier emit:
#: ``gen_ai.system``, no per-modality usage.
GENAI_SEMCONV_LEGACY = "v1.36"
#: No ``gen_ai.*`` attributes beyond the span name.
GENAI_SEMCONV_NONE = "none"
GENAI_SEMCONV_VERSIONS: tuple[str, ...] = (
    GENAI_SEMCONV_DEVELOPMENT,
    GENAI_SEMCONV_LEGACY,
    GENAI_SEMCONV_NONE,
)


@cache
def gen_ai_usage_input_tokens(modality: str) -> str:
    """The GenAI per-modality input token attribute (development status)."""
    return f"gen_ai.usage.{modality}.input_tokens"


# --- Metrics -----------------------------------------------------------------
METRIC_ATTRIBUTED_GPU_SECONDS = "modtrace.attributed.gpu_seconds"
METRIC_ATTRIBUTED_USD = "modtrace.attributed.cost"
METRIC_UNITS = "modtrace.units"
METRIC_RECONCILE_FACTOR = "modtrace.reconcile.factor"
METRIC_ERRORS = "modtrace.errors"

#: One unit-count counter per kind of unit, so that each instrument has one unit.
METRIC_UNIT_KINDS: tuple[str, ...] = ("tokens", "count", "pixels", "tiles", "frames", "seconds")

# Metric attribute (label) names.
LABEL_MODALITY = "modtrace.modality"
LABEL_MODEL = GEN_AI_REQUEST_MODEL
LABEL_ERROR_STAGE = "modtrace.error.stage"


@cache
def metric_units(kind: str) -> str:
    """``tokens`` -> ``modtrace.units.tokens``: the counter of one kind of unit."""
    return f"{METRIC_UNITS}.{kind}"
