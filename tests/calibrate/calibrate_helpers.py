"""Synthetic probe records with known weights: the oracle of the fitting tests."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

from modtrace.calibrate.probes import ProbeRecord
from modtrace.timers import GpuTimers

#: Image sizes of the synthetic image probes.
IMAGE_SIZES: tuple[tuple[int, int], ...] = (
    (224, 224),
    (448, 448),
    (640, 480),
    (1024, 1024),
    (1280, 720),
    (1920, 1080),
)
TEXT_TOKENS: tuple[int, ...] = (20, 160, 640, 1300, 2600, 5200)
AUDIO_SECONDS: tuple[float, ...] = (1.0, 5.0, 10.0, 20.0, 30.0)


def image_units(width: int, height: int) -> dict[str, float]:
    """Units of one image: 448-pixel tiles plus a thumbnail, and one token per 28x28 block.

    Tiles and tokens are deliberately not proportional, so that the fit has
    a real choice to make; tokens follow pixels closely (as in Qwen-VL).
    """
    tiles = math.ceil(width / 448) * math.ceil(height / 448) + 1
    return {
        "image.count": 1.0,
        "image.pixels": float(width * height),
        "image.tiles": float(tiles),
        "image.tokens": float(math.ceil(width / 28) * math.ceil(height / 28)),
    }


def audio_units(seconds: float) -> dict[str, float]:
    """Units of one clip: 100 encoder frames and 25 tokens per second."""
    return {
        "audio.count": 1.0,
        "audio.seconds": seconds,
        "audio.frames": 100.0 * seconds,
        "audio.tokens": 25.0 * seconds,
    }


def synthetic_records(
    weights: Mapping[str, float],
    overhead: float,
    sigma: float,
    rng: np.random.Generator,
    *,
    repeats: int = 3,
    prompt_tokens: int = 8,
    images: Sequence[tuple[int, int]] = IMAGE_SIZES,
    audio: Sequence[float] = AUDIO_SECONDS,
) -> list[ProbeRecord]:
    """Single-modality probe records whose GPU seconds follow a known linear model.

    ``gpu_seconds = overhead + sum(weights[u] * units[u]) + N(0, sigma)``: the
    assumptions under which classical OLS intervals are exact.
    """
    rows: list[tuple[str, str, dict[str, float]]] = []
    for tokens in TEXT_TOKENS:
        rows.append(("text", f"{tokens}t", {"text.tokens": float(tokens)}))
    for w, h in images:
        rows.append(("image", f"{w}x{h}", {"text.tokens": prompt_tokens, **image_units(w, h)}))
    for s in audio:
        rows.append(("audio", f"{s:g}s", {"text.tokens": prompt_tokens, **audio_units(s)}))
    records = []
    for modality, size, units in rows:
        for r in range(repeats):
            mean = overhead + sum(weights.get(u, 0.0) * c for u, c in units.items())
            total = max(mean + rng.normal(0.0, sigma), 0.0)
            records.append(
                ProbeRecord(
                    id=f"{modality}/{size}/r{r}",
                    kind="probe",
                    modality=modality,
                    size=size,
                    status="ok",
                    units=units,
                    timers=GpuTimers(total=total),
                )
            )
    return records
