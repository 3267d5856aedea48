"""Real media bytes made at test time, and the base64 forms a request may carry them in.

Images come from Pillow, audio from soundfile (libsndfile: WAV, FLAC, Ogg,
MP3 through LAME/mpg123) and PyAV (FFmpeg: MP3 with ID3 and Xing/LAME tags,
MP4/M4A). Nothing is stored in the repository.
"""

from __future__ import annotations

import base64
import io
import struct
from pathlib import Path

import av
import numpy as np
import soundfile as sf
from PIL import Image

from modtrace.counting.media import B64View

# --- base64 forms -------------------------------------------------------------


def b64_forms(raw: bytes) -> dict[str, str]:
    """The ways a gateway may receive ``raw`` as base64 text."""
    std = base64.b64encode(raw).decode()
    return {
        "std": std,
        "nopad": std.rstrip("="),
        "urlsafe": base64.urlsafe_b64encode(raw).decode(),
        "urlsafe_nopad": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "mime": base64.encodebytes(raw).decode(),  # 76-char lines, "\n"
        "mime_crlf": base64.encodebytes(raw).decode().replace("\n", "\r\n"),
        "pem64": "\n".join(std[i : i + 64] for i in range(0, len(std), 64)),
        "irregular": irregular(std),
    }


def irregular(std: str) -> str:
    """``std`` with whitespace at irregular places (no fixed line length)."""
    out, i, step = [], 0, 3
    while i < len(std):
        out.append(std[i : i + step])
        i += step
        step = step % 11 + 2
    return " \t\n".join(out)


SOURCES = ("bytes", "b64", "b64_mime_crlf", "b64_urlsafe_nopad", "b64_irregular")


def as_source(raw: bytes, kind: str) -> bytes | B64View:
    """``raw`` as a probe input of the given kind."""
    if kind == "bytes":
        return raw
    std = base64.b64encode(raw).decode()
    text = {
        "b64": std,
        "b64_mime_crlf": base64.encodebytes(raw).decode().replace("\n", "\r\n"),
        "b64_urlsafe_nopad": base64.urlsafe_b64encode(raw).decode().rstrip("="),
        "b64_irregular": irregular(std),
    }[kind]
    return B64View(text)


# --- images -------------------------------------------------------------------


def gradient(size: tuple[int, int], mode: str = "RGB") -> Image.Image:
    """A deterministic non-flat image, so encoders produce real entropy-coded data."""
    w, h = size
    y, x = np.mgrid[0:h, 0:w]
    rgb = np.stack([(x * 7) % 256, (y * 5) % 256, ((x + y) * 3) % 256], axis=-1).astype(np.uint8)
    return Image.fromarray(rgb, "RGB").convert(mode)


def encode_image(im: Image.Image, fmt: str, **params: object) -> bytes:
    """Save ``im`` with Pillow and return the bytes."""
    buf = io.BytesIO()
    im.save(buf, fmt, **params)
    return buf.getvalue()


def pillow_size(raw: bytes) -> tuple[int, int]:
    """The oracle: the size Pillow (hence vLLM's ``Image.open``) gives the image."""
    with Image.open(io.BytesIO(raw)) as im:
        return im.size


def jpeg_segments(raw: bytes) -> list[tuple[int, int]]:
    """``(offset, marker)`` of each marker segment before the first scan.

    Only used to choose where to splice bytes into a Pillow-made JPEG.
    """
    out, pos = [], 2
    while True:
        marker = raw[pos + 1]
        out.append((pos, marker))
        if marker == 0xDA:
            return out
        pos += 2 + int.from_bytes(raw[pos + 2 : pos + 4], "big")


def tiff_bytes(size: tuple[int, int], order: str, side_type: int) -> bytes:
    """A minimal uncompressed 8-bit grayscale TIFF, one strip.

    Args:
        size: ``(width, height)``.
        order: ``"<"`` (II, little endian) or ``">"`` (MM, big endian).
        side_type: 3 (SHORT) or 4 (LONG) for ImageWidth and ImageLength.
    """
    w, h = size
    pixels = bytes((i * 37) % 256 for i in range(w * h))
    entries = [
        (256, side_type, 1, w),
        (257, side_type, 1, h),
        (258, 3, 1, 8),  # BitsPerSample
        (259, 3, 1, 1),  # Compression: none
        (262, 3, 1, 1),  # PhotometricInterpretation: BlackIsZero
        (273, 4, 1, 0),  # StripOffsets, patched below
        (277, 3, 1, 1),  # SamplesPerPixel
        (278, 4, 1, h),  # RowsPerStrip
        (279, 4, 1, len(pixels)),  # StripByteCounts
    ]
    ifd_size = 2 + 12 * len(entries) + 4
    strip_at = 8 + ifd_size
    head = (b"II" if order == "<" else b"MM") + struct.pack(order + "HI", 42, 8)
    ifd = struct.pack(order + "H", len(entries))
    for tag, typ, count, value in entries:
        value = strip_at if tag == 273 else value
        field = (
            struct.pack(order + "H", value) + b"\0\0"
            if typ == 3
            else struct.pack(order + "I", value)
        )
        ifd += struct.pack(order + "HHI", tag, typ, count) + field
    ifd += struct.pack(order + "I", 0)
    return head + ifd + pixels


# --- audio --------------------------------------------------------------------


def tone(n: int, rate: int, channels: int = 1) -> np.ndarray:
    """``n`` frames of a 440 Hz tone, float32, shape ``(n,)`` or ``(n, channels)``."""
    x = (0.3 * np.sin(np.arange(n) * 2 * np.pi * 440 / rate)).astype(np.float32)
    return x if channels == 1 else np.repeat(x[:, None], channels, axis=1)


def sf_encode(n: int, rate: int, fmt: str, subtype: str | None = None, channels: int = 1) -> bytes:
    """Encode ``n`` frames with soundfile (libsndfile)."""
    buf = io.BytesIO()
    sf.write(buf, tone(n, rate, channels), rate, format=fmt, subtype=subtype)
    return buf.getvalue()


def sf_decoded_frames(raw: bytes) -> int:
    """The oracle: frames vLLM's first decoder (soundfile) returns when it decodes ``raw``."""
    data, _ = sf.read(io.BytesIO(raw), dtype="float32", always_2d=True)
    return data.shape[0]


def sf_rate(raw: bytes) -> int:
    """Sample rate soundfile decodes ``raw`` at."""
    return sf.info(io.BytesIO(raw)).samplerate


def av_encode(
    n: int,
    rate: int,
    container: str,
    codec: str,
    channels: int = 1,
    options: dict[str, str] | None = None,
    path: Path | None = None,
) -> bytes:
    """Encode ``n`` frames with PyAV (FFmpeg), through ``path`` when the muxer must seek."""
    buf = io.BytesIO()
    layout = "mono" if channels == 1 else "stereo"
    target = str(path) if path is not None else buf
    with av.open(target, "w", format=container, options=options or {}) as out:
        stream = out.add_stream(codec, rate=rate, layout=layout)
        sample_fmt = stream.codec_context.format.name
        planar = sample_fmt.endswith("p")
        dtype = {"flt": np.float32, "s16": np.int16, "s32": np.int32}[sample_fmt.rstrip("p")]
        x = tone(n, rate)
        for i in range(0, n, 1024):
            seg = x[i : i + 1024]
            if dtype is not np.float32:
                seg = (seg * np.iinfo(dtype).max).astype(dtype)
            arr = np.tile(seg, (channels, 1)) if planar else np.repeat(seg, channels)[None, :]
            frame = av.AudioFrame.from_ndarray(
                np.ascontiguousarray(arr), format=sample_fmt, layout=layout
            )
            frame.sample_rate = rate
            frame.pts = i
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)
    return path.read_bytes() if path is not None else buf.getvalue()


def av_decoded(raw: bytes) -> tuple[int, int]:
    """The oracle where libsndfile has no reader: ``(frames, rate)`` PyAV decodes."""
    with av.open(io.BytesIO(raw)) as container:
        stream = container.streams.audio[0]
        return sum(f.samples for f in container.decode(stream)), stream.rate


def riff(chunks: list[tuple[bytes, bytes]], form: bytes = b"WAVE") -> bytes:
    """A RIFF file of ``chunks``, each padded to an even size as the spec says."""
    body = form
    for cid, data in chunks:
        body += cid + struct.pack("<I", len(data)) + data + (b"\0" if len(data) % 2 else b"")
    return b"RIFF" + struct.pack("<I", len(body)) + body


def wav_fmt(channels: int, rate: int, bits: int, tag: int = 1) -> bytes:
    """A 16-byte ``fmt `` chunk body."""
    block = channels * bits // 8
    return struct.pack("<HHIIHH", tag, channels, rate, rate * block, block, bits)
