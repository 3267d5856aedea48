"""Qwen2-Audio and Qwen2.5-Omni profiles against the real transformers processors.

The processors run end to end: ``WhisperFeatureExtractor`` built from the
checkpoint's ``preprocessor_config.json``, and the prompt expansion of
``Qwen2AudioProcessor`` / ``Qwen2_5OmniProcessor`` with a tokenizer built
here that knows the Qwen special tokens (the count of ``<|AUDIO|>`` ids in
``input_ids`` is what vLLM's placeholder range holds). For the corpus of
200+ lengths the extractor's spectrogram is replaced by zeros of the same
shape: padding, truncation and the attention mask, which decide every
count, stay transformers' code; a handful of lengths run the real
spectrogram too.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from counting_helpers import shape_only, tiny_tokenizer
from PIL import Image
from transformers import (
    Qwen2_5OmniProcessor,
    Qwen2AudioProcessor,
    WhisperFeatureExtractor,
)
from transformers.models.qwen2_5_omni.processing_qwen2_5_omni import (
    _get_feat_extract_output_lengths,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from modtrace.counting.families.qwen import QwenVideoParams, qwen_video_units
from modtrace.counting.families.qwen_audio import (
    PROFILES,
    QWEN2_AUDIO,
    QWEN25_OMNI,
    QwenAudioParams,
    qwen_audio_output_length,
)
from modtrace.counting.profile import AudioInput, ImageInput, VideoInput

#: Qwen/Qwen2-Audio-7B-Instruct preprocessor_config.json (huggingface.co, revision b825d41).
QWEN2_AUDIO_CONFIG = {
    "chunk_length": 30,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "n_fft": 400,
    "n_samples": 480000,
    "nb_max_frames": 3000,
    "padding_side": "right",
    "padding_value": 0.0,
    "processor_class": "Qwen2AudioProcessor",
    "return_attention_mask": True,
    "sampling_rate": 16000,
}
#: Qwen/Qwen2.5-Omni-7B preprocessor_config.json (as quoted by several GitHub copies).
QWEN25_OMNI_CONFIG = {
    "chunk_length": 300,
    "dither": 0.0,
    "feature_extractor_type": "WhisperFeatureExtractor",
    "feature_size": 128,
    "hop_length": 160,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_processor_type": "Qwen2VLImageProcessor",
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "max_pixels": 12845056,
    "merge_size": 2,
    "min_pixels": 3136,
    "n_fft": 400,
    "n_samples": 4800000,
    "nb_max_frames": 30000,
    "padding_side": "right",
    "padding_value": 0.0,
    "patch_size": 14,
    "processor_class": "Qwen2_5OmniProcessor",
    "return_attention_mask": True,
    "sampling_rate": 16000,
    "temporal_patch_size": 2,
}

SPECIAL = {
    "audio_token": "<|AUDIO|>",
    "audio_bos_token": "<|audio_bos|>",
    "audio_eos_token": "<|audio_eos|>",
    "image_token": "<|IMAGE|>",
    "video_token": "<|VIDEO|>",
    "vision_bos_token": "<|vision_bos|>",
    "vision_eos_token": "<|vision_eos|>",
}
AUDIO_PROMPT = "<|audio_bos|><|AUDIO|><|audio_eos|>"


def _lengths(seed: int, top: int, extra: set[int]) -> list[int]:
    edges = {0, 1, 2, 159, 160, 161, 319, 320, 321, 322, 480, 481, 640, 16_000, 160_000}
    edges |= {479_840, 479_841, 479_999, 480_000, 480_001, 480_160, 480_161}
    edges |= {16_000 * 60, 16_000 * 180}
    return sorted(edges | extra | set(random.Random(seed).sample(range(1, top), 185)))


QWEN2_LENGTHS = _lengths(21, 1_000_000, set())
OMNI_LENGTHS = _lengths(
    22, 16_000 * 600, {4_799_840, 4_799_841, 4_800_000, 4_800_001, 16_000 * 600}
)
#: Through the whole processor (each call pads to 300 s, so fewer): edges and 24 more.
OMNI_PROCESSOR_LENGTHS = sorted(
    {0, 1, 320, 321, 322, 16_000, 480_001, 4_799_841, 4_800_000, 4_800_001, 16_000 * 600}
    | set(random.Random(23).sample(OMNI_LENGTHS, 24))
)


def _qwen2_processor(fast: bool) -> Qwen2AudioProcessor:
    extractor = WhisperFeatureExtractor.from_dict(QWEN2_AUDIO_CONFIG)
    return Qwen2AudioProcessor(
        feature_extractor=shape_only(extractor) if fast else extractor,
        tokenizer=tiny_tokenizer(SPECIAL),
    )


def _omni_processor(fast: bool) -> Qwen2_5OmniProcessor:
    """``Qwen2_5OmniProcessor`` with the checkpoint's extractor and image processor.

    Its video processor needs torchvision, which is not installed: the
    processor is assembled without one (no video is processed here), with
    the attributes its ``__init__`` would set.
    """
    extractor = WhisperFeatureExtractor.from_dict(QWEN25_OMNI_CONFIG)
    tokenizer = tiny_tokenizer(SPECIAL)
    processor = Qwen2_5OmniProcessor.__new__(Qwen2_5OmniProcessor)
    processor.feature_extractor = shape_only(extractor) if fast else extractor
    processor.image_processor = Qwen2VLImageProcessorPil.from_dict(QWEN25_OMNI_CONFIG)
    processor.video_processor = None
    processor.tokenizer = tokenizer
    processor.chat_template = None
    for name in ("image", "audio", "video"):
        setattr(processor, f"{name}_token", getattr(tokenizer, f"{name}_token"))
        setattr(processor, f"{name}_token_id", getattr(tokenizer, f"{name}_token_id"))
    for name in ("vision_bos", "vision_eos", "audio_bos", "audio_eos"):
        setattr(processor, f"{name}_token", getattr(tokenizer, f"{name}_token"))
    return processor


def _audio_oracle(processor, samples: np.ndarray) -> tuple[int, int]:
    """(``feature_attention_mask.sum()``, ``<|AUDIO|>`` ids in the expanded prompt)."""
    out = processor(text=AUDIO_PROMPT, audio=[samples], sampling_rate=16000, return_tensors="np")
    tokens = int((out["input_ids"][0] == processor.audio_token_id).sum())
    return int(out["feature_attention_mask"].sum()), tokens


def _check(profile_counter, processor, n: int) -> None:
    frames, tokens = _audio_oracle(processor, np.zeros(n, np.float32))
    item = AudioInput(seconds=0, num_samples=n)
    if tokens == 0:  # vLLM rejects a clip with no audio token
        with pytest.raises(ValueError, match="too short"):
            profile_counter(item)
        return
    got = profile_counter(item)
    assert (got.frames, got.tokens) == (frames, tokens), n


@pytest.fixture(scope="module")
def qwen2_fast() -> Qwen2AudioProcessor:
    """Qwen2-Audio processor, spectrogram stubbed."""
    return _qwen2_processor(fast=True)


@pytest.fixture(scope="module")
def omni_fast() -> Qwen2_5OmniProcessor:
    """Qwen2.5-Omni processor, spectrogram stubbed."""
    return _omni_processor(fast=True)


class TestQwen2Audio:
    """Qwen2-Audio audio counter against ``Qwen2AudioProcessor``."""

    def test_corpus_size(self) -> None:
        """The corpus has at least 200 clip lengths, from 0 samples to over a minute."""
        assert len(QWEN2_LENGTHS) >= 200
        assert QWEN2_LENGTHS[0] == 0
        assert QWEN2_LENGTHS[-1] >= 16_000 * 60

    def test_matches_processor_corpus(self, qwen2_fast: Qwen2AudioProcessor) -> None:
        """Frames and tokens equal the processor's mask sum and ``<|AUDIO|>`` count."""
        for n in QWEN2_LENGTHS:
            _check(QWEN2_AUDIO.audio, qwen2_fast, n)

    @pytest.mark.parametrize("n", [321, 16_000, 160_007, 480_000, 480_001])
    def test_matches_processor_real_spectrogram(self, n: int) -> None:
        """With the real spectrogram too."""
        _check(QWEN2_AUDIO.audio, _qwen2_processor(fast=False), n)

    def test_long_audio_is_cut_at_30_seconds(self, qwen2_fast: Qwen2AudioProcessor) -> None:
        """Five minutes give what 30 s give: 3000 frames, 750 tokens."""
        assert _audio_oracle(qwen2_fast, np.zeros(16_000 * 300, np.float32)) == (3000, 750)
        units = QWEN2_AUDIO.audio(AudioInput(seconds=300.0))
        assert (units.frames, units.tokens) == (3000, 750)

    def test_ten_seconds(self) -> None:
        """10 s -> 1000 frames -> 250 tokens (research notes' worked example)."""
        units = QWEN2_AUDIO.audio(AudioInput(seconds=10.0))
        assert (units.frames, units.tokens) == (1000, 250)

    @pytest.mark.parametrize(
        ("rate", "n"), [(44_100, 441_000), (8_000, 80_003), (48_000, 1_440_000)]
    )
    def test_resampled_clip(self, qwen2_fast: Qwen2AudioProcessor, rate: int, n: int) -> None:
        """A clip at another rate, resampled by scipy as vLLM's scipy backend does."""
        signal = pytest.importorskip("scipy.signal")
        g = math.gcd(rate, 16_000)
        resampled = signal.resample_poly(np.zeros(n, np.float32), 16_000 // g, rate // g)
        frames, tokens = _audio_oracle(qwen2_fast, resampled.astype(np.float32))
        counter = QWEN2_AUDIO.with_params({"resample_method": "scipy"}).audio
        got = counter(AudioInput(seconds=n / rate, sample_rate=rate, num_samples=n))
        assert (got.frames, got.tokens) == (frames, tokens)


class TestQwen25OmniAudio:
    """Qwen2.5-Omni audio counter against ``Qwen2_5OmniProcessor``."""

    def test_corpus_size(self) -> None:
        """The corpus has at least 200 clip lengths, up to 10 minutes."""
        assert len(OMNI_LENGTHS) >= 200
        assert OMNI_LENGTHS[-1] == 16_000 * 600

    def test_matches_processor(self, omni_fast: Qwen2_5OmniProcessor) -> None:
        """Frames and tokens equal the processor's mask sum and ``<|AUDIO|>`` count."""
        for n in OMNI_PROCESSOR_LENGTHS:
            _check(QWEN25_OMNI.audio, omni_fast, n)

    def test_matches_length_helper(self, omni_fast: Qwen2_5OmniProcessor) -> None:
        """Over the 200+ corpus: the processor's length-only ``_get_num_audio_tokens``."""
        for n in OMNI_LENGTHS:
            expected = int(omni_fast._get_num_audio_tokens(n))
            if expected == 0:
                continue
            assert QWEN25_OMNI.audio(AudioInput(seconds=0, num_samples=n)).tokens == expected

    @pytest.mark.parametrize("n", [321, 480_001])
    def test_matches_processor_real_spectrogram(self, n: int) -> None:
        """With the real (300 s) spectrogram too."""
        _check(QWEN25_OMNI.audio, _omni_processor(fast=False), n)

    def test_keeps_up_to_300_seconds(self) -> None:
        """Omni keeps 300 s (7500 tokens) where Qwen2-Audio stops at 30 s."""
        assert QWEN25_OMNI.audio(AudioInput(seconds=35.0)).tokens == 875
        assert QWEN25_OMNI.audio(AudioInput(seconds=600.0)).tokens == 7500
        assert int(_get_feat_extract_output_lengths(np.array(30000))) == 7500


class TestQwenAudioFormula:
    """The shared token formula."""

    def test_output_length_matches_transformers(self) -> None:
        """The formula equals transformers' ``_get_feat_extract_output_lengths``."""
        frames = np.arange(0, 30_001)
        expected = np.maximum(_get_feat_extract_output_lengths(frames), 0)
        assert [qwen_audio_output_length(int(f)) for f in frames] == expected.tolist()

    @pytest.mark.parametrize("n", [0, 1, 160, 320])
    def test_too_short_raises(self, n: int) -> None:
        """At most 320 samples (2 mel frames) give no token: vLLM refuses the clip."""
        for profile in PROFILES:
            with pytest.raises(ValueError, match="too short"):
                profile.audio(AudioInput(seconds=0, num_samples=n))


class TestQwen25OmniVision:
    """Qwen2.5-Omni images and videos use the Qwen2.5-VL formulas with Omni's defaults."""

    def test_image_matches_processor_prompt(self, omni_fast: Qwen2_5OmniProcessor) -> None:
        """Image tokens equal the ``<|IMAGE|>`` ids the Omni processor expands to.

        A wiring check over a few sizes (Qwen2.5-VL's corpus is in test_qwen.py):
        4000x3000 is above the class default ``max_pixels`` (1,003,520) but below
        the checkpoint's 12,845,056, so it checks that the checkpoint's is used;
        tiny and extreme ones too.
        """
        sizes = [(1920, 1080), (1080, 1920), (28, 28), (10, 10), (3, 500), (500, 3), (1, 1)]
        sizes += [(4000, 3000), (7, 1050), (1050, 7), (641, 359), (2999, 33)]
        for width, height in sizes:
            try:
                out = omni_fast(
                    text="<|vision_bos|><|IMAGE|><|vision_eos|>",
                    images=[Image.new("RGB", (width, height))],
                    return_tensors="np",
                )
            except ValueError:
                with pytest.raises(ValueError, match=r"\w"):
                    QWEN25_OMNI.image(ImageInput(width, height))
                continue
            expected = int((out["input_ids"][0] == omni_fast.image_token_id).sum())
            assert QWEN25_OMNI.image(ImageInput(width, height)).tokens == expected, (width, height)

    def test_video_defaults_are_the_processor_defaults(self) -> None:
        """Omni's per-frame pixel bounds are ``Qwen2_5OmniProcessor.videos_kwargs['size']``."""
        size = Qwen2_5OmniProcessor.videos_kwargs["size"]
        params = QWEN25_OMNI.video.params
        assert (params.min_pixels, params.max_pixels) == (
            size["shortest_edge"],
            size["longest_edge"],
        )
        assert (params.patch_size, params.merge_size, params.temporal_patch_size) == (14, 2, 2)

    def test_video_uses_qwen25_formula(self) -> None:
        """The video counter is ``qwen_video_units`` with those bounds."""
        item = VideoInput(seconds=10.0, fps=30.0, width=1280, height=720)
        params = QwenVideoParams(min_pixels=128 * 28 * 28, max_pixels=768 * 28 * 28)
        assert QWEN25_OMNI.video(item) == qwen_video_units(item, params)


class TestProfiles:
    """Registry shape, defaults and overrides."""

    def test_registry_shape(self) -> None:
        """Two profiles; Qwen2-Audio is audio only, Omni has all three counters."""
        assert [p.name for p in PROFILES] == ["qwen2-audio", "qwen2.5-omni"]
        assert QWEN2_AUDIO.image is None
        assert QWEN2_AUDIO.video is None
        assert QWEN25_OMNI.image is not None
        assert QWEN25_OMNI.video is not None
        assert QWEN2_AUDIO.audio.ref == "qwen2-audio.audio@1"
        assert QWEN25_OMNI.audio.ref == "qwen2.5-omni.audio@1"

    @pytest.mark.parametrize(
        ("profile", "config"),
        [(QWEN2_AUDIO, QWEN2_AUDIO_CONFIG), (QWEN25_OMNI, QWEN25_OMNI_CONFIG)],
    )
    def test_defaults_from_checkpoint(self, profile, config: dict) -> None:
        """Rate, hop and window equal the checkpoint's extractor."""
        extractor = WhisperFeatureExtractor.from_dict(config)
        params = profile.audio.params
        assert params.sampling_rate == extractor.sampling_rate
        assert params.hop_length == extractor.hop_length
        assert params.chunk_length * params.sampling_rate == extractor.n_samples

    def test_truncation_override(self, qwen2_fast: Qwen2AudioProcessor) -> None:
        """``truncation=False`` in ``mm_processor_kwargs`` keeps a long clip whole, as HF does."""
        n = 16_000 * 40 + 7
        out = qwen2_fast(
            text=AUDIO_PROMPT,
            audio=[np.zeros(n, np.float32)],
            sampling_rate=16000,
            truncation=False,
            return_tensors="np",
        )
        expected = int((out["input_ids"][0] == qwen2_fast.audio_token_id).sum())
        counter = QWEN2_AUDIO.with_params({"truncation": False, "fps": 2}).audio
        assert counter(AudioInput(seconds=0, num_samples=n)).tokens == expected

    def test_rejects_bad_params(self) -> None:
        """Non-positive geometry and unknown backends are refused."""
        with pytest.raises(ValueError, match="chunk_length"):
            QwenAudioParams(chunk_length=0)
        with pytest.raises(ValueError, match="resample_method"):
            QwenAudioParams(resample_method="ffmpeg")
