"""``modtrace report ...`` driven in-process: formats, charts, exit codes and errors."""

from __future__ import annotations

import csv
import io
import json
import sys

import pytest
from PIL import Image
from report_helpers import inference, span, write_spans

from modtrace.cli import main

REPORTS = ("shares", "drift", "restate", "compare", "subsidy")


def _run(capsys, *argv):
    code = main(["report", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def spans_file(tmp_path):
    """Three text-heavy days, then three image-heavy ones, 30 requests a day."""
    spans = []
    for day in range(5, 11):
        image = 100 if day < 8 else 700
        for i in range(30):
            spans.append(
                span(
                    f"2026-01-{day:02d}T10:{i:02d}:00",
                    inference(
                        units={"text.tokens": 1000 - image, "image.tokens": image},
                        measured=1.0,
                        attributed={"text": 1 - image / 1000, "image": image / 1000},
                        version="v1",
                        usd={"text": 0.0001, "image": image / 1e6},
                        usd_per_gpu_hour=2.0,
                        rate_id="r1",
                        extra={"app.plan": "pro" if i % 2 else "free"},
                    ),
                )
            )
    return write_spans(tmp_path / "spans.otlp.jsonl", spans, per_line=16)


@pytest.mark.parametrize("name", REPORTS)
def test_help(capsys, name):
    """Every report has its own --help."""
    with pytest.raises(SystemExit) as exit_info:
        main(["report", name, "--help"])
    assert exit_info.value.code == 0
    assert "--format" in capsys.readouterr().out


def test_report_alone_prints_help(capsys):
    """``modtrace report`` with no report lists them and exits 2."""
    code, out, _ = _run(capsys)
    assert code == 2 and all(name in out for name in REPORTS)


def test_shares_json(capsys, spans_file):
    """JSON carries the documented sections and the hand totals."""
    code, out, _ = _run(capsys, "shares", str(spans_file), "--format", "json", "--bucket", "all")
    data = json.loads(out)
    assert code == 0
    assert data["report"] == "shares" and data["hypothetical"] is True
    assert set(data) >= {"params", "input", "warnings", "columns", "rows", "totals"}
    (row,) = data["rows"]
    assert row["requests"] == 180
    # 90 requests at 0.1 s of image, 90 at 0.7 s: 72 s of image out of 180 s.
    assert row["gpu_seconds.image"] == pytest.approx(72.0)
    assert row["share.image"] == pytest.approx(0.4)


def test_shares_csv_and_chart(capsys, spans_file, tmp_path):
    """CSV has the columns as header and one row per day; the chart is a real PNG."""
    chart = tmp_path / "shares.png"
    code, out, err = _run(
        capsys,
        "shares",
        str(spans_file),
        "--format",
        "csv",
        "--by",
        "app.plan",
        "--chart",
        str(chart),
    )
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 12 and {r["app.plan"] for r in rows} == {"pro", "free"}
    assert float(rows[0]["share.image"]) == pytest.approx(0.1)
    with Image.open(chart) as image:
        assert image.format == "PNG" and image.width > 400
    assert "chart written" in err


def test_table_output_to_file(capsys, spans_file, tmp_path):
    """The plain table goes to --output with its notes."""
    target = tmp_path / "report.txt"
    code, out, _ = _run(capsys, "shares", str(spans_file), "--bucket", "week", "-o", str(target))
    text = target.read_text()
    assert code == 0 and out == ""
    assert "Modality shares of GPU seconds per week" in text and "hypothetical" in text


def test_drift_fail_on_drift(capsys, spans_file, tmp_path):
    """The launch is flagged: exit 1 with --fail-on-drift, 0 without; a chart is drawn."""
    code, out, _ = _run(capsys, "drift", str(spans_file), "--fail-on-drift")
    assert code == 1
    assert "image.tokens/request: 100 -> 700 (+600%) by 2026-01-08" in out
    code, _, _ = _run(capsys, "drift", str(spans_file), "--chart", str(tmp_path / "d.png"))
    assert code == 0 and (tmp_path / "d.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_restate_with_calibration_file(capsys, spans_file, tmp_path):
    """Restating every request with image.tokens at 0.003 s: the image share rises."""
    calibration = tmp_path / "v2.json"
    calibration.write_text(
        json.dumps({"version": "v2", "weights": {"text.tokens": 0.001, "image.tokens": 0.003}})
    )
    code, out, _ = _run(
        capsys,
        "restate",
        str(spans_file),
        "--calibration",
        str(calibration),
        "--bucket",
        "all",
        "--format",
        "json",
    )
    (row,) = json.loads(out)["rows"]
    assert code == 0
    # Light days predict 0.9 + 0.3 s (image 0.25 of the 1.0 s measured); heavy days predict
    # 0.3 + 2.1 s (image 0.875 of it).
    assert row["restated.gpu_seconds.image"] == pytest.approx(90 * 0.3 / 1.2 + 90 * 2.1 / 2.4)


def test_compare_and_subsidy(capsys, spans_file, tmp_path):
    """Compare by window; subsidy with a pricing file, both as JSON."""
    code, out, _ = _run(
        capsys,
        "compare",
        str(spans_file),
        "--a",
        "2026-01-05..2026-01-08",
        "--b",
        "2026-01-08..",
        "--format",
        "json",
    )
    lines = {r["metric"]: r for r in json.loads(out)["rows"]}
    assert code == 0 and lines["image.tokens/request"]["b"] == pytest.approx(700)
    pricing = tmp_path / "pricing.json"
    pricing.write_text(
        json.dumps({"tier_attribute": "app.plan", "tiers": {"free": 0, "pro": 0.01}})
    )
    code, out, _ = _run(
        capsys, "subsidy", str(spans_file), "--pricing", str(pricing), "--format", "json"
    )
    data = json.loads(out)
    assert code == 0 and {r["tier"] for r in data["rows"]} == {"free", "pro"}
    assert data["transfers"][0]["from"] == "pro/text+image"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["shares"], "give one or more span files"),
        (["shares", "missing.jsonl"], "cannot read missing.jsonl"),
        (["restate", "x.jsonl"], "nothing to restate"),
        (["drift", "x.jsonl", "--since", "yesterday"], "not an ISO date"),
        (["compare", "x.jsonl", "--a", "nope", "--b", "x=1"], "KEY=VALUE"),
    ],
)
def test_errors_are_one_line(capsys, argv, message):
    """Bad input exits 2 with one line on stderr, no traceback."""
    code, _, err = _run(capsys, *argv)
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_plain_progress_without_rich(capsys, spans_file, monkeypatch):
    """Without rich, --progress prints the bytes read on standard error."""
    monkeypatch.setitem(sys.modules, "rich.progress", None)
    code, _, err = _run(capsys, "shares", str(spans_file), "--progress", "--format", "json")
    assert code == 0 and "reading spans: 100% (" in err


def test_rich_progress(capsys, spans_file):
    """With rich, --progress draws a bar and the report is unchanged."""
    code, out, _ = _run(capsys, "shares", str(spans_file), "--progress", "--format", "json")
    assert code == 0 and json.loads(out)["rows"]


def test_warnings_reach_stderr_in_machine_formats(capsys, tmp_path):
    """With --format csv, a broken line's warning is repeated on stderr."""
    path = tmp_path / "broken.jsonl"
    path.write_text("not json\n")
    code, out, err = _run(capsys, "shares", str(path), "--format", "csv")
    assert code == 0
    assert out.startswith("bucket,")
    assert "1 lines are not OTLP JSON" in err
