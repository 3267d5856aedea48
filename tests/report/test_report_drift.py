"""Drift report: a launch that turns traffic image-heavy while tokens per request stay flat."""

from __future__ import annotations

import pytest
from report_helpers import inference, span, write_spans

from modtrace.report import DriftConfig, ReadStats, drift_report, read_spans

DAYS = ["2026-01-05", "2026-01-06", "2026-01-07", "2026-01-08", "2026-01-09", "2026-01-10"]
PER_DAY = 40


def _day(day, n, *, text, image, seconds, version="v1", counter="qwen2.5-vl@1"):
    """``n`` identical requests on ``day``: the per-request figures are the chosen ones."""
    return [
        span(
            f"{day}T{9 + i // 60:02d}:{i % 60:02d}:00",
            inference(
                units={"text.tokens": text, "image.tokens": image, "image.count": 1},
                measured=1.0,
                attributed=seconds,
                version=version,
                counters={"image": counter},
            ),
        )
        for i in range(n)
    ]


def _launch(**after):
    """Three text-heavy days, then three image-heavy ones; tokens per request stay at 1000."""
    spans = []
    for day in DAYS[:3]:
        spans += _day(day, PER_DAY, text=900, image=100, seconds={"text": 0.9, "image": 0.1})
    for day in DAYS[3:]:
        spans += _day(
            day, PER_DAY, text=400, image=600, seconds={"text": 0.4, "image": 0.6}, **after
        )
    return spans


def _report(path, **kwargs):
    stats = ReadStats()
    return drift_report(read_spans(path, stats), stats, **kwargs)


def _rows(report, metric):
    return {r["bucket"]: r for r in report.rows if r["metric"] == metric}


class TestDriftFlag:
    """The shift is flagged where it happens, with its evidence; flat series are not."""

    def test_vision_tokens_flagged_tokens_flat(self, tmp_path):
        """image.tokens/request 100 -> 600 is flagged from the launch on; tokens/request is not."""
        path = write_spans(tmp_path / "s.jsonl", _launch(), per_line=50)
        report = _report(path)
        image = _rows(report, "image.tokens/request")
        assert [image[d]["value"] for d in DAYS] == [100, 100, 100, 600, 600, 600]
        assert [image[d]["flagged"] for d in DAYS] == [False] * 3 + [True] * 3
        assert image["2026-01-08"]["baseline"] == 100
        assert image["2026-01-08"]["relative_change"] == pytest.approx(5.0)
        tokens = _rows(report, "tokens/request")
        assert {tokens[d]["value"] for d in DAYS} == {1000}
        assert not any(r["flagged"] for r in tokens.values())
        assert not any(r["flagged"] for r in _rows(report, "gpu_seconds/request").values())
        assert report.extra["drift_detected"] is True

    def test_shares_flagged_in_points(self, tmp_path):
        """share.image 10% -> 60% moves 50 points: flagged against a 10-point threshold."""
        path = write_spans(tmp_path / "s.jsonl", _launch(), per_line=50)
        share = _rows(_report(path), "share.image")
        assert share["2026-01-05"]["value"] == pytest.approx(0.1)
        assert share["2026-01-08"]["value"] == pytest.approx(0.6)
        assert share["2026-01-08"]["change"] == pytest.approx(0.5)
        assert share["2026-01-08"]["flagged"] and share["2026-01-08"]["calibration_version"] == "v1"

    def test_evidence(self, tmp_path):
        """A flag names its baseline and requests, and says the blended view hides it."""
        path = write_spans(tmp_path / "s.jsonl", _launch(), per_line=50)
        report = _report(path)
        flags = [f for f in report.extra["flags"] if f["metric"] == "image.tokens/request"]
        assert [f["bucket"] for f in flags] == DAYS[3:]
        first = flags[0]
        assert first["baseline_buckets"] == ["2026-01-05"]
        assert first["baseline_requests"] == PER_DAY and first["requests"] == PER_DAY
        assert any("tokens/request moved only +0.0%" in n for n in first["notes"])
        assert any(
            line.startswith("image.tokens/request: 100 -> 600") for line in report.extra["summary"]
        )
        # Four metrics flagged on each of the three days after the launch.
        assert {f["metric"] for f in report.extra["flags"]} == {
            "image.tokens/request",
            "text.tokens/request",
            "share.image",
            "share.text",
        }
        assert len(report.extra["flags"]) == 12

    def test_counter_change_is_named(self, tmp_path):
        """When the image counter's version changed with the shift, the flag says so."""
        path = write_spans(tmp_path / "s.jsonl", _launch(counter="qwen2.5-vl@2"), per_line=50)
        flag = next(
            f for f in _report(path).extra["flags"] if f["metric"] == "image.tokens/request"
        )
        assert any("qwen2.5-vl@2 here but by qwen2.5-vl@1" in n for n in flag["notes"])

    def test_pooled_baseline(self, tmp_path):
        """Three pooled baseline buckets give the same baseline and flag nothing inside it."""
        path = write_spans(tmp_path / "s.jsonl", _launch(), per_line=50)
        report = _report(path, config=DriftConfig(baseline_buckets=3))
        image = _rows(report, "image.tokens/request")
        assert image["2026-01-08"]["baseline"] == 100
        assert image["2026-01-06"]["change"] is None  # inside the baseline
        assert [image[d]["flagged"] for d in DAYS] == [False] * 3 + [True] * 3


class TestDriftNeverMisleads:
    """Thin buckets, flat traffic and calibration versions."""

    def test_thin_bucket_is_never_flagged(self, tmp_path):
        """A day with fewer requests than the minimum is reported, not flagged, and named."""
        spans = _launch() + _day(
            "2026-01-11", 5, text=100, image=5000, seconds={"text": 0.1, "image": 5.0}
        )
        path = write_spans(tmp_path / "s.jsonl", spans, per_line=50)
        report = _report(path)
        thin = _rows(report, "image.tokens/request")["2026-01-11"]
        assert thin["value"] == 5000 and thin["requests"] == 5 and not thin["flagged"]
        assert any("fewer than 30 requests" in w and "2026-01-11" in w for w in report.warnings)

    def test_flat_traffic_has_no_flag(self, tmp_path):
        """Six identical days: nothing is flagged."""
        spans = []
        for day in DAYS:
            spans += _day(day, PER_DAY, text=900, image=100, seconds={"text": 0.9, "image": 0.1})
        report = _report(write_spans(tmp_path / "s.jsonl", spans, per_line=50), bucket="week")
        assert report.extra["drift_detected"] is False and report.extra["flags"] == []

    def test_share_series_stay_within_a_version(self, tmp_path):
        """A new calibration version starts its own share series: no cross-version flag."""
        spans = []
        for day in DAYS[:3]:
            spans += _day(day, PER_DAY, text=900, image=100, seconds={"text": 0.9, "image": 0.1})
        for day in DAYS[3:]:
            spans += _day(
                day, PER_DAY, text=900, image=100, seconds={"text": 0.5, "image": 0.5}, version="v2"
            )
        report = _report(write_spans(tmp_path / "s.jsonl", spans, per_line=50))
        shares = [r for r in report.rows if r["metric"] == "share.image"]
        assert {(r["calibration_version"], round(r["value"], 9)) for r in shares} == {
            ("v1", 0.1),
            ("v2", 0.5),
        }
        assert not any(r["flagged"] for r in shares)
        assert any("2 calibration versions" in w for w in report.warnings)

    def test_all_bucket_is_refused(self, tmp_path):
        """Drift needs time buckets."""
        with pytest.raises(ValueError, match="time buckets"):
            _report(tmp_path / "none.jsonl", bucket="all")


def _audio_days(per_day_with_audio):
    """40 requests a day; ``k`` of them carry a 10 s clip, the rest none."""
    spans = []
    for day, k in zip(DAYS, per_day_with_audio, strict=False):
        for i in range(PER_DAY):
            seconds = 10.0 if i < k else 0.0
            spans.append(
                span(
                    f"{day}T{9 + i // 60:02d}:{i % 60:02d}:00",
                    inference(units={"text.tokens": 500, "audio.seconds": seconds}, measured=1.0),
                )
            )
    return spans


class TestSignificance:
    """A relative move must also exceed z standard errors of the difference of means."""

    def test_rare_requests_do_not_alarm(self, tmp_path):
        """1 clip in 40 requests, then 3 in 40: +200 % but well within noise (z < 3)."""
        path = write_spans(tmp_path / "s.jsonl", _audio_days([1, 1, 1, 3, 3, 3]))
        report = _report(path, config=DriftConfig(baseline_buckets=1))
        audio = _rows(report, "audio.seconds/request")
        assert audio[DAYS[3]]["relative_change"] == pytest.approx(2.0)
        # Per-request sd: baseline sqrt((100 - 40 * 0.25**2) / 39) = 1.5811; day 4: 2.6672.
        # SE of the difference: sqrt(1.5811**2 / 40 + 2.6672**2 / 40) = 0.4903; 0.5 / 0.4903 = 1.02.
        assert not any(r["flagged"] for r in audio.values())

    def test_real_shift_alarms(self, tmp_path):
        """1 clip in 40, then 30 in 40: the move is many standard errors: flagged."""
        path = write_spans(tmp_path / "s.jsonl", _audio_days([1, 1, 1, 30, 30, 30]))
        report = _report(path)
        audio = _rows(report, "audio.seconds/request")
        assert audio[DAYS[3]]["flagged"] is True
        assert report.params["z"] == 3.0

    def test_z_is_configurable(self, tmp_path):
        """With z below the observed 1.02 standard errors the small move is flagged."""
        path = write_spans(tmp_path / "s.jsonl", _audio_days([1, 1, 1, 3, 3, 3]))
        report = _report(path, config=DriftConfig(z=0.9))
        assert _rows(report, "audio.seconds/request")[DAYS[3]]["flagged"] is True
