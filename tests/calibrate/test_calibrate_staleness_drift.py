"""Staleness reasons and the drift tracker."""

from __future__ import annotations

import random
import statistics
import threading
from datetime import datetime, timedelta, timezone

import pytest

from modtrace.calibrate.drift import DriftTracker
from modtrace.calibrate.staleness import DEFAULT_MAX_AGE, is_stale, staleness_reasons
from modtrace.calibration import Calibration

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
CAL = Calibration(
    version="v7",
    created=T0,
    model="Qwen/Qwen2.5-VL-7B-Instruct",
    preprocessor="qwen2.5-vl (image qwen2.5-vl.image@1, video qwen2.5-vl.video@1)",
    weights={"text.tokens": 0.0008},
    counters={"image": "qwen2.5-vl.image@1", "video": "qwen2.5-vl.video@1"},
)
SPAN = {
    "model": "Qwen/Qwen2.5-VL-7B-Instruct",
    "preprocessor": "qwen2.5-vl",
    "counters": {"image": "qwen2.5-vl.image@1", "text": "llm-d.text.bytes4@1"},
}


class TestStaleness:
    def test_fresh(self):
        """Same model and preprocessor, 10 days old: no reason."""
        assert staleness_reasons(CAL, now=T0 + timedelta(days=10), **SPAN) == []
        assert not is_stale(CAL, now=T0 + timedelta(days=10), **SPAN)

    def test_too_old(self):
        """Older than 30 days by default, or than a configured age."""
        assert timedelta(days=30) == DEFAULT_MAX_AGE
        reasons = staleness_reasons(CAL, now=T0 + timedelta(days=31), **SPAN)
        assert reasons == ["calibration v7 is 31 days old (max 30 days): recalibrate"]
        assert staleness_reasons(CAL, now=T0 + timedelta(days=8), max_age=timedelta(days=7))
        assert staleness_reasons(CAL, now=T0 + timedelta(days=30), **SPAN) == []

    def test_other_model(self):
        """Measured on another model than the span's."""
        reasons = staleness_reasons(CAL, now=T0, model="Qwen/Qwen3-VL-8B-Instruct")
        assert reasons == [
            "calibration v7 was measured on model Qwen/Qwen2.5-VL-7B-Instruct, "
            "not Qwen/Qwen3-VL-8B-Instruct"
        ]

    def test_other_preprocessor(self):
        """Another profile, or another counter version of a modality the span carries."""
        reasons = staleness_reasons(CAL, now=T0, preprocessor="qwen3-vl")
        assert reasons == ["calibration v7 was measured with preprocessor qwen2.5-vl, not qwen3-vl"]
        reasons = staleness_reasons(CAL, now=T0, counters={"image": "qwen2.5-vl.image@2"})
        assert reasons == [
            "calibration v7 fitted image units of qwen2.5-vl.image@1, the span's are "
            "qwen2.5-vl.image@2"
        ]

    def test_several_reasons_and_unknowns(self):
        """Every reason is listed; fields unknown to either side are not compared."""
        reasons = staleness_reasons(
            CAL, now=T0 + timedelta(days=90), model="other", preprocessor="gemma-3"
        )
        assert len(reasons) == 3
        bare = Calibration(version="b", created=T0, weights={})
        assert staleness_reasons(bare, now=T0, **SPAN) == []

    def test_naive_and_future_times(self):
        """A naive creation time is UTC; one after the span is flagged."""
        naive = CAL.model_copy(update={"created": datetime(2026, 11, 1, 12, 0)})
        assert staleness_reasons(naive, now=T0 + timedelta(days=1)) == []
        reasons = staleness_reasons(CAL, now=T0 - timedelta(hours=1))
        assert reasons and "created after the span" in reasons[0]
        with pytest.raises(ValueError, match="max_age"):
            staleness_reasons(CAL, max_age=timedelta(0))


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TestDrift:
    def test_no_judgement_before_min_samples(self):
        """Fewer factors than min_samples: no state, no signal."""
        tracker = DriftTracker(min_samples=5, window=10)
        assert [tracker.observe(2.0) for _ in range(4)] == [None] * 4
        assert tracker.status() is None

    def test_signals_once_on_leaving_and_once_on_returning(self):
        """The median leaving the band signals once; coming back signals once."""
        tracker = DriftTracker(window=21, min_samples=21)
        rng = random.Random(0)
        signals = [
            tracker.observe(rng.uniform(0.95, 1.05), calibration_version="v7") for _ in range(50)
        ]
        assert [s for s in signals if s] == []
        assert tracker.status().drifting is False
        signals = [
            tracker.observe(rng.uniform(1.25, 1.35), calibration_version="v7") for _ in range(30)
        ]
        fired = [(i, s) for i, s in enumerate(signals) if s]
        assert len(fired) == 1
        index, signal = fired[0]
        # The median of 21 moves once 11 of them are high.
        assert index == 10
        assert signal.drifting and signal.changed and signal.median > 1.1
        assert signal.calibration_version == "v7" and signal.samples == 21
        assert "above the band [0.9, 1.1]" in signal.message and "recalibrate" in signal.message
        signals = [tracker.observe(1.0, calibration_version="v7") for _ in range(30)]
        back = [s for s in signals if s]
        assert len(back) == 1 and not back[0].drifting
        assert back[0].message.startswith("drift cleared")

    def test_median_is_the_window_median(self):
        """The reported median is the median of the last `window` factors."""
        tracker = DriftTracker(window=15, min_samples=1)
        rng = random.Random(3)
        values = [rng.uniform(0.5, 1.5) for _ in range(100)]
        for v in values:
            tracker.observe(v)
        assert tracker.status().median == statistics.median(values[-15:])

    def test_below_band(self):
        """A median under the band reads 'below'."""
        tracker = DriftTracker(window=5, min_samples=5)
        signal = [tracker.observe(0.5) for _ in range(5)][-1]
        assert signal.drifting and "below" in signal.message

    def test_new_calibration_starts_a_new_window(self):
        """A new calibration version forgets the old factors and the drift state."""
        tracker = DriftTracker(window=5, min_samples=5)
        for _ in range(5):
            tracker.observe(2.0, calibration_version="v1")
        assert tracker.status().drifting
        assert tracker.observe(1.0, calibration_version="v2") is None
        assert tracker.status() is None

    def test_time_window(self):
        """With window_seconds, factors older than the window are dropped."""
        clock = Clock()
        tracker = DriftTracker(window=100, window_seconds=60, min_samples=3, clock=clock)
        for _ in range(5):
            tracker.observe(2.0)
            clock.now += 1
        assert tracker.status().samples == 5
        clock.now += 120
        assert tracker.status() is None
        for _ in range(3):
            tracker.observe(1.0)
        assert tracker.status().median == 1.0

    def test_invalid_input(self):
        """Bad factors and configurations are errors."""
        tracker = DriftTracker()
        for bad in (float("nan"), float("inf"), -1.0):
            with pytest.raises(ValueError, match="factor"):
                tracker.observe(bad)
        with pytest.raises(ValueError, match="band"):
            DriftTracker(band=(1.1, 0.9))
        with pytest.raises(ValueError, match="min_samples"):
            DriftTracker(window=5, min_samples=6)
        with pytest.raises(ValueError, match="window_seconds"):
            DriftTracker(window_seconds=0)

    def test_thread_safe(self):
        """Eight threads observing at once: the window stays consistent."""
        tracker = DriftTracker(window=500, min_samples=10)
        barrier = threading.Barrier(8)

        def work(seed: int) -> None:
            rng = random.Random(seed)
            barrier.wait()
            for _ in range(2000):
                tracker.observe(rng.uniform(0.8, 1.2))
                tracker.status()

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        status = tracker.status()
        assert status.samples == 500
        assert sorted(tracker._sorted) == tracker._sorted
        assert sorted(v for _, v in tracker._times) == tracker._sorted
        assert 0.9 < status.median < 1.1
