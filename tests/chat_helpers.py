"""Chat requests with real media: noisy PNGs and WAVs, really encoded, as content parts."""

from __future__ import annotations

import base64
import io
from typing import Any

import numpy as np
import soundfile
from PIL import Image


def png(width: int, height: int, seed: int = 0) -> bytes:
    """A noisy RGB PNG of the given size."""
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, "PNG")
    return out.getvalue()


def wav(samples: int, rate: int = 16000, seed: int = 0) -> bytes:
    """A 16-bit PCM WAV of noise (libsndfile writes it)."""
    wave = np.random.default_rng(seed).uniform(-0.5, 0.5, samples).astype(np.float32)
    out = io.BytesIO()
    soundfile.write(out, wave, rate, format="WAV", subtype="PCM_16")
    return out.getvalue()


def image_part(data: bytes) -> dict[str, Any]:
    """An ``image_url`` part with a base64 ``data:`` URL."""
    url = "data:image/png;base64," + base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": url}}


def audio_part(data: bytes) -> dict[str, Any]:
    """An ``input_audio`` part."""
    return {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"},
    }


def messages(*parts: dict[str, Any], text: str = "Describe these.") -> list[dict[str, Any]]:
    """One system and one user message holding ``parts``."""
    return [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": text}, *parts]},
    ]


def mixed_parts() -> tuple[dict[str, Any], ...]:
    """Two images and two clips of odd sizes (16 kHz, as the reference engine wants)."""
    return (
        image_part(png(320, 240)),
        audio_part(wav(24_000)),
        image_part(png(57, 911, seed=1)),
        audio_part(wav(53_921, seed=2)),
    )
