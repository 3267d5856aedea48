"""EngineMiddleware around tiny ASGI apps: trace, ledger id, timer headers, streams."""

from __future__ import annotations

import asyncio
import json
import math
from types import SimpleNamespace
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from modtrace import semconv
from modtrace.engine import (
    STATE_KEY,
    USAGE_EXTENSION,
    EngineHooks,
    EngineMiddleware,
    current_engine_request,
    engine_request_from_scope,
    timers_from_headers,
    timers_from_sse,
)
from modtrace.timers import GpuTimers
from modtrace.timing import StepLedger

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
USAGE = {
    "prompt_tokens": 50,
    "completion_tokens": 3,
    "total_tokens": 53,
    "prompt_tokens_details": {"cached_tokens": 0, "image_tokens": 20},
}


@pytest.fixture
def env():
    """A ledger, hooks on an in-memory tracer provider, and the spans they export."""
    exporter = InMemorySpanExporter()
    tracers = TracerProvider()
    tracers.add_span_processor(SimpleSpanProcessor(exporter))
    ledger = StepLedger()
    yield SimpleNamespace(
        ledger=ledger,
        hooks=EngineHooks(ledger, tracer_provider=tracers),
        exporter=exporter,
    )
    tracers.shutdown()


def call(
    app: Any, path: str = "/v1/chat/completions", headers: list | None = None, **scope: Any
) -> list[dict]:
    """Run one HTTP request through an ASGI app; the messages it sent."""
    sent: list[dict] = []
    full = {
        "type": "http",
        "method": "POST",
        "path": path,
        "headers": headers if headers is not None else [(b"traceparent", TRACEPARENT.encode())],
        **scope,
    }

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(app(full, receive, send))
    return sent


def response_headers(sent: list[dict]) -> dict[str, str]:
    """The response headers of the start message, decoded."""
    start = next(m for m in sent if m["type"] == "http.response.start")
    return {k.decode(): v.decode() for k, v in start["headers"]}


def body(sent: list[dict]) -> bytes:
    """The response body, all chunks joined."""
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def work(ledger: StepLedger, request_id: str) -> None:
    """Engine steps of one request, shared with another request in the batch."""
    ledger.record_step_ns(3_000_000, {request_id: 3, "neighbour": 1}, "vision_encoder")
    ledger.record_step_ns(2_000_000, {request_id: 10}, "prefill")
    ledger.record_step_ns(500_000, {request_id: 1}, "decode")


def json_app(ledger: StepLedger, status: int = 200, seen: dict | None = None) -> Any:
    """A non-streaming app: runs engine steps for the ledger id it is given, answers JSON.

    ``seen`` receives the scope the app was called with.
    """

    async def app(scope: dict, receive: Any, send: Any) -> None:
        if seen is not None:
            seen.update(scope)
        await receive()
        request = engine_request_from_scope(scope)
        assert current_engine_request() is request
        work(ledger, request.request_id)
        payload = json.dumps({"model": "served-model", "choices": [], "usage": USAGE}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    return app


def sse_app(ledger: StepLedger, pieces: list[bytes]) -> Any:
    """A streaming app: runs engine steps, then sends ``pieces`` as body chunks."""

    async def app(scope: dict, receive: Any, send: Any) -> None:
        request = engine_request_from_scope(scope)
        work(ledger, request.request_id)
        headers = [(b"content-type", b"text/event-stream"), (b"content-length", b"999")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for piece in pieces:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


def sse_stream(line_end: bytes = b"\n", *, usage: bool = True, done: bool = True) -> bytes:
    """An OpenAI chat stream: role, two tokens, finish, the usage chunk, [DONE]."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "served-model"}
    chunks = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {**base, "choices": [{"index": 0, "delta": {"content": "hi"}}]},
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    if usage:
        chunks.append({**base, "choices": [], "usage": USAGE})
    events = [b"data: " + json.dumps(c).encode() for c in chunks]
    if done:
        events.append(b"data: [DONE]")
    return b"".join(e + line_end + line_end for e in events)


def expected_timers(env: SimpleNamespace) -> GpuTimers:
    """The timers of a request that ran ``work``: what the ledger split gives it."""
    other = StepLedger()
    work(other, "r")
    return other.finish("r")


class TestPlainResponses:
    """JSON responses: timers in headers, span continued and informed."""

    def test_timer_headers_and_the_engine_span(self, env) -> None:
        """Headers carry the request's ledger timers; the span joins the caller's trace."""
        seen: dict = {}
        sent = call(EngineMiddleware(json_app(env.ledger, seen=seen), env.hooks))
        timers = timers_from_headers(response_headers(sent))
        assert timers == expected_timers(env)
        assert math.isclose(timers.vision_encoder, 0.003 * 3 / 4)
        assert json.loads(body(sent))["usage"] == USAGE  # the body passes through unchanged
        (span,) = env.exporter.get_finished_spans()
        assert span.kind is SpanKind.SERVER
        assert f"{span.context.trace_id:032x}" == TRACE_ID
        assert span.name == "chat served-model"
        assert span.attributes[semconv.GPU_SECONDS] == timers.total
        assert span.attributes[semconv.unit("image.tokens")] == 20
        assert span.attributes[semconv.unit("text.tokens")] == 30
        assert isinstance(seen["state"][STATE_KEY].request_id, str)
        assert len(env.ledger) == 1  # only the neighbour is still open

    def test_request_id_header_is_the_ledger_id_and_is_added_when_missing(self, env) -> None:
        """The caller's x-request-id is used; without one, one is added for the app."""
        seen: dict = {}
        app = EngineMiddleware(json_app(env.ledger, seen=seen), env.hooks)
        call(app, headers=[(b"x-request-id", b"caller-7")])
        assert seen["state"][STATE_KEY].request_id == "caller-7"
        assert [v for k, v in seen["headers"] if k == b"x-request-id"] == [b"caller-7"]
        call(app, headers=[])
        (added,) = [v for k, v in seen["headers"] if k == b"x-request-id"]
        assert added.decode() == seen["state"][STATE_KEY].request_id

    def test_a_duplicate_request_id_reaches_the_app_made_unique(self, env) -> None:
        """Two requests in flight with one x-request-id: each app sees its own ledger id."""
        seen: list[tuple[str, list[bytes]]] = []
        both_in = asyncio.Event()

        async def app(scope: dict, receive: Any, send: Any) -> None:
            await receive()
            request = engine_request_from_scope(scope)
            ids = [v for k, v in scope["headers"] if k == b"x-request-id"]
            seen.append((request.request_id, ids))
            if len(seen) == 2:
                both_in.set()
            await both_in.wait()
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        middleware = EngineMiddleware(app, env.hooks)

        async def one() -> None:
            scope = {
                "type": "http",
                "method": "POST",
                "path": "/v1/chat/completions",
                "headers": [(b"x-request-id", b"same")],
            }

            async def receive() -> dict:
                return {"type": "http.request", "body": b"{}", "more_body": False}

            async def send(message: dict) -> None:
                return None

            await middleware(scope, receive, send)

        async def both() -> None:
            await asyncio.gather(one(), one())

        asyncio.run(both())
        (first_id, first_headers), (second_id, second_headers) = seen
        assert first_id != second_id
        assert first_headers == [first_id.encode()]
        assert second_headers == [second_id.encode()]
        assert "same" in (first_id, second_id)

    def test_5xx_marks_the_span_failed_and_still_returns_timers(self, env) -> None:
        """An engine 500 after some work: error span, partial timers still sent."""
        sent = call(EngineMiddleware(json_app(env.ledger, status=500), env.hooks))
        assert timers_from_headers(response_headers(sent)) == expected_timers(env)
        (span,) = env.exporter.get_finished_spans()
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[semconv.ERROR_TYPE] == "500"

    def test_app_exception_propagates_and_is_recorded(self, env) -> None:
        """The app's exception reaches the server unchanged; the span records it."""

        async def broken(scope: dict, receive: Any, send: Any) -> None:
            work(env.ledger, engine_request_from_scope(scope).request_id)
            raise KeyError("engine died")

        with pytest.raises(KeyError, match="engine died"):
            call(EngineMiddleware(broken, env.hooks))
        (span,) = env.exporter.get_finished_spans()
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[semconv.ERROR_TYPE] == "KeyError"
        assert span.attributes[semconv.GPU_SECONDS] == expected_timers(env).total

    def test_other_paths_and_scopes_pass_through(self, env) -> None:
        """Untraced paths and non-HTTP scopes are not touched."""
        app = EngineMiddleware(json_app(env.ledger), env.hooks, paths={"/v1/chat/completions"})
        seen: list[dict] = []

        async def raw(scope: dict, receive: Any, send: Any) -> None:
            seen.append(scope)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        untouched = EngineMiddleware(raw, env.hooks, paths={"/v1/chat/completions"})
        sent = call(untouched, path="/health")
        assert response_headers(sent) == {}
        assert STATE_KEY not in seen[0].get("state", {})
        sent = call(untouched, path="/x", type="websocket")
        assert env.exporter.get_finished_spans() == ()
        assert app.paths == frozenset({"/v1/chat/completions"})

    def test_by_default_only_posts_to_inference_endpoints_are_traced(self, env) -> None:
        """Probes and listings (GET /health, /metrics, /v1/models) get no span by default."""
        seen: list[dict] = []

        async def raw(scope: dict, receive: Any, send: Any) -> None:
            seen.append(scope)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

        app = EngineMiddleware(raw, env.hooks)
        for path in ("/health", "/metrics", "/v1/models"):
            assert response_headers(call(app, path=path, method="GET")) == {}
        call(app, path="/v1/chat/completions", method="GET")
        call(app, path="/v1/tokenize")
        assert env.exporter.get_finished_spans() == ()
        assert all(STATE_KEY not in s.get("state", {}) for s in seen)
        for path in ("/v1/chat/completions", "/v1/completions", "/v1/responses"):
            call(app, path=path)
        assert len(env.exporter.get_finished_spans()) == 3

    def test_needs_hooks_or_a_ledger(self, env) -> None:
        """Built from a ledger alone, or refused without either."""
        assert EngineMiddleware(json_app(env.ledger), ledger=env.ledger).hooks.ledger is env.ledger
        with pytest.raises(ValueError, match="hooks"):
            EngineMiddleware(json_app(env.ledger))


class TestStreams:
    """text/event-stream: timers in the usage chunk and a comment block before [DONE]."""

    @pytest.mark.parametrize("line_end", [b"\n", b"\r\n"])
    @pytest.mark.parametrize("piece", [1, 7, 64, 10_000])
    def test_usage_chunk_and_comment_block(self, env, line_end: bytes, piece: int) -> None:
        """Whatever the chunking, the events pass intact and the timers land at the end."""
        stream = sse_stream(line_end)
        pieces = [stream[i : i + piece] for i in range(0, len(stream), piece)]
        sent = call(EngineMiddleware(sse_app(env.ledger, pieces), env.hooks))
        assert "content-length" not in response_headers(sent)
        out = body(sent)
        expected = expected_timers(env)
        assert timers_from_sse(out) == expected
        events = [e for e in out.replace(b"\r\n", b"\n").split(b"\n\n") if e]
        datas = [e[6:] for e in events if e.startswith(b"data: ")]
        assert datas[-1] == b"[DONE]"
        assert events[-2].startswith(b": x-modtrace-gpu-seconds: ")  # the block before [DONE]
        usage_chunk = json.loads(datas[-2])
        assert usage_chunk["usage"] == USAGE
        assert timers_from_headers(usage_chunk[USAGE_EXTENSION]) == expected
        original = [e[6:] for e in sse_stream().split(b"\n\n") if e]
        assert datas[:3] == original[:3]  # the other chunks pass byte for byte
        (span,) = env.exporter.get_finished_spans()
        assert span.attributes[semconv.GPU_SECONDS] == expected.total
        assert span.attributes[semconv.unit("image.tokens")] == 20
        assert span.name == "chat served-model"

    def test_no_usage_and_no_done_still_gets_the_block(self, env) -> None:
        """A stream without usage chunk or [DONE] ends with the comment block."""
        stream = sse_stream(usage=False, done=False)
        sent = call(EngineMiddleware(sse_app(env.ledger, [stream]), env.hooks))
        out = body(sent)
        assert out.startswith(stream)
        assert timers_from_sse(out[len(stream) :]) == expected_timers(env)

    def test_client_gone_early_still_records_on_the_span(self, env) -> None:
        """The server's send fails mid-stream: the span ends with the timers all the same."""

        async def app(scope: dict, receive: Any, send: Any) -> None:
            work(env.ledger, engine_request_from_scope(scope).request_id)
            headers = [(b"content-type", b"text/event-stream")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})

        sent: list[dict] = []

        async def send(message: dict) -> None:
            if len(sent) >= 1:
                raise OSError("client disconnected")
            sent.append(message)

        async def receive() -> dict:
            return {"type": "http.disconnect"}

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
        with pytest.raises(OSError, match="client disconnected"):
            asyncio.run(EngineMiddleware(app, env.hooks)(scope, receive, send))
        (span,) = env.exporter.get_finished_spans()
        assert span.attributes[semconv.GPU_SECONDS] == expected_timers(env).total
