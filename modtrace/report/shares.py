"""Shares: GPU seconds, hypothetical dollars and share per modality, per day or week.

The figures are the attribution as recorded on each span (the span
processor's ``modtrace.attributed.gpu_seconds.<modality>``), summed. Rows
are split by calibration version so that weights of different versions are
never summed together; ``modtrace report restate`` puts them on one footing.

Both the local path (:func:`shares_report`, over span files) and the
ClickHouse path (:mod:`modtrace.report.clickhouse`) fill the same
:class:`SharesSums` and share :func:`finish_shares`, so they agree by
construction beyond the sums themselves.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import semconv
from ..cost import Rate
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
from .spans import ReadStats, SpanRecord

__all__ = [
    "GPU_SECONDS_KEYS",
    "USD_KEYS",
    "SharesBuilder",
    "SharesSums",
    "finish_shares",
    "shares_columns",
    "shares_report",
    "span_usd",
]

#: ``modtrace.attributed.gpu_seconds.<modality>`` in :data:`RESULT_MODALITIES` order.
GPU_SECONDS_KEYS: tuple[str, ...] = tuple(
    semconv.attributed_gpu_seconds(m) for m in RESULT_MODALITIES
)
#: ``modtrace.cost.usd.<modality>`` in :data:`RESULT_MODALITIES` order.
USD_KEYS: tuple[str, ...] = tuple(semconv.cost_usd(m) for m in RESULT_MODALITIES)

_N = len(RESULT_MODALITIES)
#: Layout of one cell of sums: requests, priced requests, seconds x N, dollars x N.
_REQUESTS, _PRICED, _SECONDS, _USD = 0, 1, 2, 2 + _N
_CELL = 2 + 2 * _N


@dataclass
class SharesSums:
    """The sums a shares report is made of: the common ground of both paths.

    Attributes:
        cells: ``(bucket, group, calibration version)`` -> ``[requests, priced
            requests, seconds per modality..., recorded dollars per modality...]``
            in :data:`RESULT_MODALITIES` order.
        unattributed: modtrace spans with counts or timers but no attribution.
        invalid: Attributed spans skipped for a value that is not a
            non-negative finite number.
        outside_window: Spans outside the time window.
        rate_ids: Ids of the rates the recorded dollars were priced at.
    """

    cells: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    unattributed: int = 0
    invalid: int = 0
    outside_window: int = 0
    rate_ids: set[str] = field(default_factory=set)

    def cell(self, key: tuple[str, str, str]) -> list[float]:
        """The sums of ``key``, created empty on first use."""
        return cell_of(self.cells, key, _CELL)


class SharesBuilder(BucketedBuilder):
    """Adds spans to :class:`SharesSums`, one at a time (bounded memory).

    Args:
        bucket: ``day``, ``week`` (Monday, UTC) or ``all``.
        by: A span (else resource) attribute to group by, e.g. ``gen_ai.request.model``.
        window: Only spans that start in it count.
        stats: Receives the count and examples of invalid spans.
    """

    sums_class = SharesSums
    sums: SharesSums

    def add(self, record: SpanRecord) -> None:
        """Add one span's recorded attribution to its cell."""
        sums = self.sums
        if self.outside(record):
            sums.outside_window += 1
            return
        if self.attribution_skipped(record):
            return
        attrs = record.attrs
        if semconv.ATTRIBUTED_METHOD not in attrs:
            sums.unattributed += 1
            return
        number = record.number
        try:
            seconds = [number(k) for k in GPU_SECONDS_KEYS]
            usd = [number(k) for k in USD_KEYS]
            version = record.string(semconv.CALIBRATION_VERSION) or ""
            rate_id = record.string(semconv.COST_RATE_ID)
        except ValueError as exc:
            sums.invalid += 1
            self.skip_invalid(record, exc)
            return
        cell = sums.cell((*self.place(record), version))
        cell[_REQUESTS] += 1
        if semconv.COST_USD_TOTAL in attrs:
            cell[_PRICED] += 1
        for i, s in enumerate(seconds, _SECONDS):
            if s:
                cell[i] += s
        for i, d in enumerate(usd, _USD):
            if d:
                cell[i] += d
        if rate_id is not None:
            sums.rate_ids.add(rate_id)


def span_usd(
    record: SpanRecord, rate: Rate | None, seconds: list[float] | None = None
) -> list[float] | None:
    """Dollars per modality of an attributed span, in :data:`RESULT_MODALITIES` order.

    Its attributed seconds (``seconds`` when already read) at ``rate``; without
    a rate, the dollars it recorded; ``None`` when it recorded none.

    Raises:
        ValueError: a value is not a non-negative finite number.
    """
    number = record.number
    if rate is not None:
        if seconds is None:
            seconds = [number(k) or 0.0 for k in GPU_SECONDS_KEYS]
        per_second = rate.usd_per_gpu_second
        return [s * per_second for s in seconds]
    if semconv.COST_USD_TOTAL in record.attrs:
        return [number(k) or 0.0 for k in USD_KEYS]
    return None


def shares_columns(by: str | None) -> list[str]:
    """The columns of a shares report (the CSV header)."""
    return [
        "bucket",
        *([by] if by else []),
        "calibration_version",
        "requests",
        "gpu_seconds",
        *(f"gpu_seconds.{m}" for m in RESULT_MODALITIES),
        *(f"share.{m}" for m in RESULT_MODALITIES),
        "usd",
        *(f"usd.{m}" for m in RESULT_MODALITIES),
        "priced_requests",
    ]


def _row(
    key: tuple[str, str, str], cell: list[float], by: str | None, rate: Rate | None
) -> dict[str, Any]:
    bucket, group, version = key
    seconds = cell[_SECONDS:_USD]
    total = sum(seconds)
    if rate is not None:
        per_second = rate.usd_per_gpu_second
        usd = [s * per_second for s in seconds]
        priced = cell[_REQUESTS]
    else:
        usd, priced = cell[_USD:], cell[_PRICED]
    row: dict[str, Any] = {"bucket": bucket}
    if by:
        row[by] = group
    row["calibration_version"] = version or None
    row["requests"] = int(cell[_REQUESTS])
    row["gpu_seconds"] = total
    for m, s in zip(RESULT_MODALITIES, seconds, strict=True):
        row[f"gpu_seconds.{m}"] = s
    for m, s in zip(RESULT_MODALITIES, seconds, strict=True):
        row[f"share.{m}"] = ratio(s, total)
    row["usd"] = sum(usd)
    for m, d in zip(RESULT_MODALITIES, usd, strict=True):
        row[f"usd.{m}"] = d
    row["priced_requests"] = int(priced)
    return row


def finish_shares(
    sums: SharesSums,
    *,
    bucket: Bucket,
    by: str | None = None,
    rate: Rate | None = None,
    window: Window | None = None,
    input_stats: dict[str, Any] | None = None,
    source: str = "spans",
) -> Report:
    """Turn sums into the shares report: rows per bucket, totals per group and version.

    Args:
        sums: Sums from :class:`SharesBuilder` or the ClickHouse query.
        bucket: The bucket the sums were made with.
        by: The attribute the sums were grouped by.
        rate: Price every GPU second at this hypothetical rate; without it the
            dollars recorded on the spans are summed.
        window: The time window the sums were restricted to.
        input_stats: The ``input`` section (what reading met).
        source: ``spans`` or ``clickhouse``.
    """
    keys = sorted(sums.cells)
    rows = [_row(k, sums.cells[k], by, rate) for k in keys]
    totals_cells = totals(sums.cells, _CELL)
    total_rows = [_row(k, totals_cells[k], by, rate) for k in sorted(totals_cells)]

    warnings: list[str] = []
    versions: Counter[str] = Counter()
    for (_, _, version), cell in sums.cells.items():
        versions[version] += int(cell[_REQUESTS])
    consequence = (
        "rows are split by version and never summed across versions; restate them onto one "
        "version with `modtrace report restate --calibration FILE`"
    )
    if (warning := versions_warning(versions, consequence)) is not None:
        warnings.append(warning)
    if sums.unattributed:
        warnings.append(
            f"{sums.unattributed} modtrace spans carry counts or timers but no attribution "
            "(no attribution span processor?) and are not in the shares; "
            "`modtrace report restate --calibration FILE` attributes them"
        )
    if sums.invalid:
        warnings.append(f"{sums.invalid} attributed spans have an invalid value and were skipped")
    requests = sum(int(c[_REQUESTS]) for c in sums.cells.values())
    priced = sum(int(c[_PRICED]) for c in sums.cells.values())
    if rate is None:
        if priced < requests:
            warnings.append(
                f"dollars cover the {priced} of {requests} requests that recorded a cost; "
                "pass --usd-per-gpu-hour to price every GPU second at one rate"
            )
        if len(sums.rate_ids) > 1:
            warnings.append(
                f"recorded dollars mix {len(sums.rate_ids)} rates "
                f"({', '.join(sorted(sums.rate_ids))}); pass --usd-per-gpu-hour to use one"
            )
    params: dict[str, Any] = {
        "bucket": bucket,
        "by": by,
        "source": source,
        "usd_basis": "rate" if rate is not None else "recorded",
        **rate_params(rate),
        "rate_ids": sorted(sums.rate_ids) if rate is None else [rate.id],
        **(window or Window()).describe(),
    }
    input_section = dict(input_stats or {})
    input_section.update(
        {
            "attributed_spans": requests,
            "unattributed_spans": sums.unattributed,
            "invalid_spans": sums.invalid,
            "outside_window": sums.outside_window,
        }
    )
    return Report(
        kind="shares",
        columns=shares_columns(by),
        rows=rows,
        params=params,
        input=input_section,
        warnings=warnings,
        extra={"totals": total_rows},
    )


def shares_report(
    records: Iterable[SpanRecord],
    stats: ReadStats | None = None,
    *,
    bucket: Bucket = "day",
    by: str | None = None,
    rate: Rate | None = None,
    window: Window | None = None,
) -> Report:
    """The shares report over spans (from :func:`~modtrace.report.spans.read_spans`).

    Args:
        records: The spans, streamed.
        stats: The reader's stats (filled while ``records`` is consumed).
        bucket: ``day``, ``week`` (Monday, UTC) or ``all``.
        by: Group by this span (else resource) attribute.
        rate: Price every GPU second at this hypothetical rate instead of
            summing the recorded dollars.
        window: Only spans starting in it count.

    Returns:
        Rows per bucket, group and calibration version, with ``totals`` per
        group and version in :attr:`Report.extra`.
    """
    stats = stats if stats is not None else ReadStats()
    builder = SharesBuilder(bucket=bucket, by=by, window=window, stats=stats).add_all(records)
    report = finish_shares(
        builder.sums,
        bucket=bucket,
        by=by,
        rate=rate,
        window=window,
        input_stats=stats.to_dict(),
    )
    report.warnings[:0] = stats.warnings()
    return report
