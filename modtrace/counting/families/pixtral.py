"""Pixtral: one token per 16-px patch, a row break per row, as vLLM expands it.

An image whose long side exceeds 1024 px is scaled down (aspect kept); it is
then covered by ``rows = ceil(h/16)`` × ``cols = ceil(w/16)`` patches. The
prompt holds, per row, ``cols`` ``[IMG]`` tokens and an ``[IMG_BREAK]``, the
last break replaced by ``[IMG_END]``: ``rows × (cols + 1)`` tokens, all in
vLLM's placeholder range.

Two implementations differ in one detail, the rounding of the scaled size:

* ``mistralai/Pixtral-12B-2409`` served by vLLM with ``--tokenizer-mode
  mistral`` (the documented way) counts with mistral_common's
  ``ImageEncoder._image_to_num_tokens``: ``round()`` (banker's), at least 1.
* The transformers port (``mistral-community/pixtral-12b``, vLLM's LLaVA
  path) uses ``floor``; a side that floors to 0 px makes the processor fail.

The ``pixtral`` profile uses the first, ``pixtral-hf`` the second.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator

from ..profile import Counter, ImageInput, ImageUnits, Params, Profile, check_size

__all__ = [
    "PIXTRAL",
    "PIXTRAL_HF",
    "PROFILES",
    "PixtralImageParams",
    "pixtral_grid",
    "pixtral_image_units",
]


class PixtralImageParams(Params):
    """Pixtral parameters (``mistralai/Pixtral-12B-2409``: 1024 px, 16-px patches).

    ``patch_size`` also accepts the HF form ``{"height": 16, "width": 16}``.
    ``resize_rounding``: ``"round"`` (mistral_common) or ``"floor"`` (transformers).
    """

    longest_edge: int = Field(default=1024, gt=0)
    patch_size: int = Field(default=16, gt=0)
    spatial_merge_size: int = Field(default=1, gt=0)
    resize_rounding: Literal["round", "floor"] = "round"

    @field_validator("patch_size", mode="before")
    @classmethod
    def _patch_dict(cls, value: Any) -> Any:
        if isinstance(value, dict):
            height, width = value.get("height"), value.get("width")
            if height != width:
                msg = f"patch_size must be square, got {value}"
                raise ValueError(msg)
            return height
        return value


def pixtral_grid(width: int, height: int, p: PixtralImageParams) -> tuple[int, int]:
    """Token grid ``(rows, cols)`` of an image.

    Raises:
        ValueError: In ``"floor"`` mode when a side scales to 0 px (an aspect
            ratio beyond 1024:1 after downscaling), where transformers fails.
    """
    ratio = max(height / p.longest_edge, width / p.longest_edge)
    w: int = width
    h: int = height
    if ratio > 1:
        if p.resize_rounding == "round":
            # mistral_common: an extreme ratio would otherwise round a side to 0.
            w = max(round(width / ratio), 1)
            h = max(round(height / ratio), 1)
        else:
            w = math.floor(width / ratio)
            h = math.floor(height / ratio)
            if w == 0 or h == 0:
                msg = (
                    f"Pixtral (transformers) cannot resize {width}x{height}: a side "
                    f"scales to 0 px under longest_edge={p.longest_edge}"
                )
                raise ValueError(msg)
    unit = p.patch_size * p.spatial_merge_size
    return (h - 1) // unit + 1, (w - 1) // unit + 1


def pixtral_image_units(item: ImageInput, p: PixtralImageParams) -> ImageUnits:
    """Pixtral image units.

    ``tokens``: ``rows × (cols + 1)`` — ``cols`` ``[IMG]`` per row plus one
    ``[IMG_BREAK]`` per row, the last being ``[IMG_END]``. ``tiles``: None.
    """
    width, height = check_size(item.width, item.height)
    rows, cols = pixtral_grid(width, height, p)
    return ImageUnits(tokens=rows * (cols + 1))


_SOURCE = (
    "mistral_common@src/mistral_common/tokens/tokenizers/image.py "
    "(ImageEncoder._image_to_num_tokens, max(round(), 1)); "
    "vllm@vllm/model_executor/models/pixtral.py (get_replacement: "
    "([IMG]*ncols + [IMG_BREAK])*nrows, last -> [IMG_END]); "
    "transformers@src/transformers/models/pixtral/image_processing_pil_pixtral.py "
    "(get_resize_output_image_size, floor; longest_edge 1024, patch 16)"
)

PIXTRAL = Profile(
    name="pixtral",
    description=(
        "Pixtral 12B (reference mistralai/Pixtral-12B-2409, vLLM --tokenizer-mode mistral): "
        "long side capped at 1024 px, 16-px patches, rows × (cols + 1) tokens."
    ),
    image=Counter(
        id="pixtral.image",
        version=1,
        params=PixtralImageParams(),
        fn=pixtral_image_units,
        source=_SOURCE,
    ),
    aliases=("pixtral-12b", "Pixtral-12B-2409"),
)

PIXTRAL_HF = Profile(
    name="pixtral-hf",
    description=(
        "Pixtral 12B, transformers port (reference mistral-community/pixtral-12b): "
        "as pixtral, with the scaled size floored."
    ),
    image=Counter(
        id="pixtral-hf.image",
        version=1,
        params=PixtralImageParams(resize_rounding="floor"),
        fn=pixtral_image_units,
        source=_SOURCE,
    ),
    aliases=("pixtral-12b-hf",),
)

PROFILES: tuple[Profile, ...] = (PIXTRAL, PIXTRAL_HF)
