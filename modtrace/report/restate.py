"""Restate: recompute attribution and dollars from the raw counts, beside the figures of the time.

Weights decay and prices change. Some users price history as it was
recorded, others reprice it; both need the two figures side by side. Each
span's raw counts (``modtrace.units.*``) and timers (``modtrace.gpu.*``)
go through the same pure :func:`modtrace.attribution.attribute` the span
processor ran, with the calibration asked for, and the result is priced at
the rate asked for (or, without one, at the rate recorded on the span).

Rows keep the recorded calibration version as a key: the figures "as at the
time" are never summed across versions; the restated ones all use one.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import semconv
from ..attribution import Attribution, AttributionConfig, attribute
from ..calibration import Calibration
from ..cost import SECONDS_PER_HOUR, Rate
from ..timers import COMPONENTS, GpuTimers
from ..units import UNIT_NAMES, UnitCounts
from .base import (
    RESULT_MODALITIES,
    Bucket,
    BucketedBuilder,
    Report,
    Window,
    cell_of,
    rate_params,
    ratio,
    totals,
    versions_warning,
)
from .shares import GPU_SECONDS_KEYS, USD_KEYS
from .spans import ReadStats, SpanRecord

__all__ = [
    "RestateBuilder",
    "RestatedSpan",
    "restate_report",
    "restate_span",
    "span_inputs",
]

_UNIT_KEYS: tuple[tuple[str, str], ...] = tuple((u, semconv.unit(u)) for u in UNIT_NAMES)
_COMPONENT_KEYS: tuple[tuple[str, str], ...] = tuple(
    (c, semconv.gpu_seconds_component(c)) for c in COMPONENTS
)
_N = len(RESULT_MODALITIES)


@dataclass(frozen=True)
class RestatedSpan:
    """One span, as recorded and as restated.

    Attributes:
        recorded_version: The calibration version on the span (``""`` when none).
        recorded_seconds: Attributed seconds per modality as recorded, or
            ``None`` when the span was never attributed.
        recorded_usd: Dollars per modality as recorded, or ``None``.
        restated: The attribution recomputed from the raw counts and timers.
        restated_usd: Dollars per modality at the restating rate, or ``None``
            when there is no rate (none given, none recorded).
    """

    recorded_version: str
    recorded_seconds: dict[str, float] | None
    recorded_usd: dict[str, float] | None
    restated: Attribution
    restated_usd: dict[str, float] | None


def span_inputs(record: SpanRecord) -> tuple[UnitCounts, GpuTimers | None]:
    """The raw counts and GPU timers a span carries.

    Raises:
        ValueError: a count or timer is not a non-negative finite number.
    """
    number = record.number
    units = {u: v for u, key in _UNIT_KEYS if (v := number(key)) is not None}
    timers = {c: v for c, key in _COMPONENT_KEYS if (v := number(key)) is not None}
    total = number(semconv.GPU_SECONDS)
    if total is not None:
        timers["total"] = total
    return UnitCounts(units), (GpuTimers(**timers, source="span") if timers else None)


def _per_modality(record: SpanRecord, keys: tuple[str, ...]) -> dict[str, float]:
    values = (record.number(k) for k in keys)
    return {m: v for m, v in zip(RESULT_MODALITIES, values, strict=True) if v is not None}


def restate_span(
    record: SpanRecord,
    calibration: Calibration | None,
    rate: Rate | None = None,
    *,
    config: AttributionConfig | None = None,
) -> RestatedSpan:
    """Recompute one span's attribution with ``calibration`` and price it at ``rate``.

    Args:
        record: The span.
        calibration: The weights to restate with. ``None`` keeps the recorded
            seconds (only the price is restated); a span never attributed is
            then attributed from its component timers alone.
        rate: The hypothetical rate; ``None`` prices at the rate recorded on
            the span (``modtrace.cost.usd_per_gpu_hour``), if any.
        config: The allocation key's knobs (the outlier band).

    Raises:
        ValueError: a value on the span is not a non-negative finite number.
    """
    attributed = semconv.ATTRIBUTED_METHOD in record.attrs
    recorded_seconds = _per_modality(record, GPU_SECONDS_KEYS) if attributed else None
    recorded_usd = (
        _per_modality(record, USD_KEYS) if semconv.COST_USD_TOTAL in record.attrs else None
    )
    units, timers = span_inputs(record)
    if calibration is None and recorded_seconds is not None:
        total = sum(recorded_seconds.values())
        restated = Attribution(
            method=record.string(semconv.ATTRIBUTED_METHOD) or "weights",  # type: ignore[arg-type]
            factor=record.number(semconv.RECONCILE_FACTOR) or 1.0,
            predicted_gpu_seconds=total,
            measured_gpu_seconds=timers.total if timers else None,
            gpu_seconds=recorded_seconds,
            share={m: s / total if total else 0.0 for m, s in recorded_seconds.items()},
            reconciled=timers is not None and timers.total is not None,
            outlier=False,
            calibration_version=record.string(semconv.CALIBRATION_VERSION),
        )
    else:
        restated = attribute(units, timers, calibration, config=config)
    per_hour = rate.usd_per_gpu_hour if rate is not None else None
    if per_hour is None:
        per_hour = record.number(semconv.COST_USD_PER_GPU_HOUR)
    restated_usd = (
        None
        if per_hour is None
        else {m: s * per_hour / SECONDS_PER_HOUR for m, s in restated.gpu_seconds.items()}
    )
    return RestatedSpan(
        recorded_version=record.string(semconv.CALIBRATION_VERSION) or "",
        recorded_seconds=recorded_seconds,
        recorded_usd=recorded_usd,
        restated=restated,
        restated_usd=restated_usd,
    )


#: Layout of a restate cell.
_REQ, _REC_REQ, _REC_PRICED, _RES_PRICED, _OUTLIERS = 0, 1, 2, 3, 4
_REC_S = 5
_RES_S = _REC_S + _N
_REC_D = _RES_S + _N
_RES_D = _REC_D + _N
_CELL = _RES_D + _N


@dataclass
class RestateSums:
    """Sums per ``(bucket, group, recorded calibration version)`` (see the cell layout)."""

    cells: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    no_inputs: int = 0
    invalid: int = 0
    outside_window: int = 0
    methods: dict[str, int] = field(default_factory=dict)


class RestateBuilder(BucketedBuilder):
    """Restates spans one at a time into :class:`RestateSums`."""

    sums_class = RestateSums
    sums: RestateSums

    def __init__(
        self,
        calibration: Calibration | None,
        rate: Rate | None = None,
        *,
        bucket: Bucket = "day",
        by: str | None = None,
        window: Window | None = None,
        config: AttributionConfig | None = None,
        stats: ReadStats | None = None,
    ) -> None:
        if calibration is None and rate is None:
            msg = "nothing to restate: give a calibration, a rate or both"
            raise ValueError(msg)
        super().__init__(bucket=bucket, by=by, window=window, stats=stats)
        self.calibration = calibration
        self.rate = rate
        self.config = config

    def add(self, record: SpanRecord) -> None:
        """Restate one span and add both figures to its cell."""
        sums = self.sums
        if self.outside(record):
            sums.outside_window += 1
            return
        if self.attribution_skipped(record):
            return
        try:
            result = restate_span(record, self.calibration, self.rate, config=self.config)
        except ValueError as exc:
            sums.invalid += 1
            self.skip_invalid(record, exc)
            return
        if not result.restated.gpu_seconds and result.recorded_seconds is None:
            sums.no_inputs += 1
            return
        cell = cell_of(sums.cells, (*self.place(record), result.recorded_version), _CELL)
        cell[_REQ] += 1
        cell[_OUTLIERS] += result.restated.outlier
        sums.methods[result.restated.method] = sums.methods.get(result.restated.method, 0) + 1
        for i, m in enumerate(RESULT_MODALITIES):
            cell[_RES_S + i] += result.restated.gpu_seconds.get(m, 0.0)
        if result.recorded_seconds is not None:
            cell[_REC_REQ] += 1
            for i, m in enumerate(RESULT_MODALITIES):
                cell[_REC_S + i] += result.recorded_seconds.get(m, 0.0)
        if result.recorded_usd is not None:
            cell[_REC_PRICED] += 1
            for i, m in enumerate(RESULT_MODALITIES):
                cell[_REC_D + i] += result.recorded_usd.get(m, 0.0)
        if result.restated_usd is not None:
            cell[_RES_PRICED] += 1
            for i, m in enumerate(RESULT_MODALITIES):
                cell[_RES_D + i] += result.restated_usd.get(m, 0.0)


def _columns(by: str | None) -> list[str]:
    per = [
        f"{side}.{what}.{m}"
        for what in ("gpu_seconds", "share")
        for m in RESULT_MODALITIES
        for side in ("recorded", "restated")
    ]
    usd = [f"{side}.usd.{m}" for m in RESULT_MODALITIES for side in ("recorded", "restated")]
    return [
        "bucket",
        *([by] if by else []),
        "recorded_calibration",
        "restated_calibration",
        "requests",
        "recorded_requests",
        "recorded.gpu_seconds",
        "restated.gpu_seconds",
        *per,
        "recorded.usd",
        "restated.usd",
        "delta.usd",
        *usd,
        "recorded_priced",
        "restated_priced",
        "restated_outliers",
    ]


def _row(
    key: tuple[str, str, str], cell: list[float], by: str | None, restated_version: str | None
) -> dict[str, Any]:
    bucket, group, version = key
    rec_s, res_s = cell[_REC_S:_RES_S], cell[_RES_S:_REC_D]
    rec_d, res_d = cell[_REC_D:_RES_D], cell[_RES_D:_CELL]
    rec_total, res_total = sum(rec_s), sum(res_s)
    row: dict[str, Any] = {"bucket": bucket}
    if by:
        row[by] = group
    row.update(
        {
            "recorded_calibration": version or None,
            "restated_calibration": restated_version,
            "requests": int(cell[_REQ]),
            "recorded_requests": int(cell[_REC_REQ]),
            "recorded.gpu_seconds": rec_total,
            "restated.gpu_seconds": res_total,
        }
    )
    for i, m in enumerate(RESULT_MODALITIES):
        row[f"recorded.gpu_seconds.{m}"] = rec_s[i]
        row[f"restated.gpu_seconds.{m}"] = res_s[i]
    for i, m in enumerate(RESULT_MODALITIES):
        row[f"recorded.share.{m}"] = ratio(rec_s[i], rec_total)
        row[f"restated.share.{m}"] = ratio(res_s[i], res_total)
    rec_usd = sum(rec_d) if cell[_REC_PRICED] else None
    res_usd = sum(res_d) if cell[_RES_PRICED] else None
    row["recorded.usd"] = rec_usd
    row["restated.usd"] = res_usd
    row["delta.usd"] = None if rec_usd is None or res_usd is None else res_usd - rec_usd
    for i, m in enumerate(RESULT_MODALITIES):
        row[f"recorded.usd.{m}"] = rec_d[i] if cell[_REC_PRICED] else None
        row[f"restated.usd.{m}"] = res_d[i] if cell[_RES_PRICED] else None
    row["recorded_priced"] = int(cell[_REC_PRICED])
    row["restated_priced"] = int(cell[_RES_PRICED])
    row["restated_outliers"] = int(cell[_OUTLIERS])
    return row


def restate_report(
    records: Iterable[SpanRecord],
    stats: ReadStats | None = None,
    *,
    calibration: Calibration | None = None,
    rate: Rate | None = None,
    bucket: Bucket = "day",
    by: str | None = None,
    window: Window | None = None,
    config: AttributionConfig | None = None,
) -> Report:
    """The restatement report: recorded and restated figures per bucket, group and version.

    Args:
        records: The spans, streamed.
        stats: The reader's stats.
        calibration: Restate the seconds with these weights (``None`` keeps
            the recorded seconds and only reprices).
        rate: Restate the dollars at this rate (``None`` keeps each span's
            recorded rate).
        bucket: ``day``, ``week`` or ``all``.
        by: Group by this span (else resource) attribute.
        window: Only spans starting in it count.
        config: The allocation key's knobs.

    Raises:
        ValueError: neither a calibration nor a rate is given.
    """
    stats = stats if stats is not None else ReadStats()
    builder = RestateBuilder(
        calibration, rate, bucket=bucket, by=by, window=window, config=config, stats=stats
    ).add_all(records)
    sums = builder.sums
    restated_version = calibration.version if calibration is not None else None
    rows = [_row(k, sums.cells[k], by, restated_version) for k in sorted(sums.cells)]
    totals_cells = totals(sums.cells, _CELL)
    total_rows = [_row(k, totals_cells[k], by, restated_version) for k in sorted(totals_cells)]

    warnings: list[str] = stats.warnings()
    versions: dict[str, int] = {}
    for (_, _, version), cell in sums.cells.items():
        versions[version] = versions.get(version, 0) + int(cell[_REC_REQ])
    consequence = "the recorded figures stay per version, the restated ones all use " + (
        restated_version or "the recorded seconds"
    )
    if (warning := versions_warning(versions, consequence)) is not None:
        warnings.append(warning)
    requests = sum(int(c[_REQ]) for c in sums.cells.values())
    unpriced = requests - sum(int(c[_RES_PRICED]) for c in sums.cells.values())
    if unpriced:
        warnings.append(
            f"{unpriced} requests recorded no rate and none was given: no restated dollars "
            "for them; pass --usd-per-gpu-hour"
        )
    outliers = sum(int(c[_OUTLIERS]) for c in sums.cells.values())
    if outliers:
        warnings.append(
            f"{outliers} requests have a reconciliation factor outside the outlier band "
            "under the restating calibration"
        )
    if sums.no_inputs:
        warnings.append(f"{sums.no_inputs} spans carry no counts or timers to restate")
    if sums.invalid:
        warnings.append(f"{sums.invalid} spans have an invalid value and were skipped")
    input_section = stats.to_dict()
    input_section.update(
        {
            "restated_spans": requests,
            "no_inputs": sums.no_inputs,
            "invalid_spans": sums.invalid,
            "outside_window": sums.outside_window,
            "restated_methods": dict(sorted(sums.methods.items())),
        }
    )
    return Report(
        kind="restate",
        columns=_columns(by),
        rows=rows,
        params={
            "bucket": bucket,
            "by": by,
            "calibration_version": restated_version,
            "calibration_model": calibration.model if calibration is not None else None,
            **rate_params(rate),
            "usd_basis": "rate" if rate is not None else "recorded rate per span",
            **(window or Window()).describe(),
        },
        input=input_section,
        warnings=warnings,
        extra={"totals": total_rows},
    )
