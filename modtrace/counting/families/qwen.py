"""Qwen2-VL, Qwen2.5-VL and Qwen3-VL: image and video units as vLLM counts them.

Images go through the Hugging Face ``Qwen2VLImageProcessor`` (all three
models use it; Qwen3-VL with 16-px patches): ``smart_resize`` to a multiple
of ``patch_size * merge_size`` inside ``[min_pixels, max_pixels]``, then one
prompt token per ``merge_size x merge_size`` block of patches.

Videos follow the serving path end to end:

1. vLLM's video loader picks the frames. Since vLLM PRs #44126, #44412 and
   #45555 (June 2026) the loader is chosen from the model's video processor:
   ``qwen3_vl`` for Qwen3-VL and ``qwen2_vl`` for Qwen2/2.5-VL, both sampling
   at ``fps`` (2) like the HF processors. Older vLLM, or
   ``--media-io-kwargs '{"video": {"video_backend": "opencv"}}'``, uses the
   generic uniform loader: ``num_frames`` (32) frames spread evenly. The
   loaders' sampling is in :mod:`~modtrace.counting.families.video_loader`.
2. The HF video processor resizes every frame to one size (Qwen2/2.5: a
   per-frame pixel budget; Qwen3-VL: a budget over all frames), pads the
   frame count to a multiple of ``temporal_patch_size`` and merges pairs.
3. vLLM's prompt update expands the placeholder. Qwen3-VL adds, per
   temporal group, the timestamp text ``<{t:.1f} seconds>`` and
   ``<|vision_start|>``/``<|vision_end|>`` inside the placeholder range.

Reference checkpoints: ``Qwen/Qwen2-VL-7B-Instruct``,
``Qwen/Qwen2.5-VL-7B-Instruct`` and ``Qwen/Qwen3-VL-8B-Instruct``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import Field, NonNegativeInt, PositiveFloat, PositiveInt, model_validator

from ..profile import (
    Counter,
    ImageInput,
    ImageUnits,
    Params,
    Profile,
    VideoInput,
    VideoUnits,
    check_size,
)
from ..safe import is_safe_name
from .numerics import ceil_div
from .video_loader import (
    VLLM_QWEN_LOADER_FPS,
    check_frame_limit,
    check_num_frames,
    qwen2_loader_indices,
    qwen3_loader_indices,
    source_frame_count,
    uniform_loader_count,
    uniform_loader_indices,
)

__all__ = [
    "MAX_ASPECT_RATIO",
    "PROFILES",
    "QWEN2_VL",
    "QWEN3_VL",
    "QWEN25_VL",
    "Qwen3VideoParams",
    "QwenImageParams",
    "QwenVideoParams",
    "qwen_image_units",
    "qwen_timestamp_tokens",
    "qwen_video_units",
    "smart_resize",
    "smart_resize_video",
    "temporal_group_timestamps",
]

#: HF ``smart_resize`` refuses images whose long side exceeds this many short sides.
MAX_ASPECT_RATIO = 200

VideoBackend = Literal["qwen2_vl", "qwen3_vl", "opencv"]


# --- Pure formulas -----------------------------------------------------------
def _check_aspect_ratio(height: int, width: int) -> None:
    ratio = max(height, width) / min(height, width)
    if ratio > MAX_ASPECT_RATIO:
        msg = (
            f"aspect ratio {ratio:.1f} of {width}x{height} exceeds the Qwen processor "
            f"limit of {MAX_ASPECT_RATIO}"
        )
        raise ValueError(msg)


def smart_resize(
    height: int, width: int, factor: int, min_pixels: int, max_pixels: int
) -> tuple[int, int]:
    """Resize ``height x width`` as HF ``Qwen2VLImageProcessor`` does.

    Both sides become multiples of ``factor`` (Python ``round``, half to
    even), and the area is brought inside ``[min_pixels, max_pixels]`` while
    keeping the aspect ratio as far as the rounding allows.

    Args:
        height: Original height in pixels (>= 1).
        width: Original width in pixels (>= 1).
        factor: ``patch_size * merge_size`` (28 for Qwen2/2.5-VL, 32 for Qwen3-VL).
        min_pixels: Smallest allowed area.
        max_pixels: Largest allowed area.

    Returns:
        ``(resized_height, resized_width)``.

    Raises:
        ValueError: The aspect ratio exceeds 200, as in the processor.
    """
    _check_aspect_ratio(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def smart_resize_video(
    num_frames: int,
    height: int,
    width: int,
    factor: int,
    min_pixels: int,
    max_pixels: int,
    temporal_factor: int = 2,
) -> tuple[int, int]:
    """Resize frames as HF ``Qwen3VLVideoProcessor`` does: one budget for all frames.

    Frames smaller than ``factor`` are first scaled up (truncating) so the
    short side reaches ``factor``; the pixel budget then applies to
    ``frames x height x width``.

    Returns:
        ``(resized_height, resized_width)`` of every frame.

    Raises:
        ValueError: Fewer frames than ``temporal_factor``, or an aspect ratio
            above 200, as in the processor.
    """
    if num_frames < temporal_factor:
        msg = (
            f"Qwen3-VL video needs at least {temporal_factor} frames "
            f"(temporal_patch_size), got {num_frames}"
        )
        raise ValueError(msg)
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height = int(height * scale)
        width = int(width * scale)
    _check_aspect_ratio(height, width)
    h_bar = round(height / factor) * factor
    w_bar = round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def temporal_group_timestamps(
    indices: Sequence[int], source_fps: float, temporal_patch_size: int
) -> list[float]:
    """Seconds shown for each temporal group (Qwen3-VL ``_calculate_timestamps``).

    The index list is padded with its last index to a multiple of
    ``temporal_patch_size``; each group shows the mean of its first and last
    frame times.
    """
    padded = list(indices)
    if len(padded) % temporal_patch_size:
        padded += [padded[-1]] * (temporal_patch_size - len(padded) % temporal_patch_size)
    times = [i / source_fps for i in padded]
    return [
        (times[i] + times[i + temporal_patch_size - 1]) / 2
        for i in range(0, len(times), temporal_patch_size)
    ]


def qwen_timestamp_tokens(seconds: float) -> int:
    """Tokens of ``f"<{seconds:.1f} seconds>"`` with the Qwen2/Qwen3 tokenizer.

    The Qwen pre-tokenizer splits every digit into its own token; ``<``,
    ``.``, `` seconds`` and ``>`` are one token each. Checked against the
    Qwen BPE ranks (``qwen.tiktoken``) for timestamps from 0 to 20,000 s.
    """
    text = f"{seconds:.1f}"
    return sum(ch.isdigit() for ch in text) + 4


# --- Parameters --------------------------------------------------------------
def _key_names(keys: set[Any]) -> str:
    """The client's keys for a message: plain identifiers only, the rest counted."""
    shown = sorted(k for k in keys if is_safe_name(k))[:5]
    return ", ".join([*map(repr, shown), *(["..."] if len(shown) < len(keys) else [])])


def _flatten_size(data: Any) -> Any:
    """Map HF's nested ``size={"shortest_edge", "longest_edge"}`` onto min/max pixels.

    A ``size`` given with the flat fields wins over them: the flat fields
    always hold the current values when a counter's parameters are merged.
    """
    if not isinstance(data, Mapping) or "size" not in data:
        return data
    data = dict(data)
    size = data.pop("size")
    if size is None:
        return data
    if not isinstance(size, Mapping):
        msg = (
            "size: expected a mapping with 'shortest_edge'/'longest_edge', "
            f"got {type(size).__name__}"
        )
        raise ValueError(msg)
    unknown = set(size) - {"shortest_edge", "longest_edge"}
    if unknown:
        msg = (
            f"size: {len(unknown)} unsupported key(s) {_key_names(unknown)}; Qwen processors take "
            "'shortest_edge' (min pixels) and 'longest_edge' (max pixels)"
        )
        raise ValueError(msg)
    if "shortest_edge" in size:
        data["min_pixels"] = size["shortest_edge"]
    if "longest_edge" in size:
        data["max_pixels"] = size["longest_edge"]
    return data


class _QwenPixelParams(Params):
    """Shared pixel-budget fields; ``size`` is accepted on input only."""

    patch_size: PositiveInt
    merge_size: PositiveInt
    min_pixels: PositiveInt
    max_pixels: PositiveInt
    #: Write-only alias: HF's ``size={"shortest_edge": min, "longest_edge": max}``.
    size: dict[str, int] | None = Field(default=None, exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _nested_size(cls, data: Any) -> Any:
        return _flatten_size(data)

    @property
    def factor(self) -> int:
        """``patch_size * merge_size``: the side of one prompt token, in pixels."""
        return self.patch_size * self.merge_size


class QwenImageParams(_QwenPixelParams):
    """Image parameters, named as the HF ``Qwen2VLImageProcessor`` kwargs.

    Defaults are those of ``Qwen/Qwen2.5-VL-7B-Instruct``'s
    ``preprocessor_config.json`` (4..16384 tokens of 28x28 pixels).
    """

    patch_size: PositiveInt = 14
    merge_size: PositiveInt = 2
    min_pixels: PositiveInt = 3136
    max_pixels: PositiveInt = 12845056


class QwenVideoParams(_QwenPixelParams):
    """Video parameters of Qwen2/2.5-VL (HF ``Qwen2VLVideoProcessor``, vLLM loaders).

    Attributes:
        min_pixels: Per-frame minimum area. The Qwen2/2.5-VL checkpoints ship
            no ``video_preprocessor_config.json``; transformers then loads the
            video processor from ``preprocessor_config.json``, so the image
            bounds (3136 / 12845056) apply to every frame.
        max_pixels: Per-frame maximum area (see ``min_pixels``).
        temporal_patch_size: Frames merged into one temporal group.
        fps: HF processor sampling rate (``mm_processor_kwargs.fps``), used
            when the processor samples: vLLM handed it every frame.
        min_frames: Fewest frames the fps samplers keep (loader and HF: 4).
        max_frames: Most frames the fps samplers keep (loader and HF: 768).
        num_frames: vLLM ``media_io_kwargs.video.num_frames``; only the
            uniform ``opencv`` loader uses it (``-1``: all frames).
        loader_fps: vLLM ``media_io_kwargs.video.fps``; ``None`` keeps the
            loader's own default (2 for the Qwen loaders, off for ``opencv``).
        video_backend: vLLM video loader (``media_io_kwargs.video.video_backend``).
        do_sample_frames: Whether the HF processor re-samples by ``fps`` when
            vLLM hands it every frame of the clip.
        cap_pixels_per_frame: HF's opt-in qwen-vl-utils cap (off by default
            in transformers 5.24).
        max_video_tokens: Context size the cap derives its total budget from.
    """

    patch_size: PositiveInt = 14
    merge_size: PositiveInt = 2
    min_pixels: PositiveInt = 3136
    max_pixels: PositiveInt = 12845056
    temporal_patch_size: PositiveInt = 2
    fps: PositiveFloat = 2.0
    min_frames: PositiveInt = 4
    max_frames: PositiveInt = 768
    num_frames: int = 32
    loader_fps: float | None = None
    video_backend: VideoBackend = "qwen2_vl"
    do_sample_frames: bool = False
    cap_pixels_per_frame: bool = False
    max_video_tokens: PositiveInt = 128000

    @model_validator(mode="after")
    def _check_num_frames(self) -> QwenVideoParams:
        check_num_frames(self.num_frames)
        return self


class Qwen3VideoParams(QwenVideoParams):
    """Video parameters of Qwen3-VL (HF ``Qwen3VLVideoProcessor``).

    ``min_pixels``/``max_pixels`` (``size`` shortest/longest edge) bound the
    pixels of all frames together. Defaults from the Qwen3-VL checkpoints'
    ``video_preprocessor_config.json``.

    Attributes:
        max_video_tokens: Per-frame token ceiling of the optional cap
            (qwen-vl-utils' ``VIDEO_MAX_TOKEN_NUM``), not a context size.
        timestamp_token_count: Tokens per ``<{t:.1f} seconds>`` string;
            ``None`` counts them with the Qwen tokenizer rule
            (:func:`qwen_timestamp_tokens`).
    """

    patch_size: PositiveInt = 16
    min_pixels: PositiveInt = 4096
    max_pixels: PositiveInt = 25165824
    video_backend: VideoBackend = "qwen3_vl"
    do_sample_frames: bool = True
    max_video_tokens: PositiveInt = 768
    timestamp_token_count: NonNegativeInt | None = None


# --- Counters ----------------------------------------------------------------
def qwen_image_units(item: ImageInput, p: QwenImageParams) -> ImageUnits:
    """Prompt tokens of one image: ``grid_h * grid_w / merge_size**2``.

    This is the ``<|image_pad|>`` run vLLM's ``PromptReplacement`` produces
    (its placeholder range). The ``<|vision_start|>``/``<|vision_end|>`` pair
    around it comes from the chat template, outside the range, and is
    counted as text.

    Raises:
        ValueError: A side below 1 px or an aspect ratio above 200.
    """
    check_size(item.width, item.height)
    h, w = smart_resize(item.height, item.width, p.factor, p.min_pixels, p.max_pixels)
    grid_h, grid_w = h // p.patch_size, w // p.patch_size
    return ImageUnits(tokens=grid_h * grid_w // p.merge_size**2)


def _hf_resampled(total: int, item: VideoInput, p: QwenVideoParams) -> list[int]:
    """Frames the HF processor samples by ``fps`` from a clip it received whole."""
    if isinstance(p, Qwen3VideoParams):
        return qwen3_loader_indices(total, item.fps, p.fps, p.min_frames, p.max_frames)
    return qwen2_loader_indices(
        total, item.fps, p.fps, p.min_frames, p.max_frames, p.temporal_patch_size
    )


def _sampled_frames(item: VideoInput, p: QwenVideoParams) -> tuple[int, list[int] | None]:
    """Frames the vision encoder sees: their number, and their source indices when needed.

    Only Qwen3-VL needs the indices (its timestamps); the count is
    arithmetic otherwise, and an index list is built only once the frame
    count is clamped and below :data:`~.video_loader.MAX_VIDEO_FRAMES`.
    """
    if item.seconds <= 0 or item.fps <= 0:
        msg = f"video needs a positive duration and fps, got {item.seconds} s at {item.fps} fps"
        raise ValueError(msg)
    check_size(item.width, item.height)
    check_frame_limit("max_frames", p.max_frames)
    total = source_frame_count(item.seconds, item.fps)
    if p.video_backend == "opencv":
        check_frame_limit("num_frames", p.num_frames)
        loader_fps = -1.0 if p.loader_fps is None else p.loader_fps
        n = uniform_loader_count(total, item.fps, p.num_frames, loader_fps)
        if n == total and p.do_sample_frames:
            # vLLM flags a clip loaded whole with do_sample_frames: HF samples by fps.
            indices = _hf_resampled(total, item, p)
            return len(indices), indices
        check_frame_limit("frames sampled", n)
        if not isinstance(p, Qwen3VideoParams):
            return n, None  # uniform indices are distinct: the count is all Qwen2 needs
        indices = uniform_loader_indices(total, item.fps, p.num_frames, loader_fps)
        return len(indices), indices
    # The loader samples at media_io fps; mm_processor_kwargs' fps never reaches it.
    fps = VLLM_QWEN_LOADER_FPS if p.loader_fps is None or p.loader_fps <= 0 else p.loader_fps
    if p.video_backend == "qwen3_vl":
        idx = qwen3_loader_indices(total, item.fps, fps, p.min_frames, p.max_frames)
    else:
        idx = qwen2_loader_indices(
            total, item.fps, fps, p.min_frames, p.max_frames, p.temporal_patch_size
        )
    # The decoder reads the index set in order: repeated indices load once.
    indices = sorted(set(idx))
    if len(indices) == total and p.do_sample_frames:
        indices = _hf_resampled(total, item, p)
    return len(indices), indices


def _frame_max_pixels(p: QwenVideoParams, num_frames: int) -> int:
    """Per-frame pixel cap of ``Qwen2VLVideoProcessor.resize`` (with the optional cap)."""
    if not p.cap_pixels_per_frame:
        return p.max_pixels
    total_pixels = int(p.max_video_tokens * p.factor * p.factor * 0.9)
    return max(
        min(p.max_pixels, total_pixels * p.temporal_patch_size // num_frames),
        int(p.min_pixels * 1.05),
    )


def _all_frames_max_pixels(p: Qwen3VideoParams, num_frames: int) -> int:
    """Whole-clip pixel cap of ``Qwen3VLVideoProcessor.resize`` (with the optional cap)."""
    if not p.cap_pixels_per_frame:
        return p.max_pixels
    frame_cap = p.max_video_tokens * p.factor * p.factor
    per_frame = max(min(frame_cap, p.max_pixels // num_frames), int(p.min_pixels * 1.05))
    return per_frame * num_frames


def qwen_video_units(item: VideoInput, p: QwenVideoParams) -> VideoUnits:
    """Frames and prompt tokens of one video.

    ``frames`` are the frames the encoder sees: sampled frames before the
    padding to a multiple of ``temporal_patch_size``
    (``grid_t = ceil(frames / temporal_patch_size)``).

    ``tokens`` is the length of vLLM's placeholder range:

    * Qwen2/2.5-VL: ``grid_t * grid_h * grid_w / merge**2`` ``<|video_pad|>``
      tokens (``<|vision_start|>``/``<|vision_end|>`` are template text).
    * Qwen3-VL: per temporal group, the ``<{t:.1f} seconds>`` text tokens,
      ``<|vision_start|>``, ``grid_h * grid_w / merge**2`` pads and
      ``<|vision_end|>``: vLLM replaces the template's whole
      ``<|vision_start|><|video_pad|><|vision_end|>``.

    Raises:
        ValueError: A non-positive duration or fps, a clip too short for the
            model's temporal patch, an aspect ratio above 200, or frame counts
            past the caps (``num_frames``, ``max_frames`` or the frames sampled
            above :data:`~.video_loader.MAX_VIDEO_FRAMES`, a clip above
            :data:`~.video_loader.MAX_SOURCE_FRAMES`).
    """
    n, indices = _sampled_frames(item, p)
    tp = p.temporal_patch_size
    grid_t = ceil_div(n, tp)
    if isinstance(p, Qwen3VideoParams):
        h, w = smart_resize_video(
            n,
            item.height,
            item.width,
            p.factor,
            p.min_pixels,
            _all_frames_max_pixels(p, n),
            temporal_factor=tp,
        )
    else:
        h, w = smart_resize(
            item.height, item.width, p.factor, p.min_pixels, _frame_max_pixels(p, n)
        )
    per_group = (h // p.patch_size) * (w // p.patch_size) // p.merge_size**2
    tokens = grid_t * per_group
    if isinstance(p, Qwen3VideoParams):
        stamps = temporal_group_timestamps(indices or (), item.fps, tp)
        if p.timestamp_token_count is None:  # Qwen tokenizer rule
            text = sum(qwen_timestamp_tokens(t) for t in stamps)
        else:
            text = p.timestamp_token_count * len(stamps)
        tokens += text + 2 * grid_t
    return VideoUnits(frames=n, tokens=tokens)


# --- Profiles ----------------------------------------------------------------
_HF_IMAGE = "transformers@src/transformers/models/qwen2_vl/image_processing_pil_qwen2_vl.py"
_HF_VIDEO2 = "transformers@src/transformers/models/qwen2_vl/video_processing_qwen2_vl.py"
_HF_VIDEO3 = "transformers@src/transformers/models/qwen3_vl/video_processing_qwen3_vl.py"
_VLLM_LOADER = "vllm@vllm/frontend/processing/multimodal/video.py (qwen2_vl/qwen3_vl loaders)"

QWEN2_VL = Profile(
    name="qwen2-vl",
    description="Qwen2-VL (Qwen/Qwen2-VL-7B-Instruct) served by vLLM",
    image=Counter(
        id="qwen2-vl.image",
        version=1,
        params=QwenImageParams(),
        fn=qwen_image_units,
        source=(
            f"{_HF_IMAGE}; vllm@vllm/model_executor/models/qwen2_vl.py _get_prompt_updates; "
            "Qwen/Qwen2-VL-7B-Instruct preprocessor_config.json (4-16384 tokens)"
        ),
    ),
    video=Counter(
        id="qwen2-vl.video",
        version=1,
        params=QwenVideoParams(),
        fn=qwen_video_units,
        source=(
            f"{_HF_VIDEO2}; {_VLLM_LOADER}; vllm@vllm/model_executor/models/qwen2_vl.py; "
            "video bounds from preprocessor_config.json (no video config in the checkpoint)"
        ),
    ),
    aliases=("qwen2_vl", "Qwen/Qwen2-VL-7B-Instruct"),
)

QWEN25_VL = Profile(
    name="qwen2.5-vl",
    description="Qwen2.5-VL (Qwen/Qwen2.5-VL-7B-Instruct) served by vLLM",
    image=Counter(
        id="qwen2.5-vl.image",
        version=1,
        params=QwenImageParams(),
        fn=qwen_image_units,
        source=(
            f"{_HF_IMAGE}; vllm@vllm/model_executor/models/qwen2_5_vl.py; "
            "Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json"
        ),
    ),
    video=Counter(
        id="qwen2.5-vl.video",
        version=1,
        params=QwenVideoParams(),
        fn=qwen_video_units,
        source=(
            f"{_HF_VIDEO2}; {_VLLM_LOADER}; "
            "video bounds from preprocessor_config.json (no video config in the checkpoint)"
        ),
    ),
    aliases=("qwen2_5_vl", "Qwen/Qwen2.5-VL-7B-Instruct"),
)

QWEN3_VL = Profile(
    name="qwen3-vl",
    description="Qwen3-VL (Qwen/Qwen3-VL-8B-Instruct) served by vLLM",
    image=Counter(
        id="qwen3-vl.image",
        version=1,
        params=QwenImageParams(patch_size=16, min_pixels=65536, max_pixels=16777216),
        fn=qwen_image_units,
        source=(
            f"{_HF_IMAGE}; vllm@vllm/model_executor/models/qwen3_vl.py _get_prompt_updates; "
            "Qwen3-VL preprocessor_config.json size={shortest_edge: 65536, longest_edge: 16777216}"
        ),
    ),
    video=Counter(
        id="qwen3-vl.video",
        version=1,
        params=Qwen3VideoParams(),
        fn=qwen_video_units,
        source=(
            f"{_HF_VIDEO3}; transformers@src/transformers/models/qwen3_vl/processing_qwen3_vl.py; "
            f"{_VLLM_LOADER}; vllm@vllm/model_executor/models/qwen3_vl.py; Qwen3-VL "
            "video_preprocessor_config.json size={shortest_edge: 4096, longest_edge: 25165824}"
        ),
    ),
    aliases=("qwen3_vl", "Qwen/Qwen3-VL-8B-Instruct"),
)

PROFILES: tuple[Profile, ...] = (QWEN2_VL, QWEN25_VL, QWEN3_VL)
