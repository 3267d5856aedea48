"""Fitting weights: OLS against NumPy, known weights recovered, intervals at their stated rate."""

from __future__ import annotations

import math

import numpy as np
import pytest
from calibrate_helpers import synthetic_records
from PIL import Image

from modtrace.calibrate._stats import t_cdf, t_quantile, two_sided
from modtrace.calibrate.fit import (
    OVERHEAD,
    FitError,
    candidate_units,
    fit_probes,
    ols,
    residual_plots,
)
from modtrace.calibrate.probes import ProbeRecord
from modtrace.timers import GpuTimers

#: The seed's illustrative weights: image cost per tile, and 0.05 s per audio
#: second as 0.002 s per audio token (25 tokens a second).
TRUE = {"text.tokens": 0.0008, "image.tiles": 0.012, "audio.tokens": 0.002}
OVERHEAD_S = 0.03


def binomial_bounds(n: int, p: float, tail: float = 0.0005) -> tuple[int, int]:
    """The central ``1 - 2 tail`` range of a Binomial(n, p) count, exactly."""
    pmf = [math.comb(n, k) * p**k * (1 - p) ** (n - k) for k in range(n + 1)]
    cdf, low = 0.0, 0
    for k, q in enumerate(pmf):
        cdf += q
        if cdf > tail:
            low = k
            break
    cdf, high = 0.0, n
    for k in range(n, -1, -1):
        cdf += pmf[k]
        if cdf > tail:
            high = k
            break
    return low, high


class TestStudentT:
    def test_table_values(self):
        """Quantiles match a printed Student's t table to 3 decimals."""
        table = {(0.975, 1): 12.706, (0.975, 10): 2.228, (0.975, 30): 2.042, (0.995, 5): 4.032}
        for (q, df), expected in table.items():
            assert round(t_quantile(q, df), 3) == expected
        assert two_sided(0.95) == pytest.approx(1.959964, abs=1e-6)

    def test_against_sampled_t(self):
        """The 0.975 quantile at 7 df leaves 2.5 % of NumPy's t draws above it."""
        draws = np.random.default_rng(1).standard_t(7, size=400_000)
        above = float((draws > t_quantile(0.975, 7)).mean())
        assert above == pytest.approx(0.025, abs=0.0015)

    def test_cdf_symmetry(self):
        """The CDF is symmetric and 0.5 at 0."""
        assert t_cdf(0.0, 4) == pytest.approx(0.5)
        assert t_cdf(1.3, 4) + t_cdf(-1.3, 4) == pytest.approx(1.0)


class TestOls:
    def test_matches_numpy(self):
        """Coefficients, covariance and R^2 match NumPy's lstsq and the textbook formulas."""
        rng = np.random.default_rng(0)
        x = np.column_stack([np.ones(50), rng.uniform(0, 5000, 50), rng.uniform(0, 3e6, 50)])
        y = x @ np.array([0.02, 1e-4, 2e-8]) + rng.normal(0, 0.01, 50)
        fit = ols(x, y, ("overhead", "a", "b"))
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        assert fit.coef == pytest.approx(coef, rel=1e-9)
        resid = y - x @ coef
        s2 = resid @ resid / (50 - 3)
        assert fit.cov == pytest.approx(s2 * np.linalg.inv(x.T @ x), rel=1e-6)
        assert fit.r2 == pytest.approx(1 - (resid @ resid) / ((y - y.mean()) @ (y - y.mean())))
        assert fit.residual_se == pytest.approx(math.sqrt(s2))
        assert fit.df == 47

    def test_too_few_rows(self):
        """n <= p is an error naming the parameters."""
        with pytest.raises(FitError, match="cannot fit 2 parameters"):
            ols(np.ones((2, 2)), np.ones(2), ("overhead", "a"))

    def test_collinear_columns(self):
        """Columns that move together are an error naming them."""
        a = np.arange(1.0, 11.0)
        x = np.column_stack([np.ones(10), a, 2 * a])
        with pytest.raises(FitError, match="cannot separate"):
            ols(x, a, ("overhead", "a", "b"))


class TestFitProbes:
    def test_recovers_noiseless_weights(self):
        """Without noise the fit returns the true weights and overhead exactly."""
        records = synthetic_records(TRUE, OVERHEAD_S, 0.0, np.random.default_rng(0))
        fit = fit_probes(records)
        for unit, w in TRUE.items():
            assert fit.weights[unit].value == pytest.approx(w, rel=1e-9)
        assert fit.overhead.value == pytest.approx(OVERHEAD_S, rel=1e-9)
        assert fit.r2 == pytest.approx(1.0)

    def test_chooses_the_unit_that_explains_the_modality(self):
        """Image cost per tile: tiles win over tokens and pixels; the alternatives are recorded."""
        records = synthetic_records(TRUE, OVERHEAD_S, 0.005, np.random.default_rng(3))
        fit = fit_probes(records)
        image = fit.choices["image"]
        assert image.unit == "image.tiles"
        assert image.rule == "smallest residual standard error"
        scored = {s.unit: s for s in image.scores}
        assert set(scored) == {"image.pixels", "image.tiles", "image.tokens"}
        for other in ("image.pixels", "image.tokens"):
            assert scored[other].residual_se > 2 * scored["image.tiles"].residual_se
            assert scored[other].r2 < scored["image.tiles"].r2
        assert [s.residual_se for s in image.scores] == sorted(s.residual_se for s in image.scores)
        assert set(fit.weights) == {"text.tokens", "image.tiles", "audio.tokens"}

    def test_pixels_chosen_when_cost_follows_pixels(self):
        """When GPU time follows pixels (and noise is small), pixels are chosen."""
        weights = {"text.tokens": 0.0008, "image.pixels": 4e-8, "audio.tokens": 0.002}
        records = synthetic_records(weights, OVERHEAD_S, 0.0002, np.random.default_rng(4))
        fit = fit_probes(records)
        assert fit.choices["image"].unit == "image.pixels"
        assert fit.weights["image.pixels"].value == pytest.approx(4e-8, rel=0.01)

    def test_noise_level_tie_goes_to_tokens(self):
        """Tokens and pixels within 1 % of each other: the tie goes to tokens, and says so."""
        weights = {"text.tokens": 0.0008, "image.pixels": 4e-8, "audio.tokens": 0.002}
        records = synthetic_records(weights, OVERHEAD_S, 0.02, np.random.default_rng(4))
        image = fit_probes(records).choices["image"]
        scored = {s.unit: s.residual_se for s in image.scores}
        assert scored["image.tokens"] <= 1.01 * min(scored.values())
        assert image.unit == "image.tokens"
        if image.scores[0].unit != "image.tokens":
            assert "tokens preferred" in image.rule

    def test_tie_prefers_tokens(self):
        """Proportional candidates tie: tokens are preferred and the rule says so."""
        weights = {"text.tokens": 0.0008, "image.tiles": 0.012, "audio.seconds": 0.05}
        records = synthetic_records(weights, OVERHEAD_S, 0.005, np.random.default_rng(5))
        fit = fit_probes(records)
        audio = fit.choices["audio"]
        assert audio.unit == "audio.tokens"
        # seconds, frames and tokens are proportional: identical scores, tokens taken.
        assert len({round(s.residual_se, 12) for s in audio.scores}) == 1
        assert "tokens preferred" in audio.rule or audio.scores[0].unit == "audio.tokens"
        # 25 tokens per second: the per-token weight is the per-second one / 25.
        assert fit.weights["audio.tokens"].value * 25 == pytest.approx(0.05, rel=0.02)

    def test_forced_unit(self):
        """A forced unit is used and recorded as forced."""
        records = synthetic_records(TRUE, OVERHEAD_S, 0.005, np.random.default_rng(6))
        fit = fit_probes(records, units={"image": "image.pixels"})
        assert fit.choices["image"].unit == "image.pixels"
        assert fit.choices["image"].rule == "forced"
        with pytest.raises(FitError, match="not a image unit"):
            fit_probes(records, units={"image": "audio.seconds"})
        with pytest.raises(FitError, match="does not vary"):
            fit_probes(records, units={"image": "image.count"})
        with pytest.raises(FitError, match="not a media modality"):
            fit_probes(records, units={"text": "text.tokens"})

    def test_candidates_exclude_constant_units(self):
        """image.count is 1 on every image probe: it cannot be a candidate."""
        records = synthetic_records(TRUE, OVERHEAD_S, 0.0, np.random.default_rng(0))
        assert candidate_units(records, "image") == ["image.pixels", "image.tiles", "image.tokens"]

    @pytest.mark.parametrize("confidence", [0.95, 0.80])
    def test_interval_coverage(self, confidence):
        """Over 200 seeded runs the known weights fall in the intervals at the stated rate."""
        runs = 200
        hits = dict.fromkeys([*TRUE, OVERHEAD], 0)
        for seed in range(runs):
            records = synthetic_records(
                TRUE, OVERHEAD_S, 0.05, np.random.default_rng(seed), repeats=2
            )
            fit = fit_probes(records, units={"image": "image.tiles", "audio": "audio.tokens"})
            for name in hits:
                low, high = fit.interval(name, confidence)
                truth = OVERHEAD_S if name == OVERHEAD else TRUE[name]
                hits[name] += low <= truth <= high
        low_k, high_k = binomial_bounds(runs, confidence)
        for name, k in hits.items():
            assert low_k <= k <= high_k, f"{name}: {k}/{runs} inside, expected {confidence:.0%}"

    def test_coverage_with_unit_choice(self):
        """With the unit chosen by the fit (not forced), coverage holds too.

        The noise is small enough for tiles to win every run; at 0.01 s, tokens
        (close to pixels) win about 1 run in 100 by chance.
        """
        runs, hits = 200, 0
        for seed in range(runs):
            records = synthetic_records(
                TRUE, OVERHEAD_S, 0.005, np.random.default_rng(1000 + seed), repeats=2
            )
            fit = fit_probes(records)
            assert fit.choices["image"].unit == "image.tiles"
            low, high = fit.interval("image.tiles")
            hits += low <= TRUE["image.tiles"] <= high
        low_k, high_k = binomial_bounds(runs, 0.95)
        assert low_k <= hits <= high_k

    def test_residuals_and_quality(self):
        """One residual per fitted probe; measured = fitted + residual; R^2 in (0, 1]."""
        records = synthetic_records(TRUE, OVERHEAD_S, 0.01, np.random.default_rng(8))
        fit = fit_probes(records)
        assert len(fit.residuals) == fit.n == len(records)
        for row in fit.residuals:
            assert row.measured == pytest.approx(row.fitted + row.residual)
        assert 0.9 < fit.r2 <= 1.0 and fit.adj_r2 <= fit.r2
        assert fit.df == fit.n - 4
        names = [OVERHEAD, *fit.weights]
        assert set(fit.covariance) == set(names)
        for name in names:
            se = fit.overhead.stderr if name == OVERHEAD else fit.weights[name].stderr
            assert fit.covariance[name][name] == pytest.approx(se**2)


def _failed(record_id: str, modality: str = "image") -> ProbeRecord:
    return ProbeRecord(
        id=record_id,
        kind="probe",
        modality=modality,
        size="x",
        status="failed",
        error="engine: TimeoutError: no answer in 30 s",
    )


class TestFitRefusesBadInput:
    def test_failed_probe_is_an_error(self):
        """A failed probe stops the fit, naming it and its reason."""
        records = synthetic_records(TRUE, OVERHEAD_S, 0.0, np.random.default_rng(0))
        records.append(_failed("image/9999x9999/r0"))
        with pytest.raises(FitError, match=r"1 probe\(s\) failed: image/9999x9999/r0: engine"):
            fit_probes(records)

    def test_allow_failed_lists_them(self):
        """With allow_failed the failures are left out and listed, not dropped silently."""
        records = synthetic_records(TRUE, OVERHEAD_S, 0.0, np.random.default_rng(0))
        records.append(_failed("image/9999x9999/r0"))
        fit = fit_probes(records, allow_failed=True)
        assert fit.excluded["failed"] == ["image/9999x9999/r0"]
        assert fit.n == len(records) - 1

    def test_retried_probe_supersedes_failure(self):
        """A later ok record of the same id replaces the failure, which is reported superseded."""
        records = synthetic_records(TRUE, OVERHEAD_S, 0.0, np.random.default_rng(0))
        first = records[0]
        records.insert(0, _failed(first.id, first.modality))
        fit = fit_probes(records)
        assert fit.excluded["superseded"] == [first.id]
        assert "failed" not in fit.excluded

    def test_warmup_and_holdout_not_fitted(self):
        """Warm-ups and held-out requests are listed as excluded, not fitted."""
        records = synthetic_records(TRUE, OVERHEAD_S, 0.0, np.random.default_rng(0))
        extra = [
            r.model_copy(
                update={"id": f"warmup/{r.id}", "kind": "warmup", "timers": GpuTimers(total=99.0)}
            )
            for r in records[:2]
        ]
        held = records[-1].model_copy(update={"id": "holdout/x/r0", "kind": "holdout"})
        fit = fit_probes([*extra, *records, held])
        assert fit.excluded["warmup"] == [e.id for e in extra]
        assert fit.excluded["holdout"] == ["holdout/x/r0"]
        assert fit.weights["text.tokens"].value == pytest.approx(TRUE["text.tokens"])

    def test_no_text_probe(self):
        """Without a successful text probe the text weight cannot be fitted."""
        records = [
            r
            for r in synthetic_records(TRUE, OVERHEAD_S, 0.0, np.random.default_rng(0))
            if r.modality != "text"
        ]
        with pytest.raises(FitError, match="no text probe"):
            fit_probes(records)

    def test_single_size_cannot_be_fitted(self):
        """One image size only: no image unit varies, which is a clear error."""
        records = synthetic_records(
            TRUE, OVERHEAD_S, 0.01, np.random.default_rng(0), images=[(448, 448)]
        )
        with pytest.raises(FitError, match="no image unit varies"):
            fit_probes(records)


class TestResidualPlots:
    def test_writes_pngs(self, tmp_path):
        """Residual plots are real PNG files, one overall and one per modality."""
        pytest.importorskip("matplotlib")
        records = synthetic_records(TRUE, OVERHEAD_S, 0.01, np.random.default_rng(9))
        paths = residual_plots(fit_probes(records), tmp_path)
        assert [p.name for p in paths] == [
            "residuals.png",
            "residuals-text.png",
            "residuals-image.png",
            "residuals-audio.png",
        ]
        for p in paths:
            with Image.open(p) as img:
                assert img.format == "PNG" and img.size[0] > 300
