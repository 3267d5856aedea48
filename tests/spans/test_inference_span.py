"""The inference span: context manager and decorator, sync and async, fault-proof."""

from __future__ import annotations

import asyncio
import base64
import io
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import SpanKind, StatusCode
from PIL import Image
from telemetry_helpers import Telemetry

from modtrace import GpuTimers, UnitCounts
from modtrace.counting import count_request
from modtrace.counting.result import RequestCount
from modtrace.processor import AttributionSpanProcessor
from modtrace.spans import current_inference_span, inference_span, trace_inference
from modtrace.spans import inference as inference_module
from modtrace.spans.inference import refresh_settings


@pytest.fixture
def otel():
    """A tracer provider with the attribution processor (inline) and in-memory sinks."""
    telemetry = Telemetry.attributed()
    yield telemetry
    telemetry.shutdown()


def span_options(otel):
    """The provider arguments every span in these tests takes."""
    return {"tracer_provider": otel.tracers, "meter_provider": otel.meters}


def finished(otel):
    """The spans exported so far, by name."""
    return {s.name: s for s in otel.exporter.get_finished_spans()}


def error_counts(otel):
    """modtrace.errors data points as {stage: value}."""
    out = {}
    data = otel.reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == "modtrace.errors":
                    for point in metric.data.data_points:
                        out[point.attributes["modtrace.error.stage"]] = point.value
    return out


class StubCounter:
    """A RequestCounter stand-in: counts only what the body declares, records the body seen."""

    def __init__(self, fail: bool = False):
        self.fail = fail
        self.seen = []

    def count(self, body, headers=None, *, profile=None):
        self.seen.append(body)
        if self.fail:
            msg = "decoder exploded"
            raise RuntimeError(msg)
        return RequestCount(
            profile=profile or "stub",
            counters={"image": "stub.image@3"},
            units=UnitCounts(body["declared"]),
        )


class TestContextManager:
    def test_sync_span_carries_genai_counts_and_timers(self, otel):
        """Name, kind, gen_ai.* and the raw inputs land on the span."""
        with inference_span(
            "Qwen/Qwen2.5-VL-7B-Instruct",
            counts={"text.tokens": 600, "image.tokens": 256, "image.count": 1},
            **span_options(otel),
        ) as span:
            span.set_timers({"total": 1.5, "prefill": 1.0, "decode": 0.5, "gpu_count": 2})
        got = finished(otel)["chat Qwen/Qwen2.5-VL-7B-Instruct"]
        assert got.kind == SpanKind.INTERNAL
        attrs = got.attributes
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.request.model"] == "Qwen/Qwen2.5-VL-7B-Instruct"
        assert attrs["gen_ai.provider.name"] == "vllm"
        assert attrs["gen_ai.usage.text.input_tokens"] == 600
        assert attrs["gen_ai.usage.image.input_tokens"] == 256
        assert attrs["gen_ai.usage.input_tokens"] == 856
        assert attrs["modtrace.units.text.tokens"] == 600
        assert attrs["modtrace.units.image.count"] == 1
        assert attrs["modtrace.gpu.seconds"] == 1.5
        assert attrs["modtrace.gpu.seconds.decode"] == 0.5
        assert attrs["modtrace.gpu.count"] == 2
        assert "modtrace.error" not in attrs

    def test_async_span_and_current_handle(self, otel):
        """async with works; current_inference_span() is the handle inside, None outside."""

        async def handler():
            async with inference_span("m", counts={"text.tokens": 5}, **span_options(otel)) as s:
                assert current_inference_span() is s
                await asyncio.sleep(0)
                current_inference_span().set_timers(GpuTimers(total=0.25))
            assert current_inference_span() is None

        asyncio.run(handler())
        attrs = finished(otel)["chat m"].attributes
        assert attrs["modtrace.gpu.seconds"] == 0.25
        assert attrs["modtrace.units.text.tokens"] == 5

    def test_children_nest_under_the_inference_span(self, otel):
        """Spans opened inside are children of the inference span."""
        tracer = otel.tracers.get_tracer("engine")
        with (
            inference_span("m", counts={"text.tokens": 1}, **span_options(otel)) as span,
            tracer.start_as_current_span("prefill"),
        ):
            pass
        spans = finished(otel)
        assert spans["prefill"].parent.span_id == span.span.get_span_context().span_id

    def test_model_from_request_body(self, otel):
        """Without a model argument, the body's model names the span."""
        with inference_span(
            request={"model": "llava", "declared": {}}, counter=StubCounter(), **span_options(otel)
        ):
            pass
        assert finished(otel)["chat llava"].attributes["gen_ai.request.model"] == "llava"

    def test_model_named_late(self, otel):
        """A model learned after the span started is written when it ends."""
        with inference_span(counts={"text.tokens": 1}, **span_options(otel)) as span:
            span.model = "late-model"
        assert finished(otel)["chat"].attributes["gen_ai.request.model"] == "late-model"

    def test_semconv_switch(self, otel, monkeypatch):
        """MODTRACE_GENAI_SEMCONV=v1.36 writes gen_ai.system and no per-modality usage."""
        with monkeypatch.context() as env:
            env.setenv("MODTRACE_GENAI_SEMCONV", "v1.36")
            env.setenv("MODTRACE_GENAI_PROVIDER", "sglang")
            refresh_settings()
            with inference_span("m", counts={"text.tokens": 7}, **span_options(otel)):
                pass
        refresh_settings()
        with inference_span("n", counts={"text.tokens": 7}, **span_options(otel)):
            pass
        attrs = finished(otel)["chat m"].attributes
        assert attrs["gen_ai.system"] == "sglang"
        assert "gen_ai.provider.name" not in attrs
        assert "gen_ai.usage.text.input_tokens" not in attrs
        assert attrs["gen_ai.usage.input_tokens"] == 7
        # Back to the defaults once the variables are gone and re-read.
        later = finished(otel)["chat n"].attributes
        assert later["gen_ai.provider.name"] == "vllm"
        assert later["gen_ai.usage.text.input_tokens"] == 7

    def test_semconv_argument(self, otel):
        """semconv_version="none" leaves gen_ai.* out; modtrace.* stays."""
        with inference_span(
            "m", counts={"text.tokens": 7}, semconv_version="none", **span_options(otel)
        ):
            pass
        attrs = finished(otel)["chat m"].attributes
        assert not any(key.startswith("gen_ai.") for key in attrs)
        assert attrs["modtrace.units.text.tokens"] == 7

    def test_unsampled_span_is_harmless(self):
        """With sampling off nothing is recorded, nothing raises, nothing is kept aside."""
        exporter = InMemorySpanExporter()
        tracers = TracerProvider(sampler=ALWAYS_OFF)
        processor = AttributionSpanProcessor(
            SimpleSpanProcessor(exporter), background=False, record_metrics=False
        )
        tracers.add_span_processor(processor)
        try:
            with inference_span("m", counts={"text.tokens": 1}, tracer_provider=tracers) as s:
                s.set_timers({"total": 1.0})
            assert s.units["text.tokens"] == 1
            assert exporter.get_finished_spans() == ()
            assert inference_module._pending == {}
        finally:
            tracers.shutdown()


class TestDecorator:
    def test_sync_request_parameter_and_timers_from_result(self, otel):
        """The named parameter is counted; timers come from the result; it is returned as is."""
        counter = StubCounter()

        @trace_inference(
            "m",
            request="body",
            timers_from=lambda r: r["timers"],
            counter=counter,
            **span_options(otel),
        )
        def handle(prefix, body):
            return {"timers": {"total": 2.0}, "text": prefix}

        body = {"declared": {"image.tiles": 4}}
        result = handle("hello", body=body)
        assert result == {"timers": {"total": 2.0}, "text": "hello"}
        assert counter.seen == [body]
        attrs = finished(otel)["chat m"].attributes
        assert attrs["modtrace.units.image.tiles"] == 4
        assert attrs["modtrace.units.image.counter"] == "stub.image@3"
        assert attrs["modtrace.gpu.seconds"] == 2.0

    def test_async_with_getter(self, otel):
        """An async handler with a request getter; timers set through the current span."""

        @trace_inference(request=lambda req: req.json, counter=StubCounter(), **span_options(otel))
        async def handle(req):
            current_inference_span().set_timers({"total": 0.5, "source": "step_ledger"})
            await asyncio.sleep(0)
            return "done"

        request = SimpleNamespace(json={"model": "whisper", "declared": {"audio.seconds": 3.5}})
        assert asyncio.run(handle(request)) == "done"
        attrs = finished(otel)["chat whisper"].attributes
        assert attrs["modtrace.units.audio.seconds"] == 3.5
        assert attrs["modtrace.gpu.source"] == "step_ledger"

    def test_unknown_parameter_fails_at_decoration(self):
        """Naming a parameter the function lacks is a programming error, raised once."""
        with pytest.raises(ValueError, match="no parameter 'body'"):
            trace_inference(request="body")(lambda payload: payload)


class TestFaults:
    def test_user_exception_and_result_untouched(self, otel):
        """The wrapped code's exception propagates as is; the span records it; counts land."""
        boom = KeyError("engine down")

        @trace_inference("m", counts={"text.tokens": 3}, **span_options(otel))
        def handle():
            raise boom

        with pytest.raises(KeyError) as caught:
            handle()
        assert caught.value is boom
        got = finished(otel)["chat m"]
        assert got.status.status_code == StatusCode.ERROR
        assert got.attributes["error.type"] == "KeyError"
        assert got.attributes["modtrace.units.text.tokens"] == 3
        assert "modtrace.error" not in got.attributes

    def test_counter_raising(self, otel):
        """A raising counter: result returned, modtrace.error set and counted, timers land."""

        @trace_inference("m", request="body", counter=StubCounter(fail=True), **span_options(otel))
        def handle(body):
            current_inference_span().set_timers({"total": 1.0})
            return 42

        assert handle({"declared": {}}) == 42
        attrs = finished(otel)["chat m"].attributes
        assert attrs["modtrace.error"] == "count: decoder exploded"
        assert attrs["modtrace.gpu.seconds"] == 1.0
        assert error_counts(otel) == {"count": 1}

    def test_bad_timers_and_bad_counts(self, otel):
        """Negative timers and unknown units are errors; the other inputs still land."""
        with inference_span("m", counts={"text.tokens": 9}, **span_options(otel)) as span:
            span.set_timers({"total": -3.0})
            span.set_counts({"text.tokenz": 1})
            assert len(span.errors) == 2
        attrs = finished(otel)["chat m"].attributes
        assert attrs["modtrace.units.text.tokens"] == 9
        assert "modtrace.gpu.seconds" not in attrs
        assert attrs["modtrace.error"].startswith("timers: ")
        assert "count: " in attrs["modtrace.error"]
        assert error_counts(otel) == {"timers": 1, "count": 1}

    def test_request_getter_raising(self, otel):
        """A request getter that raises is a count error, not a request failure."""

        @trace_inference("m", request=lambda: 1 / 0, **span_options(otel))
        def handle():
            return "ok"

        assert handle() == "ok"
        assert finished(otel)["chat m"].attributes["modtrace.error"].startswith("count: ")

    def test_strict_raises(self, otel):
        """strict=True raises the failure into the caller, and the span still ends."""
        with (
            pytest.raises(ValueError, match="negative"),
            inference_span("m", strict=True, **span_options(otel)) as span,
        ):
            span.set_timers({"total": -1})
        with (
            pytest.raises(RuntimeError, match="exploded"),
            inference_span(
                "n",
                request={"declared": {}},
                counter=StubCounter(fail=True),
                strict=True,
                **span_options(otel),
            ),
        ):
            pass
        assert set(finished(otel)) == {"chat m", "chat n"}

    def test_strict_from_environment(self, otel, monkeypatch):
        """MODTRACE_STRICT=true turns strict mode on."""
        monkeypatch.setenv("MODTRACE_STRICT", "true")
        with (
            pytest.raises(ValueError, match="unknown unit"),
            inference_span("m", counts={"nope": 1}, **span_options(otel)),
        ):
            pass


def _png_base64(width, height):
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(buffer, "PNG")
    return base64.b64encode(buffer.getvalue()).decode()


def _body(secret, image_b64):
    return {
        "model": "Qwen/Qwen2.5-VL-7B-Instruct",
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": f"describe {secret}"},
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:image/png;base64,{image_b64}"},
                    },
                ],
            }
        ],
    }


def _assert_no_content(span, secret, image_b64):
    for key, value in span.attributes.items():
        text = str(value)
        assert secret not in text, key
        assert image_b64[:40] not in text, key
    for event in span.events:
        assert secret not in str(dict(event.attributes or {}))


def test_no_prompt_or_media_on_the_span(otel):
    """Neither prompt text nor media bytes reach the span (request counted by a counter)."""
    secret, image = "SECRET-PROMPT-7f3a", _png_base64(64, 48)
    body = _body(secret, image) | {"declared": {"text.tokens": 5, "image.tokens": 4}}
    with inference_span(request=body, counter=StubCounter(), **span_options(otel)):
        pass
    _assert_no_content(finished(otel)["chat Qwen/Qwen2.5-VL-7B-Instruct"], secret, image)


def test_request_path_with_the_real_counter(otel):
    """A body counted by modtrace.counting: the span carries exactly count_request's units.

    The oracle is count_request itself on the same body.
    """
    secret, image = "SECRET-PROMPT-91c2", _png_base64(640, 480)
    body = _body(secret, image)
    expected = count_request(body, profile="qwen2.5-vl")
    with inference_span(request=body, profile="qwen2.5-vl", **span_options(otel)) as span:
        pass
    assert span.request_count == expected
    got = finished(otel)["chat Qwen/Qwen2.5-VL-7B-Instruct"]
    for unit, count in expected.units.items():
        assert got.attributes[f"modtrace.units.{unit}"] == count
    assert got.attributes["modtrace.units.profile"] == expected.profile
    _assert_no_content(got, secret, image)


def test_replayed_timestamps(otel):
    """start_time and end_time replay a past request at its own time."""
    start = 1_700_000_000 * 10**9
    with inference_span(
        "m", counts={"text.tokens": 5}, start_time=start, **span_options(otel)
    ) as s:
        s.end_time = start + 250_000_000
    span = finished(otel)["chat m"]
    assert (span.start_time, span.end_time) == (start, start + 250_000_000)


class BrokenMessage(Exception):
    """An exception whose message cannot be read."""

    def __str__(self) -> str:
        msg = "no message for you"
        raise ValueError(msg)


class TestHardening:
    def test_counts_and_timers_land_when_recording_the_exception_fails(self, otel):
        """An exception with a broken __str__: the span still gets its inputs and ends."""

        @trace_inference("m", counts={"text.tokens": 5}, **span_options(otel))
        def handle():
            current_inference_span().set_timers({"total": 2.0})
            raise BrokenMessage

        with pytest.raises(BrokenMessage):
            handle()
        attrs = finished(otel)["chat m"].attributes
        assert attrs["modtrace.units.text.tokens"] == 5
        assert attrs["modtrace.gpu.seconds"] == 2.0
        assert "modtrace.attributed.method" in attrs
        assert current_inference_span() is None

    def test_status_names_the_exception_type_only(self, otel):
        """The status description is the type; the message stays in the exception event."""
        with (
            pytest.raises(ValueError, match="engine said"),
            inference_span("m", **span_options(otel)),
        ):
            raise ValueError("engine said: ssn 078-05-1120")
        got = finished(otel)["chat m"]
        assert got.status.status_code == StatusCode.ERROR
        assert got.status.description == "ValueError"
        (event,) = [e for e in got.events if e.name == "exception"]
        assert event.attributes["exception.message"] == "engine said: ssn 078-05-1120"

    def test_the_request_is_let_go_once_counted(self, otel):
        """After __enter__ the context holds neither the body, the headers nor the counts."""
        body = {"declared": {"text.tokens": 4}}
        scope = inference_span(
            "m", request=body, headers={"h": "v"}, counter=StubCounter(), **span_options(otel)
        )
        with scope as span:
            assert span.units["text.tokens"] == 4
            assert scope._request is None
            assert scope._headers is None
            assert scope._counts is None
        ready = inference_span("n", counts={"text.tokens": 1}, **span_options(otel))
        with ready:
            assert ready._counts is None


class TestPendingInputs:
    """Inputs kept for a processor that never sees the span are bounded in number and age."""

    @pytest.fixture
    def elsewhere(self, otel):
        """A provider without the processor, while one listens on another provider."""
        exporter = InMemorySpanExporter()
        tracers = TracerProvider()
        tracers.add_span_processor(SimpleSpanProcessor(exporter))
        inference_module._pending.clear()
        yield tracers
        tracers.shutdown()
        inference_module._pending.clear()

    def test_the_number_kept_is_bounded(self, elsewhere):
        """Past the bound the oldest inputs go; the bound is far below 65,536."""
        assert inference_module._PENDING_MAX <= 4096
        for _ in range(inference_module._PENDING_MAX + 50):
            with inference_span("m", counts={"text.tokens": 1}, tracer_provider=elsewhere):
                pass
        assert len(inference_module._pending) == inference_module._PENDING_MAX

    def test_old_inputs_expire(self, elsewhere, monkeypatch):
        """Inputs older than the time to live are dropped at the next span."""
        now = [1000.0]
        monkeypatch.setattr(inference_module, "_monotonic", lambda: now[0])
        for _ in range(5):
            with inference_span("m", counts={"text.tokens": 1}, tracer_provider=elsewhere):
                pass
        assert len(inference_module._pending) == 5
        now[0] += inference_module._PENDING_TTL_S + 1
        with inference_span("m", counts={"text.tokens": 1}, tracer_provider=elsewhere):
            pass
        assert len(inference_module._pending) == 1

    def test_inputs_still_reach_the_processor(self, otel):
        """The processor's own spans still get their inputs (taken at once)."""
        with inference_span("m", counts={"text.tokens": 3}, **span_options(otel)) as span:
            span.set_timers({"total": 1.0})
        attrs = finished(otel)["chat m"].attributes
        assert attrs["modtrace.units.text.tokens"] == 3
        assert "modtrace.attributed.method" in attrs
        assert inference_module._pending == {}
