"""Hosted APIs (OpenAI, Claude, Gemini): the providers' documented worked examples.

No reference code runs here; each expected number is quoted from the
provider's documentation (or a verbatim copy of it), with its source.
"""

from __future__ import annotations

import pytest

from modtrace.counting.families.hosted import (
    CLAUDE,
    GEMINI,
    OPENAI,
    OPENAI_MODEL_PARAMS,
    PROFILES,
    ClaudeImageParams,
    OpenAIImageParams,
    claude_native_size,
    openai_params_for,
    openai_patch_count,
)
from modtrace.counting.profile import AudioInput, ImageInput, VideoInput

# --- OpenAI ------------------------------------------------------------------
# platform.openai.com/docs/guides/vision "Calculating costs" (verbatim copy at
# v2ex.com/amp/t/1044688): "All images with detail: low cost 85 tokens each.
# detail: high images are first scaled to fit within a 2048 x 2048 square ...
# Then, they are scaled such that the shortest side of the image is 768px long.
# Finally, we count how many 512px squares the image consists of. Each of those
# squares costs 170 tokens. Another 85 tokens are always added to the final total."


class TestOpenAITiles:
    def test_1024_square_high_is_765(self) -> None:
        """Guide: "A 1024 x 1024 square image in detail: high mode costs 765 tokens"."""
        units = OPENAI.image(ImageInput(1024, 1024, detail="high"))
        assert (units.tokens, units.tiles) == (765, 4)

    def test_2048_by_4096_high_is_1105(self) -> None:
        """Guide: "A 2048 x 4096 image in detail: high mode costs 1105 tokens"."""
        units = OPENAI.image(ImageInput(2048, 4096, detail="high"))
        assert (units.tokens, units.tiles) == (1105, 6)

    def test_low_detail_is_85_whatever_the_size(self) -> None:
        """Guide: "A 4096 x 8192 image in detail: low most costs 85 tokens"."""
        units = OPENAI.image(ImageInput(4096, 8192, detail="low"))
        assert (units.tokens, units.tiles) == (85, 0)

    def test_auto_resolves_to_high_by_default(self) -> None:
        """``auto`` (and a missing detail) costs as ``high`` unless configured."""
        high = OPENAI.image(ImageInput(1024, 1024, detail="high"))
        assert OPENAI.image(ImageInput(1024, 1024, detail="auto")) == high
        assert OPENAI.image(ImageInput(1024, 1024)) == high
        low = OPENAI.image.with_params({"auto_detail": "low"})
        assert low(ImageInput(1024, 1024)).tokens == 85

    def test_request_detail_beats_configured_detail(self) -> None:
        """The content part's ``detail`` wins over the configured default."""
        counter = OPENAI.image.with_params({"detail": "low"})
        assert counter(ImageInput(1024, 1024)).tokens == 85
        assert counter(ImageInput(1024, 1024, detail="high")).tokens == 765

    @pytest.mark.parametrize(
        ("size", "tiles"),
        [
            ((1, 1), 1),
            ((512, 512), 1),
            ((513, 500), 2),
            ((20000, 20000), 4),
            ((1, 150), 1),
            ((1, 20000), 4),
        ],
    )
    def test_edge_sizes(self, size: tuple[int, int], tiles: int) -> None:
        """Tiny, boundary, huge and extreme sizes: tiles after the two scalings."""
        assert OPENAI.image(ImageInput(*size, detail="high")).tiles == tiles

    def test_unknown_detail_rejected(self) -> None:
        """A detail other than auto/low/high is an error, not a guess."""
        with pytest.raises(ValueError, match="detail"):
            OPENAI.image(ImageInput(100, 100, detail="ultra"))


class TestOpenAIPatches:
    # Guide, 32px patch models: "1024 x 1024 image is 1024 tokens"; "1800 x 2400
    # image": 4275 patches > 1536 -> scaled to 1056 x 1408 -> 33 x 44 = 1452.
    # Multipliers "gpt-4.1-mini 1.62, gpt-4.1-nano 2.46, o4-mini 1.72".

    def test_1024_square_is_1024_patches(self) -> None:
        """Guide: a 1024 x 1024 image is 1024 patches."""
        assert openai_patch_count(1024, 1024, 32, 1536) == 1024

    def test_1800_by_2400_is_1452_patches(self) -> None:
        """Guide: 1800 x 2400 is scaled to 1056 x 1408 -> 1452 patches."""
        assert openai_patch_count(1800, 2400, 32, 1536) == 1452

    def test_multiplier_presets(self) -> None:
        """gpt-4.1-mini multiplies the 1452 patches by 1.62 (2352.24 -> 2353)."""
        counter = OPENAI.image.with_params(openai_params_for("gpt-4.1-mini-2025-04-14"))
        assert counter.params.method == "patch"
        assert counter(ImageInput(1800, 2400)).tokens == 2353
        nano = OPENAI.image.with_params(openai_params_for("gpt-4.1-nano"))
        assert nano(ImageInput(1024, 1024)).tokens == 2520  # ceil(1024 * 2.46 = 2519.04)

    def test_patch_cap(self) -> None:
        """Huge and extreme images never exceed 1536 patches."""
        for size in [(20000, 20000), (1, 20000), (20000, 3), (7999, 8001)]:
            assert openai_patch_count(*size, 32, 1536) <= 1536

    def test_family_lookup(self) -> None:
        """Longest prefix wins (gpt-4o-mini is not gpt-4o); unknown models get {}."""
        assert openai_params_for("gpt-4o-mini-2024-07-18")["base_tokens"] == 2833
        assert openai_params_for("gpt-4o-2024-08-06")["base_tokens"] == 85
        assert openai_params_for("o3-2025-04-16")["tile_tokens"] == 150
        assert openai_params_for("text-davinci") == {}
        for params in OPENAI_MODEL_PARAMS.values():
            OpenAIImageParams.model_validate(params)


# --- Claude ------------------------------------------------------------------
# platform.claude.com/docs/en/build-with-claude/vision: "tokens = (width px *
# height px)/750"; examples "200x200 px ~54", "1000x1000 px ~1334",
# "1092x1092 px ~1590"; maximum sizes that are not resized: "1:1 1092x1092 px,
# 3:4 951x1268 px, 2:3 896x1344 px, 9:16 819x1456 px, 1:2 784x1568 px"; "If your
# image's long edge is more than 1568 pixels, or your image is more than ~1,600
# tokens, it is first scaled down, preserving aspect ratio"; "The maximal
# dimensions per image are 8000x8000 px". Current guide: "An image therefore
# costs ceil(width / 28) x ceil(height / 28) visual tokens."


class TestClaude:
    @pytest.mark.parametrize(
        ("size", "expected"), [((200, 200), 54), ((1000, 1000), 1334), ((1092, 1092), 1590)]
    )
    def test_documented_examples(self, size: tuple[int, int], expected: int) -> None:
        """The guide's token table for unresized images."""
        assert CLAUDE.image(ImageInput(*size)).tokens == expected

    @pytest.mark.parametrize("size", [(1092, 1092), (951, 1268), (896, 1344), (819, 1456)])
    def test_documented_max_sizes_are_not_resized(self, size: tuple[int, int]) -> None:
        """The guide's largest unresized size per aspect ratio is kept, both ways round."""
        w, h = size
        assert claude_native_size(w, h, 1568, 1568, 28) == (w, h)
        assert claude_native_size(h, w, 1568, 1568, 28) == (h, w)

    def test_one_to_two_max_size(self) -> None:
        """784x1568 (1:2) is kept; one more pixel of long edge is resized."""
        assert claude_native_size(784, 1568, 1568, 1568, 28) == (784, 1568)
        assert claude_native_size(785, 1570, 1568, 1568, 28) == (784, 1568)

    def test_documented_max_sizes_are_maximal(self) -> None:
        """Slightly larger images of the same ratio are scaled back down."""
        assert claude_native_size(1100, 1100, 1568, 1568, 28) == (1092, 1092)
        assert claude_native_size(900, 1350, 1568, 1568, 28)[1] < 1350

    def test_large_images_cost_the_same(self) -> None:
        """Above the native size the count is flat: the image is scaled first."""
        big = CLAUDE.image(ImageInput(2000, 2000)).tokens
        assert big == CLAUDE.image(ImageInput(8000, 8000)).tokens == 1590

    def test_patch_method(self) -> None:
        """Current guide: ceil(w/28) x ceil(h/28) visual tokens (1000^2 -> 36^2)."""
        counter = CLAUDE.image.with_params({"method": "patch"})
        assert counter(ImageInput(1000, 1000)).tokens == 1296
        assert counter(ImageInput(200, 200)).tokens == 64

    def test_over_8000_rejected(self) -> None:
        """The API rejects images above 8000x8000 px."""
        with pytest.raises(ValueError, match="8000"):
            CLAUDE.image(ImageInput(8001, 10))

    @pytest.mark.parametrize("size", [(1, 1), (1, 8000), (8000, 1), (3, 500)])
    def test_extreme_sizes_are_defined(self, size: tuple[int, int]) -> None:
        """Tiny and extreme aspect ratios give a positive count within the cap."""
        tokens = CLAUDE.image(ImageInput(*size)).tokens
        assert 1 <= tokens <= 1640

    def test_params_validated(self) -> None:
        """Non-positive limits are rejected."""
        with pytest.raises(ValueError):  # noqa: PT011 - pydantic's error is a ValueError
            ClaudeImageParams(max_long_edge=0)


# --- Gemini ------------------------------------------------------------------
# ai.google.dev/gemini-api/docs/tokens: "With Gemini 2.0, image inputs with both
# dimensions <=384 pixels are counted as 258 tokens. Images larger in one or both
# dimensions are cropped and scaled as needed into tiles of 768x768 pixels, each
# counted as 258 tokens." "Video and audio files are converted to tokens at the
# following fixed rates: video at 263 tokens per second and audio at 32 tokens per
# second." "Gemini represents each second of audio as 32 tokens; for example, one
# minute of audio is represented as 1,920 tokens."


class TestGemini:
    @pytest.mark.parametrize("size", [(384, 384), (1, 1), (384, 10), (100, 200)])
    def test_small_images_are_258(self, size: tuple[int, int]) -> None:
        """Both sides <= 384: 258 tokens."""
        units = GEMINI.image(ImageInput(*size))
        assert (units.tokens, units.tiles) == (258, 1)

    def test_larger_images_are_768_tiles(self) -> None:
        """Larger images: 258 per 768x768 tile (600x400 -> 1 tile; 1920x1080 -> 6)."""
        assert GEMINI.image(ImageInput(600, 400)).tokens == 258  # geminibyexample.com
        assert GEMINI.image(ImageInput(385, 385)).tiles == 1
        assert GEMINI.image(ImageInput(1920, 1080)).tokens == 6 * 258

    def test_one_minute_of_audio_is_1920(self) -> None:
        """Docs: "one minute of audio is represented as 1,920 tokens"."""
        units = GEMINI.audio(AudioInput(seconds=60))
        assert units.tokens == 1920

    def test_video_is_263_per_second(self) -> None:
        """Docs: video at 263 tokens per second; frames sampled at 1 fps."""
        units = GEMINI.video(VideoInput(10, 30, 1280, 720))
        assert (units.frames, units.tokens) == (10, 2630)

    def test_video_per_frame_option(self) -> None:
        """tokens_per_frame counts frames instead of seconds (e.g. 258 per frame)."""
        counter = GEMINI.video.with_params({"tokens_per_frame": 258})
        assert counter(VideoInput(10, 30, 1280, 720)).tokens == 2580

    def test_sub_second_clips_round_up(self) -> None:
        """Half a second of video is one frame and ceil(131.5) tokens."""
        units = GEMINI.video(VideoInput(0.5, 30, 640, 360))
        assert (units.frames, units.tokens) == (1, 132)

    @pytest.mark.parametrize("seconds", [0, -1])
    def test_non_positive_duration_rejected(self, seconds: float) -> None:
        """A clip without a positive duration cannot be counted."""
        with pytest.raises(ValueError, match="duration"):
            GEMINI.audio(AudioInput(seconds=seconds))


def test_profiles_exported() -> None:
    """PROFILES holds the three hosted profiles, image-only for OpenAI and Claude."""
    assert [p.name for p in PROFILES] == ["openai", "claude", "gemini"]
    assert OPENAI.audio is None
    assert CLAUDE.video is None
    assert GEMINI.video is not None
