"""InternVL counter against transformers' InternVL / GOT-OCR2 processing (Pil, no torch).

Transformers' InternVL (the ``-hf`` checkpoints) tiles with
``GotOcr2ImageProcessor.crop_to_patches``, the same rule as InternVL's own
``dynamic_preprocess`` that vLLM copies. The oracle counts tiles from the real
image processor and builds the prompt text with the real
``InternVLProcessor.replace_image_token`` / ``replace_video_token`` (the
processor object itself needs torch for its video processor, so those
methods run on a stand-in ``self`` holding the processor's defaults).
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from counting_helpers import image_corpus
from PIL import Image
from pydantic import ValidationError
from transformers.models.got_ocr2.image_processing_pil_got_ocr2 import (
    GotOcr2ImageProcessorPil,
    get_optimal_tiled_canvas,
)
from transformers.models.internvl.processing_internvl import InternVLProcessor

from modtrace.counting.families.internvl import (
    INTERNVL,
    PROFILES,
    InternVLImageParams,
    InternVLVideoParams,
    internvl_target_ratios,
)
from modtrace.counting.families.tiling import closest_aspect_ratio
from modtrace.counting.profile import ImageInput, VideoInput

MARKERS = ["<img>", "</img>", "<IMG_CONTEXT>"]


#: Sizes checked first: extremes and this family's tile and patch edges.
FIXED_SIZES = [
    (1, 1), (1, 2), (2, 1), (3, 500), (500, 3), (1, 150), (150, 1), (10, 10), (13, 17),
    (447, 448), (448, 448), (449, 449), (896, 448), (448, 896), (896, 896), (1344, 896),
    (640, 480), (480, 640), (800, 600), (1024, 768), (768, 1024), (1280, 720), (720, 1280),
    (1920, 1080), (1080, 1920), (4032, 3024), (3024, 4032), (1000, 3), (3, 1000),
    (1250, 1000), (1000, 1250), (2000, 1000), (1000, 2000), (1500, 1000), (300, 200),
]  # fmt: skip

IMAGES = image_corpus(FIXED_SIZES, n=200, seed=5, limit=4000)
HUGE = [(20000, 20000), (20000, 1), (1, 20000), (20000, 133), (30000, 10000)]


@pytest.fixture(scope="module")
def stand_in() -> SimpleNamespace:
    """``self`` for the processor's replacement methods, with its own defaults."""
    seq = inspect.signature(InternVLProcessor.__init__).parameters["image_seq_length"].default
    return SimpleNamespace(
        start_image_token="<img>",
        end_image_token="</img>",
        image_token="<IMG_CONTEXT>",
        image_seq_length=seq,
    )


def _hf_patches(processor: GotOcr2ImageProcessorPil, width: int, height: int, **kw) -> int:
    return processor.get_number_of_image_patches(height, width, {"crop_to_patches": True, **kw})


@pytest.fixture(scope="module")
def image_processor() -> GotOcr2ImageProcessorPil:
    """The GOT-OCR2 tiling processor at InternVL's 448 px, 1..12 tiles."""
    return GotOcr2ImageProcessorPil(
        size={"height": 448, "width": 448}, crop_to_patches=True, min_patches=1, max_patches=12
    )


class TestImage:
    """InternVL images: dynamic tiling + thumbnail, 256 tokens per tile."""

    def test_corpus_matches_tile_helper_and_prompt(self, image_processor, stand_in):
        """Tiles and tokens match the processor's helper and replacement text, 200+ sizes."""
        for width, height in IMAGES:
            patches = _hf_patches(image_processor, width, height)
            repl = InternVLProcessor.replace_image_token(stand_in, {"num_patches": [patches]}, 0)
            expected = sum(repl.count(tok) for tok in MARKERS)
            units = INTERNVL.image(ImageInput(width, height))
            assert (units.tokens, units.tiles) == (expected, patches), (width, height)

    def test_pixels_match_helper(self, image_processor):
        """On a sample, the pixel pipeline's patch count equals the helper's."""
        for width, height in IMAGES[::8]:
            out = image_processor(Image.new("RGB", (width, height)))
            assert out["num_patches"][0] == INTERNVL.image(ImageInput(width, height)).tiles

    def test_huge_sizes(self, image_processor):
        """Huge and extreme sizes match the tiling helper."""
        for width, height in HUGE:
            assert INTERNVL.image(ImageInput(width, height)).tiles == _hf_patches(
                image_processor, width, height
            )

    @pytest.mark.parametrize(("low", "high"), [(1, 6), (2, 12), (1, 24), (4, 4)])
    def test_other_limits_match_helper(self, image_processor, low, high):
        """Request overrides of min/max_dynamic_patch match the processor's min/max_patches."""
        counter = INTERNVL.with_params({"min_dynamic_patch": low, "max_dynamic_patch": high}).image
        for width, height in IMAGES[::4]:
            expected = _hf_patches(
                image_processor, width, height, min_patches=low, max_patches=high
            )
            assert counter(ImageInput(width, height)).tiles == expected, (width, height, low)

    def test_ratio_choice_matches_transformers(self):
        """vLLM's grid order gives the same choice as transformers' canvas search."""
        ratios = internvl_target_ratios(1, 12)
        for width, height in [*IMAGES, *HUGE]:
            ours = closest_aspect_ratio(width, height, ratios, 448)
            assert ours == get_optimal_tiled_canvas((height, width), (448, 448), 1, 12)

    def test_dynamic_off_is_one_tile(self):
        """With dynamic_image_size off every image is one 448-px tile: 258 tokens."""
        counter = INTERNVL.with_params({"dynamic_image_size": False}).image
        assert counter(ImageInput(4032, 3024)).tokens == 256 + 2
        assert counter(ImageInput(4032, 3024)).tiles == 1

    def test_worked_example(self):
        """1024×768 → 4×3 grid + thumbnail = 13 tiles → 3328 + 2 (research §5)."""
        units = INTERNVL.image(ImageInput(1024, 768))
        assert (units.tiles, units.tokens) == (13, 3330)

    def test_rejects_inverted_limits(self):
        """min_dynamic_patch above max_dynamic_patch is refused."""
        with pytest.raises(ValidationError, match="must not exceed"):
            InternVLImageParams(min_dynamic_patch=8, max_dynamic_patch=4)

    @pytest.mark.parametrize("bad", [(0, 1), (1, 0), (-4, 4), (3.0, 3)])
    def test_rejects_bad_sizes(self, bad):
        """Non-positive or non-integer sizes raise ValueError."""
        with pytest.raises(ValueError, match="must be a positive integer"):
            INTERNVL.image(ImageInput(*bad))


class TestVideo:
    """InternVL video: one 448-px tile per sampled frame."""

    def test_frame_tokens_match_replacement(self, stand_in):
        """Markers and context tokens equal the processor's video replacement text."""
        pixel_values = SimpleNamespace(shape=(7, 3, 448, 448))
        repl = InternVLProcessor.replace_video_token(
            stand_in, {"pixel_values_videos": [pixel_values]}, 0
        )
        units = INTERNVL.video(VideoInput(seconds=7.0, fps=1.0, width=640, height=360))
        special = sum(repl.count(tok) for tok in MARKERS)
        assert units.frames == 7
        assert units.tokens == special + 7 * 4  # 4 prefix tokens per one-digit "FrameN: "

    @pytest.mark.parametrize(
        ("seconds", "fps", "frames", "tokens"),
        [
            (10.0, 30.0, 32, 32 * 262 + 23),
            (2.0, 2.0, 4, 4 * 262),
            (0.5, 2.0, 1, 262),
        ],
    )
    def test_frames_and_prefix_digits(self, seconds, fps, frames, tokens):
        """Frames are min(32, round(s × fps)); two-digit frame numbers add a token each."""
        units = INTERNVL.video(VideoInput(seconds=seconds, fps=fps, width=1280, height=720))
        assert (units.frames, units.tokens) == (frames, tokens)

    def test_loader_settings(self):
        """num_frames=-1 keeps every frame; a loader fps caps them; a 0-s clip has one frame."""
        item = VideoInput(seconds=4.0, fps=10.0, width=640, height=360)
        assert INTERNVL.with_params({"num_frames": -1}).video(item).frames == 40
        assert INTERNVL.with_params({"loader_fps": 2.0}).video(item).frames == 8
        assert INTERNVL.video(VideoInput(seconds=0.0, fps=24.0, width=64, height=64)).frames == 1

    def test_rejects_bad_video_and_params(self):
        """A negative duration and num_frames=0 are refused."""
        with pytest.raises(ValueError, match="video seconds"):
            INTERNVL.video(VideoInput(seconds=-1.0, fps=24.0, width=640, height=360))
        with pytest.raises(ValidationError, match="num_frames"):
            InternVLVideoParams(num_frames=0)


def test_profiles_export():
    """The module exports one profile with image and video counters."""
    assert [p.name for p in PROFILES] == ["internvl"]
    assert (INTERNVL.image.ref, INTERNVL.video.ref) == ("internvl.image@1", "internvl.video@1")
