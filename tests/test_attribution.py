"""The allocation key: golden examples from the seed, properties and edge cases."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from seed_helpers import SEED, SEED_COUNTS

from modtrace import (
    AttributionConfig,
    Calibration,
    GpuTimers,
    Rate,
    UnitCounts,
    attribute,
    price,
)


class TestSeedExamples:
    def test_mixed_request_worked_example(self):
        """600 tokens, 8 tiles, 20 s audio measured at 1.70 s: factor 1.079, 0.52/0.10/1.08 s."""
        a = attribute(SEED_COUNTS, GpuTimers(total=1.70), SEED)
        assert a.method == "weights"
        assert a.predicted_gpu_seconds == pytest.approx(1.576)
        assert round(a.factor, 3) == 1.079
        assert round(a.gpu_seconds["text"], 2) == 0.52
        assert round(a.gpu_seconds["image"], 2) == 0.10
        assert round(a.gpu_seconds["audio"], 2) == 1.08
        assert a.estimates == pytest.approx({"text": 0.48, "image": 0.096, "audio": 1.0})

    def test_worked_example_cost(self):
        """1.70 GPU s at a hypothetical 2.00 USD/h is about 0.00094 USD, audio about 64 %."""
        a = attribute(SEED_COUNTS, GpuTimers(total=1.70), SEED)
        cost = price(a.gpu_seconds, Rate(usd_per_gpu_hour=2.00, id="plan-2026"))
        assert round(cost.usd_total, 5) == 0.00094
        assert cost.hypothetical is True
        assert cost.rate_id == "plan-2026"
        # The seed rounds 1.08 / 1.70 = 63.5 % to "about 64 percent".
        assert cost.usd["audio"] / cost.usd_total == pytest.approx(0.64, abs=0.006)
        assert a.share["audio"] == pytest.approx(1.0 / 1.576, rel=1e-12)

    def test_predicted_140_measured_154(self):
        """A weighted sum of 1.40 against a measured 1.54 gives factor 1.10."""
        cal = Calibration.from_weights({"text.tokens": 0.001, "image.tiles": 0.01})
        a = attribute({"text.tokens": 1000, "image.tiles": 40}, {"total": 1.54}, cal)
        assert a.predicted_gpu_seconds == pytest.approx(1.40)
        assert a.factor == pytest.approx(1.10)
        assert a.gpu_seconds["text"] == pytest.approx(1.10)
        assert a.gpu_seconds["image"] == pytest.approx(0.44)


class TestComponents:
    def test_encoders_go_to_their_modalities(self):
        """Vision encoder seconds go to image, audio encoder to audio, LM by token share."""
        units = {"text.tokens": 600, "image.tokens": 300, "audio.tokens": 100}
        t = GpuTimers(total=2.0, vision_encoder=0.3, audio_encoder=0.2, prefill=1.0, decode=0.5)
        a = attribute(units, t)
        assert a.method == "components"
        assert a.factor == pytest.approx(1.0)
        assert a.gpu_seconds["image"] == pytest.approx(0.3 + 1.5 * 0.3)
        assert a.gpu_seconds["audio"] == pytest.approx(0.2 + 1.5 * 0.1)
        assert a.gpu_seconds["text"] == pytest.approx(1.5 * 0.6)

    def test_vision_split_between_image_and_video_by_tokens(self):
        """The vision encoder is shared between image and video by their tokens."""
        units = {"text.tokens": 100, "image.tokens": 100, "video.tokens": 300}
        a = attribute(units, GpuTimers(total=1.4, vision_encoder=0.4, prefill=1.0))
        assert a.gpu_seconds["video"] == pytest.approx(0.3 + 0.6)
        assert a.gpu_seconds["image"] == pytest.approx(0.1 + 0.2)

    def test_lm_part_is_total_minus_encoders_without_prefill_decode(self):
        """Without prefill/decode timers the LM part is the total minus the encoders."""
        a = attribute(
            {"text.tokens": 50, "image.tokens": 50}, GpuTimers(total=1.0, vision_encoder=0.2)
        )
        assert a.components["language_model"] == pytest.approx(0.8)
        assert a.gpu_seconds["image"] == pytest.approx(0.2 + 0.4)
        assert sum(a.gpu_seconds.values()) == pytest.approx(1.0, rel=1e-12)

    def test_missing_token_count_falls_back_to_weights(self):
        """Audio with seconds but no tokens: the LM split uses weighted estimates (mixed)."""
        units = {"text.tokens": 600, "audio.seconds": 20}
        a = attribute(units, GpuTimers(total=1.0, prefill=0.8), SEED)
        assert a.method == "mixed"
        assert a.gpu_seconds["audio"] / a.gpu_seconds["text"] == pytest.approx(1.0 / 0.48)

    def test_components_larger_than_total_scale_down(self):
        """Component timers summing above the total are scaled down and flagged."""
        a = attribute(
            {"text.tokens": 10, "image.tokens": 10},
            GpuTimers(total=1.0, vision_encoder=2.0, prefill=1.0, decode=0.5),
        )
        assert a.factor == pytest.approx(1.0 / 3.5)
        assert a.outlier is True
        assert math.fsum(a.gpu_seconds.values()) == pytest.approx(1.0, rel=1e-12)

    def test_vision_encoder_without_vision_items_is_unknown(self):
        """Encoder seconds with no image or video in the request go to unknown."""
        a = attribute({"text.tokens": 10}, GpuTimers(total=1.0, vision_encoder=0.25, prefill=0.75))
        assert a.gpu_seconds["unknown"] == pytest.approx(0.25)
        assert a.gpu_seconds["text"] == pytest.approx(0.75)


class TestEdgeCases:
    def test_missing_total_is_unreconciled(self):
        """No measured total: estimates as they are, factor 1, flagged."""
        a = attribute(SEED_COUNTS, None, SEED)
        assert a.method == "unreconciled"
        assert a.reconciled is False
        assert a.factor == 1.0
        assert a.measured_gpu_seconds is None
        assert a.gpu_seconds == pytest.approx({"text": 0.48, "image": 0.096, "audio": 1.0})

    def test_zero_estimates_go_to_unknown(self):
        """When nothing can carry the total it all goes to unknown, never lost."""
        a = attribute({"text.tokens": 100}, GpuTimers(total=0.9), Calibration.from_weights({}))
        assert a.gpu_seconds == {"unknown": 0.9}
        assert a.share == {"unknown": 1.0}
        assert a.outlier is True

    def test_empty_request_with_total(self):
        """A request with no units at all: the measured seconds are unknown."""
        a = attribute({}, GpuTimers(total=0.5))
        assert a.gpu_seconds == {"unknown": 0.5}

    def test_modality_with_units_but_no_weight(self):
        """A modality without weight gets nothing and is reported; others carry the total."""
        cal = Calibration.from_weights({"text.tokens": 0.001})
        a = attribute({"text.tokens": 100, "video.frames": 30}, GpuTimers(total=0.2), cal)
        assert a.unweighted_units == ["video.frames"]
        assert a.gpu_seconds == pytest.approx({"text": 0.2})
        assert "no weight for video.frames" in a.notes

    def test_outlier_band_is_configurable(self):
        """Factor 1.079 is inside the default band and outside a tight one."""
        assert not attribute(SEED_COUNTS, {"total": 1.7}, SEED).outlier
        tight = AttributionConfig(outlier_band=(0.95, 1.05))
        assert attribute(SEED_COUNTS, {"total": 1.7}, SEED, config=tight).outlier

    def test_zero_total(self):
        """A measured total of zero attributes zero everywhere and flags the factor."""
        a = attribute(SEED_COUNTS, {"total": 0.0}, SEED)
        assert sum(a.gpu_seconds.values()) == 0.0
        assert a.outlier is True

    @pytest.mark.parametrize(
        ("units", "timers", "field"),
        [
            ({"text.tokens": -1}, {"total": 1.0}, "text.tokens"),
            ({"text.tokens": float("nan")}, {"total": 1.0}, "text.tokens"),
            ({"image.tiles": float("inf")}, {"total": 1.0}, "image.tiles"),
            ({"text.tokens": 1}, {"total": -0.1}, "timers.total"),
            ({"text.tokens": 1}, {"total": float("nan")}, "timers.total"),
            ({"text.tokens": 1}, {"total": 1.0, "prefill": float("inf")}, "timers.prefill"),
            ({"text.token": 1}, {"total": 1.0}, "text.token"),
            ({"text.tokens": "many"}, {"total": 1.0}, "text.tokens"),
        ],
    )
    def test_bad_numbers_name_the_field(self, units, timers, field):
        """Negative, NaN, infinite or non-numeric inputs raise an error naming the field."""
        with pytest.raises(ValueError, match=field.replace(".", r"\.")):
            attribute(units, timers, SEED)

    @pytest.mark.parametrize("weight", [-0.1, float("nan"), float("inf")])
    def test_bad_weight_names_the_unit(self, weight):
        """A bad weight is rejected with the unit's name."""
        with pytest.raises(ValueError, match=r"weights\.text\.tokens"):
            Calibration.from_weights({"text.tokens": weight})

    def test_bad_rate(self):
        """A negative rate is rejected."""
        with pytest.raises(ValueError, match="usd_per_gpu_hour"):
            Rate(usd_per_gpu_hour=-2)


# --- Properties --------------------------------------------------------------
# Counts are 0 or at least a thousandth: subnormal counts only test float division.
counts = st.one_of(st.just(0.0), st.floats(min_value=1e-3, max_value=1e6))
weights = st.floats(min_value=1e-9, max_value=10, allow_nan=False, allow_infinity=False)
totals = st.floats(min_value=1e-6, max_value=1e5, allow_nan=False, allow_infinity=False)
unit_names = st.sampled_from(
    [
        "text.tokens",
        "image.tiles",
        "image.tokens",
        "audio.seconds",
        "audio.tokens",
        "video.frames",
        "video.tokens",
    ]
)
unit_maps = st.dictionaries(unit_names, counts, min_size=1)
weight_maps = st.dictionaries(unit_names, weights)
component_timers = st.fixed_dictionaries(
    {},
    optional={
        "vision_encoder": st.floats(0, 100),
        "audio_encoder": st.floats(0, 100),
        "prefill": st.floats(0, 100),
        "decode": st.floats(0, 100),
    },
)


@given(unit_maps, weight_maps, totals, component_timers)
def test_conservation(units, w, total, comps):
    """Attributed seconds add up to the measured total, whatever the inputs."""
    a = attribute(units, GpuTimers(total=total, **comps), Calibration.from_weights(w))
    assert math.fsum(a.gpu_seconds.values()) == pytest.approx(total, rel=1e-9)


@given(unit_maps, weight_maps, totals, component_timers)
def test_non_negative(units, w, total, comps):
    """No modality is ever attributed negative seconds or shares."""
    a = attribute(units, GpuTimers(total=total, **comps), Calibration.from_weights(w))
    assert all(s >= 0 for s in a.gpu_seconds.values())
    assert all(0 <= s <= 1 + 1e-12 for s in a.share.values())


# Two or more modalities, every unit weighted and counted: nothing to filter out.
mixed_units = st.dictionaries(
    unit_names, st.floats(min_value=1e-3, max_value=1e6), min_size=2
).filter(lambda u: len({name.split(".")[0] for name in u}) >= 2)


@given(mixed_units, st.data(), totals)
def test_weights_preserve_proportions(units, data, total):
    """Under the weights method the attribution keeps the estimates' proportions."""
    w = {unit: data.draw(weights) for unit in units}
    a = attribute(units, GpuTimers(total=total), Calibration.from_weights(w))
    est = {m: e for m, e in a.estimates.items() if e > 0}
    assert len(est) >= 2
    first, *rest = est
    for m in rest:
        assert a.gpu_seconds[m] / a.gpu_seconds[first] == pytest.approx(
            est[m] / est[first], rel=1e-9
        )


@given(unit_maps, weight_maps, totals, st.floats(min_value=1e-3, max_value=1e3))
def test_scale_invariance(units, w, total, c):
    """Scaling every weight changes nothing; scaling the total scales every modality."""
    cal = Calibration.from_weights(w)
    base = attribute(units, GpuTimers(total=total), cal)
    rescaled = attribute(
        units, GpuTimers(total=total), Calibration.from_weights({u: x * c for u, x in w.items()})
    )
    assert rescaled.gpu_seconds == pytest.approx(base.gpu_seconds, rel=1e-9, abs=1e-12)
    bigger = attribute(units, GpuTimers(total=total * c), cal)
    assert bigger.gpu_seconds == pytest.approx(
        {m: s * c for m, s in base.gpu_seconds.items()}, rel=1e-9, abs=1e-12
    )


def test_unit_counts_reject_non_mapping():
    """UnitCounts needs a mapping."""
    with pytest.raises(ValueError, match="mapping"):
        UnitCounts([1, 2])  # type: ignore[arg-type]
