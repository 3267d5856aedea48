"""Error bars on attributed seconds and shares: delta method, Monte Carlo, and real coverage."""

from __future__ import annotations

import math

import numpy as np
import pytest
from calibrate_helpers import synthetic_records

from modtrace.attribution import attribute
from modtrace.calibrate.fit import fit_probes
from modtrace.calibrate.intervals import attribution_intervals, weight_covariance
from modtrace.calibration import Calibration

UNITS = {"text.tokens": 600, "image.tiles": 8, "audio.seconds": 20}
CAL = Calibration(
    version="v1",
    weights={
        "text.tokens": {"value": 0.0008, "stderr": 0.00004},
        "image.tiles": {"value": 0.012, "stderr": 0.002},
        "audio.seconds": {"value": 0.05, "stderr": 0.004},
    },
)


def numeric_share_sd(units, total, cal, modality):
    """sd of a share by finite differences through attribute() (independent weights)."""
    base = attribute(units, {"total": total}, cal).share[modality]
    var = 0.0
    for unit, weight in cal.weights.items():
        h = weight.value * 1e-6
        bumped = {u: w.value + (h if u == unit else 0.0) for u, w in cal.weights.items()}
        moved = attribute(units, {"total": total}, Calibration.from_weights(bumped)).share[modality]
        var += ((moved - base) / h) ** 2 * weight.stderr**2
    return math.sqrt(var)


class TestDelta:
    def test_matches_finite_differences(self):
        """The analytic gradient agrees with differentiating attribute() numerically."""
        iv = attribution_intervals(UNITS, {"total": 1.70}, CAL)
        assert iv.method == "delta" and iv.confidence == 0.95
        point = attribute(UNITS, {"total": 1.70}, CAL)
        for m in ("text", "image", "audio"):
            sd = numeric_share_sd(UNITS, 1.70, CAL, m)
            low, high = iv.share[m]
            assert (high - low) / 2 == pytest.approx(1.959964 * sd, rel=1e-4)
            assert low < point.share[m] < high
            assert iv.stderr[m] == pytest.approx(1.70 * sd, rel=1e-4)
        assert "independent" in iv.notes[0]

    def test_zero_stderr_is_a_point(self):
        """Weights without errors give zero-width intervals at the point attribution."""
        cal = Calibration.from_weights({u: w.value for u, w in CAL.weights.items()})
        iv = attribution_intervals(UNITS, {"total": 1.70}, cal)
        point = attribute(UNITS, {"total": 1.70}, cal)
        for m, (low, high) in iv.gpu_seconds.items():
            assert low == high == pytest.approx(point.gpu_seconds[m])
        assert any("treated as exact" in n for n in iv.notes)

    def test_unreconciled_seconds(self):
        """Without a measured total, seconds vary as sum(count * weight) does."""
        iv = attribution_intervals(UNITS, None, CAL)
        low, high = iv.gpu_seconds["audio"]
        assert (high - low) / 2 == pytest.approx(1.959964 * 20 * 0.004, rel=1e-6)
        assert iv.stderr["image"] == pytest.approx(8 * 0.002)

    def test_uses_stored_covariance(self):
        """A calibration's covariance (correlated weights) changes the width."""
        names = list(CAL.weights)
        se = {u: w.stderr for u, w in CAL.weights.items()}
        corr = {(a, b): (1.0 if a == b else 0.9) for a in names for b in names}
        cov = {a: {b: corr[a, b] * se[a] * se[b] for b in names} for a in names}
        correlated = CAL.model_copy(update={"covariance": cov})
        stored, notes = weight_covariance(correlated)
        assert stored["text.tokens", "image.tiles"] == pytest.approx(0.9 * 0.00004 * 0.002)
        assert notes == []
        wide = attribution_intervals(UNITS, {"total": 1.7}, CAL).share["audio"]
        narrow = attribution_intervals(UNITS, {"total": 1.7}, correlated).share["audio"]
        # Weights moving together move shares less.
        assert narrow[1] - narrow[0] < wide[1] - wide[0]

    def test_shares_clipped(self):
        """Share bounds stay within [0, 1] and seconds bounds at or above 0."""
        cal = Calibration(
            version="v",
            weights={"text.tokens": {"value": 1e-4, "stderr": 1e-3}, "image.tiles": 0.01},
        )
        iv = attribution_intervals({"text.tokens": 100, "image.tiles": 4}, {"total": 1}, cal)
        for low, high in iv.share.values():
            assert 0.0 <= low <= high <= 1.0
        assert all(low >= 0 for low, _ in iv.gpu_seconds.values())


class TestMonteCarlo:
    def test_agrees_with_delta(self):
        """With small relative errors Monte Carlo and the delta method agree."""
        small = Calibration(
            version="v",
            weights={
                u: {"value": w.value, "stderr": w.value * 0.03} for u, w in CAL.weights.items()
            },
        )
        delta = attribution_intervals(UNITS, {"total": 1.7}, small)
        mc = attribution_intervals(
            UNITS, {"total": 1.7}, small, method="monte_carlo", samples=4000, seed=1
        )
        assert mc.method == "monte_carlo" and mc.samples == 4000 and mc.seed == 1
        for m in ("text", "image", "audio"):
            d_width = delta.share[m][1] - delta.share[m][0]
            mc_width = mc.share[m][1] - mc.share[m][0]
            assert mc_width == pytest.approx(d_width, rel=0.08)

    def test_reproducible(self):
        """A fixed seed gives the same interval."""
        a = attribution_intervals(UNITS, {"total": 1.7}, CAL, method="monte_carlo", samples=300)
        b = attribution_intervals(UNITS, {"total": 1.7}, CAL, method="monte_carlo", samples=300)
        assert a == b

    def test_mixed_uses_monte_carlo(self):
        """A components attribution whose split fell back to weights gets a Monte Carlo interval."""
        timers = {"total": 2.0, "vision_encoder": 0.5, "prefill": 1.2}
        units = {"text.tokens": 600, "image.tiles": 8, "video.frames": 4}
        weights = {u: w.model_dump() for u, w in CAL.weights.items()}
        cal = Calibration(
            version="v", weights={**weights, "video.frames": {"value": 0.02, "stderr": 0.003}}
        )
        assert attribute(units, timers, cal).method == "mixed"
        iv = attribution_intervals(units, timers, cal, samples=300)
        assert iv.method == "monte_carlo"
        assert iv.share["image"][0] < iv.share["image"][1]
        with pytest.raises(ValueError, match="mixed"):
            attribution_intervals(units, timers, cal, method="delta")

    def test_components_are_exact(self):
        """A components attribution does not depend on the weights: zero width."""
        timers = {"total": 2.0, "vision_encoder": 0.5, "audio_encoder": 0.6, "prefill": 0.8}
        units = {"text.tokens": 600, "image.tokens": 300, "audio.tokens": 200, "image.tiles": 8}
        iv = attribution_intervals(units, timers, CAL)
        assert iv.method == "exact"
        assert all(low == high for low, high in iv.share.values())


def test_share_interval_coverage_on_fitted_weights():
    """Fitted weights with their covariance: a mixed request's true share is covered ~95 %."""
    true = {"text.tokens": 0.0008, "image.tiles": 0.012, "audio.tokens": 0.002}
    units = {"text.tokens": 600, "image.tiles": 8, "audio.tokens": 500}
    truth = attribute(units, {"total": 1.7}, Calibration.from_weights(true)).share
    runs = 200
    hits = dict.fromkeys(truth, 0)
    for seed in range(runs):
        records = synthetic_records(true, 0.03, 0.05, np.random.default_rng(seed), repeats=2)
        fit = fit_probes(records, units={"image": "image.tiles", "audio": "audio.tokens"})
        cal = Calibration(
            version=f"run{seed}",
            weights={u: e.model_dump() for u, e in fit.weights.items()},
            covariance=fit.covariance,
        )
        iv = attribution_intervals(units, {"total": 1.7}, cal)
        for m, share in truth.items():
            low, high = iv.share[m]
            hits[m] += low <= share <= high
    for m, k in hits.items():
        # Binomial(200, 0.95): 99.9 % of runs land in [180, 197]; the delta method is
        # first order, so allow the lower end a little slack.
        assert 178 <= k <= 198, f"{m}: {k}/{runs}"
