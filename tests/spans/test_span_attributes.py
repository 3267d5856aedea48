"""Counts, timers and results <-> span attributes (modtrace.spans.attributes)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st
from seed_helpers import SEED_WEIGHTS

from modtrace import Calibration, GpuTimers, Rate, UnitCounts, attribute, price, semconv
from modtrace.counting.result import RequestCount
from modtrace.spans.attributes import (
    attributed_from_attributes,
    attribution_attributes,
    cost_attributes,
    cost_from_attributes,
    count_attributes,
    genai_request_attributes,
    genai_usage_attributes,
    is_inference_span,
    short_error,
    timer_attributes,
    timers_from_attributes,
    units_from_attributes,
)
from modtrace.timers import COMPONENTS
from modtrace.units import UNIT_NAMES


class TestCountAttributes:
    def test_every_unit_has_its_key(self):
        """Each unit name becomes modtrace.units.<modality>.<unit> with its count."""
        counts = {u: float(i + 1) for i, u in enumerate(UNIT_NAMES)}
        attrs = count_attributes(counts)
        assert attrs == {f"modtrace.units.{u}": counts[u] for u in UNIT_NAMES}

    def test_types_are_fixed_per_unit(self):
        """Whole counts are ints, seconds stay floats, a fractional count is kept as is."""
        attrs = count_attributes({"text.tokens": 600, "audio.seconds": 20, "image.tiles": 2.5})
        assert type(attrs["modtrace.units.text.tokens"]) is int
        assert type(attrs["modtrace.units.audio.seconds"]) is float
        assert attrs["modtrace.units.image.tiles"] == 2.5

    def test_request_count_adds_profile_counters_defaulted_errors(self):
        """A RequestCount adds profile, counter id@version, defaulted flags and errors."""
        count = RequestCount(
            profile="qwen2.5-vl",
            counters={"image": "qwen2-vl.image@1", "video": "qwen2-vl.video@2"},
            units=UnitCounts({"text.tokens": 12, "image.tokens": 64}),
            defaulted={"image": True, "video": False},
            errors=["part 2: audio is not supported by qwen2.5-vl", "part 3: bad data"],
        )
        attrs = count_attributes(count)
        assert attrs[semconv.UNITS_PROFILE] == "qwen2.5-vl"
        assert attrs["modtrace.units.image.counter"] == "qwen2-vl.image@1"
        assert attrs["modtrace.units.video.counter"] == "qwen2-vl.video@2"
        assert attrs["modtrace.units.image.defaulted"] is True
        assert attrs["modtrace.units.video.defaulted"] is False
        assert attrs[semconv.UNITS_ERRORS] == 2
        assert attrs[semconv.UNITS_ERROR] == "count: part 2: audio is not supported by qwen2.5-vl"

    def test_bad_counts_raise(self):
        """A negative count or unknown unit is rejected, naming it."""
        with pytest.raises(ValueError, match=r"text\.tokens"):
            count_attributes({"text.tokens": -1})
        with pytest.raises(ValueError, match="unknown unit"):
            count_attributes({"image.tokenz": 1})


class TestGenAi:
    def test_request_attributes_per_convention(self):
        """development uses gen_ai.provider.name, v1.36 gen_ai.system, none nothing."""
        dev = genai_request_attributes(operation="chat", model="m", provider="vllm")
        assert dev == {
            "gen_ai.operation.name": "chat",
            "gen_ai.request.model": "m",
            "gen_ai.provider.name": "vllm",
        }
        legacy = genai_request_attributes(
            operation="chat", model="m", provider="vllm", convention="v1.36"
        )
        assert legacy["gen_ai.system"] == "vllm"
        assert "gen_ai.provider.name" not in legacy
        assert (
            genai_request_attributes(
                operation="chat", model="m", provider="vllm", convention="none"
            )
            == {}
        )

    def test_usage_per_modality_and_total(self):
        """Token counts give per-modality usage and, when complete, the input total."""
        units = UnitCounts({"text.tokens": 600, "image.tokens": 1200, "image.tiles": 8})
        attrs = genai_usage_attributes(units)
        assert attrs == {
            "gen_ai.usage.text.input_tokens": 600,
            "gen_ai.usage.image.input_tokens": 1200,
            "gen_ai.usage.input_tokens": 1800,
        }

    def test_total_omitted_when_a_modality_has_no_tokens(self):
        """Audio counted only in seconds: no total (it would leave audio out)."""
        units = UnitCounts({"text.tokens": 600, "audio.seconds": 20})
        assert genai_usage_attributes(units) == {"gen_ai.usage.text.input_tokens": 600}

    def test_legacy_convention_has_only_the_total(self):
        """v1.36 has no per-modality usage attributes."""
        units = UnitCounts({"text.tokens": 600, "image.tokens": 100})
        assert genai_usage_attributes(units, "v1.36") == {"gen_ai.usage.input_tokens": 700}
        assert genai_usage_attributes(units, "none") == {}


class TestTimers:
    def test_round_trip(self):
        """Timers written as attributes read back equal."""
        timers = GpuTimers(
            total=1.7, vision_encoder=0.2, prefill=1.0, decode=0.5, gpu_count=2, source="x"
        )
        attrs = timer_attributes(timers)
        assert attrs["modtrace.gpu.seconds"] == 1.7
        assert attrs["modtrace.gpu.seconds.prefill"] == 1.0
        assert "modtrace.gpu.seconds.audio_encoder" not in attrs
        assert attrs["modtrace.gpu.count"] == 2
        assert timers_from_attributes(attrs) == timers

    def test_absent_timers_are_none(self):
        """A span with no GPU timer reads as None."""
        assert timers_from_attributes({"modtrace.units.text.tokens": 3}) is None

    def test_bad_timer_is_collected_not_raised(self):
        """With an errors list, a bad timer is skipped and its reason kept."""
        errors: list[str] = []
        timers = timers_from_attributes(
            {"modtrace.gpu.seconds": -1.0, "modtrace.gpu.seconds.decode": 0.5}, errors=errors
        )
        assert timers == GpuTimers(decode=0.5)
        assert len(errors) == 1
        assert "modtrace.gpu.seconds" in errors[0]
        with pytest.raises(ValueError, match="negative"):
            timers_from_attributes({"modtrace.gpu.seconds": -1.0})

    def test_bad_gpu_count(self):
        """A GPU count that is not a whole number >= 1 is reported."""
        errors: list[str] = []
        timers = timers_from_attributes(
            {"modtrace.gpu.seconds": 1.0, "modtrace.gpu.count": 0}, errors=errors
        )
        assert timers == GpuTimers(total=1.0)
        assert "modtrace.gpu.count" in errors[0]


@given(
    st.dictionaries(
        st.sampled_from(UNIT_NAMES),
        st.integers(min_value=0, max_value=10**9) | st.floats(0, 1e6, allow_nan=False),
    )
)
def test_units_round_trip(counts):
    """Any valid counts survive attributes and back."""
    units = UnitCounts(counts)
    assert units_from_attributes(count_attributes(units)) == units


@given(
    st.fixed_dictionaries(
        {},
        optional={
            "total": st.floats(0, 1e4, allow_nan=False),
            **{c: st.floats(0, 1e4, allow_nan=False) for c in COMPONENTS},
        },
    ),
    st.integers(1, 16),
)
def test_timers_round_trip(fields, gpus):
    """Any valid timers survive attributes and back (None when no seconds)."""
    timers = GpuTimers(**fields, gpu_count=gpus, source="wall_clock")
    back = timers_from_attributes(timer_attributes(timers))
    assert back == (timers if fields else None)


class TestResults:
    def test_attribution_attributes_match_the_core(self):
        """Attributed seconds, shares, method, factor and version mirror attribute()."""
        cal = Calibration.from_weights(SEED_WEIGHTS, version="seed-1")
        result = attribute(
            {"text.tokens": 600, "image.tiles": 8, "audio.seconds": 20}, {"total": 1.70}, cal
        )
        attrs = attribution_attributes(result)
        assert attrs["modtrace.attributed.method"] == "weights"
        assert attrs["modtrace.reconcile.factor"] == result.factor
        assert round(result.factor, 3) == 1.079  # the seed's worked example
        assert attrs["modtrace.reconcile.outlier"] is False
        assert attrs["modtrace.calibration.version"] == "seed-1"
        for modality in ("text", "image", "audio"):
            assert (
                attrs[f"modtrace.attributed.gpu_seconds.{modality}"]
                == (result.gpu_seconds[modality])
            )
            assert attrs[f"modtrace.attributed.share.{modality}"] == result.share[modality]
        assert math.isclose(sum(attributed_from_attributes(attrs).values()), 1.70)

    def test_unknown_bucket_is_carried(self):
        """Seconds no modality can carry land in the unknown bucket attributes."""
        result = attribute({}, {"total": 2.0})
        attrs = attribution_attributes(result)
        assert attrs["modtrace.attributed.gpu_seconds.unknown"] == 2.0
        assert attributed_from_attributes(attrs) == {"unknown": 2.0}

    def test_cost_attributes(self):
        """Cost per modality, total, rate, rate id and the hypothetical flag."""
        cost = price({"text": 0.52, "audio": 1.08}, Rate(usd_per_gpu_hour=2.0, id="plan-a"))
        attrs = cost_attributes(cost)
        assert attrs["modtrace.cost.usd.text"] == cost.usd["text"]
        assert attrs["modtrace.cost.usd.total"] == cost.usd_total
        assert attrs["modtrace.cost.usd_per_gpu_hour"] == 2.0
        assert attrs["modtrace.cost.rate_id"] == "plan-a"
        assert attrs["modtrace.cost.hypothetical"] is True
        assert cost_from_attributes(attrs) == cost.usd


def test_is_inference_span():
    """Spans with a unit count or a GPU timer are inference spans; others are not."""
    assert is_inference_span({"modtrace.units.audio.seconds": 1.0})
    assert is_inference_span({"modtrace.gpu.seconds.prefill": 1.0})
    assert not is_inference_span({"http.method": "GET", "modtrace.units.profile": "x"})


def test_short_error_is_one_bounded_line():
    """Errors are one line, prefixed by the stage, at most 200 characters."""
    text = short_error("count", ValueError("a\nb " + "x" * 500))
    assert text.startswith("count: a b ")
    assert "\n" not in text
    assert len(text) == 200
