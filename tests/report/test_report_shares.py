"""Shares report on generated span files with answers worked out by hand."""

from __future__ import annotations

import pytest
from report_helpers import inference, span, write_spans

from modtrace.cost import Rate
from modtrace.report import ReadStats, Window, read_spans, shares_report

MODEL = "gen_ai.request.model"

# Four requests, chosen so that every figure below is a sum done by hand.
#   Mon 2026-01-05 10:00  A  text 0.5  image 1.5        usd 0.001 + 0.003
#   Mon 2026-01-05 11:00  B  text 1.0                   usd 0.002
#   Tue 2026-01-06 09:00  A  text 0.25 audio 0.75       usd 0.0005 + 0.0015
#   Mon 2026-01-12 08:00  A  image 2.0                  usd 0.004
REQUESTS = [
    ("2026-01-05T10:00:00", "A", {"text": 0.5, "image": 1.5}, {"text": 0.001, "image": 0.003}),
    ("2026-01-05T11:00:00", "B", {"text": 1.0}, {"text": 0.002}),
    ("2026-01-06T09:00:00", "A", {"text": 0.25, "audio": 0.75}, {"text": 0.0005, "audio": 0.0015}),
    ("2026-01-12T08:00:00", "A", {"image": 2.0}, {"image": 0.004}),
]


def _spans(version="v1", requests=REQUESTS):
    return [
        span(
            start,
            inference(
                attributed=seconds,
                version=version,
                usd=usd,
                usd_per_gpu_hour=2.0,
                rate_id="r1",
                extra={MODEL: model},
            ),
        )
        for start, model, seconds, usd in requests
    ]


def _report(path, **kwargs):
    stats = ReadStats()
    return shares_report(read_spans(path, stats), stats, **kwargs)


@pytest.fixture
def four(tmp_path):
    return write_spans(tmp_path / "spans.jsonl", _spans(), per_line=3)


def _by_bucket(report):
    return {r["bucket"]: r for r in report.rows}


class TestSharesKnownAnswers:
    """Bucketed and grouped sums, shares and dollars match the hand sums."""

    def test_per_day(self, four):
        """Two requests on Monday, one on Tuesday, one the Monday after."""
        rows = _by_bucket(_report(four, bucket="day"))
        assert list(rows) == ["2026-01-05", "2026-01-06", "2026-01-12"]
        monday = rows["2026-01-05"]
        assert monday["requests"] == 2
        assert monday["gpu_seconds.text"] == pytest.approx(1.5)
        assert monday["gpu_seconds.image"] == pytest.approx(1.5)
        assert monday["gpu_seconds"] == pytest.approx(3.0)
        assert monday["share.text"] == pytest.approx(0.5)
        assert monday["share.image"] == pytest.approx(0.5)
        assert monday["share.audio"] == 0.0
        assert monday["usd"] == pytest.approx(0.006)
        assert monday["usd.text"] == pytest.approx(0.003)
        assert monday["calibration_version"] == "v1"
        tuesday = rows["2026-01-06"]
        assert tuesday["share.text"] == pytest.approx(0.25)
        assert tuesday["share.audio"] == pytest.approx(0.75)
        assert rows["2026-01-12"]["share.image"] == pytest.approx(1.0)

    def test_per_week_starts_on_monday(self, four):
        """Monday and Tuesday fall in the week of 2026-01-05; the next Monday starts a new one."""
        rows = _by_bucket(_report(four, bucket="week"))
        assert list(rows) == ["2026-01-05", "2026-01-12"]
        week = rows["2026-01-05"]
        assert week["requests"] == 3
        assert week["gpu_seconds"] == pytest.approx(4.0)
        assert week["share.text"] == pytest.approx(1.75 / 4.0)
        assert week["share.image"] == pytest.approx(1.5 / 4.0)
        assert week["share.audio"] == pytest.approx(0.75 / 4.0)
        assert sum(week[f"share.{m}"] for m in ("text", "image", "audio", "video", "unknown")) == (
            pytest.approx(1.0)
        )

    def test_grouped_by_model(self, four):
        """Grouping by ``gen_ai.request.model`` splits A (three requests) from B (one)."""
        report = _report(four, bucket="all", by=MODEL)
        rows = {r[MODEL]: r for r in report.rows}
        assert rows["A"]["requests"] == 3
        assert rows["A"]["gpu_seconds"] == pytest.approx(5.0)
        assert rows["A"]["share.image"] == pytest.approx(3.5 / 5.0)
        assert rows["A"]["usd"] == pytest.approx(0.001 + 0.003 + 0.0005 + 0.0015 + 0.004)
        assert rows["B"]["share.text"] == pytest.approx(1.0)
        assert MODEL in report.columns and report.params["by"] == MODEL

    def test_grouped_by_resource_attribute(self, tmp_path):
        """An attribute only on the resource groups as well (span attribute first)."""
        spans = [
            span(
                "2026-01-05T10:00:00",
                inference(attributed={"text": 1.0}),
                resource={"region": "eu"},
            ),
            span(
                "2026-01-05T10:00:01",
                inference(attributed={"text": 3.0}),
                resource={"region": "us"},
            ),
            span("2026-01-05T10:00:02", inference(attributed={"text": 5.0})),
        ]
        path = write_spans(tmp_path / "s.jsonl", spans)
        rows = {
            r["region"]: r["gpu_seconds"] for r in _report(path, bucket="all", by="region").rows
        }
        assert rows == {"eu": pytest.approx(1.0), "us": pytest.approx(3.0), "": pytest.approx(5.0)}

    def test_rate_prices_every_second(self, four):
        """With a rate, dollars are seconds x rate / 3600 (3.6 USD an hour is 0.001 a second)."""
        report = _report(four, bucket="all", rate=Rate(usd_per_gpu_hour=3.6, id="plan"))
        (row,) = report.rows
        assert row["usd"] == pytest.approx(6.0 * 0.001)
        assert row["usd.image"] == pytest.approx(3.5 * 0.001)
        assert report.params["usd_basis"] == "rate" and report.params["rate_id"] == "plan"

    def test_totals_per_group_and_version(self, four):
        """Totals sum every bucket of a group and version."""
        report = _report(four, bucket="day")
        (total,) = report.extra["totals"]
        assert total["bucket"] == "total"
        assert total["requests"] == 4
        assert total["gpu_seconds"] == pytest.approx(6.0)

    def test_window(self, four):
        """Only spans starting inside [since, until) count; the others are counted outside."""
        report = _report(four, bucket="all", window=Window.parse("2026-01-06", "2026-01-12"))
        (row,) = report.rows
        assert row["requests"] == 1
        assert row["gpu_seconds"] == pytest.approx(1.0)
        assert report.input["outside_window"] == 3


class TestSharesNeverMix:
    """Mixed versions, unattributed and invalid spans are counted and reported."""

    def test_mixed_calibration_versions_split_rows(self, tmp_path):
        """Spans of v1 and v2 on the same day make two rows and a warning, never one sum."""
        later = [("2026-01-05T12:00:00", "A", {"text": 4.0}, {"text": 0.008})]
        path = write_spans(tmp_path / "s.jsonl", _spans("v1") + _spans("v2", later))
        report = _report(path, bucket="day")
        monday = [r for r in report.rows if r["bucket"] == "2026-01-05"]
        assert [(r["calibration_version"], r["requests"]) for r in monday] == [
            ("v1", 2),
            ("v2", 1),
        ]
        assert monday[1]["share.text"] == pytest.approx(1.0)
        assert any("2 calibration versions" in w and "v2: 1 requests" in w for w in report.warnings)
        assert {t["calibration_version"] for t in report.extra["totals"]} == {"v1", "v2"}

    def test_unattributed_and_invalid_spans_are_counted(self, tmp_path):
        """A span with counts only and a span with a negative value are left out and counted."""
        extra = [
            span("2026-01-05T10:30:00", inference(units={"text.tokens": 100}, measured=1.0)),
            span(
                "2026-01-05T10:31:00",
                inference(attributed={"text": 1.0, "image": -2.0}, version="v1"),
            ),
        ]
        path = write_spans(tmp_path / "s.jsonl", _spans() + extra)
        report = _report(path, bucket="all")
        assert report.rows[0]["requests"] == 4
        assert report.input["unattributed_spans"] == 1
        assert report.input["invalid_spans"] == 1
        assert any("no attribution" in w for w in report.warnings)
        assert any("invalid value" in w for w in report.warnings)

    def test_unpriced_requests_and_mixed_rates_warn(self, tmp_path):
        """Recorded dollars that cover part of the requests, or mix rates, say so."""
        extra = [
            span("2026-01-05T10:30:00", inference(attributed={"text": 1.0}, version="v1")),
            span(
                "2026-01-05T10:31:00",
                inference(attributed={"text": 1.0}, version="v1", usd={"text": 0.01}, rate_id="r2"),
            ),
        ]
        path = write_spans(tmp_path / "s.jsonl", _spans() + extra)
        report = _report(path, bucket="all")
        assert report.rows[0]["priced_requests"] == 5
        assert any("5 of 6 requests" in w for w in report.warnings)
        assert any("mix 2 rates (r1, r2)" in w for w in report.warnings)

    def test_empty_input(self, tmp_path):
        """No spans: no rows, no crash."""
        path = tmp_path / "empty.jsonl"
        path.write_text("")
        report = _report(path)
        assert report.rows == [] and report.extra["totals"] == []
