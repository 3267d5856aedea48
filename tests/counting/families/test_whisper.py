"""Whisper profile against the real ``WhisperFeatureExtractor`` and ``WhisperConfig``."""

from __future__ import annotations

import random

import numpy as np
import pytest
from counting_helpers import shape_only
from pydantic import ValidationError
from transformers import WhisperConfig, WhisperFeatureExtractor

from modtrace.counting.families.audio_common import speech_to_text_chunks
from modtrace.counting.families.whisper import PROFILES, WHISPER, WhisperAudioParams
from modtrace.counting.profile import AudioInput, AudioUnits

#: openai/whisper-large-v3 preprocessor_config.json (feature_size 128, chunk_length 30).
CHECKPOINT_EXTRACTOR = {"feature_size": 128, "chunk_length": 30, "hop_length": 160}

#: Clip lengths (16 kHz samples) of at most 30 s: one chunk each.
ONE_CHUNK = sorted(
    {0, 1, 2, 159, 160, 161, 319, 320, 321, 400, 1600, 16_000, 80_000, 160_000}
    | {479_839, 479_840, 479_841, 479_999, 480_000}
    | set(random.Random(11).sample(range(1, 480_000), 190))
)
#: A few, checked through the real spectrogram (the rest through a shape-only stub).
FULL_STFT = [0, 1, 160, 321, 16_000, 240_007, 479_999, 480_000]


def _encoder_positions(mel_frames: int) -> int:
    """Whisper encoder length: conv1 (k3, s1, p1) then conv2 (k3, s2, p1).

    transformers@models/whisper/modeling_whisper.py ``WhisperEncoder``.
    """
    after_conv1 = (mel_frames + 2 * 1 - 3) // 1 + 1
    return (after_conv1 + 2 * 1 - 3) // 2 + 1


@pytest.fixture(scope="module")
def extractor() -> WhisperFeatureExtractor:
    """The checkpoint's feature extractor, real spectrogram."""
    return WhisperFeatureExtractor(**CHECKPOINT_EXTRACTOR)


@pytest.fixture(scope="module")
def fast_extractor() -> WhisperFeatureExtractor:
    """The checkpoint's feature extractor, spectrogram stubbed (shape only)."""
    return shape_only(WhisperFeatureExtractor(**CHECKPOINT_EXTRACTOR))


def _units(frames: int, tokens: int, chunks: int = 1) -> AudioUnits:
    return AudioUnits(frames=chunks * frames, tokens=chunks * tokens)


def _oracle(extractor: WhisperFeatureExtractor, samples: int) -> tuple[int, int]:
    """(mel frames the encoder reads, encoder positions) for one chunk, from HF."""
    out = extractor(np.zeros(samples, np.float32), sampling_rate=16000, return_tensors="np")
    frames = out["input_features"].shape[-1]
    return frames, _encoder_positions(frames)


class TestExactness:
    """One chunk: the extractor pads every clip to 3000 frames -> 1500 positions."""

    def test_corpus_size(self) -> None:
        """The corpus has at least 200 clip lengths."""
        assert len(ONE_CHUNK) >= 200

    @pytest.mark.parametrize("samples", FULL_STFT)
    def test_matches_extractor(self, extractor: WhisperFeatureExtractor, samples: int) -> None:
        """Frames and tokens equal the real extractor's output and the encoder's length."""
        assert WHISPER.audio(AudioInput(seconds=0, num_samples=samples)) == _units(
            *_oracle(extractor, samples)
        )

    def test_matches_extractor_corpus(self, fast_extractor: WhisperFeatureExtractor) -> None:
        """Over 200 lengths up to 30 s, frames and tokens equal the extractor's."""
        for samples in ONE_CHUNK:
            got = WHISPER.audio(AudioInput(seconds=0, num_samples=samples))
            assert got == _units(*_oracle(fast_extractor, samples)), samples

    def test_tokens_are_max_source_positions(self, extractor: WhisperFeatureExtractor) -> None:
        """1500 encoder positions = ``WhisperConfig.max_source_positions`` (vLLM's prompt)."""
        frames, positions = _oracle(extractor, 16_000)
        assert positions == WhisperConfig().max_source_positions == 1500
        assert frames == extractor.nb_max_frames == 3000

    def test_five_seconds_costs_thirty(self) -> None:
        """A 5 s clip is padded to 30 s: 3000 frames, 1500 tokens, as a 30 s one."""
        five = WHISPER.audio(AudioInput(seconds=5.0))
        assert five == WHISPER.audio(AudioInput(seconds=30.0))
        assert (five.frames, five.tokens) == (3000, 1500)


class TestChunking:
    """Clips over 30 s: vLLM's transcription endpoint splits them, one request per chunk."""

    @pytest.mark.parametrize(
        ("samples", "chunks"),
        [
            (480_000, 1),
            (480_001, 2),
            (944_000, 2),  # 30 s + 29 s
            (944_001, 3),
            (1_040_000, 3),  # vLLM split_audio docstring: 65 s -> 3 chunks
            (16_000 * 600, 21),
        ],
    )
    def test_chunk_counts(
        self, extractor: WhisperFeatureExtractor, samples: int, chunks: int
    ) -> None:
        """Each chunk costs the 3000 frames / 1500 tokens the extractor gives any chunk."""
        assert speech_to_text_chunks(samples) == chunks
        expected = _units(*_oracle(extractor, 480_000), chunks=chunks)
        assert WHISPER.audio(AudioInput(seconds=0, num_samples=samples)) == expected

    def test_resampled_clip_is_chunked_at_16k(self) -> None:
        """A 44.1 kHz clip of 30.5 s is 2 chunks once at 16 kHz."""
        item = AudioInput(seconds=30.5, sample_rate=44_100, num_samples=1_345_050)
        assert WHISPER.audio(item).tokens == 3000


class TestProfile:
    """The profile's wiring and parameters."""

    def test_registry_shape(self) -> None:
        """``PROFILES`` holds the whisper profile with an audio counter only."""
        assert PROFILES == (WHISPER,)
        assert WHISPER.image is None
        assert WHISPER.video is None
        assert WHISPER.audio is not None
        assert WHISPER.audio.ref == "whisper.audio@1"

    def test_defaults_from_checkpoint(self) -> None:
        """Defaults equal the HF extractor and config the checkpoint ships."""
        params = WHISPER.audio.params
        fe = WhisperFeatureExtractor(**CHECKPOINT_EXTRACTOR)
        assert (params.sampling_rate, params.hop_length, params.chunk_length) == (
            fe.sampling_rate,
            fe.hop_length,
            fe.chunk_length,
        )
        assert params.max_source_positions == WhisperConfig().max_source_positions

    def test_overrides_by_name(self) -> None:
        """Known keys override by name (a smaller encoder); unknown keys are ignored."""
        profile = WHISPER.with_params({"max_source_positions": 750, "max_pixels": 1})
        assert profile.audio(AudioInput(seconds=5.0)).tokens == 750
        assert WHISPER.with_params({"max_pixels": 1}).audio is WHISPER.audio

    @pytest.mark.parametrize("field", ["hop_length", "chunk_length", "max_source_positions"])
    def test_rejects_non_positive(self, field: str) -> None:
        """Zero or negative geometry is refused."""
        with pytest.raises(ValidationError):
            WhisperAudioParams(**{field: 0})

    def test_rejects_bad_duration(self) -> None:
        """A negative duration raises ``ValueError``."""
        with pytest.raises(ValueError, match="seconds"):
            WHISPER.audio(AudioInput(seconds=-1.0))
