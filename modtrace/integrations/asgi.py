"""Gateway middleware for ASGI apps: count and trace the requests a gateway receives.

Pure ASGI (no framework), so it wraps a FastAPI or Starlette app, or a bare
ASGI callable, with no dependency::

    app = GatewayMiddleware(app, config=CountingConfig(model_profiles={...}))

Per request on the configured paths (``POST /v1/chat/completions`` by default):

1. **Reads the body without consuming it**: the request's body messages are
   read up front and replayed to the app unchanged, so the app reads the
   same bytes.
2. **Counts** the JSON body with the counting profile of its model, reading
   the video and audio metadata headers (``x-llm-d-video-fps``,
   ``x-llm-d-video-duration-seconds``, ``x-llm-d-video-resolution``,
   ``x-modtrace-audio-duration-seconds``).
3. **Opens the inference span** (kind ``SERVER``, ``chat {model}``),
   continuing the caller's trace (``traceparent``) or the current server
   span, and makes it current for the app. The app finds it as
   ``scope["state"]["modtrace_gateway"]`` (Starlette:
   ``request.state.modtrace_gateway``) or with
   :func:`modtrace.spans.current_inference_span`.

**One inference span per request.** This span *is* the request's
inference span: an instrumented openai call inside it
(:func:`modtrace.integrations.openai.instrument_openai`) does not open a
second one but writes the engine's usage, the differences and the
engine-reported GPU timers on this span, and its ``traceparent`` makes the
engine's span a child of it. So the attribution processor attributes each
request once, with the gateway's counts and the engine's measured seconds.

When no engine timers reach the span by the end of a successful (2xx)
response, it records the request's wall clock with
``modtrace.gpu.source = gateway_wall_clock`` (turn off with
``wall_clock_fallback=False``). A 5xx response or an exception from the app
marks the span failed; the exception propagates unchanged.

**Never in the way.** Whatever fails before the app runs (a body nested past
the recursion limit, a counter or propagator raising, strict mode) is logged
and the request passes to the app untraced, its body replayed unchanged.
Once counted, the middleware lets the body go: neither its bytes, nor its
messages, nor the parsed JSON stay referenced while the app runs (a stream
can last minutes). With a counter that has a URL resolver, counting (which
may fetch media) runs in a worker thread, off the event loop.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import time
from collections.abc import Collection, MutableMapping
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import semconv
from ..counting.counter import CountingConfig, RequestCounter
from ..engine.asgi import ASGIApp, Message, Receive, Scope, Send
from ..engine.hooks import extract_context, normalize_headers
from ..spans.inference import InferenceSpan, InferenceSpanContext, inference_span
from ._common import wall_clock_timers

__all__ = ["DEFAULT_PATHS", "GATEWAY_STATE_KEY", "GatewayMiddleware", "gateway_span_from_scope"]


_log = logging.getLogger(__name__)

#: Key of the gateway's :class:`InferenceSpan` in ``scope["state"]``.
GATEWAY_STATE_KEY = "modtrace_gateway"
#: The paths traced by default.
DEFAULT_PATHS: frozenset[str] = frozenset({"/v1/chat/completions"})
#: Largest request body read and counted (base64 media included); bigger ones
#: pass through uncounted.
DEFAULT_MAX_BODY = 64 << 20


def gateway_span_from_scope(scope: Scope) -> InferenceSpan | None:
    """The inference span :class:`GatewayMiddleware` put in an ASGI scope, or ``None``."""
    state = scope.get("state")
    found = state.get(GATEWAY_STATE_KEY) if isinstance(state, MutableMapping) else None
    return found if isinstance(found, InferenceSpan) else None


async def read_body(receive: Receive, limit: int) -> tuple[list[Message], bytes | None]:
    """Read a request's body messages.

    Returns:
        Every message received (to replay to the app) and the whole body, or
        ``None`` for the body when the client went away or it exceeds ``limit``
        bytes (reading stops there; the app reads the rest itself).
    """
    messages: list[Message] = []
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message.get("type") != "http.request":
            return messages, None
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return messages, None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return messages, b"".join(chunks)


def replay(messages: list[Message], receive: Receive) -> Receive:
    """A ``receive`` that returns ``messages`` first, then what ``receive`` returns.

    Each message is let go once returned; ``messages`` itself is emptied,
    so that the caller's list holds no body either.
    """
    pending = collections.deque(messages)
    messages.clear()

    async def receive_again() -> Message:
        if pending:
            return pending.popleft()
        return await receive()

    return receive_again


def json_object(body: bytes | None) -> dict[str, Any] | None:
    """The body as a JSON object, or ``None`` (absent, not JSON, not an object).

    Any parsing failure is "not JSON": a body nested past the recursion limit
    raises ``RecursionError``, which the app, not the middleware, answers.
    """
    if not body:
        return None
    try:
        found = json.loads(body)
    except Exception:
        return None
    return found if isinstance(found, dict) else None


class GatewayMiddleware:
    """Wrap a gateway's ASGI app so every request it receives gets a counted inference span.

    Args:
        app: The gateway's ASGI app.
        counter: A reusable request counter.
        config: The counting configuration (``model_profiles`` maps model
            names to profiles), when ``counter`` is not given.
        paths: Traced paths (POST only); every POST when ``None``.
        operation: ``gen_ai.operation.name`` of the spans.
        tracer_provider: Where spans go; the global provider when ``None``.
        meter_provider: Where failures are counted; the global one when ``None``.
        max_body_bytes: Largest body read and counted.
        wall_clock_fallback: Record the request's wall clock (source
            ``gateway_wall_clock``) on a 2xx response without engine timers.

    Raises:
        ValueError: both ``counter`` and ``config`` were given.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        counter: RequestCounter | None = None,
        config: CountingConfig | None = None,
        paths: Collection[str] | None = DEFAULT_PATHS,
        operation: str = "chat",
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: object | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY,
        wall_clock_fallback: bool = True,
    ) -> None:
        if counter is not None and config is not None:
            msg = "pass counter= or config=, not both"
            raise ValueError(msg)
        self.app = app
        self.counter = counter or RequestCounter(config)
        self.paths = frozenset(paths) if paths is not None else None
        self.operation = operation
        self.tracer_provider = tracer_provider
        self.meter_provider = meter_provider
        self.max_body_bytes = max_body_bytes
        self.wall_clock_fallback = wall_clock_fallback

    def _traced(self, scope: Scope) -> bool:
        return (
            scope.get("type") == "http"
            and scope.get("method") == "POST"
            and (self.paths is None or scope.get("path") in self.paths)
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not self._traced(scope):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        messages, body = await read_body(receive, self.max_body_bytes)
        oversized = bool(messages) and body is None and messages[-1].get("type") == "http.request"
        receive = replay(messages, receive)  # empties messages: the replay holds them alone
        opened = await self._open(scope, body, oversized)
        del body  # counted: from here only the app's own reads hold the body
        if opened is None:
            await self.app(scope, receive, send)
            return
        span, handle, token = opened
        try:
            recorder = _StatusRecorder(send)
            try:
                await self.app(_with_state(scope, handle), receive, recorder.send)
            except BaseException as exc:
                span.__exit__(type(exc), exc, exc.__traceback__)
                raise
            try:
                self._close(handle, recorder.status, started)
            finally:
                span.__exit__(None, None, None)
        finally:
            if token is not None:
                with contextlib.suppress(Exception):
                    otel_context.detach(token)

    async def _open(
        self, scope: Scope, body: bytes | None, oversized: bool
    ) -> tuple[InferenceSpanContext, InferenceSpan, object | None] | None:
        """Count the body and open the request's span, made current; ``None`` on any failure.

        Returns:
            The entered span scope, its handle and the context token to detach,
            or ``None``: the request then passes to the app untraced (logged).
        """
        token = None
        try:
            headers = normalize_headers(scope.get("headers") or ())
            request = json_object(body)
            # Continue the caller's trace, unless a server span (another ASGI
            # instrumentation around this one) already did.
            current = trace.get_current_span().get_span_context()
            token = None if current.is_valid else otel_context.attach(extract_context(headers))
            model = request.get("model") if request is not None else None
            span = inference_span(
                model if isinstance(model, str) else None,
                request=request,
                headers=headers,
                counter=self.counter,
                operation=self.operation,
                kind=SpanKind.SERVER,
                attributes={
                    semconv.HTTP_REQUEST_METHOD: "POST",
                    semconv.URL_PATH: str(scope.get("path", "")),
                },
                tracer_provider=self.tracer_provider,
                meter_provider=self.meter_provider,
            )
            del request, headers  # the span scope holds them until counted
            handle = await span.__aenter__()
            try:
                if oversized:
                    reason = f"request body over {self.max_body_bytes} bytes: not counted"
                    handle.fail("count", reason)
            except BaseException as exc:  # strict mode: this span is not the request's
                with contextlib.suppress(Exception):
                    handle.span.set_attribute(semconv.ATTRIBUTION_SKIP, True)
                span.__exit__(type(exc), exc, exc.__traceback__)
                raise
            return span, handle, token
        except BaseException as exc:
            if token is not None:
                with contextlib.suppress(Exception):
                    otel_context.detach(token)
            if not isinstance(exc, Exception):  # cancelled: the request goes no further
                raise
            _log.exception("modtrace: could not trace a gateway request; it passes untraced")
            return None

    def _close(self, handle: InferenceSpan, status: int | None, started: float) -> None:
        """The app returned: the response status on the span, and the wall-clock fallback."""
        try:
            span = handle.span
            if status is not None:
                span.set_attribute(semconv.HTTP_RESPONSE_STATUS_CODE, status)
                if status >= 500:
                    span.set_status(Status(StatusCode.ERROR, f"HTTP {status}"))
                    span.set_attribute(semconv.ERROR_TYPE, str(status))
            ok = status is not None and 200 <= status < 300
            if handle.timers is None and ok and self.wall_clock_fallback:
                handle.set_timers(wall_clock_timers(time.perf_counter() - started))
        except Exception:  # the response is out: never raise into the server for a span
            _log.exception("modtrace: could not record a gateway response")


def _with_state(scope: Scope, handle: InferenceSpan) -> Scope:
    """A copy of ``scope`` whose ``state`` holds the gateway span."""
    scope = dict(scope)
    state = scope.get("state")
    state = dict(state) if isinstance(state, MutableMapping) else {}
    state[GATEWAY_STATE_KEY] = handle
    scope["state"] = state
    return scope


class _StatusRecorder:
    """Passes the response through, noting its status."""

    __slots__ = ("_send", "status")

    def __init__(self, send: Send) -> None:
        self._send = send
        self.status: int | None = None

    async def send(self, message: Message) -> None:
        if message.get("type") == "http.response.start":
            self.status = int(message.get("status", 200))
        await self._send(message)
