"""``modtrace demo``: the whole path from generated requests to the weekly report."""

from __future__ import annotations

import json
from datetime import datetime, timezone

import pytest
from PIL import Image

from modtrace import semconv
from modtrace.cli import main
from modtrace.demo import COST_MODEL, DemoConfig, run_demo
from modtrace.export import read_otlp_json_lines

START = datetime(2026, 11, 16, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def week(tmp_path_factory):
    """One simulated week with the cost model (fast, deterministic)."""
    out = tmp_path_factory.mktemp("demo")
    return run_demo(DemoConfig(out=out, engine="model", start=START))


def test_outputs_exist(week):
    """The three documented files are written."""
    assert week.spans.name == "spans.otlp.jsonl"
    assert week.report.name == "report.json"
    assert week.chart is not None
    with Image.open(week.chart) as img:
        assert img.format == "PNG"
        assert img.size[0] > 400


def test_spans_are_otlp_json_with_attribution(week):
    """Every line parses as OTLP JSON; every span is counted, timed and attributed."""
    spans = [
        span
        for request in read_otlp_json_lines(week.spans)
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]
    assert len(spans) == week.requests
    for span in spans[:50]:
        attrs = {a.key for a in span.attributes}
        assert semconv.GPU_SECONDS in attrs
        assert semconv.ATTRIBUTED_METHOD in attrs
        assert semconv.unit("text.tokens") in attrs
        assert semconv.COST_HYPOTHETICAL in attrs
    # Replayed over the simulated week, not at the time the test ran.
    starts = sorted(s.start_time_unix_nano for s in spans)
    assert starts[0] >= int(START.timestamp()) * 10**9
    assert starts[-1] - starts[0] > 6 * 86_400 * 10**9


def test_report_shows_the_launch(week):
    """Image share climbs past the launch while tokens per request stay flat; drift is flagged."""
    report = json.loads(week.report.read_text())
    assert report["simulated"] is True
    assert report["hypothetical_usd"] is True
    assert report["cost_model"] == COST_MODEL
    drift = report["drift"]
    assert drift["drift_detected"] is True
    flagged = {f["metric"] for f in drift["flags"]}
    assert {"image.tokens/request", "share.image"} <= flagged
    assert "tokens/request" not in flagged  # the blended view stays flat
    rows = {r["bucket"]: r["value"] for r in drift["rows"] if r["metric"] == "share.image"}
    days = sorted(rows)
    assert rows[days[0]] < 0.1 < 0.4 < rows[days[-1]]


def test_command(tmp_path, capsys):
    """`modtrace demo --out DIR` prints the weekly report and where it wrote things."""
    assert main(["demo", "--out", str(tmp_path), "--engine", "model", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "Modality shares of GPU seconds per week" in out
    assert "share.image" in out
    assert "hypothetical" in out
    for name in ("spans.otlp.jsonl", "report.json", "shares.png"):
        assert (tmp_path / name).exists()


def test_reference_engine_path(tmp_path):
    """With modtrace[engine] installed, timings come from the reference engine, labelled."""
    pytest.importorskip("torch")
    result = run_demo(DemoConfig(out=tmp_path, engine="reference", requests_per_day=3, start=START))
    assert "reference engine" in result.engine
    report = json.loads(result.report.read_text())
    assert report["cost_model"] is None
    sources = {
        a.value.string_value
        for request in read_otlp_json_lines(result.spans)
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
        for a in span.attributes
        if a.key == semconv.GPU_SOURCE
    }
    assert sources and all(s.startswith("simulated_") for s in sources)
