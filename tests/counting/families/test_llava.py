"""LLaVA-1.5 and LLaVA-NeXT counters against the real transformers processors.

The oracle is the full processor (Pil image processor + ``LlavaProcessor`` /
``LlavaNextProcessor`` prompt expansion) configured like the llava-hf
checkpoints, around a tiny in-test tokenizer whose only real token is
``<image>``: the number of ``<image>`` ids in ``input_ids`` is the count vLLM
places, and the image processor's patch count gives the tiles.
"""

from __future__ import annotations

import pytest
from counting_helpers import image_corpus, tiny_tokenizer
from PIL import Image
from pydantic import ValidationError
from transformers.image_processing_utils import select_best_resolution as hf_select
from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
from transformers.models.llava.processing_llava import LlavaProcessor
from transformers.models.llava_next.image_processing_pil_llava_next import (
    LlavaNextImageProcessorPil,
)
from transformers.models.llava_next.processing_llava_next import LlavaNextProcessor

from modtrace.counting.families.llava import (
    LLAVA15,
    LLAVA_NEXT,
    LLAVA_NEXT_PINPOINTS,
    PROFILES,
    LlavaNextImageParams,
    select_best_resolution,
)
from modtrace.counting.profile import ImageInput

#: The tokenizer's only known token, and its id.
SPECIALS = {"image_token": "<image>"}
IMAGE_TOKEN_ID = 1


#: Sizes checked first: extremes and this family's tile and patch edges.
FIXED_SIZES = [
    (1, 1), (1, 2), (2, 1), (3, 500), (500, 3), (1, 150), (150, 1), (10, 10), (13, 17),
    (335, 336), (336, 335), (336, 336), (337, 337), (672, 336), (336, 672), (672, 672),
    (1008, 336), (336, 1008), (640, 480), (480, 640), (800, 600), (1023, 767), (1024, 768),
    (768, 1024), (1280, 720), (720, 1280), (1920, 1080), (1080, 1920), (1600, 16),
    (16, 1600), (1000, 3), (3, 1000), (1, 1500), (1500, 1), (899, 1024), (1024, 899),
]  # fmt: skip

IMAGES = image_corpus(FIXED_SIZES, n=200, seed=11, limit=1200)


@pytest.fixture(scope="module")
def next_processor() -> LlavaNextProcessor:
    """LlavaNextProcessor as in llava-hf/llava-v1.6-mistral-7b-hf (336 px, 14 px patches)."""
    image_processor = LlavaNextImageProcessorPil(
        size={"shortest_edge": 336},
        crop_size={"height": 336, "width": 336},
        image_grid_pinpoints=[list(p) for p in LLAVA_NEXT_PINPOINTS],
    )
    return LlavaNextProcessor(
        image_processor=image_processor,
        tokenizer=tiny_tokenizer(SPECIALS),
        patch_size=14,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,
    )


class TestLlava15:
    """LLaVA-1.5: a fixed 576 tokens."""

    def test_corpus_matches_processor(self):
        """Every size expands to the processor's count (576) with the checkpoint config."""
        processor = LlavaProcessor(
            image_processor=CLIPImageProcessorPil(
                size={"shortest_edge": 336}, crop_size={"height": 336, "width": 336}
            ),
            tokenizer=tiny_tokenizer(SPECIALS),
            patch_size=14,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
        )
        # Extreme aspect ratios are left out: CLIP resizes the short side to 336, so a
        # 1×1500 image would become 336×504000 pixels; they are checked in test_huge_image.
        sizes = [(w, h) for w, h in IMAGES if max(w, h) <= 20 * min(w, h)]
        for width, height in sizes[::3]:
            out = processor(text=["<image>"], images=[Image.new("RGB", (width, height))])
            expected = out["input_ids"][0].count(IMAGE_TOKEN_ID)
            assert LLAVA15.image(ImageInput(width, height)).tokens == expected == 576

    def test_full_strategy_keeps_cls(self):
        """The "full" feature strategy keeps the CLS token: 577."""
        counter = LLAVA15.with_params({"vision_feature_select_strategy": "full"}).image
        assert counter(ImageInput(640, 480)).tokens == 577

    def test_huge_and_extreme_images(self):
        """Huge and extreme images are resized like any other: 576."""
        for size in [(20000, 20000), (1, 150), (150, 1), (3, 500), (1, 20000)]:
            assert LLAVA15.image(ImageInput(*size)).tokens == 576


class TestLlavaNext:
    """LLaVA-NeXT anyres."""

    def test_corpus_matches_processor(self, next_processor):
        """Tokens and tiles equal the full processor's on every third corpus image."""
        for width, height in IMAGES[::3]:
            out = next_processor(text=["<image>"], images=[Image.new("RGB", (width, height))])
            expected_tokens = out["input_ids"][0].count(IMAGE_TOKEN_ID)
            expected_tiles = len(out["pixel_values"][0])
            units = LLAVA_NEXT.image(ImageInput(width, height))
            assert (units.tokens, units.tiles) == (expected_tokens, expected_tiles), (width, height)

    def test_corpus_matches_feature_arithmetic(self, next_processor):
        """Over all 200+ sizes, tokens equal the processor's own feature arithmetic.

        The full pipeline (pixels included) is too slow for every size; this runs
        ``LlavaNextProcessor._get_number_of_features`` and ``select_best_resolution``,
        the code the pipeline itself calls.
        """
        for width, height in IMAGES:
            expected = next_processor._get_number_of_features(height, width, 336, 336) - 1
            rows, cols = (x // 336 for x in hf_select((height, width), LLAVA_NEXT_PINPOINTS))
            units = LLAVA_NEXT.image(ImageInput(width, height))
            assert (units.tokens, units.tiles) == (expected, rows * cols + 1), (width, height)

    def test_huge_sizes_match_feature_count(self, next_processor):
        """Huge sizes match the processor's own feature arithmetic (no pixels made)."""
        for width, height in [(20000, 20000), (20000, 1), (1, 20000), (4032, 3024), (7, 9999)]:
            expected = next_processor._get_number_of_features(height, width, 336, 336) - 1
            rows, cols = (x // 336 for x in hf_select((height, width), LLAVA_NEXT_PINPOINTS))
            units = LLAVA_NEXT.image(ImageInput(width, height))
            assert (units.tokens, units.tiles) == (expected, rows * cols + 1), (width, height)

    def test_select_best_resolution_matches_transformers(self):
        """The pinpoint choice equals transformers' for every corpus size."""
        for width, height in [*IMAGES, (1, 20000), (20000, 1)]:
            ours = select_best_resolution(height, width, LLAVA_NEXT_PINPOINTS)
            assert ours == tuple(hf_select((height, width), LLAVA_NEXT_PINPOINTS))

    def test_custom_pinpoints_match_processor(self):
        """A request overriding the pinpoints is counted like the processor does."""
        pinpoints = [[336, 336], [672, 1344], [1344, 672]]
        processor = LlavaNextProcessor(
            image_processor=LlavaNextImageProcessorPil(
                size={"shortest_edge": 336},
                crop_size={"height": 336, "width": 336},
                image_grid_pinpoints=pinpoints,
            ),
            tokenizer=tiny_tokenizer(SPECIALS),
            patch_size=14,
            vision_feature_select_strategy="default",
            num_additional_image_tokens=1,
        )
        counter = LLAVA_NEXT.with_params({"image_grid_pinpoints": pinpoints}).image
        for width, height in IMAGES[::10]:
            out = processor(text=["<image>"], images=[Image.new("RGB", (width, height))])
            units = counter(ImageInput(width, height))
            assert units.tokens == out["input_ids"][0].count(IMAGE_TOKEN_ID), (width, height)
            assert units.tiles == len(out["pixel_values"][0])

    def test_worked_example(self):
        """1024×768 → 672×672 grid → 48×36 + 36 + 576 = 2340 (research §4)."""
        assert LLAVA_NEXT.image(ImageInput(1024, 768)).tokens == 2340

    def test_rejects_bad_pinpoints(self):
        """Pinpoints that are not multiples of the tile size are refused."""
        with pytest.raises(ValidationError, match="not a multiple"):
            LlavaNextImageParams(image_grid_pinpoints=((300, 600),))
        with pytest.raises(ValidationError, match="must not be empty"):
            LlavaNextImageParams(image_grid_pinpoints=())

    @pytest.mark.parametrize("bad", [(0, 10), (10, -3), (1.5, 2)])
    def test_rejects_bad_sizes(self, bad):
        """Non-positive or non-integer sizes raise ValueError."""
        with pytest.raises(ValueError, match="must be a positive integer"):
            LLAVA_NEXT.image(ImageInput(*bad))


def test_profiles_export():
    """The module exports both profiles."""
    assert [p.name for p in PROFILES] == ["llava-1.5", "llava-next"]
    assert [p.image.ref for p in PROFILES] == ["llava-1.5.image@1", "llava-next.image@1"]
