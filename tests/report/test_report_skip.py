"""Engine spans behind a gateway (``modtrace.attribution.skip``) never count their seconds twice.

Each request below is a gateway span (the counts and the engine's measured
1.0 s, attributed) and the engine's own span of the same request, marked
``modtrace.attribution.skip`` and carrying the same 1.0 s: one GPU second
per request, whatever the report.
"""

from __future__ import annotations

import pytest
from report_helpers import inference, span, write_spans

from modtrace import semconv
from modtrace.calibration import Calibration
from modtrace.cost import Rate
from modtrace.report import (
    PricingConfig,
    ReadStats,
    Side,
    compare_report,
    drift_report,
    read_spans,
    restate_report,
    shares_report,
    subsidy_report,
)

WEIGHTS = Calibration.from_weights({"text.tokens": 0.001, "image.tokens": 0.002}, version="v2")
REQUESTS = 4


def gateway_span(i: int) -> dict:
    return span(
        f"2026-01-05T10:00:{i:02d}",
        inference(
            units={"text.tokens": 500, "image.tokens": 250},
            measured=1.0,
            attributed={"text": 0.5, "image": 0.5},
            version="v1",
            usd={"text": 0.0005, "image": 0.0005},
            usd_per_gpu_hour=3.6,
        ),
    )


def engine_span(i: int) -> dict:
    # What the engine hooks write with record_usage=False; usage units too, as other
    # engine code may, so that every report path is exercised.
    return span(
        f"2026-01-05T10:00:{i:02d}",
        inference(
            units={"text.tokens": 500, "image.tokens": 250},
            measured=1.0,
            extra={semconv.ATTRIBUTION_SKIP: True},
        ),
    )


@pytest.fixture
def behind_a_gateway(tmp_path):
    spans = [s for i in range(REQUESTS) for s in (gateway_span(i), engine_span(i))]
    return write_spans(tmp_path / "spans.jsonl", spans, per_line=3)


def run(report, path, **kwargs):
    stats = ReadStats()
    return report(read_spans(path, stats), stats, **kwargs)


def test_restate_counts_each_second_once(behind_a_gateway):
    """1.0 s recorded per request restates to 1.0 s, not 2.0 s."""
    report = run(restate_report, behind_a_gateway, calibration=WEIGHTS, bucket="all")
    (row,) = report.rows
    assert row["requests"] == REQUESTS
    assert row["recorded.gpu_seconds"] == pytest.approx(REQUESTS * 1.0)
    assert row["restated.gpu_seconds"] == pytest.approx(REQUESTS * 1.0)
    assert row["restated.gpu_seconds.unknown"] == 0.0
    assert report.input["attribution_skipped"] == REQUESTS


def test_restate_with_a_rate_only(behind_a_gateway):
    """Repricing alone skips them too."""
    report = run(restate_report, behind_a_gateway, rate=Rate(usd_per_gpu_hour=7.2), bucket="all")
    (row,) = report.rows
    assert row["requests"] == REQUESTS
    assert row["restated.gpu_seconds"] == pytest.approx(REQUESTS * 1.0)
    assert not any("no counts or timers" in w for w in report.warnings)


def test_shares_skip_them_without_calling_them_unattributed(behind_a_gateway):
    """No 'no attribution processor?' warning for spans that defer by design."""
    report = run(shares_report, behind_a_gateway, bucket="all")
    (row,) = report.rows
    assert row["requests"] == REQUESTS
    assert row["gpu_seconds"] == pytest.approx(REQUESTS * 1.0)
    assert report.input["unattributed_spans"] == 0
    assert report.input["attribution_skipped"] == REQUESTS
    assert not any("no attribution" in w for w in report.warnings)


def test_shares_skip_them_even_when_attributed(tmp_path):
    """A skip span that some other pipeline attributed still counts once only."""
    attributed_engine = span(
        "2026-01-05T10:00:00",
        inference(
            measured=1.0, attributed={"unknown": 1.0}, extra={semconv.ATTRIBUTION_SKIP: True}
        ),
    )
    path = write_spans(tmp_path / "s.jsonl", [gateway_span(0), attributed_engine])
    report = run(shares_report, path, bucket="all")
    (row,) = report.rows
    assert row["gpu_seconds"] == pytest.approx(1.0)
    assert report.input["attribution_skipped"] == 1


def test_drift_counts_each_request_once(behind_a_gateway):
    """Units and measured seconds per request come from the gateway spans alone."""
    report = run(drift_report, behind_a_gateway, bucket="day")
    metrics = {r["metric"]: r for r in report.rows}
    assert metrics["gpu_seconds/request"]["requests"] == REQUESTS
    assert metrics["gpu_seconds/request"]["value"] == pytest.approx(1.0)
    assert metrics["text.tokens/request"]["requests"] == REQUESTS
    assert report.input["attribution_skipped"] == REQUESTS


@pytest.mark.parametrize("calibration", [None, WEIGHTS], ids=["recorded", "restated"])
def test_compare_counts_each_request_once(behind_a_gateway, calibration):
    """Both sides see the gateway spans only, restated or not."""
    report = run(
        compare_report,
        behind_a_gateway,
        a=Side.parse("2026-01-05.."),
        b=Side.parse("2026-01-05.."),
        calibration=calibration,
    )
    lines = {r["metric"]: r for r in report.rows}
    assert lines["requests"]["a"] == REQUESTS
    assert report.input["unattributed_spans"] == 0
    assert report.input["attribution_skipped"] == REQUESTS
    total = sum(v["a"] for k, v in lines.items() if k.startswith("gpu_seconds.") and v["a"])
    assert total == pytest.approx(1.0)


def test_subsidy_counts_each_request_once(behind_a_gateway):
    """Costed requests are the gateway's; the engine spans are skipped, not 'unattributed'."""
    report = run(subsidy_report, behind_a_gateway, pricing=PricingConfig(usd_per_request=0.01))
    assert sum(r["requests"] for r in report.rows) == REQUESTS
    assert report.input["unattributed_spans"] == 0
    assert report.input["attribution_skipped"] == REQUESTS
