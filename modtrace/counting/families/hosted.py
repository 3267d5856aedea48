"""Hosted APIs: OpenAI, Anthropic Claude and Google Gemini, from their documentation.

No code of these services can be run: the formulas follow the providers'
published rules and reproduce their worked examples. They estimate the
input tokens billed for each item; the response's ``usage`` stays the
authority.

* ``openai``: the 512-px tile formula of GPT-4o-class models,
  ``base + tile * tiles`` with ``detail`` low/high/auto, or (``method=
  "patch"``) the 32-px patch formula of gpt-4.1-mini/nano and o4-mini.
  :data:`OPENAI_MODEL_PARAMS` holds the per-model parameter sets.
* ``claude``: ``width * height / 750`` after Claude's downscaling to its
  native resolution, or (``method="patch"``) the 28-px visual tokens the
  current vision guide describes.
* ``gemini``: 258 tokens per image up to 384x384, else per 768x768 tile;
  video 263 tokens per second; audio 32 tokens per second.
"""

from __future__ import annotations

import math
from typing import Any, Literal

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
    check_size,
)
from ..safe import safe_name

__all__ = [
    "CLAUDE",
    "GEMINI",
    "OPENAI",
    "OPENAI_MODEL_PARAMS",
    "PROFILES",
    "ClaudeImageParams",
    "GeminiAudioParams",
    "GeminiImageParams",
    "GeminiVideoParams",
    "OpenAIImageParams",
    "claude_image_units",
    "claude_native_size",
    "gemini_audio_units",
    "gemini_image_units",
    "gemini_video_units",
    "openai_image_units",
    "openai_params_for",
    "openai_patch_count",
    "openai_tile_count",
]


def _squares(width: float, height: float, side: int) -> int:
    """Squares of ``side`` px covering a ``width x height`` image (tiles, patches)."""
    return math.ceil(width / side) * math.ceil(height / side)


# --- OpenAI ------------------------------------------------------------------
def openai_tile_count(width: int, height: int, max_side: int, short_side: int, tile: int) -> int:
    """512-px tiles of a ``detail: high`` image (OpenAI vision guide).

    The image is scaled (down only) to fit a ``max_side`` square, then so
    that its short side is at most ``short_side``; it is then covered with
    ``tile x tile`` squares. Scaled sizes are truncated to whole pixels
    (the guide gives no rounding; this is the common implementation).
    """
    w, h = width, height
    if w > max_side or h > max_side:
        aspect = w / h
        w, h = (
            (max_side, int(max_side / aspect)) if aspect > 1 else (int(max_side * aspect), max_side)
        )
    if w >= h and h > short_side:
        w, h = int(short_side / h * w), short_side
    elif h > w and w > short_side:
        w, h = short_side, int(short_side / w * h)
    # A sliver truncated to 0 px still occupies one tile row/column.
    w, h = max(w, 1), max(h, 1)
    return _squares(w, h, tile)


def openai_patch_count(width: int, height: int, patch: int, max_patches: int) -> int:
    """32-px patches of an image for the patch-billed models (OpenAI vision guide).

    ``ceil(w/32) * ceil(h/32)``; above ``max_patches`` the image is scaled
    by ``sqrt(32**2 * max_patches / (w * h))``, shrunk again so a whole
    number of patches fits the width or height, then counted again and
    capped at ``max_patches``.
    """
    patches = _squares(width, height, patch)
    if patches <= max_patches:
        return patches
    shrink = math.sqrt(patch * patch * max_patches / (width * height))
    w_fit = width * shrink / patch
    h_fit = height * shrink / patch
    shrink *= min(math.floor(w_fit) / w_fit, math.floor(h_fit) / h_fit)
    w, h = int(width * shrink), int(height * shrink)
    return min(_squares(w, h, patch), max_patches)


class OpenAIImageParams(Params):
    """OpenAI image costing. Defaults: GPT-4o / GPT-4.1 (85 + 170 per tile).

    Attributes:
        method: ``tile`` (base + per 512-px tile) or ``patch`` (32-px patches
            times ``patch_multiplier``; ``detail`` does not apply).
        detail: Detail used when the request part carries none;
            ``auto`` resolves to ``auto_detail``.
        auto_detail: What ``auto`` means; OpenAI lets the model choose, and
            ``high`` is the documented cost ceiling.
        base_tokens: Tokens of every image (``low`` costs only this).
        tile_tokens: Tokens per 512-px tile at ``high``.
        tile_size: Tile side in pixels.
        max_side: Side of the square a ``high`` image is first fitted into.
        short_side: Short side a ``high`` image is then scaled down to.
        patch_size: Patch side for ``patch``.
        max_patches: Patch cap for ``patch``.
        patch_multiplier: Tokens per patch for ``patch`` (1.62 for gpt-4.1-mini...).
    """

    method: Literal["tile", "patch"] = "tile"
    detail: Literal["auto", "low", "high"] = "auto"
    auto_detail: Literal["low", "high"] = "high"
    base_tokens: NonNegativeInt = 85
    tile_tokens: NonNegativeInt = 170
    tile_size: PositiveInt = 512
    max_side: PositiveInt = 2048
    short_side: PositiveInt = 768
    patch_size: PositiveInt = 32
    max_patches: PositiveInt = 1536
    patch_multiplier: PositiveFloat = 1.0


#: Parameter sets per model family (prefix of the model name, longest match wins).
OPENAI_MODEL_PARAMS: dict[str, dict[str, Any]] = {
    "gpt-4o": {"method": "tile", "base_tokens": 85, "tile_tokens": 170},
    "gpt-4o-mini": {"method": "tile", "base_tokens": 2833, "tile_tokens": 5667},
    "gpt-4.1": {"method": "tile", "base_tokens": 85, "tile_tokens": 170},
    "gpt-4.5": {"method": "tile", "base_tokens": 85, "tile_tokens": 170},
    "o1": {"method": "tile", "base_tokens": 75, "tile_tokens": 150},
    "o3": {"method": "tile", "base_tokens": 75, "tile_tokens": 150},
    "gpt-4.1-mini": {"method": "patch", "patch_multiplier": 1.62},
    "gpt-4.1-nano": {"method": "patch", "patch_multiplier": 2.46},
    "o4-mini": {"method": "patch", "patch_multiplier": 1.72},
}


def openai_params_for(model: str) -> dict[str, Any]:
    """The parameter overrides for ``model`` (``{}`` when no family matches).

    >>> openai_params_for("gpt-4.1-mini-2025-04-14")["patch_multiplier"]
    1.62
    """
    matches = [prefix for prefix in OPENAI_MODEL_PARAMS if model.startswith(prefix)]
    if not matches:
        return {}
    return dict(OPENAI_MODEL_PARAMS[max(matches, key=len)])


def openai_image_units(item: ImageInput, p: OpenAIImageParams) -> ImageUnits:
    """Input tokens of one image for OpenAI.

    ``tile``: ``low`` -> ``base_tokens`` (no tiles); ``high`` ->
    ``base_tokens + tile_tokens * tiles``. ``patch``: ``ceil(patches *
    patch_multiplier)`` (the rounding of the product is not documented).

    Raises:
        ValueError: An unknown ``detail`` on the item, or a side below 1 px.
    """
    check_size(item.width, item.height)
    if p.method == "patch":
        patches = openai_patch_count(item.width, item.height, p.patch_size, p.max_patches)
        return ImageUnits(tokens=math.ceil(patches * p.patch_multiplier))
    detail = item.detail or p.detail
    if detail not in ("auto", "low", "high"):
        msg = f"detail must be 'auto', 'low' or 'high', got {safe_name(detail)}"
        raise ValueError(msg)
    if detail == "auto":
        detail = p.auto_detail
    if detail == "low":
        return ImageUnits(tokens=p.base_tokens, tiles=0)
    tiles = openai_tile_count(item.width, item.height, p.max_side, p.short_side, p.tile_size)
    return ImageUnits(tokens=p.base_tokens + p.tile_tokens * tiles, tiles=tiles)


# --- Anthropic Claude --------------------------------------------------------
def claude_native_size(
    width: int, height: int, max_long_edge: int, max_visual_tokens: int, patch: int
) -> tuple[int, int]:
    """The size Claude processes an image at.

    An image whose long edge is at most ``max_long_edge`` and that covers at
    most ``max_visual_tokens`` patches of ``patch`` pixels is kept; a larger
    one is scaled down to the largest size that preserves its aspect ratio
    (short side rounded to the nearest pixel) and fits both limits.
    """
    if max(width, height) <= max_long_edge and _squares(width, height, patch) <= max_visual_tokens:
        return width, height
    long_side, short_side = max(width, height), min(width, height)
    for side in range(min(long_side, max_long_edge), 0, -1):
        short = max(1, round(short_side * side / long_side))
        if _squares(side, short, patch) <= max_visual_tokens:
            return (side, short) if width >= height else (short, side)
    return (1, 1)


class ClaudeImageParams(Params):
    """Claude image costing (Claude 3 / 4 vision guide).

    Attributes:
        method: ``area`` (``ceil(w * h / 750)``, the long-documented
            estimate) or ``patch`` (``ceil(w/28) * ceil(h/28)`` visual tokens,
            the current guide's exact count).
        pixels_per_token: Divisor of ``area``.
        patch_size: Visual-token side in pixels.
        max_long_edge: Longest edge kept without resizing (1568; Opus 4.7: 2576).
        max_visual_tokens: Most 28-px patches kept without resizing (1568: the
            documented largest unresized sizes, 1092x1092 ... 784x1568, all
            fit it and are maximal under it).
        max_image_side: Largest side the API accepts (8000; 2000 when a
            request carries more than 20 images).
    """

    method: Literal["area", "patch"] = "area"
    pixels_per_token: PositiveInt = 750
    patch_size: PositiveInt = 28
    max_long_edge: PositiveInt = 1568
    max_visual_tokens: PositiveInt = 1568
    max_image_side: PositiveInt = 8000


def claude_image_units(item: ImageInput, p: ClaudeImageParams) -> ImageUnits:
    """Input tokens of one image for Claude, after its downscaling.

    Raises:
        ValueError: A side below 1 px, or above ``max_image_side`` (the API
            rejects such an image).
    """
    check_size(item.width, item.height)
    if max(item.width, item.height) > p.max_image_side:
        msg = (
            f"image {item.width}x{item.height} exceeds Claude's limit of "
            f"{p.max_image_side}x{p.max_image_side} px"
        )
        raise ValueError(msg)
    w, h = claude_native_size(
        item.width, item.height, p.max_long_edge, p.max_visual_tokens, p.patch_size
    )
    if p.method == "patch":
        return ImageUnits(tokens=_squares(w, h, p.patch_size))
    return ImageUnits(tokens=math.ceil(w * h / p.pixels_per_token))


# --- Google Gemini -----------------------------------------------------------
class GeminiImageParams(Params):
    """Gemini 2.x image costing.

    Attributes:
        tokens_per_tile: Tokens of a small image or of one tile.
        small_side: Images with both sides at most this cost one tile.
        tile_size: Side of the tiles larger images are cropped and scaled into.
    """

    tokens_per_tile: PositiveInt = 258
    small_side: PositiveInt = 384
    tile_size: PositiveInt = 768


class GeminiVideoParams(Params):
    """Gemini video costing.

    Attributes:
        tokens_per_second: Documented fixed rate (frames and audio track together).
        frames_per_second: Gemini's sampling rate, for the frame count.
        tokens_per_frame: When set, tokens are ``frames * tokens_per_frame``
            instead (e.g. 258 per frame, or a ``media_resolution`` level).
    """

    tokens_per_second: PositiveFloat = 263.0
    frames_per_second: PositiveFloat = 1.0
    tokens_per_frame: PositiveInt | None = None


class GeminiAudioParams(Params):
    """Gemini audio costing: ``tokens_per_second`` (32)."""

    tokens_per_second: PositiveFloat = 32.0


def gemini_image_units(item: ImageInput, p: GeminiImageParams) -> ImageUnits:
    """Input tokens of one image for Gemini.

    Both sides <= 384: one tile of 258 tokens. Larger: 258 per 768x768
    tile, ``ceil(w/768) * ceil(h/768)`` tiles (the exact crop-and-scale rule
    is not documented).

    Raises:
        ValueError: A side below 1 px.
    """
    check_size(item.width, item.height)
    if item.width <= p.small_side and item.height <= p.small_side:
        tiles = 1
    else:
        tiles = _squares(item.width, item.height, p.tile_size)
    return ImageUnits(tokens=tiles * p.tokens_per_tile, tiles=tiles)


def _check_seconds(seconds: float) -> None:
    if not seconds > 0:
        msg = f"duration must be positive, got {seconds!r} s"
        raise ValueError(msg)


def gemini_video_units(item: VideoInput, p: GeminiVideoParams) -> VideoUnits:
    """Frames (sampled at 1 fps, at least 1) and input tokens of one video.

    Raises:
        ValueError: A non-positive duration.
    """
    _check_seconds(item.seconds)
    frames = max(1, math.floor(item.seconds * p.frames_per_second))
    if p.tokens_per_frame is not None:
        return VideoUnits(frames=frames, tokens=frames * p.tokens_per_frame)
    return VideoUnits(frames=frames, tokens=math.ceil(item.seconds * p.tokens_per_second))


def gemini_audio_units(item: AudioInput, p: GeminiAudioParams) -> AudioUnits:
    """Input tokens of one audio clip: ``ceil(seconds * 32)``; one frame per token.

    Raises:
        ValueError: A non-positive duration.
    """
    _check_seconds(item.seconds)
    tokens = math.ceil(item.seconds * p.tokens_per_second)
    return AudioUnits(frames=tokens, tokens=tokens)


# --- Profiles ----------------------------------------------------------------
_OPENAI_DOC = "platform.openai.com/docs/guides/images-vision (calculating costs)"
_CLAUDE_DOC = "platform.claude.com/docs/en/build-with-claude/vision (evaluate image size)"
_GEMINI_DOC = "ai.google.dev/gemini-api/docs/tokens (multimodal tokens)"

OPENAI = Profile(
    name="openai",
    description="OpenAI vision pricing (GPT-4o-class tiles; patch models via params)",
    image=Counter(
        id="openai.image",
        version=1,
        params=OpenAIImageParams(),
        fn=openai_image_units,
        source=_OPENAI_DOC,
    ),
    aliases=("gpt-4o", "gpt-4.1"),
    model_params=openai_params_for,
)

CLAUDE = Profile(
    name="claude",
    description="Anthropic Claude vision pricing (w*h/750 after downscaling to 1568 px)",
    image=Counter(
        id="claude.image",
        version=1,
        params=ClaudeImageParams(),
        fn=claude_image_units,
        source=_CLAUDE_DOC,
    ),
    aliases=("anthropic",),
)

GEMINI = Profile(
    name="gemini",
    description="Google Gemini 2.x pricing (258-token tiles, 263 tok/s video, 32 tok/s audio)",
    image=Counter(
        id="gemini.image",
        version=1,
        params=GeminiImageParams(),
        fn=gemini_image_units,
        source=_GEMINI_DOC,
    ),
    audio=Counter(
        id="gemini.audio",
        version=1,
        params=GeminiAudioParams(),
        fn=gemini_audio_units,
        source=_GEMINI_DOC,
    ),
    video=Counter(
        id="gemini.video",
        version=1,
        params=GeminiVideoParams(),
        fn=gemini_video_units,
        source=_GEMINI_DOC,
    ),
    aliases=("google",),
)

PROFILES: tuple[Profile, ...] = (OPENAI, CLAUDE, GEMINI)
