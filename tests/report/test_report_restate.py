"""Restatement with a second calibration version and a new rate, beside the recorded figures."""

from __future__ import annotations

import pytest
from report_helpers import inference, span, write_spans

from modtrace.calibration import Calibration
from modtrace.cost import Rate
from modtrace.report import ReadStats, read_spans, restate_report, restate_span

V2 = Calibration.from_weights({"text.tokens": 0.001, "image.tiles": 0.03}, version="v2")

# Recorded under v1 (text.tokens 0.001, image.tiles 0.01 GPU s per unit) at 3.6 USD an hour
# (0.001 USD a second):
#   request 1: 1000 tokens, 100 tiles, measured 3.0 s. v1 predicts 1.0 + 1.0 = 2.0, factor
#              1.5: text 1.5, image 1.5. v2 predicts 1.0 + 3.0 = 4.0, factor 0.75: text 0.75,
#              image 2.25.
#   request 2: 2000 tokens, measured 1.0 s: text 1.0 under both.
REQUEST_1 = inference(
    units={"text.tokens": 1000, "image.tiles": 100},
    measured=3.0,
    attributed={"text": 1.5, "image": 1.5},
    version="v1",
    usd={"text": 0.0015, "image": 0.0015},
    usd_per_gpu_hour=3.6,
    rate_id="r1",
)
REQUEST_2 = inference(
    units={"text.tokens": 2000},
    measured=1.0,
    attributed={"text": 1.0},
    version="v1",
    usd={"text": 0.001},
    usd_per_gpu_hour=3.6,
    rate_id="r1",
)


@pytest.fixture
def recorded(tmp_path):
    spans = [span("2026-01-05T10:00:00", REQUEST_1), span("2026-01-06T10:00:00", REQUEST_2)]
    return write_spans(tmp_path / "s.jsonl", spans)


def _report(path, **kwargs):
    stats = ReadStats()
    return restate_report(read_spans(path, stats), stats, **kwargs)


class TestRestateKnownAnswers:
    """Restated figures match the hand computation; recorded ones are kept beside them."""

    def test_second_calibration_version(self, recorded):
        """Under v2 the image takes 2.25 of request 1's 3.0 s; dollars at the recorded rate."""
        report = _report(recorded, calibration=V2, bucket="all")
        (row,) = report.rows
        assert row["recorded_calibration"] == "v1" and row["restated_calibration"] == "v2"
        assert row["requests"] == 2
        assert row["recorded.gpu_seconds.text"] == pytest.approx(2.5)
        assert row["recorded.gpu_seconds.image"] == pytest.approx(1.5)
        assert row["restated.gpu_seconds.text"] == pytest.approx(1.75)
        assert row["restated.gpu_seconds.image"] == pytest.approx(2.25)
        assert row["recorded.share.image"] == pytest.approx(1.5 / 4.0)
        assert row["restated.share.image"] == pytest.approx(2.25 / 4.0)
        # The measured total is unchanged, so at the same rate so are the total dollars.
        assert row["recorded.usd"] == pytest.approx(0.004)
        assert row["restated.usd"] == pytest.approx(0.004)
        assert row["delta.usd"] == pytest.approx(0.0, abs=1e-15)
        assert row["restated.usd.image"] == pytest.approx(0.00225)
        assert report.params["calibration_version"] == "v2"

    def test_second_version_and_new_rate(self, recorded):
        """At 7.2 USD an hour (0.002 a second) the 4.0 restated seconds cost 0.008."""
        report = _report(
            recorded, calibration=V2, rate=Rate(usd_per_gpu_hour=7.2, id="new"), bucket="day"
        )
        monday, tuesday = report.rows
        assert monday["restated.usd.image"] == pytest.approx(2.25 * 0.002)
        assert monday["restated.usd"] == pytest.approx(3.0 * 0.002)
        assert tuesday["restated.usd"] == pytest.approx(0.002)
        (total,) = report.extra["totals"]
        assert total["restated.usd"] == pytest.approx(0.008)
        assert total["delta.usd"] == pytest.approx(0.004)

    def test_reprice_only(self, recorded):
        """Without a calibration the recorded seconds stay and only the rate changes."""
        report = _report(recorded, rate=Rate(usd_per_gpu_hour=7.2), bucket="all")
        (row,) = report.rows
        assert row["restated.gpu_seconds.image"] == pytest.approx(1.5)
        assert row["restated.usd"] == pytest.approx(4.0 * 0.002)
        assert row["restated_calibration"] is None

    def test_component_timers_need_no_weights(self, tmp_path):
        """vision_encoder 0.5 goes to image; the 0.5 s of prefill+decode split 100:300 tokens."""
        attrs = inference(
            units={"text.tokens": 100, "image.tokens": 300},
            measured=1.0,
            components={"vision_encoder": 0.5, "prefill": 0.3, "decode": 0.2},
        )
        (record,) = read_spans(write_spans(tmp_path / "s.jsonl", [span("2026-01-05", attrs)]))
        result = restate_span(record, V2, Rate(usd_per_gpu_hour=3.6))
        assert result.recorded_seconds is None
        assert result.restated.method == "components"
        assert result.restated.gpu_seconds["image"] == pytest.approx(0.5 + 0.375)
        assert result.restated.gpu_seconds["text"] == pytest.approx(0.125)
        assert result.restated_usd["image"] == pytest.approx(0.000875)


class TestRestateNeverMixes:
    """Recorded versions stay apart; what cannot be restated or priced is counted."""

    def test_recorded_versions_stay_apart(self, tmp_path):
        """A span recorded under v0 gets its own row; restated, all rows use v2."""
        old = inference(
            units={"text.tokens": 1000}, measured=2.0, attributed={"text": 2.0}, version="v0"
        )
        spans = [span("2026-01-05T10:00:00", REQUEST_1), span("2026-01-05T11:00:00", old)]
        report = _report(
            write_spans(tmp_path / "s.jsonl", spans),
            calibration=V2,
            rate=Rate(usd_per_gpu_hour=3.6),
        )
        assert [(r["recorded_calibration"], r["requests"]) for r in report.rows] == [
            ("v0", 1),
            ("v1", 1),
        ]
        assert report.rows[0]["restated.gpu_seconds.text"] == pytest.approx(2.0)
        assert any("2 calibration versions" in w and "all use v2" in w for w in report.warnings)

    def test_outliers_and_unpriced_are_reported(self, tmp_path):
        """A factor outside the band is counted; a span with no rate gets no restated dollars."""
        heavy = Calibration.from_weights({"text.tokens": 0.01}, version="heavy")
        attrs = inference(units={"text.tokens": 1000}, measured=1.0)  # predicted 10 s: factor 0.1
        report = _report(
            write_spans(tmp_path / "s.jsonl", [span("2026-01-05", attrs)]),
            calibration=heavy,
            bucket="all",
        )
        (row,) = report.rows
        assert row["restated_outliers"] == 1
        assert row["restated.usd"] is None and row["recorded.usd"] is None
        assert any("outside the outlier band" in w for w in report.warnings)
        assert any("no restated dollars" in w for w in report.warnings)
        assert report.input["restated_methods"] == {"weights": 1}

    def test_nothing_to_restate_is_an_error(self, recorded):
        """Neither a calibration nor a rate: a clear error."""
        with pytest.raises(ValueError, match="nothing to restate"):
            _report(recorded)
