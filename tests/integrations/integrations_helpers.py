"""Shared pieces of the integration tests: real media, requests, telemetry, the engine."""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import io
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import soundfile
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from PIL import Image

from modtrace import semconv
from modtrace.counting import CountingConfig
from modtrace.engine import EngineHooks
from modtrace.engine.reference import EngineConfig, ReferenceEngine, RunningServer, start_server
from modtrace.processor import AttributionSpanProcessor

MODEL = EngineConfig().model_name
PROFILE = "qwen2.5-omni"
#: The gateway's counting configuration: the reference model counts as Qwen2.5-Omni.
COUNTING = CountingConfig(model_profiles={MODEL: PROFILE})
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gateway_and_engine.py"


# --- Media, really encoded --------------------------------------------------------------------
def png(width: int, height: int, seed: int = 0) -> bytes:
    """A noisy RGB PNG of the given size."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def wav(samples: int, rate: int = 16000, seed: int = 0) -> bytes:
    """A 16-bit PCM WAV of noise (libsndfile writes it)."""
    wave = np.random.default_rng(seed).uniform(-0.5, 0.5, samples).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, wave, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def image_part(data: bytes) -> dict[str, Any]:
    """An ``image_url`` part with a base64 ``data:`` URL."""
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def audio_part(data: bytes) -> dict[str, Any]:
    """An ``input_audio`` part."""
    return {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"},
    }


def messages(*parts: dict[str, Any], text: str = "Describe these.") -> list[dict[str, Any]]:
    """One system and one user message holding ``parts``."""
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": text}, *parts]},
    ]


#: Two images and two clips of odd sizes (16 kHz, as the engine wants exact counts).
MIXED = messages(
    image_part(png(320, 240)),
    audio_part(wav(24_000)),
    image_part(png(57, 911, seed=1)),
    audio_part(wav(53_921, seed=2)),
)


# --- Telemetry -----------------------------------------------------------------------------------
@dataclass
class Telemetry:
    """A tracer provider with the attribution processor, exporting to memory."""

    tracers: TracerProvider
    meters: MeterProvider
    exporter: InMemorySpanExporter

    @classmethod
    def attributed(cls) -> Telemetry:
        """Spans attributed synchronously by the modtrace processor."""
        exporter = InMemorySpanExporter()
        meters = MeterProvider(metric_readers=[InMemoryMetricReader()])
        tracers = TracerProvider()
        tracers.add_span_processor(
            AttributionSpanProcessor(
                SimpleSpanProcessor(exporter), meter_provider=meters, background=False
            )
        )
        return cls(tracers, meters, exporter)

    @classmethod
    def plain(cls) -> Telemetry:
        """Spans exported as they are (the engine's service)."""
        exporter = InMemorySpanExporter()
        tracers = TracerProvider()
        tracers.add_span_processor(SimpleSpanProcessor(exporter))
        return cls(tracers, MeterProvider(), exporter)

    def spans(self) -> tuple[ReadableSpan, ...]:
        """Every finished span so far."""
        return self.exporter.get_finished_spans()

    def clear(self) -> None:
        """Forget the spans so far."""
        self.exporter.clear()

    def shutdown(self) -> None:
        """Stop both providers."""
        self.tracers.shutdown()
        self.meters.shutdown()


def wait_for_spans(telemetry: Telemetry, count: int, timeout: float = 10.0) -> list[ReadableSpan]:
    """The first ``count`` finished spans, waiting for them.

    The engine ends its span just after the last byte of its response, so a
    client may read the response a moment before the span is exported.
    """
    deadline = time.monotonic() + timeout
    while len(telemetry.spans()) < count:
        assert time.monotonic() < deadline, f"expected {count} spans, got {len(telemetry.spans())}"
        time.sleep(0.01)
    return list(telemetry.spans())


def inference_spans(telemetry: Telemetry) -> list[ReadableSpan]:
    """The finished spans that carry modtrace counts."""
    return [
        s
        for s in telemetry.spans()
        if any(k.startswith(semconv.UNITS_PREFIX) for k in (s.attributes or {}))
    ]


def hexid(value: int, width: int = 32) -> str:
    """A trace or span id as lowercase hex."""
    return format(value, f"0{width}x")


# --- The engine -----------------------------------------------------------------------------------
@contextlib.contextmanager
def running_engine(telemetry: Telemetry) -> Iterator[RunningServer]:
    """The reference engine on 127.0.0.1 (fault injection on), spans to ``telemetry``.

    ``record_usage=False``: the caller's span carries the counts, as in a
    pipeline where gateway and engine report to the same backend.
    """
    engine = ReferenceEngine(EngineConfig(threads=1, allow_fault_injection=True))
    hooks = EngineHooks(engine.ledger, tracer_provider=telemetry.tracers, record_usage=False)
    with start_server(engine, hooks=hooks) as server:
        yield server


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def load_example() -> ModuleType:
    """``examples/gateway_and_engine.py`` as a module (its gateway app is reused)."""
    spec = importlib.util.spec_from_file_location("gateway_and_engine_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered before running it: its dataclasses look their module up by name.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
