"""instrument_openai against an in-process mock engine: memory, threads, faults, retries.

The openai client sends through its own HTTP client with a mock transport,
so these run without the reference engine (no torch, no server).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from typing import Any

import pytest

pytest.importorskip("openai")
pytest.importorskip("wrapt")

import openai
from integrations_helpers import COUNTING, MODEL, only
from opentelemetry.trace import SpanKind

from modtrace import semconv
from modtrace.counting import RequestCounter
from modtrace.integrations import GatewayMiddleware
from modtrace.integrations._common import GATEWAY_WALL_CLOCK
from modtrace.integrations.openai import _Call, instrument_openai, uninstrument_openai

try:  # the HTTP package the openai client is built on
    import httpx2 as httpx
except ImportError:  # pragma: no cover - older openai releases
    import httpx

MESSAGES = [{"role": "user", "content": "Hello there"}]
TIMERS = {"x-modtrace-gpu-seconds": "0.25", "x-modtrace-gpu-source": "step_ledger"}
USAGE = {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}
COMPLETION = {
    "id": "cmpl-1",
    "object": "chat.completion",
    "created": 0,
    "model": MODEL,
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}
    ],
    "usage": USAGE,
}


def chunk(**fields: Any) -> dict[str, Any]:
    """One streamed chat completion chunk."""
    return {
        "id": "cmpl-1",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": MODEL,
        **fields,
    }


STREAM = b"".join(
    b"data: " + json.dumps(c).encode() + b"\n\n"
    for c in (
        chunk(choices=[{"index": 0, "delta": {"content": "Hi"}, "finish_reason": None}]),
        chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        chunk(choices=[], usage=USAGE),
    )
) + (b": x-modtrace-gpu-seconds: 0.25\n: x-modtrace-gpu-source: step_ledger\n\ndata: [DONE]\n\n")


def answer(status: int = 200, *, stream: bool = False, timers: bool = True) -> Any:
    """The mock engine's response: a completion, a stream or an error."""
    if status >= 400:
        return httpx.Response(status, json={"error": {"message": "busy"}})
    if stream:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, content=STREAM)
    return httpx.Response(200, json=COMPLETION, headers=TIMERS if timers else {})


def mock_client(
    handler: Callable[[Any], Any], *, asynchronous: bool = False, otel: Any, **options: Any
) -> Any:
    """An instrumented openai client whose requests go to ``handler``."""
    transport = httpx.MockTransport(handler)
    if asynchronous:
        client = openai.AsyncOpenAI(
            base_url="http://engine/v1",
            api_key="-",
            max_retries=0,
            http_client=httpx.AsyncClient(transport=transport),
        )
    else:
        client = openai.OpenAI(
            base_url="http://engine/v1",
            api_key="-",
            max_retries=0,
            http_client=httpx.Client(transport=transport),
        )
    options.setdefault("config", COUNTING)
    return instrument_openai(
        client, tracer_provider=otel.tracers, meter_provider=otel.meters, **options
    )


class ThreadNotingCounter:
    """A counter that notes the thread it counts on; ``resolver`` as given."""

    def __init__(self, resolver: Any = None) -> None:
        self.resolver = resolver
        self.config = COUNTING
        self.inner = RequestCounter(COUNTING)
        self.threads: list[str] = []

    def count(self, body, headers=None, *, profile=None):
        self.threads.append(threading.current_thread().name)
        return self.inner.count(body, headers, profile=profile)


@pytest.fixture
def otel():
    """The caller's spans, attributed in memory."""
    from telemetry_helpers import Telemetry

    telemetry = Telemetry.attributed()
    yield telemetry
    telemetry.shutdown()


class TestMemory:
    """A call keeps only what it needs once the request is counted."""

    def test_a_stream_does_not_keep_the_request_body(self, otel) -> None:
        """While the stream is read, neither the call nor its span context hold the body."""
        client = mock_client(lambda request: answer(stream=True), otel=otel)
        try:
            stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
            call = stream._self_call
            assert isinstance(call, _Call)
            assert getattr(call, "body", None) is None
            assert getattr(call, "headers", None) in (None, {})
            assert call.scope is not None and call.scope._request is None
            assert call.scope._headers is None
            list(stream)
        finally:
            uninstrument_openai(client)
        assert only(otel.spans()).attributes[semconv.unit("text.tokens")] > 0


class TestResolverThread:
    """The async client counts in a worker thread when the counter may fetch URLs."""

    @pytest.mark.parametrize("resolver", [None, lambda url: b""], ids=["inline", "thread"])
    def test_async_create_counts_off_the_loop_with_a_resolver(self, otel, resolver) -> None:
        """With a resolver: another thread; without: the loop's own thread."""
        counter = ThreadNotingCounter(resolver)

        async def run() -> None:
            client = mock_client(
                lambda request: answer(), asynchronous=True, otel=otel, config=None, counter=counter
            )
            try:
                await client.chat.completions.create(model=MODEL, messages=MESSAGES)
            finally:
                uninstrument_openai(client)

        asyncio.run(run())
        loop_thread = threading.current_thread().name
        assert len(counter.threads) == 1
        assert (counter.threads[0] != loop_thread) is (resolver is not None)
        assert only(otel.spans()).attributes[semconv.unit("text.tokens")] > 0


class TestStreamFaults:
    """A failure noting a chunk is recorded on the span, never raised into the reader."""

    def test_sync_stream_survives_a_failing_observe(self, otel, monkeypatch) -> None:
        """Every chunk still reaches the caller; the span says what failed."""

        def broken(self, chunk):
            msg = "chunk bookkeeping exploded"
            raise RuntimeError(msg)

        monkeypatch.setattr(_Call, "observe", broken)
        client = mock_client(lambda request: answer(stream=True), otel=otel)
        try:
            stream = client.chat.completions.create(model=MODEL, messages=MESSAGES, stream=True)
            chunks = list(stream)
        finally:
            uninstrument_openai(client)
        assert len(chunks) == 3
        attrs = only(otel.spans()).attributes
        assert "chunk bookkeeping exploded" in attrs[semconv.ERROR]
        assert attrs[semconv.STREAM_ENDED_EARLY] is False

    def test_async_stream_survives_a_failing_observe(self, otel, monkeypatch) -> None:
        """The same for the async client."""

        def broken(self, chunk):
            msg = "chunk bookkeeping exploded"
            raise RuntimeError(msg)

        monkeypatch.setattr(_Call, "observe", broken)

        async def run() -> list[Any]:
            client = mock_client(lambda request: answer(stream=True), asynchronous=True, otel=otel)
            try:
                stream = await client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, stream=True
                )
                return [c async for c in stream]
            finally:
                uninstrument_openai(client)

        assert len(asyncio.run(run())) == 3
        attrs = only(otel.spans()).attributes
        assert "chunk bookkeeping exploded" in attrs[semconv.ERROR]


class TestRetryBehindTheGateway:
    """A failed engine call gives the gateway span back, so the retry enriches it."""

    @pytest.mark.parametrize("first_timers", [False, True], ids=["no-timers", "timers"])
    def test_503_then_retry_is_attributed_once(self, otel, first_timers) -> None:
        """503, then 200: one span, the engine's seconds (both attempts'), no wall clock."""
        statuses = [503, 200]

        def engine(request: Any) -> Any:
            status = statuses.pop(0)
            if status == 503 and first_timers:
                return httpx.Response(503, json={"error": {}}, headers={**TIMERS})
            return answer(status)

        async def run() -> None:
            client = mock_client(engine, asynchronous=True, otel=otel)

            async def app(scope, receive, send) -> None:
                while (await receive()).get("more_body"):
                    pass
                try:
                    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
                except openai.APIStatusError:
                    await client.chat.completions.create(model=MODEL, messages=MESSAGES)
                await send({"type": "http.response.start", "status": 200, "headers": []})
                await send({"type": "http.response.body", "body": b"{}"})

            body = json.dumps({"model": MODEL, "messages": MESSAGES}).encode()
            inbox = [{"type": "http.request", "body": body, "more_body": False}]

            async def receive() -> dict[str, Any]:
                return inbox.pop(0)

            async def send(message: dict[str, Any]) -> None:
                return None

            scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
            gateway = GatewayMiddleware(
                app, config=COUNTING, tracer_provider=otel.tracers, meter_provider=otel.meters
            )
            try:
                await gateway({**scope, "headers": []}, receive, send)
            finally:
                uninstrument_openai(client)

        asyncio.run(run())
        span = only(otel.spans())
        assert span.kind is SpanKind.SERVER
        attrs = span.attributes
        assert attrs[semconv.GPU_SOURCE] == "step_ledger"
        assert attrs[semconv.GPU_SECONDS] == pytest.approx(0.5 if first_timers else 0.25)
        assert attrs[semconv.GPU_SOURCE] != GATEWAY_WALL_CLOCK
        assert attrs[semconv.ENGINE_USAGE_PROMPT_TOKENS] == USAGE["prompt_tokens"]
        assert any(e.name == "exception" for e in span.events)  # the failed call's error
