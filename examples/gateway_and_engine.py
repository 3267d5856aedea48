"""A gateway and an engine in one trace: counts from the gateway, GPU seconds from the engine.

    python examples/gateway_and_engine.py [--out FILE] [--requests N]

Starts two servers on 127.0.0.1, each with uvicorn in a thread:

* the **reference engine** (``modtrace.engine.reference``): an OpenAI-compatible
  server running a tiny random Qwen2.5-Omni thinker on the CPU, which times
  its encoder, prefill and decode passes and returns the GPU timers in
  response headers (or at the end of a stream);
* a **gateway**: a small OpenAI-compatible ASGI app behind
  :class:`modtrace.integrations.GatewayMiddleware`, forwarding each chat
  completion to the engine with an ``AsyncOpenAI`` client instrumented by
  :func:`modtrace.integrations.instrument_openai`.

Then it sends a mixed workload (text, images and audio generated here, some
requests streamed) through a plain ``openai`` client to the gateway. Each
request gives one trace: the gateway's span (SERVER) with the request's
counts, the engine's usage beside them and the engine-reported timers,
attributed per modality by :class:`modtrace.AttributionSpanProcessor`; and,
as its child, the engine's span (SERVER) with the timers it measured.

Spans go to ``FILE`` (OTLP JSON lines, default ``modtrace-spans.jsonl``) and,
when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set, over OTLP as well. The script
prints a per-modality summary read back from the file, stops both servers,
and exits 1 if a trace did not join or an attribution did not add up.

Needs ``modtrace[engine,openai]``. CPU seconds stand in for GPU seconds
(see ``docs/engine.md``).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import io
import json
import math
import os
import socket
import sys
import threading
import time
import uuid
import wave
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import openai
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from PIL import Image

from modtrace import semconv
from modtrace.counting import CountingConfig
from modtrace.engine import EngineHooks
from modtrace.engine.reference import EngineConfig, ReferenceEngine, start_server
from modtrace.export import configure, iter_spans, span_exporters
from modtrace.integrations import GatewayMiddleware, instrument_openai

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

MODEL = EngineConfig().model_name
#: The counting profile of the reference model (its geometry is Qwen2.5-Omni-7B's).
PROFILES = {MODEL: "qwen2.5-omni"}
#: Request headers the gateway passes on to the engine (media metadata; test faults).
FORWARDED_PREFIXES = ("x-llm-d-", "x-modtrace-", "x-reference-engine-")
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


# --- Media, made and encoded here ------------------------------------------------------------
def png(width: int, height: int, seed: int) -> bytes:
    """A noisy RGB PNG."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def wav(seconds: float, seed: int, rate: int = 16000) -> bytes:
    """A 16-bit mono PCM WAV of a chirp with noise, at 16 kHz (the model's rate)."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    signal = 0.4 * np.sin(2 * np.pi * (220 + 200 * t) * t) + 0.05 * rng.standard_normal(t.size)
    out = io.BytesIO()
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(rate)
        f.writeframes((np.clip(signal, -1, 1) * 32767).astype("<i2").tobytes())
    return out.getvalue()


def image_part(data: bytes) -> dict[str, Any]:
    """An ``image_url`` content part with a base64 ``data:`` URL."""
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def audio_part(data: bytes) -> dict[str, Any]:
    """An ``input_audio`` content part."""
    return {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"},
    }


def workload(n: int) -> list[dict[str, Any]]:
    """``n`` chat requests: text, image, audio and mixed ones in turn; every third streams."""
    shapes: list[tuple[str, list[dict[str, Any]]]] = [
        ("Say hello.", []),
        ("Describe the picture.", [image_part(png(320, 240, 1))]),
        ("Transcribe the clip.", [audio_part(wav(1.5, 2))]),
        (
            "Compare the image and the sound.",
            [image_part(png(160, 448, 3)), audio_part(wav(2.25, 4))],
        ),
        ("Two pictures.", [image_part(png(96, 96, 5)), image_part(png(400, 300, 6))]),
    ]
    requests = []
    for i in range(n):
        text, media = shapes[i % len(shapes)]
        request: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [{"type": "text", "text": text}, *media]}],
        }
        if i % 3 == 2:
            request["stream"] = True
            request["stream_options"] = {"include_usage": True}
        requests.append(request)
    return requests


# --- The gateway: a small OpenAI-compatible ASGI app ------------------------------------------
class Gateway:
    """``POST /v1/chat/completions``, forwarded to the engine with an openai client.

    Args:
        client: The (instrumented) ``AsyncOpenAI`` client of the engine.
    """

    def __init__(self, client: openai.AsyncOpenAI) -> None:
        self.client = client
        self._params = set(_create_parameters())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await self.client.close()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        if scope["path"] == "/v1/chat/completions" and scope["method"] == "POST":
            await self.chat(scope, receive, send)
        elif scope["path"] == "/health":
            await _send_json(send, 200, {})
        else:
            await _send_json(send, 404, {"error": {"message": "not found", "code": 404}})

    async def chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Forward one chat completion; errors keep the engine's status and body."""
        body = json.loads(await _read_body(receive) or b"{}")
        headers = {
            k.decode("latin-1"): v.decode("latin-1")
            for k, v in scope.get("headers", [])
            if k.decode("latin-1").lower().startswith(FORWARDED_PREFIXES)
        }
        kwargs = {k: v for k, v in body.items() if k in self._params}
        extra = {k: v for k, v in body.items() if k not in self._params}
        try:
            result = await self.client.chat.completions.create(
                **kwargs, extra_body=extra or None, extra_headers=headers or None
            )
        except openai.APIStatusError as exc:
            await _send_raw(send, exc.status_code, exc.response.content)
            return
        except openai.APIError as exc:  # timeout, connection refused
            await _send_json(send, 502, {"error": {"message": str(exc), "code": 502}})
            return
        if not body.get("stream"):
            await _send_json(send, 200, result.to_dict())
            return
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        async with result as stream:
            async for chunk in stream:
                data = b"data: " + chunk.to_json(indent=None).encode() + b"\n\n"
                await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def _create_parameters() -> list[str]:
    import inspect

    from openai.resources.chat.completions import AsyncCompletions

    skip = {"self", "extra_headers", "extra_query", "extra_body", "timeout"}
    return [p for p in inspect.signature(AsyncCompletions.create).parameters if p not in skip]


async def _read_body(receive: Receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _send_raw(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _send_json(send: Send, status: int, data: object) -> None:
    await _send_raw(send, status, json.dumps(data).encode())


# --- Serving -----------------------------------------------------------------------------------
@dataclass
class Served:
    """An ASGI app served by uvicorn in a background thread."""

    url: str
    server: Any
    thread: threading.Thread

    def stop(self) -> None:
        """Stop serving (lifespan shutdown included)."""
        self.server.should_exit = True
        self.thread.join(10)


def serve(app: Any, host: str = "127.0.0.1") -> Served:
    """Serve ``app`` on a free port of ``host``; returns once it accepts connections."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(128)
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", lifespan="on", access_log=False)
    )
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            msg = "the gateway did not start"
            raise RuntimeError(msg)
        time.sleep(0.01)
    port = sock.getsockname()[1]
    return Served(f"http://{host}:{port}", server, thread)


def build_gateway(
    engine_url: str, *, tracer_provider: Any = None, meter_provider: Any = None
) -> GatewayMiddleware:
    """The gateway: the middleware (counts, span) around the app (instrumented client)."""
    counting = CountingConfig(model_profiles=PROFILES)
    client = instrument_openai(
        openai.AsyncOpenAI(base_url=engine_url + "/v1", api_key="unused", max_retries=0),
        config=counting,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )
    return GatewayMiddleware(
        Gateway(client),
        config=counting,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
    )


# --- The summary ---------------------------------------------------------------------------------
def summarize(path: str, run_id: str) -> tuple[list[str], bool]:
    """The per-modality summary of this run's spans in ``path``; and whether all is consistent."""
    records = [r for r in iter_spans(path) if r.resource.get("service.instance.id") == run_id]
    gateway = [r for r in records if r.resource.get("service.name") == "modtrace-example-gateway"]
    engine = {
        r.parent_span_id: r for r in records if r.resource.get("service.name") == "reference-engine"
    }
    rows: dict[str, dict[str, float]] = {}
    measured = attributed = 0.0
    joined = consistent = 0
    for span in gateway:
        attrs = span.attributes
        child = engine.get(span.span_id)
        if child is not None and child.trace_id == span.trace_id:
            joined += 1
        total = attrs.get(semconv.GPU_SECONDS)
        parts = {
            m: attrs.get(semconv.attributed_gpu_seconds(m), 0.0)
            for m in ("text", "image", "audio", "video", "unknown")
        }
        if total is not None and math.isclose(
            sum(parts.values()), total, rel_tol=1e-9, abs_tol=1e-12
        ):
            consistent += 1
        measured += total or 0.0
        attributed += sum(parts.values())
        for modality, seconds in parts.items():
            row = rows.setdefault(
                modality, {"items": 0, "gateway": 0, "engine": 0, "diff": 0, "gpu": 0.0}
            )
            row["gpu"] += seconds
            row["items"] += attrs.get(semconv.unit(f"{modality}.count"), 0)
            row["gateway"] += attrs.get(semconv.unit(f"{modality}.tokens"), 0)
            row["engine"] += attrs.get(semconv.engine_usage_tokens(modality), 0)
            row["diff"] += attrs.get(semconv.unit_diff(f"{modality}.tokens"), 0)
    lines = [
        f"spans: {len(gateway)} gateway (SERVER, counted), {len(engine)} engine (SERVER, timed); "
        f"{joined}/{len(gateway)} traces joined gateway -> engine",
        f"{'modality':<9}{'items':>6}{'tokens(gateway)':>17}{'tokens(engine)':>16}{'diff':>7}"
        f"{'gpu_seconds':>14}{'share':>8}",
    ]
    for modality, row in rows.items():
        if not (row["gpu"] or row["gateway"] or row["engine"]):
            continue
        share = row["gpu"] / attributed if attributed else 0.0
        items = "-" if modality in ("text", "unknown") else f"{int(row['items'])}"
        lines.append(
            f"{modality:<9}{items:>6}{int(row['gateway']):>17}{int(row['engine']):>16}"
            f"{int(row['diff']):>+7}{row['gpu']:>14.6f}{share:>8.1%}"
        )
    lines.append(
        f"GPU seconds measured by the engine: {measured:.6f}; attributed: {attributed:.6f} "
        f"({consistent}/{len(gateway)} requests add up exactly)"
    )
    lines.append(
        "(text: modtrace's default estimate, llm-d's 4 UTF-8 bytes per token, against the "
        "engine's byte tokens with chat-template and media-boundary tokens)"
    )
    ok = bool(gateway) and joined == len(gateway) and consistent == len(gateway)
    return lines, ok


# --- Main -----------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", default="modtrace-spans.jsonl", help="OTLP JSON lines file of the spans"
    )
    parser.add_argument("--requests", type=int, default=10, help="requests to send (default 10)")
    args = parser.parse_args(argv)
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the example; 0 when every trace joined and every attribution added up."""
    args = parse_args(argv)
    otlp = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    )
    exporters = ("file", "otlp") if otlp else ("file",)
    run_id = uuid.uuid4().hex
    # The gateway: counts, the attribution processor, metrics.
    gateway_telemetry = configure(
        service_name="modtrace-example-gateway",
        exporters=exporters,
        file=args.out,
        resource_attributes={"service.instance.id": run_id},
        set_global=False,
        sdk_metrics=False,
    )
    # The engine: its own service, spans straight to the exporters (its timers
    # reach the gateway span, which is the one attributed).
    engine_tracer = TracerProvider(
        resource=Resource.create(
            {"service.name": "reference-engine", "service.instance.id": run_id}
        )
    )
    for exporter in span_exporters(exporters=exporters, file=args.out):
        engine_tracer.add_span_processor(BatchSpanProcessor(exporter))

    engine = ReferenceEngine(EngineConfig(threads=1))
    engine_server = start_server(
        engine, hooks=EngineHooks(engine.ledger, tracer_provider=engine_tracer, record_usage=False)
    )
    gateway_server = serve(
        build_gateway(
            engine_server.url,
            tracer_provider=gateway_telemetry.tracer_provider,
            meter_provider=gateway_telemetry.meter_provider,
        )
    )
    print(f"reference engine  {engine_server.url}  ({MODEL}; CPU seconds stand in for GPU seconds)")
    print(f"gateway           {gateway_server.url}  (GatewayMiddleware + instrumented AsyncOpenAI)")
    sent = failed = streamed = 0
    try:
        client = openai.OpenAI(base_url=gateway_server.url + "/v1", api_key="unused", max_retries=0)
        for request in workload(args.requests):
            sent += 1
            try:
                if request.get("stream"):
                    streamed += 1
                    with client.chat.completions.create(**request) as stream:
                        for _ in stream:
                            pass
                else:
                    client.chat.completions.create(**request)
            except openai.APIError as exc:
                failed += 1
                print(f"request {sent} failed: {exc}", file=sys.stderr)
        client.close()
    finally:
        gateway_server.stop()
        engine_server.stop()
        gateway_telemetry.shutdown()
        engine_tracer.shutdown()
    print(f"sent {sent} requests ({streamed} streamed) through the gateway: {sent - failed} ok")
    lines, ok = summarize(args.out, run_id)
    print("\n".join(lines))
    where = f"{args.out} (OTLP JSON lines)" + (f" and OTLP {otlp}" if otlp else "")
    print(f"spans written to {where}")
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
