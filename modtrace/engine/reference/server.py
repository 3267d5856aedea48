"""The reference engine's HTTP server: OpenAI ``/v1/chat/completions``, as vLLM serves it.

A pure ASGI app (no web framework: the engine needs one route, and the
modtrace middleware in front of it is framework-free too) served by uvicorn:

* ``POST /v1/chat/completions``: vLLM's request shapes (``messages`` with
  ``image_url``, ``input_audio`` and ``audio_url`` parts as base64 ``data:``
  URLs, ``max_tokens``/``max_completion_tokens``, ``mm_processor_kwargs``,
  ``stream`` with ``stream_options.include_usage``) and vLLM's ``usage``,
  with ``prompt_tokens_details``. Errors use vLLM's body,
  ``{"error": {"message", "type", "param", "code"}}``;
* ``GET /v1/models`` and ``GET /health``.

:func:`create_app` wraps the app in :class:`modtrace.engine.EngineMiddleware`,
so every completion continues the caller's trace, gets an engine span, and
returns its GPU timers (headers, or the end of the stream).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..asgi import EngineMiddleware, Receive, Scope, Send, engine_request_from_scope
from ..hooks import EngineHooks, normalize_headers
from .engine import EngineConfig, EngineEvent, ReferenceEngine, chat_completion, usage
from .processing import PreparedRequest, RequestError

__all__ = [
    "FAULT_HEADER",
    "ReferenceApp",
    "RunningServer",
    "create_app",
    "start_server",
]


#: Request header read when ``EngineConfig.allow_fault_injection`` is on:
#: ``prefill`` (the prefill fails: a 500 after the encoders ran) or
#: ``delay=SECONDS`` (the response waits; for client timeouts).
FAULT_HEADER = "x-reference-engine-fault"
#: Largest request body accepted (base64 media included).
MAX_BODY = 64 << 20
_JSON = [(b"content-type", b"application/json")]
_SSE = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


def _error_body(status: int, message: str, kind: str) -> bytes:
    error = {"message": message, "type": kind, "param": None, "code": status}
    return json.dumps({"error": error}).encode()


class ReferenceApp:
    """The ASGI app of the reference engine (without the modtrace middleware).

    Args:
        engine: The engine; started on the first request or at lifespan startup.
    """

    def __init__(self, engine: ReferenceEngine) -> None:
        self.engine = engine

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope.get("type")
        if kind == "lifespan":
            await self._lifespan(receive, send)
            return
        if kind != "http":
            return
        path, method = scope.get("path", ""), scope.get("method", "GET")
        if path == "/v1/chat/completions" and method == "POST":
            await self._chat(scope, receive, send)
        elif path == "/health" and method == "GET":
            await _send_json(send, 200, b"{}")
        elif path == "/v1/models" and method == "GET":
            model = {"id": self.engine.config.model_name, "object": "model", "owned_by": "modtrace"}
            await _send_json(send, 200, json.dumps({"object": "list", "data": [model]}).encode())
        else:
            await _send_json(send, 404, _error_body(404, f"no route {path}", "NotFoundError"))

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await asyncio.to_thread(self.engine.start)
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await asyncio.to_thread(self.engine.stop)
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            body = await _read_json(receive)
            headers = normalize_headers(scope.get("headers") or ())
            hooks = engine_request_from_scope(scope)
            prepared = await asyncio.to_thread(
                self.engine.prepare,
                body,
                request_id=hooks.request_id if hooks is not None else None,
                headers=headers,
            )
            if hooks is not None:
                hooks.set_model(prepared.model)
            delay = self._fault(prepared, headers)
            if delay:
                await asyncio.sleep(delay)
        except RequestError as exc:
            await _send_json(send, exc.status, _error_body(exc.status, exc.message, exc.kind))
            return
        if prepared.stream:
            await self._stream(prepared, receive, send)
            return
        text: list[str] = []
        async for event in self.engine.generate(prepared):
            if event.kind == "token":
                text.append(event.text)
            elif event.kind == "error":
                body_error = _error_body(500, str(event.error), "InternalServerError")
                await _send_json(send, 500, body_error)
                return
            else:
                response = chat_completion(prepared, "".join(text), event)
                await _send_json(send, 200, json.dumps(response).encode())

    def _fault(self, prepared: PreparedRequest, headers: dict[str, str]) -> float:
        """Apply an injected fault (when allowed); the delay in seconds to wait."""
        fault = headers.get(FAULT_HEADER)
        if not fault or not self.engine.config.allow_fault_injection:
            return 0.0
        if fault == "prefill":
            prepared.fault = "prefill"
            return 0.0
        name, _, value = fault.partition("=")
        if name == "delay":
            with contextlib.suppress(ValueError):
                return max(0.0, float(value))
        raise RequestError(400, f"{FAULT_HEADER}: unknown fault {fault!r}")

    async def _stream(self, prepared: PreparedRequest, receive: Receive, send: Send) -> None:
        """Send the completion as server-sent events, as vLLM does."""
        created = int(time.time())
        base = {
            "id": f"chatcmpl-{prepared.request_id}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": prepared.model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return b"data: " + json.dumps({**base, "choices": [choice]}).encode() + b"\n\n"

        disconnected = asyncio.Event()
        watcher = asyncio.create_task(_watch_disconnect(receive, disconnected))
        events = self.engine.generate(prepared)
        try:
            await send({"type": "http.response.start", "status": 200, "headers": _SSE})
            await _body(send, chunk({"role": "assistant", "content": ""}))
            async for event in events:
                if disconnected.is_set():
                    return
                await _body(send, self._stream_event(event, prepared, base, chunk))
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        except OSError:
            return  # the client went away mid-write
        finally:
            watcher.cancel()
            # Closing the generator aborts the request in the engine if it still runs.
            await events.aclose()

    @staticmethod
    def _stream_event(
        event: EngineEvent,
        prepared: PreparedRequest,
        base: dict[str, Any],
        chunk: Callable[..., bytes],
    ) -> bytes:
        if event.kind == "token":
            return chunk({"content": event.text})
        if event.kind == "error":
            error = {"message": str(event.error), "type": "InternalServerError", "code": 500}
            return b"data: " + json.dumps({"error": error}).encode() + b"\n\n"
        out = chunk({}, event.finish_reason)
        if prepared.include_usage:
            final = {**base, "choices": [], "usage": usage(prepared, event)}
            out += b"data: " + json.dumps(final).encode() + b"\n\n"
        return out


async def _watch_disconnect(receive: Receive, disconnected: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            disconnected.set()
            return


async def _body(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def _send_json(send: Send, status: int, body: bytes) -> None:
    headers = [*_JSON, (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _read_json(receive: Receive) -> dict[str, Any]:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            raise RequestError(400, "client disconnected")
        data = message.get("body", b"")
        size += len(data)
        if size > MAX_BODY:
            raise RequestError(413, f"request body over {MAX_BODY} bytes")
        chunks.append(data)
        if not message.get("more_body", False):
            break
    try:
        body = json.loads(b"".join(chunks))
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"request body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    return body


def create_app(
    engine: ReferenceEngine | None = None,
    *,
    config: EngineConfig | None = None,
    hooks: EngineHooks | None = None,
) -> EngineMiddleware:
    """The reference engine as an ASGI app, behind the modtrace engine middleware.

    Args:
        engine: A built engine; one is built from ``config`` when omitted.
        config: Settings of the engine built here.
        hooks: Engine hooks (tracer provider, span options); default: hooks
            on the engine's ledger with the global tracer provider.
    """
    engine = engine or ReferenceEngine(config)
    hooks = hooks or EngineHooks(engine.ledger)
    if hooks.ledger is not engine.ledger:
        msg = "hooks.ledger must be the engine's ledger"
        raise ValueError(msg)
    return EngineMiddleware(ReferenceApp(engine), hooks, paths={"/v1/chat/completions"})


@dataclass
class RunningServer:
    """A reference engine served on a local port, in a background thread.

    Attributes:
        host: The bound address.
        port: The bound port.
        engine: The engine behind it.
    """

    host: str
    port: int
    engine: ReferenceEngine
    _server: Any
    _thread: threading.Thread

    @property
    def url(self) -> str:
        """``http://HOST:PORT`` (append ``/v1`` for an openai client's ``base_url``)."""
        return f"http://{self.host}:{self.port}"

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and stop the engine thread."""
        self._server.should_exit = True
        self._thread.join(timeout)
        self.engine.stop()

    def __enter__(self) -> RunningServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def bind(host: str = "127.0.0.1", port: int = 0) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``0``: a free port)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(128)
    return sock


def start_server(
    engine: ReferenceEngine | None = None,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    config: EngineConfig | None = None,
    hooks: EngineHooks | None = None,
    log_level: str = "warning",
    ready_timeout: float = 60.0,
) -> RunningServer:
    """Serve the reference engine with uvicorn in a background thread.

    Returns once the server accepts connections.

    Args:
        engine: A built engine; one is built from ``config`` when omitted.
        host: The address to bind (keep it on loopback).
        port: The port; ``0`` picks a free one (read ``RunningServer.port``).
        config: Settings of an engine built here.
        hooks: Engine hooks (tracer provider, span options).
        log_level: uvicorn's log level.
        ready_timeout: Seconds to wait for the server to start.

    Raises:
        RuntimeError: The server did not start in time.
    """
    import uvicorn

    engine = engine or ReferenceEngine(config)
    app = create_app(engine, hooks=hooks)
    sock = bind(host, port)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level=log_level, lifespan="on", access_log=False)
    )
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, name="modtrace-reference-server", daemon=True
    )
    thread.start()
    deadline = time.monotonic() + ready_timeout
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            msg = "the reference engine server did not start"
            raise RuntimeError(msg)
        time.sleep(0.01)
    bound = sock.getsockname()
    return RunningServer(bound[0], bound[1], engine, server, thread)
