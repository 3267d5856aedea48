"""llm-d router's ``estimate`` backend: the generic, model-agnostic estimator.

The llm-d router (EPP) scores prefix-cache affinity with a virtual token
footprint per multimodal asset, without a tokenizer or the model's
processor. modtrace reproduces it so a gateway that routes with llm-d
counts what llm-d counts:

* image, ``dynamic`` mode (default): ``max(1, width * height // factor)``,
  ``factor`` 1024; URL images llm-d cannot read are taken as 640x360.
  ``static`` mode: a fixed count per image.
* video: ``min(frames * tokens_per_frame, max_video_tokens)``, at least 1.
  Frames ``sampled`` (default): ``int(duration * sample_fps)`` clamped to
  ``[min_frames, max_frames]``, then divided by ``temporal_patch_size``;
  or ``strided``: ``int(duration * source_fps) // frame_stride``, clamped.
  Tokens per frame ``dynamic``: ``max(1, w * h // factor)``; or ``static``.
* audio, ``dynamic`` (default): ``overhead + int(tokens_per_second *
  duration)``, capped at ``max_audio_tokens``, at least 1; or ``static``.

A zero or missing duration, resolution or source fps falls back to the
configured default, then to llm-d's built-in one (10 s, 640x360, 24 fps),
as llm-d does with absent ``x-llm-d-video-*`` headers.

Two presets reproduce llm-d's live-test configurations:
``llm-d-qwen3-vl`` (Qwen3-VL: 10 s at 1280x720 -> 9,000 video tokens) and
``llm-d-gemma4`` (Gemma 4: 10 s -> 2,368).

Source: ``llm-d/llm-d-router``
``pkg/epp/framework/plugins/requestcontrol/dataproducer/tokenizer/mm_estimate.go``
and ``estimate_live_test.go``; the "Multimodal Workload Serving" guide.
"""

from __future__ import annotations

from typing import Literal

from pydantic import NonNegativeInt, PositiveFloat, PositiveInt

from ..profile import (
    AudioInput,
    AudioUnits,
    Counter,
    ImageInput,
    ImageUnits,
    Params,
    Profile,
    VideoInput,
    VideoUnits,
)

__all__ = [
    "DEFAULT_DURATION_S",
    "DEFAULT_RESOLUTION",
    "DEFAULT_SOURCE_FPS",
    "LLMD",
    "LLMD_GEMMA4",
    "LLMD_QWEN3_VL",
    "PROFILES",
    "LlmdAudioParams",
    "LlmdImageParams",
    "LlmdVideoParams",
    "dimension_tokens",
    "llmd_audio_units",
    "llmd_frame_count",
    "llmd_image_units",
    "llmd_video_units",
]

#: llm-d's built-in size for images and videos it cannot measure (360p).
DEFAULT_RESOLUTION = (640, 360)
#: llm-d's built-in video and audio duration when no header or config gives one.
DEFAULT_DURATION_S = 10.0
#: llm-d's built-in source frame rate for strided frame counting.
DEFAULT_SOURCE_FPS = 24.0

_SOURCE = (
    "llm-d/llm-d-router@pkg/epp/framework/plugins/requestcontrol/dataproducer/"
    "tokenizer/mm_estimate.go"
)
_LIVE_TEST = _SOURCE.replace("mm_estimate.go", "estimate_live_test.go")


# --- Pure formulas -----------------------------------------------------------
def dimension_tokens(width: int, height: int, factor: int) -> int:
    """``max(1, width * height // factor)``: llm-d's dimension-based estimate."""
    return max(1, (width * height) // factor)


def _resolution(width: int, height: int, default: tuple[int, int]) -> tuple[int, int]:
    """The item's size, or ``default`` when either side is unknown (<= 0)."""
    if width > 0 and height > 0:
        return width, height
    return default


def llmd_frame_count(
    seconds: float,
    source_fps: float,
    *,
    frames_mode: Literal["sampled", "strided"],
    sample_fps: float,
    frame_stride: int,
    min_frames: int,
    max_frames: int,
    temporal_patch_size: int,
) -> tuple[int, int]:
    """llm-d's ``frameCount``: frames taken and token groups.

    Args:
        seconds: Clip duration (already defaulted).
        source_fps: Source frame rate (already defaulted; strided mode only).
        frames_mode: ``sampled`` or ``strided``.
        sample_fps: Model sampling rate (sampled mode).
        frame_stride: Keep every n-th source frame (strided mode; < 1 reads as 1).
        min_frames: Lower clamp, 0 = off.
        max_frames: Upper clamp, 0 = off.
        temporal_patch_size: Frames merged per group (sampled mode; <= 1 = none).

    Returns:
        ``(frames, groups)``: frames after the clamp, and the token groups
        llm-d multiplies by tokens per frame (frames // temporal patch).
    """
    if frames_mode == "strided":
        n = int(seconds * source_fps) // max(frame_stride, 1)
    else:
        n = int(seconds * sample_fps)
    if min_frames > 0 and n < min_frames:
        n = min_frames
    if max_frames > 0 and n > max_frames:
        n = max_frames
    groups = n
    if frames_mode == "sampled" and temporal_patch_size > 1:
        groups = n // temporal_patch_size
    return n, groups


# --- Parameters --------------------------------------------------------------
class LlmdImageParams(Params):
    """llm-d ``estimate.image`` configuration.

    Attributes:
        mode: ``dynamic`` (dimension-based) or ``static`` (fixed per image).
        factor: Pixels per token in dynamic mode (1024 = 32x32; 784 for Qwen2.5-VL).
        static_token: Tokens per image in static mode (0 reads as 1, as in llm-d).
        default_width: Width assumed for images llm-d cannot read (URLs).
        default_height: Height assumed for images llm-d cannot read.
    """

    mode: Literal["dynamic", "static"] = "dynamic"
    factor: PositiveInt = 1024
    static_token: NonNegativeInt = 0
    default_width: PositiveInt = DEFAULT_RESOLUTION[0]
    default_height: PositiveInt = DEFAULT_RESOLUTION[1]


class LlmdVideoParams(Params):
    """llm-d ``estimate.video`` configuration (zero means "not set", as in llm-d).

    Attributes:
        tokens_per_frame_mode: ``dynamic`` (``w * h // factor``) or ``static``.
        factor: Pixels per token in dynamic mode.
        num_tokens_per_frame: Tokens per frame in static mode (0 reads as 1).
        frames_mode: ``sampled`` (model fps) or ``strided`` (every n-th source frame).
        sample_fps: Sampled mode rate; llm-d's code default is 2 (its README says 1).
        temporal_patch_size: Sampled frames merged per token group (0/1 = none).
        frame_stride: Strided mode stride.
        default_source_fps: Strided mode source fps when the clip's is unknown.
        min_frames: Lower clamp on frames, 0 = off.
        max_frames: Upper clamp on frames, 0 = off.
        max_video_tokens: Cap on the total, 0 = uncapped.
        default_duration: Seconds assumed when the clip's duration is unknown.
        default_width: Frame width assumed when unknown.
        default_height: Frame height assumed when unknown.
    """

    tokens_per_frame_mode: Literal["dynamic", "static"] = "dynamic"
    factor: PositiveInt = 1024
    num_tokens_per_frame: NonNegativeInt = 0
    frames_mode: Literal["sampled", "strided"] = "sampled"
    sample_fps: PositiveFloat = 2.0
    temporal_patch_size: NonNegativeInt = 0
    frame_stride: NonNegativeInt = 1
    default_source_fps: PositiveFloat = DEFAULT_SOURCE_FPS
    min_frames: NonNegativeInt = 0
    max_frames: NonNegativeInt = 0
    max_video_tokens: NonNegativeInt = 0
    default_duration: PositiveFloat = DEFAULT_DURATION_S
    default_width: PositiveInt = DEFAULT_RESOLUTION[0]
    default_height: PositiveInt = DEFAULT_RESOLUTION[1]


class LlmdAudioParams(Params):
    """llm-d ``estimate.audio`` configuration.

    Attributes:
        mode: ``dynamic`` (duration-based) or ``static`` (fixed per clip).
        static_token: Tokens per clip in static mode (0 reads as 1).
        tokens_per_second: Dynamic mode rate; llm-d's fallback is Qwen3-Omni's 12.5.
        overhead_tokens: Prompt template tokens added per clip (llm-d: 14).
        default_duration: Seconds assumed when the clip's duration is unknown.
        max_audio_tokens: Cap per clip, 0 = uncapped.
    """

    mode: Literal["dynamic", "static"] = "dynamic"
    static_token: NonNegativeInt = 0
    tokens_per_second: PositiveFloat = 12.5
    overhead_tokens: PositiveInt = 14
    default_duration: PositiveFloat = DEFAULT_DURATION_S
    max_audio_tokens: NonNegativeInt = 0


# --- Counters ----------------------------------------------------------------
def llmd_image_units(item: ImageInput, p: LlmdImageParams) -> ImageUnits:
    """llm-d's placeholder count for one image (``imageEstimator.countFromDims``).

    An unknown size (a side <= 0) falls back to the configured default
    resolution. Always at least 1, so every image carries weight.
    """
    if p.mode == "static":
        return ImageUnits(tokens=p.static_token or 1)
    w, h = _resolution(item.width, item.height, (p.default_width, p.default_height))
    return ImageUnits(tokens=dimension_tokens(w, h, p.factor))


def llmd_video_units(item: VideoInput, p: LlmdVideoParams) -> VideoUnits:
    """llm-d's placeholder count for one video (``videoEstimator.placeholderCount``).

    ``frames`` are the frames llm-d takes after the clamp; its token groups
    are ``frames // temporal_patch_size`` in sampled mode. ``tokens`` is
    ``min(groups * tokens_per_frame, max_video_tokens)``, at least 1.
    """
    seconds = item.seconds if item.seconds > 0 else p.default_duration
    source_fps = item.fps if item.fps > 0 else p.default_source_fps
    frames, groups = llmd_frame_count(
        seconds,
        source_fps,
        frames_mode=p.frames_mode,
        sample_fps=p.sample_fps,
        frame_stride=p.frame_stride,
        min_frames=p.min_frames,
        max_frames=p.max_frames,
        temporal_patch_size=p.temporal_patch_size,
    )
    if p.tokens_per_frame_mode == "static":
        per_frame = p.num_tokens_per_frame or 1
    else:
        w, h = _resolution(item.width, item.height, (p.default_width, p.default_height))
        per_frame = dimension_tokens(w, h, p.factor)
    tokens = groups * per_frame
    if p.max_video_tokens > 0:
        tokens = min(tokens, p.max_video_tokens)
    return VideoUnits(frames=frames, tokens=max(tokens, 1))


def llmd_audio_units(item: AudioInput, p: LlmdAudioParams) -> AudioUnits:
    """llm-d's placeholder count for one audio clip (``audioEstimator.placeholderCount``).

    ``tokens = overhead + int(tokens_per_second * seconds)``, capped at
    ``max_audio_tokens``, at least 1; a zero duration falls back to
    ``default_duration``. ``frames`` counts the codec frames at
    ``tokens_per_second`` (the tokens without the template overhead); in
    static mode it equals the tokens.
    """
    if p.mode == "static":
        tokens = p.static_token or 1
        return AudioUnits(frames=tokens, tokens=tokens)
    seconds = item.seconds if item.seconds > 0 else p.default_duration
    frames = int(p.tokens_per_second * seconds)
    tokens = p.overhead_tokens + frames
    if p.max_audio_tokens > 0:
        tokens = min(tokens, p.max_audio_tokens)
    return AudioUnits(frames=frames, tokens=max(tokens, 1))


# --- Profiles ----------------------------------------------------------------
def _image(params: LlmdImageParams, source: str = _SOURCE) -> Counter:
    return Counter(id="llm-d.image", version=1, params=params, fn=llmd_image_units, source=source)


def _video(params: LlmdVideoParams, source: str = _SOURCE) -> Counter:
    return Counter(id="llm-d.video", version=1, params=params, fn=llmd_video_units, source=source)


_AUDIO = Counter(
    id="llm-d.audio",
    version=1,
    params=LlmdAudioParams(),
    fn=llmd_audio_units,
    source=_SOURCE,
)

LLMD = Profile(
    name="llm-d",
    description="llm-d router estimate backend with its built-in defaults (model-agnostic)",
    image=_image(LlmdImageParams()),
    audio=_AUDIO,
    video=_video(LlmdVideoParams()),
    aliases=("llmd", "llm-d-estimate"),
)

#: Qwen3-VL preset of the llm-d guide and live test (Qwen/Qwen3-VL-30B-A3B-Instruct).
LLMD_QWEN3_VL = Profile(
    name="llm-d-qwen3-vl",
    description="llm-d estimate backend configured for Qwen3-VL (guide / live-test preset)",
    image=_image(LlmdImageParams(factor=32 * 32)),
    video=_video(
        LlmdVideoParams(
            tokens_per_frame_mode="dynamic",
            factor=32 * 32,
            frames_mode="sampled",
            sample_fps=2,
            temporal_patch_size=2,
            min_frames=4,
            max_frames=768,
            max_video_tokens=12288,
        ),
        source=f"{_SOURCE}; {_LIVE_TEST} (qwen3vlVideoCase)",
    ),
    aliases=("llmd-qwen3-vl",),
)

#: Gemma 4 preset of the llm-d guide and live test (google/gemma-4-31B-it).
LLMD_GEMMA4 = Profile(
    name="llm-d-gemma4",
    description="llm-d estimate backend configured for Gemma 4 (guide / live-test preset)",
    image=_image(LlmdImageParams(mode="static", static_token=280)),
    audio=_AUDIO,
    video=_video(
        LlmdVideoParams(
            tokens_per_frame_mode="static",
            num_tokens_per_frame=296,
            frames_mode="strided",
            frame_stride=4,
            min_frames=1,
            max_frames=8,
        ),
        source=f"{_SOURCE}; {_LIVE_TEST} (gemma4VideoCase)",
    ),
    aliases=("llmd-gemma4",),
)

PROFILES: tuple[Profile, ...] = (LLMD, LLMD_QWEN3_VL, LLMD_GEMMA4)
