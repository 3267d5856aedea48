"""ASGI middleware for engine servers: continue the trace, return the GPU timers.

Pure ASGI (no framework), so it wraps vLLM's FastAPI app, a Starlette app or
a bare ASGI callable alike::

    app = EngineMiddleware(app, EngineHooks(ledger))

Per HTTP request it continues the caller's trace, opens the engine span
(:class:`modtrace.engine.hooks.EngineRequest`), gives the request a ledger
id, and returns the request's GPU timers. The handler finds its hooks as
``scope["state"]["modtrace"]`` (Starlette's ``request.state.modtrace``) or
:func:`modtrace.engine.hooks.current_engine_request`, and records the
request's engine steps in the ledger under ``request_id``. The id is the
caller's ``x-request-id`` when it sent one; otherwise one is made and added
to the request headers the app sees, so an app that keys its work by that
header (vLLM's OpenAI server does) uses the same id.

How the timers travel back:

* **Plain responses** (JSON): as headers (``x-modtrace-gpu-seconds``... see
  :mod:`modtrace.headers`), added to ``http.response.start``. An app that
  builds the whole body before starting the response (any JSON endpoint)
  has finished its engine steps by then.
* **Streaming responses** (``text/event-stream``): the headers are gone
  before the timers are known, and HTTP trailers do not help: browsers,
  httpx (hence the openai client), aiohttp and most proxies drop them, and
  h11 servers cannot send them. So the timers go in the stream itself, at
  its end, in two forms that OpenAI-compatible clients ignore:

  1. a ``"modtrace"`` object in the final usage chunk (the chunk with
     ``"usage"`` and no choices that ``stream_options.include_usage``
     asks for), holding the same ``name: value`` pairs as the headers.
     The openai client keeps unknown fields, so a gateway reads it from
     the parsed chunk (``chunk.model_extra["modtrace"]``);
  2. always, an SSE comment block (``: x-modtrace-gpu-seconds: 0.0123``,
     one line per header) right before ``data: [DONE]``, or at the end of a
     stream without one. SSE parsers drop comment lines by specification,
     so this reaches only code that reads the raw stream, and never breaks
     a client.

  A client that stops reading early gets neither; the engine span still
  records what the request used (the ledger is closed when the response
  ends).

The engine span also learns the served model (``model`` of the response
body or first chunk) and the response's ``usage``, and is marked failed on a
5xx status or an exception from the app (which propagates unchanged).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any

from ..timing import StepLedger
from .hooks import USAGE_EXTENSION, EngineHooks, EngineRequest, sse_comment

__all__ = ["INFERENCE_PATHS", "STATE_KEY", "EngineMiddleware", "engine_request_from_scope"]

# The ASGI interface, as modtrace's middlewares and the reference server type it.
Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: Key of the :class:`EngineRequest` in ``scope["state"]`` (``request.state.modtrace``).
STATE_KEY = "modtrace"
#: The paths traced by default (POST only): the OpenAI-compatible endpoints that
#: run the model. Health probes, metrics scrapes and model listings are not
#: requests to attribute.
INFERENCE_PATHS: frozenset[str] = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/v1/embeddings",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
    }
)

# One SSE event ends at a blank line; servers write \n, \r\n or \r line ends.
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_DONE = b"[DONE]"


def engine_request_from_scope(scope: Scope) -> EngineRequest | None:
    """The :class:`EngineRequest` the middleware put in an ASGI scope, or ``None``."""
    state = scope.get("state")
    found = state.get(STATE_KEY) if isinstance(state, MutableMapping) else None
    return found if isinstance(found, EngineRequest) else None


class EngineMiddleware:
    """Wrap an engine's ASGI app so every request returns its GPU timers.

    Args:
        app: The engine's ASGI app.
        hooks: The engine hooks (ledger, tracer provider, span options);
            built from ``ledger`` when omitted.
        ledger: The engine's step ledger, when ``hooks`` is omitted.
        paths: Only POST requests to these paths are traced; by default
            :data:`INFERENCE_PATHS` (``/v1/chat/completions``,
            ``/v1/completions``, ``/v1/responses``...), every POST when
            ``None``. Other requests (``GET /health``, ``/metrics``,
            ``/v1/models``) pass through untouched, with no span.
        max_sniff_bytes: Largest JSON response body read for ``usage`` and
            ``model``; bigger bodies pass through unread.
    """

    def __init__(
        self,
        app: ASGIApp,
        hooks: EngineHooks | None = None,
        *,
        ledger: StepLedger | None = None,
        paths: Collection[str] | None = INFERENCE_PATHS,
        max_sniff_bytes: int = 1 << 20,
    ) -> None:
        if hooks is None:
            if ledger is None:
                msg = "EngineMiddleware needs hooks= or ledger="
                raise ValueError(msg)
            hooks = EngineHooks(ledger)
        self.app = app
        self.hooks = hooks
        self.paths = frozenset(paths) if paths is not None else None
        self.max_sniff_bytes = max_sniff_bytes

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
        request = self.hooks.request(scope.get("headers") or ())
        with request:
            # Entered: the ledger id is final (a duplicate caller id was made unique).
            scope = dict(scope)
            scope["headers"] = _with_request_id(
                list(scope.get("headers") or ()), self.hooks.request_id_header, request.request_id
            )
            state = scope.get("state")
            state = dict(state) if isinstance(state, MutableMapping) else {}
            state[STATE_KEY] = request
            scope["state"] = state
            responder = _Responder(request, send, self.max_sniff_bytes)
            await self.app(scope, receive, responder.send)


def _with_request_id(
    headers: list[tuple[bytes, bytes]], name: str, request_id: str
) -> list[tuple[bytes, bytes]]:
    """The request headers carrying the ledger id under ``name``, once.

    Unchanged when the caller's header already holds it; otherwise the header
    is added, or replaced by the effective id (a duplicate id made unique).
    """
    key = name.encode("latin-1")
    value = request_id.encode("latin-1")
    found = [v for k, v in headers if k.lower() == key]
    if found == [value]:
        return headers
    return [*((k, v) for k, v in headers if k.lower() != key), (key, value)]


class _Responder:
    """Rewrites one response on its way out: timer headers, or the end of an SSE stream."""

    __slots__ = (
        "_buffer",
        "_comment_sent",
        "_json",
        "_model_seen",
        "_request",
        "_send",
        "_sniff",
        "_sniff_limit",
        "_streaming",
    )

    def __init__(self, request: EngineRequest, send: Send, sniff_limit: int) -> None:
        self._request = request
        self._send = send
        self._sniff_limit = sniff_limit
        self._streaming = False
        self._json = False
        self._buffer = b""  # SSE: the unfinished event; JSON: the body so far
        self._sniff: bytearray | None = None
        self._comment_sent = False
        self._model_seen = False

    async def send(self, message: Message) -> None:
        kind = message.get("type")
        if kind == "http.response.start":
            await self._send(self._start(message))
        elif kind == "http.response.body" and self._streaming:
            await self._stream_body(message)
        elif kind == "http.response.body":
            self._sniff_body(message)
            await self._send(message)
        else:
            await self._send(message)

    # -- Start ----------------------------------------------------------------------
    def _start(self, message: Message) -> Message:
        status = int(message.get("status", 200))
        self._request.set_status(status)
        headers = list(message.get("headers") or ())
        content_type = b""
        for name, value in headers:
            if name.lower() == b"content-type":
                content_type = value.lower()
        self._streaming = content_type.startswith(b"text/event-stream")
        self._json = content_type.startswith(b"application/json")
        if self._streaming:
            # The stream grows by the timer block: a declared length would be wrong.
            headers = [(k, v) for k, v in headers if k.lower() != b"content-length"]
        else:
            self._sniff = bytearray() if self._json else None
            for name, value in self._request.response_headers().items():
                headers.append((name.encode("latin-1"), value.encode("latin-1")))
        return {**message, "headers": headers}

    # -- Plain bodies ---------------------------------------------------------------------
    def _sniff_body(self, message: Message) -> None:
        sniff = self._sniff
        if sniff is None:
            return
        sniff += message.get("body", b"")
        if len(sniff) > self._sniff_limit:
            self._sniff = None
            return
        if not message.get("more_body", False):
            self._sniff = None
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                self._note(json.loads(bytes(sniff)))

    def _note(self, data: object) -> None:
        """Tell the hooks the model and usage found in a response object."""
        if not isinstance(data, dict):
            return
        model = data.get("model")
        if isinstance(model, str) and not self._model_seen:
            self._model_seen = True
            self._request.set_model(model)
        usage = data.get("usage")
        if isinstance(usage, dict):
            self._request.set_usage(usage)

    # -- Streams ------------------------------------------------------------------------------
    async def _stream_body(self, message: Message) -> None:
        data = self._buffer + message.get("body", b"")
        more = bool(message.get("more_body", False))
        out = bytearray()
        start = 0
        for match in _EVENT_END.finditer(data):
            out += self._event(data[start : match.end()])
            start = match.end()
        self._buffer = data[start:]
        if not more:
            # A last event without its blank line still goes out as it came.
            out += self._buffer
            self._buffer = b""
            out += self._comment()
        if out or not more:
            await self._send({**message, "body": bytes(out), "more_body": more})

    def _event(self, event: bytes) -> bytes:
        """One complete SSE event, rewritten when it is the usage chunk or ``[DONE]``."""
        payload = _data(event)
        if payload is None:
            return event
        if payload.strip() == _DONE:
            return self._comment() + event
        if self._model_seen and b'"usage"' not in payload:
            return event
        try:
            chunk = json.loads(payload)
        except (ValueError, UnicodeDecodeError):
            return event
        self._note(chunk)
        if not _is_usage_chunk(chunk):
            return event
        timers = self._request.response_headers()
        if not timers:
            return event
        chunk[USAGE_EXTENSION] = timers
        # Same framing as the app's: one data line, its own line end.
        end = event[len(event.rstrip(b"\r\n")) :]
        return b"data: " + json.dumps(chunk, separators=(",", ":")).encode() + end

    def _comment(self) -> bytes:
        if self._comment_sent:
            return b""
        self._comment_sent = True
        return sse_comment(self._request.response_headers())


def _data(event: bytes) -> bytes | None:
    """The ``data:`` payload of an SSE event (lines joined by ``\\n``), or ``None``."""
    lines = [
        line[5:].removeprefix(b" ") for line in event.splitlines() if line.startswith(b"data:")
    ]
    return b"\n".join(lines) if lines else None


def _is_usage_chunk(chunk: object) -> bool:
    """The final usage chunk: a ``usage`` object and no choices (OpenAI ``include_usage``)."""
    return (
        isinstance(chunk, dict)
        and isinstance(chunk.get("usage"), dict)
        and chunk.get("choices") in ([], None)
    )
