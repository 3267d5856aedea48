"""Pixtral counters against transformers' Pixtral image processor and mistral_common.

``pixtral-hf`` (floor) is checked against the real ``PixtralImageProcessorPil``:
the resized pixel array gives ``rows = H/16`` and ``cols = W/16``, and the
prompt is ``rows × (cols + 1)`` tokens as ``PixtralProcessor.replace_image_token``
builds it (that class needs torchvision, so it is not imported here).

``pixtral`` (round, as vLLM serves ``mistralai/Pixtral-12B-2409`` with the
mistral tokenizer) is equal to it wherever no downscale happens; where the two
roundings differ it is checked against worked examples produced by
mistral_common 1.13.1's ``ImageEncoder._image_to_num_tokens``, and against
mistral_common itself when that package is installed.
"""

from __future__ import annotations

import math

import pytest
from counting_helpers import image_corpus
from PIL import Image
from transformers.models.pixtral.image_processing_pil_pixtral import (
    PixtralImageProcessorPil,
    get_resize_output_image_size,
)

from modtrace.counting.families.pixtral import PIXTRAL, PIXTRAL_HF, PROFILES, PixtralImageParams
from modtrace.counting.profile import ImageInput

#: Sizes checked first: extremes and this family's tile and patch edges.
FIXED_SIZES = [
    (1, 1), (1, 2), (2, 1), (3, 500), (500, 3), (1, 150), (150, 1), (10, 10), (13, 17),
    (15, 15), (16, 16), (17, 17), (1023, 1023), (1024, 1024), (1025, 1025), (1024, 768),
    (768, 1024), (1920, 1080), (1080, 1920), (640, 480), (1280, 720), (2048, 1536),
    (1025, 17), (1025, 33), (1060, 100), (1130, 513), (1025, 2047), (1000, 3), (3, 1000),
    (1024, 1), (1, 1024), (2900, 3), (3, 2900), (2049, 1537), (3000, 1999), (1500, 1001),
]  # fmt: skip

IMAGES = image_corpus(FIXED_SIZES, n=210, seed=13, limit=3000)
HUGE = [(20000, 20000), (20000, 133), (133, 20000), (4032, 3024), (30000, 31)]


def _floors_to_zero(width: int, height: int) -> bool:
    ratio = max(width / 1024, height / 1024)
    return ratio > 1 and (math.floor(width / ratio) == 0 or math.floor(height / ratio) == 0)


def _hf_tokens(rows: int, cols: int) -> int:
    # PixtralProcessor.replace_image_token: ([IMG]*cols + [IMG_BREAK]) * rows, last -> [IMG_END].
    return rows * (cols + 1)


class TestPixtralHF:
    """The transformers port: floor rounding."""

    def test_corpus_matches_image_processor(self):
        """Tokens equal the processor's resized grid for 200+ generated images."""
        processor = PixtralImageProcessorPil()
        checked = 0
        for width, height in IMAGES:
            if _floors_to_zero(width, height):
                continue
            pixels = processor(Image.new("RGB", (width, height)))["pixel_values"][0]
            rows, cols = pixels.shape[-2] // 16, pixels.shape[-1] // 16
            assert PIXTRAL_HF.image(ImageInput(width, height)).tokens == _hf_tokens(rows, cols)
            checked += 1
        assert checked >= 200

    def test_zero_side_raises_like_processor(self):
        """Where a side floors to 0 px, both the processor and the counter refuse."""
        processor = PixtralImageProcessorPil()
        for width, height in [(1025, 1), (1, 3000), (2900, 2)]:
            with pytest.raises(ValueError, match="Size must contain"):
                processor(Image.new("RGB", (width, height)))
            with pytest.raises(ValueError, match="scales to 0 px"):
                PIXTRAL_HF.image(ImageInput(width, height))

    def test_huge_sizes_match_size_helper(self):
        """Huge sizes match the processor's own resize helper (no pixels made)."""
        for width, height in HUGE:
            h, w = get_resize_output_image_size(
                _SizedArray((height, width)), size=(1024, 1024), patch_size=(16, 16)
            )
            expected = _hf_tokens(h // 16, w // 16)
            assert PIXTRAL_HF.image(ImageInput(width, height)).tokens == expected


class _SizedArray:
    """A stand-in image array exposing only a channels-first shape."""

    def __init__(self, size: tuple[int, int]) -> None:
        self.shape = (3, *size)
        self.ndim = 3


class TestPixtral:
    """The mistral_common path (vLLM's default for Pixtral-12B-2409)."""

    def test_equal_to_hf_without_downscale(self):
        """Images whose long side is at most 1024 px count the same in both paths."""
        for width, height in IMAGES:
            if max(width, height) <= 1024:
                item = ImageInput(width, height)
                assert PIXTRAL.image(item) == PIXTRAL_HF.image(item)

    @pytest.mark.parametrize(
        ("size", "tokens"),
        [
            # (rows, cols) from mistral_common 1.13.1 ImageEncoder._image_to_num_tokens:
            ((1024, 768), 48 * 65),  # (48, 64)
            ((1920, 1080), 36 * 65),  # (36, 64)
            ((1025, 17), 2 * 65),  # (2, 64); floor gives 1 row
            ((1025, 33), 3 * 65),  # (3, 64); floor gives 2 rows
            ((1060, 100), 7 * 65),  # (7, 64); floor gives 6 rows
            ((1130, 513), 30 * 65),  # (30, 64); floor gives 29 rows
            ((1025, 2047), 64 * 34),  # (64, 33); floor gives 32 columns
            ((1, 3000), 64 * 2),  # (64, 1): the 0-px side is kept at 1 px
            ((20000, 20000), 64 * 65),  # (64, 64)
            ((20000, 133), 1 * 65),  # (1, 64)
        ],
    )
    def test_worked_examples_from_mistral_common(self, size, tokens):
        """Sizes where the roundings matter give mistral_common's grid."""
        assert PIXTRAL.image(ImageInput(*size)).tokens == tokens

    def test_matches_mistral_common_when_installed(self):
        """Over the corpus, tokens equal mistral_common's own encoder (skipped if absent)."""
        image = pytest.importorskip("mistral_common.tokens.tokenizers.image")
        encoder = image.ImageEncoder(
            image.ImageConfig(image_patch_size=16, max_image_size=1024),
            image.SpecialImageIDs(img=10, img_break=12, img_end=13),
        )
        for width, height in [*IMAGES, *HUGE]:
            cols, rows = encoder._image_to_num_tokens(Image.new("RGB", (width, height)))
            assert PIXTRAL.image(ImageInput(width, height)).tokens == rows * (cols + 1)

    def test_patch_size_dict_and_merge(self):
        """The HF dict form of patch_size is accepted; a 2×2 merge halves the grid."""
        params = PixtralImageParams(patch_size={"height": 14, "width": 14}, spatial_merge_size=2)
        assert params.patch_size == 14
        merged = PIXTRAL.with_params({"patch_size": 14, "spatial_merge_size": 2}).image
        assert merged(ImageInput(1024, 768)).tokens == 28 * (37 + 1)

    @pytest.mark.parametrize("bad", [(0, 4), (4, 0), (-2, 2), (2, 2.5)])
    def test_rejects_bad_sizes(self, bad):
        """Non-positive or non-integer sizes raise ValueError."""
        with pytest.raises(ValueError, match="must be a positive integer"):
            PIXTRAL.image(ImageInput(*bad))


def test_profiles_export():
    """The module exports both Pixtral profiles."""
    assert [p.name for p in PROFILES] == ["pixtral", "pixtral-hf"]
