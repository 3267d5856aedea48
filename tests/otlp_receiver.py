"""A real OTLP receiver for tests: OTLP/HTTP (protobuf) and OTLP/gRPC, traces and metrics.

Built only from ``opentelemetry-proto``, ``grpcio`` and the standard library,
bound to 127.0.0.1 on ephemeral ports (or given ones, to bring a "collector"
back on the port the exporters already use). It decodes what arrives with
the protobuf classes of the OTLP specification, so a test checks exactly
what a collector would receive.
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import (
    metrics_service_pb2,
    metrics_service_pb2_grpc,
)
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from modtrace.export.file import any_value, attribute_dict

__all__ = ["OTLPReceiver", "ReceivedPoint", "ReceivedSpan", "any_value"]

_ROUTES: dict[str, tuple[str, Any, Any]] = {
    "/v1/traces": (
        "traces",
        trace_service_pb2.ExportTraceServiceRequest,
        trace_service_pb2.ExportTraceServiceResponse,
    ),
    "/v1/metrics": (
        "metrics",
        metrics_service_pb2.ExportMetricsServiceRequest,
        metrics_service_pb2.ExportMetricsServiceResponse,
    ),
}


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as a collector received it."""

    transport: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    kind: int
    attributes: dict[str, Any]
    dropped_attributes_count: int
    resource: dict[str, Any]
    scope: str
    status_code: int


@dataclass(frozen=True)
class ReceivedPoint:
    """One metric data point as a collector received it."""

    transport: str
    metric: str
    unit: str
    kind: str
    attributes: dict[str, Any]
    value: float | None
    count: int | None
    exemplars: list[tuple[str, str, float]] = field(default_factory=list)


class OTLPReceiver:
    """OTLP/HTTP and OTLP/gRPC servers on 127.0.0.1, recording every export request.

    Args:
        http_port: Port for OTLP/HTTP; 0 picks a free one.
        grpc_port: Port for OTLP/gRPC; 0 picks a free one.
    """

    def __init__(self, http_port: int = 0, grpc_port: int = 0) -> None:
        self.host = "127.0.0.1"
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.requests: list[tuple[str, str, Any]] = []  # (signal, transport, request)
        self.encodings: list[str] = []
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)
        self._http: ThreadingHTTPServer | None = None
        self._grpc: grpc.Server | None = None

    # --- lifecycle -----------------------------------------------------------------------
    def start(self) -> OTLPReceiver:
        """Bind both servers and start serving."""
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                receiver.encodings.append(encoding or "identity")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                route = _ROUTES.get(self.path)
                if route is None or "protobuf" not in (self.headers.get("Content-Type") or ""):
                    self.send_response(404 if route is None else 415)
                    self.end_headers()
                    return
                signal, request_type, response_type = route
                receiver._got(signal, "http", request_type.FromString(body))
                data = response_type().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                return

        self._http = ThreadingHTTPServer((self.host, self.http_port), Handler)
        self._http.daemon_threads = True
        self.http_port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, daemon=True).start()

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                receiver._got("traces", "grpc", request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                receiver._got("metrics", "grpc", request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        self._grpc = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), self._grpc)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), self._grpc)
        port = self._grpc.add_insecure_port(f"{self.host}:{self.grpc_port}")
        if port == 0:
            msg = f"cannot bind gRPC port {self.grpc_port}"
            raise OSError(msg)
        self.grpc_port = port
        self._grpc.start()
        return self

    def stop(self) -> None:
        """Stop both servers (the ports are free again)."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
        if self._grpc is not None:
            self._grpc.stop(grace=None).wait()
            self._grpc = None

    def __enter__(self) -> OTLPReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def http_endpoint(self) -> str:
        """Base URL for OTLP/HTTP exporters (append ``/v1/traces``)."""
        return f"http://{self.host}:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        """Endpoint for OTLP/gRPC exporters (plain text)."""
        return f"http://{self.host}:{self.grpc_port}"

    def _got(self, signal: str, transport: str, request: Any) -> None:
        with self._arrived:
            self.requests.append((signal, transport, request))
            self._arrived.notify_all()

    # --- what arrived ------------------------------------------------------------------------
    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far, flattened."""
        with self._lock:
            requests = [(t, r) for s, t, r in self.requests if s == "traces"]
        out = []
        for transport, request in requests:
            for resource_spans in request.resource_spans:
                resource = attribute_dict(resource_spans.resource.attributes)
                for scope_spans in resource_spans.scope_spans:
                    for span in scope_spans.spans:
                        out.append(
                            ReceivedSpan(
                                transport=transport,
                                name=span.name,
                                trace_id=span.trace_id.hex(),
                                span_id=span.span_id.hex(),
                                parent_span_id=span.parent_span_id.hex(),
                                kind=span.kind,
                                attributes=attribute_dict(span.attributes),
                                dropped_attributes_count=span.dropped_attributes_count,
                                resource=resource,
                                scope=scope_spans.scope.name,
                                status_code=span.status.code,
                            )
                        )
        return out

    def points(self) -> list[ReceivedPoint]:
        """Every metric data point received so far, flattened."""
        with self._lock:
            requests = [(t, r) for s, t, r in self.requests if s == "metrics"]
        out = []
        for transport, request in requests:
            for resource_metrics in request.resource_metrics:
                for scope_metrics in resource_metrics.scope_metrics:
                    for metric in scope_metrics.metrics:
                        kind = metric.WhichOneof("data")
                        for point in getattr(metric, kind).data_points:
                            value, count = None, None
                            if kind == "histogram":
                                count, value = point.count, point.sum
                            else:
                                value = getattr(point, point.WhichOneof("value"))
                            exemplars = [
                                (
                                    e.trace_id.hex(),
                                    e.span_id.hex(),
                                    getattr(e, e.WhichOneof("value")),
                                )
                                for e in point.exemplars
                            ]
                            out.append(
                                ReceivedPoint(
                                    transport=transport,
                                    metric=metric.name,
                                    unit=metric.unit,
                                    kind=kind,
                                    attributes=attribute_dict(point.attributes),
                                    value=value,
                                    count=count,
                                    exemplars=exemplars,
                                )
                            )
        return out

    def wait_for(self, done: Callable[[OTLPReceiver], bool], timeout: float = 10.0) -> bool:
        """Wait until ``done(self)`` holds (checked on every arrival), up to ``timeout`` s."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while True:
                self._lock.release()
                try:
                    ok = done(self)
                finally:
                    self._lock.acquire()
                if ok:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._arrived.wait(min(left, 0.2))


if __name__ == "__main__":  # pragma: no cover - manual use: print the ports, log span names
    with OTLPReceiver() as rx:
        print(f"HTTP_PORT={rx.http_port} GRPC_PORT={rx.grpc_port}", flush=True)
        seen = 0
        while True:
            time.sleep(0.5)
            spans = rx.spans()
            for span in spans[seen:]:
                print(span.transport, span.name, span.attributes, flush=True)
            seen = len(spans)
