"""Drift: units per request and shares over time, with a flag where they shift.

A blended per-request price hides a change in the mix: after a feature
launch, vision tokens per request can climb while tokens per request look
flat. This report follows, per bucket (and group):

* ``<unit>/request`` for every unit seen (``text.tokens/request``,
  ``image.tokens/request``, ``audio.seconds/request``...), from the raw
  counts on the spans: independent of any calibration;
* ``tokens/request``: every modality's tokens together, the blended view;
* ``gpu_seconds/request``: the measured GPU seconds;
* ``share.<modality>``: the share of attributed GPU seconds, per calibration
  version (a new version is a new series: weights never mix).

Each bucket is compared with a baseline (the first buckets). A per-request
metric is flagged when it moves by more than ``threshold`` (relative) AND
the move is significant: larger than ``z`` standard errors of the
difference of the two means (per-request variances from sums of squares),
so a handful of rare requests (three audio clips instead of one) does not
raise an alarm. A share is flagged when it moves by more than
``share_threshold`` (absolute). Every flag
carries its evidence: the baseline, the value, the change, the requests on
both sides, and notes (a blended view that hides it, a change of counter
version that may explain it).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import semconv
from ..units import MODALITIES, UNIT_NAMES, modality_of
from .base import RESULT_MODALITIES, Bucket, BucketedBuilder, Report, Window, cell_of, ratio
from .shares import GPU_SECONDS_KEYS
from .spans import ReadStats, SpanRecord

__all__ = ["DriftBuilder", "DriftConfig", "DriftSums", "drift_report", "finish_drift"]

UNIT_KEYS: tuple[str, ...] = tuple(semconv.unit(u) for u in UNIT_NAMES)
TOKEN_UNITS: tuple[str, ...] = tuple(u for u in UNIT_NAMES if u.endswith(".tokens"))
_TOKEN_INDEXES = tuple(UNIT_NAMES.index(u) for u in TOKEN_UNITS)
_COUNTER_KEYS: tuple[str, ...] = tuple(semconv.unit_counter(m) for m in MODALITIES)

#: Layout of a units cell: requests, measured requests, measured seconds and its square,
#: all tokens of a request squared, then units and their squares (UNIT_NAMES order).
_REQ, _MREQ, _MSEC, _MSEC2, _TOK2, _UNITS = 0, 1, 2, 3, 4, 5
_SQUARES = _UNITS + len(UNIT_NAMES)
_UNIT_CELL = _SQUARES + len(UNIT_NAMES)

#: Layout of a shares cell: requests, seconds per modality.
_SHARE_CELL = 1 + len(RESULT_MODALITIES)


@dataclass(frozen=True)
class DriftConfig:
    """When a shift is flagged.

    Attributes:
        threshold: Relative change of a per-request metric that is flagged
            (0.25: a 25% rise or fall against the baseline).
        share_threshold: Absolute change of a share that is flagged (0.10: ten
            percentage points).
        min_requests: Buckets with fewer requests are reported, never flagged
            (and never used as a baseline).
        baseline_buckets: How many of the first buckets, pooled, make the
            baseline.
        z: Standard errors a per-request metric's move must exceed (3: a
            chance move this large happens about 3 times in 1000).
    """

    threshold: float = 0.25
    share_threshold: float = 0.10
    min_requests: int = 30
    baseline_buckets: int = 1
    z: float = 3.0

    def __post_init__(self) -> None:
        for name in ("threshold", "share_threshold", "z"):
            value = getattr(self, name)
            if not value > 0:
                msg = f"{name}: must be above 0, got {value!r}"
                raise ValueError(msg)
        if self.min_requests < 1 or self.baseline_buckets < 1:
            msg = "min_requests and baseline_buckets must be at least 1"
            raise ValueError(msg)


@dataclass
class DriftSums:
    """Sums per bucket: the raw counts, the measured seconds and the attributed seconds.

    Attributes:
        units: ``(bucket, group)`` -> ``[requests, measured requests, measured
            seconds, units...]`` (units in :data:`~modtrace.units.UNIT_NAMES` order).
        shares: ``(bucket, group, calibration version)`` -> ``[requests,
            seconds per modality...]``.
        counters: ``(bucket, group)`` -> modality -> counter refs (``id@version``) seen.
        invalid: Spans skipped for an invalid value.
        outside_window: Spans outside the time window.
    """

    units: dict[tuple[str, str], list[float]] = field(default_factory=dict)
    shares: dict[tuple[str, str, str], list[float]] = field(default_factory=dict)
    counters: dict[tuple[str, str], dict[str, set[str]]] = field(default_factory=dict)
    invalid: int = 0
    outside_window: int = 0


class DriftBuilder(BucketedBuilder):
    """Adds spans to :class:`DriftSums` (bounded memory: one cell per bucket and group)."""

    sums_class = DriftSums
    sums: DriftSums

    def __init__(
        self,
        *,
        bucket: Bucket = "day",
        by: str | None = None,
        window: Window | None = None,
        stats: ReadStats | None = None,
    ) -> None:
        if bucket == "all":
            msg = "drift needs time buckets: use --bucket day or week"
            raise ValueError(msg)
        super().__init__(bucket=bucket, by=by, window=window, stats=stats)

    def add(self, record: SpanRecord) -> None:
        """Add one span's counts, measured seconds and attributed seconds."""
        sums = self.sums
        if self.outside(record):
            sums.outside_window += 1
            return
        if self.attribution_skipped(record):
            return
        number = record.number
        attributed = semconv.ATTRIBUTED_METHOD in record.attrs
        try:
            units = [number(k) for k in UNIT_KEYS]
            measured = number(semconv.GPU_SECONDS)
            seconds = [number(k) for k in GPU_SECONDS_KEYS] if attributed else None
        except ValueError as exc:
            sums.invalid += 1
            self.skip_invalid(record, exc)
            return
        bucket, group = self.place(record)
        if any(u is not None for u in units):
            cell = cell_of(sums.units, (bucket, group), _UNIT_CELL)
            cell[_REQ] += 1
            if measured is not None:
                cell[_MREQ] += 1
                cell[_MSEC] += measured
                cell[_MSEC2] += measured * measured
            for i, u in enumerate(units):
                if u:
                    cell[_UNITS + i] += u
                    cell[_SQUARES + i] += u * u
            tokens = sum(units[i] or 0.0 for i in _TOKEN_INDEXES)
            cell[_TOK2] += tokens * tokens
            refs = sums.counters.setdefault((bucket, group), {})
            for modality, key in zip(MODALITIES, _COUNTER_KEYS, strict=True):
                if key in record.attrs:
                    refs.setdefault(modality, set()).add(record.string(key) or "")
        if seconds is not None:
            version = record.string(semconv.CALIBRATION_VERSION) or ""
            share = cell_of(sums.shares, (bucket, group, version), _SHARE_CELL)
            share[0] += 1
            for i, s in enumerate(seconds, 1):
                if s:
                    share[i] += s


# --- Finishing: metrics per bucket, baseline, flags ------------------------------------------
@dataclass
class _Point:
    """One metric in one bucket, before comparison with the baseline."""

    numerator: float
    denominator: float
    requests: int
    #: Sum of squared per-request values, for per-request means (else ``None``).
    squares: float | None = None

    @property
    def value(self) -> float | None:
        return ratio(self.numerator, self.denominator)

    @property
    def variance_of_mean(self) -> float | None:
        """Squared standard error of a per-request mean; ``None`` for ratios of sums."""
        n = self.denominator
        if self.squares is None or n < 2:
            return None
        mean = self.numerator / n
        variance = max(self.squares - n * mean * mean, 0.0) / (n - 1)
        return variance / n


def _unit_points(cell: list[float], units_seen: list[int]) -> dict[str, _Point]:
    requests = int(cell[_REQ])
    points = {
        f"{UNIT_NAMES[i]}/request": _Point(cell[_UNITS + i], requests, requests, cell[_SQUARES + i])
        for i in units_seen
    }
    tokens = sum(cell[_UNITS + i] for i in _TOKEN_INDEXES)
    points["tokens/request"] = _Point(tokens, requests, requests, cell[_TOK2])
    if cell[_MREQ]:
        points["gpu_seconds/request"] = _Point(
            cell[_MSEC], cell[_MREQ], int(cell[_MREQ]), cell[_MSEC2]
        )
    return points


def _share_points(cell: list[float], modalities_seen: list[int]) -> dict[str, _Point]:
    total = sum(cell[1:])
    if total <= 0:
        return {}
    requests = int(cell[0])
    return {
        f"share.{RESULT_MODALITIES[i]}": _Point(cell[1 + i], total, requests)
        for i in modalities_seen
    }


def _pool(points: list[_Point]) -> _Point:
    squares = [p.squares for p in points]
    return _Point(
        sum(p.numerator for p in points),
        sum(p.denominator for p in points),
        sum(p.requests for p in points),
        None if None in squares else sum(squares),  # type: ignore[arg-type]
    )


def _significant(point: _Point, base: _Point, change: float, z: float) -> bool:
    """Whether ``change`` exceeds ``z`` standard errors of the difference of two means."""
    a, b = point.variance_of_mean, base.variance_of_mean
    if a is None or b is None:
        return True  # not a per-request mean: the threshold alone decides
    return abs(change) > z * (a + b) ** 0.5


def _series(
    cells: dict[Any, dict[str, _Point]], config: DriftConfig
) -> list[tuple[Any, dict[str, _Point], dict[str, _Point] | None, list[Any]]]:
    """Each bucket of one series with its baseline: ``(key, points, baseline, baseline keys)``."""
    keys = sorted(cells)
    eligible = [k for k in keys if _requests(cells[k]) >= config.min_requests]
    base_keys = eligible[: config.baseline_buckets]
    baseline: dict[str, _Point] | None = None
    if base_keys:
        metrics = {m for k in base_keys for m in cells[k]}
        baseline = {
            m: _pool([cells[k][m] for k in base_keys if m in cells[k]]) for m in sorted(metrics)
        }
    return [(k, cells[k], baseline, base_keys) for k in keys]


def _requests(points: dict[str, _Point]) -> int:
    return max((p.requests for p in points.values()), default=0)


def _compare(
    metric: str, point: _Point, base: _Point | None, config: DriftConfig
) -> tuple[float | None, float | None, bool]:
    """``(change, relative change, flagged)`` of a point against its baseline point."""
    value = point.value
    if base is None or value is None or base.value is None:
        return None, None, False
    change = value - base.value
    relative = ratio(change, base.value)
    if metric.startswith("share."):
        return change, relative, abs(change) >= config.share_threshold
    significant = _significant(point, base, change, config.z)
    if base.value == 0:
        return change, None, value > 0 and significant  # appeared where the baseline had none
    beyond = relative is not None and abs(relative) >= config.threshold
    return change, relative, beyond and significant


def finish_drift(
    sums: DriftSums,
    *,
    bucket: Bucket,
    by: str | None = None,
    config: DriftConfig | None = None,
    window: Window | None = None,
    input_stats: dict[str, Any] | None = None,
) -> Report:
    """Turn sums into the drift report: long rows (one per bucket and metric) and flags."""
    config = config or DriftConfig()
    units_seen = sorted(
        {i for cell in sums.units.values() for i in range(len(UNIT_NAMES)) if cell[_UNITS + i]}
    )
    modalities_seen = sorted(
        {i for cell in sums.shares.values() for i in range(len(RESULT_MODALITIES)) if cell[1 + i]}
    )
    groups = sorted({g for _, g in sums.units} | {g for _, g, _ in sums.shares})
    rows: list[dict[str, Any]] = []
    flags: list[dict[str, Any]] = []
    had_baseline = False
    for group in groups:
        unit_cells = {
            b: _unit_points(cell, units_seen) for (b, g), cell in sums.units.items() if g == group
        }
        series = [("", unit_cells)]
        versions = sorted({v for _, g, v in sums.shares if g == group})
        for version in versions:
            share_cells = {
                b: _share_points(cell, modalities_seen)
                for (b, g, v), cell in sums.shares.items()
                if g == group and v == version
            }
            series.append((version, share_cells))
        group_rows: list[dict[str, Any]] = []
        for version, cells in series:
            for key, points, baseline, base_keys in _series(cells, config):
                had_baseline |= bool(base_keys)
                for metric, point in points.items():
                    base = baseline.get(metric) if baseline else None
                    in_baseline = key in base_keys
                    change, relative, flagged = _compare(metric, point, base, config)
                    enough = point.requests >= config.min_requests
                    flagged = flagged and enough and not in_baseline
                    row: dict[str, Any] = {"bucket": key}
                    if by:
                        row[by] = group
                    row.update(
                        {
                            "metric": metric,
                            "calibration_version": (version or None)
                            if metric.startswith("share.")
                            else None,
                            "requests": point.requests,
                            "value": point.value,
                            "baseline": base.value if base else None,
                            "change": None if in_baseline else change,
                            "relative_change": None if in_baseline else relative,
                            "flagged": flagged,
                        }
                    )
                    group_rows.append(row)
                    if flagged:
                        flags.append(
                            {
                                **row,
                                "baseline_buckets": list(base_keys),
                                "baseline_requests": base.requests if base else 0,
                                "notes": [],
                            }
                        )
        rows.extend(group_rows)
    _annotate(flags, rows, sums, by)
    rows.sort(key=lambda r: (r.get(by, "") if by else "", r["bucket"], _metric_order(r)))
    warnings: list[str] = []
    versions_all = sorted({v for _, _, v in sums.shares})
    if len(versions_all) > 1:
        warnings.append(
            f"spans carry {len(versions_all)} calibration versions "
            f"({', '.join(v or '(none)' for v in versions_all)}): each share series stays "
            "within one version; per-request units do not depend on calibration"
        )
    if sums.invalid:
        warnings.append(f"{sums.invalid} spans have an invalid value and were skipped")
    thin = sorted({r["bucket"] for r in rows if r["requests"] < config.min_requests})
    if thin:
        warnings.append(
            f"{len(thin)} buckets have fewer than {config.min_requests} requests and are "
            f"never flagged: {', '.join(thin[:6])}{' ...' if len(thin) > 6 else ''}"
        )
    if rows and not had_baseline:
        warnings.append(
            f"no bucket has {config.min_requests} requests: there is no baseline to compare with"
        )
    input_section = dict(input_stats or {})
    input_section.update({"invalid_spans": sums.invalid, "outside_window": sums.outside_window})
    return Report(
        kind="drift",
        columns=[
            "bucket",
            *([by] if by else []),
            "metric",
            "calibration_version",
            "requests",
            "value",
            "baseline",
            "change",
            "relative_change",
            "flagged",
        ],
        rows=rows,
        params={
            "bucket": bucket,
            "by": by,
            "threshold": config.threshold,
            "share_threshold": config.share_threshold,
            "min_requests": config.min_requests,
            "baseline_buckets": config.baseline_buckets,
            "z": config.z,
            **(window or Window()).describe(),
        },
        input=input_section,
        warnings=warnings,
        extra={"drift_detected": bool(flags), "flags": flags, "summary": _summary(flags, by)},
    )


def _metric_order(row: dict[str, Any]) -> tuple[int, str, str]:
    metric = row["metric"]
    rank = 0 if metric.endswith("/request") else 1
    return rank, row["calibration_version"] or "", metric


def _annotate(
    flags: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    sums: DriftSums,
    by: str | None,
) -> None:
    """Add the notes that make a flag evidence: the blended view, a counter change."""
    blended = {
        (r["bucket"], r.get(by, "") if by else ""): r
        for r in rows
        if r["metric"] == "tokens/request"
    }
    for flag in flags:
        metric, group = flag["metric"], flag.get(by, "") if by else ""
        if not metric.endswith("/request") or metric in ("tokens/request", "gpu_seconds/request"):
            continue
        tokens = blended.get((flag["bucket"], group))
        if tokens is not None and not tokens["flagged"] and tokens["relative_change"] is not None:
            flag["notes"].append(
                f"tokens/request moved only {tokens['relative_change']:+.1%} in the same bucket: "
                "a blended per-request view hides this shift"
            )
        modality = modality_of(metric.removesuffix("/request"))
        here = sums.counters.get((flag["bucket"], group), {}).get(modality, set())
        before: set[str] = set()
        for b in flag["baseline_buckets"]:
            before |= sums.counters.get((b, group), {}).get(modality, set())
        if here and before and here != before:
            flag["notes"].append(
                f"{modality} was counted by {', '.join(sorted(here))} here but by "
                f"{', '.join(sorted(before))} in the baseline: the shift may be a change of "
                "counting, not of traffic"
            )


def _summary(flags: list[dict[str, Any]], by: str | None) -> list[str]:
    """One sentence per flagged series: its largest move."""
    largest: dict[tuple[str, str, str], dict[str, Any]] = {}
    for flag in flags:
        key = (flag.get(by, "") if by else "", flag["metric"], flag["calibration_version"] or "")
        current = largest.get(key)
        if current is None or abs(flag["change"] or 0) > abs(current["change"] or 0):
            largest[key] = flag
    lines = []
    for (group, metric, version), flag in largest.items():
        if metric.startswith("share."):
            move = (
                f"{flag['baseline']:.1%} -> {flag['value']:.1%} "
                f"({flag['change'] * 100:+.1f} points)"
            )
        elif flag["relative_change"] is None:
            move = f"appeared: 0 -> {flag['value']:.4g}"
        else:
            move = f"{flag['baseline']:.4g} -> {flag['value']:.4g} ({flag['relative_change']:+.0%})"
        where = "".join(f" [{x}]" for x in (group, version) if x)
        note = f"; {flag['notes'][0]}" if flag["notes"] else ""
        lines.append(f"{metric}{where}: {move} by {flag['bucket']}{note}")
    return lines


def drift_report(
    records: Iterable[SpanRecord],
    stats: ReadStats | None = None,
    *,
    bucket: Bucket = "day",
    by: str | None = None,
    config: DriftConfig | None = None,
    window: Window | None = None,
) -> Report:
    """The drift report over spans.

    Args:
        records: The spans, streamed.
        stats: The reader's stats.
        bucket: ``day`` or ``week``.
        by: Follow each value of this attribute as its own series.
        config: Thresholds, minimum requests and baseline size.
        window: Only spans starting in it count.
    """
    stats = stats if stats is not None else ReadStats()
    builder = DriftBuilder(bucket=bucket, by=by, window=window, stats=stats).add_all(records)
    report = finish_drift(
        builder.sums,
        bucket=bucket,
        by=by,
        config=config,
        window=window,
        input_stats=stats.to_dict(),
    )
    report.warnings[:0] = stats.warnings()
    return report
