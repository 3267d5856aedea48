"""The allocation key: measured GPU seconds split across modalities.

This module is pure arithmetic, shared by the span processor, the CLI and
restatement. The method (see ``docs/allocation.md``), in order of preference:

1. **Components.** ``vision_encoder`` goes to image and video, ``audio_encoder``
   to audio, and the language-model part (``prefill + decode``, else ``total``
   minus the encoders) is split by prompt-token share. Where a token count is
   missing, a split falls back to the weighted estimates (method ``mixed``).
2. **Weights.** Estimate per modality = sum of weight x count.
3. Either way, one factor ``total / predicted`` reconciles the split to the
   measured total, so attributed seconds always add up to what the engine
   measured. Without a measured total the estimates are reported as they are
   (method ``unreconciled``).

Seconds that no modality can carry go to ``unknown``: never lost.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .calibration import Calibration
from .timers import GpuTimers
from .units import MODALITIES, UNIT_MODALITY, UNKNOWN, UnitCounts, check_number

__all__ = ["Attribution", "AttributionConfig", "Method", "attribute", "weighted_estimates"]

Method = Literal["components", "weights", "mixed", "unreconciled"]

#: The unit whose count is a modality's share of the prompt.
PROMPT_TOKEN_UNITS: dict[str, str] = {m: f"{m}.tokens" for m in MODALITIES}
VISION_MODALITIES: tuple[str, ...] = ("image", "video")


class AttributionConfig(BaseModel):
    """Knobs of the allocation key.

    Attributes:
        outlier_band: A reconciliation factor outside ``[low, high]`` flags
            the calibration as an outlier for this request.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    outlier_band: tuple[float, float] = (0.5, 2.0)

    @field_validator("outlier_band")
    @classmethod
    def _band(cls, value: tuple[float, float]) -> tuple[float, float]:
        low, high = (check_number(f"outlier_band[{i}]", v) for i, v in enumerate(value))
        if low > high:
            msg = f"outlier_band: low {low} is above high {high}"
            raise ValueError(msg)
        return (low, high)


class Attribution(BaseModel):
    """GPU seconds per modality for one request.

    Attributes:
        method: ``components``, ``weights``, ``mixed`` (components with a
            split that fell back to weights) or ``unreconciled``.
        factor: ``measured / predicted``; 1 when unreconciled.
        predicted_gpu_seconds: The sum the key predicted before scaling.
        measured_gpu_seconds: The measured total, or ``None``.
        gpu_seconds: Attributed seconds per modality (``unknown`` included
            when something could not be carried).
        share: Each modality's fraction of the attributed total.
        estimates: Weighted estimates per present modality (weight x count).
        components: The component timers used, by name.
        reconciled: Whether the split was scaled to a measured total.
        outlier: Whether the factor left the configured band.
        calibration_version: The weights' version, if weights were used.
        unweighted_units: Units with a count but no weight.
        notes: Human-readable remarks on fallbacks taken.
    """

    model_config = ConfigDict(frozen=True)

    method: Method
    factor: float
    predicted_gpu_seconds: float
    measured_gpu_seconds: float | None
    gpu_seconds: dict[str, float]
    share: dict[str, float]
    estimates: dict[str, float] = Field(default_factory=dict)
    components: dict[str, float] = Field(default_factory=dict)
    reconciled: bool
    outlier: bool
    calibration_version: str | None = None
    unweighted_units: list[str] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def weighted_estimates(
    units: UnitCounts, calibration: Calibration | None
) -> tuple[dict[str, float], list[str]]:
    """Estimate GPU seconds per present modality as the sum of weight x count.

    Returns the estimates (every present modality, possibly 0) and the unit
    names that had a count but no weight.
    """
    weights = calibration.values if calibration else {}
    estimates: dict[str, float] = {}
    unweighted = []
    for unit, count in units.root.items():
        if count <= 0:
            continue
        modality = UNIT_MODALITY[unit]
        weight = weights.get(unit)
        if weight is None:
            unweighted.append(unit)
            estimates.setdefault(modality, 0.0)
        else:
            estimates[modality] = estimates.get(modality, 0.0) + weight * count
    return estimates, unweighted


def _split(
    seconds: float,
    candidates: tuple[str, ...],
    present: list[str],
    by_tokens: Mapping[str, float],
    by_estimate: Mapping[str, float],
) -> tuple[dict[str, float], bool]:
    """Share ``seconds`` among the present candidates.

    Token counts are the preferred key; when a present candidate has none,
    the weighted estimates take over. Returns the split and whether the
    fallback was taken.
    """
    targets = [m for m in candidates if m in present]
    if seconds <= 0:
        return {}, False
    if not targets:
        return {UNKNOWN: seconds}, False
    if len(targets) == 1:
        return {targets[0]: seconds}, False
    for key, fell_back in ((by_tokens, False), (by_estimate, True)):
        if all(key.get(m, 0.0) > 0 for m in targets):
            return _proportional(seconds, {m: key[m] for m in targets}), fell_back
    # Neither key covers every target: use whichever covers something.
    for key in (by_tokens, by_estimate):
        basis = {m: key.get(m, 0.0) for m in targets if key.get(m, 0.0) > 0}
        if basis:
            return _proportional(seconds, basis), True
    return {UNKNOWN: seconds}, True


def _proportional(seconds: float, basis: Mapping[str, float]) -> dict[str, float]:
    total = math.fsum(basis.values())
    return {m: seconds * b / total for m, b in basis.items()}


def _component_key(
    units: UnitCounts, timers: GpuTimers, estimates: Mapping[str, float]
) -> tuple[dict[str, float], dict[str, float], bool]:
    """Seconds per modality from the component timers, before reconciling.

    Returns the allocation, the components used and whether any split fell
    back to the weighted estimates.
    """
    present = units.modalities()
    tokens = {m: units[unit] for m, unit in PROMPT_TOKEN_UNITS.items()}
    used: dict[str, float] = {}
    if timers.vision_encoder is not None:
        used["vision_encoder"] = timers.vision_encoder
    if timers.audio_encoder is not None:
        used["audio_encoder"] = timers.audio_encoder
    lm_timed = {n: v for n in ("prefill", "decode") if (v := getattr(timers, n)) is not None}
    if lm_timed:
        used.update(lm_timed)
        lm_seconds = math.fsum(lm_timed.values())
    elif timers.total is not None:
        # The language model ran in whatever time the encoders did not use.
        used["language_model"] = lm_seconds = max(
            timers.total - used.get("vision_encoder", 0.0) - used.get("audio_encoder", 0.0), 0.0
        )
    else:
        lm_seconds = 0.0

    allocation: dict[str, float] = {}
    fell_back = False
    splits = (
        (used.get("vision_encoder", 0.0), VISION_MODALITIES),
        (used.get("audio_encoder", 0.0), ("audio",)),
        (lm_seconds, MODALITIES),
    )
    for seconds, candidates in splits:
        part, fb = _split(seconds, candidates, present, tokens, estimates)
        fell_back |= fb
        for m, s in part.items():
            allocation[m] = allocation.get(m, 0.0) + s
    return allocation, used, fell_back


def _ordered(values: Mapping[str, float]) -> dict[str, float]:
    return {m: values[m] for m in (*MODALITIES, UNKNOWN) if m in values}


def _scale_exactly(allocation: Mapping[str, float], total: float) -> tuple[dict[str, float], float]:
    """Scale ``allocation`` to sum to ``total``; the rounding residue goes to the largest part."""
    predicted = math.fsum(allocation.values())
    factor = total / predicted
    # total * s / predicted rather than s * factor: exact for a single part.
    scaled = {m: total * (s / predicted) for m, s in allocation.items()}
    residue = total - math.fsum(scaled.values())
    if residue:
        largest = max(scaled, key=scaled.__getitem__)
        scaled[largest] = max(scaled[largest] + residue, 0.0)
    return scaled, factor


def attribute(
    units: UnitCounts | Mapping[str, float],
    timers: GpuTimers | Mapping[str, object] | None = None,
    calibration: Calibration | None = None,
    *,
    config: AttributionConfig | None = None,
) -> Attribution:
    """Split a request's measured GPU seconds across its modalities.

    Args:
        units: The request's unit counts (``{"text.tokens": 600, ...}``).
        timers: The measured total and optional component timers.
        calibration: Weights in GPU seconds per unit, used where component
            timers are missing and to split where token counts are missing.
        config: Outlier band and other knobs.

    Raises:
        ValueError: a count, timer or weight is negative, NaN or infinite;
            the message names the field.

    >>> a = attribute({"text.tokens": 600, "image.tiles": 8, "audio.seconds": 20},
    ...               {"total": 1.70},
    ...               Calibration.from_weights({"text.tokens": 0.0008,
    ...                   "image.tiles": 0.012, "audio.seconds": 0.05}))
    >>> round(a.factor, 3), round(a.gpu_seconds["audio"], 2)
    (1.079, 1.08)
    """
    units = units if isinstance(units, UnitCounts) else UnitCounts(units)
    if timers is None:
        timers = GpuTimers()
    elif not isinstance(timers, GpuTimers):
        timers = GpuTimers.model_validate(timers)
    config = config or AttributionConfig()

    estimates, unweighted = weighted_estimates(units, calibration)
    notes: list[str] = []
    if timers.components():
        allocation, components, fell_back = _component_key(units, timers, estimates)
        method: Method = "mixed" if fell_back else "components"
        if fell_back:
            notes.append("a component split fell back to weighted estimates")
    else:
        allocation, components, method = dict(estimates), {}, "weights"
    if method != "components":
        notes.extend(f"no weight for {u}" for u in unweighted)
    allocation = {m: s for m, s in allocation.items() if s > 0}
    predicted = math.fsum(allocation.values())
    total = timers.total

    low, high = config.outlier_band
    if total is None:
        method, factor, gpu, outlier = "unreconciled", 1.0, allocation, False
        notes.append("no measured total: estimates are unreconciled")
    elif predicted > 0 and math.isfinite(total / predicted):
        gpu, factor = _scale_exactly(allocation, total)
        outlier = not low <= factor <= high
    else:
        # Nothing in the request can carry the measured seconds.
        factor, gpu, outlier = 1.0, ({UNKNOWN: total} if total > 0 else {}), total > 0
        if total > 0:
            notes.append("no unit could carry the measured total: all of it is unknown")

    attributed = math.fsum(gpu.values())
    share = {m: (s / attributed if attributed > 0 else 0.0) for m, s in gpu.items()}
    return Attribution(
        method=method,
        factor=factor,
        predicted_gpu_seconds=predicted,
        measured_gpu_seconds=total,
        gpu_seconds=_ordered(gpu),
        share=_ordered(share),
        estimates=_ordered(estimates),
        components=components,
        reconciled=total is not None,
        outlier=outlier,
        calibration_version=calibration.version if calibration else None,
        unweighted_units=unweighted,
        notes=notes,
    )
