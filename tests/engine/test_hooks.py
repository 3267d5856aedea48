"""Engine hooks: the timer header codec, SSE comments, usage, trace continuation."""

from __future__ import annotations

import asyncio
import importlib.util
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode
from telemetry_helpers import PARENT_ID, TRACE_ID, TRACEPARENT, Telemetry

from modtrace import headers as H
from modtrace import semconv
from modtrace.engine import (
    EngineHooks,
    current_engine_request,
    extract_context,
    normalize_headers,
    sse_comment,
    timers_from_headers,
    timers_from_sse,
    timers_to_headers,
    usage_units,
)
from modtrace.timers import COMPONENTS, GpuTimers
from modtrace.timing import StepLedger


@pytest.fixture
def otel():
    """A tracer provider with the attribution processor (inline) and in-memory sinks."""
    telemetry = Telemetry.attributed()
    yield telemetry
    telemetry.shutdown()


seconds = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
labels = st.text(
    alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.:/+-",
    min_size=1,
    max_size=64,
)


@st.composite
def gpu_timers(draw: st.DrawFn) -> GpuTimers:
    """Timers whose components never exceed the total, as engines report them."""
    parts = {c: draw(st.one_of(st.none(), seconds)) for c in COMPONENTS}
    measured = sum(v for v in parts.values() if v is not None)
    extra = draw(st.one_of(st.none(), seconds))
    total = None if extra is None else measured + extra
    return GpuTimers(
        total=total,
        gpu_count=draw(st.integers(1, 999_999)),
        source=draw(labels),
        **parts,
    )


class TestTimerHeaders:
    """timers_to_headers / timers_from_headers."""

    @given(timers=gpu_timers())
    @settings(max_examples=300, deadline=None)
    def test_round_trip_is_exact(self, timers: GpuTimers) -> None:
        """Every measured timer, the GPU count and the source come back bit for bit."""
        back = timers_from_headers(timers_to_headers(timers))
        if timers.total is None and not timers.components():
            assert back is None
        else:
            assert back == timers

    def test_names_are_the_documented_ones(self) -> None:
        """Header names are modtrace.headers' constants, unmeasured timers left out."""
        timers = GpuTimers(total=2.5, prefill=1.0, decode=0.5, gpu_count=2, source="step_ledger")
        assert timers_to_headers(timers) == {
            "x-modtrace-gpu-seconds": "2.5",
            "x-modtrace-gpu-seconds-prefill": "1.0",
            "x-modtrace-gpu-seconds-decode": "0.5",
            "x-modtrace-gpu-count": "2",
            "x-modtrace-gpu-source": "step_ledger",
        }
        assert set(H.TIMER_HEADERS) >= set(timers_to_headers(timers))

    def test_reads_any_case_and_asgi_byte_pairs(self) -> None:
        """Header names are case-insensitive; ASGI (bytes, bytes) pairs work."""
        pairs = [(b"X-ModTrace-GPU-Seconds", b"1.5"), (b"x-modtrace-gpu-seconds-decode", b"1")]
        timers = timers_from_headers(pairs)
        assert timers == GpuTimers(total=1.5, decode=1.0, source="engine_headers")
        assert timers_from_headers({"X-MODTRACE-GPU-SECONDS": "3"}).total == 3.0

    def test_no_timer_headers_is_none_without_a_reason(self) -> None:
        """A response from an engine without modtrace: None, and nothing to complain about."""
        errors: list[str] = []
        assert timers_from_headers({"content-type": "application/json"}, errors=errors) is None
        assert timers_from_headers(None, errors=errors) is None
        assert errors == []

    def test_count_and_source_alone_are_not_timers(self) -> None:
        """Count and source without any seconds: None, with a reason."""
        errors: list[str] = []
        found = timers_from_headers({H.GPU_COUNT: "1", H.GPU_SOURCE: "x"}, errors=errors)
        assert found is None
        assert len(errors) == 1

    @pytest.mark.parametrize(
        ("name", "value"),
        [
            (H.GPU_SECONDS, "nan"),
            (H.GPU_SECONDS, "inf"),
            (H.GPU_SECONDS, "1e400"),
            (H.GPU_SECONDS, "-1"),
            (H.GPU_SECONDS, "+1"),
            (H.GPU_SECONDS, "1_000"),
            (H.GPU_SECONDS, "0x10"),
            (H.GPU_SECONDS, ""),
            (H.GPU_SECONDS, "1.0, 2.0"),
            (H.GPU_SECONDS_COMPONENTS["prefill"], "fast"),
            (H.GPU_COUNT, "0"),
            (H.GPU_COUNT, "1.5"),
            (H.GPU_COUNT, "-2"),
            (H.GPU_COUNT, "9999999"),
            (H.GPU_SOURCE, "step ledger"),
            (H.GPU_SOURCE, "x" * 65),
            (H.GPU_SOURCE, ""),
        ],
    )
    def test_malformed_value_rejects_the_whole_set(self, name: str, value: str) -> None:
        """One malformed value: None and exactly one reason naming the header."""
        headers = {H.GPU_SECONDS: "2.0", H.GPU_SECONDS_COMPONENTS["decode"]: "1.0", name: value}
        errors: list[str] = []
        assert timers_from_headers(headers, errors=errors) is None
        assert len(errors) == 1
        assert name in errors[0]

    def test_repeated_header_with_two_values_is_malformed(self) -> None:
        """The same timer header twice with different values is ambiguous: rejected."""
        errors: list[str] = []
        pairs = [(H.GPU_SECONDS, "1.0"), (H.GPU_SECONDS, "2.0")]
        assert timers_from_headers(pairs, errors=errors) is None
        assert errors
        assert timers_from_headers([(H.GPU_SECONDS, "1.0"), (H.GPU_SECONDS, "1.0")]).total == 1.0

    def test_components_over_the_total_are_rejected(self) -> None:
        """Components adding up to more than the total cannot be trusted."""
        errors: list[str] = []
        headers = {
            H.GPU_SECONDS: "1.0",
            H.GPU_SECONDS_COMPONENTS["prefill"]: "0.7",
            H.GPU_SECONDS_COMPONENTS["decode"]: "0.4",
        }
        assert timers_from_headers(headers, errors=errors) is None
        assert "over the total" in errors[0]

    def test_missing_source_is_labelled_engine_headers(self) -> None:
        """Without a source header the timers say where they came from."""
        assert timers_from_headers({H.GPU_SECONDS: "1"}).source == "engine_headers"

    def test_whitespace_around_values_is_allowed(self) -> None:
        """Values are trimmed, as HTTP field values are."""
        assert timers_from_headers({H.GPU_SECONDS: " 0.25 "}).total == 0.25


class TestSse:
    """The SSE comment block that carries timers at the end of a stream."""

    def test_round_trip_inside_a_stream(self) -> None:
        """Timers in a comment block between events read back exactly."""
        timers = GpuTimers(total=0.3, vision_encoder=0.1, prefill=0.2, source="step_ledger")
        stream = (
            b'data: {"choices": []}\n\n'
            + b": keep-alive\n\n"
            + sse_comment(timers_to_headers(timers))
            + b"data: [DONE]\n\n"
        )
        assert timers_from_sse(stream) == timers

    def test_block_is_only_comment_lines_and_a_blank_line(self) -> None:
        """Every line starts with ':' and the block ends with one blank line."""
        block = sse_comment({H.GPU_SECONDS: "1.0", H.GPU_COUNT: "1"}).decode()
        lines = block.split("\n")
        assert lines[-2:] == ["", ""]
        assert all(line.startswith(": ") for line in lines[:-2])
        assert sse_comment({}) == b""

    def test_stream_without_timers_is_none(self) -> None:
        """Other comments and data lines are not timers."""
        assert timers_from_sse(b": ping\ndata: {}\n\n") is None

    @pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="openai not installed")
    def test_openai_client_sse_decoder_ignores_the_block(self) -> None:
        """The openai client's own SSE decoder yields the events and skips the comments."""
        from openai._streaming import SSEDecoder

        block = sse_comment({H.GPU_SECONDS: "1.0"})
        stream = b'data: {"a": 1}\n\n' + block + b"data: [DONE]\n\n"
        events = list(SSEDecoder().iter_bytes(iter([stream])))
        assert [e.data for e in events] == ['{"a": 1}', "[DONE]"]


class TestUsageUnits:
    """usage_units: vLLM usage -> unit counts."""

    def test_media_tokens_and_the_text_remainder(self) -> None:
        """prompt_tokens_details modalities become token units; text is the rest."""
        usage = {
            "prompt_tokens": 300,
            "completion_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 0, "image_tokens": 99, "audio_tokens": 75},
        }
        assert usage_units(usage) == {
            "image.tokens": 99.0,
            "audio.tokens": 75.0,
            "text.tokens": 126.0,
        }

    def test_malformed_fields_are_skipped(self) -> None:
        """Non-integers, booleans and an impossible prompt size are left out."""
        usage = {
            "prompt_tokens": 10,
            "prompt_tokens_details": {
                "image_tokens": "99",
                "audio_tokens": True,
                "video_tokens": 20,
            },
        }
        assert usage_units(usage) == {"video.tokens": 20.0}
        assert usage_units({"prompt_tokens": 5}) == {"text.tokens": 5.0}
        assert usage_units({}) == {}


class TestContext:
    """extract_context and normalize_headers."""

    def test_traceparent_continues_the_trace(self) -> None:
        """The W3C traceparent becomes the parent span context, whatever the header case."""
        ctx = extract_context({"TraceParent": TRACEPARENT})
        parent = trace.get_current_span(ctx).get_span_context()
        assert f"{parent.trace_id:032x}" == TRACE_ID
        assert f"{parent.span_id:016x}" == PARENT_ID
        assert parent.is_remote

    def test_no_trace_headers_is_an_empty_context(self) -> None:
        """Without a traceparent there is no parent."""
        ctx = extract_context([(b"content-type", b"application/json")])
        assert not trace.get_current_span(ctx).get_span_context().is_valid

    def test_normalize_lower_cases_and_folds_repeats(self) -> None:
        """Names lower-cased, bytes decoded, differing repeats joined."""
        pairs = [(b"A", b"1"), ("a", "2"), (b"B", b"x"), (b"b", b"x")]
        assert normalize_headers(pairs) == {"a": "1, 2", "b": "x"}


class TestEngineHooks:
    """EngineHooks.request: span, ledger id, timers and usage."""

    def test_request_span_continues_the_trace_and_carries_timers(self, otel) -> None:
        """A SERVER span under the caller's span, with the ledger's timers and the usage."""
        ledger = StepLedger()
        hooks = EngineHooks(ledger, tracer_provider=otel.tracers, meter_provider=otel.meters)
        with hooks.request({"traceparent": TRACEPARENT}, model="m") as req:
            assert current_engine_request() is req
            ledger.record_step(0.5, {req.request_id: 10}, "vision_encoder")
            ledger.record_step(0.25, {req.request_id: 30, "other": 10}, "prefill")
            req.set_usage({"prompt_tokens": 40, "prompt_tokens_details": {"image_tokens": 10}})
            headers = req.response_headers()
        assert current_engine_request() is None
        (span,) = otel.exporter.get_finished_spans()
        assert span.kind is SpanKind.SERVER
        assert f"{span.context.trace_id:032x}" == TRACE_ID
        assert f"{span.parent.span_id:016x}" == PARENT_ID
        assert span.name == "chat m"
        attrs = span.attributes
        timers = timers_from_headers(headers)
        assert timers.source == "step_ledger"
        assert attrs[semconv.GPU_SECONDS] == timers.total
        assert attrs[semconv.gpu_seconds_component("vision_encoder")] == 0.5
        assert math.isclose(timers.prefill, 0.25 * 30 / 40)
        assert attrs[semconv.unit("image.tokens")] == 10
        assert attrs[semconv.unit("text.tokens")] == 30
        # The attribution processor split the measured total across modalities.
        parts = sum(v for k, v in attrs.items() if k.startswith("modtrace.attributed.gpu_seconds."))
        assert math.isclose(parts, timers.total)
        assert req.request_id not in ledger

    def test_request_id_comes_from_x_request_id(self) -> None:
        """The caller's x-request-id is the ledger id; without it a fresh id is made."""
        hooks = EngineHooks(StepLedger())
        assert hooks.request({"X-Request-Id": "abc"}).request_id == "abc"
        first, second = hooks.request({}), hooks.request({})
        assert first.request_id != second.request_id
        assert hooks.request({"x-request-id": "abc"}, request_id="mine").request_id == "mine"

    def test_a_duplicate_request_id_in_flight_gets_its_own_ledger_account(self, otel) -> None:
        """Two open requests with one x-request-id: the second gets a unique ledger id."""
        ledger = StepLedger()
        hooks = EngineHooks(ledger, tracer_provider=otel.tracers, meter_provider=otel.meters)
        with hooks.request({"x-request-id": "dup"}) as first:
            with hooks.request({"x-request-id": "dup"}) as second:
                assert first.request_id == "dup"
                assert second.request_id != "dup"
                assert second.request_id.startswith("dup")
                ledger.record_step(1.0, {first.request_id: 1, second.request_id: 3}, "decode")
            assert second.finish_timers().total == pytest.approx(0.75)
        assert first.finish_timers().total == pytest.approx(0.25)
        with hooks.request({"x-request-id": "dup"}) as third:  # free again
            assert third.request_id == "dup"

    def test_an_id_with_an_open_ledger_account_is_made_unique(self, otel) -> None:
        """An account left open under the caller's id is not shared with a new request."""
        ledger = StepLedger()
        ledger.record_step(1.0, {"stale": 1}, "decode")
        hooks = EngineHooks(ledger, tracer_provider=otel.tracers)
        with hooks.request({"x-request-id": "stale"}) as req:
            assert req.request_id != "stale"
            ledger.record_step(0.5, {req.request_id: 1}, "decode")
        assert req.finish_timers().total == pytest.approx(0.5)
        assert "stale" in ledger

    def test_finish_is_idempotent_and_without_steps_gives_no_headers(self, otel) -> None:
        """A request with no step has no timers; finishing twice returns the same."""
        hooks = EngineHooks(StepLedger(), tracer_provider=otel.tracers)
        with hooks.request() as req:
            assert req.response_headers() == {}
            assert req.finish_timers() is None
        (span,) = otel.exporter.get_finished_spans()
        assert span.name == "engine"
        assert semconv.GPU_SECONDS not in span.attributes

    def test_5xx_status_and_exceptions_mark_the_span_failed(self, otel) -> None:
        """set_status(500) and an exception both end the span in error."""
        hooks = EngineHooks(StepLedger(), tracer_provider=otel.tracers)
        with hooks.request() as req:
            req.set_status(503)
        with pytest.raises(RuntimeError, match="boom"), hooks.request():
            raise RuntimeError("boom")
        with hooks.request() as req:
            req.set_status(404)
        failed, raised, fine = otel.exporter.get_finished_spans()
        assert failed.status.status_code is StatusCode.ERROR
        assert failed.attributes[semconv.ERROR_TYPE] == "503"
        assert raised.status.status_code is StatusCode.ERROR
        assert raised.attributes[semconv.ERROR_TYPE] == "RuntimeError"
        assert fine.status.status_code is StatusCode.UNSET

    def test_record_usage_off_keeps_units_off_the_span(self, otel) -> None:
        """record_usage=False: timers on the span, no unit counts."""
        ledger = StepLedger()
        hooks = EngineHooks(ledger, tracer_provider=otel.tracers, record_usage=False)
        with hooks.request() as req:
            ledger.record_step(0.1, {req.request_id: 1}, "decode")
            req.set_usage({"prompt_tokens": 5})
        (span,) = otel.exporter.get_finished_spans()
        assert semconv.unit("text.tokens") not in span.attributes
        assert span.attributes[semconv.GPU_SECONDS] == 0.1

    def test_async_with_and_set_model(self, otel) -> None:
        """The request is also an async context manager; set_model renames the span."""
        hooks = EngineHooks(StepLedger(), tracer_provider=otel.tracers)

        async def handle(model: str | None) -> None:
            async with hooks.request(model=model) as req:
                req.set_model("served")

        asyncio.run(handle(None))
        asyncio.run(handle("m"))
        learned, given = otel.exporter.get_finished_spans()
        assert learned.name == "chat served"
        assert learned.attributes[semconv.GEN_AI_REQUEST_MODEL] == "served"
        assert given.name == "chat m"  # a model given up front is kept
        assert given.attributes[semconv.GEN_AI_REQUEST_MODEL] == "m"
