"""The shares report as SQL pushed down to ClickHouse, on the collector's ``otel_traces`` table.

At fleet scale spans are not pulled into Python: the sums of
:class:`~modtrace.report.shares.SharesSums` are computed by ClickHouse and
the same :func:`~modtrace.report.shares.finish_shares` makes the report, so
both paths agree to rounding.

The table is the one the OpenTelemetry collector's ClickHouse exporter
writes (open-telemetry/opentelemetry-collector-contrib,
``exporter/clickhouseexporter/internal/sqltemplates/traces_table.sql``):
``Timestamp DateTime64(9)`` is the span's start, and every attribute is in
``SpanAttributes Map(LowCardinality(String), String)`` as text, written by
``pcommon.Value.AsString`` (``internal/util.go`` ``AttributesToMap``). The
query reads the numbers back with ``toFloat64OrNull`` and applies the same
rules as the local path: a span with a value that is not a non-negative
finite number is skipped and counted, and a span marked
``modtrace.attribution.skip`` (an engine span behind a gateway, whose
seconds the gateway's span carries) is left out and counted.

Runs through ``clickhouse-connect`` against a server (:func:`connect`), or
through chDB, the embedded engine (:class:`ChdbRunner`), which the tests use.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Protocol

from .. import semconv
from ..cost import Rate
from .base import RESULT_MODALITIES, Bucket, Report, Window
from .shares import GPU_SECONDS_KEYS, USD_KEYS, SharesSums, finish_shares
from .spans import MODTRACE_MARKERS, SpanRecord, as_string

__all__ = [
    "OTEL_TRACES_DDL",
    "ChdbRunner",
    "ClickHouseConnectRunner",
    "Runner",
    "connect",
    "exporter_rows",
    "shares_clickhouse",
    "shares_sql",
    "stats_sql",
]

#: The collector ClickHouse exporter's traces table (``traces_table.sql``, without the
#: cluster, TTL and full-text options), for loading spans into chDB or a test server.
OTEL_TRACES_DDL = """\
CREATE TABLE IF NOT EXISTS {table} (
    Timestamp DateTime64(9) CODEC(Delta(8), ZSTD(1)),
    TraceId String CODEC(ZSTD(1)),
    SpanId String CODEC(ZSTD(1)),
    ParentSpanId String CODEC(ZSTD(1)),
    TraceState String CODEC(ZSTD(1)),
    SpanName LowCardinality(String) CODEC(ZSTD(1)),
    SpanKind LowCardinality(String) CODEC(ZSTD(1)),
    ServiceName LowCardinality(String) CODEC(ZSTD(1)),
    ResourceAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    ScopeName String CODEC(ZSTD(1)),
    ScopeVersion String CODEC(ZSTD(1)),
    SpanAttributes Map(LowCardinality(String), String) CODEC(ZSTD(1)),
    Duration UInt64 CODEC(T64, ZSTD(1)),
    StatusCode LowCardinality(String) CODEC(ZSTD(1)),
    StatusMessage String CODEC(ZSTD(1)),
    Events Nested (
        Timestamp DateTime64(9),
        Name LowCardinality(String),
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    Links Nested (
        TraceId String,
        SpanId String,
        TraceState String,
        Attributes Map(LowCardinality(String), String)
    ) CODEC(ZSTD(1)),
    INDEX idx_trace_id TraceId TYPE bloom_filter(0.001) GRANULARITY 1,
    INDEX idx_span_attr_key mapKeys(SpanAttributes) TYPE bloom_filter(0.01) GRANULARITY 1,
    INDEX idx_duration Duration TYPE minmax GRANULARITY 1
) ENGINE = MergeTree()
PARTITION BY toDate(Timestamp)
ORDER BY (ServiceName, SpanName, toDateTime(Timestamp), Timestamp)
"""

_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)?$")


class Runner(Protocol):
    """Runs one SQL query and returns its rows as tuples."""

    def __call__(self, sql: str) -> Sequence[Sequence[Any]]:
        """Run ``sql``; return the result rows."""
        ...


class ClickHouseConnectRunner:
    """A :class:`Runner` over a ``clickhouse-connect`` client."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __call__(self, sql: str) -> Sequence[Sequence[Any]]:
        """Run ``sql`` on the server."""
        return self.client.query(sql).result_rows  # type: ignore[no-any-return]


class ChdbRunner:
    """A :class:`Runner` over chDB, the embedded ClickHouse engine.

    Args:
        path: The chDB database (``:memory:`` by default).
    """

    def __init__(self, path: str = ":memory:") -> None:
        try:
            import chdb
        except ImportError as exc:
            msg = "chDB is not installed: pip install chdb"
            raise ValueError(msg) from exc
        self.connection = chdb.connect(path)

    def __call__(self, sql: str) -> Sequence[Sequence[Any]]:
        """Run ``sql`` in the embedded engine."""
        cursor = self.connection.cursor()
        try:
            cursor.execute(sql)
            return cursor.fetchall() or ()
        finally:
            cursor.close()

    def load(self, records: Iterable[SpanRecord], table: str = "otel_traces") -> int:
        """Create ``table`` as the exporter does and insert ``records`` as it would.

        Returns:
            The number of spans inserted.
        """
        table = _table(table)
        self(OTEL_TRACES_DDL.format(table=table))
        fd, path = tempfile.mkstemp(suffix=".jsonl", prefix="modtrace-otel-traces-")
        count = 0
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                for row in exporter_rows(records):
                    out.write(json.dumps(row, ensure_ascii=False) + "\n")
                    count += 1
            structure = (
                "ts Int64, TraceId String, SpanId String, SpanName String, ServiceName String, "
                "ResourceAttributes Map(String, String), SpanAttributes Map(String, String), "
                "Duration UInt64"
            )
            self(
                f"INSERT INTO {table} (Timestamp, TraceId, SpanId, SpanName, ServiceName, "
                "ResourceAttributes, SpanAttributes, Duration) "
                "SELECT fromUnixTimestamp64Nano(ts), TraceId, SpanId, SpanName, ServiceName, "
                "ResourceAttributes, SpanAttributes, Duration "
                f"FROM file({_quote(path)}, 'JSONEachRow', {_quote(structure)})"
            )
        finally:
            os.unlink(path)
        return count


def connect(dsn: str) -> ClickHouseConnectRunner:
    """A runner on a ClickHouse server, e.g. ``clickhouse://user:password@host:8123/otel``.

    Raises:
        ValueError: ``clickhouse-connect`` is not installed.
    """
    try:
        import clickhouse_connect
    except ImportError as exc:
        msg = "ClickHouse needs clickhouse-connect: pip install 'modtrace[clickhouse]'"
        raise ValueError(msg) from exc
    return ClickHouseConnectRunner(clickhouse_connect.get_client(dsn=dsn))


def exporter_rows(records: Iterable[SpanRecord]) -> Iterator[dict[str, Any]]:
    """Rows as the collector's ClickHouse exporter writes them (the columns reports read).

    ``ts`` is the start time in ns (``Timestamp``); attributes are text, as
    ``pcommon.Value.AsString`` writes them.
    """
    for record in records:
        resource = {k: as_string(v) for k, v in (record.resource or {}).items()}
        yield {
            "ts": record.start_ns,
            "TraceId": record.trace_id,
            "SpanId": record.span_id,
            "SpanName": record.name,
            "ServiceName": resource.get("service.name", ""),
            "ResourceAttributes": resource,
            "SpanAttributes": {k: as_string(v) for k, v in record.attrs.items()},
            "Duration": max(record.end_ns - record.start_ns, 0),
        }


def _quote(text: str) -> str:
    """A ClickHouse string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _table(name: str) -> str:
    if not _IDENTIFIER.match(name):
        msg = f"table {name!r}: expected NAME or DATABASE.NAME (letters, digits, _)"
        raise ValueError(msg)
    return ".".join(f"`{part}`" for part in name.split("."))


def _attr(key: str) -> str:
    return f"SpanAttributes[{_quote(key)}]"


def _skipped_sql() -> str:
    """Spans marked ``modtrace.attribution.skip`` (``AsString`` of ``true``), as the local path."""
    return f"{_attr(semconv.ATTRIBUTION_SKIP)} = 'true'"


def _bucket_sql(bucket: Bucket) -> str:
    # UTC, as the local path: labels are ISO dates of the day or of its Monday.
    if bucket == "day":
        return "toString(toDate(Timestamp, 'UTC'))"
    if bucket == "week":
        return "toString(toMonday(Timestamp, 'UTC'))"
    return "'all'"


def _group_sql(by: str | None) -> str:
    if not by:
        return "''"
    key = _quote(by)
    # The span attribute, else the resource attribute: as SpanRecord.group.
    return (
        f"if(mapContains(SpanAttributes, {key}), SpanAttributes[{key}], ResourceAttributes[{key}])"
    )


def _window_sql(window: Window | None) -> str:
    parts = []
    if window is not None and window.since_ns is not None:
        parts.append(f"Timestamp >= fromUnixTimestamp64Nano(toInt64({window.since_ns}))")
    if window is not None and window.until_ns is not None:
        parts.append(f"Timestamp < fromUnixTimestamp64Nano(toInt64({window.until_ns}))")
    return "".join(f" AND {p}" for p in parts)


def shares_sql(
    table: str = "otel_traces",
    *,
    bucket: Bucket = "day",
    by: str | None = None,
    window: Window | None = None,
) -> str:
    """The SQL that computes the shares sums per bucket, group and calibration version.

    One row per ``(bucket, group, version)``: requests, priced requests, the
    seconds and recorded dollars per modality (in
    :data:`~modtrace.report.base.RESULT_MODALITIES` order), invalid spans and
    the rate ids seen (newline-separated).
    """
    keys = (*GPU_SECONDS_KEYS, *USD_KEYS)
    values = ",\n        ".join(f"toFloat64OrNull({_attr(k)}) AS v{i}" for i, k in enumerate(keys))
    valid = "\n        AND ".join(
        f"(NOT mapContains(SpanAttributes, {_quote(k)}) "
        f"OR (v{i} IS NOT NULL AND v{i} >= 0 AND isFinite(v{i})))"
        for i, k in enumerate(keys)
    )
    sums = ",\n    ".join(f"sumIf(ifNull(v{i}, 0), valid) AS s{i}" for i in range(len(keys)))
    rate = _quote(semconv.COST_RATE_ID)
    return f"""\
SELECT
    bucket,
    grp,
    version,
    countIf(valid) AS requests,
    countIf(valid AND mapContains(SpanAttributes, {_quote(semconv.COST_USD_TOTAL)})) AS priced,
    {sums},
    countIf(NOT valid) AS invalid,
    arrayStringConcat(
        groupUniqArrayIf(SpanAttributes[{rate}], valid AND mapContains(SpanAttributes, {rate})),
        '\\n'
    ) AS rate_ids
FROM (
    SELECT
        SpanAttributes,
        {_bucket_sql(bucket)} AS bucket,
        {_group_sql(by)} AS grp,
        {_attr(semconv.CALIBRATION_VERSION)} AS version,
        {values},
        {valid} AS valid
    FROM {_table(table)}
    WHERE mapContains(SpanAttributes, {_quote(semconv.ATTRIBUTED_METHOD)})
        AND NOT ({_skipped_sql()}){_window_sql(window)}
)
GROUP BY bucket, grp, version
ORDER BY bucket, grp, version
"""


def stats_sql(table: str = "otel_traces", *, window: Window | None = None) -> str:
    """The SQL that counts spans, modtrace spans, unattributed and skipped modtrace spans."""
    markers = ", ".join(_quote(k) for k in sorted(MODTRACE_MARKERS))
    method = _quote(semconv.ATTRIBUTED_METHOD)
    return f"""\
SELECT
    count() AS spans,
    countIf(is_modtrace) AS modtrace_spans,
    countIf(is_modtrace AND NOT skipped AND NOT mapContains(SpanAttributes, {method}))
        AS unattributed,
    countIf(is_modtrace AND skipped) AS attribution_skipped
FROM (
    SELECT
        SpanAttributes,
        hasAny(mapKeys(SpanAttributes), [{markers}]) AS is_modtrace,
        {_skipped_sql()} AS skipped
    FROM {_table(table)}
    WHERE 1{_window_sql(window)}
)
"""


def shares_clickhouse(
    runner: Runner,
    *,
    table: str = "otel_traces",
    bucket: Bucket = "day",
    by: str | None = None,
    rate: Rate | None = None,
    window: Window | None = None,
) -> Report:
    """The shares report computed in ClickHouse: the same report as the local path.

    Args:
        runner: Runs SQL (:func:`connect`, :class:`ChdbRunner`).
        table: The exporter's traces table (``otel_traces``, or ``db.table``).
        bucket: ``day``, ``week`` (Monday, UTC) or ``all``.
        by: Group by this span (else resource) attribute.
        rate: Price every GPU second at this rate instead of the recorded dollars.
        window: Only spans starting in it count (pushed down as a ``WHERE``).
    """
    sums = SharesSums()
    n = len(RESULT_MODALITIES)
    for row in runner(shares_sql(table, bucket=bucket, by=by, window=window)):
        bucket_label, group, version, requests, priced, *rest = row
        values, invalid, rate_ids = rest[: 2 * n], rest[2 * n], rest[2 * n + 1]
        sums.invalid += int(invalid)
        # Joined by newlines in SQL: drivers return arrays in different shapes.
        sums.rate_ids.update(r for r in str(rate_ids or "").split("\n") if r)
        if not requests:
            continue
        sums.cells[(str(bucket_label), str(group), str(version))] = [
            float(requests),
            float(priced),
            *(float(v) for v in values),
        ]
    found = next(iter(runner(stats_sql(table, window=window))))
    spans, modtrace_spans, unattributed, skipped = found
    sums.unattributed = int(unattributed)
    input_stats = {
        "table": table,
        "spans": int(spans),
        "modtrace_spans": int(modtrace_spans),
        "spans_without_modtrace": int(spans) - int(modtrace_spans),
        "attribution_skipped": int(skipped),
    }
    return finish_shares(
        sums,
        bucket=bucket,
        by=by,
        rate=rate,
        window=window,
        input_stats=input_stats,
        source="clickhouse",
    )
