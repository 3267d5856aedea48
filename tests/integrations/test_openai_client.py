"""instrument_openai: the real openai client against the reference engine over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import time

import pytest

pytest.importorskip("openai")
pytest.importorskip("wrapt")
pytest.importorskip("torch")
pytest.importorskip("uvicorn")

import openai
from chat_helpers import audio_part, image_part, messages, png, wav
from integrations_helpers import (
    COUNTING,
    MIXED,
    MODEL,
    PROFILE,
    STREAM_WITH_USAGE,
    assert_engine_timers,
    closed_port,
    hexid,
    instrumented,
    only,
    openai_client,
)
from opentelemetry.trace import SpanKind, StatusCode
from telemetry_helpers import wait_for_spans

from modtrace import semconv
from modtrace.counting import TextConfig
from modtrace.engine.reference import FAULT_HEADER
from modtrace.integrations._common import GATEWAY_WALL_CLOCK
from modtrace.integrations.openai import instrument_openai, is_instrumented, uninstrument_openai


@pytest.fixture
def client(engine, otel):
    """An instrumented sync client without retries."""
    raw = openai_client(engine.url)
    instrument_openai(
        raw, config=COUNTING, tracer_provider=otel.tracers, meter_provider=otel.meters
    )
    yield raw
    uninstrument_openai(raw)
    raw.close()


@pytest.fixture
def plain(engine):
    """An uninstrumented client: what the caller would see without modtrace."""
    raw = openai_client(engine.url)
    yield raw
    raw.close()


@contextlib.asynccontextmanager
async def async_client(engine, otel):
    """An instrumented async client of the engine, uninstrumented after the block."""
    async with openai_client(engine.url, asynchronous=True) as aclient:
        with instrumented(aclient, config=COUNTING, tracer_provider=otel.tracers):
            yield aclient


def engine_spans(engine_telemetry, span, count: int = 1, timeout: float = 10.0):
    """The engine spans in ``span``'s trace, waiting for ``count`` of them."""
    deadline = time.monotonic() + timeout
    while True:
        trace_id = span.context.trace_id
        found = [s for s in engine_telemetry.spans() if s.context.trace_id == trace_id]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"{len(found)} engine spans, expected {count}"
        time.sleep(0.01)


def engine_span(engine_telemetry, span):
    """The one engine span in ``span``'s trace."""
    return only(engine_spans(engine_telemetry, span))


# --- Non-streaming -----------------------------------------------------------------------------
class TestCompletion:
    """A non-streamed chat completion: counts, usage, timers, one trace."""

    def test_span_joins_the_engine_trace(self, client, otel, engine_telemetry) -> None:
        """traceparent goes out at send time: the engine span is the client span's child."""
        client.chat.completions.create(model=MODEL, messages=MIXED, max_tokens=4)
        span = only(otel.spans())
        server = engine_span(engine_telemetry, span)
        assert span.kind is SpanKind.CLIENT
        assert span.name == f"chat {MODEL}"
        assert server.context.trace_id == span.context.trace_id
        assert server.parent is not None and server.parent.span_id == span.context.span_id

    def test_engine_media_tokens_equal_the_profile_estimate(self, client, otel) -> None:
        """The engine's image and audio tokens equal the gateway's qwen2.5-omni counts."""
        completion = client.chat.completions.create(model=MODEL, messages=MIXED, max_tokens=4)
        details = completion.usage.prompt_tokens_details
        attrs = only(otel.spans()).attributes
        assert attrs[semconv.UNITS_PROFILE] == PROFILE
        assert attrs[semconv.unit("image.count")] == 2 and attrs[semconv.unit("audio.count")] == 2
        reported_tokens = {"image": details.image_tokens, "audio": details.audio_tokens}
        for modality, reported in reported_tokens.items():
            assert reported > 0
            assert attrs[semconv.engine_usage_tokens(modality)] == reported
            assert attrs[semconv.unit(f"{modality}.tokens")] == reported
            assert attrs[semconv.unit_diff(f"{modality}.tokens")] == 0

    def test_usage_is_recorded_beside_the_estimates(self, client, otel) -> None:
        """Prompt and completion tokens as the engine reported them; text is the remainder."""
        completion = client.chat.completions.create(model=MODEL, messages=MIXED, max_tokens=5)
        usage = completion.usage
        attrs = only(otel.spans()).attributes
        assert attrs[semconv.ENGINE_USAGE_PROMPT_TOKENS] == usage.prompt_tokens
        assert attrs[semconv.ENGINE_USAGE_COMPLETION_TOKENS] == usage.completion_tokens
        assert attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] == usage.completion_tokens
        details = usage.prompt_tokens_details
        text = usage.prompt_tokens - details.image_tokens - details.audio_tokens
        assert attrs[semconv.engine_usage_tokens("text")] == text
        estimate = attrs[semconv.unit("text.tokens")]
        assert attrs[semconv.unit_diff("text.tokens")] == text - estimate
        assert attrs[semconv.GEN_AI_RESPONSE_MODEL] == completion.model
        assert attrs[semconv.GEN_AI_RESPONSE_ID] == completion.id
        assert list(attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS]) == [
            completion.choices[0].finish_reason
        ]
        assert attrs[semconv.HTTP_RESPONSE_STATUS_CODE] == 200
        assert attrs[semconv.SERVER_ADDRESS] == "127.0.0.1"

    def test_engine_timers_are_attributed_to_the_measured_total(
        self, client, otel, engine_telemetry
    ) -> None:
        """The headers' timers land on the span; the attribution adds up to the engine's total."""
        client.chat.completions.create(model=MODEL, messages=MIXED, max_tokens=4)
        span = only(otel.spans())
        attrs = span.attributes
        assert_engine_timers(attrs, engine_span(engine_telemetry, span).attributes)
        assert attrs[semconv.ATTRIBUTED_METHOD] == "components"
        assert attrs[semconv.attributed_gpu_seconds("image")] > 0
        assert attrs[semconv.attributed_gpu_seconds("audio")] > 0

    def test_the_result_is_the_clients_own(self, client, plain, engine_telemetry) -> None:
        """The caller gets the same completion type and content as without modtrace."""
        body = {"model": MODEL, "messages": messages(image_part(png(64, 64))), "max_tokens": 6}
        traced = client.chat.completions.create(**body)
        untraced = plain.chat.completions.create(**body)
        assert type(traced) is type(untraced)
        assert traced.choices[0].message.content == untraced.choices[0].message.content
        assert traced.usage == untraced.usage
        wait_for_spans(engine_telemetry, 2)  # both requests done on the engine side

    def test_raw_response_records_usage_and_parses_the_same(
        self, client, otel, engine_telemetry
    ) -> None:
        """with_raw_response: headers for the caller, usage and timers on the span."""
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=messages(audio_part(wav(16_000))), max_tokens=3
        )
        completion = raw.parse()
        assert raw.parse() is completion
        span = only(otel.spans())
        attrs = span.attributes
        assert attrs[semconv.engine_usage_tokens("audio")] == (
            completion.usage.prompt_tokens_details.audio_tokens
        )
        assert float(raw.headers["x-modtrace-gpu-seconds"]) == attrs[semconv.GPU_SECONDS]
        assert_engine_timers(attrs, engine_span(engine_telemetry, span).attributes)

    def test_streaming_response_ends_with_the_call(self, client, otel, engine_telemetry) -> None:
        """with_streaming_response: the caller reads the body later; counts and header timers."""
        with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=MIXED, max_tokens=2
        ) as response:
            span = only(otel.spans())
            completion = response.parse()
        attrs = span.attributes
        assert completion.usage.prompt_tokens > 0
        assert attrs[semconv.unit("image.count")] == 2
        assert semconv.ENGINE_USAGE_PROMPT_TOKENS not in attrs
        assert_engine_timers(attrs, engine_span(engine_telemetry, span).attributes)

    def test_model_without_a_profile_uses_the_default(self, engine, otel, engine_telemetry) -> None:
        """The model -> profile map picks the profile; other models get the default one."""
        with (
            openai_client(engine.url) as raw,
            instrumented(raw, tracer_provider=otel.tracers, meter_provider=otel.meters),
        ):
            raw.chat.completions.create(model=MODEL, messages=messages(), max_tokens=2)
        span = only(otel.spans())
        assert span.attributes[semconv.UNITS_PROFILE] == "llm-d"
        engine_span(engine_telemetry, span)

    def test_text_left_to_the_engine_is_filled_from_its_usage(
        self, engine, otel, engine_telemetry
    ) -> None:
        """TextConfig(kind="engine"): the engine's text tokens become the span's text count."""
        config = COUNTING.model_copy(update={"text": TextConfig(kind="engine")})
        with (
            openai_client(engine.url) as raw,
            instrumented(raw, config=config, tracer_provider=otel.tracers),
        ):
            completion = raw.chat.completions.create(model=MODEL, messages=MIXED, max_tokens=2)
        usage = completion.usage
        details = usage.prompt_tokens_details
        span = only(otel.spans())
        attrs = span.attributes
        text = usage.prompt_tokens - details.image_tokens - details.audio_tokens
        assert attrs[semconv.unit("text.tokens")] == text
        assert attrs[semconv.unit_counter("text")] == "engine-usage@1"
        assert semconv.unit_diff("text.tokens") not in attrs
        assert attrs[semconv.gen_ai_usage_input_tokens("text")] == text
        assert attrs[semconv.attributed_gpu_seconds("text")] > 0
        engine_span(engine_telemetry, span)

    def test_uninstrumented_client_sends_no_trace(self, client, otel, engine_telemetry) -> None:
        """After uninstrument_openai: no span, no traceparent (the engine starts a trace)."""
        uninstrument_openai(client)
        assert not is_instrumented(client)
        client.chat.completions.create(model=MODEL, messages=messages(), max_tokens=2)
        assert otel.spans() == ()
        assert only(wait_for_spans(engine_telemetry, 1)).parent is None

    def test_copies_share_the_instrumentation(self, client, otel, engine_telemetry) -> None:
        """with_options copies share the HTTP client, hence the instrumentation."""
        copy = client.with_options(timeout=30)
        copy.chat.completions.create(model=MODEL, messages=messages(), max_tokens=2)
        assert is_instrumented(copy)
        span = only(otel.spans())
        assert span.kind is SpanKind.CLIENT
        engine_span(engine_telemetry, span)


class TestAsyncCompletion:
    """The same through openai.AsyncOpenAI."""

    def test_async_completion_is_traced_and_timed(self, engine, otel, engine_telemetry) -> None:
        """Counts, usage, engine timers and the joined trace, from an async client."""

        async def run():
            async with async_client(engine, otel) as aclient:
                return await aclient.chat.completions.create(
                    model=MODEL, messages=MIXED, max_tokens=3
                )

        completion = asyncio.run(run())
        span = only(otel.spans())
        server = engine_span(engine_telemetry, span)
        assert server.parent.span_id == span.context.span_id
        attrs = span.attributes
        assert attrs[semconv.engine_usage_tokens("image")] == (
            completion.usage.prompt_tokens_details.image_tokens
        )
        assert attrs[semconv.unit_diff("audio.tokens")] == 0
        assert_engine_timers(attrs, server.attributes)


# --- Streaming ------------------------------------------------------------------------------------
class TestStreaming:
    """Streams end their span at the end of the stream, also when the reader stops early."""

    def test_usage_and_timers_land_when_the_stream_ends(
        self, client, otel, engine_telemetry
    ) -> None:
        """include_usage: the usage chunk's usage and its modtrace timers reach the span."""
        stream = client.chat.completions.create(**STREAM_WITH_USAGE, max_tokens=5)
        assert isinstance(stream, openai.Stream)
        assert otel.spans() == ()  # open while the stream is
        chunks = list(stream)
        usage = chunks[-1].usage
        span = only(otel.spans())
        attrs = span.attributes
        assert attrs[semconv.STREAM_ENDED_EARLY] is False
        assert attrs[semconv.ENGINE_USAGE_COMPLETION_TOKENS] == usage.completion_tokens
        assert attrs[semconv.engine_usage_tokens("image")] == (
            usage.prompt_tokens_details.image_tokens
        )
        assert attrs[semconv.unit_diff("image.tokens")] == 0
        assert_engine_timers(attrs, engine_span(engine_telemetry, span).attributes)

    def test_timers_come_from_the_sse_comment_without_usage(
        self, client, otel, engine_telemetry
    ) -> None:
        """Without include_usage the timers still arrive, in the SSE comment block."""
        with client.chat.completions.create(
            model=MODEL, messages=MIXED, max_tokens=4, stream=True
        ) as stream:
            text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert isinstance(text, str)
        span = only(otel.spans())
        attrs = span.attributes
        assert semconv.ENGINE_USAGE_PROMPT_TOKENS not in attrs
        assert_engine_timers(attrs, engine_span(engine_telemetry, span).attributes)

    def test_closing_early_ends_the_span_with_what_it_has(
        self, client, otel, engine_telemetry
    ) -> None:
        """close() after one chunk: the span ends, flagged, with the wall clock."""
        stream = client.chat.completions.create(**STREAM_WITH_USAGE, max_tokens=200)
        next(stream)
        stream.close()
        span = only(otel.spans())
        attrs = span.attributes
        assert attrs[semconv.STREAM_ENDED_EARLY] is True
        assert attrs[semconv.GPU_SOURCE] == GATEWAY_WALL_CLOCK
        assert attrs[semconv.GPU_SECONDS] > 0
        assert attrs[semconv.unit("image.tokens")] > 0  # the counts are there
        engine_span(engine_telemetry, span)  # the engine ends its own span too

    def test_leaving_the_with_block_early_ends_the_span(
        self, client, otel, engine_telemetry
    ) -> None:
        """break inside ``with stream``: the span ends at the block's exit."""
        with client.chat.completions.create(
            model=MODEL, messages=messages(), max_tokens=200, stream=True
        ) as stream:
            for _ in stream:
                break
            assert otel.spans() == ()
        span = only(otel.spans())
        assert span.attributes[semconv.STREAM_ENDED_EARLY] is True
        engine_span(engine_telemetry, span)

    def test_a_dropped_stream_ends_its_span(self, client, otel, engine_telemetry) -> None:
        """A stream the caller drops without closing ends its span when collected."""
        stream = client.chat.completions.create(
            model=MODEL, messages=messages(), max_tokens=200, stream=True
        )
        next(stream)
        stream.response.close()  # what the caller's GC would do to the connection
        del stream
        gc.collect()
        span = only(otel.spans())
        assert span.attributes[semconv.STREAM_ENDED_EARLY] is True
        engine_span(engine_telemetry, span)

    def test_the_engine_span_closes_when_the_client_goes(
        self, client, otel, engine_telemetry
    ) -> None:
        """The engine notices the early close and ends its own span with its timers."""
        stream = client.chat.completions.create(
            model=MODEL, messages=MIXED, max_tokens=200, stream=True
        )
        next(stream)
        stream.close()
        server = engine_span(engine_telemetry, only(otel.spans()))
        assert server.attributes[semconv.GPU_SECONDS] > 0

    def test_async_stream_closed_early(self, engine, otel, engine_telemetry) -> None:
        """AsyncStream: aclose() after one chunk ends the span, flagged."""

        async def run():
            async with async_client(engine, otel) as aclient:
                stream = await aclient.chat.completions.create(
                    model=MODEL, messages=MIXED, max_tokens=200, stream=True
                )
                assert isinstance(stream, openai.AsyncStream)
                await stream.__anext__()
                await stream.aclose()

        asyncio.run(run())
        span = only(otel.spans())
        assert span.attributes[semconv.STREAM_ENDED_EARLY] is True
        assert span.attributes[semconv.GPU_SOURCE] == GATEWAY_WALL_CLOCK
        engine_span(engine_telemetry, span)

    def test_async_stream_read_to_the_end(self, engine, otel, engine_telemetry) -> None:
        """AsyncStream read to [DONE]: usage and engine timers land."""

        async def run():
            async with async_client(engine, otel) as aclient:
                stream = await aclient.chat.completions.create(**STREAM_WITH_USAGE, max_tokens=4)
                return [chunk async for chunk in stream]

        chunks = asyncio.run(run())
        span = only(otel.spans())
        attrs = span.attributes
        assert attrs[semconv.ENGINE_USAGE_PROMPT_TOKENS] == chunks[-1].usage.prompt_tokens
        assert_engine_timers(attrs, engine_span(engine_telemetry, span).attributes)


# --- Failures -------------------------------------------------------------------------------------
def failure(call):
    """The exception ``call()`` raises."""
    with pytest.raises(openai.OpenAIError) as caught:
        call()
    return caught.value


def assert_same_error(traced: BaseException, untraced: BaseException) -> None:
    """The instrumented client raised what the plain one raised."""
    assert type(traced) is type(untraced)
    assert str(traced) == str(untraced)
    assert getattr(traced, "status_code", None) == getattr(untraced, "status_code", None)
    assert getattr(traced, "body", None) == getattr(untraced, "body", None)
    assert type(traced.__cause__) is type(untraced.__cause__)


def assert_failed(span, error_type: str) -> None:
    """The span is marked failed with the exception recorded."""
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes[semconv.ERROR_TYPE] == error_type
    assert any(e.name == "exception" for e in span.events)


class TestEngineFailures:
    """500, timeout, refused connection: the caller's error unchanged, the span records it."""

    def test_engine_500(self, client, plain, otel, engine_telemetry) -> None:
        """A failed prefill: same InternalServerError; the span keeps the encoder seconds."""
        body = {
            "model": MODEL,
            "messages": MIXED,
            "max_tokens": 3,
            "extra_headers": {FAULT_HEADER: "prefill"},
        }
        untraced = failure(lambda: plain.chat.completions.create(**body))
        traced = failure(lambda: client.chat.completions.create(**body))
        assert isinstance(traced, openai.InternalServerError)
        assert_same_error(traced, untraced)
        span = only(otel.spans())
        assert_failed(span, "InternalServerError")
        attrs = span.attributes
        assert attrs[semconv.HTTP_RESPONSE_STATUS_CODE] == 500
        server = engine_span(engine_telemetry, span).attributes
        assert attrs[semconv.GPU_SECONDS] == server[semconv.GPU_SECONDS]
        assert attrs[semconv.gpu_seconds_component("vision_encoder")] > 0
        assert semconv.gpu_seconds_component("prefill") not in attrs

    def test_engine_timeout(self, engine, otel, engine_telemetry) -> None:
        """A response slower than the client's timeout: same APITimeoutError, no timers."""
        body = {
            "model": MODEL,
            "messages": messages(),
            "max_tokens": 2,
            "extra_headers": {FAULT_HEADER: "delay=0.5"},
        }
        with openai_client(engine.url, timeout=0.1) as plain:
            untraced = failure(lambda: plain.chat.completions.create(**body))
        with (
            openai_client(engine.url, timeout=0.1) as slow,
            instrumented(slow, config=COUNTING, tracer_provider=otel.tracers),
        ):
            traced = failure(lambda: slow.chat.completions.create(**body))
        assert isinstance(traced, openai.APITimeoutError)
        assert_same_error(traced, untraced)
        span = only(otel.spans())
        assert_failed(span, "APITimeoutError")
        assert semconv.GPU_SECONDS not in span.attributes  # no answer: no seconds claimed
        engine_span(engine_telemetry, span)  # the engine still runs it, in the same trace
        wait_for_spans(engine_telemetry, 2)

    def test_connection_refused(self, otel) -> None:
        """Nothing listens: same APIConnectionError; the span records it, counts and all."""
        url = f"http://127.0.0.1:{closed_port()}"
        body = {"model": MODEL, "messages": MIXED, "max_tokens": 2}
        with openai_client(url) as plain:
            untraced = failure(lambda: plain.chat.completions.create(**body))
        with (
            openai_client(url) as down,
            instrumented(down, config=COUNTING, tracer_provider=otel.tracers),
        ):
            traced = failure(lambda: down.chat.completions.create(**body))
        assert isinstance(traced, openai.APIConnectionError)
        assert_same_error(traced, untraced)
        span = only(otel.spans())
        assert_failed(span, "APIConnectionError")
        assert span.attributes[semconv.unit("image.count")] == 2
        assert semconv.GPU_SECONDS not in span.attributes

    def test_error_inside_a_stream(self, client, plain, otel, engine_telemetry) -> None:
        """The engine fails after the stream started: same APIError, the span records it."""
        body = {
            "model": MODEL,
            "messages": MIXED,
            "max_tokens": 3,
            "stream": True,
            "extra_headers": {FAULT_HEADER: "prefill"},
        }
        untraced = failure(lambda: list(plain.chat.completions.create(**body)))
        traced = failure(lambda: list(client.chat.completions.create(**body)))
        assert_same_error(traced, untraced)
        span = only(otel.spans())
        assert_failed(span, type(untraced).__qualname__)
        assert span.attributes[semconv.STREAM_ENDED_EARLY] is False
        wait_for_spans(engine_telemetry, 2)

    def test_every_retry_carries_the_trace_and_the_seconds_add_up(
        self, engine, otel, engine_telemetry
    ) -> None:
        """Retried 500s: each attempt is a child of the span; their seconds are summed."""
        body = {
            "model": MODEL,
            "messages": messages(image_part(png(200, 150))),
            "max_tokens": 2,
            "extra_headers": {FAULT_HEADER: "prefill"},
        }
        with (
            openai_client(engine.url, max_retries=1) as retry,
            instrumented(retry, config=COUNTING, tracer_provider=otel.tracers),
        ):
            failure(lambda: retry.chat.completions.create(**body))
        span = only(otel.spans())
        attempts = engine_spans(engine_telemetry, span, 2)
        assert len(attempts) == 2
        for attempt in attempts:
            assert attempt.context.trace_id == span.context.trace_id
            assert attempt.parent.span_id == span.context.span_id
        assert span.attributes[semconv.HTTP_REQUEST_RESEND_COUNT] == 1
        total = sum(a.attributes[semconv.GPU_SECONDS] for a in attempts)
        assert math.isclose(span.attributes[semconv.GPU_SECONDS], total, rel_tol=1e-12)


def test_trace_ids_differ_per_call(client, otel, engine_telemetry) -> None:
    """Two calls, two traces: each engine span has its own client span as parent."""
    client.chat.completions.create(model=MODEL, messages=messages(), max_tokens=2)
    client.chat.completions.create(model=MODEL, messages=messages(), max_tokens=2)
    spans = otel.spans()
    servers = [engine_span(engine_telemetry, s) for s in spans]
    assert len({s.context.trace_id for s in spans}) == 2
    assert {hexid(s.context.span_id) for s in spans} == {hexid(s.parent.span_id) for s in servers}
