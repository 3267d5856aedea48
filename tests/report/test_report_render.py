"""Rendering: plain and rich tables, JSON, CSV and the charts of every report."""

from __future__ import annotations

import csv
import io
import json
import sys

import pytest
from PIL import Image
from report_helpers import inference, span, write_spans

from modtrace.calibration import Calibration
from modtrace.report import (
    PricingConfig,
    ReadStats,
    Report,
    Side,
    compare_report,
    read_spans,
    render,
    restate_report,
    shares_report,
    subsidy_report,
    write_chart,
)


@pytest.fixture
def path(tmp_path):
    spans = [
        span(
            f"2026-01-{day:02d}T10:00:00",
            inference(
                units={"text.tokens": 1000, "image.tokens": 200 * day},
                measured=1.0 + day / 10,
                attributed={"text": 1.0, "image": day / 10},
                version="v1",
                usd={"text": 0.001, "image": day / 10_000},
                usd_per_gpu_hour=3.6,
            ),
        )
        for day in range(5, 9)
    ]
    return write_spans(tmp_path / "s.jsonl", spans)


def _shares(path, **kwargs):
    stats = ReadStats()
    return shares_report(read_spans(path, stats), stats, **kwargs)


def test_plain_table_has_notes_input_and_warnings(path):
    """The plain table shows the rows, the hypothetical note, the input line and warnings."""
    report = _shares(path)
    report.warnings.append("something to know")
    text = render(report, "table")
    assert "2026-01-05" in text and "image share" in text
    assert "USD are hypothetical" in text
    assert "input: 4 spans, 4 modtrace" in text
    assert text.rstrip().endswith("warning: something to know")


def test_rich_table(path):
    """With rich the same figures are drawn as a rich table."""
    text = render(_shares(path), "table", use_rich=True, width=200)
    assert "Modality shares" in text and "2026-01-08" in text


def test_json_turns_nan_into_null():
    """A NaN or an infinity never reaches JSON output."""
    report = Report("shares", ["x"], [{"x": float("nan")}], extra={"totals": [{"y": float("inf")}]})
    data = json.loads(render(report, "json"))
    assert data["rows"] == [{"x": None}] and data["totals"] == [{"y": None}]


def test_csv_header_is_the_columns(path):
    """The CSV header lists the report's columns in order; None is an empty cell."""
    report = _shares(path)
    rows = list(csv.reader(io.StringIO(render(report, "csv"))))
    assert rows[0] == report.columns
    assert len(rows) == 1 + len(report.rows)


def test_unknown_format():
    """An unknown format names the known ones."""
    with pytest.raises(ValueError, match="table, json, csv"):
        render(Report("shares", [], []), "xml")


def _png(target):
    with Image.open(target) as image:
        return image.format, image.width


def test_charts_of_every_report(path, tmp_path):
    """Restate, compare and subsidy draw a PNG too."""
    stats = ReadStats()
    reports = [
        restate_report(
            read_spans(path, stats),
            stats,
            calibration=Calibration.from_weights({"text.tokens": 0.001, "image.tokens": 0.001}),
        ),
        compare_report(
            read_spans(path),
            a=Side.parse("2026-01-05..2026-01-07"),
            b=Side.parse("2026-01-07.."),
        ),
        subsidy_report(read_spans(path), pricing=PricingConfig(usd_per_request=0.002)),
    ]
    for report in reports:
        target = tmp_path / f"{report.kind}.png"
        write_chart(report, target)
        assert _png(target)[0] == "PNG", report.kind


def test_chart_without_matplotlib(path, tmp_path, monkeypatch):
    """Without matplotlib the chart fails with an install hint, not a traceback."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ValueError, match="matplotlib"):
        write_chart(_shares(path), tmp_path / "x.png")


def test_chart_of_nothing(tmp_path):
    """An empty report has no chart."""
    with pytest.raises(ValueError, match="no rows"):
        write_chart(Report("shares", [], []), tmp_path / "x.png")
