"""The ``MODTRACE_*`` environment variables, in one place.

The standard ``OTEL_*`` variables (service name, OTLP endpoint, protocol,
headers, timeouts, batch sizes, attribute limits) are read as the
OpenTelemetry SDK and exporters read them; these only add what OpenTelemetry
has no name for.
"""

from __future__ import annotations

__all__ = [
    "MODTRACE_ATTRIBUTION_INTERVALS",
    "MODTRACE_CALIBRATION",
    "MODTRACE_CALIBRATION_MAX_AGE_DAYS",
    "MODTRACE_COUNTING_CONFIG",
    "MODTRACE_EXPORTER",
    "MODTRACE_FILE",
    "MODTRACE_GENAI_PROVIDER",
    "MODTRACE_GENAI_SEMCONV",
    "MODTRACE_METRICS_FILE",
    "MODTRACE_RATE_ID",
    "MODTRACE_STRICT",
    "MODTRACE_USD_PER_GPU_HOUR",
]

MODTRACE_CALIBRATION = "MODTRACE_CALIBRATION"
"""
.. envvar:: MODTRACE_CALIBRATION

Path of the calibration JSON (weights in GPU seconds per unit) that
:func:`modtrace.export.configure` hands to the attribution span processor.
Unset: no weights; requests with component timers are still attributed.
"""

MODTRACE_CALIBRATION_MAX_AGE_DAYS = "MODTRACE_CALIBRATION_MAX_AGE_DAYS"
"""
.. envvar:: MODTRACE_CALIBRATION_MAX_AGE_DAYS

The age, in days (a decimal), past which the attribution span processor
calls a calibration stale: a warning in the log and
``modtrace.calibration.stale`` on the spans. Default: ``30`` (recalibrate
monthly). The processor's ``calibration_max_age`` argument wins.
"""

MODTRACE_ATTRIBUTION_INTERVALS = "MODTRACE_ATTRIBUTION_INTERVALS"
"""
.. envvar:: MODTRACE_ATTRIBUTION_INTERVALS

``true``: the attribution span processor adds interval attributes
(``modtrace.attributed.gpu_seconds.<modality>.low`` / ``.high``, the same for
``share``, and ``modtrace.attributed.interval.confidence``) from the
calibration's standard errors. Default: ``false``. The processor's
``intervals`` argument wins.
"""

MODTRACE_USD_PER_GPU_HOUR = "MODTRACE_USD_PER_GPU_HOUR"
"""
.. envvar:: MODTRACE_USD_PER_GPU_HOUR

A hypothetical price of one GPU hour in US dollars. When set, spans carry
``modtrace.cost.*`` attributes and the cost counter is recorded. Unset: no cost.
"""

MODTRACE_RATE_ID = "MODTRACE_RATE_ID"
"""
.. envvar:: MODTRACE_RATE_ID

The id stamped on costs priced at :envvar:`MODTRACE_USD_PER_GPU_HOUR`
(``modtrace.cost.rate_id``). Default: ``default``.
"""

MODTRACE_EXPORTER = "MODTRACE_EXPORTER"
"""
.. envvar:: MODTRACE_EXPORTER

Where :func:`modtrace.export.configure` sends spans: a comma-separated list of
``otlp`` and ``file``, or ``none``. Default: ``otlp`` when an OTLP endpoint is
configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``), else ``file``.
"""

MODTRACE_FILE = "MODTRACE_FILE"
"""
.. envvar:: MODTRACE_FILE

The OTLP JSON lines file the ``file`` exporter appends spans to.
Default: ``modtrace-spans.jsonl`` in the working directory.
"""

MODTRACE_METRICS_FILE = "MODTRACE_METRICS_FILE"
"""
.. envvar:: MODTRACE_METRICS_FILE

The OTLP JSON lines file the ``file`` exporter appends metrics to. Unset:
metrics are not written to a file.
"""

MODTRACE_GENAI_SEMCONV = "MODTRACE_GENAI_SEMCONV"
"""
.. envvar:: MODTRACE_GENAI_SEMCONV

Which version of the OpenTelemetry GenAI conventions the inference span
follows: ``development`` (default: ``gen_ai.provider.name`` and
``gen_ai.usage.<modality>.input_tokens``), ``v1.36`` (``gen_ai.system``, no
per-modality usage) or ``none`` (no ``gen_ai.*`` attributes).
"""

MODTRACE_GENAI_PROVIDER = "MODTRACE_GENAI_PROVIDER"
"""
.. envvar:: MODTRACE_GENAI_PROVIDER

The ``gen_ai.provider.name`` of inference spans when the code does not pass
one. Default: ``vllm``.
"""

MODTRACE_STRICT = "MODTRACE_STRICT"
"""
.. envvar:: MODTRACE_STRICT

``true``: failures inside modtrace (a counter raising, bad timers, a bad
calibration) raise into the calling code instead of being recorded on the
span as ``modtrace.error``. For tests and development only. Default: ``false``.
"""

MODTRACE_COUNTING_CONFIG = "MODTRACE_COUNTING_CONFIG"
"""
.. envvar:: MODTRACE_COUNTING_CONFIG

Path of a counting configuration JSON (the format of ``modtrace count
--config``: profile, model-to-profile map, parameters, text tokenizer) that
:class:`~modtrace.integrations.instrumentor.ModtraceInstrumentor` uses when it
is given no counter or configuration, as under ``opentelemetry-instrument``.
"""
