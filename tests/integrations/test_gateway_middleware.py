"""GatewayMiddleware as a pure ASGI middleware: body, counts, span, status, errors."""

from __future__ import annotations

import asyncio
import json
import math
import time

import pytest
from chat_helpers import audio_part, image_part, messages, png, wav
from integrations_helpers import COUNTING, MODEL, PROFILE, hexid, only
from opentelemetry.trace import SpanKind, StatusCode
from telemetry_helpers import PARENT_ID, TRACE_ID, TRACEPARENT, Telemetry

from modtrace import headers as H
from modtrace import semconv
from modtrace.counting import RequestCounter
from modtrace.integrations import GATEWAY_STATE_KEY, GatewayMiddleware, gateway_span_from_scope
from modtrace.integrations._common import GATEWAY_WALL_CLOCK
from modtrace.spans import current_inference_span


@pytest.fixture
def otel():
    """The gateway's spans, attributed in memory."""
    telemetry = Telemetry.attributed()
    yield telemetry
    telemetry.shutdown()


# --- Driving an ASGI app by hand ------------------------------------------------------------------
class Recorder:
    """An ASGI app that reads the whole body, notes what it saw, and answers ``status``."""

    def __init__(self, status: int = 200, error: BaseException | None = None) -> None:
        self.status = status
        self.error = error
        self.chunks: list[bytes] = []
        self.scope: dict | None = None
        self.current = None

    async def __call__(self, scope, receive, send) -> None:
        self.scope = scope
        self.current = current_inference_span()
        while True:
            message = await receive()
            self.chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        if self.error is not None:
            raise self.error
        await send({"type": "http.response.start", "status": self.status, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def acall(
    app, body: bytes, *, headers=(), path="/v1/chat/completions", method="POST", parts=1
):
    """Send one HTTP request through ``app``; the messages it sent back."""
    size = max(1, math.ceil(len(body) / parts))
    pieces = [body[i : i + size] for i in range(0, len(body), size)] or [b""]
    inbox = [
        {"type": "http.request", "body": piece, "more_body": i < len(pieces) - 1}
        for i, piece in enumerate(pieces)
    ]
    sent: list[dict] = []

    async def receive():
        if inbox:
            return inbox.pop(0)
        await asyncio.sleep(3600)  # a real server waits for the disconnect
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.lower().encode(), v.encode()) for k, v in dict(headers).items()],
    }
    await app(scope, receive, send)
    return sent


def call(app, body: bytes, **kwargs):
    """:func:`acall` in a fresh event loop."""
    return asyncio.run(acall(app, body, **kwargs))


def chat_body(*parts, model: str = MODEL) -> bytes:
    """A JSON chat request."""
    return json.dumps({"model": model, "messages": messages(*parts), "max_tokens": 2}).encode()


def middleware(app, otel, **kwargs) -> GatewayMiddleware:
    """The middleware with the test's providers and counting configuration."""
    kwargs.setdefault("config", COUNTING)
    return GatewayMiddleware(
        app, tracer_provider=otel.tracers, meter_provider=otel.meters, **kwargs
    )


class TestRequestBody:
    """The body is read for counting and replayed to the app untouched."""

    def test_app_reads_the_same_body_in_the_same_chunks(self, otel) -> None:
        """Every body message reaches the app as it came."""
        body = chat_body(image_part(png(300, 200)))
        app = Recorder()
        call(middleware(app, otel), body, parts=4)
        assert b"".join(app.chunks) == body
        assert len(app.chunks) == 4
        span = only(otel.spans())
        assert span.attributes[semconv.unit("image.count")] == 1

    def test_counts_with_the_models_profile(self, otel) -> None:
        """The model -> profile map chooses the profile; the counts are its counter's."""
        body = chat_body(image_part(png(640, 480)), audio_part(wav(20_000)))
        call(middleware(Recorder(), otel), body)
        attrs = only(otel.spans()).attributes
        expected = RequestCounter(COUNTING).count(json.loads(body)).units
        assert attrs[semconv.UNITS_PROFILE] == PROFILE
        for unit, value in expected.items():
            assert attrs[semconv.unit(unit)] == value, unit

    def test_reads_the_video_metadata_headers(self, otel) -> None:
        """llm-d's video headers size a video behind a URL; without them defaults apply."""
        part = {"type": "video_url", "video_url": {"url": "https://example.com/clip.mp4"}}
        body = chat_body(part)
        video_headers = {
            H.VIDEO_FPS: "30",
            H.VIDEO_DURATION: "4",
            H.VIDEO_RESOLUTION: "640x480",
        }
        call(middleware(Recorder(), otel), body, headers=video_headers)
        call(middleware(Recorder(), otel), body)
        with_headers, without = (s.attributes for s in otel.spans())
        counter = RequestCounter(COUNTING)
        assert with_headers[semconv.unit("video.seconds")] == 4.0
        assert (
            with_headers[semconv.unit("video.tokens")]
            == (counter.count(json.loads(body), video_headers).units["video.tokens"])
        )
        assert with_headers[semconv.unit_defaulted("video")] is False
        assert without[semconv.unit_defaulted("video")] is True
        assert without[semconv.unit("video.tokens")] != with_headers[semconv.unit("video.tokens")]

    def test_a_body_over_the_limit_passes_uncounted(self, otel) -> None:
        """Reading stops at the limit; the app still gets the whole body."""
        body = chat_body(image_part(png(64, 64)))
        app = Recorder()
        call(middleware(app, otel, max_body_bytes=100), body, parts=8)
        assert b"".join(app.chunks) == body
        attrs = only(otel.spans()).attributes
        assert not any(k.startswith("modtrace.units.image") for k in attrs)
        assert "not counted" in attrs[semconv.ERROR]

    def test_a_body_that_is_not_json_is_not_counted(self, otel) -> None:
        """Not a JSON object: the span opens anyway, without counts."""
        app = Recorder(status=400)
        call(middleware(app, otel), b"not json")
        span = only(otel.spans())
        assert b"".join(app.chunks) == b"not json"
        assert not any(k.startswith(semconv.UNITS_PREFIX) for k in span.attributes)


class TestSpan:
    """The span the middleware opens: kind, trace, status, wall clock."""

    def test_server_span_made_current_for_the_app(self, otel) -> None:
        """The app finds the span current and in its scope state."""
        app = Recorder()
        call(middleware(app, otel), chat_body())
        span = only(otel.spans())
        assert span.kind is SpanKind.SERVER
        assert span.name == f"chat {MODEL}"
        assert app.current is not None
        assert app.current.span.get_span_context().span_id == span.context.span_id
        assert gateway_span_from_scope(app.scope) is app.current
        assert app.scope["state"][GATEWAY_STATE_KEY] is app.current
        assert span.attributes[semconv.HTTP_REQUEST_METHOD] == "POST"
        assert span.attributes[semconv.URL_PATH] == "/v1/chat/completions"
        assert span.attributes[semconv.HTTP_RESPONSE_STATUS_CODE] == 200

    def test_continues_the_callers_trace(self, otel) -> None:
        """An incoming traceparent makes the span its child."""
        call(middleware(Recorder(), otel), chat_body(), headers={"traceparent": TRACEPARENT})
        span = only(otel.spans())
        assert hexid(span.context.trace_id) == TRACE_ID
        assert hexid(span.parent.span_id, 16) == PARENT_ID

    def test_wall_clock_on_a_2xx_without_engine_timers(self, otel) -> None:
        """No engine timers reached the span: the request's wall clock, labelled."""
        started = time.perf_counter()
        call(middleware(Recorder(), otel), chat_body())
        elapsed = time.perf_counter() - started
        attrs = only(otel.spans()).attributes
        assert attrs[semconv.GPU_SOURCE] == GATEWAY_WALL_CLOCK
        assert 0 < attrs[semconv.GPU_SECONDS] <= elapsed

    def test_no_wall_clock_when_turned_off_or_on_a_4xx(self, otel) -> None:
        """A rejected request, or the fallback turned off: no seconds claimed."""
        call(middleware(Recorder(status=400), otel), chat_body())
        call(middleware(Recorder(), otel, wall_clock_fallback=False), chat_body())
        for span in otel.spans():
            assert semconv.GPU_SECONDS not in span.attributes

    def test_5xx_marks_the_span_failed(self, otel) -> None:
        """A 5xx response: ERROR status and error.type, the response untouched."""
        sent = call(middleware(Recorder(status=503), otel), chat_body())
        assert sent[0]["status"] == 503
        span = only(otel.spans())
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[semconv.ERROR_TYPE] == "503"
        assert semconv.GPU_SECONDS not in span.attributes

    def test_an_exception_propagates_unchanged(self, otel) -> None:
        """The app's exception reaches the server as it was; the span records it."""
        error = RuntimeError("gateway bug")
        with pytest.raises(RuntimeError) as caught:
            call(middleware(Recorder(error=error), otel), chat_body())
        assert caught.value is error
        span = only(otel.spans())
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[semconv.ERROR_TYPE] == "RuntimeError"

    def test_other_requests_pass_through(self, otel) -> None:
        """Other paths and methods get no span and the original receive."""
        app = Recorder()
        call(middleware(app, otel), b"{}", path="/health")
        call(middleware(app, otel), b"", method="GET")
        assert otel.spans() == ()
        assert app.current is None

    def test_every_post_when_paths_is_none(self, otel) -> None:
        """paths=None traces every POST."""
        call(middleware(Recorder(), otel, paths=None), chat_body(), path="/chat/completions")
        assert only(otel.spans()).attributes[semconv.URL_PATH] == "/chat/completions"

    def test_counter_and_config_are_exclusive(self) -> None:
        """Giving both a counter and a config is an error at setup."""
        with pytest.raises(ValueError, match="not both"):
            GatewayMiddleware(Recorder(), counter=RequestCounter(COUNTING), config=COUNTING)


class RaisingCounter:
    """A counter whose every count raises."""

    resolver = None

    def count(self, body, headers=None, *, profile=None):
        msg = "counter exploded"
        raise RuntimeError(msg)


class ThreadNotingCounter:
    """A counter that notes the thread it counts on; ``resolver`` as given."""

    def __init__(self, resolver=None) -> None:
        self.resolver = resolver
        self.inner = RequestCounter(COUNTING)
        self.threads: list[str] = []

    def count(self, body, headers=None, *, profile=None):
        import threading

        self.threads.append(threading.current_thread().name)
        return self.inner.count(body, headers, profile=profile)


class TestFaultProof:
    """Nothing before the app reaches the client: at worst the request passes untraced."""

    def test_a_deeply_nested_body_reaches_the_app_unchanged(self, otel) -> None:
        """JSON nested past the recursion limit is not JSON to count, not a server error."""
        body = b"[" * 200_000
        app = Recorder(status=400)
        sent = call(middleware(app, otel), body, parts=3)
        assert sent[0]["status"] == 400
        assert b"".join(app.chunks) == body
        span = only(otel.spans())
        assert not any(k.startswith(semconv.UNITS_PREFIX) for k in span.attributes)

    def test_a_failure_before_the_app_passes_the_request_untraced(self, otel, monkeypatch) -> None:
        """Setting up the span fails (a broken propagator): the app still gets the body."""
        import modtrace.integrations.asgi as gateway_module

        def broken(headers):
            msg = "propagator exploded"
            raise RuntimeError(msg)

        monkeypatch.setattr(gateway_module, "extract_context", broken)
        body = chat_body(image_part(png(64, 64)))
        app = Recorder()
        sent = call(middleware(app, otel), body, parts=2)
        assert sent[0]["status"] == 200
        assert b"".join(app.chunks) == body
        assert app.current is None
        assert otel.spans() == ()

    def test_a_counter_that_raises_is_recorded_and_the_body_replayed(self, otel) -> None:
        """The counter raising: the app answers, the span says why it has no counts."""
        body = chat_body(image_part(png(64, 64)))
        app = Recorder()
        sent = call(middleware(app, otel, config=None, counter=RaisingCounter()), body)
        assert sent[0]["status"] == 200
        assert b"".join(app.chunks) == body
        attrs = only(otel.spans()).attributes
        assert attrs[semconv.ERROR] == "count: counter exploded"

    def test_a_strict_counter_failure_falls_back_to_an_untraced_request(
        self, otel, monkeypatch
    ) -> None:
        """Strict mode raises the counter's failure out of the span: the request still passes."""
        monkeypatch.setenv("MODTRACE_STRICT", "true")
        body = chat_body(image_part(png(64, 64)))
        app = Recorder()
        sent = call(middleware(app, otel, config=None, counter=RaisingCounter()), body, parts=2)
        assert sent[0]["status"] == 200
        assert b"".join(app.chunks) == body
        assert app.current is None
        # The span that failed to open is ended unattributed, never a second request.
        for span in otel.spans():
            assert semconv.ATTRIBUTED_METHOD not in span.attributes


class TestMemory:
    """The request body is not held by the middleware while the app runs."""

    def test_no_copy_of_the_body_is_kept_across_the_app(self, otel) -> None:
        """Once counted, the body bytes, its messages and the parsed JSON are all let go."""
        import gc
        import tracemalloc

        size = 8 << 20
        padding = "x" * size
        body = json.dumps(
            {"model": MODEL, "messages": messages(), "max_tokens": 2, "user": padding}
        ).encode()
        del padding
        held: dict[str, int] = {}

        async def app(scope, receive, send) -> None:
            while True:
                message = await receive()
                if not message.get("more_body", False):
                    break
            del message
            gc.collect()
            held["bytes"] = tracemalloc.get_traced_memory()[0] - held["before"]
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        async def run() -> None:
            pieces = [body[: len(body) // 2], body[len(body) // 2 :]]
            inbox = [
                {"type": "http.request", "body": pieces[0], "more_body": True},
                {"type": "http.request", "body": pieces[1], "more_body": False},
            ]
            del pieces

            async def receive():
                return inbox.pop(0)

            async def send(message) -> None:
                return None

            scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
            scope["headers"] = []
            gc.collect()
            held["before"] = tracemalloc.get_traced_memory()[0]
            await middleware(app, otel)(scope, receive, send)

        tracemalloc.start()
        try:
            asyncio.run(run())
        finally:
            tracemalloc.stop()
        # The inbox's two halves were handed over and dropped; what is left is small.
        assert held["bytes"] < size // 4, held["bytes"]
        assert only(otel.spans()).attributes[semconv.unit("text.tokens")] > 0


class TestResolverThread:
    """Counting that may fetch URLs runs in a worker thread; plain counting inline."""

    def test_counts_in_a_worker_thread_when_a_resolver_is_set(self, otel) -> None:
        """With a resolver the counter runs off the event loop's thread."""
        import threading

        counter = ThreadNotingCounter(resolver=lambda url: b"")
        call(middleware(Recorder(), otel, config=None, counter=counter), chat_body())
        assert len(counter.threads) == 1
        assert counter.threads[0] != threading.current_thread().name
        assert only(otel.spans()).attributes[semconv.unit("text.tokens")] > 0

    def test_counts_inline_without_a_resolver(self, otel) -> None:
        """Without one counting takes microseconds: on the loop's own thread."""
        import threading

        counter = ThreadNotingCounter()
        call(middleware(Recorder(), otel, config=None, counter=counter), chat_body())
        assert counter.threads == [threading.current_thread().name]

    def test_a_failure_in_the_worker_thread_is_recorded(self, otel) -> None:
        """The counter raising in the worker thread: recorded on the span, the app answers."""
        counter = RaisingCounter()
        counter.resolver = lambda url: b""
        app = Recorder()
        sent = call(middleware(app, otel, config=None, counter=counter), chat_body())
        assert sent[0]["status"] == 200
        assert only(otel.spans()).attributes[semconv.ERROR] == "count: counter exploded"
