"""examples/gateway_and_engine.py, run as a user runs it, with an OTLP collector listening."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("openai")
pytest.importorskip("wrapt")
pytest.importorskip("torch")
pytest.importorskip("uvicorn")

from integrations_helpers import EXAMPLE, MODALITIES, ROOT
from otlp_receiver import OTLPReceiver

from modtrace import semconv
from modtrace.export import iter_spans

KIND_SERVER = 2


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One run of the example with 3 requests: its output, its span file, what OTLP received."""
    out = tmp_path_factory.mktemp("example") / "spans.jsonl"
    with OTLPReceiver() as receiver:
        env = {
            **os.environ,
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        }
        done = subprocess.run(
            [sys.executable, str(EXAMPLE), "--requests", "3", "--out", str(out)],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        received = list(receiver.spans())
    return done, list(iter_spans(out)), received


def test_exits_cleanly_with_a_summary(run) -> None:
    """Exit 0, a per-modality table and the file named."""
    done, _, _ = run
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "sent 3 requests (1 streamed) through the gateway: 3 ok" in lines
    assert any(
        line.startswith("spans: 3 gateway") and "3/3 traces joined" in line for line in lines
    )
    table = {
        line.split()[0]: line.split()
        for line in lines
        if line.split()[:1] in (["text"], ["image"], ["audio"])
    }
    assert set(table) == {"text", "image", "audio"}
    assert table["image"][4] == "+0" and table["audio"][4] == "+0"  # engine == gateway tokens
    assert "(3/3 requests add up exactly)" in done.stdout
    assert "spans.jsonl" in lines[-1]


def test_file_holds_the_joined_traces(run) -> None:
    """Each gateway span has one engine child in its trace; the attribution adds up."""
    _, spans, _ = run
    gateway = [s for s in spans if s.resource["service.name"] == "modtrace-example-gateway"]
    engine = [s for s in spans if s.resource["service.name"] == "reference-engine"]
    assert len(gateway) == 3 and len(engine) == 3
    children = {s.parent_span_id: s for s in engine}
    for span in gateway:
        assert span.kind == KIND_SERVER
        child = children[span.span_id]
        assert child.trace_id == span.trace_id
        attrs = span.attributes
        assert attrs[semconv.GPU_SECONDS] == child.attributes[semconv.GPU_SECONDS]
        attributed = sum(attrs.get(semconv.attributed_gpu_seconds(m), 0.0) for m in MODALITIES)
        assert math.isclose(attributed, attrs[semconv.GPU_SECONDS], rel_tol=1e-12)
    counted = {
        m for s in gateway for m in ("image", "audio") if semconv.unit(f"{m}.count") in s.attributes
    }
    assert counted == {"image", "audio"}


def test_spans_also_went_over_otlp(run) -> None:
    """With OTEL_EXPORTER_OTLP_ENDPOINT set, the collector received the same spans."""
    _, spans, received = run
    assert {(s.trace_id, s.span_id) for s in spans} <= {(r.trace_id, r.span_id) for r in received}
