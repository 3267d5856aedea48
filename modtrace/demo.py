"""``modtrace demo``: a simulated week of traffic through the whole library, and its report.

The week starts text-heavy. Mid-week a feature launch lets users attach
photos: from then on most requests carry an image while their total prompt
tokens stay about the same, so a blended per-request price hides the shift.
Every request goes through the real path:

1. a real request body, with real JPEG and WAV bytes generated here;
2. counted by :class:`~modtrace.counting.RequestCounter` (``qwen2.5-omni``);
3. timed by an engine: the reference engine (a tiny random Qwen2.5-Omni on
   the CPU) when ``modtrace[engine]`` is installed, else a documented cost
   model; either way the figures are SIMULATED and labelled so;
4. one inference span per request, replayed at its simulated time;
5. the :class:`~modtrace.processor.AttributionSpanProcessor`, the OTLP JSON
   lines file exporter (and OTLP when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set);
6. the shares and drift reports read back from that file, and a chart.

The cost model, per request (seconds of one GPU, before noise)::

    vision_encoder = 0.004 per image  + 0.00030 per image token
    audio_encoder  = 0.006 per clip   + 0.0040  per audio second
    prefill        = 0.00009 per prompt token (text + image + audio tokens)
    decode         = 0.011 per output token

each multiplied by log-normal noise (sigma 0.05). The figures are
illustrative, of the order of a 7B model on one data-centre GPU; they are
not measurements.
"""

from __future__ import annotations

import base64
import importlib.util
import io
import json
import math
import os
import random
import wave
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Literal

from . import semconv
from .calibration import Calibration
from .cost import Rate
from .counting import CountingConfig, RequestCount, RequestCounter
from .timers import GpuTimers

__all__ = ["COST_MODEL", "DemoConfig", "DemoResult", "run_demo"]

PROFILE = "qwen2.5-omni"
MODEL = "qwen2.5-omni-demo"
WORDS = (
    "the quarterly report shows revenue growth in every region while support tickets "
    "about invoices and refunds fell please summarise the key risks and suggest next steps "
    "for the product team including pricing onboarding and retention"
).split()

#: The cost model's coefficients (GPU seconds), documented in the module docstring.
COST_MODEL: dict[str, float] = {
    "image": 0.004,
    "image_token": 0.00030,
    "clip": 0.006,
    "audio_second": 0.0040,
    "prompt_token": 0.00009,
    "output_token": 0.011,
    "noise_sigma": 0.05,
}


@dataclass(frozen=True)
class DemoConfig:
    """Settings of the simulated week.

    Attributes:
        out: The output folder.
        days: Length of the simulation.
        requests_per_day: Mean requests per day.
        launch_day: When the image feature launches (days from the start).
        seed: Seed of every random choice: the same seed gives the same week.
        engine: ``auto`` (the reference engine when installed), ``reference`` or ``model``.
        usd_per_gpu_hour: The hypothetical price of a GPU hour.
        start: Midnight UTC of the first day; default the Monday a week before today.
    """

    out: Path = Path("modtrace-demo")
    days: int = 7
    requests_per_day: int = 60
    launch_day: float = 3.5
    seed: int = 7
    engine: Literal["auto", "reference", "model"] = "auto"
    usd_per_gpu_hour: float = 2.0
    start: datetime | None = None


@dataclass
class DemoResult:
    """What the demo wrote and found."""

    spans: Path
    report: Path
    chart: Path | None
    engine: str
    requests: int
    summary: str
    drift_flags: list[dict[str, Any]] = field(default_factory=list)


# --- Media, generated once ---------------------------------------------------------------
def _jpeg(width: int, height: int, seed: int) -> str:
    from PIL import Image

    rng = random.Random(seed)
    # A coarse random mosaic scaled up: compresses like a photo, not like a flat colour.
    small = Image.new("RGB", (16, 12))
    small.putdata([tuple(rng.randrange(256) for _ in range(3)) for _ in range(16 * 12)])
    buf = io.BytesIO()
    small.resize((width, height), Image.BILINEAR).save(buf, "JPEG", quality=85)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def _wav(seconds: float, rate: int = 16000) -> str:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        frames = bytearray()
        for i in range(round(seconds * rate)):
            value = int(3000 * math.sin(2 * math.pi * 440 * i / rate))
            frames += value.to_bytes(2, "little", signed=True)
        w.writeframes(bytes(frames))
    return base64.b64encode(buf.getvalue()).decode()


class _Media:
    """A small library of encoded media: counting reads headers, so reuse is faithful."""

    def __init__(self, seed: int) -> None:
        # Phone photos after the launch; the odd small diagram before it.
        self.photos = [_jpeg(896, 672, seed + i) for i in range(3)] + [_jpeg(672, 896, seed + 9)]
        self.diagram = _jpeg(448, 448, seed + 20)
        self.clip = _wav(12.0)


# --- The workload ------------------------------------------------------------------------
def _words(rng: random.Random, tokens: int) -> str:
    # About 4 bytes per token for the default byte estimator: 1 word + space per 1.5 tokens.
    return " ".join(rng.choice(WORDS) for _ in range(max(1, round(tokens / 1.5))))


def _request(rng: random.Random, media: _Media, launched: bool) -> dict[str, Any]:
    """One chat request: text-heavy before the launch, mostly text + photo after it."""
    parts: list[dict[str, Any]] = []
    roll = rng.random()
    if launched and roll < 0.70:
        # The new feature: a photo and a short question, about as many tokens in all.
        parts.append({"type": "image_url", "image_url": {"url": rng.choice(media.photos)}})
        parts.append({"type": "text", "text": _words(rng, rng.gauss(330, 60))})
    elif roll > 0.95:
        parts.append({"type": "input_audio", "input_audio": {"data": media.clip, "format": "wav"}})
        parts.append({"type": "text", "text": _words(rng, rng.gauss(600, 80))})
    elif roll > 0.90:
        parts.append({"type": "image_url", "image_url": {"url": media.diagram}})
        parts.append({"type": "text", "text": _words(rng, rng.gauss(1000, 120))})
    else:
        parts.append({"type": "text", "text": _words(rng, rng.gauss(1150, 150))})
    return {
        "model": MODEL,
        "messages": [
            {"role": "system", "content": "You are a concise assistant."},
            {"role": "user", "content": parts},
        ],
        "max_tokens": 12,
    }


def _schedule(config: DemoConfig, rng: random.Random) -> list[float]:
    """Request times in days from the start: a diurnal curve, busiest mid-afternoon UTC."""
    times = []
    for day in range(config.days):
        n = max(1, round(rng.gauss(config.requests_per_day, config.requests_per_day * 0.05)))
        while n:
            hour = rng.random() * 24
            if rng.random() < 0.35 + 0.65 * math.sin(math.pi * hour / 24) ** 2:
                times.append(day + hour / 24)
                n -= 1
    return sorted(times)


# --- Engines -----------------------------------------------------------------------------
Engine = Callable[[dict[str, Any], RequestCount, int], GpuTimers]


def cost_model_engine(seed: int) -> Engine:
    """The documented cost model as an engine: component timers from the counted units."""
    rng = random.Random(seed)
    c = COST_MODEL

    def noisy(seconds: float) -> float:
        return seconds * math.exp(rng.gauss(0.0, c["noise_sigma"]))

    def run(body: dict[str, Any], count: RequestCount, output_tokens: int) -> GpuTimers:
        u = count.units
        prompt = u["text.tokens"] + u["image.tokens"] + u["audio.tokens"]
        parts = {
            "vision_encoder": c["image"] * u["image.count"] + c["image_token"] * u["image.tokens"],
            "audio_encoder": c["clip"] * u["audio.count"] + c["audio_second"] * u["audio.seconds"],
            "prefill": c["prompt_token"] * prompt,
            "decode": c["output_token"] * output_tokens,
        }
        timed = {k: noisy(v) for k, v in parts.items() if v > 0}
        return GpuTimers(total=math.fsum(timed.values()), source="simulated_cost_model", **timed)

    return run


def reference_engine() -> Engine:
    """The reference engine in-process: real encoders and a real LM on the CPU."""
    from .engine.reference import EngineConfig, ReferenceEngine

    engine = ReferenceEngine(EngineConfig(model_name=MODEL))
    warmed = False

    def run(body: dict[str, Any], count: RequestCount, output_tokens: int) -> GpuTimers:
        nonlocal warmed
        if not warmed:
            # The first passes pay for allocations and kernel selection: keep
            # them out of the week, as a server's warm-up would.
            for _ in range(3):
                engine.complete(body)
            warmed = True
        timers = engine.complete(body).timers
        # CPU seconds stand in for GPU seconds: say so on every span.
        return timers.model_copy(update={"source": f"simulated_{timers.source}_cpu"})

    return run


def _engine_available() -> bool:
    return all(importlib.util.find_spec(m) for m in ("torch", "transformers"))


# --- The run -----------------------------------------------------------------------------
def _week_start(now: datetime) -> datetime:
    monday = (now - timedelta(days=now.weekday() + 7)).date()
    return datetime(monday.year, monday.month, monday.day, tzinfo=timezone.utc)


def _demo_calibration(created: datetime) -> Calibration:
    """Marginal weights of the cost model: what a probe run of it would find."""
    c = COST_MODEL
    return Calibration(
        version="demo-cost-model-1",
        created=created,
        model=MODEL,
        preprocessor=f"{PROFILE} (modtrace demo)",
        engine="simulated cost model",
        weights={
            "text.tokens": c["prompt_token"],
            "image.tokens": c["prompt_token"] + c["image_token"],
            "image.count": c["image"],
            "audio.tokens": c["prompt_token"],
            "audio.seconds": c["audio_second"],
            "audio.count": c["clip"],
        },
    )


def run_demo(config: DemoConfig, progress: Callable[[int, int], None] | None = None) -> DemoResult:
    """Simulate the week, write spans, report and chart into ``config.out``.

    Args:
        config: The simulation's settings.
        progress: Called with ``(done, total)`` requests as the week runs.
    """
    from .export import configure
    from .report import (
        DriftConfig,
        ReadStats,
        drift_report,
        read_spans,
        render,
        shares_report,
        write_chart,
    )

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    spans_path = out / "spans.otlp.jsonl"
    spans_path.unlink(missing_ok=True)

    use_reference = config.engine == "reference" or (
        config.engine == "auto" and _engine_available()
    )
    engine = reference_engine() if use_reference else cost_model_engine(config.seed)
    engine_label = (
        "reference engine (CPU seconds, simulated)" if use_reference else ("cost model (simulated)")
    )

    start = config.start or _week_start(datetime.now(timezone.utc))
    start_ns = int(start.timestamp()) * 10**9
    rng = random.Random(config.seed)
    media = _Media(config.seed)
    counter = RequestCounter(CountingConfig(profile=PROFILE))
    rate = Rate(usd_per_gpu_hour=config.usd_per_gpu_hour, id="demo-hypothetical")
    exporters = ["file"] + (["otlp"] if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") else [])
    telemetry = configure(
        service_name="modtrace-demo",
        exporters=exporters,
        file=spans_path,
        calibration=_demo_calibration(created=start - timedelta(days=2)),
        rate=rate,
        resource_attributes={semconv.DEMO: True, semconv.DEMO_ENGINE: engine_label},
        set_global=False,
        sdk_metrics=False,
    )
    from .spans import inference_span

    schedule = _schedule(config, rng)
    try:
        for done, day in enumerate(schedule, 1):
            body = _request(rng, media, launched=day >= config.launch_day)
            begin = start_ns + int(day * 86_400 * 10**9)
            with inference_span(
                MODEL,
                counter=counter,
                request=body,
                tracer_provider=telemetry.tracer_provider,
                meter_provider=telemetry.meter_provider,
                attributes={"app.feature": "photos" if day >= config.launch_day else "chat"},
                start_time=begin,
            ) as span:
                count = span.request_count
                timers = engine(body, count, body["max_tokens"]) if count else None
                if timers is not None:
                    span.set_timers(timers)
                    span.end_time = begin + int((timers.total or 0) * 10**9)
            if progress:
                progress(done, len(schedule))
    finally:
        telemetry.shutdown()

    def report_of(build: Callable[..., Any], **options: Any) -> Any:
        stats = ReadStats()
        return build(read_spans(spans_path, stats), stats, **options)

    daily = report_of(shares_report, bucket="day")
    weekly = report_of(shares_report, bucket="week")
    drift = report_of(drift_report, bucket="day", config=DriftConfig())
    chart = out / "shares.png"
    try:
        write_chart(daily, chart)
    except ImportError:
        chart = None  # matplotlib is optional: pip install 'modtrace[plots]'
    flags = drift.extra.get("flags", [])
    report = {
        "simulated": True,
        "hypothetical_usd": True,
        "engine": engine_label,
        "profile": PROFILE,
        "requests": len(schedule),
        "week_start": start.isoformat(),
        "launch": (start + timedelta(days=config.launch_day)).isoformat(),
        "cost_model": COST_MODEL if not use_reference else None,
        "shares_weekly": weekly.to_dict(),
        "shares_daily": daily.to_dict(),
        "drift": drift.to_dict(),
    }
    report_path = out / "report.json"
    report_path.write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    # The daily drift table is wide: the terminal gets its flags, report.json all of it.
    drift_lines = drift.extra.get("summary", []) or ["no drift flagged"]
    summary = "\n\n".join(
        [
            render(weekly, "table"),
            "Drift per day (flags; every bucket and metric: report.json or "
            f"`modtrace report drift {spans_path}`)\n" + "\n".join(f"  {x}" for x in drift_lines),
        ]
    )
    return DemoResult(
        spans=spans_path,
        report=report_path,
        chart=chart,
        engine=engine_label,
        requests=len(schedule),
        summary=summary,
        drift_flags=list(flags),
    )
