"""Every attribute and metric name modtrace emits, in one place.

Names are documented in ``docs/attributes.md``. Functions build the
per-modality and per-unit names so that no module spells them inline.
"""

from __future__ import annotations

from functools import cache

__all__ = [
    "ATTRIBUTED_INTERVAL_CONFIDENCE",
    "ATTRIBUTED_INTERVAL_METHOD",
    "ATTRIBUTED_METHOD",
    "CALIBRATION_STALE",
    "CALIBRATION_STALE_REASONS",
    "CALIBRATION_VERSION",
    "COST_HYPOTHETICAL",
    "COST_RATE_ID",
    "COST_USD_PER_GPU_HOUR",
    "COST_USD_TOTAL",
    "DEMO",
    "DEMO_ENGINE",
    "ENGINE_USAGE_COMPLETION_TOKENS",
    "ENGINE_USAGE_PROMPT_TOKENS",
    "ERROR",
    "ERROR_TYPE",
    "GENAI_SEMCONV_DEVELOPMENT",
    "GENAI_SEMCONV_LEGACY",
    "GENAI_SEMCONV_NONE",
    "GENAI_SEMCONV_VERSIONS",
    "GEN_AI_OPERATION_NAME",
    "GEN_AI_PROVIDER_NAME",
    "GEN_AI_REQUEST_MODEL",
    "GEN_AI_RESPONSE_FINISH_REASONS",
    "GEN_AI_RESPONSE_ID",
    "GEN_AI_RESPONSE_MODEL",
    "GEN_AI_SYSTEM",
    "GEN_AI_USAGE_INPUT_TOKENS",
    "GEN_AI_USAGE_OUTPUT_TOKENS",
    "GPU_COUNT",
    "GPU_SECONDS",
    "GPU_SOURCE",
    "HTTP_REQUEST_METHOD",
    "HTTP_REQUEST_RESEND_COUNT",
    "HTTP_RESPONSE_STATUS_CODE",
    "LABEL_ERROR_STAGE",
    "LABEL_MODALITY",
    "LABEL_MODEL",
    "METRIC_ATTRIBUTED_GPU_SECONDS",
    "METRIC_ATTRIBUTED_USD",
    "METRIC_DRIFT_MEDIAN_FACTOR",
    "METRIC_DRIFT_STATE",
    "METRIC_ERRORS",
    "METRIC_RECONCILE_FACTOR",
    "METRIC_UNITS",
    "METRIC_UNIT_KINDS",
    "RECONCILE_FACTOR",
    "RECONCILE_OUTLIER",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "STREAM_ENDED_EARLY",
    "UNITS_ERROR",
    "UNITS_ERRORS",
    "UNITS_PROFILE",
    "URL_PATH",
    "attributed_gpu_seconds",
    "attributed_gpu_seconds_bound",
    "attributed_share",
    "attributed_share_bound",
    "cost_usd",
    "engine_usage_tokens",
    "gen_ai_usage_input_tokens",
    "gpu_seconds_component",
    "metric_units",
    "unit",
    "unit_counter",
    "unit_defaulted",
    "unit_diff",
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
#: True when the calibration applied is stale for the span (too old, another model or
#: preprocessor); absent when it is fresh.
CALIBRATION_STALE = "modtrace.calibration.stale"
#: Why it is stale: one plain sentence per reason (a string array).
CALIBRATION_STALE_REASONS = "modtrace.calibration.stale_reasons"
#: The confidence level of the ``.low`` / ``.high`` interval attributes (e.g. 0.95).
ATTRIBUTED_INTERVAL_CONFIDENCE = "modtrace.attributed.interval.confidence"
#: How the interval was obtained: ``delta`` (weights' errors) or ``exact`` (component timers).
ATTRIBUTED_INTERVAL_METHOD = "modtrace.attributed.interval.method"
COST_USD_TOTAL = "modtrace.cost.usd.total"
COST_USD_PER_GPU_HOUR = "modtrace.cost.usd_per_gpu_hour"
COST_RATE_ID = "modtrace.cost.rate_id"
COST_HYPOTHETICAL = "modtrace.cost.hypothetical"
ERROR = "modtrace.error"
#: Set (true) on a span whose seconds another span attributes: an engine span
#: behind a gateway that carries the counts. The processor forwards it as it
#: is, so no request is attributed (or counted in metrics) twice.
ATTRIBUTION_SKIP = "modtrace.attribution.skip"


@cache
def attributed_gpu_seconds(modality: str) -> str:
    """GPU seconds attributed to ``modality``."""
    return f"modtrace.attributed.gpu_seconds.{modality}"


@cache
def attributed_share(modality: str) -> str:
    """Fraction of the request's GPU seconds attributed to ``modality``."""
    return f"modtrace.attributed.share.{modality}"


@cache
def attributed_gpu_seconds_bound(modality: str, bound: str) -> str:
    """``("image", "low")`` -> ``modtrace.attributed.gpu_seconds.image.low``."""
    return f"modtrace.attributed.gpu_seconds.{modality}.{bound}"


@cache
def attributed_share_bound(modality: str, bound: str) -> str:
    """``("image", "high")`` -> ``modtrace.attributed.share.image.high``."""
    return f"modtrace.attributed.share.{modality}.{bound}"


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
#: Gauge: the median reconciliation factor of the drift window (weights-attributed requests).
METRIC_DRIFT_MEDIAN_FACTOR = "modtrace.calibration.drift.median_factor"
#: Gauge: 1 while that median is outside the drift band, 0 inside.
METRIC_DRIFT_STATE = "modtrace.calibration.drift.state"

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


# --- What the engine reported, beside modtrace's counts (set by the integrations) ---
#: The engine's ``usage.prompt_tokens`` (template, text and media placeholder tokens).
ENGINE_USAGE_PROMPT_TOKENS = "modtrace.engine.usage.prompt_tokens"
#: The engine's ``usage.completion_tokens``.
ENGINE_USAGE_COMPLETION_TOKENS = "modtrace.engine.usage.completion_tokens"
#: True when a streamed response was closed before its end (no engine usage or timers came).
STREAM_ENDED_EARLY = "modtrace.stream.ended_early"


@cache
def engine_usage_tokens(modality: str) -> str:
    """``image`` -> ``modtrace.engine.usage.image.tokens``: the engine's count for a modality."""
    return f"modtrace.engine.usage.{modality}.tokens"


@cache
def unit_diff(name: str) -> str:
    """``image.tokens`` -> ``modtrace.units.image.tokens.diff``: engine's count minus modtrace's."""
    return f"{UNITS_PREFIX}{name}.diff"


# GenAI response attributes (open-telemetry/semantic-conventions-genai, registry @002c8a6).
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"

# HTTP and server attributes (OpenTelemetry HTTP conventions, stable).
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
HTTP_REQUEST_RESEND_COUNT = "http.request.resend_count"
URL_PATH = "url.path"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"


# --- Resource attributes of `modtrace demo` -------------------------------------
#: True on every span of the simulated week.
DEMO = "modtrace.demo"
#: Which engine timed the simulated week (the reference engine or the cost model).
DEMO_ENGINE = "modtrace.demo.engine"
