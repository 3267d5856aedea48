"""InternVL 2.5 / 3 (OpenGVLab checkpoints): dynamic 448-px tiling, as vLLM counts it.

An image is split into ``i × j`` tiles of 448 px, the grid whose aspect
ratio is closest to the image's among those with ``min_dynamic_patch ≤ i·j ≤
max_dynamic_patch``, plus a 448-px thumbnail of the whole image when the grid
has more than one tile. Each tile gives ``(448/14)² × 0.5²`` = 256 tokens.

vLLM (``internvl.py``) replaces ``<image>`` with ``<img>`` + tokens ×
``<IMG_CONTEXT>`` + ``</img>`` and records the whole replacement as the
placeholder range (``PromptUpdateDetails.select_text``), so the two markers
count. Video frames are single 448-px tiles, each written as
``"Frame{i}: <img>" + 256 × <video token> + "</img>"``.
"""

from __future__ import annotations

from pydantic import Field, model_validator

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
from .tiling import closest_aspect_ratio
from .video_loader import check_num_frames, vllm_video_frame_count

__all__ = [
    "INTERNVL",
    "PROFILES",
    "InternVLImageParams",
    "InternVLVideoParams",
    "frame_prefix_digits",
    "internvl_blocks",
    "internvl_image_units",
    "internvl_target_ratios",
    "internvl_tokens_per_tile",
    "internvl_video_units",
]

# "<img>" and "</img>" are single special tokens in the InternVL tokenizers.
_MARKER_TOKENS = 2


class InternVLImageParams(Params):
    """InternVL image parameters (``OpenGVLab/InternVL3-1B`` config.json).

    Field names follow the config keys vLLM reads and the request kwargs it
    accepts (``max_dynamic_patch``, ``min_dynamic_patch``, ``dynamic_image_size``).
    """

    image_size: int = Field(default=448, gt=0)
    patch_size: int = Field(default=14, gt=0)
    downsample_ratio: float = Field(default=0.5, gt=0)
    min_dynamic_patch: int = Field(default=1, gt=0)
    max_dynamic_patch: int = Field(default=12, gt=0)
    dynamic_image_size: bool = True
    use_thumbnail: bool = True

    @model_validator(mode="after")
    def _ordered(self) -> InternVLImageParams:
        if self.min_dynamic_patch > self.max_dynamic_patch:
            msg = (
                f"min_dynamic_patch ({self.min_dynamic_patch}) must not exceed "
                f"max_dynamic_patch ({self.max_dynamic_patch})"
            )
            raise ValueError(msg)
        return self


def internvl_tokens_per_tile(image_size: int, patch_size: int, downsample_ratio: float) -> int:
    """Tokens per 448-px tile: ``int((image_size // patch_size)² × ratio²)``."""
    return int((image_size // patch_size) ** 2 * downsample_ratio**2)


def internvl_target_ratios(min_num: int, max_num: int) -> list[tuple[int, int]]:
    """Candidate grids ``(columns, rows)``, ordered by tile count.

    Built as vLLM builds it (a set, then a stable sort by ``i·j``), so grids
    with the same tile count keep vLLM's order, which decides exact ties.
    """
    ratios = {
        (i, j)
        for n in range(min_num, max_num + 1)
        for i in range(1, n + 1)
        for j in range(1, n + 1)
        if min_num <= i * j <= max_num
    }
    return sorted(ratios, key=lambda r: r[0] * r[1])


def internvl_blocks(width: int, height: int, p: InternVLImageParams) -> int:
    """Tiles the vision encoder sees for an image, thumbnail included."""
    if p.dynamic_image_size:
        min_num, max_num = p.min_dynamic_patch, p.max_dynamic_patch
    else:
        min_num = max_num = 1
    cols, rows = closest_aspect_ratio(
        width, height, internvl_target_ratios(min_num, max_num), p.image_size
    )
    blocks = cols * rows
    if p.use_thumbnail and blocks != 1:
        blocks += 1
    return blocks


def internvl_image_units(item: ImageInput, p: InternVLImageParams) -> ImageUnits:
    """InternVL image units.

    ``tokens``: ``<img>`` + tiles × 256 ``<IMG_CONTEXT>`` + ``</img>``.
    ``tiles``: grid tiles plus the thumbnail (when the grid has more than one).
    """
    width, height = check_size(item.width, item.height)
    blocks = internvl_blocks(width, height, p)
    per_tile = internvl_tokens_per_tile(p.image_size, p.patch_size, p.downsample_ratio)
    return ImageUnits(tokens=blocks * per_tile + _MARKER_TOKENS, tiles=blocks)


class InternVLVideoParams(Params):
    """InternVL video parameters.

    ``num_frames`` and ``loader_fps``: vLLM's ``media_io_kwargs.video``
    ``num_frames`` (32; -1 keeps every frame) and ``fps`` (unset).
    ``frame_prefix_tokens``: text tokens of ``"Frame1: "`` with a one-digit
    index, counted as 3 (``Frame``, ``1``, ``:``) + 1 (the space) with the
    Qwen2 tokenizer of InternVL3, which splits digits: each extra digit adds
    one. UNVERIFIED: no InternVL tokenizer could be run here.
    """

    image_size: int = Field(default=448, gt=0)
    patch_size: int = Field(default=14, gt=0)
    downsample_ratio: float = Field(default=0.5, gt=0)
    num_frames: int = 32
    loader_fps: float | None = Field(default=None, ge=0)
    frame_prefix_tokens: int = Field(default=4, ge=0)

    @model_validator(mode="after")
    def _frames(self) -> InternVLVideoParams:
        check_num_frames(self.num_frames)
        return self


def frame_prefix_digits(frames: int) -> int:
    """Extra digits of ``"Frame{i}: "`` for ``i = 1..frames``: ``sum(len(str(i)) - 1)``.

    Arithmetic per decade (``10**k .. 10**(k+1) - 1`` have ``k`` extra
    digits), never a loop over the frames.
    """
    total, k, low = 0, 0, 1
    while low <= frames:
        high = min(frames, 10 * low - 1)
        total += k * (high - low + 1)
        k, low = k + 1, 10 * low
    return total


def internvl_video_units(item: VideoInput, p: InternVLVideoParams) -> VideoUnits:
    """InternVL video units (InternVL3 checkpoints, whose Qwen2 LLM has a video token).

    ``frames``: ``min(num_frames, round(seconds × fps))``, vLLM's uniform
    loader (:func:`~.video_loader.vllm_video_frame_count`).
    ``tokens``: per frame ``"Frame{i}: "`` + ``<img>`` + 256 video tokens +
    ``</img>``; the prefix is ``frame_prefix_tokens`` plus one per extra
    digit of ``i``.

    Raises:
        ValueError: A bad duration, rate or size, or frame counts past the
            caps of :func:`~.video_loader.vllm_video_frame_count`.
    """
    check_size(item.width, item.height)
    frames = vllm_video_frame_count(item.seconds, item.fps, p.num_frames, p.loader_fps)
    per_tile = internvl_tokens_per_tile(p.image_size, p.patch_size, p.downsample_ratio)
    digits = frame_prefix_digits(frames)
    tokens = frames * (per_tile + _MARKER_TOKENS + p.frame_prefix_tokens) + digits
    return VideoUnits(frames=frames, tokens=tokens)


INTERNVL = Profile(
    name="internvl",
    description=(
        "InternVL 2.5 / 3 (reference OpenGVLab/InternVL3-1B): dynamic 448-px tiling "
        "up to 12 tiles plus a thumbnail, 256 tokens per tile, <img>/</img> markers."
    ),
    image=Counter(
        id="internvl.image",
        version=1,
        params=InternVLImageParams(),
        fn=internvl_image_units,
        source=(
            "vllm@vllm/model_executor/models/internvl.py (get_internvl_target_ratios, "
            "find_closest_aspect_ratio, calculate_internvl_targets, get_image_repl); "
            "OpenGVLab/InternVL3-1B config (printed in "
            "shivangjhalani/multicoco@InternVL3-1B_data.md): max_dynamic_patch 12, "
            "min_dynamic_patch 1, use_thumbnail, force_image_size 448, downsample_ratio 0.5; "
            "transformers@src/transformers/models/got_ocr2/image_processing_pil_got_ocr2.py"
        ),
    ),
    video=Counter(
        id="internvl.video",
        version=1,
        params=InternVLVideoParams(),
        fn=internvl_video_units,
        source=(
            "vllm@vllm/model_executor/models/internvl.py (get_video_repl, "
            "video frames at max_dynamic_patch=1)"
        ),
    ),
    aliases=("internvl_chat", "internvl2.5", "internvl3"),
)

PROFILES: tuple[Profile, ...] = (INTERNVL,)
