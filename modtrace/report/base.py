"""What every report shares: time buckets, windows, grouping and the report object."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from ..units import MODALITIES, UNKNOWN
from .spans import ReadStats, SpanRecord

if TYPE_CHECKING:
    from ..cost import Rate

__all__ = [
    "BUCKETS",
    "RESULT_MODALITIES",
    "Bucket",
    "BucketedBuilder",
    "Bucketer",
    "Report",
    "SpanBuilder",
    "Window",
    "cell_of",
    "parse_time",
    "rate_params",
    "ratio",
    "totals",
    "versions_warning",
]

Bucket = Literal["day", "week", "all"]
#: Time buckets a report can split by. ``week`` starts on Monday (ISO 8601), UTC.
BUCKETS: tuple[str, ...] = ("day", "week", "all")
#: The modalities a report has a column for, ``unknown`` included (seconds no
#: modality could carry are reported, never dropped).
RESULT_MODALITIES: tuple[str, ...] = (*MODALITIES, UNKNOWN)

K = TypeVar("K", bound=Hashable)
B = TypeVar("B", bound="SpanBuilder")

NS_PER_SECOND = 1_000_000_000
NS_PER_DAY = 86_400 * NS_PER_SECOND
_EPOCH = date(1970, 1, 1)
#: Label of the single bucket of ``--bucket all``.
ALL = "all"


def ratio(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator``, or ``None`` when the denominator is 0."""
    return numerator / denominator if denominator else None


def day_label(day_index: int) -> str:
    """ISO date of the day ``day_index`` days after 1970-01-01."""
    return (_EPOCH + timedelta(days=day_index)).isoformat()


class Bucketer:
    """Maps a span's start time (ns since the epoch, UTC) to its bucket label.

    Labels are ISO dates: the day, or the Monday of the ISO week; ``all`` for
    one bucket. The ClickHouse path uses ``toDate`` and ``toMonday`` in UTC:
    the same labels.
    """

    __slots__ = ("_cache", "bucket")

    def __init__(self, bucket: Bucket) -> None:
        if bucket not in BUCKETS:
            msg = f"bucket: expected one of {', '.join(BUCKETS)}, got {bucket!r}"
            raise ValueError(msg)
        self.bucket = bucket
        self._cache: dict[int, str] = {}

    def __call__(self, start_ns: int) -> str:
        """The bucket label of a start time."""
        if self.bucket == "all":
            return ALL
        day = start_ns // NS_PER_DAY
        label = self._cache.get(day)
        if label is None:
            # 1970-01-01 was a Thursday: weekday (Monday = 0) is (day + 3) % 7.
            first = day - (day + 3) % 7 if self.bucket == "week" else day
            label = self._cache[day] = day_label(first)
        return label


def parse_time(text: str) -> int:
    """An ISO 8601 date or date-time as ns since the epoch; naive times are UTC.

    >>> parse_time("1970-01-02")
    86400000000000

    Raises:
        ValueError: ``text`` is not an ISO date or date-time.
    """
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        msg = f"{text!r} is not an ISO date or date-time (e.g. 2026-01-05 or 2026-01-05T12:00)"
        raise ValueError(msg) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    delta = moment - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * NS_PER_SECOND + delta.microseconds * 1000


@dataclass(frozen=True)
class Window:
    """A half-open time window ``[since, until)`` on span start times, in ns (UTC).

    ``None`` leaves a side open.
    """

    since_ns: int | None = None
    until_ns: int | None = None

    @classmethod
    def parse(cls, since: str | None = None, until: str | None = None) -> Window:
        """A window from ISO dates or date-times (see :func:`parse_time`)."""
        window = cls(
            parse_time(since) if since else None,
            parse_time(until) if until else None,
        )
        since_ns, until_ns = window.since_ns, window.until_ns
        if since_ns is not None and until_ns is not None and until_ns <= since_ns:
            msg = f"the window is empty: until {until} is not after since {since}"
            raise ValueError(msg)
        return window

    def __contains__(self, start_ns: int) -> bool:
        return (self.since_ns is None or start_ns >= self.since_ns) and (
            self.until_ns is None or start_ns < self.until_ns
        )

    @property
    def bounded(self) -> bool:
        """Whether either side is set."""
        return self.since_ns is not None or self.until_ns is not None

    def describe(self) -> dict[str, str | None]:
        """The window as ISO date-times (UTC), for the report's parameters."""

        def iso(ns: int | None) -> str | None:
            if ns is None:
                return None
            moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(microseconds=ns // 1000)
            return moment.isoformat().replace("+00:00", "Z")

        return {"since": iso(self.since_ns), "until": iso(self.until_ns)}


@dataclass
class Report:
    """The result of one report, ready to render as a table, JSON, CSV or a chart.

    Attributes:
        kind: ``shares``, ``drift``, ``restate``, ``compare`` or ``subsidy``.
        columns: Column names of :attr:`rows`, in order (the CSV header).
        rows: The report's rows, one flat dict each (``gpu_seconds.image``...).
        params: What the report was asked for (bucket, group-by attribute, rate...).
        input: What reading the spans met (counts of spans, broken lines...).
        warnings: Things the reader must know: mixed calibration versions,
            spans skipped, dollars at mixed rates. Never silent.
        extra: Report-specific sections (totals, drift flags, subsidy transfers).
        hypothetical: Dollars are planning figures, never invoices.
    """

    kind: str
    columns: list[str]
    rows: list[dict[str, Any]]
    params: dict[str, Any] = field(default_factory=dict)
    input: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    hypothetical: bool = True

    def to_dict(self) -> dict[str, Any]:
        """The documented JSON object of the report."""
        return {
            "report": self.kind,
            "hypothetical": self.hypothetical,
            "params": self.params,
            "input": self.input,
            "warnings": self.warnings,
            "columns": self.columns,
            "rows": self.rows,
            **self.extra,
        }


def versions_warning(requests: Mapping[str, int], consequence: str) -> str | None:
    """The warning for spans of several calibration versions, or ``None`` for one.

    Args:
        requests: Requests per calibration version (``""`` for none).
        consequence: What the report does about it.
    """
    if len(requests) < 2:
        return None
    listed = ", ".join(f"{v or '(none)'}: {n} requests" for v, n in sorted(requests.items()))
    return f"spans carry {len(requests)} calibration versions ({listed}); {consequence}"


def rate_params(rate: Rate | None) -> dict[str, Any]:
    """The rate a report priced at, for its parameters (``None`` values without one)."""
    return {
        "usd_per_gpu_hour": rate.usd_per_gpu_hour if rate is not None else None,
        "rate_id": rate.id if rate is not None else None,
    }


# --- Sums: cells of floats per key, and the builders that fill them ---------------------------
def cell_of(cells: dict[K, list[float]], key: K, width: int) -> list[float]:
    """The sums of ``key`` in ``cells``, created as ``width`` zeros on first use."""
    found = cells.get(key)
    if found is None:
        found = cells[key] = [0.0] * width
    return found


def totals(
    cells: Mapping[tuple[str, str, str], list[float]], width: int
) -> dict[tuple[str, str, str], list[float]]:
    """``(bucket, group, version)`` cells summed over buckets, as ``("total", group, version)``."""
    out: dict[tuple[str, str, str], list[float]] = {}
    for (_, group, version), sums in cells.items():
        total = cell_of(out, ("total", group, version), width)
        for i, value in enumerate(sums):
            total[i] += value
    return out


class SpanBuilder:
    """What every report builder shares: the time window, the reader's stats, ``add_all``.

    Subclasses define :meth:`add` (one span into their sums, bounded memory)
    and count the spans they leave out with :meth:`outside`,
    :meth:`attribution_skipped` and :meth:`skip_invalid`.

    Args:
        window: Only spans that start in it count.
        stats: Receives the count and examples of invalid spans.
    """

    def __init__(self, *, window: Window | None = None, stats: ReadStats | None = None) -> None:
        self.window = window if window is not None and window.bounded else None
        self.stats = stats if stats is not None else ReadStats()

    def add(self, record: SpanRecord) -> None:
        """Add one span."""
        raise NotImplementedError

    def add_all(self: B, records: Iterable[SpanRecord]) -> B:
        """Add every span of ``records``; return ``self``."""
        add = self.add
        for record in records:
            add(record)
        return self

    def outside(self, record: SpanRecord) -> bool:
        """Whether ``record`` starts outside the window."""
        return self.window is not None and record.start_ns not in self.window

    def attribution_skipped(self, record: SpanRecord) -> bool:
        """Whether ``record`` defers its seconds to another span; counted in the stats if so.

        An engine span behind a gateway is marked ``modtrace.attribution.skip``:
        the gateway's span of the same request carries the same GPU seconds,
        so counting both would count them twice.
        """
        if not record.skips_attribution():
            return False
        self.stats.attribution_skipped += 1
        return True

    def skip_invalid(self, record: SpanRecord, exc: ValueError) -> None:
        """Count and keep an example of a span skipped for an invalid value."""
        self.stats.invalid_spans += 1
        self.stats.note("invalid_spans", record.span_id or record.name, str(exc))


class BucketedBuilder(SpanBuilder):
    """A :class:`SpanBuilder` whose sums are per time bucket and group.

    Subclasses name the class of their sums in :attr:`sums_class`; the
    builder starts with empty ones in :attr:`sums`.

    Args:
        bucket: ``day``, ``week`` (Monday, UTC) or ``all``.
        by: A span (else resource) attribute to group by, e.g. ``gen_ai.request.model``.
        window: Only spans that start in it count.
        stats: Receives the count and examples of invalid spans.
    """

    #: The sums this builder fills (a dataclass built empty).
    sums_class: Callable[[], Any]

    def __init__(
        self,
        *,
        bucket: Bucket = "day",
        by: str | None = None,
        window: Window | None = None,
        stats: ReadStats | None = None,
    ) -> None:
        super().__init__(window=window, stats=stats)
        self.bucketer = Bucketer(bucket)
        self.by = by
        self.sums = self.sums_class()

    def place(self, record: SpanRecord) -> tuple[str, str]:
        """``(bucket label, group)`` of a span (the group is ``""`` without ``by``)."""
        return self.bucketer(record.start_ns), record.group(self.by) if self.by else ""
