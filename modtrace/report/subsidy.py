"""Subsidy: revenue against attributed cost per modality, and who subsidises whom.

A price per request (one for all, or one per tier) is blended: it does not
change with what a request carries. Requests are grouped by tier and by
their modality mix (``text``, ``text+image``, ``text+audio``...); each
group's revenue is set against its attributed cost per modality. Groups
whose cost exceeds their revenue are subsidised; groups with a surplus pay
for them, in proportion to their surplus::

    transfer(payer -> receiver) = surplus(payer) / sum(surpluses)
                                  x deficit(receiver) x min(1, sum(surpluses) / sum(deficits))

so each receiver's deficit is covered as far as the surpluses go, and the
rest is an overall loss. A subsidy can be a choice (a modality that drives
adoption); this report makes it explicit.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .. import semconv
from ..cost import Rate
from ..errors import load_json_model
from ..units import MODALITIES, UNIT_NAMES, check_number, modality_of
from .base import (
    RESULT_MODALITIES,
    Report,
    SpanBuilder,
    Window,
    cell_of,
    rate_params,
    ratio,
    versions_warning,
)
from .shares import span_usd
from .spans import ReadStats, SpanRecord

__all__ = [
    "PricingConfig",
    "SubsidyBuilder",
    "TierPrice",
    "load_pricing",
    "subsidy_report",
    "transfers",
]

_UNIT_KEYS: tuple[tuple[str, str], ...] = tuple(
    (modality_of(u), semconv.unit(u)) for u in UNIT_NAMES
)
#: The tier label of requests when pricing has no tiers.
ALL_TIERS = "all"
_N = len(RESULT_MODALITIES)


class TierPrice(BaseModel):
    """The price of one request in a tier, in US dollars."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd_per_request: float

    @model_validator(mode="before")
    @classmethod
    def _from_number(cls, data: object) -> object:
        # A bare number is the common hand-written form.
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"usd_per_request": data}
        return data

    @field_validator("usd_per_request", mode="before")
    @classmethod
    def _price(cls, value: object) -> float:
        return check_number("usd_per_request", value)


class PricingConfig(BaseModel):
    """What requests are sold at: one price per request, or one per tier.

    ::

        {"usd_per_request": 0.002}

        {"tier_attribute": "app.plan",
         "tiers": {"free": 0, "pro": {"usd_per_request": 0.004}},
         "usd_per_request": 0.002}

    Attributes:
        usd_per_request: The price of a request; with tiers, the price of a
            request whose tier is not listed (``None``: such requests are
            left out and counted).
        tier_attribute: The span (else resource) attribute that names a
            request's tier.
        tiers: Tier value -> price.
        id: A name for this price list, recorded in the report.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd_per_request: float | None = None
    tier_attribute: str | None = Field(default=None, min_length=1)
    tiers: dict[str, TierPrice] = Field(default_factory=dict)
    id: str = Field(default="pricing", min_length=1)

    @field_validator("usd_per_request", mode="before")
    @classmethod
    def _price(cls, value: object) -> float | None:
        return None if value is None else check_number("usd_per_request", value)

    @model_validator(mode="after")
    def _consistent(self) -> PricingConfig:
        if self.tiers and not self.tier_attribute:
            msg = "tiers need tier_attribute: the span attribute that names a request's tier"
            raise ValueError(msg)
        if not self.tiers and self.usd_per_request is None:
            msg = "give usd_per_request, or tier_attribute with tiers"
            raise ValueError(msg)
        return self

    def price(self, tier: str | None) -> float | None:
        """The price of a request of ``tier``, or ``None`` when it has none."""
        if tier is not None and tier in self.tiers:
            return self.tiers[tier].usd_per_request
        return self.usd_per_request


def load_pricing(path: str | Path) -> PricingConfig:
    """Read a pricing configuration JSON file.

    Raises:
        ValueError: the file is missing, not JSON or not a valid configuration.
    """
    return load_json_model(path, PricingConfig, "pricing")


#: Layout of a subsidy cell: requests, revenue, cost per modality.
_REQ, _REV, _COST = 0, 1, 2
_CELL = 2 + _N


@dataclass
class SubsidySums:
    """Sums per ``(tier, modality mix)`` and the spans left out, by reason."""

    cells: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    unpriced: int = 0
    uncosted: int = 0
    unattributed: int = 0
    invalid: int = 0
    outside_window: int = 0
    versions: Counter[str] = field(default_factory=Counter)


def mix_of(record: SpanRecord) -> str:
    """The modalities a request carries (a unit count above 0), ``+``-joined in report order."""
    present = set()
    for modality, key in _UNIT_KEYS:
        if modality not in present and (record.number(key) or 0) > 0:
            present.add(modality)
    return "+".join(m for m in MODALITIES if m in present) or "none"


class SubsidyBuilder(SpanBuilder):
    """Adds requests' revenue and attributed cost to their ``(tier, mix)`` cell."""

    def __init__(
        self,
        pricing: PricingConfig,
        *,
        rate: Rate | None = None,
        window: Window | None = None,
        stats: ReadStats | None = None,
    ) -> None:
        super().__init__(window=window, stats=stats)
        self.pricing = pricing
        self.rate = rate
        self.sums = SubsidySums()

    def add(self, record: SpanRecord) -> None:
        """Add one request."""
        sums = self.sums
        if self.outside(record):
            sums.outside_window += 1
            return
        if self.attribution_skipped(record):
            return
        if semconv.ATTRIBUTED_METHOD not in record.attrs:
            sums.unattributed += 1
            return
        tier_attr = self.pricing.tier_attribute
        tier = record.group(tier_attr) if tier_attr else ALL_TIERS
        price = self.pricing.price(tier)
        if price is None:
            sums.unpriced += 1
            return
        try:
            cost = span_usd(record, self.rate)
            if cost is None:
                sums.uncosted += 1
                return
            mix = mix_of(record)
        except ValueError as exc:
            sums.invalid += 1
            self.skip_invalid(record, exc)
            return
        cell = cell_of(sums.cells, (tier, mix), _CELL)
        cell[_REQ] += 1
        cell[_REV] += price
        for i, c in enumerate(cost, _COST):
            cell[i] += c
        sums.versions[record.string(semconv.CALIBRATION_VERSION) or ""] += 1


def transfers(margins: Mapping[str, float]) -> list[dict[str, Any]]:
    """Who subsidises whom: surpluses cover deficits in proportion.

    Args:
        margins: Revenue minus cost per party.

    Returns:
        ``{"from", "to", "usd"}`` for every payer with a surplus and every
        receiver with a deficit, largest first; each payer gives in proportion
        to its surplus, and no payer gives more than its surplus.

    >>> transfers({"text": 3.0, "image": -2.0})
    [{'from': 'text', 'to': 'image', 'usd': 2.0}]
    """
    payers = {k: v for k, v in margins.items() if v > 0}
    receivers = {k: -v for k, v in margins.items() if v < 0}
    surplus, deficit = sum(payers.values()), sum(receivers.values())
    if not surplus or not deficit:
        return []
    covered = min(1.0, surplus / deficit)
    out = [
        {"from": p, "to": r, "usd": pv / surplus * rv * covered}
        for p, pv in payers.items()
        for r, rv in receivers.items()
    ]
    return sorted(out, key=lambda t: -t["usd"])


def _label(tier: str, mix: str, tiered: bool) -> str:
    return f"{tier}/{mix}" if tiered else mix


def subsidy_report(
    records: Iterable[SpanRecord],
    stats: ReadStats | None = None,
    *,
    pricing: PricingConfig,
    rate: Rate | None = None,
    window: Window | None = None,
) -> Report:
    """Revenue against attributed cost per tier and modality mix, and the transfers between them.

    Args:
        records: The spans, streamed.
        stats: The reader's stats.
        pricing: The price per request or per tier.
        rate: Cost every GPU second at this hypothetical rate (else the
            recorded dollars).
        window: Only spans starting in it count.
    """
    stats = stats if stats is not None else ReadStats()
    sums = SubsidyBuilder(pricing, rate=rate, window=window, stats=stats).add_all(records).sums
    tiered = bool(pricing.tier_attribute)
    rows: list[dict[str, Any]] = []
    margins: dict[str, float] = {}
    for (tier, mix), cell in sorted(sums.cells.items()):
        cost = cell[_COST:]
        total_cost = sum(cost)
        margin = cell[_REV] - total_cost
        margins[_label(tier, mix, tiered)] = margin
        row: dict[str, Any] = {"tier": tier, "mix": mix, "requests": int(cell[_REQ])}
        row["revenue"] = cell[_REV]
        row["cost"] = total_cost
        for m, c in zip(RESULT_MODALITIES, cost, strict=True):
            row[f"cost.{m}"] = c
        row["margin"] = margin
        row["margin_per_request"] = ratio(margin, cell[_REQ])
        row["cost_to_revenue"] = ratio(total_cost, cell[_REV])
        row["role"] = "subsidiser" if margin > 0 else ("subsidised" if margin < 0 else "even")
        rows.append(row)

    revenue = sum(c[_REV] for c in sums.cells.values())
    by_modality = [
        {
            "modality": m,
            "cost": (cost := sum(c[_COST + i] for c in sums.cells.values())),
            "cost_to_revenue": ratio(cost, revenue),
        }
        for i, m in enumerate(RESULT_MODALITIES)
    ]
    by_tier: dict[str, dict[str, float]] = {}
    for (tier, _), cell in sums.cells.items():
        t = by_tier.setdefault(tier, {"requests": 0, "revenue": 0.0, "cost": 0.0})
        t["requests"] += int(cell[_REQ])
        t["revenue"] += cell[_REV]
        t["cost"] += sum(cell[_COST:])
    tiers = [
        {"tier": k, **v, "margin": v["revenue"] - v["cost"]} for k, v in sorted(by_tier.items())
    ]
    flows = transfers(margins)
    total_cost = sum(m["cost"] for m in by_modality)
    summary = [f"{t['from']} pays {t['usd']:.6g} USD towards {t['to']}" for t in flows[:10]] or [
        "no group runs below its attributed cost: no subsidy"
    ]
    if total_cost > revenue:
        summary.append(f"overall loss: cost {total_cost:.6g} USD exceeds revenue {revenue:.6g} USD")

    warnings: list[str] = stats.warnings()
    if (w := versions_warning(sums.versions, "costs mix calibration versions")) is not None:
        warnings.append(w + "; restate first with `modtrace report restate` for one footing")
    if sums.unpriced:
        warnings.append(
            f"{sums.unpriced} requests have a tier with no price "
            f"({pricing.tier_attribute}) and were left out"
        )
    if sums.uncosted:
        warnings.append(
            f"{sums.uncosted} requests recorded no cost and were left out; "
            "pass --usd-per-gpu-hour to cost every attributed GPU second"
        )
    if sums.unattributed:
        warnings.append(f"{sums.unattributed} modtrace spans carry no attribution: left out")
    if sums.invalid:
        warnings.append(f"{sums.invalid} spans have an invalid value and were skipped")
    input_section = stats.to_dict()
    input_section.update(
        {
            "priced_requests": sum(int(c[_REQ]) for c in sums.cells.values()),
            "unpriced": sums.unpriced,
            "uncosted": sums.uncosted,
            "unattributed_spans": sums.unattributed,
            "invalid_spans": sums.invalid,
            "outside_window": sums.outside_window,
        }
    )
    return Report(
        kind="subsidy",
        columns=[
            "tier",
            "mix",
            "requests",
            "revenue",
            "cost",
            *(f"cost.{m}" for m in RESULT_MODALITIES),
            "margin",
            "margin_per_request",
            "cost_to_revenue",
            "role",
        ],
        rows=rows,
        params={
            "pricing": pricing.model_dump(mode="json"),
            "cost_basis": "rate" if rate is not None else "recorded",
            **rate_params(rate),
            **(window or Window()).describe(),
        },
        input=input_section,
        warnings=warnings,
        extra={
            "revenue": revenue,
            "cost": total_cost,
            "margin": revenue - total_cost,
            "by_modality": by_modality,
            "by_tier": tiers,
            "transfers": flows,
            "summary": summary,
        },
    )
