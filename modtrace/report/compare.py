"""Compare: two windows, or two values of an attribute, modality line by modality line.

Each optimization should move its own modality's line: an image resolution
cap should lower ``gpu_seconds.image/request`` and ``image.tokens/request``
and leave text alone. Figures are per request so that sides of different
sizes compare. A side is a time window (``2026-01-01..2026-01-08``), an
attribute value (``app.image_cap=on``) or both (``app.image_cap=on,2026-01-08..``).

The two sides are compared as recorded unless a calibration is given: then
both are restated with it first, so that a change of weights between the
windows is not read as a change of traffic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .. import semconv
from ..attribution import AttributionConfig
from ..calibration import Calibration
from ..cost import Rate
from ..units import UNIT_NAMES, modality_of
from .base import RESULT_MODALITIES, Report, SpanBuilder, Window, rate_params, ratio
from .restate import restate_span
from .shares import GPU_SECONDS_KEYS, span_usd
from .spans import ReadStats, SpanRecord

__all__ = ["CompareBuilder", "Side", "compare_report"]

_UNIT_KEYS: tuple[str, ...] = tuple(semconv.unit(u) for u in UNIT_NAMES)


@dataclass(frozen=True)
class Side:
    """One side of a comparison: spans in a window and with given attribute values.

    Attributes:
        label: How the side is named in the report (the spec by default).
        window: Span start times that belong to the side.
        match: ``(attribute, value)`` pairs the span (else its resource) must
            carry, compared as text (the collector's ``AsString``).
    """

    label: str
    window: Window = field(default_factory=Window)
    match: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, spec: str, label: str | None = None) -> Side:
        """Parse ``START..END`` and ``KEY=VALUE`` terms separated by commas.

        Either end of a window may be left out (``2026-01-08..``).

        >>> Side.parse("app.cap=on,2026-01-01..2026-01-08").match
        (('app.cap', 'on'),)

        Raises:
            ValueError: a term is neither a window nor ``KEY=VALUE``.
        """
        since: str | None = None
        until: str | None = None
        match: list[tuple[str, str]] = []
        for term in (t.strip() for t in spec.split(",")):
            if not term:
                continue
            key, eq, value = term.partition("=")
            if eq and key.strip():
                match.append((key.strip(), value.strip()))
            elif ".." in term:
                start, _, end = term.partition("..")
                since, until = start.strip() or None, end.strip() or None
            else:
                msg = f"{spec!r}: expected START..END or KEY=VALUE terms, got {term!r}"
                raise ValueError(msg)
        if not match and since is None and until is None:
            msg = f"{spec!r}: a side needs a window (START..END) or KEY=VALUE"
            raise ValueError(msg)
        return cls(label or spec, Window.parse(since, until), tuple(match))

    def __contains__(self, record: SpanRecord) -> bool:
        if self.window.bounded and record.start_ns not in self.window:
            return False
        return all(record.group(key) == value for key, value in self.match)

    def describe(self) -> dict[str, Any]:
        """The side as JSON: label, window and attribute values."""
        return {"label": self.label, **self.window.describe(), "match": dict(self.match)}


@dataclass
class _Tally:
    """What one side adds up."""

    requests: int = 0
    seconds: list[float] = field(default_factory=lambda: [0.0] * len(RESULT_MODALITIES))
    usd: list[float] = field(default_factory=lambda: [0.0] * len(RESULT_MODALITIES))
    priced: int = 0
    units: list[float] = field(default_factory=lambda: [0.0] * len(UNIT_NAMES))
    versions: Counter[str] = field(default_factory=Counter)


class CompareBuilder(SpanBuilder):
    """Adds spans to the two sides (a span may belong to both)."""

    def __init__(
        self,
        a: Side,
        b: Side,
        *,
        calibration: Calibration | None = None,
        rate: Rate | None = None,
        config: AttributionConfig | None = None,
        stats: ReadStats | None = None,
    ) -> None:
        super().__init__(stats=stats)
        self.sides = (a, b)
        self.tallies = (_Tally(), _Tally())
        self.calibration = calibration
        self.rate = rate
        self.config = config
        self.unattributed = 0
        self.invalid = 0
        self.neither = 0

    def _figures(
        self, record: SpanRecord
    ) -> tuple[str, list[float], list[float] | None, list[float]] | None:
        """``(version, seconds, dollars or None, units)`` of a span, or ``None`` if unattributed."""
        number = record.number
        units = [number(k) or 0.0 for k in _UNIT_KEYS]
        if self.calibration is not None:
            result = restate_span(record, self.calibration, self.rate, config=self.config)
            seconds = [result.restated.gpu_seconds.get(m, 0.0) for m in RESULT_MODALITIES]
            usd = (
                [result.restated_usd.get(m, 0.0) for m in RESULT_MODALITIES]
                if result.restated_usd is not None
                else None
            )
            return self.calibration.version, seconds, usd, units
        if semconv.ATTRIBUTED_METHOD not in record.attrs:
            return None
        seconds = [number(k) or 0.0 for k in GPU_SECONDS_KEYS]
        usd = span_usd(record, self.rate, seconds)
        return record.string(semconv.CALIBRATION_VERSION) or "", seconds, usd, units

    def add(self, record: SpanRecord) -> None:
        """Add a span to each side it belongs to."""
        member = [record in side for side in self.sides]
        if not any(member):
            self.neither += 1
            return
        if self.attribution_skipped(record):
            return
        try:
            figures = self._figures(record)
        except ValueError as exc:
            self.invalid += 1
            self.skip_invalid(record, exc)
            return
        if figures is None:
            self.unattributed += 1
            return
        version, seconds, usd, units = figures
        for inside, tally in zip(member, self.tallies, strict=True):
            if not inside:
                continue
            tally.requests += 1
            tally.versions[version] += 1
            for i, s in enumerate(seconds):
                tally.seconds[i] += s
            if usd is not None:
                tally.priced += 1
                for i, d in enumerate(usd):
                    tally.usd[i] += d
            for i, u in enumerate(units):
                tally.units[i] += u


def _lines(a: _Tally, b: _Tally) -> list[tuple[str, str | None, float | None, float | None]]:
    """``(metric, modality, a, b)`` lines, overall first, then modality by modality."""
    lines: list[tuple[str, str | None, float | None, float | None]] = [
        ("requests", None, a.requests, b.requests),
        ("gpu_seconds", None, sum(a.seconds), sum(b.seconds)),
        (
            "gpu_seconds/request",
            None,
            ratio(sum(a.seconds), a.requests),
            ratio(sum(b.seconds), b.requests),
        ),
    ]
    priced = a.priced and b.priced
    if priced:
        lines.append(
            ("usd/request", None, ratio(sum(a.usd), a.priced), ratio(sum(b.usd), b.priced))
        )
    a_total, b_total = sum(a.seconds), sum(b.seconds)
    for i, m in enumerate(RESULT_MODALITIES):
        units = [
            j
            for j, u in enumerate(UNIT_NAMES)
            if modality_of(u) == m and (a.units[j] or b.units[j])
        ]
        if not (a.seconds[i] or b.seconds[i] or units):
            continue
        lines.append(
            (
                f"gpu_seconds.{m}/request",
                m,
                ratio(a.seconds[i], a.requests),
                ratio(b.seconds[i], b.requests),
            )
        )
        lines.append((f"share.{m}", m, ratio(a.seconds[i], a_total), ratio(b.seconds[i], b_total)))
        if priced:
            lines.append(
                (f"usd.{m}/request", m, ratio(a.usd[i], a.priced), ratio(b.usd[i], b.priced))
            )
        lines.extend(
            (
                f"{UNIT_NAMES[j]}/request",
                m,
                ratio(a.units[j], a.requests),
                ratio(b.units[j], b.requests),
            )
            for j in units
        )
    return lines


def compare_report(
    records: Iterable[SpanRecord],
    stats: ReadStats | None = None,
    *,
    a: Side,
    b: Side,
    calibration: Calibration | None = None,
    rate: Rate | None = None,
    config: AttributionConfig | None = None,
) -> Report:
    """Compare side ``a`` (before) with side ``b`` (after), modality line by modality line.

    Args:
        records: The spans, streamed.
        stats: The reader's stats.
        a: The first side (before).
        b: The second side (after).
        calibration: Restate both sides with these weights first.
        rate: Price every GPU second at this hypothetical rate (else the
            recorded dollars, or the recorded rate when restating).
        config: The allocation key's knobs (when restating).
    """
    stats = stats if stats is not None else ReadStats()
    builder = CompareBuilder(
        a, b, calibration=calibration, rate=rate, config=config, stats=stats
    ).add_all(records)
    ta, tb = builder.tallies
    rows = []
    for metric, modality, va, vb in _lines(ta, tb):
        change = None if va is None or vb is None else vb - va
        rows.append(
            {
                "metric": metric,
                "modality": modality,
                "a": va,
                "b": vb,
                "change": change,
                "relative_change": None if change is None or not va else change / va,
            }
        )
    warnings: list[str] = stats.warnings()
    for side, tally in zip((a, b), (ta, tb), strict=True):
        if not tally.requests:
            warnings.append(f"side {side.label!r} has no attributed requests")
    versions = set(ta.versions) | set(tb.versions)
    if calibration is None and len(versions) > 1:
        warnings.append(
            f"the sides were attributed with {len(versions)} calibration versions "
            f"(a: {', '.join(sorted(v or '(none)' for v in ta.versions))}; "
            f"b: {', '.join(sorted(v or '(none)' for v in tb.versions))}): modality lines mix "
            "a change of weights with a change of traffic; pass --calibration FILE to restate "
            "both sides with one"
        )
    if (ta.requests and ta.priced < ta.requests) or (tb.requests and tb.priced < tb.requests):
        warnings.append(
            "some requests have no dollars (no recorded cost or rate): dollar lines are per "
            "priced request; pass --usd-per-gpu-hour to price all"
        )
    if builder.unattributed:
        warnings.append(
            f"{builder.unattributed} spans in the sides carry no attribution and were left out; "
            "pass --calibration FILE to attribute them"
        )
    if builder.invalid:
        warnings.append(f"{builder.invalid} spans have an invalid value and were skipped")
    input_section = stats.to_dict()
    input_section.update(
        {
            "a_requests": ta.requests,
            "b_requests": tb.requests,
            "unattributed_spans": builder.unattributed,
            "invalid_spans": builder.invalid,
            "outside_both": builder.neither,
        }
    )
    return Report(
        kind="compare",
        columns=["metric", "modality", "a", "b", "change", "relative_change"],
        rows=rows,
        params={
            "a": a.describe(),
            "b": b.describe(),
            "calibration_version": calibration.version if calibration is not None else None,
            **rate_params(rate),
            "a_calibration_versions": dict(sorted(ta.versions.items())),
            "b_calibration_versions": dict(sorted(tb.versions.items())),
        },
        input=input_section,
        warnings=warnings,
    )
