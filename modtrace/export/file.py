"""OTLP JSON lines files: the embedded default when no collector runs.

Each export appends one line: one ``ExportTraceServiceRequest`` (or
``ExportMetricsServiceRequest``) in the OTLP JSON encoding, the format the
OpenTelemetry Collector's file exporter writes (``exportMessageAsLine`` with
``ptrace.JSONMarshaler`` in opentelemetry-collector-contrib
``exporter/fileexporter``), so the same reports read a collector's file and
modtrace's own.

The OTLP JSON encoding (opentelemetry-proto ``docs/specification.md``, "JSON
Protobuf Encoding") is the proto3 JSON mapping with camelCase keys, 64-bit
integers as decimal strings, enums as integers (never names), and
``traceId`` / ``spanId`` / ``parentSpanId`` as hex strings instead of base64.
"""

from __future__ import annotations

import base64
import json
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import Message
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import (
    MetricExporter,
    MetricExportResult,
    MetricsData,
)
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

__all__ = [
    "OtlpJsonFileMetricExporter",
    "OtlpJsonFileSpanExporter",
    "SpanRecord",
    "any_value",
    "attribute_dict",
    "from_otlp_json",
    "iter_spans",
    "read_otlp_json_lines",
    "to_otlp_json",
]

# Byte fields written as hex in every OTLP message (Span, Link, Exemplar, LogRecord).
_ID_KEYS = frozenset(("traceId", "spanId", "parentSpanId"))


def _map_ids(node: Any, convert: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: (convert(v) if k in _ID_KEYS and isinstance(v, str) else _map_ids(v, convert))
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_map_ids(v, convert) for v in node]
    return node


def _b64_to_hex(value: str) -> str:
    return base64.b64decode(value).hex()


def _hex_to_b64(value: str) -> str:
    return base64.b64encode(bytes.fromhex(value)).decode("ascii")


def to_otlp_json(message: Message) -> dict[str, Any]:
    """An OTLP protobuf message as its OTLP JSON object.

    Args:
        message: e.g. an ``ExportTraceServiceRequest``.

    Returns:
        A JSON-ready dict: camelCase keys, integer enums, 64-bit integers as
        strings, hex trace and span ids.
    """
    data = json_format.MessageToDict(message, use_integers_for_enums=True)
    return _map_ids(data, _b64_to_hex)


def from_otlp_json(data: Mapping[str, Any], message: Message) -> Message:
    """Parse an OTLP JSON object into ``message`` (ids in hex, unknown keys ignored).

    Args:
        data: The decoded JSON object of one line.
        message: An empty message of the right type, filled and returned.

    Raises:
        ValueError: the object does not match the message type.
    """
    try:
        return json_format.ParseDict(
            _map_ids(dict(data), _hex_to_b64), message, ignore_unknown_fields=True
        )
    except (json_format.ParseError, ValueError) as exc:
        msg = f"not an OTLP JSON {type(message).__name__}: {exc}"
        raise ValueError(msg) from exc


class _LineWriter:
    """Appends whole lines to a file, one ``write`` per line, from any thread."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._file: Any = None

    def write(self, line: str) -> None:
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                # O_APPEND: lines from several processes never overwrite each other.
                self._file = open(self.path, "ab", buffering=0)  # noqa: SIM115
            self._file.write(data)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def _dumps(message: Message) -> str:
    return json.dumps(to_otlp_json(message), separators=(",", ":"), ensure_ascii=False)


class OtlpJsonFileSpanExporter(SpanExporter):
    """Appends each batch of spans to ``path`` as one OTLP JSON line.

    Args:
        path: The file to append to (created with its directory).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._writer = _LineWriter(path)
        self._closed = False

    @property
    def path(self) -> Path:
        """The file spans are appended to."""
        return self._writer.path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Append one ``ExportTraceServiceRequest`` line; ``FAILURE`` if it cannot be written."""
        if self._closed:
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        try:
            self._writer.write(_dumps(encode_spans(spans)))
        except (OSError, ValueError):
            return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Lines are written unbuffered: nothing to flush."""
        return True

    def shutdown(self) -> None:
        """Close the file; later exports fail."""
        self._closed = True
        self._writer.close()


class OtlpJsonFileMetricExporter(MetricExporter):
    """Appends each collection of metrics to ``path`` as one OTLP JSON line.

    Args:
        path: The file to append to (created with its directory).
        **kwargs: ``preferred_temporality`` / ``preferred_aggregation``, as
            for any :class:`MetricExporter`.
    """

    def __init__(self, path: str | os.PathLike[str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._writer = _LineWriter(path)
        self._closed = False

    @property
    def path(self) -> Path:
        """The file metrics are appended to."""
        return self._writer.path

    def export(
        self, metrics_data: MetricsData, timeout_millis: float = 10_000, **kwargs: Any
    ) -> MetricExportResult:
        """Append one ``ExportMetricsServiceRequest`` line."""
        if self._closed:
            return MetricExportResult.FAILURE
        try:
            self._writer.write(_dumps(encode_metrics(metrics_data)))
        except (OSError, ValueError):
            return MetricExportResult.FAILURE
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        """Lines are written unbuffered: nothing to flush."""
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        """Close the file; later exports fail."""
        self._closed = True
        self._writer.close()


# --- Reading -----------------------------------------------------------------------------
def read_otlp_json_lines(
    path: str | os.PathLike[str],
) -> Iterator[ExportTraceServiceRequest | ExportMetricsServiceRequest]:
    """Parse an OTLP JSON lines file, written by modtrace or a collector.

    Yields one request per line: traces (``resourceSpans``) and metrics
    (``resourceMetrics``); blank lines and other signals are skipped.

    Raises:
        ValueError: a line is not JSON or not OTLP; the message names the line.
    """
    with open(path, encoding="utf-8-sig") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                if "resourceSpans" in data:
                    yield from_otlp_json(data, ExportTraceServiceRequest())  # type: ignore[misc]
                elif "resourceMetrics" in data:
                    yield from_otlp_json(data, ExportMetricsServiceRequest())  # type: ignore[misc]
            except ValueError as exc:
                msg = f"{path}:{number}: {exc}"
                raise ValueError(msg) from exc


def any_value(value: Any) -> Any:
    """An OTLP ``AnyValue`` message as a Python value (arrays as lists, kvlists as dicts)."""
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [any_value(v) for v in value.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in value.kvlist_value.values}
    return getattr(value, kind) if kind else None


def attribute_dict(key_values: Any) -> dict[str, Any]:
    """OTLP ``KeyValue`` messages (span, resource or point attributes) as a dict."""
    return {kv.key: any_value(kv.value) for kv in key_values}


@dataclass(frozen=True)
class SpanRecord:
    """One finished span read back from a file.

    Attributes:
        name: The span name.
        trace_id: 32 lowercase hex digits.
        span_id: 16 lowercase hex digits.
        parent_span_id: 16 hex digits, or ``""`` for a root span.
        kind: The OTLP ``SpanKind`` number (1 internal, 2 server, 3 client...).
        start_time_unix_nano: Start, in nanoseconds since the epoch.
        end_time_unix_nano: End, in nanoseconds since the epoch.
        status_code: 0 unset, 1 ok, 2 error.
        attributes: The span's attributes as Python values.
        resource: The resource attributes (``service.name``...).
        scope: The instrumentation scope name.
        dropped_attributes_count: Attributes lost to the count limit.
    """

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    start_time_unix_nano: int
    end_time_unix_nano: int
    status_code: int
    attributes: dict[str, Any] = field(default_factory=dict)
    resource: dict[str, Any] = field(default_factory=dict)
    scope: str = ""
    dropped_attributes_count: int = 0

    @property
    def duration_seconds(self) -> float:
        """End minus start, in seconds."""
        return (self.end_time_unix_nano - self.start_time_unix_nano) / 1e9


def iter_spans(path: str | os.PathLike[str]) -> Iterator[SpanRecord]:
    """Every span in an OTLP JSON lines file, flattened, in file order.

    Raises:
        ValueError: a line is not OTLP JSON (see :func:`read_otlp_json_lines`).
    """
    for request in read_otlp_json_lines(path):
        if not isinstance(request, ExportTraceServiceRequest):
            continue
        for resource_spans in request.resource_spans:
            resource = attribute_dict(resource_spans.resource.attributes)
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    yield SpanRecord(
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_span_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        start_time_unix_nano=span.start_time_unix_nano,
                        end_time_unix_nano=span.end_time_unix_nano,
                        status_code=span.status.code,
                        attributes=attribute_dict(span.attributes),
                        resource=resource,
                        scope=scope_spans.scope.name,
                        dropped_attributes_count=span.dropped_attributes_count,
                    )
