"""One call to set up tracing, attribution and metrics from the ``OTEL_*`` variables.

::

    from modtrace.export import configure
    telemetry = configure()          # OTEL_SERVICE_NAME, OTEL_EXPORTER_OTLP_ENDPOINT...

With an OTLP endpoint configured (``OTEL_EXPORTER_OTLP_ENDPOINT`` or
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``) spans and metrics go there over
``http/protobuf`` (the OpenTelemetry default) or ``grpc``
(``OTEL_EXPORTER_OTLP_PROTOCOL``); without one, spans are appended to a local
OTLP JSON lines file (:envvar:`MODTRACE_FILE`), so reports work on one machine.

The pieces stay composable for code that brings its own providers::

    processor = attribution_processor(span_exporters(), calibration=cal)
    my_tracer_provider.add_span_processor(processor)

Export never blocks a request: every exporter sits behind a
:class:`BatchSpanProcessor` (a bounded queue drained by a worker thread; a
full queue drops the oldest span, counted by the SDK's
``otel.sdk.processor.span.processed`` metric with ``error.type=queue_full``,
which :func:`configure` turns on).
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricReader,
    PeriodicExportingMetricReader,
)
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from ..attribution import AttributionConfig
from ..calibration import Calibration, load_calibration
from ..cost import Rate
from ..environment_variables import (
    MODTRACE_CALIBRATION,
    MODTRACE_EXPORTER,
    MODTRACE_FILE,
    MODTRACE_METRICS_FILE,
    MODTRACE_RATE_ID,
    MODTRACE_USD_PER_GPU_HOUR,
)
from ..processor import AttributionSpanProcessor
from ..spans.inference import refresh_settings
from .file import OtlpJsonFileMetricExporter, OtlpJsonFileSpanExporter

__all__ = [
    "DEFAULT_FILE",
    "PROTOCOLS",
    "Telemetry",
    "attribution_processor",
    "calibration_from_env",
    "configure",
    "exporter_names",
    "metric_exporters",
    "otlp_protocol",
    "rate_from_env",
    "span_exporters",
]

#: Where spans go when no collector is configured.
DEFAULT_FILE = "modtrace-spans.jsonl"
#: The OTLP protocols the Python exporters speak.
PROTOCOLS: tuple[str, ...] = ("http/protobuf", "grpc")
_SIGNAL_PATHS = {"traces": "/v1/traces", "metrics": "/v1/metrics"}
_INTERNAL_METRICS = "OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED"


def _env(environ: Mapping[str, str] | None) -> Mapping[str, str]:
    return os.environ if environ is None else environ


def otlp_protocol(signal: str = "traces", environ: Mapping[str, str] | None = None) -> str:
    """The OTLP protocol of ``signal`` from ``OTEL_EXPORTER_OTLP_[<SIGNAL>_]PROTOCOL``.

    Raises:
        ValueError: the protocol is not ``http/protobuf`` or ``grpc``.
    """
    env = _env(environ)
    value = (
        env.get(f"OTEL_EXPORTER_OTLP_{signal.upper()}_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    return _check_protocol(value)


def _check_protocol(value: str) -> str:
    if value not in PROTOCOLS:
        msg = f"OTLP protocol {value!r} is not supported; use one of: {', '.join(PROTOCOLS)}"
        raise ValueError(msg)
    return value


def exporter_names(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Where spans go: :envvar:`MODTRACE_EXPORTER`, else ``otlp`` with an endpoint, else ``file``.

    Raises:
        ValueError: an unknown exporter name.
    """
    env = _env(environ)
    raw = env.get(MODTRACE_EXPORTER, "").strip()
    if not raw:
        has_endpoint = env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
        )
        return ("otlp",) if has_endpoint else ("file",)
    names = tuple(n.strip().lower() for n in raw.split(",") if n.strip())
    unknown = [n for n in names if n not in ("otlp", "file", "none")]
    if unknown:
        msg = f"{MODTRACE_EXPORTER}: unknown exporter {unknown[0]!r}; use otlp, file or none"
        raise ValueError(msg)
    return tuple(n for n in names if n != "none")


def _signal_endpoint(endpoint: str | None, signal: str, protocol: str) -> str | None:
    # A base endpoint gets the signal path over HTTP (OTLP spec, "OTLP/HTTP Request");
    # gRPC takes host:port as it is.
    if endpoint is None or protocol == "grpc":
        return endpoint
    return endpoint.rstrip("/") + _SIGNAL_PATHS[signal]


def _accepts(cls: type, name: str) -> bool:
    try:
        return name in inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return False


#: The OTLP exporter class of each signal and protocol: ``(module, class name)``.
_OTLP_EXPORTERS: dict[tuple[str, str], tuple[str, str]] = {
    ("traces", "grpc"): (
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "OTLPSpanExporter",
    ),
    ("traces", "http/protobuf"): (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "OTLPSpanExporter",
    ),
    ("metrics", "grpc"): (
        "opentelemetry.exporter.otlp.proto.grpc.metric_exporter",
        "OTLPMetricExporter",
    ),
    ("metrics", "http/protobuf"): (
        "opentelemetry.exporter.otlp.proto.http.metric_exporter",
        "OTLPMetricExporter",
    ),
}


def _otlp_exporter(
    signal: str,
    *,
    endpoint: str | None,
    protocol: str | None,
    headers: Mapping[str, str] | None,
    timeout: float | None,
    meter_provider: metrics.MeterProvider | None = None,
    options: Mapping[str, Any] | None = None,
) -> Any:
    """The OTLP exporter of ``signal`` (``traces`` or ``metrics``), imported when first needed."""
    proto = _check_protocol(protocol) if protocol else otlp_protocol(signal)
    module, name = _OTLP_EXPORTERS[(signal, proto)]
    cls = getattr(importlib.import_module(module), name)
    kwargs: dict[str, Any] = {}
    endpoint = _signal_endpoint(endpoint, signal, proto)
    if endpoint is not None:
        kwargs["endpoint"] = endpoint
        if proto == "grpc" and endpoint.startswith("http://"):
            kwargs["insecure"] = True
    if headers is not None:
        kwargs["headers"] = dict(headers)
    if timeout is not None:
        kwargs["timeout"] = timeout
    if meter_provider is not None and _accepts(cls, "meter_provider"):
        kwargs["meter_provider"] = meter_provider
    return cls(**kwargs, **dict(options or {}))


def _exporters(
    kind: str,
    names: Sequence[str] | None,
    *,
    otlp: Callable[[], Any],
    file: Callable[[], Any | None],
) -> list[Any]:
    """The exporters ``names`` asks for (default :func:`exporter_names`), built in order.

    Raises:
        ValueError: an unknown exporter name.
    """
    out = []
    for name in tuple(names) if names is not None else exporter_names():
        if name == "otlp":
            out.append(otlp())
        elif name == "file":
            exporter = file()
            if exporter is not None:
                out.append(exporter)
        elif name != "none":
            msg = f"unknown {kind} exporter {name!r}; use otlp, file or none"
            raise ValueError(msg)
    return out


def span_exporters(
    *,
    exporters: Sequence[str] | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float | None = None,
    file: str | os.PathLike[str] | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    otlp_options: Mapping[str, Any] | None = None,
) -> list[SpanExporter]:
    """The span exporters the configuration asks for.

    Args:
        exporters: ``otlp`` and/or ``file``; default :func:`exporter_names`.
        endpoint: The OTLP base endpoint (``http://host:4318``, or
            ``http://host:4317`` for gRPC); default from the ``OTEL_*`` variables.
        protocol: ``http/protobuf`` or ``grpc``; default :func:`otlp_protocol`.
        headers: OTLP headers; default ``OTEL_EXPORTER_OTLP_HEADERS``.
        timeout: Seconds per export, retries included; default
            ``OTEL_EXPORTER_OTLP_TIMEOUT`` or 10.
        file: The OTLP JSON lines file; default :envvar:`MODTRACE_FILE` or
            ``modtrace-spans.jsonl``.
        meter_provider: For the exporters' own metrics (failed exports).
        otlp_options: More keyword arguments of the OTLP span exporter
            (``compression``, ``certificate_file``, gRPC ``channel_options``...).

    Raises:
        ValueError: an unknown exporter or protocol.
    """

    def file_exporter() -> SpanExporter:
        return OtlpJsonFileSpanExporter(file or os.environ.get(MODTRACE_FILE) or DEFAULT_FILE)

    return _exporters(
        "span",
        exporters,
        otlp=lambda: _otlp_exporter(
            "traces",
            endpoint=endpoint,
            protocol=protocol,
            headers=headers,
            timeout=timeout,
            meter_provider=meter_provider,
            options=otlp_options,
        ),
        file=file_exporter,
    )


def metric_exporters(
    *,
    exporters: Sequence[str] | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float | None = None,
    file: str | os.PathLike[str] | None = None,
) -> list[MetricExporter]:
    """The metric exporters matching :func:`span_exporters` (``file`` only with a metrics file).

    Args:
        exporters: ``otlp`` and/or ``file``; default :func:`exporter_names`.
        endpoint: As for :func:`span_exporters`.
        protocol: ``http/protobuf`` or ``grpc``; default
            ``OTEL_EXPORTER_OTLP_METRICS_PROTOCOL`` / ``OTEL_EXPORTER_OTLP_PROTOCOL``.
        headers: OTLP headers.
        timeout: Seconds per export.
        file: The metrics OTLP JSON lines file; default
            :envvar:`MODTRACE_METRICS_FILE`; no file exporter when unset.

    Raises:
        ValueError: an unknown exporter or protocol.
    """

    def file_exporter() -> MetricExporter | None:
        path = file or os.environ.get(MODTRACE_METRICS_FILE)
        return OtlpJsonFileMetricExporter(path) if path else None

    return _exporters(
        "metric",
        exporters,
        otlp=lambda: _otlp_exporter(
            "metrics", endpoint=endpoint, protocol=protocol, headers=headers, timeout=timeout
        ),
        file=file_exporter,
    )


def calibration_from_env(environ: Mapping[str, str] | None = None) -> Calibration | None:
    """The calibration at :envvar:`MODTRACE_CALIBRATION`, or ``None`` when unset.

    Raises:
        ValueError: the file cannot be read or is not a calibration.
    """
    path = _env(environ).get(MODTRACE_CALIBRATION, "").strip()
    return load_calibration(path) if path else None


def rate_from_env(environ: Mapping[str, str] | None = None) -> Rate | None:
    """The hypothetical rate of :envvar:`MODTRACE_USD_PER_GPU_HOUR`, or ``None`` when unset.

    Raises:
        ValueError: the value is not a non-negative number.
    """
    env = _env(environ)
    raw = env.get(MODTRACE_USD_PER_GPU_HOUR, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        msg = f"{MODTRACE_USD_PER_GPU_HOUR}: expected a number, got {raw!r}"
        raise ValueError(msg) from None
    return Rate(usd_per_gpu_hour=value, id=env.get(MODTRACE_RATE_ID, "").strip() or "default")


@contextlib.contextmanager
def _sdk_internal_metrics(enabled: bool | None) -> Iterator[None]:
    """Turn the SDK's own metrics on while processors and exporters are built.

    The SDK reads ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED`` only in their
    constructors; a value the user set is left alone.
    """
    if not enabled or _INTERNAL_METRICS in os.environ:
        yield
        return
    os.environ[_INTERNAL_METRICS] = "true"
    try:
        yield
    finally:
        os.environ.pop(_INTERNAL_METRICS, None)


def attribution_processor(
    exporters: Sequence[SpanExporter] = (),
    *,
    calibration: Calibration | None = None,
    rate: Rate | None = None,
    config: AttributionConfig | None = None,
    meter_provider: metrics.MeterProvider | None = None,
    span_limits: SpanLimits | None = None,
    max_queue_size: int | None = None,
    schedule_delay_millis: float | None = None,
    max_export_batch_size: int | None = None,
    background: bool = True,
) -> AttributionSpanProcessor:
    """An :class:`AttributionSpanProcessor` forwarding to one ``BatchSpanProcessor`` per exporter.

    Register it on your own ``TracerProvider``; the batch options default to
    the ``OTEL_BSP_*`` variables.

    Args:
        exporters: The span exporters (see :func:`span_exporters`).
        calibration: Weights in GPU seconds per unit.
        rate: Hypothetical GPU-hour price; no cost when ``None``.
        config: Attribution knobs.
        meter_provider: For modtrace's metrics and the SDK's own; global when ``None``.
        span_limits: The limits your ``TracerProvider`` was built with.
        max_queue_size: Spans each batch processor holds before dropping the oldest.
        schedule_delay_millis: The longest wait before a batch is exported.
        max_export_batch_size: Spans per export.
        background: Attribute on a worker thread (see :class:`AttributionSpanProcessor`).
    """
    if max_queue_size is not None and max_export_batch_size is None:
        # The SDK rejects a batch larger than the queue; its default batch is 512.
        default_batch = os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "").strip()
        max_export_batch_size = min(int(default_batch or 512), max_queue_size)
    kwargs: dict[str, Any] = {
        "max_queue_size": max_queue_size,
        "schedule_delay_millis": schedule_delay_millis,
        "max_export_batch_size": max_export_batch_size,
    }
    if meter_provider is not None and _accepts(BatchSpanProcessor, "meter_provider"):
        kwargs["meter_provider"] = meter_provider
    batches = [BatchSpanProcessor(exporter, **kwargs) for exporter in exporters]
    return AttributionSpanProcessor(
        *batches,
        calibration=calibration,
        rate=rate,
        config=config,
        meter_provider=meter_provider,
        span_limits=span_limits,
        background=background,
    )


@dataclass
class Telemetry:
    """What :func:`configure` built.

    Attributes:
        tracer_provider: The tracer provider, with the attribution processor.
        meter_provider: The meter provider modtrace's metrics go to.
        processor: The attribution processor (set ``processor.calibration`` to
            apply a new calibration from now on).
        span_exporters: The exporters behind it.
        metric_readers: The metric readers of ``meter_provider``.
    """

    tracer_provider: TracerProvider
    meter_provider: MeterProvider
    processor: AttributionSpanProcessor
    span_exporters: list[SpanExporter] = field(default_factory=list)
    metric_readers: list[MetricReader] = field(default_factory=list)
    _closed: bool = field(default=False, init=False, repr=False)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Export every finished span, then every metric."""
        spans_ok = self.tracer_provider.force_flush(timeout_millis)
        return self.meter_provider.force_flush(timeout_millis) and spans_ok

    def shutdown(self) -> None:
        """Flush and stop: spans first (their metrics are recorded on the way), then metrics.

        Safe to call more than once.
        """
        if self._closed:
            return
        self._closed = True
        self.tracer_provider.shutdown()
        self.meter_provider.shutdown()


def configure(
    *,
    service_name: str | None = None,
    exporters: Sequence[str] | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float | None = None,
    otlp_options: Mapping[str, Any] | None = None,
    file: str | os.PathLike[str] | None = None,
    metrics_file: str | os.PathLike[str] | None = None,
    calibration: Calibration | str | os.PathLike[str] | None = None,
    rate: Rate | float | None = None,
    config: AttributionConfig | None = None,
    resource_attributes: Mapping[str, Any] | None = None,
    span_limits: SpanLimits | None = None,
    metric_readers: Sequence[MetricReader] = (),
    metric_export_interval_millis: float | None = None,
    max_queue_size: int | None = None,
    schedule_delay_millis: float | None = None,
    sdk_metrics: bool = True,
    background: bool = True,
    set_global: bool = True,
) -> Telemetry:
    """Set up tracing, attribution and metrics in one call; arguments override ``OTEL_*``.

    Args:
        service_name: ``service.name``; default ``OTEL_SERVICE_NAME``.
        exporters: ``otlp`` and/or ``file``; default :func:`exporter_names`.
        endpoint: OTLP base endpoint; default ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``.
        protocol: ``http/protobuf`` or ``grpc``; default ``OTEL_EXPORTER_OTLP_PROTOCOL``.
        headers: OTLP headers; default ``OTEL_EXPORTER_OTLP_HEADERS``.
        timeout: Seconds per OTLP export; default ``OTEL_EXPORTER_OTLP_TIMEOUT`` or 10.
        otlp_options: More keyword arguments of the OTLP span exporter.
        file: The span file of the ``file`` exporter.
        metrics_file: The metrics file of the ``file`` exporter (none by default).
        calibration: A calibration or the path of one; default
            :envvar:`MODTRACE_CALIBRATION`.
        rate: A :class:`Rate` or dollars per GPU hour; default
            :envvar:`MODTRACE_USD_PER_GPU_HOUR`.
        config: Attribution knobs.
        resource_attributes: More resource attributes (``OTEL_RESOURCE_ATTRIBUTES`` too).
        span_limits: Attribute/event limits; default from ``OTEL_*_LIMIT``.
        metric_readers: Extra metric readers (e.g. a Prometheus reader).
        metric_export_interval_millis: Default ``OTEL_METRIC_EXPORT_INTERVAL`` or 60 s.
        max_queue_size: Per batch processor; default ``OTEL_BSP_MAX_QUEUE_SIZE`` or 2048.
        schedule_delay_millis: Default ``OTEL_BSP_SCHEDULE_DELAY`` or 5 s.
        sdk_metrics: Turn on the SDK's own metrics (queue drops, failed exports)
            unless ``OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED`` is set.
        background: Attribute on a worker thread.
        set_global: Install the providers as the global ones.

    Raises:
        ValueError: an unknown exporter or protocol, an unreadable calibration,
            or a bad rate; at setup, never per request.
    """
    refresh_settings()  # the span's MODTRACE_GENAI_* defaults, read anew
    if isinstance(calibration, (str, os.PathLike)):
        calibration = load_calibration(Path(calibration))
    elif calibration is None:
        calibration = calibration_from_env()
    if isinstance(rate, (int, float)):
        rate = Rate(usd_per_gpu_hour=rate)
    elif rate is None:
        rate = rate_from_env()

    names = tuple(exporters) if exporters is not None else exporter_names()
    attrs = dict(resource_attributes or {})
    if service_name:
        attrs[SERVICE_NAME] = service_name
    resource = Resource.create(attrs)
    limits = span_limits or SpanLimits()

    readers = list(metric_readers)
    for exporter in metric_exporters(
        exporters=names,
        endpoint=endpoint,
        protocol=protocol,
        headers=headers,
        timeout=timeout,
        file=metrics_file,
    ):
        readers.append(
            PeriodicExportingMetricReader(
                exporter, export_interval_millis=metric_export_interval_millis
            )
        )
    meter_provider = MeterProvider(resource=resource, metric_readers=readers)

    with _sdk_internal_metrics(sdk_metrics):
        exporters_built = span_exporters(
            exporters=names,
            endpoint=endpoint,
            protocol=protocol,
            headers=headers,
            timeout=timeout,
            file=file,
            meter_provider=meter_provider,
            otlp_options=otlp_options,
        )
        processor = attribution_processor(
            exporters_built,
            calibration=calibration,
            rate=rate,
            config=config,
            meter_provider=meter_provider,
            span_limits=limits,
            max_queue_size=max_queue_size,
            schedule_delay_millis=schedule_delay_millis,
            background=background,
        )
    tracer_provider = TracerProvider(resource=resource, span_limits=limits)
    tracer_provider.add_span_processor(processor)
    if set_global:
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(meter_provider)
    return Telemetry(
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        processor=processor,
        span_exporters=exporters_built,
        metric_readers=readers,
    )
