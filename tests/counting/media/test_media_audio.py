"""Audio header probing against the decoders vLLM uses: soundfile first, PyAV after.

Tolerances (why): WAV, FLAC, Ogg Vorbis/Opus and MP3 with a Xing/LAME tag
must match soundfile's decoded frame count exactly, since their headers
state it. CBR MP3 without a tag is an estimate from the payload length:
within one frame (``samples per frame``). AAC in MP4: the header states
the exact presented length (the samples written); PyAV decodes whole AAC
frames after dropping the priming, so it returns up to one frame (1024)
more.
"""

from __future__ import annotations

import base64
import io
import struct
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from media_samples import (
    SOURCES,
    as_source,
    av_decoded,
    av_encode,
    riff,
    sf_decoded_frames,
    sf_encode,
    sf_rate,
    tone,
    wav_fmt,
)

from modtrace.counting.media import AudioHeader, B64View, MediaError, probe_audio

N = 12_345  # frames written: deliberately not a multiple of any codec block


def check_exact(raw: bytes, fmt: str, kind: str = "bytes") -> AudioHeader:
    """Probe ``raw`` and require soundfile's decoded frames and rate, exactly."""
    header = probe_audio(as_source(raw, kind))
    assert header.format == fmt
    assert header.num_samples == sf_decoded_frames(raw)
    assert header.sample_rate == sf_rate(raw)
    assert header.seconds == pytest.approx(header.num_samples / header.sample_rate)
    return header


class TestWav:
    @pytest.mark.parametrize("kind", SOURCES)
    @pytest.mark.parametrize(
        "subtype", ["PCM_16", "PCM_24", "PCM_32", "PCM_U8", "FLOAT", "DOUBLE", "ULAW", "ALAW"]
    )
    def test_sample_formats(self, subtype: str, kind: str) -> None:
        """Linear, float and companded PCM: data bytes // block align."""
        assert check_exact(sf_encode(N, 16000, "WAV", subtype), "wav", kind).num_samples == N

    @pytest.mark.parametrize("channels", [1, 2, 6])
    def test_extensible(self, channels: int) -> None:
        """WAVE_FORMAT_EXTENSIBLE (what soundfile writes as WAVEX)."""
        raw = sf_encode(N, 48000, "WAVEX", "PCM_24", channels)
        assert struct.unpack("<H", raw[20:22])[0] == 0xFFFE
        assert check_exact(raw, "wav").channels == channels

    def test_extensible_float(self) -> None:
        """An extensible header whose sub-format is IEEE float."""
        check_exact(sf_encode(N, 22050, "WAVEX", "FLOAT", 2), "wav")

    @pytest.mark.parametrize("subtype", ["IMA_ADPCM", "MS_ADPCM"])
    def test_adpcm_counts_whole_blocks(self, subtype: str) -> None:
        """ADPCM: whole blocks times samples per block, as libsndfile decodes them."""
        check_exact(sf_encode(N, 16000, "WAV", subtype), "wav")

    def test_gsm_uses_fact(self) -> None:
        """Other codecs fall back on the ``fact`` chunk: within two 320-sample GSM blocks."""
        raw = sf_encode(N, 8000, "WAV", "GSM610")
        header = probe_audio(raw)
        assert header.num_samples == N
        assert abs(header.num_samples - sf_decoded_frames(raw)) <= 640

    def test_rf64(self) -> None:
        """RF64: sizes come from the ds64 chunk."""
        raw = sf_encode(N, 16000, "RF64", "PCM_16")
        assert raw[:4] == b"RF64"
        check_exact(raw, "wav", "b64")

    def test_list_chunk_and_odd_padding(self) -> None:
        """LIST and odd-sized chunks (with their pad byte) before ``data`` are skipped."""
        pcm = (tone(N, 16000) * 32767).astype("<i2").tobytes()
        raw = riff(
            [
                (b"fmt ", wav_fmt(1, 16000, 16)),
                (b"LIST", b"INFOINAM" + struct.pack("<I", 5) + b"title"),  # odd size
                (b"junk", b"abc"),
                (b"data", pcm),
            ]
        )
        assert check_exact(raw, "wav", "b64_mime_crlf").num_samples == N

    def test_odd_data_then_trailing_chunk(self) -> None:
        """An odd-sized 8-bit data chunk followed by another chunk."""
        raw = riff(
            [(b"fmt ", wav_fmt(1, 8000, 8)), (b"data", bytes(range(255)) * 3), (b"LIST", b"x")]
        )
        check_exact(raw, "wav")

    def test_streamed_size_is_clamped(self) -> None:
        """A ``data`` size of 0xFFFFFFFF (streamed) counts the bytes actually there."""
        raw = bytearray(sf_encode(N, 16000, "WAV", "PCM_16"))
        at = raw.index(b"data")
        raw[at + 4 : at + 8] = b"\xff\xff\xff\xff"
        check_exact(bytes(raw), "wav")

    def test_cut_file_counts_what_is_there(self) -> None:
        """A file cut inside its samples decodes to what remains, as libsndfile reads it."""
        raw = sf_encode(N, 16000, "WAV", "PCM_16")
        check_exact(raw[: len(raw) - 1001], "wav")

    def test_missing_data(self) -> None:
        """A WAV without a ``data`` chunk has no duration."""
        with pytest.raises(MediaError, match="WAV: no 'data' chunk"):
            probe_audio(riff([(b"fmt ", wav_fmt(1, 8000, 16))]))

    def test_missing_fmt(self) -> None:
        """A WAV without ``fmt `` cannot be sized."""
        with pytest.raises(MediaError, match="WAV: no 'fmt ' chunk"):
            probe_audio(riff([(b"data", bytes(8))]))

    def test_zero_block_align(self) -> None:
        """A ``fmt `` chunk with block align 0 is corrupt."""
        fmt = struct.pack("<HHIIHH", 1, 1, 8000, 0, 0, 16)
        with pytest.raises(MediaError, match="block align 0"):
            probe_audio(riff([(b"fmt ", fmt), (b"data", bytes(8))]))

    def test_every_truncation_of_the_header(self) -> None:
        """Each prefix of a real header gives MediaError or a header, nothing else."""
        raw = sf_encode(400, 8000, "WAVEX", "PCM_16", 2)
        for n in range(200):
            try:
                header = probe_audio(raw[:n])
            except MediaError:
                continue
            assert 0 < header.num_samples <= 400


class TestFlac:
    @pytest.mark.parametrize("kind", SOURCES)
    @pytest.mark.parametrize(("rate", "channels"), [(8000, 1), (44100, 2), (96000, 1)])
    def test_streaminfo(self, rate: int, channels: int, kind: str) -> None:
        """STREAMINFO's total samples, sample rate and channels."""
        header = check_exact(sf_encode(N, rate, "FLAC", "PCM_16", channels), "flac", kind)
        assert (header.num_samples, header.channels) == (N, channels)

    def test_unknown_total_is_rejected_like_libsndfile(self) -> None:
        """Total samples 0 (unknown): libsndfile reports SF_COUNT_MAX, so vLLM cannot decode it."""
        raw = bytearray(sf_encode(N, 16000, "FLAC"))
        raw[8 + 13] &= 0xF0  # total samples: low 4 bits of byte 13 and bytes 14..17
        raw[8 + 14 : 8 + 18] = bytes(4)
        assert sf.info(io.BytesIO(bytes(raw))).frames == 2**63 - 1
        with pytest.raises(MediaError, match="FLAC: STREAMINFO total samples is 0"):
            probe_audio(bytes(raw))

    def test_id3_before_flac(self) -> None:
        """An ID3v2 tag before ``fLaC`` is skipped."""
        raw = sf_encode(N, 16000, "FLAC")
        id3 = b"ID3\x04\x00\x00" + bytes([0, 0, 1, 0]) + bytes(128)
        assert probe_audio(id3 + raw) == probe_audio(raw)
        assert probe_audio(raw).num_samples == N

    def test_first_block_not_streaminfo(self) -> None:
        """A FLAC stream must start with STREAMINFO."""
        raw = bytearray(sf_encode(N, 16000, "FLAC"))
        raw[4] = 0x04  # VORBIS_COMMENT
        with pytest.raises(MediaError, match="FLAC: first metadata block is not"):
            probe_audio(bytes(raw))


class TestOgg:
    @pytest.mark.parametrize("kind", SOURCES)
    @pytest.mark.parametrize(("rate", "channels"), [(16000, 1), (44100, 2)])
    def test_vorbis(self, rate: int, channels: int, kind: str) -> None:
        """Vorbis: the last page's granule position."""
        raw = sf_encode(N, rate, "OGG", "VORBIS", channels)
        assert check_exact(raw, "vorbis", kind).num_samples == N

    @pytest.mark.parametrize("rate", [8000, 12000, 16000, 24000, 48000])
    def test_opus_rates(self, rate: int) -> None:
        """Opus: 48 kHz granules less pre-skip, at libsndfile's decode rate."""
        raw = sf_encode(N, rate, "OGG", "OPUS")
        assert check_exact(raw, "opus", "b64").num_samples == N

    def test_opus_by_ffmpeg(self) -> None:
        """An Opus stream muxed by FFmpeg: same seconds as both decoders."""
        raw = av_encode(N, 48000, "ogg", "libopus", channels=2)
        header = check_exact(raw, "opus")
        assert header.seconds == pytest.approx(av_decoded(raw)[0] / 48000)

    @pytest.mark.parametrize("input_rate", [44100, 22050, 11025, 0])
    def test_opus_decode_rate_choice(self, input_rate: int) -> None:
        """libsndfile decodes at the lowest Opus rate >= the declared input rate."""
        raw = bytearray(sf_encode(N, 48000, "OGG", "OPUS"))
        head = raw.index(b"OpusHead")
        raw[head + 12 : head + 16] = struct.pack("<I", input_rate)
        # The page CRC covers the header: recompute it so libsndfile accepts the page.
        raw[22:26] = bytes(4)
        raw[22:26] = struct.pack(
            "<I", ogg_crc(bytes(raw[: 27 + raw[26] + sum(raw[27 : 27 + raw[26]])]))
        )
        header = check_exact(bytes(raw), "opus")
        # 48 kHz granules, floored to the decode rate: within one output sample.
        assert header.seconds == pytest.approx(N / 48000, abs=1 / header.sample_rate)

    def test_long_last_page(self) -> None:
        """A last page far from the end of a short tail window is still found."""
        raw = sf_encode(48000 * 3, 48000, "OGG", "VORBIS", 2)
        check_exact(raw, "vorbis")

    def test_unsupported_codec(self) -> None:
        """Ogg FLAC has no reader here: a clear error, not a wrong duration."""
        raw = av_encode(N, 16000, "ogg", "flac")
        with pytest.raises(MediaError, match="Ogg: unsupported codec"):
            probe_audio(raw)

    def test_audio_pages_of_another_stream(self) -> None:
        """Audio pages under another serial number leave our stream without samples."""
        raw = bytearray(sf_encode(N, 16000, "OGG", "VORBIS"))
        pages = [at for at in range(len(raw) - 4) if raw[at : at + 4] == b"OggS"]
        for at in pages[1:]:
            raw[at + 14 : at + 18] = b"\x00\x00\xee\xee"
        with pytest.raises(MediaError, match="Ogg Vorbis: no audio samples"):
            probe_audio(bytes(raw))

    def test_no_granule_anywhere(self) -> None:
        """Pages whose granule is -1 (no packet ends there) only: no length."""
        raw = bytearray(sf_encode(N, 16000, "OGG", "VORBIS"))
        for at in range(len(raw) - 4):
            if raw[at : at + 4] == b"OggS":
                raw[at + 6 : at + 14] = b"\xff" * 8
        with pytest.raises(MediaError, match="Ogg Vorbis: no page with a granule position"):
            probe_audio(bytes(raw))


def ogg_crc(page: bytes) -> int:
    """Ogg's CRC-32 (polynomial 0x04C11DB7, no reflection), over a page with CRC zeroed."""
    crc = 0
    for byte in page:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


class TestMp3:
    @pytest.mark.parametrize("kind", SOURCES)
    @pytest.mark.parametrize(
        ("rate", "channels"),
        [
            *[(44100, 2), (48000, 1), (32000, 2)],  # MPEG-1
            *[(22050, 1), (24000, 2), (16000, 1)],  # MPEG-2
            *[(11025, 2), (12000, 1), (8000, 1)],  # MPEG-2.5
        ],
    )
    def test_lame_gapless(self, rate: int, channels: int, kind: str) -> None:
        """MPEG-1, -2 and -2.5 layer III from LAME: Xing frames less delay and padding."""
        raw = sf_encode(N, rate, "MP3", "MPEG_LAYER_III", channels)
        assert check_exact(raw, "mp3", kind).num_samples == N

    @pytest.mark.parametrize("rate", [44100, 22050, 8000])
    def test_ffmpeg_id3_and_info_tag(self, rate: int) -> None:
        """FFmpeg's MP3: an ID3v2 tag, then an Info frame with a Lavc gapless tag."""
        raw = av_encode(N, rate, "mp3", "libmp3lame")
        assert raw[:3] == b"ID3"
        assert check_exact(raw, "mp3").num_samples == N
        assert av_decoded(raw)[0] == N

    @pytest.mark.parametrize("rate", [44100, 16000, 8000])
    def test_cbr_without_tag(self, rate: int) -> None:
        """No Xing tag: frames estimated from the payload length, within one frame."""
        raw = av_encode(N, rate, "mp3", "libmp3lame", options={"write_xing": "0"})
        header = probe_audio(raw)
        assert header.num_samples is None
        spf = 1152 if rate > 24000 else 576
        assert abs(header.seconds * rate - sf_decoded_frames(raw)) <= spf
        assert abs(header.seconds * rate - av_decoded(raw)[0]) <= spf

    def test_trailing_id3v1_and_ape_tags(self) -> None:
        """ID3v1 and APEv2 tags at the end are not counted as audio."""
        raw = av_encode(N, 44100, "mp3", "libmp3lame", options={"write_xing": "0"})
        item = struct.pack("<II", 5, 0) + b"Title\0hello"
        ape = item + b"APETAGEX" + struct.pack("<IIII", 2000, len(item) + 32, 1, 0) + bytes(8)
        id3v1 = b"TAG" + bytes(125)
        tagged = raw + ape + id3v1
        assert probe_audio(tagged) == probe_audio(raw)
        assert abs(probe_audio(tagged).seconds * 44100 - sf_decoded_frames(tagged)) <= 1152

    def test_vbri(self) -> None:
        """A VBRI (Fraunhofer) tag frame: its frame count times samples per frame."""
        cbr = av_encode(
            N, 44100, "mp3", "libmp3lame", options={"write_xing": "0", "id3v2_version": "0"}
        )
        frames = av_decoded(cbr)[0] // 1152
        # A 128 kb/s, 44.1 kHz, mono MPEG-1 layer III frame is 417 bytes.
        body = bytearray(417 - 4)
        tag = b"VBRI" + struct.pack(">HHHIIHHHH", 1, 576, 75, len(cbr), frames, 0, 1, 1, 1)
        body[32 : 32 + len(tag)] = tag
        raw = bytes.fromhex("fffb90c4") + bytes(body) + cbr
        header = probe_audio(raw)
        assert header.num_samples == av_decoded(raw)[0] == frames * 1152

    def test_layer_two(self) -> None:
        """MPEG audio layer II: 1152 samples per frame at every rate."""
        raw = av_encode(N, 16000, "mp2", "mp2")
        header = probe_audio(raw)
        assert header.format == "mp2"
        assert abs(header.seconds * 16000 - sf_decoded_frames(raw)) <= 1152

    def test_junk_before_first_frame_with_hint(self) -> None:
        """Junk before the first frame: found when the request says ``mp3``."""
        raw = sf_encode(N, 16000, "MP3", "MPEG_LAYER_III")
        junk = b"\x00junk\xff\x00" * 10 + raw
        with pytest.raises(MediaError, match="audio: unrecognised format"):
            probe_audio(junk)
        assert probe_audio(junk, format_hint="mp3") == probe_audio(raw)

    def test_hint_never_overrides_magic(self) -> None:
        """A wrong ``format`` in the request does not change what the bytes are."""
        raw = sf_encode(N, 16000, "WAV", "PCM_16")
        assert probe_audio(raw, format_hint="mp3").format == "wav"

    def test_id3_then_garbage(self) -> None:
        """An ID3 tag followed by no MPEG frame at all."""
        raw = b"ID3\x03\x00\x00\x00\x00\x00\x04" + bytes(4) + b"nothing here" * 10
        with pytest.raises(MediaError, match="MP3: no MPEG audio frame"):
            probe_audio(raw)


class TestMp4:
    @pytest.mark.parametrize("kind", SOURCES)
    @pytest.mark.parametrize(
        ("container", "rate", "channels"), [("ipod", 16000, 1), ("mp4", 44100, 2)]
    )
    def test_aac(self, container: str, rate: int, channels: int, kind: str) -> None:
        """AAC: mdhd less the edit-list priming is the length written; PyAV adds < 1 frame."""
        raw = av_encode(N, rate, container, "aac", channels)
        header = probe_audio(as_source(raw, kind))
        assert header == AudioHeader("mp4", N / rate, rate, channels, N)
        decoded, decoded_rate = av_decoded(raw)
        assert decoded_rate == rate
        assert 0 <= decoded - N < 1024

    def test_faststart(self, tmp_path: Path) -> None:
        """``moov`` before ``mdat`` (faststart) reads the same."""
        options = {"movflags": "faststart"}
        raw = av_encode(N, 16000, "mp4", "aac", options=options, path=tmp_path / "a.mp4")
        assert raw.index(b"moov") < raw.index(b"mdat")
        assert probe_audio(raw).num_samples == N

    def test_alac_exact(self) -> None:
        """A lossless codec in MP4 decodes to exactly the header's count."""
        raw = av_encode(N, 16000, "mp4", "alac")
        header = probe_audio(raw)
        assert header.num_samples == av_decoded(raw)[0] == N

    def test_fragmented(self) -> None:
        """Fragmented MP4 keeps no duration in ``moov``: a clear error."""
        raw = av_encode(N, 16000, "mp4", "aac", options={"movflags": "frag_keyframe+empty_moov"})
        with pytest.raises(MediaError, match="MP4: no duration"):
            probe_audio(raw)

    def test_truncated_before_moov(self) -> None:
        """A file cut before its trailing ``moov`` cannot be sized."""
        raw = av_encode(N, 16000, "mp4", "aac")
        with pytest.raises(MediaError, match="MP4: "):
            probe_audio(raw[: raw.index(b"moov") - 4])


class TestBase64Payloads:
    def test_openai_input_audio(self) -> None:
        """The OpenAI ``input_audio`` shape: plain base64 plus a declared format."""
        raw = sf_encode(16000 * 20, 16000, "WAV", "PCM_16")
        data = base64.b64encode(raw).decode()
        header = probe_audio(B64View(data), format_hint="wav")
        assert header.seconds == 20.0

    def test_invalid_base64_in_header(self) -> None:
        """A bad character where the header lies is a base64 MediaError."""
        data = base64.b64encode(sf_encode(N, 16000, "WAV", "PCM_16")).decode()
        with pytest.raises(MediaError, match="base64: invalid character"):
            probe_audio(B64View(data[:20] + "!" + data[21:]))


_MAGICS = [b"RIFF\x00\x00\x00\x00WAVE", b"fLaC", b"OggS", b"\x00\x00\x00\x18ftypM4A ", b"ID3"]
_MAGICS += [b"\xff\xfb\x90\xc4", b"RF64\xff\xff\xff\xffWAVE"]


class TestRobustness:
    @pytest.mark.parametrize(
        ("raw", "message"),
        [
            (b"", "audio: empty payload"),
            (b"not audio at all", "audio: unrecognised format"),
            (b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0", "WAV: truncated 'fmt ' chunk"),
            (b"fLaC\0\0\0\x22" + bytes(10), "FLAC: truncated STREAMINFO"),
            (b"OggS" + bytes(10), "Ogg: truncated page header"),
        ],
    )
    def test_message_names_format(self, raw: bytes, message: str) -> None:
        """Each failure is a MediaError whose message names the format and the fault."""
        with pytest.raises(MediaError, match=message):
            probe_audio(raw)

    @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(magic=st.sampled_from([b"", *_MAGICS]), tail=st.binary(max_size=300))
    def test_random_bytes(self, magic: bytes, tail: bytes) -> None:
        """Random bytes, with or without a real magic, give AudioHeader or MediaError only."""
        try:
            header = probe_audio(magic + tail, format_hint="mp3")
        except MediaError:
            return
        assert header.seconds > 0

    @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        which=st.integers(0, 5),
        flips=st.lists(st.tuples(st.integers(0, 300), st.integers(0, 255)), max_size=4),
        cut=st.integers(0, 2000),
    )
    def test_corrupted_real_headers(
        self, which: int, flips: list[tuple[int, int]], cut: int
    ) -> None:
        """Real files with header bytes overwritten and tails cut: AudioHeader or MediaError."""
        raw = bytearray(_REAL[which])
        for at, value in flips:
            raw[at % len(raw)] = value
        data = bytes(raw[: max(0, len(raw) - cut)])
        try:
            header = probe_audio(B64View(base64.b64encode(data).decode()))
        except MediaError:
            return
        assert np.isfinite(header.seconds)
        assert header.seconds > 0


_REAL = [
    sf_encode(3000, 8000, "WAV", "PCM_16"),
    sf_encode(3000, 8000, "FLAC"),
    sf_encode(3000, 8000, "OGG", "VORBIS"),
    sf_encode(3000, 8000, "OGG", "OPUS"),
    sf_encode(3000, 8000, "MP3", "MPEG_LAYER_III"),
    av_encode(3000, 8000, "ipod", "aac"),
]


def _ogg_page(packet: bytes) -> bytes:
    """One Ogg page (version 0, BOS) holding ``packet`` as its single segment."""
    header = b"OggS" + bytes([0, 2]) + bytes(8) + struct.pack("<III", 1, 0, 0)
    return header + bytes([1, len(packet)]) + packet


class TestNoPayloadBytesInErrors:
    """Error messages reach spans: they name formats and lengths, never payload bytes."""

    SECRET = b"SSN 078-05-1120 "

    @pytest.mark.parametrize(
        ("raw", "hint", "expected"),
        [
            (SECRET * 2, None, "audio: unrecognised format (32 bytes)"),
            (SECRET * 2, "wav", "audio: unrecognised format (32 bytes, declared 'wav')"),
            (SECRET * 2, "SSN 078-05-1120", "audio: unrecognised format (32 bytes, declared (not"),
            (_ogg_page(SECRET * 2), None, "Ogg: unsupported codec"),
            (
                b"\0\0\0\x10ftypisom\0\0\0\0" + b"\0\0\0\x04" + SECRET * 2,
                None,
                "MP4: box at offset 16 has size 4",
            ),
        ],
    )
    def test_message_names_the_format_not_the_bytes(
        self, raw: bytes, hint: str | None, expected: str
    ) -> None:
        """A text document posing as audio: no hex, no repr of its bytes, no unsafe hint."""
        for source in (raw, B64View(base64.b64encode(raw).decode())):
            with pytest.raises(MediaError) as info:
                probe_audio(source, hint)
            message = str(info.value)
            assert expected in message
            for leaked in ("SSN", "078", self.SECRET[:4].hex(), self.SECRET[4:8].hex()):
                assert leaked not in message, message
