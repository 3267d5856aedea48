"""Header probing vs. the naive way, on the payloads a gateway really receives.

Times, in one run and one process:

* ``probe_image`` on a base64 1920x1080 JPEG (a photo-like image of
  300-600 kB), as a bare string and inside a ``data:`` URL, against a full
  ``base64.b64decode`` plus ``PIL.Image.open(...).load()``;
* ``probe_audio`` on 20 s of base64 16-bit WAV (mono 16 kHz, and stereo
  48 kHz), against a full ``b64decode`` plus a ``soundfile`` read of every
  frame (what vLLM does) and plus ``wave`` reading every frame;
* the same probes on MIME-wrapped base64 (76-character lines).

Times are CPU time per call, best of 5. Run:
``.venv/bin/python benchmarks/bench_media_probe.py``.
"""

from __future__ import annotations

import base64
import io
import time
import timeit
import wave
from collections.abc import Callable

import numpy as np
import soundfile as sf
from PIL import Image

from modtrace.counting.media import B64View, parse_data_url, probe_audio, probe_image


def per_call(fn: Callable[[], object], min_seconds: float = 0.25) -> float:
    """Best-of-5 CPU seconds per call, each repeat running long enough to be measurable.

    CPU time (``time.process_time``), not wall time: everything timed here is
    single-threaded, and CPU time stays stable on a shared, busy machine.
    """
    timer = timeit.Timer(fn, timer=time.process_time)
    number, _ = timer.autorange()
    number = max(1, int(number * min_seconds / 0.2))
    return min(timer.repeat(repeat=5, number=number)) / number


def photo_jpeg(rng: np.random.Generator) -> bytes:
    """A 1920x1080 JPEG with photo-like entropy: smooth gradients plus sensor-like noise."""
    y, x = np.mgrid[0:1080, 0:1920].astype(np.float32)
    base = np.stack([x / 1920 * 255, y / 1080 * 255, (x + y) / 3000 * 255], axis=-1)
    noisy = np.clip(base + rng.normal(0, 6, base.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(noisy, "RGB").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def speech_wav(seconds: float, rate: int, channels: int, rng: np.random.Generator) -> bytes:
    """``seconds`` of 16-bit PCM WAV."""
    n = int(seconds * rate)
    pcm = (rng.normal(0, 0.1, (n, channels)) * 32767).astype("<i2")
    buf = io.BytesIO()
    sf.write(buf, pcm, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


def naive_image(text: str) -> tuple[int, int]:
    """What a gateway does without a header probe."""
    with Image.open(io.BytesIO(base64.b64decode(text))) as im:
        im.load()
        return im.size


def naive_audio_soundfile(text: str) -> float:
    """Decode everything, as vLLM's loader does, and count."""
    data, rate = sf.read(io.BytesIO(base64.b64decode(text)), dtype="float32")
    return len(data) / rate


def naive_audio_wave(text: str) -> float:
    """Decode the base64 and read every frame with the standard library."""
    with wave.open(io.BytesIO(base64.b64decode(text))) as w:
        frames = w.readframes(w.getnframes())
        return len(frames) / w.getsampwidth() / w.getnchannels() / w.getframerate()


def report(
    name: str, fast: Callable[[], object], slow: Callable[[], object], slow_name: str
) -> None:
    """Time both, check they agree, print one line."""
    t_fast, t_slow = per_call(fast), per_call(slow)
    print(
        f"{name:44s} probe {t_fast * 1e6:9.1f} us   {slow_name:28s} {t_slow * 1e6:10.1f} us"
        f"   x{t_slow / t_fast:8.0f}"
    )


def main() -> None:
    """Run every comparison and print a table."""
    rng = np.random.default_rng(0)
    jpeg = photo_jpeg(rng)
    jpeg_b64 = base64.b64encode(jpeg).decode()
    jpeg_mime = base64.encodebytes(jpeg).decode()
    url = "data:image/jpeg;name=photo.jpg;base64," + jpeg_b64
    size = naive_image(jpeg_b64)
    assert (probe_image(B64View(jpeg_b64)).width, probe_image(B64View(jpeg_b64)).height) == size
    print(
        f"JPEG {size[0]}x{size[1]}: {len(jpeg) / 1e3:.0f} kB, base64 {len(jpeg_b64) / 1e3:.0f} kB"
    )

    report(
        "image: base64 str",
        lambda: probe_image(B64View(jpeg_b64)),
        lambda: naive_image(jpeg_b64),
        "b64decode + Image.load()",
    )
    report(
        "image: data: URL (parse + probe)",
        lambda: probe_image(parse_data_url(url).source()),
        lambda: naive_image(url.partition(",")[2]),
        "b64decode + Image.load()",
    )
    report(
        "image: data: URL viewed in place (no copy)",
        lambda: probe_image(B64View(url, start=url.index(",") + 1)),
        lambda: naive_image(url.partition(",")[2]),
        "b64decode + Image.load()",
    )
    report(
        "image: MIME base64 (76-char lines)",
        lambda: probe_image(B64View(jpeg_mime)),
        lambda: naive_image(jpeg_mime),
        "b64decode + Image.load()",
    )
    report(
        "image: header only, naive (no pixel decode)",
        lambda: probe_image(B64View(jpeg_b64)),
        lambda: Image.open(io.BytesIO(base64.b64decode(jpeg_b64))).size,
        "b64decode + Image.open().size",
    )

    for rate, channels in ((16000, 1), (48000, 2)):
        wav = speech_wav(20.0, rate, channels, rng)
        wav_b64 = base64.b64encode(wav).decode()
        assert probe_audio(B64View(wav_b64)).seconds == naive_audio_soundfile(wav_b64) == 20.0
        label = f"audio: 20 s WAV {rate // 1000} kHz x{channels} ({len(wav_b64) / 1e6:.1f} MB b64)"
        report(
            label,
            lambda s=wav_b64: probe_audio(B64View(s), "wav"),
            lambda s=wav_b64: naive_audio_soundfile(s),
            "b64decode + soundfile.read",
        )
        report(
            label,
            lambda s=wav_b64: probe_audio(B64View(s), "wav"),
            lambda s=wav_b64: naive_audio_wave(s),
            "b64decode + wave.readframes",
        )
    wav_mime = base64.encodebytes(speech_wav(20.0, 16000, 1, rng)).decode()
    report(
        "audio: 20 s WAV, MIME base64",
        lambda: probe_audio(B64View(wav_mime), "wav"),
        lambda: naive_audio_soundfile(wav_mime),
        "b64decode + soundfile.read",
    )


if __name__ == "__main__":
    main()
