"""Audio duration from the header alone: WAV, FLAC, MP3, Ogg Vorbis, Ogg Opus, MP4/M4A.

The duration reported is what the engine's decoder will produce. vLLM
decodes audio with soundfile (libsndfile) first and falls back to PyAV
(FFmpeg) only when libsndfile does not know the format
(vllm-project/vllm@vllm/multimodal/media/audio.py, ``load_audio``), at the
file's native sample rate (``sr=None``). So libsndfile's frame count is the
reference, PyAV's where libsndfile has no reader (MP4):

* **WAV / RF64** (``fmt `` + ``data``; ``ds64`` sizes for RF64): PCM, float,
  A-law, mu-law and ``WAVE_FORMAT_EXTENSIBLE`` give ``data bytes //
  block_align`` samples exactly. IMA and MS ADPCM give whole blocks times
  the samples per block, as libsndfile counts. Other codecs use the
  ``fact`` chunk. A ``data`` size past the end of the payload is clamped to
  what is there, as libsndfile does.
* **FLAC**: STREAMINFO's total samples, exact. A total of 0 ("unknown",
  written by streaming encoders) is rejected: libsndfile then reports
  ``SF_COUNT_MAX`` frames and soundfile's ``read`` fails, so vLLM cannot
  decode such a file either.
* **MP3**: ID3v2 tags are skipped. With a Xing/Info tag, ``frames x
  samples per frame``, minus the LAME tag's encoder delay and padding when
  present (gapless decoders such as libsndfile's mpg123 remove them): exact.
  With neither tag, the frame count is the audio payload (ID3v1/APE tags
  excluded) divided by the first frame's mean length: exact for CBR, an
  estimate for untagged VBR (libsndfile sizes its output the same way and
  stops at the smaller of that estimate and the frames present). With a
  VBRI tag: ``frames x samples per frame``, what PyAV decodes; mpg123 does
  not read VBRI and estimates from the tag frame's bitrate instead, so
  vLLM may return less for such (rare, Fraunhofer-encoded) files. Samples
  per frame are 384 (layer I), 1152 (layer II, MPEG-1 layer III) and 576
  (MPEG-2/2.5 layer III).
* **Ogg Vorbis / Ogg Opus**: the granule position of the last page of the
  first logical stream. Opus counts at 48 kHz and subtracts the OpusHead
  pre-skip; the sample rate reported is the one libsndfile decodes at, the
  lowest Opus rate >= the header's input rate (libsndfile@src/ogg_opus.c,
  ``ogg_opus_setup_decoder``), and the samples are the 48 kHz count scaled
  to it, floored, as libsndfile returns them. PyAV always decodes at
  48 kHz: the same seconds within one sample.
* **MP4 / M4A**: the first sound track's ``mdhd`` duration, minus the edit
  list's priming offset (``elst`` media time) and bounded by its segment
  duration: the exact presentation length. PyAV decodes whole AAC frames,
  so it returns up to one frame (1024 samples, 2048 for HE-AAC) more.
  Fragmented MP4 (no duration in ``moov``) is rejected.

``format_hint`` is the OpenAI ``input_audio.format``. Magic bytes win over
it, as they do in the engine, which never looks at the hint; it is used
only to look for an MP3 frame past leading junk when nothing else matches.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from ..safe import safe_name
from ._reader import Reader
from .b64 import B64View

__all__ = ["AudioHeader", "probe_audio"]


@dataclass(frozen=True, slots=True)
class AudioHeader:
    """What an audio header says.

    Attributes:
        format: ``"wav"``, ``"flac"``, ``"mp3"`` (``"mp2"``, ``"mp1"`` for MPEG audio
            layers II and I), ``"vorbis"``, ``"opus"`` or ``"mp4"``.
        seconds: Duration of the decoded audio.
        sample_rate: Rate the decoder outputs, in Hz, when the header says.
        channels: Channel count, when the header says.
        num_samples: Samples per channel at ``sample_rate`` when the header
            states them; ``None`` when the duration is an estimate (CBR MP3).
    """

    format: str
    seconds: float
    sample_rate: int | None
    channels: int | None
    num_samples: int | None


def probe_audio(data: bytes | B64View, format_hint: str | None = None) -> AudioHeader:
    """Read an audio clip's duration from its header.

    Args:
        data: The encoded audio: raw bytes, or a :class:`B64View` of its base64.
        format_hint: The declared format (OpenAI ``input_audio.format``: ``"wav"``,
            ``"mp3"``...). Used only when the magic bytes match nothing.

    Returns:
        The format, the duration, and the sample rate, channels and samples when known.

    Raises:
        MediaError: Unknown format, corrupt or truncated header, or no duration in it.
    """
    r = Reader(data, "audio")
    if not r.read(0, 1):
        raise r.error("empty payload")
    start = _skip_id3v2(r)
    head = r.read(start, 12)
    if head[:4] in (b"RIFF", b"RF64", b"BW64") and head[8:12] == b"WAVE":
        r.fmt = "WAV"
        return _wav(r, start)
    if head[:4] == b"fLaC":
        r.fmt = "FLAC"
        return _flac(r, start)
    if head[:4] == b"OggS":
        r.fmt = "Ogg"
        return _ogg(r, start)
    if head[4:8] == b"ftyp":
        r.fmt = "MP4"
        return _mp4(r, start)
    if _mpeg_header(head[:4]) is not None:
        r.fmt = "MP3"
        return _mp3(r, start)
    hint = (format_hint or "").strip().lower()
    if start > 0 or hint in ("mp3", "mpeg", "mpga"):
        # An ID3 tag or the caller says MP3: decoders resync past junk, so do we.
        r.fmt = "MP3"
        return _mp3(r, _find_mpeg_sync(r, start))
    # Lengths and format names only: no payload bytes, the client's format if a plain name.
    hint_note = f", declared {safe_name(format_hint)}" if format_hint else ""
    raise r.error(f"unrecognised format ({len(r)} bytes{hint_note})")


def _header(r: Reader, fmt: str, samples: int, rate: int, channels: int | None) -> AudioHeader:
    if rate <= 0:
        raise r.error(f"sample rate {rate}")
    if samples <= 0:
        raise r.error(f"no audio samples ({samples})")
    return AudioHeader(fmt, samples / rate, rate, channels, samples)


def _skip_id3v2(r: Reader) -> int:
    """Return the offset after any ID3v2 tags at the start."""
    pos = 0
    while True:
        tag = r.read(pos, 10)
        if len(tag) < 10 or tag[:3] != b"ID3" or any(b & 0x80 for b in tag[6:10]):
            return pos
        size = (tag[6] << 21) | (tag[7] << 14) | (tag[8] << 7) | tag[9]
        pos += 10 + size + (10 if tag[5] & 0x10 else 0)  # flag 0x10: footer present


# --- WAV ---------------------------------------------------------------------
_WAV_PCM_LIKE = frozenset({1, 3, 6, 7})  # PCM, IEEE float, A-law, mu-law
_WAV_ADPCM = frozenset({2, 0x11})  # MS ADPCM, IMA ADPCM
_WAV_EXTENSIBLE = 0xFFFE


def _wav(r: Reader, base: int) -> AudioHeader:
    rf64 = r.read(base, 4) != b"RIFF"
    pos, end = base + 12, len(r)
    fmt: tuple[int, int, int, int, int] | None = None  # tag, channels, rate, block, spb
    data_size = fact = ds64_data = None
    while pos + 8 <= end and (fmt is None or data_size is None):
        cid, size = r.unpack("<4sI", pos, "chunk header")
        body = pos + 8
        if cid == b"ds64" and rf64:
            (ds64_data,) = r.unpack("<Q", body + 8, "ds64 chunk")
        elif cid == b"fmt ":
            fmt = _wav_fmt(r, body, size)
        elif cid == b"fact" and size >= 4:
            (fact,) = r.unpack("<I", body, "fact chunk")
        elif cid == b"data":
            if size == 0xFFFFFFFF and ds64_data is not None:
                size = ds64_data
            # A size past the end (a streamed or cut file): libsndfile reads what is there.
            data_size = min(size, end - body)
        pos = body + size + (size & 1)  # chunks are padded to an even size
    if fmt is None:
        raise r.error("no 'fmt ' chunk")
    if data_size is None:
        raise r.error("no 'data' chunk")
    tag, channels, rate, block, spb = fmt
    if tag in _WAV_PCM_LIKE:
        samples = data_size // block
    elif tag in _WAV_ADPCM and spb:
        samples = data_size // block * spb
    elif fact is not None:
        samples = fact
    else:
        raise r.error(f"codec 0x{tag:04x} without a 'fact' chunk: no sample count")
    return _header(r, "wav", samples, rate, channels)


def _wav_fmt(r: Reader, body: int, size: int) -> tuple[int, int, int, int, int]:
    if size < 16:
        raise r.error(f"'fmt ' chunk of {size} bytes, expected at least 16")
    tag, channels, rate, _byte_rate, block = r.unpack("<HHIIH", body, "'fmt ' chunk")
    if tag == _WAV_EXTENSIBLE:
        if size < 40:
            raise r.error(f"WAVE_FORMAT_EXTENSIBLE 'fmt ' chunk of {size} bytes, expected 40")
        # The sub-format GUID starts with the plain format tag.
        (tag,) = r.unpack("<H", body + 24, "'fmt ' chunk")
    if channels == 0 or block == 0:
        raise r.error(f"'fmt ' chunk with {channels} channels and block align {block}")
    spb = 0
    if tag in _WAV_ADPCM and size >= 20:
        (spb,) = r.unpack("<H", body + 18, "'fmt ' chunk")
    return tag, channels, rate, block, spb


# --- FLAC --------------------------------------------------------------------
def _flac(r: Reader, base: int) -> AudioHeader:
    kind, length = r.unpack(">B3s", base + 4, "metadata block header")
    if kind & 0x7F != 0 or int.from_bytes(length, "big") < 34:
        raise r.error("first metadata block is not a 34-byte STREAMINFO")
    b = r.exact(base + 8, 18, "STREAMINFO")
    rate = (b[10] << 12) | (b[11] << 4) | (b[12] >> 4)
    channels = ((b[12] >> 1) & 7) + 1
    total = ((b[13] & 0x0F) << 32) | int.from_bytes(b[14:18], "big")
    if total == 0:
        # libsndfile then reports SF_COUNT_MAX frames and soundfile.read fails.
        raise r.error("STREAMINFO total samples is 0 (unknown length): not decodable by vLLM")
    return _header(r, "flac", total, rate, channels)


# --- MP3 ---------------------------------------------------------------------
_MPEG1, _MPEG2, _MPEG25 = 3, 2, 0  # the 2-bit version field
_BITRATES_KBPS = {
    (_MPEG1, 3): (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    (_MPEG1, 2): (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    (_MPEG1, 1): (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (_MPEG2, 3): (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    (_MPEG2, 2): (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
_BITRATES_KBPS[_MPEG2, 1] = _BITRATES_KBPS[_MPEG2, 2]
_SAMPLE_RATES = {
    _MPEG1: (44100, 48000, 32000),
    _MPEG2: (22050, 24000, 16000),
    _MPEG25: (11025, 12000, 8000),
}
_MPEG_SCAN = 64 * 1024
_GAPLESS_ENCODERS = (b"LAME", b"Lavc", b"Lavf", b"GOGO")


@dataclass(frozen=True, slots=True)
class _Frame:
    version: int
    layer: int  # 3 = layer I, 2 = layer II, 1 = layer III (the raw field)
    bitrate: int  # bits per second
    sample_rate: int
    padding: int
    channels: int

    @property
    def samples(self) -> int:
        if self.layer == 3:
            return 384
        return 576 if self.layer == 1 and self.version != _MPEG1 else 1152

    @property
    def length(self) -> int:
        """Frame length in bytes, header included."""
        if self.layer == 3:
            return (12 * self.bitrate // self.sample_rate + self.padding) * 4
        return self.samples // 8 * self.bitrate // self.sample_rate + self.padding

    @property
    def side_info(self) -> int:
        """Layer III side-information size: where a Xing/Info tag starts, after the header."""
        if self.version == _MPEG1:
            return 17 if self.channels == 1 else 32
        return 9 if self.channels == 1 else 17


def _mpeg_header(b: bytes) -> _Frame | None:
    """Decode a 4-byte MPEG audio frame header, or ``None`` if it is not one."""
    if len(b) < 4 or b[0] != 0xFF or b[1] & 0xE0 != 0xE0:
        return None
    version, layer = (b[1] >> 3) & 3, (b[1] >> 1) & 3
    rate_index, br_index = (b[2] >> 2) & 3, b[2] >> 4
    if version == 1 or layer == 0 or rate_index == 3 or br_index in (0, 15):
        return None  # reserved values; bitrate 0 is "free format", with no fixed length
    bitrate = _BITRATES_KBPS[_MPEG1 if version == _MPEG1 else _MPEG2, layer][br_index] * 1000
    rate = _SAMPLE_RATES[version][rate_index]
    channels = 1 if b[3] >> 6 == 3 else 2
    return _Frame(version, layer, bitrate, rate, (b[2] >> 1) & 1, channels)


def _find_mpeg_sync(r: Reader, start: int) -> int:
    """First offset at or after ``start`` where two consecutive frame headers chain."""
    window = r.read(start, _MPEG_SCAN)
    i = window.find(b"\xff")
    while i >= 0:
        frame = _mpeg_header(window[i : i + 4])
        if frame is not None:
            nxt = start + i + frame.length
            if nxt + 4 > len(r) or _mpeg_header(r.read(nxt, 4)) is not None:
                return start + i
        i = window.find(b"\xff", i + 1)
    raise r.error(f"no MPEG audio frame in the first {_MPEG_SCAN} bytes after offset {start}")


def _mp3(r: Reader, pos: int) -> AudioHeader:
    frame = _mpeg_header(r.exact(pos, 4, "frame header"))
    if frame is None:
        raise r.error(f"invalid frame header at offset {pos}")
    spf, rate = frame.samples, frame.sample_rate
    fmt = ("mp3", "mp2", "mp1")[frame.layer - 1]
    if frame.layer == 1:
        xing_at = pos + 4 + frame.side_info
        tag = r.read(xing_at, 4)
        if tag in (b"Xing", b"Info"):
            samples = _xing_samples(r, xing_at, spf)
            if samples is not None:
                return _header(r, fmt, samples, rate, frame.channels)
            pos += frame.length  # the tag frame holds no audio: count from the next
            frame = _mpeg_header(r.exact(pos, 4, "frame header"))
            if frame is None:
                raise r.error(f"invalid frame header after the Xing tag at offset {pos}")
        elif r.read(pos + 36, 4) == b"VBRI":
            (frames,) = r.unpack(">I", pos + 36 + 14, "VBRI tag")
            return _header(r, fmt, frames * spf, rate, frame.channels)
    # CBR: count frames from the payload length and the mean frame length.
    audio = _mp3_end(r) - pos
    mean_length = spf / 8 * frame.bitrate / rate
    frames = round(audio / mean_length)
    if frames <= 0:
        raise r.error("no complete audio frame")
    return AudioHeader(fmt, frames * spf / rate, rate, frame.channels, None)


def _xing_samples(r: Reader, at: int, spf: int) -> int | None:
    """Samples from a Xing/Info tag (and its LAME extension), or ``None`` without a count."""
    (flags,) = r.unpack(">I", at + 4, "Xing tag")
    if not flags & 1:
        return None
    (frames,) = r.unpack(">I", at + 8, "Xing tag")
    samples = frames * spf
    lame = at + 8 + 4 * bin(flags & 0b1011).count("1") + (100 if flags & 4 else 0)
    ext = r.read(lame, 24)
    if len(ext) == 24 and ext[:4] in _GAPLESS_ENCODERS:
        delay = (ext[21] << 4) | (ext[22] >> 4)
        padding = ((ext[22] & 0x0F) << 8) | ext[23]
        if delay + padding < samples:
            samples -= delay + padding
    return samples


def _mp3_end(r: Reader) -> int:
    """End of the MPEG frames: the payload length less trailing ID3v1 and APEv2 tags."""
    end = len(r)
    if end >= 128 and r.read(end - 128, 3) == b"TAG":
        end -= 128
    if end >= 32 and r.read(end - 32, 8) == b"APETAGEX":
        size, _items, flags = r.unpack("<III", end - 32 + 12, "APE tag footer")
        end -= size + (32 if flags & 0x80000000 else 0)  # bit 31: a header precedes
    return end


# --- Ogg ---------------------------------------------------------------------
_OGG_MAX_PAGE = 27 + 255 + 255 * 255


def _ogg(r: Reader, base: int) -> AudioHeader:
    nsegs = r.exact(base + 26, 1, "page header")[0]
    (serial,) = r.unpack("<I", base + 14, "page header")
    packet = r.read(base + 27 + nsegs, 19)
    if packet[:7] == b"\x01vorbis":
        r.fmt = "Ogg Vorbis"
        channels, rate = r.unpack("<BI", base + 27 + nsegs + 11, "Vorbis identification header")
        return _header(r, "vorbis", _last_granule(r, serial), rate, channels)
    if packet[:8] == b"OpusHead":
        r.fmt = "Ogg Opus"
        if len(packet) < 19:
            raise r.error("truncated OpusHead")
        channels, preskip, input_rate = struct.unpack_from("<BHI", packet, 9)
        # libsndfile decodes at the lowest Opus rate >= the input rate.
        rate = next(x for x in (8000, 12000, 16000, 24000, 48000) if x >= min(input_rate, 48000))
        samples48 = _last_granule(r, serial) - preskip
        if samples48 <= 0:
            raise r.error(f"last granule position does not exceed the pre-skip ({preskip})")
        return _header(r, "opus", samples48 * rate // 48000, rate, channels)
    raise r.error("unsupported codec (not Vorbis or Opus)")


def _last_granule(r: Reader, serial: int) -> int:
    """Granule position of the last page of stream ``serial`` that has one."""
    # Last pages are usually small: look at a little of the end first.
    for size in (4096, 2 * _OGG_MAX_PAGE):
        _, tail = r.tail(size)
        at = len(tail)
        while (at := tail.rfind(b"OggS", 0, at)) >= 0:
            page = tail[at : at + 27]
            if len(page) == 27 and page[4] == 0:
                granule, page_serial = struct.unpack_from("<qI", page, 6)
                if page_serial == serial and granule >= 0:
                    return granule
        if len(tail) == len(r):
            break
    raise r.error("no page with a granule position near the end")


# --- MP4 ---------------------------------------------------------------------
_MP4_CONTAINERS = (b"moov", b"trak", b"mdia", b"minf", b"stbl", b"edts")


def _boxes(r: Reader, pos: int, end: int) -> dict[bytes, tuple[int, int]]:
    """Map box type -> (body start, body end) for the boxes in ``[pos, end)``; first wins."""
    found: dict[bytes, tuple[int, int]] = {}
    while pos + 8 <= end:
        size, kind = r.unpack(">I4s", pos, "box header")
        body = pos + 8
        if size == 1:
            (size,) = r.unpack(">Q", body, "box header")
            body += 8
        elif size == 0:
            size = end - pos
        if size < body - pos:
            raise r.error(f"box at offset {pos} has size {size}")
        found.setdefault(kind, (body, min(pos + size, end)))
        pos += size
    return found


def _mp4(r: Reader, base: int) -> AudioHeader:
    top = _boxes(r, base, len(r))
    if b"moov" not in top:
        raise r.error("no 'moov' box (a truncated file, or moov past the payload)")
    moov = _boxes(r, *top[b"moov"])
    trak_pos, trak_end = top[b"moov"]
    # Several traks: walk them in order to find the first sound track.
    pos = trak_pos
    while pos + 8 <= trak_end:
        size, kind = r.unpack(">I4s", pos, "box header")
        if size < 8:
            raise r.error(f"box at offset {pos} has size {size}")
        if kind == b"trak":
            header = _mp4_sound_track(r, pos + 8, pos + size, moov)
            if header is not None:
                return header
        pos += size
    raise r.error("no sound track")


def _mp4_sound_track(
    r: Reader, pos: int, end: int, moov: dict[bytes, tuple[int, int]]
) -> AudioHeader | None:
    trak = _boxes(r, pos, end)
    if b"mdia" not in trak:
        return None
    mdia = _boxes(r, *trak[b"mdia"])
    if b"hdlr" not in mdia or r.read(mdia[b"hdlr"][0] + 8, 4) != b"soun":
        return None
    if b"mdhd" not in mdia:
        raise r.error("sound track without 'mdhd'")
    timescale, duration = _mp4_times(r, mdia[b"mdhd"][0])
    if timescale == 0 or duration == 0:
        raise r.error("no duration in 'mdhd' (fragmented MP4?)")
    samples = duration
    if b"edts" in trak:
        elst = _boxes(r, *trak[b"edts"]).get(b"elst")
        if elst is not None and b"mvhd" in moov:
            movie_scale, _ = _mp4_times(r, moov[b"mvhd"][0])
            samples = _mp4_edit(r, elst[0], samples, timescale, movie_scale)
    rate, channels = timescale, None
    if b"minf" in mdia:
        stbl = _boxes(r, *mdia[b"minf"]).get(b"stbl")
        stsd = _boxes(r, *stbl).get(b"stsd") if stbl else None
        if stsd is not None:
            # Audio sample entry: 8-byte box header after the 8-byte stsd header,
            # then channel count at +24 and 16.16 sample rate at +32.
            channels, rate_fixed = r.unpack(">H6xI", stsd[0] + 8 + 24, "'stsd' box")
            rate = rate_fixed >> 16 or timescale
    seconds = samples / timescale
    exact = samples if rate == timescale else None
    if seconds <= 0:
        raise r.error("empty sound track")
    return AudioHeader("mp4", seconds, rate, channels, exact)


def _mp4_times(r: Reader, body: int) -> tuple[int, int]:
    """``(timescale, duration)`` of an ``mdhd`` or ``mvhd`` box body (same layout)."""
    version = r.exact(body, 1, "'mdhd' box")[0]
    if version == 1:
        timescale, duration = r.unpack(">IQ", body + 20, "'mdhd' box")
    else:
        timescale, duration = r.unpack(">II", body + 12, "'mdhd' box")
    return timescale, duration


def _mp4_edit(r: Reader, body: int, samples: int, timescale: int, movie_scale: int) -> int:
    """Media samples an edit list presents: skip the priming, stop at the segment end."""
    version = r.exact(body, 1, "'elst' box")[0]
    (count,) = r.unpack(">I", body + 4, "'elst' box")
    if count != 1:
        return samples  # several edits: keep the media duration
    if version == 1:
        segment, media_time = r.unpack(">Qq", body + 8, "'elst' box")
    else:
        segment, media_time = r.unpack(">Ii", body + 8, "'elst' box")
    if media_time < 0:
        return samples
    presented = samples - media_time
    if segment and movie_scale:
        # The segment is in the (often millisecond) movie timescale: trust it
        # only when it cuts more than its own rounding.
        tick = timescale / movie_scale
        cut = segment * tick
        if cut + tick < presented:
            presented = round(cut)
    return presented
