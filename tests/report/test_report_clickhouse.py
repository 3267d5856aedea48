"""The shares report as SQL in chDB (embedded ClickHouse) agrees with the local path."""

from __future__ import annotations

import math
import random

import pytest
from report_helpers import inference, span, write_spans

from modtrace import semconv
from modtrace.cost import Rate
from modtrace.report import ReadStats, Window, read_spans, shares_report
from modtrace.report.clickhouse import shares_clickhouse, shares_sql

chdb = pytest.importorskip("chdb", reason="chDB (embedded ClickHouse) is not installed")

from modtrace.report.clickhouse import ChdbRunner  # noqa: E402 - after the skip

MODEL = "gen_ai.request.model"
REL = 1e-9


def _random_spans(seed=7, n=240):
    """A week of varied spans: two models, two regions, two versions, broken ones among them."""
    rng = random.Random(seed)
    spans = []
    for i in range(n):
        day = 5 + i % 9  # 2026-01-05 .. 2026-01-13: two ISO weeks
        start = f"2026-01-{day:02d}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:{i % 60:02d}"
        seconds = {"text": rng.uniform(0.01, 3.0)}
        if i % 3:
            seconds["image"] = rng.uniform(0.0, 9.0)
        if i % 7 == 0:
            seconds["audio"] = rng.expovariate(2.0)
        if i % 11 == 0:
            seconds["unknown"] = 1e-7 * (i + 1)  # written in exponent form by the collector
        if i % 13 == 0:
            seconds["video"] = float(i)  # whole numbers
        usd = {m: s * 2.0 / 3600 for m, s in seconds.items()} if i % 5 else None
        attrs = inference(
            units={"text.tokens": rng.randrange(1, 4000)},
            measured=sum(seconds.values()),
            attributed=seconds,
            version="v1" if i % 4 else "v2",
            usd=usd,
            rate_id="r1" if i % 2 else "r2",
            extra={MODEL: rng.choice(["A", "B", "model 'quoted'"])},
        )
        spans.append(
            span(start, attrs, resource={"service.name": "gw", "region": rng.choice(["eu", "us"])})
        )
    # Counted, not summed: counts without attribution, invalid values, a plain HTTP span.
    spans.append(span("2026-01-06T10:00:00", inference(units={"text.tokens": 5}, measured=1.0)))
    spans.append(span("2026-01-06T10:00:01", inference(attributed={"text": -1.0}, version="v1")))
    spans.append(span("2026-01-06T10:00:02", inference(attributed={"image": float("nan")})))
    spans.append(span("2026-01-06T10:00:03", {"http.route": "/v1/chat/completions"}))
    return spans


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """One span file, and the same spans in chDB's ``otel_traces`` as the exporter writes them."""
    path = write_spans(tmp_path_factory.mktemp("ch") / "spans.jsonl", _random_spans(), per_line=25)
    runner = ChdbRunner()
    inserted = runner.load(read_spans(path, only_modtrace=False))
    assert inserted == 244
    return path, runner


def _assert_same(local, remote):
    """Same rows in the same order, numbers within 1e-9 relative."""
    assert len(local.rows) == len(remote.rows) > 0
    for mine, theirs in zip(
        [*local.rows, *local.extra["totals"]], [*remote.rows, *remote.extra["totals"]], strict=True
    ):
        assert mine.keys() == theirs.keys()
        for key, value in mine.items():
            other = theirs[key]
            if isinstance(value, float):
                assert math.isclose(value, other, rel_tol=REL, abs_tol=1e-300), (key, value, other)
            else:
                assert value == other, (key, value, other)
    for key in ("attributed_spans", "unattributed_spans", "invalid_spans", "attribution_skipped"):
        assert local.input[key] == remote.input[key], key
    assert local.warnings == remote.warnings


@pytest.mark.parametrize(
    ("bucket", "by"),
    [("day", None), ("week", MODEL), ("all", "region"), ("day", "service.name")],
)
def test_shares_agree(loaded, bucket, by):
    """Per bucket and group, both paths give the same rows, totals, counts and warnings."""
    path, runner = loaded
    stats = ReadStats()
    local = shares_report(read_spans(path, stats), stats, bucket=bucket, by=by)
    remote = shares_clickhouse(runner, bucket=bucket, by=by)
    _assert_same(local, remote)
    assert remote.params["source"] == "clickhouse"
    assert local.input["invalid_spans"] == 2 and local.input["unattributed_spans"] == 1


def test_window_and_rate_agree(loaded):
    """A pushed-down window and a rate give the same report too."""
    path, runner = loaded
    window = Window.parse("2026-01-07", "2026-01-12T06:00")
    rate = Rate(usd_per_gpu_hour=2.5, id="plan")
    stats = ReadStats()
    local = shares_report(read_spans(path, stats), stats, bucket="day", window=window, rate=rate)
    remote = shares_clickhouse(runner, bucket="day", window=window, rate=rate)
    _assert_same(local, remote)
    assert {r["bucket"] for r in remote.rows} <= {f"2026-01-{d:02d}" for d in range(7, 13)}


def test_input_counts_from_the_table(loaded):
    """The table-side input counts every span and the ones without modtrace attributes."""
    _, runner = loaded
    report = shares_clickhouse(runner, bucket="all")
    assert report.input["spans"] == 244
    assert report.input["spans_without_modtrace"] == 1


def test_sql_quotes_attribute_names(loaded):
    """A group-by attribute with a quote is a literal, not SQL."""
    _, runner = loaded
    sql = shares_sql(by="x' OR 1=1 --")
    assert "'x\\' OR 1=1 --'" in sql
    report = shares_clickhouse(runner, bucket="all", by="x' OR 1=1 --")
    assert {r["x' OR 1=1 --"] for r in report.rows} == {""}


def test_bad_table_name_is_refused():
    """Table names are identifiers only."""
    with pytest.raises(ValueError, match="table"):
        shares_sql("otel_traces; DROP TABLE x")


def test_engine_spans_behind_a_gateway_are_skipped_on_both_paths(tmp_path):
    """Spans marked modtrace.attribution.skip count once, as skipped, never as unattributed."""
    start = "2026-01-05T10:00:00"
    gateway = inference(units={"text.tokens": 9}, measured=1.0, attributed={"text": 1.0})
    engine = inference(measured=1.0, extra={semconv.ATTRIBUTION_SKIP: True})
    attributed_engine = inference(
        measured=1.0, attributed={"unknown": 1.0}, extra={semconv.ATTRIBUTION_SKIP: True}
    )
    spans = [span(start, gateway), span(start, engine), span(start, attributed_engine)]
    path = write_spans(tmp_path / "spans.jsonl", spans)
    runner = ChdbRunner()
    # chDB's in-memory database is shared: a table of its own.
    assert runner.load(read_spans(path, only_modtrace=False), table="skip_traces") == 3
    stats = ReadStats()
    local = shares_report(read_spans(path, stats), stats, bucket="all")
    remote = shares_clickhouse(runner, table="skip_traces", bucket="all")
    _assert_same(local, remote)
    (row,) = remote.rows
    assert row["requests"] == 1 and row["gpu_seconds"] == 1.0
    assert remote.input["attribution_skipped"] == 2
    assert remote.input["unattributed_spans"] == 0
