"""Streaming reader of OTLP JSON lines: one ``ExportTraceServiceRequest`` per line.

This is the format of the OpenTelemetry file exporter specification
(``opentelemetry.io/docs/specs/otel/protocol/file-exporter``), which the
collector's ``file`` exporter and modtrace's own file exporter write: the
protobuf JSON mapping, camelCase names, 64-bit integers as strings::

    {"resourceSpans": [{"resource": {"attributes": [...]},
      "scopeSpans": [{"scope": {...}, "spans": [{"traceId": "...", "spanId": "...",
        "name": "chat m", "startTimeUnixNano": "1767225600000000000", ...,
        "attributes": [{"key": "modtrace.units.text.tokens",
                        "value": {"intValue": "600"}}, ...]}]}]}]}

Memory is bounded: files are read line by line and each span becomes a
light :class:`SpanRecord` that keeps the attribute values as parsed and
decodes one only when a report asks for it. Broken input is counted in
:class:`ReadStats`, never raised: a line that is not JSON, a span without
a start time, a span with no modtrace attribute.
"""

from __future__ import annotations

import gzip
import io
import json
import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import IO, Any

from .. import semconv
from ..timers import COMPONENTS
from ..units import MODALITIES, UNIT_NAMES, UNKNOWN

__all__ = [
    "MODTRACE_MARKERS",
    "ReadStats",
    "SpanRecord",
    "as_string",
    "decode_value",
    "iter_lines",
    "read_spans",
    "spans_from_request",
]

#: Attributes that make a span a modtrace inference span: a raw count, a GPU
#: timer or an attribution result. Shared with the ClickHouse path.
MODTRACE_MARKERS: frozenset[str] = frozenset(
    (
        *(semconv.unit(u) for u in UNIT_NAMES),
        semconv.GPU_SECONDS,
        *(semconv.gpu_seconds_component(c) for c in COMPONENTS),
        semconv.ATTRIBUTED_METHOD,
        *(semconv.attributed_gpu_seconds(m) for m in (*MODALITIES, UNKNOWN)),
    )
)

#: How many examples of each kind of problem the stats keep.
MAX_EXAMPLES = 5
#: Lines between two progress callbacks.
PROGRESS_EVERY = 2048

_GZIP_MAGIC = b"\x1f\x8b"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
_INF = math.inf


@dataclass
class ReadStats:
    """What reading span files met, for the report's ``input`` section.

    Attributes:
        files: The files read.
        lines: Lines read, blank ones included.
        blank_lines: Empty lines (skipped).
        malformed_lines: Lines that are not a JSON object (truncated writes,
            binary data...).
        other_lines: JSON objects with no ``resourceSpans`` (metrics or logs
            written to the same file).
        spans: Spans seen.
        malformed_spans: Spans whose structure is broken (no start time, an
            attribute without a key...).
        spans_without_modtrace: Spans with no modtrace count, timer or result.
        modtrace_spans: Spans handed to the report.
        invalid_spans: modtrace spans a report skipped because a value it
            needs is not a non-negative finite number.
        attribution_skipped: modtrace spans a report left out because they
            are marked ``modtrace.attribution.skip``: an engine span behind a
            gateway, whose seconds the gateway's span carries already.
        examples: Up to :data:`MAX_EXAMPLES` ``"<file>:<line>: <reason>"``
            per kind of problem.
    """

    files: list[str] = field(default_factory=list)
    lines: int = 0
    blank_lines: int = 0
    malformed_lines: int = 0
    other_lines: int = 0
    spans: int = 0
    malformed_spans: int = 0
    spans_without_modtrace: int = 0
    modtrace_spans: int = 0
    invalid_spans: int = 0
    attribution_skipped: int = 0
    examples: dict[str, list[str]] = field(default_factory=dict)

    def note(self, kind: str, where: str, reason: str) -> None:
        """Keep an example of a problem of ``kind`` (the first few only)."""
        kept = self.examples.setdefault(kind, [])
        if len(kept) < MAX_EXAMPLES:
            kept.append(f"{where}: {reason}"[:300])

    def warnings(self) -> list[str]:
        """One line per kind of reading problem met, with its count and first example.

        Invalid values are left to each report, which says what it skipped.
        """
        out = []
        for kind, count, what in (
            ("malformed_lines", self.malformed_lines, "lines are not OTLP JSON"),
            ("other_lines", self.other_lines, "lines hold no spans (metrics or logs?)"),
            ("malformed_spans", self.malformed_spans, "spans are malformed"),
        ):
            if count:
                first = self.examples.get(kind, [""])[0]
                example = f" (first: {first})" if first else ""
                out.append(f"{count} {what} and were skipped{example}")
        return out

    def to_dict(self) -> dict[str, Any]:
        """The stats as a JSON-ready dict."""
        return {
            "files": list(self.files),
            "lines": self.lines,
            "blank_lines": self.blank_lines,
            "malformed_lines": self.malformed_lines,
            "other_lines": self.other_lines,
            "spans": self.spans,
            "malformed_spans": self.malformed_spans,
            "spans_without_modtrace": self.spans_without_modtrace,
            "modtrace_spans": self.modtrace_spans,
            "invalid_spans": self.invalid_spans,
            "attribution_skipped": self.attribution_skipped,
            "examples": {k: list(v) for k, v in self.examples.items()},
        }


def decode_value(value: Any) -> Any:
    """Decode one OTLP JSON ``AnyValue`` into a Python value.

    ``intValue`` is a string in the protobuf JSON mapping (a number is
    accepted too); ``doubleValue`` may be ``"NaN"`` or ``"Infinity"``.
    Arrays decode to lists, key-value lists to dicts, bytes stay base64 text.

    Raises:
        ValueError: the value is not an ``AnyValue`` object or does not parse.
    """
    if not isinstance(value, dict):
        msg = f"expected an AnyValue object, got {value!r}"[:200]
        raise ValueError(msg)
    for name, x in value.items():
        if name in ("stringValue", "string_value"):
            return x
        if name in ("doubleValue", "double_value"):
            return float(x)
        if name in ("intValue", "int_value"):
            return int(x)
        if name in ("boolValue", "bool_value"):
            return x is True or x == "true"
        if name in ("arrayValue", "array_value"):
            return [decode_value(v) for v in (x or {}).get("values") or ()]
        if name in ("kvlistValue", "kvlist_value"):
            return {kv["key"]: decode_value(kv.get("value") or {}) for kv in x.get("values") or ()}
        if name in ("bytesValue", "bytes_value"):
            return x
    return None


def _go_float(number: float) -> str:
    """A double as Go's ``pcommon`` ``float64AsString`` writes it (ES6 number style)."""
    if math.isnan(number) or math.isinf(number):
        go = "NaN" if math.isnan(number) else ("+Inf" if number > 0 else "-Inf")
        return f"json: unsupported value: {go}"
    if number != 0 and not 1e-6 <= abs(number) < 1e21:
        # repr uses an exponent in this range too; Go drops the exponent's leading zero.
        mantissa, _, exponent = repr(number).partition("e")
        return f"{mantissa}e{exponent[0]}{int(exponent[1:])}"
    # Go's 'f' format with the shortest digits: the repr's digits, without exponent.
    text = format(Decimal(repr(number)), "f")
    return text.rstrip("0").rstrip(".") if "." in text else text


def as_string(value: Any) -> str:
    """An ``AnyValue`` as the collector's ``Value.AsString`` writes it.

    This is how the ClickHouse exporter stores every attribute (``Map(String,
    String)``), so grouping by an attribute gives the same keys on both paths.
    Source: open-telemetry/opentelemetry-collector ``pdata/pcommon/value.go``
    (``AsString``, ``float64AsString``).
    """
    if not isinstance(value, dict) or not value:
        return ""
    decoded = decode_value(value)
    if isinstance(decoded, bool):
        return "true" if decoded else "false"
    if isinstance(decoded, int):
        return str(decoded)
    if isinstance(decoded, float):
        return _go_float(decoded)
    if isinstance(decoded, (list, dict)):
        return json.dumps(decoded, separators=(",", ":"), ensure_ascii=False)
    return "" if decoded is None else str(decoded)


class SpanRecord:
    """One span, light: ids, name, times and its attributes as parsed.

    Values stay in their OTLP JSON form until a report decodes one, so a
    span costs one dict, not one Python object per attribute.
    """

    __slots__ = ("attrs", "end_ns", "name", "resource", "span_id", "start_ns", "trace_id")

    def __init__(
        self,
        trace_id: str,
        span_id: str,
        name: str,
        start_ns: int,
        end_ns: int,
        attrs: dict[str, Any],
        resource: dict[str, Any] | None = None,
    ) -> None:
        self.trace_id = trace_id
        self.span_id = span_id
        self.name = name
        self.start_ns = start_ns
        self.end_ns = end_ns
        #: Attribute key -> OTLP JSON ``AnyValue`` (``{"doubleValue": 1.5}``).
        self.attrs = attrs
        #: Resource attribute key -> ``AnyValue``; ``None`` when the resource has none.
        self.resource = resource

    def __repr__(self) -> str:
        return f"SpanRecord({self.name!r}, span_id={self.span_id!r}, {len(self.attrs)} attributes)"

    def number(self, key: str) -> float | None:
        """The attribute ``key`` as a non-negative finite float, or ``None`` when absent.

        Raises:
            ValueError: the value is not a non-negative finite number.
        """
        value = self.attrs.get(key)
        if value is None:
            return None
        try:
            x = value.get("doubleValue")
            if x is None:
                x = value.get("intValue")
                if x is None:
                    return _number_slow(key, value)
                x = int(x)
            x = float(x)
        except (AttributeError, TypeError, ValueError):
            msg = f"{key}: not a number: {value!r}"[:200]
            raise ValueError(msg) from None
        if 0.0 <= x < _INF:  # NaN fails both comparisons
            return x
        msg = f"{key}: must be a non-negative finite number, got {x!r}"
        raise ValueError(msg)

    def string(self, key: str) -> str | None:
        """The attribute ``key`` as text (``AsString`` for non-strings), or ``None`` when absent."""
        value = self.attrs.get(key)
        if value is None:
            return None
        x = value.get("stringValue") if isinstance(value, dict) else None
        return x if isinstance(x, str) else as_string(value)

    def group(self, key: str) -> str:
        """The value to group by: the span attribute, else the resource attribute, else ``""``.

        Text is what the ClickHouse exporter stores, so both paths agree.
        """
        value = self.attrs.get(key)
        if value is None and self.resource is not None:
            value = self.resource.get(key)
        if value is None:
            return ""
        x = value.get("stringValue") if isinstance(value, dict) else None
        return x if isinstance(x, str) else as_string(value)

    def skips_attribution(self) -> bool:
        """Whether the span is marked ``modtrace.attribution.skip`` (``true``, as text too).

        Such a span (an engine's, behind a gateway) carries GPU seconds that
        another span of the same request carries too: reports leave it out.
        """
        return self.string(semconv.ATTRIBUTION_SKIP) == "true"

    def get(self, key: str, default: Any = None) -> Any:
        """The decoded value of attribute ``key`` (``default`` when absent or undecodable)."""
        value = self.attrs.get(key)
        if value is None:
            return default
        try:
            return decode_value(value)
        except (AttributeError, TypeError, ValueError, KeyError):
            return default

    def attributes(self) -> dict[str, Any]:
        """Every attribute, decoded; values that do not decode are left out."""
        out = {}
        for key, value in self.attrs.items():
            try:
                out[key] = decode_value(value)
            except (AttributeError, TypeError, ValueError, KeyError):
                continue
        return out

    def resource_attributes(self) -> dict[str, Any]:
        """Every resource attribute, decoded."""
        out = {}
        for key, value in (self.resource or {}).items():
            try:
                out[key] = decode_value(value)
            except (AttributeError, TypeError, ValueError, KeyError):
                continue
        return out


def _number_slow(key: str, value: dict[str, Any]) -> float | None:
    """snake_case names (``double_value``) or a non-number type."""
    for name in ("double_value", "int_value"):
        if name in value:
            return float(value[name])
    if not value:
        return None
    msg = f"{key}: not a number: {value!r}"[:200]
    raise ValueError(msg)


def _attribute_dict(kvs: Iterable[dict[str, Any]] | None) -> dict[str, Any]:
    # The key names are the protobuf JSON mapping's; a missing key is malformed.
    return {kv["key"]: kv.get("value") for kv in kvs} if kvs else {}


def spans_from_request(
    request: dict[str, Any],
    stats: ReadStats,
    where: str = "",
    *,
    only_modtrace: bool = True,
) -> Iterator[SpanRecord]:
    """The spans of one decoded ``ExportTraceServiceRequest`` (one file line).

    Args:
        request: The decoded JSON object.
        stats: Counts spans seen, malformed and without modtrace attributes.
        where: ``file:line``, for the examples kept in ``stats``.
        only_modtrace: Skip (and count) spans without a modtrace attribute.
    """
    resource_spans = request.get("resourceSpans")
    if resource_spans is None:
        resource_spans = request.get("resource_spans")
        if resource_spans is None:
            stats.other_lines += 1
            stats.note("other_lines", where, f"keys {sorted(request)[:4]}")
            return
    markers = MODTRACE_MARKERS
    for rs in resource_spans if type(resource_spans) is list else (None,):
        try:
            res = rs.get("resource")
            resource = _attribute_dict(res.get("attributes")) if res else None
            scopes = rs.get("scopeSpans") or rs.get("scope_spans") or ()
        except (AttributeError, TypeError, KeyError) as exc:
            stats.malformed_spans += 1
            stats.note("malformed_spans", where, f"bad resourceSpans entry: {exc!r}"[:200])
            continue
        batches = []
        for ss in scopes if type(scopes) is list else (None,):
            spans = ss.get("spans") if type(ss) is dict else None
            if type(spans) is list:
                batches.append(spans)
            elif spans is not None or type(ss) is not dict:
                stats.malformed_spans += 1
                stats.note("malformed_spans", where, f"bad scopeSpans entry: {ss!r}"[:200])
        for spans in batches:
            for span in spans:
                stats.spans += 1
                try:
                    kvs = span.get("attributes")
                    try:
                        attrs = {kv["key"]: kv["value"] for kv in kvs} if kvs else {}
                    except KeyError:  # an attribute without a value: legal, if rare
                        attrs = _attribute_dict(kvs)
                    if only_modtrace and markers.isdisjoint(attrs):
                        stats.spans_without_modtrace += 1
                        continue
                    start = span.get("startTimeUnixNano")
                    if start is None:
                        start = span["start_time_unix_nano"]
                    end = span.get("endTimeUnixNano")
                    if end is None:
                        end = span.get("end_time_unix_nano", start)
                    record = SpanRecord(
                        span.get("traceId", ""),
                        span.get("spanId", ""),
                        span.get("name", ""),
                        int(start),
                        int(end),
                        attrs,
                        resource,
                    )
                except (AttributeError, TypeError, KeyError, ValueError) as exc:
                    stats.malformed_spans += 1
                    stats.note("malformed_spans", where, f"{type(exc).__name__}: {exc}")
                    continue
                stats.modtrace_spans += 1
                yield record


def _open(path: str | Path) -> tuple[IO[bytes], IO[bytes] | None]:
    """Open ``path`` (``-`` is standard input) for binary reading, gunzipping if needed.

    Returns the stream to read lines from and the raw file (for progress).
    """
    if str(path) == "-":
        return sys.stdin.buffer, None
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    head = raw.peek(4)[:4] if isinstance(raw, io.BufferedReader) else b""
    if head.startswith(_GZIP_MAGIC):
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    if head == _ZSTD_MAGIC:
        return _zstd(raw, path), raw
    return raw, raw


def _zstd(raw: IO[bytes], path: str | Path) -> IO[bytes]:
    try:  # Python 3.14 ships zstd; older Pythons have the backport when installed.
        from compression import zstd  # type: ignore[import-not-found]
    except ImportError:
        try:
            from backports import zstd  # type: ignore[no-redef]
        except ImportError:
            raw.close()
            msg = f"{path}: zstd-compressed; decompress it (zstd -d) or install backports.zstd"
            raise ValueError(msg) from None
    return zstd.ZstdFile(raw, mode="rb")  # type: ignore[no-any-return]


def iter_lines(
    paths: Iterable[str | Path],
    stats: ReadStats,
    progress: Callable[[int], None] | None = None,
) -> Iterator[tuple[str, bytes]]:
    """Yield ``(where, line)`` for every line of every file, counting lines in ``stats``.

    Args:
        paths: Files to read; ``-`` reads standard input; gzip and zstd
            files are decompressed on the fly.
        stats: Receives the file names and line counts.
        progress: Called with the bytes read so far (compressed bytes for
            compressed files), every :data:`PROGRESS_EVERY` lines and at the end.

    Raises:
        ValueError: a file cannot be opened.
    """
    done = 0
    for path in paths:
        name = str(path)
        try:
            stream, raw = _open(path)
        except OSError as exc:
            msg = f"cannot read {name}: {exc.strerror or exc}"
            raise ValueError(msg) from exc
        stats.files.append(name)
        lineno = 0
        try:
            for lineno, line in enumerate(stream, 1):
                if progress is not None and not lineno % PROGRESS_EVERY:
                    progress(done + (raw.tell() if raw is not None else 0))
                yield f"{name}:{lineno}", line
        except (OSError, EOFError) as exc:  # a truncated gzip member, a read error
            stats.malformed_lines += 1
            stats.note("malformed_lines", f"{name}:{lineno + 1}", f"read error: {exc}")
        finally:
            stats.lines += lineno
            if raw is not None:
                done += raw.tell()
            if stream is not sys.stdin.buffer:
                stream.close()
                if raw is not None and raw is not stream:
                    raw.close()
    if progress is not None:
        progress(done)


def read_spans(
    paths: Iterable[str | Path] | str | Path,
    stats: ReadStats | None = None,
    *,
    only_modtrace: bool = True,
    progress: Callable[[int], None] | None = None,
) -> Iterator[SpanRecord]:
    """Stream the spans of OTLP JSON lines files, skipping and counting what is broken.

    Args:
        paths: One file or several; ``-`` is standard input.
        stats: Receives the counts (a fresh one is used when omitted).
        only_modtrace: Yield only spans with a modtrace attribute.
        progress: Called with the bytes read so far, now and then.

    Raises:
        ValueError: a file cannot be opened (broken lines never raise).

    >>> stats = ReadStats()
    >>> list(read_spans([], stats)), stats.spans
    ([], 0)
    """
    if isinstance(paths, (str, Path)):
        paths = [paths]
    stats = stats if stats is not None else ReadStats()
    loads = json.loads
    for where, line in iter_lines(paths, stats, progress):
        try:
            request = loads(line)
        except ValueError as exc:  # UnicodeDecodeError is a ValueError too
            if not line.strip():
                stats.blank_lines += 1
                continue
            stats.malformed_lines += 1
            stats.note("malformed_lines", where, f"not JSON: {exc}")
            continue
        if type(request) is not dict:
            stats.malformed_lines += 1
            stats.note("malformed_lines", where, f"not a JSON object: {type(request).__name__}")
            continue
        yield from spans_from_request(request, stats, where, only_modtrace=only_modtrace)
        # Drop this line's objects before parsing the next: otherwise the
        # garbage collector walks two lines' worth of objects while parsing.
        del request
