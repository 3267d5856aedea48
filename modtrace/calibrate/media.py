"""Real, encoded probe media made on the spot: PNG/JPEG images, WAV audio, MJPEG AVI video.

Probes must reach the engine as the bytes a client would send, so each
item is encoded in a standard container: images with Pillow, audio with the
standard library's :mod:`wave`, video as Motion-JPEG frames in an AVI
(RIFF) file written here in a few lines. FFmpeg decodes MJPEG AVI (the
tests check it through PyAV); vLLM's video loaders (``vllm/multimodal/video.py``:
OpenCV by default, PyAV for some models) go through FFmpeg.

Content is seeded and cheap to compress, and it differs from seed to seed:
repeats of a probe must not hit the engine's prefix or multimodal caches.
"""

from __future__ import annotations

import base64
import io
import math
import random
import struct
import wave
from fractions import Fraction

from PIL import Image, ImageDraw

__all__ = [
    "avi_mjpeg",
    "data_url",
    "image_bytes",
    "make_image",
    "video_frame_count",
    "wav_bytes",
]


def data_url(mime: str, data: bytes) -> str:
    """``data:<mime>;base64,<data>``, as OpenAI-style clients inline media."""
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"


def make_image(width: int, height: int, seed: int) -> Image.Image:
    """A seeded RGB picture: a coloured gradient with a few shapes on it.

    Args:
        width: Width in pixels.
        height: Height in pixels.
        seed: Picks the colours and the shapes.
    """
    if width <= 0 or height <= 0:
        msg = f"image size must be positive, got {width}x{height}"
        raise ValueError(msg)
    rng = random.Random(seed)
    # A 256-pixel gradient scaled up is fast at any size and compresses well.
    ramp = Image.linear_gradient("L").rotate(rng.choice((0, 90, 180, 270)))
    low = tuple(rng.randrange(0, 128) for _ in range(3))
    high = tuple(rng.randrange(128, 256) for _ in range(3))
    channels = [
        ramp.point(lambda v, a=a, b=b: a + (b - a) * v // 255)
        for a, b in zip(low, high, strict=True)
    ]
    picture = Image.merge("RGB", channels).resize((width, height))
    draw = ImageDraw.Draw(picture)
    for _ in range(6):
        x0, x1 = sorted(rng.randrange(0, width + 1) for _ in range(2))
        y0, y1 = sorted(rng.randrange(0, height + 1) for _ in range(2))
        colour = tuple(rng.randrange(0, 256) for _ in range(3))
        shape = draw.ellipse if rng.random() < 0.5 else draw.rectangle
        shape((x0, y0, x1, y1), fill=colour)
    return picture


def image_bytes(width: int, height: int, seed: int, fmt: str = "png") -> tuple[bytes, str]:
    """An encoded seeded image and its MIME type.

    Args:
        width: Width in pixels.
        height: Height in pixels.
        seed: Picks the content.
        fmt: ``png`` or ``jpeg``.

    Returns:
        The file bytes and ``image/png`` or ``image/jpeg``.
    """
    fmt = fmt.lower()
    if fmt not in ("png", "jpeg"):
        msg = f"image format must be png or jpeg, got {fmt!r}"
        raise ValueError(msg)
    out = io.BytesIO()
    picture = make_image(width, height, seed)
    if fmt == "png":
        picture.save(out, format="PNG", compress_level=1)
    else:
        picture.save(out, format="JPEG", quality=85)
    return out.getvalue(), f"image/{fmt}"


def wav_bytes(seconds: float, seed: int, sample_rate: int = 16000) -> bytes:
    """A seeded mono 16-bit PCM WAV file of ``seconds`` seconds.

    The content is a one-second seeded tone-plus-noise buffer repeated with a
    varying level: real audio, quick to make at any length.

    Args:
        seconds: Duration; rounded to whole samples.
        seed: Picks the tone and noise.
        sample_rate: Samples per second.
    """
    if not seconds > 0 or not math.isfinite(seconds):
        msg = f"audio duration must be a positive number of seconds, got {seconds!r}"
        raise ValueError(msg)
    if sample_rate <= 0:
        msg = f"sample rate must be positive, got {sample_rate}"
        raise ValueError(msg)
    rng = random.Random(seed)
    freq = rng.uniform(110.0, 880.0)
    second = [
        0.5 * math.sin(2 * math.pi * freq * i / sample_rate) + rng.uniform(-0.1, 0.1)
        for i in range(sample_rate)
    ]
    total = round(seconds * sample_rate)
    blocks = []
    for start in range(0, total, sample_rate):
        level = 8000 + rng.randrange(0, 8000)
        n = min(sample_rate, total - start)
        blocks.append(struct.pack(f"<{n}h", *(int(level * v) for v in second[:n])))
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(b"".join(blocks))
    return out.getvalue()


def video_frame_count(seconds: float, fps: float) -> int:
    """Frames a clip of ``seconds`` at ``fps`` holds (at least one)."""
    return max(1, round(seconds * fps))


def _chunk(fourcc: bytes, payload: bytes) -> bytes:
    # RIFF chunks are word-aligned: odd payloads get one pad byte.
    pad = b"\x00" if len(payload) % 2 else b""
    return fourcc + struct.pack("<I", len(payload)) + payload + pad


def _list(kind: bytes, payload: bytes) -> bytes:
    return _chunk(b"LIST", kind + payload)


def avi_mjpeg(
    seconds: float, fps: float, width: int, height: int, seed: int, quality: int = 80
) -> bytes:
    """A seeded Motion-JPEG AVI clip: ``round(seconds * fps)`` frames of ``width`` x ``height``.

    The layout is the classic AVI 1.0 file (``RIFF AVI`` with ``hdrl``,
    ``movi`` and an ``idx1`` index), one ``00dc`` chunk per JPEG frame.

    Args:
        seconds: Duration.
        fps: Frame rate; stored as an exact ratio (``dwRate / dwScale``).
        width: Frame width in pixels.
        height: Frame height in pixels.
        seed: Picks the content; a shape moves across frames.
        quality: JPEG quality of each frame.
    """
    if not fps > 0 or not math.isfinite(fps):
        msg = f"video fps must be positive, got {fps!r}"
        raise ValueError(msg)
    frames_n = video_frame_count(seconds, fps)
    base = make_image(width, height, seed)
    rng = random.Random(seed ^ 0x5EED)
    box = max(8, min(width, height) // 6)
    colour = tuple(rng.randrange(0, 256) for _ in range(3))
    frames = []
    for i in range(frames_n):
        frame = base.copy()
        x = (i * 7 * box // 8) % max(1, width - box)
        y = (i * 3 * box // 8) % max(1, height - box)
        ImageDraw.Draw(frame).rectangle((x, y, x + box, y + box), fill=colour)
        out = io.BytesIO()
        frame.save(out, format="JPEG", quality=quality)
        frames.append(out.getvalue())

    rate = Fraction(fps).limit_denominator(1001)
    usec_per_frame = round(1_000_000 / fps)
    biggest = max(len(f) for f in frames)
    avih = struct.pack(
        "<14I",
        usec_per_frame,
        round(biggest * fps),  # dwMaxBytesPerSec
        0,  # dwPaddingGranularity
        0x10,  # dwFlags: AVIF_HASINDEX
        frames_n,  # dwTotalFrames
        0,  # dwInitialFrames
        1,  # dwStreams
        biggest,  # dwSuggestedBufferSize
        width,
        height,
        0,
        0,
        0,
        0,
    )
    strh = (
        b"vidsMJPG"
        + struct.pack("<IHHIIIIIIII", 0, 0, 0, 0, rate.denominator, rate.numerator, 0, frames_n,
                      biggest, 0xFFFFFFFF, 0)
        + struct.pack("<4h", 0, 0, width, height)
    )  # fmt: skip
    strf = struct.pack(
        "<IiiHH4sIiiII", 40, width, height, 1, 24, b"MJPG", width * height * 3, 0, 0, 0, 0
    )
    hdrl = _list(
        b"hdrl",
        _chunk(b"avih", avih) + _list(b"strl", _chunk(b"strh", strh) + _chunk(b"strf", strf)),
    )
    movi_body = b""
    index = b""
    for data in frames:
        # idx1 offsets count from the 'movi' fourcc: 4 bytes before the first chunk.
        index += b"00dc" + struct.pack("<III", 0x10, 4 + len(movi_body), len(data))
        movi_body += _chunk(b"00dc", data)
    body = b"AVI " + hdrl + _list(b"movi", movi_body) + _chunk(b"idx1", index)
    return b"RIFF" + struct.pack("<I", len(body)) + body
