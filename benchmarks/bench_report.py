"""The shares report over an OTLP JSON lines file, against parsing the same file and nothing else.

The baseline is the least any reader must do: ``json.loads`` of every line,
with the same JSON library (the standard one, which the reader uses). The
report reads the same file with :func:`modtrace.report.read_spans` and sums
it with :func:`modtrace.report.shares_report` (per day, grouped by model).
Both run in the same process, interleaved, best of ``--repeats``. The goal:
the report within 2x of the parse alone.

Peak memory is measured in separate, untimed runs with ``tracemalloc``, for
two file sizes: it should not grow with the file (the reader streams).

Spans are written in the shape of modtrace's file exporter (OTLP JSON:
camelCase, hex ids, 64-bit integers as strings), with the ~30 attributes an
attributed inference span carries, ``--per-line`` spans per line (one
``BatchSpanProcessor`` export each).

Run: ``.venv/bin/python benchmarks/bench_report.py [--spans 250000] [--small 50000]``
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from modtrace import semconv
from modtrace.report import ReadStats, read_spans, shares_report

MODELS = ("Qwen/Qwen2.5-VL-7B-Instruct", "google/gemma-3-4b-it", "mistralai/Pixtral-12B-2409")
START_NS = 1_767_225_600_000_000_000  # 2026-01-01T00:00:00Z


def _kv(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, bool):
        return {"key": key, "value": {"boolValue": value}}
    if isinstance(value, int):
        return {"key": key, "value": {"intValue": str(value)}}
    if isinstance(value, float):
        return {"key": key, "value": {"doubleValue": value}}
    return {"key": key, "value": {"stringValue": value}}


def _span(i: int, total_spans: int, rng: random.Random) -> dict[str, Any]:
    """One attributed inference span; a week of traffic over the whole file."""
    start = START_NS + i * (7 * 86_400 * 10**9 // total_spans)
    text = rng.randint(50, 3000)
    image = rng.choice((0, 0, 256, 1024, 2304))
    audio = rng.choice((0.0, 0.0, 0.0, rng.uniform(1, 60)))
    measured = 0.0008 * text + 0.00005 * image + 0.05 * audio + rng.uniform(0.01, 0.2)
    seconds = {"text": 0.0008 * text, "image": 0.00005 * image, "audio": 0.05 * audio}
    predicted = sum(seconds.values())
    attributed = {m: s * measured / predicted for m, s in seconds.items() if s > 0}
    attrs = [
        _kv(semconv.GEN_AI_OPERATION_NAME, "chat"),
        _kv(semconv.GEN_AI_REQUEST_MODEL, MODELS[i % len(MODELS)]),
        _kv(semconv.GEN_AI_PROVIDER_NAME, "vllm"),
        _kv(semconv.GEN_AI_USAGE_INPUT_TOKENS, text + image),
        _kv(semconv.unit("text.tokens"), text),
        _kv(semconv.unit_counter("text"), "hf-tokenizer@1"),
        _kv(semconv.UNITS_PROFILE, "qwen2.5-vl"),
        _kv(semconv.GPU_SECONDS, measured),
        _kv(semconv.gpu_seconds_component("prefill"), measured * 0.4),
        _kv(semconv.gpu_seconds_component("decode"), measured * 0.6),
        _kv(semconv.GPU_COUNT, 1),
        _kv(semconv.GPU_SOURCE, "step_ledger"),
        _kv(semconv.ATTRIBUTED_METHOD, "weights"),
        _kv(semconv.RECONCILE_FACTOR, measured / predicted),
        _kv(semconv.RECONCILE_OUTLIER, False),
        _kv(semconv.CALIBRATION_VERSION, "2026-01-qwen2.5-vl-7b-a"),
        _kv(semconv.COST_USD_TOTAL, measured * 2.0 / 3600),
        _kv(semconv.COST_USD_PER_GPU_HOUR, 2.0),
        _kv(semconv.COST_RATE_ID, "default"),
        _kv(semconv.COST_HYPOTHETICAL, True),
    ]
    if image:
        attrs += [
            _kv(semconv.unit("image.count"), 1),
            _kv(semconv.unit("image.tokens"), image),
            _kv(semconv.unit("image.pixels"), image * 784),
            _kv(semconv.unit_counter("image"), "qwen2.5-vl@1"),
        ]
    if audio:
        attrs += [_kv(semconv.unit("audio.count"), 1), _kv(semconv.unit("audio.seconds"), audio)]
    for modality, value in attributed.items():
        attrs += [
            _kv(semconv.attributed_gpu_seconds(modality), value),
            _kv(semconv.attributed_share(modality), value / measured),
            _kv(semconv.cost_usd(modality), value * 2.0 / 3600),
        ]
    return {
        "traceId": f"{rng.getrandbits(128):032x}",
        "spanId": f"{rng.getrandbits(64):016x}",
        "parentSpanId": f"{rng.getrandbits(64):016x}",
        "name": f"chat {MODELS[i % len(MODELS)]}",
        "kind": 3,
        "startTimeUnixNano": str(start),
        "endTimeUnixNano": str(start + int(measured * 1e9)),
        "attributes": attrs,
        "status": {},
    }


def write_file(path: Path, spans: int, per_line: int, seed: int = 0) -> int:
    """Write ``spans`` spans, ``per_line`` to a line; return the file size in bytes."""
    rng = random.Random(seed)
    resource = {"attributes": [_kv("service.name", "gateway"), _kv("host.name", "gpu-node-17")]}
    scope = {"name": "modtrace", "version": "0.1.0"}
    with path.open("w", encoding="utf-8") as out:
        for first in range(0, spans, per_line):
            batch = [_span(i, spans, rng) for i in range(first, min(first + per_line, spans))]
            line = {
                "resourceSpans": [
                    {"resource": resource, "scopeSpans": [{"scope": scope, "spans": batch}]}
                ]
            }
            out.write(json.dumps(line, separators=(",", ":")) + "\n")
    return path.stat().st_size


def parse_only(path: Path) -> None:
    """The baseline: parse every line with the same JSON library, keep nothing."""
    loads = json.loads
    with path.open("rb") as lines:
        for line in lines:
            loads(line)


def report(path: Path) -> Any:
    """The shares report, per day, grouped by model."""
    stats = ReadStats()
    return shares_report(
        read_spans(path, stats), stats, bucket="day", by=semconv.GEN_AI_REQUEST_MODEL
    )


def _timed(run: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def _peak(run: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        run()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def measure(path: Path, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` wall and CPU times of both, interleaved, and their peak memory."""
    best = {"parse_wall": float("inf"), "parse_cpu": float("inf")}
    best.update({"report_wall": float("inf"), "report_cpu": float("inf")})
    for _ in range(repeats):
        for name, run in (("parse", lambda: parse_only(path)), ("report", lambda: report(path))):
            wall, cpu = _timed(run)
            best[f"{name}_wall"] = min(best[f"{name}_wall"], wall)
            best[f"{name}_cpu"] = min(best[f"{name}_cpu"], cpu)
    best["parse_peak"] = _peak(lambda: parse_only(path))
    best["report_peak"] = _peak(lambda: report(path))
    return best


def main() -> None:
    """Write two files, time both paths on each, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=250_000, help="spans in the large file")
    parser.add_argument("--small", type=int, default=50_000, help="spans in the small file")
    parser.add_argument("--per-line", type=int, default=64, help="spans per line (one export)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=None, help="where to write the files")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = []
        for spans in (args.small, args.spans):
            path = Path(tmp) / f"spans-{spans}.otlp.jsonl"
            size = write_file(path, spans, args.per_line)
            figures = measure(path, args.repeats)
            check = report(path)
            assert check.input["attributed_spans"] == spans, check.input
            rows.append((spans, size, figures))
            path.unlink()

    print(
        f"shares report vs json.loads alone, {args.per_line} spans per line, "
        f"best of {args.repeats} (wall and CPU seconds)"
    )
    header = (
        f"{'spans':>9} {'file MB':>8} {'parse s':>8} {'report s':>9} {'ratio':>6} "
        f"{'parse cpu':>10} {'report cpu':>11} {'cpu ratio':>10} "
        f"{'parse peak MiB':>15} {'report peak MiB':>16}"
    )
    print(header)
    for spans, size, f in rows:
        print(
            f"{spans:>9,} {size / 1e6:>8.0f} {f['parse_wall']:>8.2f} {f['report_wall']:>9.2f} "
            f"{f['report_wall'] / f['parse_wall']:>6.2f} {f['parse_cpu']:>10.2f} "
            f"{f['report_cpu']:>11.2f} {f['report_cpu'] / f['parse_cpu']:>10.2f} "
            f"{f['parse_peak'] / 2**20:>15.2f} {f['report_peak'] / 2**20:>16.2f}"
        )
    large = rows[-1][2]
    ratio = large["report_cpu"] / large["parse_cpu"]
    print(
        f"goal: report within 2x of the parse alone at {rows[-1][0]:,} spans: "
        f"{'met' if ratio <= 2 else 'MISSED'} ({ratio:.2f}x CPU, "
        f"{large['report_wall'] / large['parse_wall']:.2f}x wall)"
    )
    grow = rows[-1][2]["report_peak"] / max(rows[0][2]["report_peak"], 1)
    print(
        f"peak memory, large / small file: {grow:.2f} "
        f"(files differ {rows[-1][0] / rows[0][0]:.0f}x in size)"
    )


if __name__ == "__main__":
    main()
