"""Compare report: an image resolution cap moves the image line and leaves text alone."""

from __future__ import annotations

import pytest
from report_helpers import inference, span, write_spans

from modtrace.calibration import Calibration
from modtrace.report import ReadStats, Side, compare_report, read_spans

CAP = "app.image_cap"
# Before the cap (10 requests): 500 text tokens, 1000 image tokens; text 0.5 s, image 2.0 s.
# After the cap (20 requests): 500 text tokens, 400 image tokens; text 0.5 s, image 0.8 s.
# The weights text.tokens 0.001 and image.tokens 0.002 predict exactly these seconds.
WEIGHTS = Calibration.from_weights({"text.tokens": 0.001, "image.tokens": 0.002}, version="v9")


def _requests(day, n, image_tokens, image_seconds, *, cap, version="v1"):
    return [
        span(
            f"{day}T10:{i:02d}:00",
            inference(
                units={"text.tokens": 500, "image.tokens": image_tokens},
                measured=0.5 + image_seconds,
                attributed={"text": 0.5, "image": image_seconds},
                version=version,
                usd={"text": 0.0005, "image": image_seconds / 1000},
                extra={CAP: cap},
            ),
        )
        for i in range(n)
    ]


@pytest.fixture
def capped(tmp_path):
    spans = _requests("2026-01-06", 10, 1000, 2.0, cap="off") + _requests(
        "2026-01-09", 20, 400, 0.8, cap="on"
    )
    return write_spans(tmp_path / "s.jsonl", spans, per_line=7)


def _lines(path, a, b, **kwargs):
    stats = ReadStats()
    report = compare_report(
        read_spans(path, stats), stats, a=Side.parse(a), b=Side.parse(b), **kwargs
    )
    return report, {r["metric"]: r for r in report.rows}


class TestCompareKnownAnswers:
    """Per-request lines of each side match the chosen numbers."""

    def test_two_windows(self, capped):
        """The image line halves and more; the text line does not move."""
        report, lines = _lines(capped, "2026-01-05..2026-01-08", "2026-01-08..")
        assert lines["requests"]["a"] == 10 and lines["requests"]["b"] == 20
        image = lines["gpu_seconds.image/request"]
        assert image["a"] == pytest.approx(2.0) and image["b"] == pytest.approx(0.8)
        assert image["change"] == pytest.approx(-1.2)
        assert image["relative_change"] == pytest.approx(-0.6)
        assert image["modality"] == "image"
        text = lines["gpu_seconds.text/request"]
        assert text["change"] == pytest.approx(0.0, abs=1e-12)
        assert lines["image.tokens/request"]["b"] == pytest.approx(400)
        assert lines["text.tokens/request"]["relative_change"] == pytest.approx(0.0, abs=1e-12)
        assert lines["gpu_seconds/request"]["b"] == pytest.approx(1.3)
        assert lines["share.image"]["a"] == pytest.approx(0.8)
        assert lines["share.image"]["b"] == pytest.approx(0.8 / 1.3)
        assert lines["usd.image/request"]["b"] == pytest.approx(0.0008)
        assert report.warnings == []

    def test_two_attribute_values(self, capped):
        """``KEY=VALUE`` sides select the same requests as the windows here."""
        _, lines = _lines(capped, f"{CAP}=off", f"{CAP}=on")
        assert lines["gpu_seconds.image/request"]["a"] == pytest.approx(2.0)
        assert lines["gpu_seconds.image/request"]["b"] == pytest.approx(0.8)

    def test_modalities_absent_on_both_sides_have_no_line(self, capped):
        """No audio in either side: no audio line."""
        _, lines = _lines(capped, f"{CAP}=off", f"{CAP}=on")
        assert not any("audio" in m for m in lines)


class TestCompareVersions:
    """Sides attributed with different weights are flagged, or restated onto one version."""

    def test_mismatched_versions_warn(self, tmp_path):
        """v1 before and v2 after: a warning says the lines mix weights and traffic."""
        spans = _requests("2026-01-06", 10, 1000, 2.0, cap="off") + _requests(
            "2026-01-09", 20, 400, 0.8, cap="on", version="v2"
        )
        path = write_spans(tmp_path / "s.jsonl", spans)
        report, _ = _lines(path, f"{CAP}=off", f"{CAP}=on")
        assert any("2 calibration versions" in w for w in report.warnings)
        assert report.params["a_calibration_versions"] == {"v1": 10}

    def test_restating_puts_both_sides_on_one_version(self, tmp_path):
        """With --calibration both sides are restated: the same lines, no warning."""
        spans = _requests("2026-01-06", 10, 1000, 2.0, cap="off") + _requests(
            "2026-01-09", 20, 400, 0.8, cap="on", version="v2"
        )
        path = write_spans(tmp_path / "s.jsonl", spans)
        report, lines = _lines(path, f"{CAP}=off", f"{CAP}=on", calibration=WEIGHTS)
        assert lines["gpu_seconds.image/request"]["a"] == pytest.approx(2.0)
        assert lines["gpu_seconds.image/request"]["b"] == pytest.approx(0.8)
        assert not any("calibration versions" in w for w in report.warnings)
        assert report.params["b_calibration_versions"] == {"v9": 20}


class TestSideSpec:
    """Side specifications parse or fail clearly."""

    def test_window_and_match(self):
        """Terms combine; open-ended windows are allowed."""
        side = Side.parse("app.cap=on, 2026-01-08..")
        assert side.match == (("app.cap", "on"),)
        assert side.window.since_ns is not None and side.window.until_ns is None

    @pytest.mark.parametrize("spec", ["", "nonsense", "2026-13-01..", "2026-01-09..2026-01-01"])
    def test_bad_specs(self, spec):
        """An empty spec, a bare word, a bad date and an empty window raise ValueError."""
        with pytest.raises(ValueError, match=r"\S"):
            Side.parse(spec)
