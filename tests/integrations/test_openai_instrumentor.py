"""ModtraceInstrumentor: instrument, uninstrument, instrument twice, the entry point."""

from __future__ import annotations

import asyncio
import importlib.metadata
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("openai")
pytest.importorskip("wrapt")
pytest.importorskip("opentelemetry.instrumentation")
pytest.importorskip("torch")
pytest.importorskip("uvicorn")

import wrapt
from chat_helpers import messages
from integrations_helpers import COUNTING, MODEL, PROFILE, openai_client
from openai.resources.chat.completions import AsyncCompletions, Completions
from opentelemetry.trace import SpanKind
from telemetry_helpers import Telemetry, wait_for_spans

from modtrace import semconv
from modtrace.export import iter_spans
from modtrace.integrations.instrumentor import MODTRACE_COUNTING_CONFIG, ModtraceInstrumentor
from modtrace.integrations.openai import instrument_openai, is_instrumented, uninstrument_openai

ORIGINAL_CREATE = inspect.getattr_static(Completions, "create")
ORIGINAL_ACREATE = inspect.getattr_static(AsyncCompletions, "create")


@pytest.fixture
def instrumentor():
    """The instrumentor (a singleton), uninstrumented again after the test."""
    found = ModtraceInstrumentor()
    yield found
    if found.is_instrumented_by_opentelemetry:
        found.uninstrument()


@pytest.fixture
def client(engine):
    """A plain client, never instrumented explicitly."""
    with openai_client(engine.url) as found:
        yield found


def ask(client) -> None:
    """One short chat completion."""
    client.chat.completions.create(model=MODEL, messages=messages(), max_tokens=2)


def wrapped_once(cls: type) -> bool:
    """``cls.create`` is one wrapt layer over the original function."""
    found = inspect.getattr_static(cls, "create")
    return isinstance(found, wrapt.FunctionWrapper) and not isinstance(
        found.__wrapped__, wrapt.FunctionWrapper
    )


def test_instrument_traces_every_client(instrumentor, client, otel, engine_telemetry) -> None:
    """After instrument(): a client nobody instrumented gets a span and joins the engine's trace."""
    instrumentor.instrument(tracer_provider=otel.tracers, config=COUNTING)
    assert wrapped_once(Completions) and wrapped_once(AsyncCompletions)
    ask(client)
    span = otel.spans()[0]
    assert len(otel.spans()) == 1
    assert span.kind is SpanKind.CLIENT
    assert span.attributes[semconv.UNITS_PROFILE] == PROFILE
    (server,) = wait_for_spans(engine_telemetry, 1)
    assert server.parent.span_id == span.context.span_id
    assert span.attributes[semconv.GPU_SECONDS] == server.attributes[semconv.GPU_SECONDS]


def test_instrument_traces_async_clients(instrumentor, engine, otel, engine_telemetry) -> None:
    """Async clients get async hooks at their first call, and the same span."""
    instrumentor.instrument(tracer_provider=otel.tracers, config=COUNTING)

    async def run() -> None:
        async with openai_client(engine.url, asynchronous=True) as aclient:
            await aclient.chat.completions.create(model=MODEL, messages=messages(), max_tokens=2)

    asyncio.run(run())
    (span,) = otel.spans()
    (server,) = wait_for_spans(engine_telemetry, 1)
    assert server.parent.span_id == span.context.span_id


def test_uninstrument_unwraps(instrumentor, client, otel, engine_telemetry) -> None:
    """After uninstrument(): the original methods, no span, no traceparent, no hooks."""
    instrumentor.instrument(tracer_provider=otel.tracers, config=COUNTING)
    ask(client)  # adds the hooks to this client
    wait_for_spans(engine_telemetry, 1)
    instrumentor.uninstrument()
    assert inspect.getattr_static(Completions, "create") is ORIGINAL_CREATE
    assert inspect.getattr_static(AsyncCompletions, "create") is ORIGINAL_ACREATE
    hooks = client._client.event_hooks
    assert not any(h.__module__ == "modtrace.integrations.openai" for h in hooks["request"])
    assert not any(h.__module__ == "modtrace.integrations.openai" for h in hooks["response"])
    assert not is_instrumented(client)
    engine_telemetry.clear()
    ask(client)
    assert len(otel.spans()) == 1  # only the call made while instrumented
    (server,) = wait_for_spans(engine_telemetry, 1)
    assert server.parent is None


def test_double_instrument_is_one_layer(instrumentor, client, otel, engine_telemetry) -> None:
    """instrument() twice: one wrapper, one span per call; one uninstrument() undoes it."""
    instrumentor.instrument(tracer_provider=otel.tracers, config=COUNTING)
    instrumentor.instrument(tracer_provider=otel.tracers, config=COUNTING)
    assert wrapped_once(Completions) and wrapped_once(AsyncCompletions)
    ask(client)
    assert len(otel.spans()) == 1
    (server,) = wait_for_spans(engine_telemetry, 1)
    assert server.parent.span_id == otel.spans()[0].context.span_id
    instrumentor.uninstrument()
    assert inspect.getattr_static(Completions, "create") is ORIGINAL_CREATE


def test_explicit_and_global_together(instrumentor, engine, otel, engine_telemetry) -> None:
    """An explicitly instrumented client keeps its settings and outlives uninstrument()."""
    mine = Telemetry.attributed()
    try:
        with openai_client(engine.url) as own:
            instrument_openai(own, config=COUNTING, tracer_provider=mine.tracers)
            instrumentor.instrument(tracer_provider=otel.tracers, config=COUNTING)
            assert wrapped_once(Completions)
            ask(own)
            instrumentor.uninstrument()
            assert wrapped_once(Completions)  # still needed by the explicit client
            ask(own)
            uninstrument_openai(own)
            assert inspect.getattr_static(Completions, "create") is ORIGINAL_CREATE
            ask(own)
        assert otel.spans() == ()
        assert len(mine.spans()) == 2
        wait_for_spans(engine_telemetry, 3)
    finally:
        mine.shutdown()


def test_counting_config_from_the_environment(
    instrumentor, client, otel, engine_telemetry, tmp_path, monkeypatch
) -> None:
    """Under opentelemetry-instrument (no arguments) the config file sets the model map."""
    path = tmp_path / "counting.json"
    path.write_text(json.dumps({"model_profiles": {MODEL: PROFILE}}), encoding="utf-8")
    monkeypatch.setenv(MODTRACE_COUNTING_CONFIG, str(path))
    instrumentor.instrument(tracer_provider=otel.tracers)
    ask(client)
    assert otel.spans()[0].attributes[semconv.UNITS_PROFILE] == PROFILE
    wait_for_spans(engine_telemetry, 1)


def test_a_bad_counting_config_fails_at_instrument(instrumentor, tmp_path, monkeypatch) -> None:
    """A configuration that cannot be read fails instrument(), not a request."""
    path = tmp_path / "counting.json"
    path.write_text('{"model_profiles": 3}', encoding="utf-8")
    monkeypatch.setenv(MODTRACE_COUNTING_CONFIG, str(path))
    with pytest.raises(ValueError, match=MODTRACE_COUNTING_CONFIG):
        instrumentor.instrument()
    assert inspect.getattr_static(Completions, "create") is ORIGINAL_CREATE


def test_instruments_openai() -> None:
    """The instrumented package, as opentelemetry-instrument checks it."""
    assert ModtraceInstrumentor().instrumentation_dependencies() == ("openai >= 1.40",)


def test_entry_point_names_the_instrumentor() -> None:
    """opentelemetry-instrument finds the instrumentor under opentelemetry_instrumentor."""
    found = [
        e
        for e in importlib.metadata.entry_points(group="opentelemetry_instrumentor")
        if e.name == "modtrace"
    ]
    if not found:
        pytest.skip("entry point not in the installed metadata (reinstall modtrace)")
    assert found[0].load() is ModtraceInstrumentor


APP = """
import sys
import openai
from modtrace.export import configure

telemetry = configure(exporters=["file"], file=sys.argv[2], background=False)
with openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0) as client:
    client.chat.completions.create(
        model={model!r}, messages=[{{"role": "user", "content": "hi"}}], max_tokens=2
    )
telemetry.shutdown()
"""


def test_opentelemetry_instrument_loads_it(engine, engine_telemetry, tmp_path) -> None:
    """``opentelemetry-instrument python app.py`` instruments the app's openai client.

    The entry point is declared by a distribution made here on PYTHONPATH,
    so the test does not depend on how modtrace itself was installed.
    """
    engine_telemetry.clear()
    dist = tmp_path / "site" / "modtrace_entry_point-0.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: modtrace-entry-point\nVersion: 0.0\n", encoding="utf-8"
    )
    (dist / "entry_points.txt").write_text(
        "[opentelemetry_instrumentor]\n"
        "modtrace = modtrace.integrations.instrumentor:ModtraceInstrumentor\n",
        encoding="utf-8",
    )
    config = tmp_path / "counting.json"
    config.write_text(json.dumps({"model_profiles": {MODEL: PROFILE}}), encoding="utf-8")
    app = tmp_path / "app.py"
    app.write_text(APP.format(model=MODEL), encoding="utf-8")
    out = tmp_path / "spans.jsonl"
    env = {
        **os.environ,
        "PYTHONPATH": str(dist.parent),
        MODTRACE_COUNTING_CONFIG: str(config),
        "OTEL_TRACES_EXPORTER": "none",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
    }
    command = [str(Path(sys.executable).parent / "opentelemetry-instrument"), sys.executable]
    done = subprocess.run(
        [*command, str(app), engine.url, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    (span,) = list(iter_spans(out))
    assert span.kind == 3  # CLIENT
    assert span.attributes[semconv.UNITS_PROFILE] == PROFILE
    (server,) = wait_for_spans(engine_telemetry, 1)
    assert format(server.context.trace_id, "032x") == span.trace_id
    assert format(server.parent.span_id, "016x") == span.span_id
    assert span.attributes[semconv.GPU_SECONDS] == server.attributes[semconv.GPU_SECONDS]
