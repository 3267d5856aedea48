"""Check a calibration on the held-out mixed requests.

Each held-out request is attributed twice with :func:`modtrace.attribution.attribute`:
by the calibrated weights alone (the measured total only), and by the
engine's component timers (the preferred key). The absolute difference of
each modality's share, in percentage points, says how far weights-only
attribution is from what the components say. The issue's goal: a median
within 5 points per modality.

Held-out requests without component timers can only be checked on their
total: the reconciliation factor (measured / predicted) is reported for
every request.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from ..attribution import attribute
from ..calibration import Calibration
from ..timers import GpuTimers
from ..units import MODALITIES
from .probes import ProbeRecord

__all__ = ["HoldoutReport", "HoldoutRow", "ShareError", "validate_holdout"]


class HoldoutRow(BaseModel):
    """One held-out request, attributed both ways.

    Attributes:
        id: The probe id.
        factor: measured / predicted by the weights.
        by_weights: Share per modality from the weights.
        by_components: Share per modality from the component timers
            (empty when the engine reported none).
        error_pp: ``|by_weights - by_components|`` per modality, in points.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    size: str
    factor: float
    by_weights: dict[str, float]
    by_components: dict[str, float] = Field(default_factory=dict)
    error_pp: dict[str, float] = Field(default_factory=dict)


class ShareError(BaseModel):
    """Absolute share error of one modality over the held-out requests, in points."""

    model_config = ConfigDict(frozen=True)

    n: int
    median_pp: float
    worst_pp: float


class HoldoutReport(BaseModel):
    """The validation of a calibration on held-out requests.

    Attributes:
        rows: One per held-out request with a measured total.
        per_modality: Median and worst absolute share error per modality.
        factor_median: Median reconciliation factor.
        without_components: Held-out ids with no component timers (factor only).
        failed: Held-out ids whose latest record is a failure.
    """

    model_config = ConfigDict(frozen=True)

    rows: list[HoldoutRow] = Field(default_factory=list)
    per_modality: dict[str, ShareError] = Field(default_factory=dict)
    factor_median: float | None = None
    without_components: list[str] = Field(default_factory=list)
    failed: list[str] = Field(default_factory=list)

    def goal_met(self, median_pp: float = 5.0) -> bool:
        """Whether every modality's median share error is within ``median_pp`` points."""
        return bool(self.per_modality) and all(
            e.median_pp <= median_pp for e in self.per_modality.values()
        )


def validate_holdout(calibration: Calibration, records: Iterable[ProbeRecord]) -> HoldoutReport:
    """Attribute every held-out record by weights and by components, and compare the shares.

    Args:
        calibration: The weights to check.
        records: Probe records (the latest record of each held-out id counts).
    """
    latest: dict[str, ProbeRecord] = {}
    for record in records:
        if record.kind == "holdout":
            latest.pop(record.id, None)
            latest[record.id] = record
    rows, no_components, failed = [], [], []
    errors: dict[str, list[float]] = {}
    for record in latest.values():
        if record.status != "ok" or record.timers is None:
            failed.append(record.id)
            continue
        timers = record.timers
        by_weights = attribute(record.units, GpuTimers(total=timers.total), calibration)
        row = {
            "id": record.id,
            "size": record.size,
            "factor": by_weights.factor,
            "by_weights": by_weights.share,
        }
        if timers.components():
            by_components = attribute(record.units, timers, calibration)
            error = {
                m: abs(by_weights.share.get(m, 0.0) - by_components.share.get(m, 0.0)) * 100
                for m in (*MODALITIES, "unknown")
                if m in by_weights.share or m in by_components.share
            }
            row.update(by_components=by_components.share, error_pp=error)
            for m, e in error.items():
                errors.setdefault(m, []).append(e)
        else:
            no_components.append(record.id)
        rows.append(HoldoutRow(**row))
    per_modality = {
        m: ShareError(n=len(v), median_pp=statistics.median(v), worst_pp=max(v))
        for m, v in errors.items()
    }
    factors = [r.factor for r in rows]
    return HoldoutReport(
        rows=rows,
        per_modality=per_modality,
        factor_median=statistics.median(factors) if factors else None,
        without_components=no_components,
        failed=failed,
    )
