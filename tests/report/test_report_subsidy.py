"""Subsidy report: a blended price per request, text-only requests paying for image ones."""

from __future__ import annotations

import json

import pytest
from report_helpers import inference, span, write_spans

from modtrace.cost import Rate
from modtrace.report import (
    PricingConfig,
    ReadStats,
    load_pricing,
    read_spans,
    subsidy_report,
    transfers,
)

PLAN = "app.plan"


def _text_only(n, plan=None, start="2026-01-05"):
    extra = {PLAN: plan} if plan else {}
    return [
        span(
            f"{start}T10:{i:02d}:00",
            inference(
                units={"text.tokens": 300},
                attributed={"text": 0.9},
                usd={"text": 0.0005},
                version="v1",
                extra=extra,
            ),
        )
        for i in range(n)
    ]


def _with_image(n, plan=None, start="2026-01-05"):
    extra = {PLAN: plan} if plan else {}
    return [
        span(
            f"{start}T11:{i:02d}:00",
            inference(
                units={"text.tokens": 300, "image.tokens": 1200, "image.count": 1},
                attributed={"text": 0.9, "image": 7.2},
                usd={"text": 0.0005, "image": 0.004},
                version="v1",
                extra=extra,
            ),
        )
        for i in range(n)
    ]


def _report(path, pricing, **kwargs):
    stats = ReadStats()
    return subsidy_report(read_spans(path, stats), stats, pricing=pricing, **kwargs)


class TestOnePrice:
    """0.002 USD a request: 30 text-only requests (cost 0.0005) and 10 with an image (0.0045)."""

    @pytest.fixture
    def report(self, tmp_path):
        path = write_spans(tmp_path / "s.jsonl", _text_only(30) + _with_image(10), per_line=8)
        return _report(path, PricingConfig(usd_per_request=0.002))

    def test_margins_per_mix(self, report):
        """Text-only earns 0.045 above cost; text+image runs 0.025 below it."""
        rows = {r["mix"]: r for r in report.rows}
        assert rows["text"]["revenue"] == pytest.approx(0.06)
        assert rows["text"]["cost"] == pytest.approx(0.015)
        assert rows["text"]["margin"] == pytest.approx(0.045)
        assert rows["text"]["role"] == "subsidiser"
        assert rows["text+image"]["cost.image"] == pytest.approx(0.04)
        assert rows["text+image"]["margin"] == pytest.approx(-0.025)
        assert rows["text+image"]["margin_per_request"] == pytest.approx(-0.0025)
        assert rows["text+image"]["role"] == "subsidised"

    def test_who_subsidises_whom(self, report):
        """The surplus covers the whole deficit: text pays 0.025 towards text+image."""
        (flow,) = report.extra["transfers"]
        assert flow["from"] == "text" and flow["to"] == "text+image"
        assert flow["usd"] == pytest.approx(0.025)
        assert report.extra["summary"][0].startswith("text pays 0.025 USD towards text+image")

    def test_cost_per_modality_against_revenue(self, report):
        """Image costs 0.04 of 0.08 revenue: half of it."""
        modality = {m["modality"]: m for m in report.extra["by_modality"]}
        assert modality["image"]["cost"] == pytest.approx(0.04)
        assert modality["image"]["cost_to_revenue"] == pytest.approx(0.5)
        assert modality["text"]["cost"] == pytest.approx(0.02)
        assert report.extra["margin"] == pytest.approx(0.02)

    def test_rate_costs_attributed_seconds(self, tmp_path):
        """At 3.6 USD an hour the costs are seconds / 1000: text 0.0009, image 0.0072."""
        path = write_spans(tmp_path / "s.jsonl", _text_only(2) + _with_image(1))
        report = _report(
            path, PricingConfig(usd_per_request=0.002), rate=Rate(usd_per_gpu_hour=3.6)
        )
        rows = {r["mix"]: r for r in report.rows}
        assert rows["text"]["cost"] == pytest.approx(2 * 0.0009)
        assert rows["text+image"]["cost.image"] == pytest.approx(0.0072)
        assert report.params["cost_basis"] == "rate"


class TestTiers:
    """Tier prices chosen by a span attribute; a tier with no price is counted, not guessed."""

    def test_tiers(self, tmp_path):
        """free (0) and the image requests of pro run below cost; pro text pays for both."""
        spans = _text_only(5, "free") + _with_image(10, "pro") + _text_only(10, "pro", "2026-01-06")
        spans += _text_only(3, "trial", "2026-01-07")
        path = write_spans(tmp_path / "s.jsonl", spans, per_line=10)
        pricing = PricingConfig(tier_attribute=PLAN, tiers={"free": 0, "pro": 0.004})
        report = _report(path, pricing)
        rows = {(r["tier"], r["mix"]): r for r in report.rows}
        assert rows[("free", "text")]["margin"] == pytest.approx(-0.0025)
        assert rows[("pro", "text+image")]["margin"] == pytest.approx(0.04 - 0.045)
        assert rows[("pro", "text")]["margin"] == pytest.approx(0.035)
        flows = {(f["from"], f["to"]): f["usd"] for f in report.extra["transfers"]}
        assert flows == {
            ("pro/text", "pro/text+image"): pytest.approx(0.005),
            ("pro/text", "free/text"): pytest.approx(0.0025),
        }
        assert report.input["unpriced"] == 3
        assert any("tier with no price" in w for w in report.warnings)
        tiers = {t["tier"]: t for t in report.extra["by_tier"]}
        assert tiers["pro"]["margin"] == pytest.approx(0.08 - 0.05)

    def test_default_price_for_unlisted_tiers(self):
        """``usd_per_request`` prices a tier that is not listed."""
        pricing = PricingConfig(usd_per_request=0.001, tier_attribute=PLAN, tiers={"pro": 0.004})
        assert pricing.price("trial") == 0.001 and pricing.price("pro") == 0.004


class TestTransfers:
    """The proportional rule, when the surpluses fall short."""

    def test_short_surplus_covers_proportionally(self):
        """1.0 of surplus against 4.0 of deficit covers a quarter of each deficit."""
        flows = transfers({"a": 1.0, "b": -2.0, "c": -2.0})
        assert {(f["from"], f["to"]): f["usd"] for f in flows} == {
            ("a", "b"): pytest.approx(0.5),
            ("a", "c"): pytest.approx(0.5),
        }

    def test_no_deficit_no_transfer(self):
        """Everyone above cost: nothing flows."""
        assert transfers({"a": 1.0, "b": 0.0}) == []


class TestPricingConfig:
    """Pricing files validate with clear errors."""

    @pytest.mark.parametrize(
        ("data", "message"),
        [
            ({}, "usd_per_request, or tier_attribute"),
            ({"tiers": {"pro": 1}}, "tiers need tier_attribute"),
            ({"usd_per_request": -1}, "must not be negative"),
            ({"usd_per_request": 1, "surprise": 2}, "surprise"),
        ],
    )
    def test_invalid(self, tmp_path, data, message):
        """Each invalid file names its problem."""
        path = tmp_path / "pricing.json"
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match=message):
            load_pricing(path)

    def test_tier_object_form(self, tmp_path):
        """A tier may be written as an object with ``usd_per_request``."""
        path = tmp_path / "pricing.json"
        path.write_text(
            json.dumps({"tier_attribute": PLAN, "tiers": {"pro": {"usd_per_request": 0.004}}})
        )
        assert load_pricing(path).price("pro") == 0.004
