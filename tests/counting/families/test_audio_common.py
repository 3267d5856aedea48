"""Shared audio helpers against the real resamplers and the real Whisper feature extractor."""

from __future__ import annotations

import io
import math
import random
import wave
from fractions import Fraction

import numpy as np
import pytest
from counting_helpers import shape_only
from transformers import WhisperFeatureExtractor
from transformers.utils import is_torch_available

from modtrace.counting.families.audio_common import (
    resampled_length,
    samples_at_rate,
    speech_to_text_chunks,
    whisper_mel_frames,
)
from modtrace.counting.families.numerics import ceil_div
from modtrace.counting.profile import AudioInput

RATES = (8000, 11025, 12000, 22050, 24000, 32000, 44100, 48000, 96000, 7999, 16001)


def _lengths(seed: int, count: int, top: int) -> list[int]:
    rng = random.Random(seed)
    fixed = [1, 2, 3, 5, 7, 100, 159, 160, 161, 441, 1023, 1024, 1025, 44100, 44101, 48000]
    return fixed + [rng.randint(1, top) for _ in range(count)]


#: Per rate: edge lengths and random ones up to 14 s at 48 kHz (87 s at 8 kHz).
LENGTHS = {rate: _lengths(rate, 10, 700_000) for rate in RATES}


# --- Resampling: each backend's output length ---------------------------------
class TestResampledLength:
    """``resampled_length`` against the libraries vLLM's ``AudioResampler`` calls."""

    @pytest.mark.parametrize("rate", RATES)
    def test_scipy_matches_resample_poly(self, rate: int) -> None:
        """The scipy backend is ``resample_poly(x, t/g, o/g)``: same length as scipy gives."""
        signal = pytest.importorskip("scipy.signal")
        g = math.gcd(rate, 16000)
        for n in LENGTHS[rate]:
            out = signal.resample_poly(np.zeros(n, np.float32), 16000 // g, rate // g)
            assert resampled_length(n, rate, 16000, "scipy") == len(out), n

    @pytest.mark.parametrize("rate", RATES)
    def test_soxr_matches_soxr(self, rate: int) -> None:
        """The soxr backend is ``soxr.resample(x, o, t)``: same length as python-soxr gives."""
        soxr = pytest.importorskip("soxr")
        for n in LENGTHS[rate]:
            out = soxr.resample(np.zeros(n, np.float32), rate, 16000)
            assert resampled_length(n, rate, 16000, "soxr") == len(out), n

    @pytest.mark.parametrize("rate", [8000, 22050, 44100, 44100.0, 22050.5, 48000, 7999])
    def test_librosa_matches_librosa(self, rate: float) -> None:
        """The librosa backend is ``librosa.resample`` (fix=True): same length as librosa gives."""
        librosa = pytest.importorskip("librosa")
        for n in _lengths(int(rate), 6, 400_000):
            out = librosa.resample(np.zeros(n, np.float32), orig_sr=rate, target_sr=16000)
            assert resampled_length(n, rate, 16000, "librosa") == len(out)

    @pytest.mark.parametrize("rate", RATES)
    def test_pyav_is_at_most_one_sample_long(self, rate: int) -> None:
        """The pyav backend returns the exact ceiling or, from libswresample, one sample less.

        Oracle: vLLM's ``resample_audio_pyav`` (vllm/multimodal/audio.py): zero-pad
        to 1024 samples, resample with ``av.AudioResampler(fltp, mono)``, flush,
        and keep ``ceil(N * t / o)`` samples.
        """
        av = pytest.importorskip("av")
        for n in LENGTHS[rate]:
            expected = math.ceil(n * 16000 / rate)
            audio = np.zeros(max(n, 1024), np.float32).reshape(1, -1)
            resampler = av.AudioResampler(format="fltp", layout="mono", rate=16000)
            frame = av.AudioFrame.from_ndarray(audio, format="fltp", layout="mono")
            frame.sample_rate = rate
            frames = resampler.resample(frame)
            frames.extend(resampler.resample(None))
            got = min(sum(f.samples for f in frames), expected)
            assert resampled_length(n, rate, 16000, "pyav") in (got, got + 1), n

    @pytest.mark.parametrize("rate", RATES)
    def test_torchaudio_matches_float32_ceil(self, rate: int) -> None:
        """torchaudio: ``torch.ceil(torch.as_tensor(t * N / o))``, the quotient cast to float32.

        Oracle: numpy's float32 cast of the same float64 quotient
        (torchaudio ``functional._apply_sinc_resample_kernel``; ``torch.as_tensor``
        of a Python float is float32).
        """
        g = math.gcd(rate, 16000)
        o, t = rate // g, 16000 // g
        for n in LENGTHS[rate]:
            expected = min(int(np.ceil(np.float32(t * n / o))), (n // o + 1) * t)
            assert resampled_length(n, rate, 16000, "torchaudio") == expected, n

    def test_torchaudio_float32_can_be_one_short(self) -> None:
        """Near 30 s at 44.1 kHz the float32 quotient falls on an integer: one sample short."""
        # 160 * n = 441 * k + 1: the exact quotient is k + 1/441, float32 rounds it to k.
        n = next(n for n in range(1_323_000, 1_324_000) if (160 * n) % 441 == 1)
        exact = ceil_div(n * 160, 441)
        assert Fraction(n * 160, 441) - (exact - 1) == Fraction(1, 441)
        assert resampled_length(n, 44100, 16000, "torchaudio") == exact - 1
        assert resampled_length(n, 44100, 16000, "scipy") == exact

    def test_same_rate_is_not_resampled(self) -> None:
        """A clip already at the target rate (within 1e-6 Hz) keeps its samples, per vLLM."""
        for method in ("torchaudio", "pyav", "scipy", "soxr", "librosa"):
            assert resampled_length(12345, 16000, 16000, method) == 12345
            assert resampled_length(12345, 16000.0000001, 16000, method) == 12345

    def test_zero_samples(self) -> None:
        """An empty clip stays empty whatever the rates."""
        assert resampled_length(0, 44100, 16000) == 0

    @pytest.mark.parametrize(
        ("kwargs", "match"),
        [
            ({"num_samples": -1, "orig_sr": 44100, "target_sr": 16000}, "num_samples"),
            ({"num_samples": 1.5, "orig_sr": 44100, "target_sr": 16000}, "num_samples"),
            ({"num_samples": True, "orig_sr": 44100, "target_sr": 16000}, "num_samples"),
            ({"num_samples": 10, "orig_sr": 0, "target_sr": 16000}, "sample_rate"),
            ({"num_samples": 10, "orig_sr": float("nan"), "target_sr": 16000}, "sample_rate"),
            ({"num_samples": 10, "orig_sr": 44100, "target_sr": -1}, "target_sr"),
            (
                {"num_samples": 10, "orig_sr": 44100, "target_sr": 16000, "method": "sox"},
                "resample_method",
            ),
        ],
    )
    def test_rejects_bad_input(self, kwargs: dict, match: str) -> None:
        """Bad counts, rates and backends raise ``ValueError`` naming the field."""
        with pytest.raises(ValueError, match=match):
            resampled_length(**kwargs)


# --- What the gateway knows -> samples ------------------------------------------
def _wav_bytes(samples: int, rate: int) -> bytes:
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(2)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(np.zeros((samples, 2), np.int16).tobytes())
    return buffer.getvalue()


class TestSamplesAtRate:
    """``samples_at_rate`` from what a request tells about a clip."""

    @pytest.mark.parametrize(("frames", "rate"), [(44101, 44100), (1_323_007, 44100), (8000, 8000)])
    def test_wav_header_matches_decoded_and_resampled_audio(self, frames: int, rate: int) -> None:
        """A real stereo WAV: header-derived samples equal the decoded, resampled clip's."""
        signal = pytest.importorskip("scipy.signal")
        data = _wav_bytes(frames, rate)
        with wave.open(io.BytesIO(data)) as wav:
            item = AudioInput(
                seconds=wav.getnframes() / wav.getframerate(),
                sample_rate=wav.getframerate(),
                num_samples=wav.getnframes(),
            )
            pcm = np.frombuffer(wav.readframes(wav.getnframes()), np.int16).reshape(-1, 2)
        mono = pcm.mean(axis=1).astype(np.float32)  # vLLM's channel reduction: mean
        g = math.gcd(rate, 16000)
        resampled = signal.resample_poly(mono, 16000 // g, rate // g) if rate != 16000 else mono
        assert samples_at_rate(item, 16000, "scipy") == len(resampled)

    def test_seconds_only_rounds_at_target_rate(self) -> None:
        """Only a duration: ``round(seconds * 16000)`` samples."""
        assert samples_at_rate(AudioInput(seconds=2.5), 16000) == 40000
        assert samples_at_rate(AudioInput(seconds=1 / 32000), 16000) == 1

    def test_seconds_and_rate_resample(self) -> None:
        """A duration and a rate: the samples at that rate, then resampled."""
        item = AudioInput(seconds=1.0, sample_rate=44100)
        assert samples_at_rate(item, 16000, "scipy") == 16000

    def test_samples_without_rate_are_at_target_rate(self) -> None:
        """Samples without a rate are used as they are, as vLLM does with raw arrays."""
        assert samples_at_rate(AudioInput(seconds=99, num_samples=777), 16000) == 777

    @pytest.mark.parametrize(
        ("item", "match"),
        [
            (AudioInput(seconds=-1.0), "seconds"),
            (AudioInput(seconds=float("inf")), "seconds"),
            (AudioInput(seconds=1.0, sample_rate=0), "sample_rate"),
            (AudioInput(seconds=1.0, num_samples=-5), "num_samples"),
        ],
    )
    def test_rejects_bad_input(self, item: AudioInput, match: str) -> None:
        """Negative or infinite durations, zero rates and negative counts raise."""
        with pytest.raises(ValueError, match=match):
            samples_at_rate(item, 16000)


# --- Whisper feature extractor: padding and attention mask ------------------------
@pytest.fixture(scope="module")
def short_extractor() -> WhisperFeatureExtractor:
    """A real extractor with a 3 s window, so that long and short cases stay fast."""
    return WhisperFeatureExtractor(feature_size=80, chunk_length=3)


@pytest.fixture(scope="module")
def shape_only_extractor() -> WhisperFeatureExtractor:
    """The same, its spectrogram replaced by zeros of ``padded // hop`` frames.

    Padding, truncation and the attention mask stay transformers' code; the
    real spectrogram (same frame count, checked on the short clips and the
    checkpoint extractor below) is skipped for speed.
    """
    return shape_only(WhisperFeatureExtractor(feature_size=80, chunk_length=3))


EXTRACTOR_KWARGS = [
    {"padding": "max_length"},
    {"padding": "max_length", "truncation": False},
    {"padding": "max_length", "pad_to_multiple_of": 7000},
    {"padding": "max_length", "truncation": False, "pad_to_multiple_of": 7000},
    {"padding": "longest", "truncation": False, "pad_to_multiple_of": 160},
    {"padding": "longest", "truncation": True},
    {"padding": "longest", "truncation": False},
]
EXTRACTOR_LENGTHS = [
    1,
    2,
    159,
    160,
    161,
    319,
    320,
    321,
    47_999,
    48_000,
    48_001,
    48_159,
    48_160,
    96_007,
    *random.Random(7).sample(range(1, 100_000), 12),
]


class TestWhisperMelFrames:
    """``whisper_mel_frames`` against ``WhisperFeatureExtractor``'s features and mask."""

    @pytest.mark.parametrize("kwargs", EXTRACTOR_KWARGS)
    def test_matches_extractor(
        self,
        short_extractor: WhisperFeatureExtractor,
        shape_only_extractor: WhisperFeatureExtractor,
        kwargs: dict,
    ) -> None:
        """Mask sum and feature frames equal the extractor's, or both refuse the clip.

        Clips under 400 samples run the real spectrogram (the one that may refuse
        them). vLLM always has torch, whose ``stft`` refuses 200 samples or fewer;
        without torch, transformers' numpy path accepts 160 to 200: only then may
        the two differ.
        """
        for n in EXTRACTOR_LENGTHS:
            extractor = short_extractor if n < 400 else shape_only_extractor
            try:
                out = extractor(
                    np.zeros(n, np.float32),
                    sampling_rate=16000,
                    return_attention_mask=True,
                    return_tensors="np",
                    **kwargs,
                )
            except (ValueError, RuntimeError):
                with pytest.raises(ValueError, match="too few for the mel spectrogram"):
                    whisper_mel_frames(n, max_length=short_extractor.n_samples, **kwargs)
                continue
            expected = (int(out["attention_mask"].sum()), out["input_features"].shape[-1])
            try:
                got = whisper_mel_frames(n, max_length=short_extractor.n_samples, **kwargs)
            except ValueError:
                assert not is_torch_available()
                assert expected[1] == 1, (n, kwargs)  # 160..200 samples: one frame
                continue
            assert got == expected, (n, kwargs)

    @pytest.mark.parametrize("n", [1, 160, 16000, 479_999, 480_000, 480_001, 1_000_000])
    def test_matches_checkpoint_extractor(self, n: int) -> None:
        """With the 30 s checkpoint window: ``min(ceil(N/160), 3000)`` of 3000 frames."""
        extractor = WhisperFeatureExtractor(feature_size=128)
        out = extractor(
            np.zeros(n, np.float32),
            sampling_rate=16000,
            return_attention_mask=True,
            return_tensors="np",
        )
        expected = (int(out["attention_mask"].sum()), out["input_features"].shape[-1])
        assert whisper_mel_frames(n) == expected


# --- vLLM transcription chunking ------------------------------------------------------
def _vllm_split_points(audio: np.ndarray, chunk: int, overlap: int, window: int) -> list[int]:
    """Chunk lengths from vLLM's ``split_audio`` + ``find_split_point``.

    Transcribed from vllm@vllm/multimodal/audio.py: cut each chunk at the
    quietest ``window``-sample RMS window of its last ``overlap`` samples.
    """
    lengths, i = [], 0
    while i < len(audio):
        if i + chunk >= len(audio):
            lengths.append(len(audio) - i)
            break
        start, end = i + chunk - overlap, min(i + chunk, len(audio))
        segment = audio[start:end]
        best, split = math.inf, start
        for k in range(0, len(segment) - window, window):
            energy = float(np.sqrt(np.mean(segment[k : k + window] ** 2)))
            if energy < best:
                best, split = energy, start + k
        if split <= i:
            split = min(i + chunk, len(audio))
        lengths.append(split - i)
        i = split
    return lengths


class TestSpeechToTextChunks:
    """``speech_to_text_chunks`` against vLLM's splitting of real arrays."""

    def test_docstring_example(self) -> None:
        """vLLM's ``split_audio`` docstring: 1,040,000 samples (65 s) -> 3 chunks."""
        assert speech_to_text_chunks(1_040_000) == 3

    @pytest.mark.parametrize(
        "n", [1, 479_999, 480_000, 480_001, 944_000, 944_001, 1_040_000, 5_000_000]
    )
    def test_silence_matches_vllm_split(self, n: int) -> None:
        """On silence the split count is exact."""
        audio = np.zeros(n, np.float32)
        assert speech_to_text_chunks(n) == len(_vllm_split_points(audio, 480_000, 16_000, 1600))

    @pytest.mark.parametrize("n", [960_001, 1_040_000, 2_900_000])
    def test_noise_never_exceeds_the_count(self, n: int) -> None:
        """On noise with quiet spots the split may land later: never more chunks."""
        rng = np.random.default_rng(n)
        audio = rng.standard_normal(n).astype(np.float32)
        audio[rng.integers(0, n, 40)] = 0.0
        got = len(_vllm_split_points(audio, 480_000, 16_000, 1600))
        assert got <= speech_to_text_chunks(n)
        # A cut lands at most 8 windows into the 1 s overlap: chunks of <= 476,800.
        assert got >= 1 + ceil_div(n - 480_000, 476_800)

    def test_empty_clip_is_one_chunk(self) -> None:
        """A clip shorter than 30 s, even an empty one, is sent whole."""
        assert speech_to_text_chunks(0) == 1
