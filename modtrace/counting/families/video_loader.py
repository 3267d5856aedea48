"""Frame sampling of vLLM's video loaders: which source frames reach the processor.

vLLM decodes only some frames of a video, and the model's processor sees
just those. The loader is chosen from the model's video processor (vLLM PRs
#44126, #44412 and #45555, June 2026) or by ``media_io_kwargs.video.
video_backend``:

* the generic uniform loader (``opencv``): ``num_frames`` (32) frames
  spread evenly, optionally capped by ``fps``
  (:func:`uniform_loader_indices`, :func:`vllm_video_frame_count`);
* ``qwen2_vl`` and ``qwen3_vl``: sampling at ``fps`` (2) as the HF Qwen
  video processors do (:func:`qwen2_loader_indices`,
  :func:`qwen3_loader_indices`).

Source: ``vllm@vllm/frontend/processing/multimodal/video.py``.
"""

from __future__ import annotations

import math

from .numerics import float32, linspace

__all__ = [
    "MAX_SOURCE_FRAMES",
    "MAX_VIDEO_FRAMES",
    "VLLM_QWEN_LOADER_FPS",
    "check_frame_limit",
    "check_num_frames",
    "qwen2_loader_indices",
    "qwen3_loader_indices",
    "source_frame_count",
    "uniform_loader_count",
    "uniform_loader_indices",
    "vllm_video_frame_count",
]

#: Default sampling rate of vLLM's ``qwen2_vl`` / ``qwen3_vl`` video loaders.
VLLM_QWEN_LOADER_FPS = 2.0

#: Most frames modtrace counts for one video: the cap on the frames a loader
#: keeps (what the processor sees) and on a request's ``num_frames`` and
#: ``max_frames``. Past it the item is flagged instead of counted: frame
#: index lists are built only below it.
MAX_VIDEO_FRAMES = 100_000

#: Most source frames a clip may hold (``round(seconds * fps)``, from request
#: headers): about 11.5 days at 100 fps. Counts use only arithmetic on it.
MAX_SOURCE_FRAMES = 100_000_000


def check_frame_limit(name: str, value: int) -> int:
    """``value`` when it is at most :data:`MAX_VIDEO_FRAMES`.

    Args:
        name: What ``value`` is, for the message (``num_frames``, ``max_frames``,
            ``frames sampled``).
        value: A frame count.

    Raises:
        ValueError: ``value`` exceeds the cap.
    """
    if value > MAX_VIDEO_FRAMES:
        msg = (
            f"video {name} = {value} exceeds the cap of {MAX_VIDEO_FRAMES} frames per video "
            "that modtrace counts; item not counted"
        )
        raise ValueError(msg)
    return value


def _floor_at_most(value: float, limit: int) -> int:
    """``min(floor(value), limit)`` for a non-negative ``value`` that may be huge or infinite."""
    if value != value:  # NaN
        msg = "video frame rate is not a number"
        raise ValueError(msg)
    return limit if value >= limit else math.floor(value)


def check_num_frames(value: int) -> int:
    """``value`` as the loaders' ``num_frames``: a positive count, or -1 for all frames.

    Raises:
        ValueError: Any other value (0, or below -1).
    """
    if value != -1 and value < 1:
        msg = f"num_frames must be a positive integer or -1 (all frames), got {value}"
        raise ValueError(msg)
    return value


def source_frame_count(seconds: float, fps: float) -> int:
    """Frames in the container: ``round(seconds * fps)``, at least 1.

    The decoder reads an integer frame count; a duration computed from it is
    ``frames / fps``, so rounding recovers it from a duration and a rate.

    Raises:
        ValueError: More than :data:`MAX_SOURCE_FRAMES` frames (the values
            come from request headers).
    """
    frames = seconds * fps
    if not frames <= MAX_SOURCE_FRAMES + 0.5:  # also NaN and infinity
        msg = (
            f"video of {seconds:.6g} s at {fps:.6g} fps exceeds the cap of "
            f"{MAX_SOURCE_FRAMES} source frames; item not counted"
        )
        raise ValueError(msg)
    return max(1, round(frames))


def uniform_loader_count(total: int, source_fps: float, num_frames: int, fps: float) -> int:
    """How many frames vLLM's generic ``opencv`` loader (``VideoBackend``) decodes.

    ``min(num_frames, total)`` (all if ``num_frames <= 0``), further capped at
    ``floor(duration * fps)`` when ``fps > 0``, at least 1. Pure arithmetic:
    the length of :func:`uniform_loader_indices` without building the list
    (the indices are distinct).
    """
    n = total
    if num_frames > 0:
        n = min(num_frames, total)
    if fps > 0:
        n = _floor_at_most(total / source_fps * fps, n)
    return max(1, n)


def uniform_loader_indices(total: int, source_fps: float, num_frames: int, fps: float) -> list[int]:
    """Frames vLLM's generic ``opencv`` loader (``VideoBackend``) decodes.

    :func:`uniform_loader_count` frames, taken with ``np.linspace(0, total -
    1, n, dtype=int)`` (truncation); all of them when ``n == total``.

    Raises:
        ValueError: More than :data:`MAX_VIDEO_FRAMES` frames: the list is
            never built past the cap.
    """
    n = check_frame_limit(
        "frames sampled", uniform_loader_count(total, source_fps, num_frames, fps)
    )
    if n == total:
        return list(range(total))
    return [int(x) for x in linspace(0, total - 1, n)]


def vllm_video_frame_count(
    seconds: float, fps: float, num_frames: int, loader_fps: float | None = None
) -> int:
    """Frames vLLM's generic uniform video loader hands the processor.

    The clip holds ``round(seconds * fps)`` frames (at least 1); the loader
    keeps ``min(num_frames, total)`` of them (all for ``num_frames=-1``),
    capped at ``floor(seconds * loader_fps)`` when ``media_io_kwargs`` sets
    ``fps``. Counted by arithmetic, never by listing the frames.

    Args:
        seconds: The clip's duration.
        fps: The clip's frame rate.
        num_frames: The loader's ``num_frames`` (vLLM default 32; -1 for all).
        loader_fps: The loader's ``fps`` (``media_io_kwargs.video.fps``), if set.

    Returns:
        The number of frames sampled, at least 1.

    Raises:
        ValueError: A negative or non-finite duration or rate, a zero rate,
            ``num_frames`` or the frames kept above :data:`MAX_VIDEO_FRAMES`,
            or more than :data:`MAX_SOURCE_FRAMES` source frames.
    """
    check_frame_limit("num_frames", num_frames)
    for name, value in (("seconds", seconds), ("fps", fps)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            msg = f"video {name} must be a finite non-negative number, got {value!r}"
            raise ValueError(msg)
    if fps == 0:
        msg = "video fps must be positive"
        raise ValueError(msg)
    total = source_frame_count(seconds, fps)
    kept = uniform_loader_count(total, fps, num_frames, loader_fps or 0.0)
    return check_frame_limit("frames sampled", kept)


def qwen3_loader_indices(
    total: int, source_fps: float, fps: float, min_frames: int, max_frames: int
) -> list[int]:
    """Frames sampled by vLLM's ``qwen3_vl`` loader and HF ``Qwen3VLVideoProcessor``.

    ``n = int(total / source_fps * fps)`` clamped to ``[min_frames,
    max_frames]`` and to ``total``; indices ``round(linspace(0, total-1, n))``
    (round half to even, as numpy).

    Raises:
        ValueError: More than :data:`MAX_VIDEO_FRAMES` frames to list.
    """
    n = _floor_at_most(total / source_fps * fps, total)
    n = check_frame_limit("frames sampled", min(max(n, min_frames), max_frames, total))
    return [round(x) for x in linspace(0, total - 1, n)]


def qwen2_loader_indices(
    total: int,
    source_fps: float,
    fps: float,
    min_frames: int,
    max_frames: int,
    temporal_patch_size: int,
) -> list[int]:
    """Frames sampled by vLLM's ``qwen2_vl`` loader (HF ``Qwen2VLVideoProcessor`` fps mode).

    ``n = total / source_fps * fps`` clamped to ``[min_frames,
    floor_tp(min(max_frames, total))]`` and ``total``, then floored to a
    multiple of ``temporal_patch_size``. Indices are
    ``torch.arange(0, total, total / n).int()`` (a float32 tensor whose
    elements are computed in double), the tail clamped to ``total - 1``.

    Raises:
        ValueError: The clip is too short to give one temporal patch (the
            engine would divide by zero), or more than
            :data:`MAX_VIDEO_FRAMES` frames to list.
    """
    tp = temporal_patch_size
    cap = math.floor(min(max_frames, total) / tp) * tp
    n_float = min(max(total / source_fps * fps, min_frames), cap, total)
    n = math.floor(n_float / tp) * tp
    if n <= 0:
        msg = (
            f"video of {total} frame(s) is too short for Qwen2-VL sampling: "
            f"needs at least {tp} frames"
        )
        raise ValueError(msg)
    check_frame_limit("frames sampled", n)
    step = total / n
    count = math.ceil(total / step)
    return [min(int(float32(i * step)), total - 1) for i in range(count)]
