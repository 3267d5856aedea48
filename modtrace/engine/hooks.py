"""Plain Python hooks for engine servers: trace in, GPU timers out.

An engine server that wants its measured GPU seconds on the caller's trace
does three things per request, whatever its framework:

1. **Continue the trace** the caller started: :func:`extract_context` reads
   the W3C ``traceparent``/``tracestate`` headers with
   ``opentelemetry.propagate.extract`` (so any propagator configured through
   ``OTEL_PROPAGATORS`` applies).
2. **Time the request** with a :class:`modtrace.timing.StepLedger`: the
   engine records each batch step with the tokens it did for each request;
   :meth:`EngineRequest.finish_timers` closes the request's account.
3. **Return the timers** in response headers (:func:`timers_to_headers`),
   which a gateway reads back with :func:`timers_from_headers`.

:class:`EngineHooks` bundles the three around an engine span (an
:func:`modtrace.spans.inference_span` of kind ``SERVER``)::

    hooks = EngineHooks(ledger)
    with hooks.request(headers) as req:           # trace continued, span open
        result = engine.run(body, request_id=req.request_id)
        req.set_usage(result["usage"])
        response_headers.update(req.response_headers())

Streaming responses only know their timers at the end, after the HTTP
headers are gone: see :mod:`modtrace.engine.asgi` for how they travel then
(an SSE comment block, and a ``modtrace`` object in the usage chunk), and
:func:`sse_comment` / :func:`timers_from_sse` for the codec.

Nothing here raises into the request on a modtrace failure: a bad value is
recorded on the span (``modtrace.error``) and the response goes out.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import re
import threading
import uuid
from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import headers as H
from .. import semconv
from .._scope import SyncAndAsync, leave_context
from ..spans.inference import InferenceSpan, inference_span
from ..timers import COMPONENTS, GpuTimers
from ..timing import StepLedger

__all__ = [
    "USAGE_EXTENSION",
    "EngineHooks",
    "EngineRequest",
    "HeaderInput",
    "current_engine_request",
    "extract_context",
    "normalize_headers",
    "sse_comment",
    "timers_from_headers",
    "timers_from_sse",
    "timers_to_headers",
    "usage_units",
]

#: Headers as a mapping, or as ``(name, value)`` pairs (ASGI gives ``bytes`` pairs).
HeaderInput = Mapping[str, str] | Iterable[tuple[str | bytes, str | bytes]]

#: The key of the object carrying the timer headers in a streamed usage chunk.
USAGE_EXTENSION = "modtrace"

# A plain decimal or scientific number, no sign, no underscores, no inf/nan:
# float() accepts all of those, a timer header must not.
_NUMBER = re.compile(r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_COUNT = re.compile(r"[1-9]\d{0,5}")
_SOURCE = re.compile(r"[A-Za-z0-9_.:/+-]{1,64}")
_COMPONENT_HEADERS: dict[str, str] = H.GPU_SECONDS_COMPONENTS
_HEADER_COMPONENTS: dict[str, str] = {v: k for k, v in _COMPONENT_HEADERS.items()}
# Components may add up to a hair over the total after float rounding.
_SUM_TOLERANCE = 1e-9

_current: contextvars.ContextVar[EngineRequest | None] = contextvars.ContextVar(
    "modtrace_engine_request", default=None
)


def current_engine_request() -> EngineRequest | None:
    """The engine request open in this thread or task (inside ``with hooks.request(...)``).

    Lets handler code deep inside a framework find its ledger id and report
    usage without the handle being passed down.
    """
    return _current.get()


# --- Headers ---------------------------------------------------------------------
def normalize_headers(headers: HeaderInput | None) -> dict[str, str]:
    """Headers as a ``{lower-case name: value}`` dict.

    Accepts a mapping or ``(name, value)`` pairs, ``str`` or ``bytes``
    (latin-1, as HTTP/1.1 and ASGI carry them). A name repeated with
    different values keeps them joined by ``", "``, as RFC 9110 folds
    repeated fields, so that a duplicated timer header reads as malformed
    rather than silently picking one.
    """
    if headers is None:
        return {}
    pairs = headers.items() if isinstance(headers, Mapping) else headers
    out: dict[str, str] = {}
    for name, value in pairs:
        key = (name.decode("latin-1") if isinstance(name, bytes) else str(name)).lower()
        text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
        if key in out and out[key] != text:
            out[key] = f"{out[key]}, {text}"
        else:
            out[key] = text
    return out


def extract_context(headers: HeaderInput | None) -> Context:
    """The trace context the caller sent (W3C ``traceparent`` by default).

    Uses the globally configured propagator, like every OpenTelemetry
    server instrumentation. Headers without a trace give an empty context,
    so the engine span starts a new trace.
    """
    return propagate.extract(normalize_headers(headers))


def _seconds(value: float) -> str:
    # repr() is the shortest string that reads back to the same float.
    return repr(float(value))


def timers_to_headers(timers: GpuTimers) -> dict[str, str]:
    """The response headers that carry ``timers`` (names in :mod:`modtrace.headers`).

    Unmeasured timers (``None``) are left out; the GPU count and source are
    always written. Values round-trip exactly through
    :func:`timers_from_headers`.
    """
    out: dict[str, str] = {}
    if timers.total is not None:
        out[H.GPU_SECONDS] = _seconds(timers.total)
    for name in COMPONENTS:
        value = getattr(timers, name)
        if value is not None:
            out[_COMPONENT_HEADERS[name]] = _seconds(value)
    out[H.GPU_COUNT] = str(timers.gpu_count)
    out[H.GPU_SOURCE] = timers.source
    return out


def _bad(errors: list[str] | None, reason: str) -> None:
    if errors is not None:
        errors.append(reason)


def timers_from_headers(
    headers: HeaderInput | None, *, errors: list[str] | None = None
) -> GpuTimers | None:
    """Read the GPU timers an engine returned, or ``None``.

    Tolerant: headers from another hop are data, not trusted input. Any
    malformed value (not a plain non-negative decimal, a repeated header
    with two values, a GPU count that is not a positive integer, a source
    label with odd characters, components adding up to more than the total)
    gives ``None`` for the whole set, and the reason is appended to
    ``errors`` when given: a gateway then records wall-clock time with an
    honest source label instead of half-trusted numbers.

    Args:
        headers: Response headers, a mapping or ``(name, value)`` pairs;
            names are case-insensitive.
        errors: Collects one reason per rejected set.

    Returns:
        The timers, or ``None`` when no timer header is present (neither the
        total nor a component) or a value is malformed.
    """
    found = normalize_headers(headers)
    present = [k for k in H.TIMER_HEADERS if k in found]
    if not any(k == H.GPU_SECONDS or k in _HEADER_COMPONENTS for k in present):
        if present:
            _bad(errors, "engine timers: no total or component header, only count/source")
        return None
    fields: dict[str, Any] = {}
    for key in present:
        raw = found[key].strip()
        if key == H.GPU_COUNT:
            if not _COUNT.fullmatch(raw):
                _bad(errors, f"engine timers: header {key}: {raw[:40]!r} is not a GPU count")
                return None
            fields["gpu_count"] = int(raw)
        elif key == H.GPU_SOURCE:
            if not _SOURCE.fullmatch(raw):
                _bad(errors, f"engine timers: header {key}: {raw[:40]!r} is not a source label")
                return None
            fields["source"] = raw
        else:
            value = float(raw) if _NUMBER.fullmatch(raw) else math.nan
            if not math.isfinite(value):
                reason = f"header {key}: {raw[:40]!r} is not a number of seconds"
                _bad(errors, f"engine timers: {reason}")
                return None
            fields["total" if key == H.GPU_SECONDS else _HEADER_COMPONENTS[key]] = value
    total = fields.get("total")
    parts = sum(fields.get(name) or 0.0 for name in COMPONENTS)
    if total is not None and parts > total * (1 + _SUM_TOLERANCE) + _SUM_TOLERANCE:
        _bad(errors, f"engine timers: components add up to {parts!r} s, over the total {total!r} s")
        return None
    fields.setdefault("source", "engine_headers")
    return GpuTimers(**fields)


# --- Server-sent events ------------------------------------------------------------
def sse_comment(headers: Mapping[str, str]) -> bytes:
    """An SSE comment block carrying ``headers``: one ``: name: value`` line each.

    Comment lines are ignored by every SSE parser (the openai client's
    included), so the block can sit in any OpenAI-compatible stream. It ends
    with a blank line, which dispatches nothing.
    """
    lines = "".join(f": {name}: {value}\n" for name, value in headers.items())
    return (lines + "\n").encode("utf-8") if lines else b""


def timers_from_sse(text: str | bytes, *, errors: list[str] | None = None) -> GpuTimers | None:
    """The timers in the ``: x-modtrace-...: value`` comment lines of an SSE stream.

    Args:
        text: The raw stream, or any part of it holding the comment block.
        errors: Collects the reason when a value is malformed.

    Returns:
        The timers, as :func:`timers_from_headers` reads them, or ``None``.
    """
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    pairs: list[tuple[str, str]] = []
    for line in text.splitlines():
        if not line.startswith(":"):
            continue
        name, sep, value = line[1:].strip().partition(":")
        if sep and name.strip().lower() in H.TIMER_HEADERS:
            pairs.append((name.strip(), value.strip()))
    return timers_from_headers(pairs, errors=errors) if pairs else None


# --- Usage ---------------------------------------------------------------------
def usage_units(usage: Mapping[str, Any]) -> dict[str, float]:
    """Unit counts from an OpenAI/vLLM ``usage`` object.

    ``prompt_tokens_details.{image,audio,video}_tokens`` (vLLM PR #45458)
    become ``<modality>.tokens``; ``text.tokens`` is what is left of
    ``prompt_tokens``. Malformed fields are skipped.
    """
    units: dict[str, float] = {}
    details = usage.get("prompt_tokens_details")
    media = 0
    if isinstance(details, Mapping):
        for modality in ("image", "audio", "video"):
            value = details.get(f"{modality}_tokens")
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                units[f"{modality}.tokens"] = float(value)
                media += value
    prompt = usage.get("prompt_tokens")
    if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= media:
        units["text.tokens"] = float(prompt - media)
    return units


# --- The per-request hooks ------------------------------------------------------------
class EngineHooks:
    """The engine side of modtrace for one server: ledger, tracer, span options.

    Args:
        ledger: The step ledger the engine records its steps in. The hooks
            only ever *finish* requests in it.
        tracer_provider: Where engine spans go; the global provider when ``None``.
        meter_provider: Where span failures are counted; the global one when ``None``.
        span_name: Name of the engine span until the model is known
            (then ``"{operation} {model}"``).
        operation: ``gen_ai.operation.name`` of the engine span.
        provider: ``gen_ai.provider.name``; the inference span's default when ``None``.
        record_usage: Write the engine's usage (exact token counts per
            modality) on the engine span as ``modtrace.units.*``, so that the
            attribution processor attributes the engine span by itself. Turn
            off where a gateway span in the same pipeline already carries the
            counts: the engine span is then marked ``modtrace.attribution.skip``
            and the processor leaves its seconds to the gateway span.
        request_id_header: The header whose value becomes the ledger request
            id when a caller sends one. Two requests in flight must not share
            a ledger account: a caller's id already in use (by a request in
            flight, or by an account still open in the ledger) is made
            unique with a suffix when the request is entered.
    """

    def __init__(
        self,
        ledger: StepLedger,
        *,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: object | None = None,
        span_name: str = "engine",
        operation: str = "chat",
        provider: str | None = None,
        record_usage: bool = True,
        request_id_header: str = H.REQUEST_ID,
    ) -> None:
        self.ledger = ledger
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.span_name = span_name
        self.operation = operation
        self.provider = provider
        self.record_usage = record_usage
        self.request_id_header = request_id_header.lower()
        # Ledger ids of the requests in flight (entered, not yet exited), with
        # how many use each: an id chosen by the engine code may repeat.
        self._in_flight: dict[str, int] = {}
        self._ids_lock = threading.Lock()

    def request(
        self,
        headers: HeaderInput | None = None,
        *,
        request_id: str | None = None,
        model: str | None = None,
    ) -> EngineRequest:
        """The hooks of one request; use it as a context manager (sync or async).

        Args:
            headers: The incoming request headers (trace context, request id).
            request_id: The ledger id, used as given; default: the
                ``x-request-id`` header (made unique when it is in use, see
                :attr:`EngineRequest.request_id`), else a new random id.
            model: The served model, when known up front.
        """
        found = normalize_headers(headers)
        rid = request_id or found.get(self.request_id_header) or uuid.uuid4().hex
        return EngineRequest(self, found, rid, model, unique=request_id is None)

    def _claim_id(self, request_id: str, *, unique: bool) -> str:
        """Mark ``request_id`` in flight; with ``unique``, first suffix it while it is in use."""
        with self._ids_lock:
            rid = request_id
            if unique:
                while rid in self._in_flight or rid in self.ledger:
                    rid = f"{request_id}-{uuid.uuid4().hex[:8]}"
            self._in_flight[rid] = self._in_flight.get(rid, 0) + 1
            return rid

    def _release_id(self, request_id: str) -> None:
        with self._ids_lock:
            left = self._in_flight.get(request_id, 0) - 1
            if left > 0:
                self._in_flight[request_id] = left
            else:
                self._in_flight.pop(request_id, None)


class EngineRequest(SyncAndAsync):
    """One request on the engine: its trace context, ledger id and engine span.

    Attributes:
        request_id: The id the engine must record this request's steps under.
            Final once the request is entered: a caller's ``x-request-id``
            that another request in flight uses (or that has an open ledger
            account) becomes ``"{id}-{8 hex digits}"`` there, so that two
            requests never share an account; the ASGI middleware passes the
            effective id to the app in that header.
        span: The open engine span handle (``None`` outside the ``with``).
    """

    __slots__ = (
        "_claimed_id",
        "_context_token",
        "_current_token",
        "_finished",
        "_headers",
        "_hooks",
        "_model",
        "_span_context",
        "_timers",
        "_unique",
        "_usage",
        "request_id",
        "span",
    )

    def __init__(
        self,
        hooks: EngineHooks,
        headers: dict[str, str],
        request_id: str,
        model: str | None,
        *,
        unique: bool = True,
    ) -> None:
        self._hooks = hooks
        self._headers = headers
        self._model = model
        self._unique = unique
        self._claimed_id: str | None = None
        self.request_id = request_id
        self.span: InferenceSpan | None = None
        self._span_context: Any = None
        self._context_token: object | None = None
        self._current_token: contextvars.Token[EngineRequest | None] | None = None
        self._timers: GpuTimers | None = None
        self._finished = False
        self._usage: Mapping[str, Any] | None = None

    # -- Lifecycle -------------------------------------------------------------------
    def __enter__(self) -> EngineRequest:
        hooks = self._hooks
        self.request_id = self._claimed_id = hooks._claim_id(self.request_id, unique=self._unique)
        try:
            self._context_token = otel_context.attach(extract_context(self._headers))
            name = f"{hooks.operation} {self._model}" if self._model else hooks.span_name
            self._span_context = inference_span(
                self._model,
                operation=hooks.operation,
                provider=hooks.provider,
                kind=SpanKind.SERVER,
                name=name,
                # Without its own counts the engine span defers to the gateway's.
                attributes=None if hooks.record_usage else {semconv.ATTRIBUTION_SKIP: True},
                tracer_provider=hooks.tracer_provider,
                meter_provider=hooks.meter_provider,
            )
            self.span = self._span_context.__enter__()
            self._current_token = _current.set(self)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self._close_span(exc_type, exc, tb)
        finally:
            current, self._current_token = self._current_token, None
            token, self._context_token = self._context_token, None
            leave_context(_current, current, token)
            claimed, self._claimed_id = self._claimed_id, None
            if claimed is not None:
                self._hooks._release_id(claimed)

    def _close_span(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        handle, scope = self.span, self._span_context
        if handle is None or scope is None:
            return
        timers = self.finish_timers()
        if timers is not None:
            handle.set_timers(timers)
        if self._usage is not None and self._hooks.record_usage:
            units = usage_units(self._usage)
            if units:
                handle.set_counts(units)
        self.span = self._span_context = None
        scope.__exit__(exc_type, exc, tb)

    # -- What the server tells the hooks --------------------------------------------------
    def set_model(self, model: str) -> None:
        """Name the served model once known (the span becomes ``"{operation} {model}"``).

        A model given to :meth:`EngineHooks.request` up front is kept.
        """
        if not model or self._model:
            return
        self._model = model
        handle = self.span
        if handle is None:
            return
        handle.model = model
        with contextlib.suppress(Exception):
            handle.span.update_name(f"{self._hooks.operation} {model}")
            handle.span.set_attribute(semconv.GEN_AI_REQUEST_MODEL, model)

    def set_usage(self, usage: Mapping[str, Any]) -> None:
        """The response's ``usage`` object; written on the span when it ends."""
        if isinstance(usage, Mapping):
            self._usage = usage

    def set_status(self, status: int) -> None:
        """The HTTP status sent; a 5xx marks the span as failed (HTTP server semantics)."""
        handle = self.span
        if handle is None or status < 500:
            return
        with contextlib.suppress(Exception):
            handle.span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
            handle.span.set_attribute(semconv.ERROR_TYPE, str(status))

    # -- Timers ------------------------------------------------------------------------
    def finish_timers(self) -> GpuTimers | None:
        """Close the request in the ledger and return its timers (``None`` if it had no step).

        Idempotent: later calls return the same timers. Steps recorded after
        the first call are not seen by this request.
        """
        if not self._finished:
            self._finished = True
            self._timers = self._hooks.ledger.finish(self.request_id, None)
        return self._timers

    def response_headers(self) -> dict[str, str]:
        """The timer headers of this request (finishing it in the ledger); ``{}`` without steps."""
        timers = self.finish_timers()
        return timers_to_headers(timers) if timers is not None else {}
