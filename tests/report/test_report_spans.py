"""The streaming reader of OTLP JSON lines: real exporter files, collector lines, broken input."""

from __future__ import annotations

import gzip
import json
from typing import ClassVar

import pytest
from report_helpers import inference, span, write_spans

from modtrace import semconv
from modtrace.report.spans import ReadStats, SpanRecord, as_string, read_spans


def _read(path, **kwargs):
    stats = ReadStats()
    return list(read_spans(path, stats, **kwargs)), stats


class TestRealExporterFiles:
    """Files written by modtrace's OTLP JSON file exporter read back value for value."""

    def test_values_types_and_times(self, tmp_path):
        """Ints, doubles, strings, bools, start times and resource attributes survive the trip."""
        attrs = inference(
            units={"text.tokens": 600, "audio.seconds": 20.5},
            measured=1.7,
            attributed={"text": 0.5, "audio": 1.2},
            version="v1",
            extra={"app.cached": True},
        )
        path = write_spans(tmp_path / "s.jsonl", [span("2026-01-05T10:00:00", attrs)])
        (record,), stats = _read(path)
        assert record.number(semconv.unit("text.tokens")) == 600.0
        assert record.number(semconv.unit("audio.seconds")) == 20.5
        assert record.number(semconv.GPU_SECONDS) == 1.7
        assert record.string(semconv.CALIBRATION_VERSION) == "v1"
        assert record.get("app.cached") is True
        assert record.group("service.name") == "gateway"  # from the resource
        assert record.start_ns == 1767607200 * 10**9
        assert record.end_ns - record.start_ns == 10**9
        assert len(record.trace_id) == 32 and len(record.span_id) == 16
        assert stats.spans == stats.modtrace_spans == 1
        assert stats.lines == 1 and stats.malformed_lines == 0

    def test_many_spans_per_line(self, tmp_path):
        """A batch of spans on one line (as a batch processor exports) yields every span."""
        spans = [
            span(f"2026-01-05T10:00:{i:02d}", inference(units={"text.tokens": i + 1}))
            for i in range(25)
        ]
        path = write_spans(tmp_path / "s.jsonl", spans, per_line=10)
        records, stats = _read(path)
        assert [r.number(semconv.unit("text.tokens")) for r in records] == [
            float(i + 1) for i in range(25)
        ]
        assert stats.lines == 3 and stats.spans == 25

    def test_gzip(self, tmp_path):
        """A gzip-compressed file is read like the plain one."""
        path = write_spans(
            tmp_path / "s.jsonl", [span("2026-01-05T10:00:00", inference(measured=2.0))]
        )
        packed = tmp_path / "s.jsonl.gz"
        packed.write_bytes(gzip.compress(path.read_bytes()))
        (record,), _ = _read(packed)
        assert record.number(semconv.GPU_SECONDS) == 2.0

    def test_truncated_gzip_is_counted(self, tmp_path):
        """A gzip file cut short yields the lines before the cut and counts the break."""
        spans = [span("2026-01-05T10:00:00", inference(measured=1.0)) for _ in range(50)]
        path = write_spans(tmp_path / "s.jsonl", spans)
        packed = gzip.compress(path.read_bytes())
        cut = tmp_path / "cut.jsonl.gz"
        cut.write_bytes(packed[: len(packed) - 40])
        records, stats = _read(cut)
        assert 0 < len(records) < 50
        assert stats.malformed_lines >= 1
        assert "read error" in stats.examples["malformed_lines"][-1]

    def test_zstd(self, tmp_path):
        """A zstd-compressed file is read when a zstd module is available."""
        zstd = pytest.importorskip("backports.zstd")
        path = write_spans(
            tmp_path / "s.jsonl", [span("2026-01-05T10:00:00", inference(measured=3.0))]
        )
        packed = tmp_path / "s.jsonl.zst"
        packed.write_bytes(zstd.compress(path.read_bytes()))
        (record,), _ = _read(packed)
        assert record.number(semconv.GPU_SECONDS) == 3.0

    def test_progress_reports_every_byte(self, tmp_path):
        """The progress callback ends at the file's size."""
        spans = [span("2026-01-05T10:00:00", inference(measured=1.0)) for _ in range(3)]
        path = write_spans(tmp_path / "s.jsonl", spans)
        seen: list[int] = []
        _read(path, progress=seen.append)
        assert seen[-1] == path.stat().st_size


class TestCollectorLines:
    """Lines as the collector's file exporter writes them (OTLP JSON spec example shape)."""

    LINE: ClassVar[dict] = {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "gw"}}]
                },
                "scopeSpans": [
                    {
                        "scope": {},
                        "spans": [
                            {
                                "traceId": "5b8efff798038103d269b633813fc60c",
                                "spanId": "eee19b7ec3c1b174",
                                "parentSpanId": "",
                                "name": "chat m",
                                "kind": 3,
                                "startTimeUnixNano": "1581452772000000321",
                                "endTimeUnixNano": "1581452773000000789",
                                "droppedAttributesCount": 1,
                                "attributes": [
                                    {
                                        "key": "modtrace.units.image.tiles",
                                        "value": {"intValue": "8"},
                                    },
                                    {"key": "modtrace.gpu.seconds", "value": {"doubleValue": 1.5}},
                                    {"key": "empty", "value": {}},
                                ],
                                "status": {},
                            }
                        ],
                    }
                ],
            }
        ]
    }

    def test_string_ints_and_empty_values(self, tmp_path):
        """``intValue`` as a string, an empty ``AnyValue`` and integer kinds are read."""
        path = tmp_path / "collector.jsonl"
        path.write_text(json.dumps(self.LINE) + "\n")
        (record,), stats = _read(path)
        assert record.number("modtrace.units.image.tiles") == 8.0
        assert record.number("empty") is None
        assert record.start_ns == 1581452772000000321
        assert record.group("service.name") == "gw"
        assert stats.malformed_spans == 0


class TestBrokenInput:
    """Malformed lines and spans are counted and reported, never raised."""

    def test_malformed_lines_are_counted(self, tmp_path):
        """Garbage, a truncated line, a JSON array, a metrics line and blanks are all counted."""
        good = write_spans(
            tmp_path / "good.jsonl", [span("2026-01-05T10:00:00", inference(measured=1.0))]
        )
        line = good.read_text().strip()
        path = tmp_path / "mixed.jsonl"
        path.write_text(
            "\n".join(
                [
                    line,
                    "not json at all",
                    line[: len(line) // 2],  # a write cut short
                    "[1, 2, 3]",
                    '{"resourceMetrics": []}',
                    "",
                    "   ",
                    line,
                    "\x00\xff garbage",
                ]
            )
            + "\n",
            encoding="latin-1",
        )
        records, stats = _read(path)
        assert len(records) == 2
        assert stats.malformed_lines == 4
        assert stats.other_lines == 1
        assert stats.blank_lines == 2
        assert stats.lines == 9
        assert len(stats.examples["malformed_lines"]) == 4
        assert any("mixed.jsonl:2" in e for e in stats.examples["malformed_lines"])
        assert any("lines are not OTLP JSON" in w for w in stats.warnings())

    def test_spans_without_modtrace_attributes_are_counted(self, tmp_path):
        """An ordinary HTTP span is skipped and counted, or yielded when asked for."""
        spans = [
            span("2026-01-05T10:00:00", {"http.route": "/v1/chat"}),
            span("2026-01-05T10:00:01", inference(units={"text.tokens": 5})),
        ]
        path = write_spans(tmp_path / "s.jsonl", spans, per_line=2)
        records, stats = _read(path)
        assert len(records) == 1 and stats.spans_without_modtrace == 1 and stats.spans == 2
        everything, _ = _read(path, only_modtrace=False)
        assert len(everything) == 2

    def test_malformed_spans_are_counted(self, tmp_path):
        """A span without a start time or with a keyless attribute is skipped; the next is read."""
        line = {
            "resourceSpans": [
                {
                    "scopeSpans": [
                        {
                            "spans": [
                                {
                                    "name": "no start",
                                    "attributes": [
                                        {"key": "modtrace.gpu.seconds", "value": {"doubleValue": 1}}
                                    ],
                                },
                                {
                                    "name": "keyless",
                                    "startTimeUnixNano": "1",
                                    "attributes": [{"value": {"doubleValue": 1}}],
                                },
                                {
                                    "name": "ok",
                                    "startTimeUnixNano": "2",
                                    "attributes": [
                                        {"key": "modtrace.gpu.seconds", "value": {"doubleValue": 1}}
                                    ],
                                },
                            ]
                        },
                        "not a scope",
                    ]
                },
                7,
            ]
        }
        path = tmp_path / "s.jsonl"
        path.write_text(json.dumps(line) + "\n")
        records, stats = _read(path)
        assert [r.name for r in records] == ["ok"]
        # Two spans, the scope entry "not a scope" and the resourceSpans entry 7.
        assert stats.malformed_spans == 4
        assert stats.spans == 3

    def test_missing_file_is_one_clear_error(self, tmp_path):
        """A file that cannot be opened raises one ValueError naming it."""
        with pytest.raises(ValueError, match=r"cannot read .*absent\.jsonl"):
            _read(tmp_path / "absent.jsonl")


class TestValues:
    """Decoding single values: numbers, validity, and the collector's AsString text."""

    @staticmethod
    def _record(value):
        return SpanRecord("t", "s", "n", 0, 0, {"k": value})

    @pytest.mark.parametrize(
        ("value", "expected"),
        [
            ({"doubleValue": 1.25}, 1.25),
            ({"intValue": "42"}, 42.0),
            ({"intValue": 42}, 42.0),
            ({"doubleValue": 0}, 0.0),
            ({}, None),
        ],
    )
    def test_numbers(self, value, expected):
        """Doubles and (string) ints read as floats; an empty value reads as absent."""
        assert self._record(value).number("k") == expected

    @pytest.mark.parametrize(
        "value",
        [
            {"doubleValue": "NaN"},
            {"doubleValue": "Infinity"},
            {"doubleValue": -1.0},
            {"stringValue": "1.5"},
            {"boolValue": True},
            {"intValue": "x"},
            "not an AnyValue",
        ],
    )
    def test_invalid_numbers_raise(self, value):
        """NaN, infinities, negatives and non-numbers raise ValueError naming the key."""
        with pytest.raises(ValueError, match="k"):
            self._record(value).number("k")

    @pytest.mark.parametrize(
        ("value", "text"),
        [
            # pcommon float64AsString: ES6 style, 'f' between 1e-6 and 1e21, 'e' outside.
            ({"doubleValue": 0.1}, "0.1"),
            ({"doubleValue": 100.0}, "100"),
            ({"doubleValue": 1.5e17}, "150000000000000000"),
            ({"doubleValue": 0.000015}, "0.000015"),
            ({"doubleValue": 1e-7}, "1e-7"),
            ({"doubleValue": 1.5e-7}, "1.5e-7"),
            ({"doubleValue": 1e21}, "1e+21"),
            ({"doubleValue": "NaN"}, "json: unsupported value: NaN"),
            ({"intValue": "-7"}, "-7"),
            ({"boolValue": False}, "false"),
            ({"stringValue": "x y"}, "x y"),
            ({"arrayValue": {"values": [{"intValue": "1"}, {"stringValue": "a"}]}}, '[1,"a"]'),
            ({}, ""),
        ],
    )
    def test_as_string_matches_the_collector(self, value, text):
        """Attribute text is what the collector's ``Value.AsString`` writes to ClickHouse."""
        assert as_string(value) == text
