"""llm-d router estimate backend: worked examples from llm-d's guide, code and tests.

llm-d's Go code cannot run here. Every expected number below is quoted
from a primary source: the "Multimodal Workload Serving" guide (the seed),
``llm-d/llm-d-router`` ``mm_estimate.go`` constants, and the presets of
``estimate_live_test.go``, whose numbers the guide states.
"""

from __future__ import annotations

import pytest

from modtrace.counting.families.llmd import (
    DEFAULT_DURATION_S,
    DEFAULT_RESOLUTION,
    DEFAULT_SOURCE_FPS,
    LLMD,
    LLMD_GEMMA4,
    LLMD_QWEN3_VL,
    PROFILES,
    LlmdVideoParams,
    dimension_tokens,
    llmd_frame_count,
    llmd_video_units,
)
from modtrace.counting.profile import AudioInput, ImageInput, VideoInput


class TestBuiltInDefaults:
    def test_defaults_are_llmd_constants(self) -> None:
        """mm_estimate.go: 640x360, 10 s, sampleFPS 2, source fps 24, factor 1024."""
        # defaultImageWidth = 640, defaultImageHeight = 360, imageTokenFactor = 1024,
        # defaultVideoDuration = 10, defaultVideoSampleFPS = 2, defaultVideoSourceFPS = 24
        assert DEFAULT_RESOLUTION == (640, 360)
        assert DEFAULT_DURATION_S == 10
        assert DEFAULT_SOURCE_FPS == 24
        video = LLMD.video.params
        assert (video.sample_fps, video.factor, video.frames_mode) == (2, 1024, "sampled")
        assert LLMD.image.params.factor == 1024

    def test_unmeasured_image_is_360p(self) -> None:
        """An image llm-d cannot read counts as 640x360 -> 225 tokens."""
        assert LLMD.image(ImageInput(0, 0)).tokens == 640 * 360 // 1024 == 225

    def test_unmeasured_video_is_4500(self) -> None:
        """No headers: 10 s x 2 fps = 20 frames x 225 = 4,500 tokens."""
        units = LLMD.video(VideoInput(0, 0, 0, 0))
        assert (units.frames, units.tokens) == (20, 4500)


class TestImage:
    @pytest.mark.parametrize(
        ("size", "expected"),
        [((1920, 1080), 2025), ((1280, 720), 900), ((1, 1), 1), ((31, 33), 1), ((32, 32), 1)],
    )
    def test_dimension_mode(self, size: tuple[int, int], expected: int) -> None:
        """Tokens = max(1, w*h // factor) (integer division, floor at 1)."""
        assert LLMD.image(ImageInput(*size)).tokens == expected

    def test_qwen25_factor(self) -> None:
        """The guide's Qwen 2.5 VL factor 784 (28 x 28)."""
        counter = LLMD.image.with_params({"factor": 784})
        assert counter(ImageInput(1920, 1080)).tokens == 1920 * 1080 // 784

    @pytest.mark.parametrize(("static", "expected"), [(0, 1), (70, 70), (1120, 1120)])
    def test_static_mode(self, static: int, expected: int) -> None:
        """Static mode: the configured count per image, 1 when unset."""
        counter = LLMD.image.with_params({"mode": "static", "static_token": static})
        assert counter(ImageInput(4000, 3000)).tokens == expected

    def test_default_resolution_override(self) -> None:
        """estimate.image.defaultResolution replaces 640x360 for unreadable images."""
        counter = LLMD.image.with_params({"default_width": 1024, "default_height": 1024})
        assert counter(ImageInput(0, 0)).tokens == 1024


class TestVideo:
    def test_qwen3_vl_preset_matches_guide(self) -> None:
        """Guide/live test: Qwen3-VL, 10 s 1280x720 -> 10 groups x 900 = 9,000."""
        units = LLMD_QWEN3_VL.video(VideoInput(10, 30, 1280, 720))
        assert (units.frames, units.tokens) == (20, 9000)

    def test_qwen3_vl_preset_config_is_the_guide_config(self) -> None:
        """The preset is the guide's per-EPP config for Qwen3-VL."""
        p = LLMD_QWEN3_VL.video.params
        assert (p.factor, p.min_frames, p.max_frames) == (1024, 4, 768)
        assert (p.sample_fps, p.temporal_patch_size, p.max_video_tokens) == (2, 2, 12288)

    def test_gemma4_preset_matches_guide(self) -> None:
        """Guide/live test: Gemma 4, 10 s -> min(240 // 4, 8) x 296 = 2,368."""
        units = LLMD_GEMMA4.video(VideoInput(10, 0, 1280, 720))
        assert (units.frames, units.tokens) == (8, 2368)

    def test_gemma4_image_is_fixed_allocation(self) -> None:
        """Guide: Gemma 4 images take a fixed 280 tokens (the default budget)."""
        assert LLMD_GEMMA4.image(ImageInput(4000, 100)).tokens == 280

    def test_max_video_tokens_caps(self) -> None:
        """The Qwen3-VL preset caps at maxVideoTokens 12,288."""
        units = LLMD_QWEN3_VL.video(VideoInput(600, 30, 1920, 1080))
        assert units.tokens == 12288

    def test_short_clip_clamps_to_min_frames(self) -> None:
        """1 s at 2 fps = 2 frames, clamped to minFrames 4, merged in pairs: 2 groups."""
        units = LLMD_QWEN3_VL.video(VideoInput(1, 30, 640, 360))
        assert (units.frames, units.tokens) == (4, 2 * 225)

    def test_temporal_merge_floors_after_clamp(self) -> None:
        """Groups are frames // temporalPatchSize after the clamp (an odd count floors)."""
        frames, groups = llmd_frame_count(
            3.5,
            24,
            frames_mode="sampled",
            sample_fps=2,
            frame_stride=1,
            min_frames=0,
            max_frames=0,
            temporal_patch_size=2,
        )
        assert (frames, groups) == (7, 3)

    def test_strided_uses_item_fps_then_default(self) -> None:
        """Strided mode: x-llm-d-video-fps wins, else defaultSourceFPS, else 24."""
        params = LlmdVideoParams(frames_mode="strided", frame_stride=4)
        assert llmd_video_units(VideoInput(10, 30, 640, 360), params).frames == 75
        assert llmd_video_units(VideoInput(10, 0, 640, 360), params).frames == 60
        params = params.model_copy(update={"default_source_fps": 25.0})
        assert llmd_video_units(VideoInput(10, 0, 640, 360), params).frames == 62

    def test_sample_fps_is_never_taken_from_the_clip(self) -> None:
        """Sampled mode ignores the source fps (llm-d never overrides sampleFPS)."""
        assert LLMD.video(VideoInput(10, 60, 640, 360)) == LLMD.video(VideoInput(10, 24, 640, 360))

    def test_static_tokens_per_frame_unset_reads_one(self) -> None:
        """Static tokens-per-frame with no value counts 1 per frame."""
        counter = LLMD.video.with_params({"tokens_per_frame_mode": "static"})
        assert counter(VideoInput(10, 24, 640, 360)).tokens == 20

    def test_tiny_frames_floor_at_one(self) -> None:
        """A frame under one factor of pixels still counts 1 token."""
        assert LLMD.video(VideoInput(1, 24, 8, 8)).tokens == 2

    def test_dimension_tokens(self) -> None:
        """The shared dimension formula floors at 1."""
        assert dimension_tokens(1, 1, 1024) == 1
        assert dimension_tokens(1280, 720, 1024) == 900


class TestAudio:
    def test_dynamic_default(self) -> None:
        """mm_estimate.go: 14 overhead + int(12.5 tok/s x 10 s) = 139."""
        units = LLMD.audio(AudioInput(seconds=10))
        assert (units.frames, units.tokens) == (125, 139)

    def test_unknown_duration_defaults_to_10s(self) -> None:
        """A zero duration falls back to defaultAudioDuration (10 s)."""
        assert LLMD.audio(AudioInput(seconds=0)).tokens == 139

    def test_truncates_fractional_tokens(self) -> None:
        """int(tokensPerSecond * duration) truncates: 0.1 s -> 14 + 1."""
        assert LLMD.audio(AudioInput(seconds=0.1)).tokens == 15

    def test_cap_and_static(self) -> None:
        """maxAudioTokens caps; static mode counts a constant (1 when unset)."""
        assert LLMD.audio.with_params({"max_audio_tokens": 100})(AudioInput(60)).tokens == 100
        static = LLMD.audio.with_params({"mode": "static"})
        assert static(AudioInput(60)).tokens == 1
        fixed = LLMD.audio.with_params({"mode": "static", "static_token": 188})
        assert fixed(AudioInput(60)).tokens == 188

    def test_qwen3_preset_has_no_audio(self) -> None:
        """Qwen3-VL takes no audio: the preset flags it instead of guessing."""
        assert LLMD_QWEN3_VL.audio is None


class TestProfiles:
    def test_exported_profiles(self) -> None:
        """PROFILES holds the generic estimator and both presets."""
        assert [p.name for p in PROFILES] == ["llm-d", "llm-d-qwen3-vl", "llm-d-gemma4"]
        assert LLMD.image.ref == "llm-d.image@1"

    @pytest.mark.parametrize(
        "bad", [{"factor": 0}, {"frames_mode": "random"}, {"sample_fps": -2}, {"min_frames": -1}]
    )
    def test_invalid_params_rejected(self, bad: dict[str, object]) -> None:
        """Invalid configuration values raise a validation error."""
        with pytest.raises(ValueError):  # noqa: PT011 - pydantic's error is a ValueError
            LlmdVideoParams.model_validate(bad)
