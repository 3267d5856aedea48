"""The reference engine: real encoders, counts equal to the profile's, timers that add up."""

from __future__ import annotations

import http.client
import importlib.util
import json
import math
import queue
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("soundfile")
pytest.importorskip("uvicorn")

from chat_helpers import audio_part, image_part, messages, mixed_parts, png, wav
from opentelemetry.trace import SpanKind, StatusCode
from telemetry_helpers import TRACE_ID, TRACEPARENT, Telemetry

from modtrace import semconv
from modtrace.counting.counter import CountingConfig, RequestCounter
from modtrace.counting.families.qwen_audio import QWEN25_OMNI
from modtrace.engine import (
    USAGE_EXTENSION,
    EngineHooks,
    timers_from_headers,
    timers_from_sse,
)
from modtrace.engine.reference import (
    FAULT_HEADER,
    EngineConfig,
    InputProcessor,
    ReferenceEngine,
    RequestError,
    start_server,
)
from modtrace.engine.reference.model import AUDIO, IMAGE
from modtrace.timers import COMPONENTS

MODEL = EngineConfig().model_name


def chat(*parts: dict, max_tokens: int = 6, **extra: object) -> dict:
    """A one-message chat request to the reference model."""
    return {"model": MODEL, "max_tokens": max_tokens, "messages": messages(*parts), **extra}


MIXED = chat(*mixed_parts())


def profile_count(body: dict):
    """What modtrace's counting profile predicts for ``body`` (qwen2.5-omni)."""
    return RequestCounter(CountingConfig(profile="qwen2.5-omni")).count(body)


@pytest.fixture(scope="module")
def engine():
    """One started reference engine for the module (the model builds in well under a second)."""
    with ReferenceEngine(EngineConfig(threads=1, allow_fault_injection=True)) as built:
        yield built


@pytest.fixture(scope="module")
def otel():
    """Tracer provider with the attribution processor and an in-memory exporter."""
    telemetry = Telemetry.attributed()
    yield telemetry
    telemetry.shutdown()


@pytest.fixture(scope="module")
def server(engine, otel):
    """The engine served over HTTP on 127.0.0.1, spans to the in-memory exporter."""
    hooks = EngineHooks(engine.ledger, tracer_provider=otel.tracers)
    with start_server(engine, hooks=hooks) as running:
        yield running


def post(server, body: dict, headers: dict | None = None) -> tuple[int, dict, bytes]:
    """POST a chat request; status, lower-cased headers, body."""
    conn = http.client.HTTPConnection(server.host, server.port, timeout=60)
    try:
        conn.request(
            "POST",
            "/v1/chat/completions",
            json.dumps(body),
            {"content-type": "application/json", **(headers or {})},
        )
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def next_span(otel, before: int, where=lambda span: True):
    """The first span (matching ``where``) to end after ``before`` spans had ended.

    The server ends its span just after the last byte of the response, so a
    client can hold the response a moment before the span is exported; and a
    previous test's span may still end late, hence ``where``.
    """
    deadline = time.monotonic() + 10
    while True:
        ended = [s for s in otel.exporter.get_finished_spans()[before:] if where(s)]
        if ended:
            return ended[0]
        assert time.monotonic() < deadline, "no engine span ended"
        time.sleep(0.01)


# --- In process --------------------------------------------------------------------------
class TestInProcess:
    """ReferenceEngine.complete: counts, usage and timers."""

    def test_media_tokens_equal_the_counting_profile(self, engine) -> None:
        """Images and clips go through the real processors; their tokens are the profile's."""
        completion = engine.complete(MIXED)
        details = completion.response["usage"]["prompt_tokens_details"]
        units = profile_count(MIXED).units.root
        assert details["image_tokens"] == units["image.tokens"]
        assert details["audio_tokens"] == units["audio.tokens"]
        assert details["cached_tokens"] == 0
        assert "video_tokens" not in details

    def test_prompt_is_expanded_to_the_placeholder_tokens(self, engine) -> None:
        """The prompt holds exactly image_tokens <|IMAGE|> and audio_tokens <|AUDIO|> ids."""
        prepared = engine.prepare(MIXED)
        count = profile_count(MIXED)
        per_item = [i.units[f"{i.modality}.tokens"] for i in count.items]
        assert [i.tokens for i in prepared.images] == per_item[0::2]
        assert [a.tokens for a in prepared.audios] == per_item[1::2]
        assert prepared.input_ids.count(IMAGE) == prepared.image_tokens
        assert prepared.input_ids.count(AUDIO) == prepared.audio_tokens
        assert [a.frames for a in prepared.audios] == [
            i.units["audio.frames"] for i in count.items if i.modality == "audio"
        ]

    def test_usage_matches_vllm_shape(self, engine) -> None:
        """prompt + completion = total; the completion stops at max_tokens."""
        response = engine.complete(chat(max_tokens=5)).response
        usage = response["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert usage["completion_tokens"] <= 5
        assert response["object"] == "chat.completion"
        assert response["choices"][0]["finish_reason"] in ("stop", "length")
        assert usage["prompt_tokens_details"] == {"cached_tokens": 0}

    def test_timers_are_measured_and_conserved(self, engine) -> None:
        """All four components measured; the total is their sum; the ledger keeps nothing."""
        completion = engine.complete(MIXED)
        timers = completion.timers
        assert timers.source == "step_ledger"
        assert all(getattr(timers, c) > 0 for c in COMPONENTS)
        assert math.isclose(timers.total, sum(timers.components().values()), rel_tol=1e-12)
        totals = engine.ledger.totals()
        assert totals.recorded_ns == totals.finished_ns + totals.open_ns + totals.unattributed_ns
        assert completion.response["id"].removeprefix("chatcmpl-") not in engine.ledger

    def test_deterministic_weights_give_the_same_text(self, engine) -> None:
        """Greedy decoding on seeded weights: the same request gives the same answer."""
        first = engine.complete(MIXED).response["choices"][0]["message"]["content"]
        assert first == engine.complete(MIXED).response["choices"][0]["message"]["content"]

    def test_requests_queued_together_share_one_encoder_pass(self) -> None:
        """Three requests in one batch: one vision pass, split by each one's image tokens."""
        batch = ReferenceEngine(EngineConfig(threads=1))
        bodies = [chat(image_part(png(28 * k, 56, seed=k)), max_tokens=2) for k in (2, 4, 8)]
        prepared = [batch.prepare(b) for b in bodies]
        done: queue.Queue = queue.Queue()
        for p in prepared:
            batch.submit(
                p, lambda ev, p=p: done.put((p.request_id, ev)) if ev.kind != "token" else None
            )
        before = batch.ledger.totals().steps
        with batch:
            finished = [done.get(timeout=30) for _ in prepared]
        assert all(ev.kind == "finished" for _, ev in finished)
        ns = {p.request_id: batch.ledger.finish_ns(p.request_id) for p in prepared}
        vision = [ns[p.request_id]["vision_encoder"] for p in prepared]
        tokens = [p.image_tokens for p in prepared]
        shared = sum(vision)
        for v, t in zip(vision, tokens, strict=True):
            assert abs(v - shared * t / sum(tokens)) <= 1  # largest remainder: within 1 ns
        # One vision step for the batch, then per-request prefill and decode steps.
        assert batch.ledger.totals().steps - before == 1 + 3 + 3

    def test_mm_processor_kwargs_reach_the_processor_and_the_profile(self, engine) -> None:
        """max_pixels in mm_processor_kwargs shrinks the image on both sides alike."""
        plain = chat(image_part(png(640, 480)))
        body = {**plain, "mm_processor_kwargs": {"max_pixels": 50_176}}
        tokens = engine.complete(body).response["usage"]["prompt_tokens_details"]["image_tokens"]
        assert tokens == profile_count(body).units.root["image.tokens"]
        assert tokens * 28 * 28 <= 50_176
        assert tokens < engine.prepare(plain).image_tokens

    def test_profile_disagreement_is_a_500(self) -> None:
        """A profile that predicts other counts makes the request fail, naming the item."""
        wrong = InputProcessor(QWEN25_OMNI.with_params({"max_pixels": 100_352}))
        with pytest.raises(RequestError) as caught:
            wrong.prepare(chat(image_part(png(640, 480))), request_id="r", model=MODEL)
        assert caught.value.status == 500
        assert caught.value.kind == "CountMismatchError"
        assert "image #0" in caught.value.message

    def test_fast_audio_padding_gives_the_full_padding_features(self, engine) -> None:
        """The short pad gives the features the processor's 300 s padding gives, frame for frame."""
        processor = engine.processor
        for samples in (321, 16_000, 24_077):
            clip = processor.audio(wav(samples, seed=samples))
            full = processor.feature_extractor(
                processor.samples(wav(samples, seed=samples)),
                sampling_rate=16_000,
                padding="max_length",
                return_attention_mask=True,
                return_tensors="np",
            )
            frames = int(full["attention_mask"].sum())
            assert clip.frames == frames
            np.testing.assert_allclose(
                clip.features.numpy(), full["input_features"][0, :, :frames], atol=1e-6
            )

    @pytest.mark.parametrize(
        ("body", "status", "words"),
        [
            (
                chat({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}),
                400,
                "video",
            ),
            (
                chat({"type": "image_url", "image_url": {"url": "http://example.invalid/a.png"}}),
                400,
                "never fetches",
            ),
            (chat(image_part(b"not an image")), 400, "cannot decode"),
            (chat(audio_part(b"RIFF....")), 400, "cannot decode"),
            (chat(audio_part(wav(100))), 400, "too short"),
            (
                {"model": "other", "messages": [{"role": "user", "content": "x"}]},
                404,
                "does not exist",
            ),
            ({"model": MODEL}, 400, "messages"),
            (chat(max_tokens=0), 400, "max_tokens"),
            (chat({"type": "mystery"}), 400, "unsupported"),
        ],
    )
    def test_bad_requests_are_refused(self, engine, body: dict, status: int, words: str) -> None:
        """What the engine cannot run is a 4xx with a reason, before any engine step."""
        steps = engine.ledger.totals().steps
        with pytest.raises(RequestError) as caught:
            engine.complete(body)
        assert caught.value.status == status
        assert words in caught.value.message
        assert engine.ledger.totals().steps == steps


# --- Over HTTP ---------------------------------------------------------------------------
class TestHttp:
    """The server on 127.0.0.1 behind the engine middleware."""

    def test_timers_in_headers_and_the_engine_span(self, server, otel) -> None:
        """A JSON response carries the timers; the span continues the trace and attributes."""
        before = len(otel.exporter.get_finished_spans())
        status, headers, raw = post(server, MIXED, {"traceparent": TRACEPARENT})
        assert status == 200
        response = json.loads(raw)
        timers = timers_from_headers(headers)
        assert set(timers.components()) == set(COMPONENTS)
        assert math.isclose(timers.total, sum(timers.components().values()), rel_tol=1e-12)
        span = next_span(otel, before)
        assert span.kind is SpanKind.SERVER
        assert f"{span.context.trace_id:032x}" == TRACE_ID
        assert span.name == f"chat {MODEL}"
        attrs = span.attributes
        assert attrs[semconv.GPU_SECONDS] == timers.total
        units = profile_count(MIXED).units.root
        assert attrs[semconv.unit("image.tokens")] == units["image.tokens"]
        assert attrs[semconv.unit("audio.tokens")] == units["audio.tokens"]
        details = response["usage"]["prompt_tokens_details"]
        assert details["image_tokens"] == units["image.tokens"]
        attributed = sum(
            v for k, v in attrs.items() if k.startswith("modtrace.attributed.gpu_seconds.")
        )
        assert math.isclose(attributed, timers.total, rel_tol=1e-9)

    def test_stream_with_usage_ends_with_the_timers(self, server) -> None:
        """SSE: tokens, the usage chunk with the modtrace object, the comment block, [DONE]."""
        body = {**MIXED, "stream": True, "stream_options": {"include_usage": True}}
        status, headers, raw = post(server, body)
        assert status == 200
        assert headers["content-type"].startswith("text/event-stream")
        assert timers_from_headers(headers) is None
        datas = [line[6:] for line in raw.decode().splitlines() if line.startswith("data: ")]
        assert datas[-1] == "[DONE]"
        chunks = [json.loads(d) for d in datas[:-1]]
        usage_chunk = chunks[-1]
        assert usage_chunk["choices"] == []
        units = profile_count(MIXED).units.root
        assert (
            usage_chunk["usage"]["prompt_tokens_details"]["audio_tokens"] == units["audio.tokens"]
        )
        in_chunk = timers_from_headers(usage_chunk[USAGE_EXTENSION])
        assert in_chunk == timers_from_sse(raw)
        assert set(in_chunk.components()) == set(COMPONENTS)
        assert chunks[-2]["choices"][0]["finish_reason"] in ("stop", "length")

    @pytest.mark.skipif(importlib.util.find_spec("openai") is None, reason="openai not installed")
    def test_openai_client_reads_usage_and_timers(self, server) -> None:
        """The real openai client streams from the engine and keeps the modtrace object."""
        import openai

        units = profile_count(MIXED).units.root
        with openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0) as client:
            stream = client.chat.completions.create(
                **MIXED, stream=True, stream_options={"include_usage": True}
            )
            final = list(stream)[-1]
            plain = client.chat.completions.with_raw_response.create(**MIXED)
        details = final.usage.prompt_tokens_details
        # image_tokens is a field in recent openai releases, an extra field before.
        image = getattr(details, "image_tokens", None) or details.model_extra["image_tokens"]
        assert image == units["image.tokens"]
        assert details.audio_tokens == units["audio.tokens"]
        timers = timers_from_headers(final.model_extra[USAGE_EXTENSION])
        assert timers.source == "step_ledger"
        assert timers_from_headers(dict(plain.headers)).total > 0
        assert plain.parse().usage.prompt_tokens_details.audio_tokens == units["audio.tokens"]

    def test_engine_failure_is_a_500_with_partial_timers(self, server, otel) -> None:
        """A failed prefill: vLLM's error body, the encoder time still reported and traced."""
        before = len(otel.exporter.get_finished_spans())
        status, headers, raw = post(server, MIXED, {FAULT_HEADER: "prefill"})
        assert status == 500
        error = json.loads(raw)["error"]
        assert error["code"] == 500
        assert error["type"] == "InternalServerError"
        timers = timers_from_headers(headers)
        assert set(timers.components()) == {"vision_encoder", "audio_encoder"}
        span = next_span(otel, before)
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes[semconv.ERROR_TYPE] == "500"

    def test_bad_request_is_a_400_without_timers(self, server) -> None:
        """A refused request: 400, vLLM's error body, no timer headers."""
        status, headers, raw = post(server, chat(image_part(b"junk")))
        assert status == 400
        assert json.loads(raw)["error"]["type"] == "BadRequestError"
        assert timers_from_headers(headers) is None
        status, _, _ = post(
            server, {"model": MODEL, "messages": "x"}, {"content-type": "text/plain"}
        )
        assert status == 400

    def test_client_leaving_mid_stream_aborts_the_request(self, server, engine, otel) -> None:
        """The client closes after the first token: the engine stops, the span still ends."""
        body = json.dumps({**chat(max_tokens=256), "stream": True}).encode()
        steps = engine.ledger.totals().steps
        before = len(otel.exporter.get_finished_spans())
        with socket.create_connection((server.host, server.port), timeout=30) as sock:
            head = (
                "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n"
                f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
            received = b""
            while b'"content": "' not in received.split(b"\n\n", 1)[-1]:
                received += sock.recv(65536)
        span = next_span(otel, before, lambda s: s.attributes.get(semconv.GPU_SECONDS))
        assert span.attributes[semconv.GPU_SECONDS] > 0
        time.sleep(0.2)
        assert engine.ledger.totals().steps - steps < 1 + 256  # stopped well before 256 tokens
        assert len(engine.ledger) == 0

    def test_health_and_models(self, server) -> None:
        """GET /health and /v1/models answer; unknown paths are 404."""

        def get(path: str) -> tuple[int, bytes]:
            conn = http.client.HTTPConnection(server.host, server.port, timeout=10)
            try:
                conn.request("GET", path)
                response = conn.getresponse()
                return response.status, response.read()
            finally:
                conn.close()

        status, raw = get("/v1/models")
        assert status == 200
        assert json.loads(raw)["data"][0]["id"] == MODEL
        assert get("/health")[0] == 200
        assert get("/nope")[0] == 404


def test_cli_prints_the_port_and_serves() -> None:
    """python -m modtrace.engine.reference --port 0 prints its URL and answers /health."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "modtrace.engine.reference", "--port", "0", "--threads", "1"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith("listening on http://127.0.0.1:")
        port = int(line.rsplit(":", 1)[1])
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                assert conn.getresponse().status == 200
                conn.close()
                break
            except (ConnectionError, http.client.HTTPException):
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        proc.stdout.close()
