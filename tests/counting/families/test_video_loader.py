"""vLLM's video loaders under client-controlled sizes: counts by arithmetic, caps past the limits.

The clip's duration and frame rate come from request headers, and
``num_frames``, ``max_frames`` and ``fps`` from the request's
``media_io_kwargs`` / ``mm_processor_kwargs``: no count may build a list as
long as the clip, and values past the caps flag the item instead of working.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from modtrace.counting.families.gemma import GEMMA4
from modtrace.counting.families.internvl import INTERNVL, frame_prefix_digits
from modtrace.counting.families.qwen import QWEN3_VL, QWEN25_VL
from modtrace.counting.families.video_loader import (
    MAX_SOURCE_FRAMES,
    MAX_VIDEO_FRAMES,
    source_frame_count,
    uniform_loader_count,
    uniform_loader_indices,
    vllm_video_frame_count,
)
from modtrace.counting.profile import VideoInput

#: The review's scenario: 200,000 s at 100 fps is 20 million source frames.
HUGE = VideoInput(seconds=200_000, fps=100, width=640, height=360)


def _bounded(fn):
    """Run ``fn`` and return ``(result_or_exception, seconds, peak_bytes)``."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        out = fn()
    except ValueError as exc:
        out = exc
    elapsed = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return out, elapsed, peak


class TestArithmeticCounts:
    def test_uniform_count_is_the_length_of_the_indices(self) -> None:
        """uniform_loader_count equals len(uniform_loader_indices) without building them."""
        for total in (1, 2, 3, 19, 20, 21, 299, 300, 301, 3600):
            for num_frames in (-1, 1, 2, 31, 32, 33, 300, 5000):
                for fps in (-1.0, 0.0, 0.5, 1.0, 2.0, 29.97, 1e9):
                    indices = uniform_loader_indices(total, 30.0, num_frames, fps)
                    assert len(set(indices)) == len(indices)  # distinct: the count is the length
                    assert uniform_loader_count(total, 30.0, num_frames, fps) == len(indices)

    def test_uniform_indices_still_match_numpy(self) -> None:
        """The indices, when they are needed, stay vLLM's np.linspace(..., dtype=int)."""
        assert uniform_loader_indices(300, 30.0, 32, -1) == (
            np.linspace(0, 299, 32, dtype=int).tolist()
        )
        assert uniform_loader_indices(300, 30.0, -1, -1) == list(range(300))

    def test_all_frames_of_a_huge_clip_are_counted_not_listed(self) -> None:
        """num_frames=-1 on 20 M frames: the count comes back at once, with no frame list."""
        total = source_frame_count(HUGE.seconds, HUGE.fps)
        out, elapsed, peak = _bounded(lambda: uniform_loader_count(total, HUGE.fps, -1, -1))
        assert out == 20_000_000
        assert peak < 1_000_000 and elapsed < 0.5

    def test_internvl_prefix_digits_are_arithmetic(self) -> None:
        """The extra digits of "Frame{i}: " for i = 1..n equal the brute-force sum."""
        for n in (*range(0, 130), 999, 1000, 1001, 9999, 10000, 12345, 99999, 100000):
            assert frame_prefix_digits(n) == sum(len(str(i)) - 1 for i in range(1, n + 1))


class TestCaps:
    def test_qwen25_opencv_all_frames_is_flagged_without_work(self) -> None:
        """The review's scenario (qwen2.5-vl, opencv, num_frames=-1): an error, fast and small."""
        counter = QWEN25_VL.video.with_params({"video_backend": "opencv", "num_frames": -1})
        out, elapsed, peak = _bounded(lambda: counter(HUGE))
        assert isinstance(out, ValueError)
        assert "frames sampled = 20000000" in str(out) and str(MAX_VIDEO_FRAMES) in str(out)
        assert peak < 5_000_000 and elapsed < 0.5

    def test_qwen3_whole_clip_resampled_without_listing_it(self) -> None:
        """Qwen3-VL re-samples a clip loaded whole: 768 frames, no 20 M-entry list on the way."""
        counter = QWEN3_VL.video.with_params({"video_backend": "opencv", "num_frames": -1})
        out, elapsed, peak = _bounded(lambda: counter(HUGE))
        assert out.frames == 768
        assert out == QWEN3_VL.video(HUGE)
        assert peak < 5_000_000 and elapsed < 0.5

    @pytest.mark.parametrize(
        ("counter", "params", "name"),
        [
            (QWEN3_VL.video, {"max_frames": 10**9}, "max_frames"),
            (QWEN25_VL.video, {"max_frames": 10**9, "fps": 1e300}, "max_frames"),
            (QWEN25_VL.video, {"video_backend": "opencv", "num_frames": 10**9}, "num_frames"),
            (GEMMA4.video, {"num_frames": 10**9}, "num_frames"),
            (INTERNVL.video, {"num_frames": 10**9}, "num_frames"),
        ],
    )
    def test_request_frame_limits_past_the_cap_are_refused(self, counter, params, name) -> None:
        """num_frames / max_frames above the cap give a clear error, not a huge sample."""
        out, elapsed, peak = _bounded(lambda: counter.with_params(params)(HUGE))
        assert isinstance(out, ValueError)
        assert name in str(out) and str(MAX_VIDEO_FRAMES) in str(out)
        assert peak < 5_000_000 and elapsed < 0.5

    @pytest.mark.parametrize("counter", [GEMMA4.video, INTERNVL.video])
    def test_uniform_loader_families_cap_the_frames_kept(self, counter) -> None:
        """Gemma 4 and InternVL with num_frames=-1 on a huge clip: flagged, not summed."""
        out, elapsed, peak = _bounded(lambda: counter.with_params({"num_frames": -1})(HUGE))
        assert isinstance(out, ValueError) and "frames" in str(out)
        assert peak < 1_000_000 and elapsed < 0.5

    @pytest.mark.parametrize(
        ("seconds", "fps"), [(1e300, 1e300), (1.7e308, 10.0), (MAX_SOURCE_FRAMES + 1, 1.0)]
    )
    def test_source_frames_past_the_cap_are_refused(self, seconds, fps) -> None:
        """A clip of more than MAX_SOURCE_FRAMES frames is a ValueError, never an overflow."""
        with pytest.raises(ValueError, match="source frames"):
            source_frame_count(seconds, fps)
        for counter in (QWEN3_VL.video, QWEN25_VL.video, GEMMA4.video, INTERNVL.video):
            with pytest.raises(ValueError, match="source frames"):
                counter(VideoInput(seconds=seconds, fps=fps, width=640, height=360))

    def test_huge_loader_fps_is_clamped_not_overflowed(self) -> None:
        """A loader fps of 1e308 keeps every frame (capped), rather than overflowing a floor."""
        assert vllm_video_frame_count(10.0, 30.0, 32, 1e308) == 32
        assert uniform_loader_count(300, 30.0, -1, 1e308) == 300
        item = VideoInput(10, 30, 640, 360)
        assert QWEN25_VL.video.with_params({"loader_fps": 1e308})(item).frames == 300
        # Qwen3-VL's processor re-samples the whole clip it then receives at 2 fps.
        assert QWEN3_VL.video.with_params({"loader_fps": 1e308})(item).frames == 20

    def test_limits_at_the_cap_still_count(self) -> None:
        """Exactly MAX_VIDEO_FRAMES is allowed; realistic long clips count as before."""
        item = VideoInput(seconds=MAX_VIDEO_FRAMES, fps=1.0, width=64, height=64)
        assert GEMMA4.video.with_params({"num_frames": -1})(item).frames == MAX_VIDEO_FRAMES
        # Two hours at 60 fps (432,000 source frames) with the default loader settings.
        long_clip = VideoInput(seconds=7200, fps=60, width=1280, height=720)
        assert QWEN3_VL.video(long_clip).frames == 768
        assert GEMMA4.video(long_clip).frames == 32
