"""Image header probing against Pillow, the library vLLM opens images with."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from media_samples import (
    SOURCES,
    as_source,
    encode_image,
    gradient,
    jpeg_segments,
    pillow_size,
    tiff_bytes,
)
from PIL import Image, ImageOps

from modtrace.counting.media import (
    MAX_PIXELS,
    B64View,
    ImageHeader,
    MediaError,
    parse_data_url,
    probe_image,
)

SIZES = [(1, 1), (3, 7), (64, 48), (257, 129), (1000, 3)]


def check(raw: bytes, fmt: str, kind: str = "bytes") -> ImageHeader:
    """Probe ``raw`` given as ``kind`` and compare with Pillow's size."""
    header = probe_image(as_source(raw, kind))
    assert header.format == fmt
    assert (header.width, header.height) == pillow_size(raw)
    return header


class TestPng:
    @pytest.mark.parametrize("kind", SOURCES)
    @pytest.mark.parametrize("size", SIZES)
    def test_sizes(self, size: tuple[int, int], kind: str) -> None:
        """IHDR width and height match Pillow for every input form."""
        check(encode_image(gradient(size), "PNG"), "png", kind)

    @pytest.mark.parametrize("mode", ["RGBA", "L", "P", "1", "I;16", "LA"])
    def test_modes(self, mode: str) -> None:
        """Colour type and bit depth do not move IHDR."""
        check(encode_image(gradient((31, 9), mode), "PNG"), "png")

    def test_apng(self) -> None:
        """An animated PNG reports its IHDR (canvas) size, like Pillow."""
        frames = [gradient((40, 30)), gradient((40, 30), "L").convert("RGB")]
        raw = encode_image(frames[0], "PNG", save_all=True, append_images=frames[1:])
        assert b"acTL" in raw
        check(raw, "png")

    def test_first_chunk_not_ihdr(self) -> None:
        """A PNG signature followed by another chunk is corrupt."""
        raw = bytearray(encode_image(gradient((4, 4)), "PNG"))
        raw[12:16] = b"IDAT"
        with pytest.raises(MediaError, match="PNG: first chunk is not IHDR"):
            probe_image(bytes(raw))


def png_chunk(kind: bytes, body: bytes) -> bytes:
    """One PNG chunk with its CRC."""
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_claiming(width: int, height: int) -> bytes:
    """A PNG whose IHDR claims ``width`` x ``height``, with a token IDAT."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\0\0\0\0")
    return (
        b"\x89PNG\r\n\x1a\n"
        + png_chunk(b"IHDR", ihdr)
        + png_chunk(b"IDAT", idat)
        + png_chunk(b"IEND", b"")
    )


class TestSizeLimits:
    def test_pillow_refuses_what_we_refuse(self) -> None:
        """10^9 x 10^9 trips Pillow's bomb check at open, so the probe rejects it too."""
        raw = png_claiming(10**9, 10**9)
        with pytest.raises(Image.DecompressionBombError):
            Image.open(io.BytesIO(raw))
        with pytest.raises(MediaError, match="exceeds 178956970 pixels"):
            probe_image(raw)

    def test_limit_is_pillows_default(self) -> None:
        """MAX_PIXELS is twice Pillow's default MAX_IMAGE_PIXELS: where open() raises."""
        assert MAX_PIXELS == 2 * Image.MAX_IMAGE_PIXELS

    def test_limit_can_be_lifted(self) -> None:
        """An engine that raised Pillow's limit is matched with ``max_pixels``."""
        header = probe_image(png_claiming(10**9, 10**9), max_pixels=None)
        assert (header.width, header.height) == (10**9, 10**9)

    @pytest.mark.parametrize(("w", "h"), [(0, 10), (10, 0), (2**31, 1), (1, 2**32 - 1)])
    def test_side_out_of_range(self, w: int, h: int) -> None:
        """A zero side or one beyond 2^31 - 1 is rejected whatever the pixel limit."""
        with pytest.raises(MediaError, match="out of range"):
            probe_image(png_claiming(w, h), max_pixels=None)


class TestJpeg:
    @pytest.mark.parametrize("kind", SOURCES)
    @pytest.mark.parametrize("size", SIZES)
    def test_baseline(self, size: tuple[int, int], kind: str) -> None:
        """Baseline (SOF0) JPEG sizes match Pillow."""
        raw = encode_image(gradient(size), "JPEG", quality=80)
        assert 0xC0 in dict(map(reversed, jpeg_segments(raw)))
        check(raw, "jpeg", kind)

    def test_progressive(self) -> None:
        """A progressive JPEG carries its size in SOF2."""
        raw = encode_image(gradient((301, 199)), "JPEG", progressive=True)
        assert 0xC2 in {m for _, m in jpeg_segments(raw)}
        check(raw, "jpeg")

    def test_cmyk_adobe(self) -> None:
        """A CMYK JPEG with an Adobe APP14 segment."""
        raw = encode_image(gradient((77, 55), "CMYK"), "JPEG")
        assert 0xEE in {m for _, m in jpeg_segments(raw)}
        check(raw, "jpeg")

    @pytest.mark.parametrize("mode", ["L", "RGB"])
    @pytest.mark.parametrize("subsampling", [0, 1, 2])
    def test_subsampling_and_gray(self, mode: str, subsampling: int) -> None:
        """Chroma subsampling and single-channel JPEGs."""
        check(encode_image(gradient((123, 45), mode), "JPEG", subsampling=subsampling), "jpeg")

    @pytest.mark.parametrize("kind", SOURCES)
    def test_large_exif_before_frame_header(self, kind: str) -> None:
        """A ~60 KB APP1/Exif block is jumped over, not decoded."""
        exif = Image.Exif()
        exif[0x010E] = "x" * 60_000  # ImageDescription
        exif[0x0112] = 6
        raw = encode_image(gradient((640, 480)), "JPEG", exif=exif)
        app1 = [(o, m) for o, m in jpeg_segments(raw) if m == 0xE1]
        assert int.from_bytes(raw[app1[0][0] + 2 : app1[0][0] + 4], "big") > 60_000
        header = check(raw, "jpeg", kind)
        assert header.orientation == 6

    @pytest.mark.parametrize("kw", [{"restart_marker_blocks": 1}, {"restart_marker_rows": 2}])
    def test_restart_markers(self, kw: dict[str, int]) -> None:
        """A restart interval (DRI) and RSTn markers in the scan change nothing."""
        raw = encode_image(gradient((96, 64)), "JPEG", **kw)
        assert 0xDD in {m for _, m in jpeg_segments(raw)}
        check(raw, "jpeg")

    def test_standalone_markers_before_frame(self) -> None:
        """RSTn and TEM-like markers without length before SOF are skipped, as Pillow does."""
        raw = encode_image(gradient((50, 40)), "JPEG")
        sof = next(o for o, m in jpeg_segments(raw) if m == 0xC0)
        check(raw[:sof] + b"\xff\xd0\xff\xd7" + raw[sof:], "jpeg")

    @pytest.mark.parametrize("fill", [1, 7, 200])
    def test_fill_bytes(self, fill: int) -> None:
        """Runs of 0xFF fill bytes before markers (T.81 B.1.1.2) are skipped."""
        raw = encode_image(gradient((50, 40)), "JPEG")
        for offset, _ in reversed(jpeg_segments(raw)):
            raw = raw[:offset] + b"\xff" * fill + raw[offset:]
        check(raw, "jpeg", "b64")

    def test_junk_between_segments(self) -> None:
        """Non-0xFF bytes between segments are skipped, as Pillow skips them."""
        raw = encode_image(gradient((50, 40)), "JPEG")
        sof = next(o for o, m in jpeg_segments(raw) if m == 0xC0)
        check(raw[:sof] + b"\x00junk\x01" + raw[sof:], "jpeg")

    @pytest.mark.parametrize("orientation", range(1, 9))
    def test_exif_orientation(self, orientation: int) -> None:
        """Stored size is reported; ``upright_size`` matches ``ImageOps.exif_transpose``."""
        exif = Image.Exif()
        exif[0x0112] = orientation
        raw = encode_image(gradient((64, 32)), "JPEG", exif=exif)
        header = check(raw, "jpeg", "b64")
        assert header.orientation == orientation
        with Image.open(io.BytesIO(raw)) as im:
            assert header.upright_size == ImageOps.exif_transpose(im).size

    def test_big_endian_exif(self) -> None:
        """A Motorola-order (MM) Exif block is read in its byte order."""
        tiff = b"MM\0*" + struct.pack(">I", 8) + struct.pack(">H", 1)
        tiff += struct.pack(">HHIHH", 0x0112, 3, 1, 8, 0) + struct.pack(">I", 0)
        raw = encode_image(gradient((64, 32)), "JPEG", exif=b"Exif\0\0" + tiff)
        with Image.open(io.BytesIO(raw)) as im:
            assert im.getexif()[0x0112] == 8
        assert check(raw, "jpeg").orientation == 8

    def test_corrupt_exif_is_ignored(self) -> None:
        """Broken EXIF does not fail a JPEG that Pillow opens: orientation falls back to 1."""
        raw = encode_image(gradient((20, 10)), "JPEG", exif=b"Exif\0\0II*\0\xff\xff\xff\x7f")
        with pytest.warns(UserWarning, match="Corrupt EXIF"):
            assert check(raw, "jpeg").orientation == 1

    def test_scan_before_frame(self) -> None:
        """A start of scan with no frame header before it is corrupt."""
        raw = encode_image(gradient((20, 10)), "JPEG")
        segs = jpeg_segments(raw)
        sof = next(o for o, m in segs if m == 0xC0)
        nxt = next(o for o, _ in segs if o > sof)
        with pytest.raises(MediaError, match="JPEG: start of scan before any frame header"):
            probe_image(raw[:sof] + raw[nxt:])

    def test_twelve_bit_is_rejected_like_pillow(self) -> None:
        """Pillow cannot open 12-bit JPEGs, so neither can vLLM: the probe says so."""
        raw = bytearray(encode_image(gradient((20, 10)), "JPEG"))
        sof = next(o for o, m in jpeg_segments(bytes(raw)) if m == 0xC0)
        raw[sof + 4] = 12
        with pytest.raises(OSError, match="cannot identify"):
            Image.open(io.BytesIO(bytes(raw)))
        with pytest.raises(MediaError, match="JPEG: 12-bit samples"):
            probe_image(bytes(raw))

    def test_truncated_before_frame(self) -> None:
        """A JPEG cut inside its headers names the truncation."""
        raw = encode_image(gradient((20, 10)), "JPEG")
        sof = next(o for o, m in jpeg_segments(raw) if m == 0xC0)
        with pytest.raises(MediaError, match="JPEG: "):
            probe_image(raw[: sof + 5])


class TestGif:
    @pytest.mark.parametrize("kind", SOURCES)
    @pytest.mark.parametrize("size", SIZES)
    def test_sizes(self, size: tuple[int, int], kind: str) -> None:
        """The logical screen size matches Pillow."""
        check(encode_image(gradient(size, "P"), "GIF"), "gif", kind)

    def test_animated_with_comment(self) -> None:
        """Extensions (comment, graphic control, application) are walked over."""
        frames = [gradient((40, 30), "P"), gradient((40, 30), "L").convert("P")]
        raw = encode_image(
            frames[0],
            "GIF",
            save_all=True,
            append_images=frames[1:],
            comment=b"c" * 1000,
            duration=100,
            loop=0,
        )
        assert raw[:6] == b"GIF89a"
        check(raw, "gif", "b64_mime_crlf")

    def test_first_frame_larger_than_screen(self) -> None:
        """Pillow grows the size to cover the first frame; so does the probe."""
        raw = bytearray(encode_image(gradient((40, 30), "P"), "GIF"))
        raw[6:10] = struct.pack("<HH", 20, 10)  # shrink the logical screen
        assert pillow_size(bytes(raw)) == (40, 30)
        check(bytes(raw), "gif")

    def test_no_image(self) -> None:
        """A GIF with only a trailer has no image."""
        raw = encode_image(gradient((4, 4), "P"), "GIF")
        header = raw[:13] + raw[13 : 13 + 3 * 2 ** ((raw[10] & 7) + 1)]
        with pytest.raises(MediaError, match="GIF: trailer before any image"):
            probe_image(header + b";")


class TestWebp:
    @pytest.mark.parametrize("kind", SOURCES)
    @pytest.mark.parametrize("size", SIZES)
    @pytest.mark.parametrize(("params", "chunk"), [({}, b"VP8 "), ({"lossless": True}, b"VP8L")])
    def test_simple(self, size: tuple[int, int], kind: str, params: dict, chunk: bytes) -> None:
        """Lossy (VP8) and lossless (VP8L) WebP sizes match Pillow."""
        raw = encode_image(gradient(size), "WEBP", **params)
        assert raw[12:16] == chunk
        check(raw, "webp", kind)

    def test_alpha_is_vp8x(self) -> None:
        """Lossy with alpha is a VP8X file: its canvas size is reported."""
        im = gradient((333, 111))
        im.putalpha(gradient((333, 111), "L"))
        raw = encode_image(im, "WEBP")
        assert raw[12:16] == b"VP8X"
        check(raw, "webp")

    def test_animated(self) -> None:
        """An animated WebP reports its canvas, like Pillow."""
        frames = [gradient((64, 40)), gradient((64, 40), "L").convert("RGB")]
        raw = encode_image(frames[0], "WEBP", save_all=True, append_images=frames[1:])
        assert raw[12:16] == b"VP8X"
        check(raw, "webp")

    def test_largest(self) -> None:
        """The 14-bit fields hold up to 16383 per side."""
        check(encode_image(Image.new("L", (16383, 2)), "WEBP", lossless=True), "webp")

    def test_unknown_chunk(self) -> None:
        """A RIFF/WEBP file whose first chunk is unknown is corrupt."""
        raw = bytearray(encode_image(gradient((8, 8)), "WEBP"))
        raw[12:16] = b"ABCD"
        with pytest.raises(MediaError, match="WebP: unknown first chunk"):
            probe_image(bytes(raw))


class TestBmp:
    @pytest.mark.parametrize("kind", SOURCES)
    @pytest.mark.parametrize("size", SIZES)
    @pytest.mark.parametrize("mode", ["RGB", "P", "1", "RGBA"])
    def test_sizes(self, size: tuple[int, int], kind: str, mode: str) -> None:
        """BITMAPINFOHEADER sizes match Pillow."""
        check(encode_image(gradient(size, mode), "BMP"), "bmp", kind)

    def test_top_down(self) -> None:
        """A negative height (rows stored top-down) is reported as its absolute value."""
        raw = bytearray(encode_image(gradient((30, 20)), "BMP"))
        raw[22:26] = struct.pack("<i", -20)
        assert pillow_size(bytes(raw)) == (30, 20)
        check(bytes(raw), "bmp")

    def test_core_header(self) -> None:
        """The 12-byte OS/2 BITMAPCOREHEADER has 16-bit sides."""
        w, h = 5, 3
        row = (bytes([0, 0, 255]) * w).ljust((3 * w + 3) // 4 * 4, b"\0")
        pixels = row * h
        dib = struct.pack("<IHHHH", 12, w, h, 1, 24)
        head = b"BM" + struct.pack("<IHHI", 14 + 12 + len(pixels), 0, 0, 26)
        check(head + dib + pixels, "bmp")

    def test_unsupported_dib(self) -> None:
        """A DIB header size Pillow does not know is rejected."""
        raw = bytearray(encode_image(gradient((4, 4)), "BMP"))
        raw[14:18] = struct.pack("<I", 99)
        with pytest.raises(MediaError, match="BMP: unsupported DIB header of 99 bytes"):
            probe_image(bytes(raw))


class TestTiff:
    @pytest.mark.parametrize("order", ["<", ">"])
    @pytest.mark.parametrize("side_type", [3, 4])
    @pytest.mark.parametrize("size", [(1, 1), (300, 2), (7, 513)])
    def test_endianness_and_types(self, order: str, side_type: int, size: tuple[int, int]) -> None:
        """II and MM files, ImageWidth/ImageLength as SHORT or LONG."""
        check(tiff_bytes(size, order, side_type), "tiff", "b64")

    @pytest.mark.parametrize("compression", ["raw", "tiff_lzw", "tiff_deflate"])
    def test_pillow_written(self, compression: str) -> None:
        """TIFFs as Pillow (and libtiff) write them."""
        check(encode_image(gradient((90, 60)), "TIFF", compression=compression), "tiff")

    def test_bigtiff(self) -> None:
        """BigTIFF: 8-byte offsets, 20-byte IFD entries."""
        raw = encode_image(gradient((90, 60)), "TIFF", big_tiff=True)
        assert raw[:4] == b"II+\0"
        check(raw, "tiff")

    @pytest.mark.parametrize("orientation", range(1, 9))
    def test_orientation_applied_like_pillow(self, orientation: int) -> None:
        """Pillow transposes TIFFs itself, so the size is upright and nothing is pending."""
        raw = encode_image(gradient((90, 60)), "TIFF", tiffinfo={274: orientation})
        header = check(raw, "tiff")
        assert header.orientation == 1
        with Image.open(io.BytesIO(raw)) as im:
            im.load()
            assert im.size == header.upright_size

    def test_ifd_out_of_range(self) -> None:
        """A first-IFD offset past the end is corrupt."""
        raw = b"II*\0" + struct.pack("<I", 10_000) + bytes(20)
        with pytest.raises(MediaError, match="TIFF: first IFD offset 10000 out of range"):
            probe_image(raw)

    def test_missing_width(self) -> None:
        """An IFD without ImageWidth has no size."""
        raw = b"MM\0*" + struct.pack(">IH", 8, 1) + struct.pack(">HHIHH", 257, 3, 1, 5, 0)
        with pytest.raises(MediaError, match="TIFF: first IFD lacks ImageWidth"):
            probe_image(raw + bytes(4))


class TestDataUrlToProbe:
    def test_end_to_end(self) -> None:
        """The OpenAI request shape: a data URL with extra parameters, probed lazily."""
        raw = encode_image(gradient((640, 360)), "JPEG")
        b64 = base64.b64encode(raw).decode()
        url = parse_data_url(f"data:image/jpeg;charset=utf-8;name=a.jpg;base64,{b64}")
        assert probe_image(url.source()) == ImageHeader("jpeg", 640, 360)


_MAGICS = [
    b"\x89PNG\r\n\x1a\n",
    b"\xff\xd8\xff",
    b"GIF89a",
    b"RIFF\0\0\0\0WEBPVP8 ",
    b"RIFF\0\0\0\0WEBPVP8X",
    b"BM",
    b"II*\0",
    b"MM\0+",
]


class TestBadInput:
    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            (b"", "image: empty payload"),
            (b"hello world, no image", "image: unrecognised format"),
            (b"\x89PNG\r\n\x1a\n\0\0", "PNG: truncated IHDR chunk"),
            (b"GIF89a\x01", "GIF: truncated logical screen descriptor"),
            (b"RIFF\0\0\0\0WEBPVP8 ", "WebP: truncated header"),
            (b"BM" + bytes(16), "BMP: unsupported DIB header of 0 bytes"),
            (b"BM" + bytes(12) + b"\x28\0\0\0", "BMP: truncated DIB header"),
            (b"\xff\xd8\xff", "JPEG: truncated marker"),
        ],
    )
    def test_message_names_format(self, raw: bytes, message: str) -> None:
        """Each failure is a MediaError whose message names the format and the fault."""
        with pytest.raises(MediaError, match=message):
            probe_image(raw)

    def test_truncated_base64(self) -> None:
        """A base64 payload cut mid-group is a base64 error."""
        text = base64.b64encode(encode_image(gradient((8, 8)), "PNG")).decode()
        cut = text[: len(text) // 4 * 4 - 3]
        with pytest.raises(MediaError, match="base64: truncated"):
            probe_image(B64View(cut))

    def test_invalid_character_in_header(self) -> None:
        """A bad character where the header is read is reported, not skipped."""
        text = base64.b64encode(encode_image(gradient((8, 8)), "PNG")).decode()
        with pytest.raises(MediaError, match="base64: invalid character"):
            probe_image(B64View(text[:10] + "*" + text[11:]))

    @pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"])
    def test_every_truncation(self, fmt: str) -> None:
        """Each prefix of a real header gives MediaError or Pillow's own size, nothing else."""
        raw = encode_image(gradient((33, 17)), fmt)
        for n in range(min(len(raw), 400)):
            try:
                header = probe_image(raw[:n])
            except MediaError:
                continue
            assert (header.width, header.height) == (33, 17)

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(data=st.binary(max_size=300))
    def test_random_bytes(self, data: bytes) -> None:
        """Random bytes give an ImageHeader or MediaError, never another exception."""
        try:
            header = probe_image(data)
        except MediaError:
            return
        assert header.width > 0
        assert header.height > 0

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(magic=st.sampled_from(_MAGICS), tail=st.binary(max_size=300))
    def test_random_bytes_after_magic(self, magic: bytes, tail: bytes) -> None:
        """A real signature followed by random bytes: ImageHeader or MediaError only."""
        try:
            header = probe_image(magic + tail)
        except MediaError:
            return
        assert 0 < header.width * header.height <= MAX_PIXELS

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        fmt=st.sampled_from(["PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"]),
        flips=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 255)), max_size=4),
    )
    def test_corrupted_headers(self, fmt: str, flips: list[tuple[int, int]]) -> None:
        """Real headers with bytes overwritten give an ImageHeader or MediaError only."""
        raw = bytearray(encode_image(gradient((20, 12)), fmt))
        for at, value in flips:
            raw[at % len(raw)] = value
        try:
            header = probe_image(B64View(base64.b64encode(bytes(raw)).decode()))
        except MediaError:
            return
        assert 0 < header.width * header.height <= MAX_PIXELS


class TestNoPayloadBytesInErrors:
    """Error messages reach spans: they name formats and lengths, never payload bytes."""

    SECRET = b"SSN 078-05-1120 "

    @pytest.mark.parametrize(
        ("raw", "expected"),
        [
            (SECRET * 2, "image: unrecognised format (32 bytes)"),
            (b"\x89PNG\r\n\x1a\n" + b"\0\0\0\x0d" + SECRET * 2, "PNG: first chunk is not IHDR"),
            (b"RIFF\0\0\0\0WEBP" + SECRET * 2, "WebP: unknown first chunk"),
        ],
    )
    def test_message_names_the_format_not_the_bytes(self, raw: bytes, expected: str) -> None:
        """A text document posing as an image: no hex, no repr of its bytes in the message."""
        for source in (raw, B64View(base64.b64encode(raw).decode())):
            with pytest.raises(MediaError) as info:
                probe_image(source)
            message = str(info.value)
            assert expected in message
            for leaked in ("SSN", "078", self.SECRET[:4].hex(), self.SECRET[4:8].hex()):
                assert leaked not in message, message
