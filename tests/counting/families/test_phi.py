"""Phi-3.5-vision and Phi-4-multimodal counters against their reference code.

* Phi-3.5-vision ships no transformers class: its processor is remote code in
  the checkpoint. The oracle below is that code's size arithmetic, quoted
  verbatim from ``image_processing_phi3_v.py`` (``calc_padded_size``,
  ``calc_hd_transform_size``, ``calc_num_image_tokens_from_image_size``), plus
  vLLM's own expected counts.
* Phi-4-multimodal's transformers image processor and the feature extractor's
  ``__call__`` need torch, which this environment does not install: the tests
  that run them are skipped without torch (they pass where torch is present).
  Without torch the counters are checked against vLLM's worked examples and the
  feature extractor's own settings.
"""

from __future__ import annotations

import numpy as np
import pytest
from counting_helpers import image_corpus
from PIL import Image
from pydantic import ValidationError
from transformers.models.phi4_multimodal.feature_extraction_phi4_multimodal import (
    Phi4MultimodalFeatureExtractor,
)

from modtrace.counting.families.audio_common import samples_at_rate
from modtrace.counting.families.phi import (
    PHI4_MULTIMODAL,
    PHI35_VISION,
    PROFILES,
    Phi3VImageParams,
    Phi4AudioParams,
)
from modtrace.counting.profile import AudioInput, ImageInput


# --- Reference: microsoft/Phi-3.5-vision-instruct image_processing_phi3_v.py ------
# Quoted verbatim (whitespace aside) from the checkpoint's remote code; the
# runtime check in `calc_num_image_tokens_from_image_size` is the one vLLM calls.
def calc_padded_size(width, height, padding_unit=336):
    target_height = int(np.ceil(height / padding_unit) * padding_unit)
    top_padding = int((target_height - height) / 2)
    bottom_padding = target_height - height - top_padding
    left_padding = 0
    right_padding = 0
    padded_width = width + left_padding + right_padding
    padded_height = height + top_padding + bottom_padding
    return padded_width, padded_height


def calc_hd_transform_size(width, height, hd_num=16):
    transposed = False
    if width < height:
        width, height = height, width
        transposed = True

    ratio = width / height
    scale = 1
    while scale * np.ceil(scale / ratio) <= hd_num:
        scale += 1
    scale -= 1

    new_width = int(scale * 336)
    new_height = int(new_width / ratio)

    padded_width, padded_height = calc_padded_size(new_width, new_height)

    if transposed:
        padded_width, padded_height = padded_height, padded_width

    return padded_width, padded_height


def calc_num_image_tokens_from_image_size(width, height, num_crops):
    new_width, new_height = calc_hd_transform_size(width, height, hd_num=num_crops)
    return int((new_height // 336 * new_width // 336 + 1) * 144 + 1 + (new_height // 336 + 1) * 12)


# -------------------------------------------------------------------------------------


#: Sizes checked first: extremes and this family's tile and patch edges.
FIXED_SIZES = [
    (1, 1), (1, 2), (2, 1), (3, 500), (500, 3), (1, 150), (150, 1), (10, 10), (13, 17),
    (335, 336), (336, 336), (337, 337), (672, 672), (1344, 1008), (1008, 1344), (448, 448),
    (449, 448), (896, 448), (1344, 896), (3136, 3136), (640, 480), (1024, 768), (768, 1024),
    (1920, 1080), (1080, 1920), (4032, 3024), (1000, 3), (3, 1000), (1300, 876),
    (20000, 20000), (20000, 133), (133, 20000), (1, 1344), (1344, 1), (1, 1345), (1345, 1),
]  # fmt: skip

IMAGES = image_corpus(FIXED_SIZES, n=240, seed=17, limit=5000)


class TestPhi35Vision:
    """Phi-3.5-vision: HD transform into 336-px crops."""

    @pytest.mark.parametrize("num_crops", [4, 16, 1, 9])
    def test_corpus_matches_reference(self, num_crops):
        """Tokens and crops equal the checkpoint's arithmetic over 200+ sizes."""
        counter = PHI35_VISION.with_params({"num_crops": num_crops}).image
        checked = 0
        for width, height in IMAGES:
            hd_w, hd_h = calc_hd_transform_size(width, height, hd_num=num_crops)
            if hd_w == 0 or hd_h == 0:
                # The processor's resize to a 0-px side fails; the counter refuses too.
                with pytest.raises(ValueError, match="scales to 0 px"):
                    counter(ImageInput(width, height))
                continue
            units = counter(ImageInput(width, height))
            expected = calc_num_image_tokens_from_image_size(width, height, num_crops)
            assert units.tokens == expected, (width, height, num_crops)
            assert units.tiles == (hd_w // 336) * (hd_h // 336) + 1
            checked += 1
        assert checked >= 200

    @pytest.mark.parametrize(("num_crops", "tokens"), [(4, 757), (16, 1921)])
    def test_vllm_expected_counts(self, num_crops, tokens):
        """vLLM's test expects 757 (num_crops 4, the default) and 1921 (16) for its asset."""
        counter = PHI35_VISION.with_params({"num_crops": num_crops}).image
        assert counter(ImageInput(1024, 768)).tokens == tokens
        assert PHI35_VISION.image.params.num_crops == 4

    def test_rejects_bad_num_crops(self):
        """num_crops must be positive."""
        with pytest.raises(ValidationError):
            Phi3VImageParams(num_crops=0)


class TestPhi4Image:
    """Phi-4-multimodal: dynamic HD with 448-px crops."""

    @pytest.mark.parametrize(("dynamic_hd", "tokens"), [(4, 1329), (16, 4433), (36, 9585)])
    def test_vllm_expected_counts(self, dynamic_hd, tokens):
        """vLLM's test: a 3136×3136 image gives 1329 / 4433 / 9585 (36 is the default)."""
        counter = PHI4_MULTIMODAL.with_params({"dynamic_hd": dynamic_hd}).image
        assert counter(ImageInput(3136, 3136)).tokens == tokens
        assert PHI4_MULTIMODAL.image.params.dynamic_hd == 36

    def test_vllm_shape_comment(self):
        """vLLM's encoder comment: 7 crops for an 896×1344 (h×w) image → 1841 embeddings."""
        units = PHI4_MULTIMODAL.image(ImageInput(1344, 896))
        assert (units.tokens, units.tiles) == (1841, 7)

    def test_padding_only_features_excluded(self):
        """A 448×300 image pads 148 px: 10 feature rows are padding and dropped."""
        # 448/14 = 32 columns; 300 rows scale to 300 px → (448-300)//14 = 10 padding rows,
        # 22 feature rows → 11 compressed rows: 16·11 + 11 + 1 + 256 + 16.
        assert PHI4_MULTIMODAL.image(ImageInput(448, 300)).tokens == 16 * 11 + 11 + 1 + 256 + 16

    def test_extreme_aspect_refused(self):
        """An image that resizes under 10 px on a side is refused, like the processor does."""
        with pytest.raises(ValueError, match="too extreme"):
            PHI4_MULTIMODAL.image(ImageInput(3, 500))

    def test_matches_transformers_processor_with_torch(self):
        """With torch installed: tokens and crops equal the real image processor's."""
        pytest.importorskip("torch")
        pytest.importorskip("torchvision")
        from transformers.models.phi4_multimodal.image_processing_phi4_multimodal import (
            Phi4MultimodalImageProcessor,
        )

        processor = Phi4MultimodalImageProcessor()
        for width, height in IMAGES[:120]:
            if max(width, height) > 6000:
                continue
            try:
                out = processor(Image.new("RGB", (width, height)))
            except ValueError:
                with pytest.raises(ValueError, match="too extreme"):
                    PHI4_MULTIMODAL.image(ImageInput(width, height))
                continue
            units = PHI4_MULTIMODAL.image(ImageInput(width, height))
            expected = (out["num_img_tokens"][0], out["image_pixel_values"].shape[1])
            assert (units.tokens, units.tiles) == expected, (width, height)


class TestPhi4Audio:
    """Phi-4-multimodal audio: 10 ms frames, 8× compression."""

    def test_params_match_feature_extractor(self):
        """The counter's settings are the feature extractor's defaults."""
        fe = Phi4MultimodalFeatureExtractor()
        p = Phi4AudioParams()
        assert (p.sampling_rate, p.win_length, p.hop_length) == (
            fe.sampling_rate,
            fe.win_length,
            fe.hop_length,
        )
        assert (p.audio_compression_rate, p.audio_downsample_rate) == (
            fe.audio_compression_rate,
            fe.audio_downsample_rate,
        )

    @pytest.mark.parametrize(
        ("samples", "frames", "tokens"),
        [(160_000, 998, 125), (400, 1, 1), (559, 1, 1), (560, 2, 1), (1_520, 8, 1), (1_680, 9, 2)],
    )
    def test_frames_and_tokens(self, samples, frames, tokens):
        """frames = (N − 400) // 160 + 1, tokens = ceil(frames / 8); 10 s → 125 (research §8)."""
        units = PHI4_MULTIMODAL.audio(AudioInput(samples / 16000, 16000, samples))
        assert (units.frames, units.tokens) == (frames, tokens)

    def test_too_short_refused(self):
        """Under 400 samples (25 ms) vLLM rejects the clip; so does the counter."""
        with pytest.raises(ValueError, match="too short"):
            PHI4_MULTIMODAL.audio(AudioInput(0.02, 16000, 320))

    def test_resampled_clip_counts(self):
        """A 10 s 44.1 kHz clip is counted at its 16 kHz length from vLLM's scipy backend."""
        item = AudioInput(10.0, 44_100, 441_000)
        assert Phi4AudioParams().resample_method == "scipy"
        resampled = samples_at_rate(item, 16_000, "scipy")
        assert resampled == 160_000  # resample_poly(x, 160, 441): ceil(441000 × 160 / 441)
        units = PHI4_MULTIMODAL.audio(item)
        assert (units.frames, units.tokens) == ((resampled - 400) // 160 + 1, 125)

    def test_matches_feature_extractor_with_torch(self):
        """With torch installed: frames and embed sizes equal the real feature extractor's."""
        pytest.importorskip("torch")
        fe = Phi4MultimodalFeatureExtractor()
        for n in [400, 401, 559, 560, 16_000, 160_000, 480_000, 1_000_000, 12_345]:
            out = fe([np.zeros(n, dtype=np.float32)], sampling_rate=16_000)
            units = PHI4_MULTIMODAL.audio(AudioInput(n / 16_000, 16_000, n))
            expected = (out["audio_input_features"].shape[1], int(out["audio_embed_sizes"][0]))
            assert (units.frames, units.tokens) == expected, n


def test_profiles_export():
    """The module exports both Phi profiles."""
    assert [p.name for p in PROFILES] == ["phi-3.5-vision", "phi-4-multimodal"]
    assert PHI4_MULTIMODAL.audio.ref == "phi-4-multimodal.audio@1"
