"""The gateway end to end: the real openai client -> the gateway -> the reference engine."""

from __future__ import annotations

import asyncio
import time

import pytest

pytest.importorskip("openai")
pytest.importorskip("wrapt")
pytest.importorskip("torch")
pytest.importorskip("uvicorn")

import openai
from chat_helpers import image_part, messages, png
from integrations_helpers import (
    COUNTING,
    MIXED,
    MODEL,
    PROFILE,
    STREAM_WITH_USAGE,
    assert_engine_timers,
    hexid,
    inference_spans,
    load_example,
    only,
    openai_client,
)
from opentelemetry.trace import SpanKind, StatusCode
from telemetry_helpers import PARENT_ID, TRACE_ID, TRACEPARENT, Telemetry

from modtrace import semconv
from modtrace.engine.reference import FAULT_HEADER
from modtrace.integrations import GatewayMiddleware
from modtrace.integrations.openai import instrument_openai, uninstrument_openai


@pytest.fixture(scope="module")
def example():
    """The example script's module (its gateway app and server helper)."""
    return load_example()


@pytest.fixture(scope="module")
def gateway_telemetry():
    """The gateway's spans, attributed (the module's gateway keeps one provider)."""
    telemetry = Telemetry.attributed()
    yield telemetry
    telemetry.shutdown()


@pytest.fixture(scope="module")
def gateway(example, engine, gateway_telemetry):
    """The example's gateway on 127.0.0.1, calling the engine."""
    app = example.build_gateway(
        engine.url,
        tracer_provider=gateway_telemetry.tracers,
        meter_provider=gateway_telemetry.meters,
    )
    served = example.serve(app)
    yield served
    served.stop()


@pytest.fixture
def caller(gateway, gateway_telemetry, engine_telemetry):
    """A plain openai client of the gateway; both exporters start empty."""
    gateway_telemetry.clear()
    engine_telemetry.clear()
    with openai_client(gateway.url) as client:
        yield client


def settle(gateway_telemetry, engine_telemetry, count: int = 1, timeout: float = 10.0):
    """The gateway and engine spans of ``count`` requests, once all have ended."""
    deadline = time.monotonic() + timeout
    while len(gateway_telemetry.spans()) < count or len(engine_telemetry.spans()) < count:
        assert time.monotonic() < deadline, "spans missing"
        time.sleep(0.01)
    return list(gateway_telemetry.spans()), list(engine_telemetry.spans())


def assert_joined_and_attributed(gateway_span, engine_span) -> None:
    """One trace; the gateway span carries the engine's timers, attributed to its total."""
    assert gateway_span.kind is SpanKind.SERVER
    assert engine_span.context.trace_id == gateway_span.context.trace_id
    assert engine_span.parent.span_id == gateway_span.context.span_id
    assert_engine_timers(gateway_span.attributes, engine_span.attributes)


class TestEndToEnd:
    """The real openai client -> the gateway -> the reference engine, over HTTP."""

    def test_one_trace_counts_usage_timers_attribution(
        self, caller, gateway_telemetry, engine_telemetry
    ) -> None:
        """Gateway span: counts, the engine's equal media tokens, its timers, attributed."""
        completion = caller.chat.completions.create(model=MODEL, messages=MIXED, max_tokens=4)
        (span,), (server,) = settle(gateway_telemetry, engine_telemetry)
        assert_joined_and_attributed(span, server)
        attrs = span.attributes
        details = completion.usage.prompt_tokens_details
        assert attrs[semconv.UNITS_PROFILE] == PROFILE
        for modality, reported in (
            ("image", details.image_tokens),
            ("audio", details.audio_tokens),
        ):
            assert attrs[semconv.unit(f"{modality}.tokens")] == reported
            assert attrs[semconv.engine_usage_tokens(modality)] == reported
            assert attrs[semconv.unit_diff(f"{modality}.tokens")] == 0
        assert attrs[semconv.ENGINE_USAGE_PROMPT_TOKENS] == completion.usage.prompt_tokens
        assert attrs[semconv.ATTRIBUTED_METHOD] == "components"

    def test_one_inference_span_per_request(
        self, caller, gateway_telemetry, engine_telemetry
    ) -> None:
        """The openai call enriches the gateway span: no second, client-side span."""
        caller.chat.completions.create(model=MODEL, messages=messages(), max_tokens=2)
        spans, _ = settle(gateway_telemetry, engine_telemetry)
        assert len(spans) == 1
        assert only(inference_spans(gateway_telemetry)).kind is SpanKind.SERVER

    def test_the_callers_trace_reaches_the_engine(
        self, caller, gateway_telemetry, engine_telemetry
    ) -> None:
        """A traceparent sent to the gateway: caller, gateway and engine share one trace."""
        caller.chat.completions.create(
            model=MODEL,
            messages=messages(image_part(png(90, 90))),
            max_tokens=2,
            extra_headers={"traceparent": TRACEPARENT},
        )
        (span,), (server,) = settle(gateway_telemetry, engine_telemetry)
        assert hexid(span.context.trace_id) == TRACE_ID
        assert hexid(span.parent.span_id, 16) == PARENT_ID
        assert hexid(server.context.trace_id) == TRACE_ID

    def test_streaming_through_the_gateway(
        self, caller, gateway_telemetry, engine_telemetry
    ) -> None:
        """A stream through the gateway: usage and timers on the gateway span at its end."""
        with caller.chat.completions.create(**STREAM_WITH_USAGE, max_tokens=4) as stream:
            chunks = list(stream)
        (span,), (server,) = settle(gateway_telemetry, engine_telemetry)
        assert_joined_and_attributed(span, server)
        attrs = span.attributes
        assert attrs[semconv.STREAM_ENDED_EARLY] is False
        usage = chunks[-1].usage
        assert attrs[semconv.ENGINE_USAGE_COMPLETION_TOKENS] == usage.completion_tokens
        assert attrs[semconv.unit_diff("audio.tokens")] == 0

    def test_engine_failure_through_the_gateway(
        self, caller, gateway_telemetry, engine_telemetry
    ) -> None:
        """The engine's 500 reaches the caller; the gateway span fails, keeping the encoder time."""
        with pytest.raises(openai.InternalServerError) as caught:
            caller.chat.completions.create(
                model=MODEL,
                messages=MIXED,
                max_tokens=2,
                extra_headers={FAULT_HEADER: "prefill"},
            )
        assert caught.value.status_code == 500
        (span,), (server,) = settle(gateway_telemetry, engine_telemetry)
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == 500
        assert any(e.name == "exception" for e in span.events)  # the engine call's error
        assert span.attributes[semconv.GPU_SECONDS] == server.attributes[semconv.GPU_SECONDS]
        assert span.attributes[semconv.gpu_seconds_component("vision_encoder")] > 0


def test_second_engine_call_gets_its_own_span(engine, engine_telemetry) -> None:
    """Two engine calls in one gateway request: the first enriches, the second is a child."""
    engine_telemetry.clear()
    otel = Telemetry.attributed()

    async def run() -> None:
        client = instrument_openai(
            openai_client(engine.url, asynchronous=True),
            config=COUNTING,
            tracer_provider=otel.tracers,
        )

        async def twice(scope, receive, send) -> None:
            while (await receive()).get("more_body"):
                pass
            for _ in range(2):
                await client.chat.completions.create(model=MODEL, messages=messages(), max_tokens=2)
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        body = {"model": MODEL, "messages": messages(image_part(png(80, 80)))}
        messages_in = [{"type": "http.request", "body": _json(body), "more_body": False}]

        async def receive():
            return messages_in.pop(0)

        async def send(message) -> None:
            return None

        scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
        app = GatewayMiddleware(twice, config=COUNTING, tracer_provider=otel.tracers)
        try:
            await app(scope, receive, send)
        finally:
            uninstrument_openai(client)
            await client.close()

    try:
        asyncio.run(run())
        spans = otel.spans()
    finally:
        otel.shutdown()
    assert len(spans) == 2
    server_span = next(s for s in spans if s.kind is SpanKind.SERVER)
    client_span = next(s for s in spans if s.kind is SpanKind.CLIENT)
    assert client_span.parent.span_id == server_span.context.span_id
    # The gateway span keeps the received request's counts (one image) and the
    # first call's engine seconds; the second call has its own counts and seconds.
    assert server_span.attributes[semconv.unit("image.count")] == 1
    assert semconv.unit("image.count") not in client_span.attributes
    for span in (server_span, client_span):
        assert span.attributes[semconv.GPU_SOURCE] == "step_ledger"
    deadline = time.monotonic() + 10
    while len(engine_telemetry.spans()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    parents = {s.parent.span_id for s in engine_telemetry.spans()}
    assert parents == {server_span.context.span_id, client_span.context.span_id}


def _json(data: object) -> bytes:
    import json

    return json.dumps(data).encode()
