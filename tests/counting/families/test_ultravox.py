"""Ultravox profile against the real Whisper feature extractor and fixie-ai's worked examples.

transformers does not ship ``UltravoxProcessor`` (it is the checkpoint's
remote code), so the oracle is its audio path reproduced on the real
``WhisperFeatureExtractor``: the same call (``padding="longest"``,
``pad_to_multiple_of=hop_length``, ``truncation=False``) gives the mel
frames, and the processor's chunking and rounding are transcribed from
fixie-ai/ultravox ``ultravox/model/ultravox_processing.py``. Its own
tests' expected values are checked as worked examples.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from counting_helpers import shape_only
from transformers import WhisperFeatureExtractor

from modtrace.counting.families.ultravox import (
    PROFILES,
    ULTRAVOX,
    UltravoxAudioParams,
    ultravox_chunk_frames,
)
from modtrace.counting.profile import AudioInput

#: The v0.5 checkpoints' audio processor: openai/whisper-large-v3-turbo's extractor.
EXTRACTOR = {"feature_size": 128, "chunk_length": 30, "hop_length": 160}
#: fixie-ai/ultravox-v0_5-llama-3_2-1b processor_config.json.
PROCESSOR_CONFIG = {"audio_context_size": 3000, "encoder_ds_factor": 2, "stack_factor": 8}

LENGTHS = sorted(
    {0, 1, 159, 160, 161, 319, 320, 321, 2559, 2560, 2561, 16_000, 160_000}
    | {479_840, 479_999, 480_000, 480_001, 480_160, 480_161, 560_000}
    | {959_999, 960_000, 960_001, 16_000 * 65}
    | set(random.Random(31).sample(range(1, 16_000 * 70), 180))
)
#: Several minutes, a few only (no truncation: the spectrogram covers the whole clip).
LONG = [16_000 * 180 + 1, 16_000 * 300, 16_000 * 301 + 77]


def _processor_audio(extractor: WhisperFeatureExtractor, n: int) -> tuple[list[int], list[int]]:
    """(``audio_lens`` per chunk, ``audio_token_len`` per chunk) as UltravoxProcessor makes them."""
    hop = extractor.hop_length
    audio = np.zeros(n, np.float32)
    if len(audio) < 2 * hop:  # "Pad out each audio to at least 2 hops"
        audio = np.pad(audio, (0, 2 * hop - len(audio)))
    out = extractor(
        [audio],
        sampling_rate=16000,
        padding="longest",
        pad_to_multiple_of=hop,
        truncation=False,
        return_attention_mask=True,
        return_tensors="np",
    )
    length = int(out["attention_mask"].sum(-1)[0])
    assert out["input_features"].shape[-1] == length  # one clip: no padding frames
    context = PROCESSOR_CONFIG["audio_context_size"]
    lens = [min(length - offset, context) for offset in range(0, length, context)]
    per_token = PROCESSOR_CONFIG["encoder_ds_factor"] * PROCESSOR_CONFIG["stack_factor"]
    return lens, [math.ceil(chunk / per_token) for chunk in lens]


@pytest.fixture(scope="module")
def extractor() -> WhisperFeatureExtractor:
    """The extractor, real spectrogram."""
    return WhisperFeatureExtractor(**EXTRACTOR)


@pytest.fixture(scope="module")
def fast_extractor() -> WhisperFeatureExtractor:
    """The extractor, spectrogram stubbed (shape only)."""
    return shape_only(WhisperFeatureExtractor(**EXTRACTOR))


class TestWorkedExamples:
    """Expected values of fixie-ai/ultravox ``ultravox/model/ultravox_processing_test.py``."""

    @pytest.mark.parametrize(
        ("seconds", "lens", "tokens"),
        [
            (1, [100], [7]),  # test_processor_single_audio
            (10, [1000], [63]),  # test_processor_multiple_audios
            (35, [3000, 500], [188, 32]),  # test_processor_overflowing_audio
        ],
    )
    def test_processor_tests(
        self, extractor: WhisperFeatureExtractor, seconds: int, lens: list, tokens: list
    ) -> None:
        """The oracle reproduces fixie-ai's values, and the profile gives their sums."""
        assert _processor_audio(extractor, 16_000 * seconds) == (lens, tokens)
        units = ULTRAVOX.audio(AudioInput(seconds=float(seconds)))
        assert (units.frames, units.tokens) == (sum(lens), sum(tokens))

    @pytest.mark.parametrize("n", [0, 1, 159, 160, 161, 319, 320, 321])
    def test_audio_shapes(self, extractor: WhisperFeatureExtractor, n: int) -> None:
        """test_audio_shapes: tiny clips are padded to 2 hops; frames equal features."""
        lens, tokens = _processor_audio(extractor, n)
        units = ULTRAVOX.audio(AudioInput(seconds=0, num_samples=n))
        assert (units.frames, units.tokens) == (sum(lens), sum(tokens))
        assert units.tokens == 1


class TestExactness:
    """Over 200+ lengths, frames and tokens equal the reproduced processor's."""

    def test_corpus_size(self) -> None:
        """At least 200 lengths, from 0 samples to over a minute."""
        assert len(LENGTHS) >= 200
        assert LENGTHS[0] == 0
        assert LENGTHS[-1] >= 16_000 * 65

    def test_matches_corpus(self, fast_extractor: WhisperFeatureExtractor) -> None:
        """Sum of chunk frames and of per-chunk tokens, for every length."""
        for n in LENGTHS:
            lens, tokens = _processor_audio(fast_extractor, n)
            units = ULTRAVOX.audio(AudioInput(seconds=0, num_samples=n))
            assert (units.frames, units.tokens) == (sum(lens), sum(tokens)), n

    @pytest.mark.parametrize("n", LONG)
    def test_matches_minutes(self, fast_extractor: WhisperFeatureExtractor, n: int) -> None:
        """Several minutes: many 30 s chunks, each rounded up on its own."""
        lens, tokens = _processor_audio(fast_extractor, n)
        units = ULTRAVOX.audio(AudioInput(seconds=0, num_samples=n))
        assert (units.frames, units.tokens) == (sum(lens), sum(tokens))

    @pytest.mark.parametrize("n", [16_000 * 35, 1_040_003])
    def test_matches_real_spectrogram(self, extractor: WhisperFeatureExtractor, n: int) -> None:
        """With the real spectrogram too."""
        lens, tokens = _processor_audio(extractor, n)
        units = ULTRAVOX.audio(AudioInput(seconds=0, num_samples=n))
        assert (units.frames, units.tokens) == (sum(lens), sum(tokens))

    def test_chunk_rounding_differs_from_whole_clip(self) -> None:
        """Rounding per chunk: 35 s is 220 tokens, not ``ceil(3500 / 16)`` = 219."""
        assert ULTRAVOX.audio(AudioInput(seconds=35.0)).tokens == 220
        assert math.ceil(3500 / 16) == 219

    def test_resampled_clip(self, fast_extractor: WhisperFeatureExtractor) -> None:
        """A 22.05 kHz clip resampled by scipy, as vLLM's scipy backend does."""
        signal = pytest.importorskip("scipy.signal")
        n, rate = 1_000_001, 22_050
        resampled = signal.resample_poly(np.zeros(n, np.float32), 320, 441)
        lens, tokens = _processor_audio(fast_extractor, len(resampled))
        counter = ULTRAVOX.with_params({"resample_method": "scipy"}).audio
        units = counter(AudioInput(seconds=n / rate, sample_rate=rate, num_samples=n))
        assert (units.frames, units.tokens) == (sum(lens), sum(tokens))


class TestProfile:
    """Registry shape, defaults and overrides."""

    def test_registry_shape(self) -> None:
        """One audio-only profile."""
        assert PROFILES == (ULTRAVOX,)
        assert ULTRAVOX.image is None
        assert ULTRAVOX.video is None
        assert ULTRAVOX.audio.ref == "ultravox.audio@1"

    def test_defaults_from_checkpoint(self) -> None:
        """Defaults equal the checkpoint's ``processor_config.json`` and extractor."""
        params = ULTRAVOX.audio.params
        assert {k: getattr(params, k) for k in PROCESSOR_CONFIG} == PROCESSOR_CONFIG
        fe = WhisperFeatureExtractor(**EXTRACTOR)
        assert (params.sampling_rate, params.hop_length) == (fe.sampling_rate, fe.hop_length)

    def test_stack_factor_override(self) -> None:
        """``stack_factor`` from ``mm_processor_kwargs``: 10 s at 4 -> ceil(1000 / 8)."""
        counter = ULTRAVOX.with_params({"stack_factor": 4, "max_pixels": 3}).audio
        assert counter(AudioInput(seconds=10.0)).tokens == 125

    def test_chunk_frames(self) -> None:
        """Chunks of 3000 frames, the remainder last, nothing empty."""
        assert ultravox_chunk_frames(6000, 3000) == [3000, 3000]
        assert ultravox_chunk_frames(6001, 3000) == [3000, 3000, 1]
        assert ultravox_chunk_frames(2, 3000) == [2]

    def test_rejects_bad_params(self) -> None:
        """Non-positive factors are refused."""
        with pytest.raises(ValueError, match="stack_factor"):
            UltravoxAudioParams(stack_factor=0)
