"""Shared pieces of the integration tests: the reference engine, its spans, the example."""

from __future__ import annotations

import contextlib
import importlib.util
import math
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from chat_helpers import messages, mixed_parts
from opentelemetry.sdk.trace import ReadableSpan
from telemetry_helpers import Telemetry

from modtrace import semconv
from modtrace.counting import CountingConfig
from modtrace.engine import EngineHooks
from modtrace.engine.reference import EngineConfig, ReferenceEngine, RunningServer, start_server
from modtrace.timers import COMPONENTS

MODEL = EngineConfig().model_name
PROFILE = "qwen2.5-omni"
#: The gateway's counting configuration: the reference model counts as Qwen2.5-Omni.
COUNTING = CountingConfig(model_profiles={MODEL: PROFILE})
ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "gateway_and_engine.py"
#: Every modality a span attributes seconds to.
MODALITIES = ("text", "image", "audio", "video", "unknown")


#: Two images and two clips of odd sizes (16 kHz, as the engine wants exact counts).
MIXED = messages(*mixed_parts())
#: ``create`` arguments of a streamed MIXED request whose last chunk carries the usage.
STREAM_WITH_USAGE: dict[str, Any] = {
    "model": MODEL,
    "messages": MIXED,
    "stream": True,
    "stream_options": {"include_usage": True},
}


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


def only(spans: Any) -> Any:
    """The one span of a list."""
    assert len(spans) == 1, [s.name for s in spans]
    return spans[0]


def attributed_total(attrs: Any) -> float:
    """The sum of the attributed GPU seconds over every modality."""
    return sum(attrs.get(semconv.attributed_gpu_seconds(m), 0.0) for m in MODALITIES)


def assert_engine_timers(attrs: Any, engine_attrs: Any) -> None:
    """The span carries exactly the timers the engine measured, and adds them up."""
    assert attrs[semconv.GPU_SOURCE] == "step_ledger"
    assert attrs[semconv.GPU_SECONDS] == engine_attrs[semconv.GPU_SECONDS]
    for name in COMPONENTS:
        key = semconv.gpu_seconds_component(name)
        assert attrs.get(key) == engine_attrs.get(key), key
    assert math.isclose(attributed_total(attrs), attrs[semconv.GPU_SECONDS], rel_tol=1e-12)


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


def openai_client(base_url: str, *, asynchronous: bool = False, **options: Any) -> Any:
    """A plain ``openai`` client of the server at ``base_url`` (its ``/v1``), without retries.

    ``options`` override the client's (``max_retries``, ``timeout``...).
    """
    import openai

    cls = openai.AsyncOpenAI if asynchronous else openai.OpenAI
    return cls(**{"base_url": base_url + "/v1", "api_key": "unused", "max_retries": 0, **options})


@contextlib.contextmanager
def instrumented(client: Any, **options: Any) -> Iterator[Any]:
    """``client`` instrumented (``instrument_openai(client, **options)``) inside the block."""
    from modtrace.integrations.openai import instrument_openai, uninstrument_openai

    instrument_openai(client, **options)
    try:
        yield client
    finally:
        uninstrument_openai(client)


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
