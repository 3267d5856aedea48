"""Image width and height from the header alone: PNG, JPEG, GIF, WebP, BMP, TIFF.

Each parser reads the few bytes Pillow's own ``_open`` reads to set
``Image.size``, so the size reported here is the size the engine's
processor receives. vLLM loads an image with ``Image.open(BytesIO(data))``
and converts its mode (vllm-project/vllm@vllm/multimodal/media/image.py,
``ImageMediaIO.load_bytes``); it never calls ``ImageOps.exif_transpose``,
and Hugging Face image processors do not either when handed a PIL image.
So the **stored** size is reported, not the displayed one: a phone photo
stored 4032x3024 with EXIF orientation 6 reaches the model as 4032x3024.
Only ``transformers.image_utils.load_image`` (used when a processor is
given a URL or path, e.g. by ``transformers serve``) applies the EXIF
orientation; :attr:`ImageHeader.orientation` and
:attr:`ImageHeader.upright_size` let a caller match such an engine. The
orientation is read from JPEG APP1 ``Exif``; other formats report 1. TIFF
is the exception that proves the rule: Pillow itself swaps a TIFF's size
for orientations 5-8 when it opens it and transposes the pixels when it
loads them (``TiffImageFile._setup`` and ``load_end``), so a TIFF is
reported upright, with orientation 1, because that is what the engine sees.

Sizes follow Pillow where formats leave room for choice: a GIF whose first
frame extends past the logical screen grows to cover it, a BMP with a
negative height (top-down rows) reports its absolute value, a WebP with a
``VP8X`` chunk reports its canvas.

Limits: a side of 0 or above :data:`MAX_SIDE` (2**31 - 1, the PNG maximum
and the largest ``int32``) is rejected, and so is an area above
:data:`MAX_PIXELS` (by default): that is Pillow's decompression-bomb limit,
``2 * Image.MAX_IMAGE_PIXELS`` with Pillow's default, above which
``Image.open`` raises ``DecompressionBombError``, so vLLM refuses the
request and there is nothing to count. An engine that raised Pillow's
limit can be matched with ``probe_image(data, max_pixels=...)``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from ._reader import Reader
from .b64 import B64View
from .errors import MediaError

__all__ = ["MAX_PIXELS", "MAX_SIDE", "ImageHeader", "probe_image"]

#: Largest width or height accepted, in pixels.
MAX_SIDE = 2**31 - 1
#: Largest area accepted by default: ``2 * PIL.Image.MAX_IMAGE_PIXELS`` at
#: Pillow's default (``1024 * 1024 * 1024 // 4 // 3``).
MAX_PIXELS = 2 * (1024 * 1024 * 1024 // 4 // 3)

_TAG_WIDTH, _TAG_LENGTH, _TAG_ORIENTATION = 256, 257, 274


@dataclass(frozen=True, slots=True)
class ImageHeader:
    """What an image header says.

    Attributes:
        format: ``"png"``, ``"jpeg"``, ``"gif"``, ``"webp"``, ``"bmp"`` or ``"tiff"``.
        width: Width in pixels of the image Pillow opens: the stored width (for
            TIFF, already oriented, since Pillow orients TIFFs itself).
        height: Height in pixels, likewise.
        orientation: EXIF orientation still to apply, 1 (none) to 8; 1 when absent.
    """

    format: str
    width: int
    height: int
    orientation: int = 1

    @property
    def upright_size(self) -> tuple[int, int]:
        """``(width, height)`` after ``ImageOps.exif_transpose``: swapped for 5-8."""
        if self.orientation >= 5:
            return self.height, self.width
        return self.width, self.height


def probe_image(data: bytes | B64View, *, max_pixels: int | None = MAX_PIXELS) -> ImageHeader:
    """Read an image's format and size from its header.

    Args:
        data: The encoded image: raw bytes, or a :class:`B64View` of its base64.
        max_pixels: Largest ``width * height`` accepted; ``None`` for no limit.

    Returns:
        The format, the stored width and height, and the EXIF orientation.

    Raises:
        MediaError: Unknown format, corrupt or truncated header, or a size out of range.
    """
    r = Reader(data, "image")
    head = r.read(0, 12)
    if not head:
        raise r.error("empty payload")
    for magic, fmt, parse in _SNIFF:
        if head.startswith(magic):
            r.fmt = fmt
            header = parse(r)
            break
    else:
        if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
            r.fmt = "WebP"
            header = _webp(r)
        else:
            # Lengths only: the bytes of a payload that is not an image stay out.
            raise r.error(f"unrecognised format ({len(r)} bytes)")
    _check_size(r, header.width, header.height, max_pixels)
    return header


def _check_size(r: Reader, width: int, height: int, max_pixels: int | None) -> None:
    for name, side in (("width", width), ("height", height)):
        if side <= 0 or side > MAX_SIDE:
            raise r.error(f"{name} {side} out of range (1..{MAX_SIDE})")
    if max_pixels is not None and width * height > max_pixels:
        msg = f"{width}x{height} exceeds {max_pixels} pixels (Pillow's decompression-bomb limit)"
        raise r.error(msg)


def _orientation(value: int | None) -> int:
    """Orientation as ``exif_transpose`` reads it: values outside 1-8 mean none."""
    return value if value is not None and 1 <= value <= 8 else 1


# --- PNG ---------------------------------------------------------------------
def _png(r: Reader) -> ImageHeader:
    length, ctype, width, height = r.unpack(">I4sII", 8, "IHDR chunk")
    if ctype != b"IHDR":
        raise r.error("first chunk is not IHDR")
    if length < 13:
        raise r.error(f"IHDR chunk of {length} bytes, expected 13")
    return ImageHeader("png", width, height)


# --- JPEG --------------------------------------------------------------------
# Start-of-frame markers: every 0xC0-0xCF except DHT (C4), JPG (C8), DAC (CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers Pillow reads without a length field (JpegImagePlugin.MARKER entries
# with no handler): JPG, RSTn, SOI, EOI, JPGn.
_NO_LENGTH = frozenset({0xC8, *range(0xD0, 0xDA), *range(0xF0, 0xFE)})


def _jpeg(r: Reader) -> ImageHeader:
    """Walk the segments up to the first SOF, as ``JpegImageFile._open`` does.

    Like Pillow: bytes between segments that are not 0xFF are skipped as
    junk, any run of 0xFF fill bytes may precede a marker (ITU T.81
    B.1.1.2), and 0xFF00 outside a scan is skipped.
    """
    pos = 2
    orientation = None
    while True:
        window = r.read(pos, 256)
        if not window:
            raise r.error("no frame header (SOF) before the end of the data")
        lead = window.find(b"\xff")
        if lead < 0:
            pos += len(window)
            continue
        pos += lead + 1
        while True:
            window = r.read(pos, 64)
            if not window:
                raise r.error(f"truncated marker at offset {pos}")
            rest = window.lstrip(b"\xff")
            pos += len(window) - len(rest)
            if rest:
                break
        marker = rest[0]
        pos += 1
        if marker == 0x00 or marker in _NO_LENGTH:
            continue
        if marker < 0xC0:
            raise r.error(f"invalid marker 0xFF{marker:02X} at offset {pos - 2}")
        if marker == 0xDA:
            raise r.error("start of scan before any frame header (SOF)")
        (length,) = r.unpack(">H", pos, "segment length")
        if length < 2:
            raise r.error(f"segment 0xFF{marker:02X} at offset {pos - 2} has length {length}")
        if marker in _SOF:
            precision, height, width = r.unpack(">BHH", pos + 2, "frame header")
            if height == 0:
                raise r.error("height 0 in frame header (DNL-defined height is unsupported)")
            if precision != 8:
                # Pillow refuses these at open ("cannot handle 12-bit layers").
                raise r.error(f"{precision}-bit samples, which Pillow cannot open")
            return ImageHeader("jpeg", width, height, _orientation(orientation))
        # Pillow keeps the first Exif APP1 only.
        if marker == 0xE1 and orientation is None and r.read(pos + 2, 6) == b"Exif\0\0":
            orientation = _exif_orientation(r, pos + 8, pos + length)
        pos += length


def _exif_orientation(r: Reader, base: int, limit: int) -> int:
    """Orientation tag of an Exif block; a corrupt block counts as none.

    Pillow only parses EXIF when asked (``getexif``), and vLLM never asks,
    so broken EXIF must not fail a JPEG the engine opens fine.
    """
    try:
        tags = _tiff_tags(r, base, limit, (_TAG_ORIENTATION,))
    except MediaError:
        return 1
    return _orientation(tags.get(_TAG_ORIENTATION))


# --- GIF ---------------------------------------------------------------------
def _gif(r: Reader) -> ImageHeader:
    width, height, flags = r.unpack("<HHB", 6, "logical screen descriptor")
    pos = 13
    if flags & 0x80:
        pos += 3 << ((flags & 7) + 1)
    while True:
        (kind,) = r.exact(pos, 1, "block")
        if kind == 0x21:  # extension: label, then sub-blocks until a 0 size
            pos += 2
            while size := r.exact(pos, 1, "extension sub-block")[0]:
                pos += 1 + size
            pos += 1
        elif kind == 0x2C:
            # Pillow grows the size to cover the first frame (GifImagePlugin._seek).
            left, top, w, h = r.unpack("<HHHH", pos + 1, "image descriptor")
            width, height = max(width, left + w), max(height, top + h)
            return ImageHeader("gif", width, height)
        elif kind == 0x3B:
            raise r.error("trailer before any image")
        else:
            raise r.error(f"unknown block 0x{kind:02x} at offset {pos}")


# --- WebP --------------------------------------------------------------------
def _webp(r: Reader) -> ImageHeader:
    s = r.exact(0, 30, "header")
    chunk = s[12:16]
    if chunk == b"VP8 ":
        if s[23:26] != b"\x9d\x01\x2a":
            raise r.error("VP8 frame without its start code")
        w, h = struct.unpack_from("<HH", s, 26)
        return ImageHeader("webp", w & 0x3FFF, h & 0x3FFF)
    if chunk == b"VP8L":
        if s[20] != 0x2F:
            raise r.error("VP8L chunk without its signature byte 0x2f")
        (bits,) = struct.unpack_from("<I", s, 21)
        return ImageHeader("webp", (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1)
    if chunk == b"VP8X":
        w = int.from_bytes(s[24:27], "little") + 1
        h = int.from_bytes(s[27:30], "little") + 1
        return ImageHeader("webp", w, h)
    raise r.error("unknown first chunk (expected VP8, VP8L or VP8X)")


# --- BMP ---------------------------------------------------------------------
_BMP_INFO_SIZES = frozenset({40, 52, 56, 64, 108, 124})


def _bmp(r: Reader) -> ImageHeader:
    (dib,) = r.unpack("<I", 14, "DIB header")
    if dib == 12:  # BITMAPCOREHEADER: unsigned 16-bit sides
        w, h = r.unpack("<HH", 18, "DIB header")
        return ImageHeader("bmp", w, h)
    if dib not in _BMP_INFO_SIZES:
        raise r.error(f"unsupported DIB header of {dib} bytes")
    w, h = r.unpack("<ii", 18, "DIB header")
    # A negative height stores rows top-down; the image is |height| tall.
    return ImageHeader("bmp", w, abs(h))


# --- TIFF (and the EXIF block of a JPEG, which is a TIFF) -----------------------
_TIFF_VALUE = {3: ("H", 2), 4: ("I", 4), 16: ("Q", 8)}  # SHORT, LONG, LONG8 (BigTIFF)
_MAX_IFD_ENTRIES = 4096


def _tiff(r: Reader) -> ImageHeader:
    tags = _tiff_tags(r, 0, len(r), (_TAG_WIDTH, _TAG_LENGTH, _TAG_ORIENTATION))
    if _TAG_WIDTH not in tags or _TAG_LENGTH not in tags:
        raise r.error("first IFD lacks ImageWidth or ImageLength")
    width, height = tags[_TAG_WIDTH], tags[_TAG_LENGTH]
    # Pillow applies a TIFF's orientation itself: the engine sees it upright.
    if tags.get(_TAG_ORIENTATION) in (5, 6, 7, 8):
        width, height = height, width
    return ImageHeader("tiff", width, height)


def _tiff_tags(r: Reader, base: int, limit: int, wanted: tuple[int, ...]) -> dict[int, int]:
    """Read integer tags ``wanted`` from the first IFD of a TIFF stream at ``base``.

    Offsets inside the stream are relative to ``base`` and must stay below ``limit``.
    """
    order = r.exact(base, 2, "TIFF header")
    if order not in (b"II", b"MM"):
        raise r.error("bad TIFF byte order (expected II or MM)")
    e = "<" if order == b"II" else ">"
    (magic,) = r.unpack(e + "H", base + 2, "TIFF header")
    if magic == 42:
        (ifd,) = r.unpack(e + "I", base + 4, "TIFF header")
        count_fmt, entry_size, value_size = "H", 12, 4
    elif magic == 43:  # BigTIFF: 8-byte offsets and counts, 20-byte entries
        (ifd,) = r.unpack(e + "Q", base + 8, "TIFF header")
        count_fmt, entry_size, value_size = "Q", 20, 8
    else:
        raise r.error("bad TIFF magic (expected 42 or 43)")
    if ifd < 8 or base + ifd >= limit:
        raise r.error(f"first IFD offset {ifd} out of range")
    pos = base + ifd
    (count,) = r.unpack(e + count_fmt, pos, "IFD")
    if count > _MAX_IFD_ENTRIES:
        raise r.error(f"IFD claims {count} entries (limit {_MAX_IFD_ENTRIES})")
    pos += struct.calcsize(count_fmt)
    entries = r.exact(pos, count * entry_size, "IFD")
    tags: dict[int, int] = {}
    layout = e + "HH" + ("I" if value_size == 4 else "Q")
    for i in range(count):
        tag, typ, n = struct.unpack_from(layout, entries, i * entry_size)
        if tag in wanted and n == 1 and typ in _TIFF_VALUE:
            code, size = _TIFF_VALUE[typ]
            if size > value_size:
                raise r.error(f"tag {tag} of type LONG8 outside BigTIFF")
            value_at = i * entry_size + entry_size - value_size
            (tags[tag],) = struct.unpack_from(e + code, entries, value_at)
    return tags


_SNIFF: tuple[tuple[bytes, str, Callable[[Reader], ImageHeader]], ...] = (
    (b"\x89PNG\r\n\x1a\n", "PNG", _png),
    (b"\xff\xd8\xff", "JPEG", _jpeg),
    (b"GIF87a", "GIF", _gif),
    (b"GIF89a", "GIF", _gif),
    (b"BM", "BMP", _bmp),
    (b"II*\0", "TIFF", _tiff),
    (b"MM\0*", "TIFF", _tiff),
    (b"II+\0", "TIFF", _tiff),
    (b"MM\0+", "TIFF", _tiff),
)
