"""LLaVA-1.5 and LLaVA-NeXT (v1.6 "anyres"): image tokens as vLLM expands them.

vLLM replaces each ``<image>`` with exactly the number of image features
(``PromptReplacement`` of ``[image_token_id] * n``): there are no start/end
markers, so the placeholder range is the feature count. LLaVA-NeXT features
are the tiled grid with padding rows/columns removed, one newline embedding
per remaining row, and the base (whole-image) view.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from ..profile import Counter, ImageInput, ImageUnits, Params, Profile, check_size

__all__ = [
    "LLAVA15",
    "LLAVA_NEXT",
    "LLAVA_NEXT_PINPOINTS",
    "PROFILES",
    "LlavaImageParams",
    "LlavaNextImageParams",
    "llava_image_units",
    "llava_next_grid",
    "llava_next_image_units",
    "llava_next_unpadded_features",
    "select_best_resolution",
]

#: ``image_grid_pinpoints`` of the llava-hf v1.6 checkpoints, as (height, width).
LLAVA_NEXT_PINPOINTS: tuple[tuple[int, int], ...] = (
    (336, 672),
    (672, 336),
    (672, 672),
    (1008, 336),
    (336, 1008),
)


def _base_features(image_size: int, patch_size: int, strategy: str) -> int:
    # CLIP emits a CLS token besides the patch grid; "default" drops it.
    features = (image_size // patch_size) ** 2 + 1
    return features - 1 if strategy == "default" else features


class LlavaImageParams(Params):
    """LLaVA-1.5 parameters (``llava-hf/llava-1.5-7b-hf``: CLIP ViT-L/14 at 336 px)."""

    image_size: int = Field(default=336, gt=0)
    patch_size: int = Field(default=14, gt=0)
    vision_feature_select_strategy: Literal["default", "full"] = "default"


def llava_image_units(item: ImageInput, p: LlavaImageParams) -> ImageUnits:
    """LLaVA-1.5 image units.

    ``tokens``: ``(image_size / patch_size)²`` = 576 ``<image>`` tokens,
    whatever the size (the image is resized and center-cropped to 336×336);
    577 with the ``"full"`` strategy (CLS kept). ``tiles``: None.
    """
    check_size(item.width, item.height)
    return ImageUnits(
        tokens=_base_features(p.image_size, p.patch_size, p.vision_feature_select_strategy)
    )


LLAVA15 = Profile(
    name="llava-1.5",
    description="LLaVA-1.5 (reference llava-hf/llava-1.5-7b-hf): 576 tokens per image.",
    image=Counter(
        id="llava-1.5.image",
        version=1,
        params=LlavaImageParams(),
        fn=llava_image_units,
        source=(
            "transformers@src/transformers/models/llava/processing_llava.py "
            "(replace_image_token); vllm@vllm/model_executor/models/llava.py "
            "(get_num_image_tokens: CLIP 336/14, strategy 'default')"
        ),
    ),
    aliases=("llava", "llava-1.5-hf"),
)


class LlavaNextImageParams(Params):
    """LLaVA-NeXT parameters (``llava-hf/llava-v1.6-mistral-7b-hf``).

    ``image_grid_pinpoints`` accepts ``[[h, w], ...]`` as in the HF config.
    """

    image_size: int = Field(default=336, gt=0)
    patch_size: int = Field(default=14, gt=0)
    vision_feature_select_strategy: Literal["default", "full"] = "default"
    image_grid_pinpoints: tuple[tuple[int, int], ...] = LLAVA_NEXT_PINPOINTS

    @field_validator("image_grid_pinpoints")
    @classmethod
    def _pinpoints(cls, value: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
        if not value:
            msg = "image_grid_pinpoints must not be empty"
            raise ValueError(msg)
        for height, width in value:
            if height < 1 or width < 1:
                msg = f"image_grid_pinpoints must be positive (height, width) pairs, got {value}"
                raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _divisible(self) -> LlavaNextImageParams:
        if self.image_size % self.patch_size:
            msg = f"image_size {self.image_size} must be a multiple of patch_size"
            raise ValueError(msg)
        for height, width in self.image_grid_pinpoints:
            if height % self.image_size or width % self.image_size:
                msg = f"grid pinpoint {height}x{width} is not a multiple of {self.image_size}"
                raise ValueError(msg)
        return self


def select_best_resolution(
    height: int, width: int, pinpoints: tuple[tuple[int, int], ...]
) -> tuple[int, int]:
    """The pinpoint ``(height, width)`` LLaVA-NeXT resizes an image into.

    Follows transformers' ``select_best_resolution``: the most effective
    pixels after an aspect-preserving downscale (``int()`` truncation), ties
    to the least wasted area. When every fit truncates to zero pixels (e.g.
    1×20000) the least wasted pinpoint wins, as in transformers.
    """
    best = pinpoints[0]
    max_effective = 0
    min_wasted = float("inf")
    for pin_h, pin_w in pinpoints:
        scale = min(pin_w / width, pin_h / height)
        down_w, down_h = int(width * scale), int(height * scale)
        effective = min(down_w * down_h, width * height)
        wasted = pin_w * pin_h - effective
        if effective > max_effective or (effective == max_effective and wasted < min_wasted):
            max_effective = effective
            min_wasted = wasted
            best = (pin_h, pin_w)
    return best


def llava_next_grid(width: int, height: int, p: LlavaNextImageParams) -> tuple[int, int]:
    """Tiles ``(rows, columns)`` of the anyres grid for an image."""
    best_h, best_w = select_best_resolution(height, width, p.image_grid_pinpoints)
    return best_h // p.image_size, best_w // p.image_size


def llava_next_unpadded_features(
    width: int, height: int, rows: int, cols: int, patches_per_side: int
) -> tuple[int, int]:
    """``(unpadded features, newline features)`` of the tiled view.

    The grid of ``rows × cols`` tiles of ``patches_per_side²`` features is
    cropped back to the image's aspect ratio (padding removed symmetrically,
    ``int(round(x, 7))`` as transformers does); each remaining feature row
    gets one newline.
    """
    current_h = patches_per_side * rows
    current_w = patches_per_side * cols
    if width / height > current_w / current_h:
        new_h = int(round(height * (current_w / width), 7))
        current_h -= 2 * ((current_h - new_h) // 2)
    else:
        new_w = int(round(width * (current_h / height), 7))
        current_w -= 2 * ((current_w - new_w) // 2)
    return current_h * current_w, current_h


def llava_next_image_units(item: ImageInput, p: LlavaNextImageParams) -> ImageUnits:
    """LLaVA-NeXT image units.

    ``tokens``: unpadded grid features + one newline per feature row + the
    base view ``(336/14)²`` = 576 (CLS dropped by the "default" strategy);
    all ``<image>`` tokens, nothing else in vLLM's placeholder range.
    ``tiles``: grid tiles + 1 base tile.
    """
    width, height = check_size(item.width, item.height)
    rows, cols = llava_next_grid(width, height, p)
    unpadded, newlines = llava_next_unpadded_features(
        width, height, rows, cols, p.image_size // p.patch_size
    )
    base = _base_features(p.image_size, p.patch_size, p.vision_feature_select_strategy)
    return ImageUnits(tokens=unpadded + newlines + base, tiles=rows * cols + 1)


LLAVA_NEXT = Profile(
    name="llava-next",
    description=(
        "LLaVA-NeXT / v1.6 (reference llava-hf/llava-v1.6-mistral-7b-hf): anyres grid "
        "over 336-px tiles with unpadding, row newlines and a 576-token base view."
    ),
    image=Counter(
        id="llava-next.image",
        version=1,
        params=LlavaNextImageParams(),
        fn=llava_next_image_units,
        source=(
            "transformers@src/transformers/models/llava_next/processing_llava_next.py "
            "(_get_number_of_features, _get_unpadded_features); "
            "transformers@src/transformers/image_processing_utils.py (select_best_resolution); "
            "transformers@src/transformers/models/llava_next/convert_llava_next_weights_to_hf.py "
            "(pinpoints = LlavaNextImageProcessor defaults); "
            "vllm@vllm/model_executor/models/llava_next.py (get_num_image_tokens)"
        ),
    ),
    aliases=("llava_next", "llava-v1.6"),
)

PROFILES: tuple[Profile, ...] = (LLAVA15, LLAVA_NEXT)
