"""Phi-3.5-vision and Phi-4-multimodal: image and audio units as vLLM expands them.

Both models replace their ``<|image_N|>`` / ``<|audio_N|>`` tag with exactly
``n`` placeholder tokens in vLLM (``[token_id] * n``), so the placeholder
range is the embedding count: separators and newline embeddings are inside
``n``, and there are no extra markers.

Phi-4-multimodal audio is resampled by vLLM to 16 kHz with the "scipy"
backend, which its ``_get_data_parser`` pins (``resample_poly``: ``ceil(N *
16000 / R)`` samples on gcd-reduced integer rates); the length comes from the
shared :func:`~modtrace.counting.families.audio_common.samples_at_rate`.
"""

from __future__ import annotations

import math

from pydantic import Field

from ..profile import (
    AudioInput,
    AudioUnits,
    Counter,
    ImageInput,
    ImageUnits,
    Params,
    Profile,
    check_size,
)
from .audio_common import ResampleMethod, samples_at_rate
from .numerics import ceil_div
from .tiling import closest_aspect_ratio

__all__ = [
    "PHI4_MULTIMODAL",
    "PHI35_VISION",
    "PROFILES",
    "Phi3VImageParams",
    "Phi4AudioParams",
    "Phi4ImageParams",
    "phi3v_hd_size",
    "phi3v_image_units",
    "phi4_audio_frames",
    "phi4_audio_units",
    "phi4_image_grid",
    "phi4_image_tokens",
    "phi4_image_units",
]


# --- Phi-3.5-vision -----------------------------------------------------------
_PHI3V_CROP = 336


class Phi3VImageParams(Params):
    """Phi-3.5-vision parameters (``microsoft/Phi-3.5-vision-instruct``: ``num_crops=4``)."""

    num_crops: int = Field(default=4, gt=0)


def phi3v_hd_size(width: int, height: int, num_crops: int) -> tuple[int, int]:
    """``(width, height)`` of the padded HD image Phi-3.5-vision tiles into 336-px crops.

    Follows ``calc_hd_transform_size`` of the checkpoint's image processor:
    lay the image landscape, take the largest ``scale`` with
    ``scale * ceil(scale / ratio) <= num_crops``, resize to ``scale × 336`` wide
    and pad the height up to a multiple of 336.

    Raises:
        ValueError: When the short side scales to 0 px (aspect ratio beyond
            ``336 × scale``), where the processor's resize fails.
    """
    transposed = width < height
    if transposed:
        width, height = height, width
    ratio = width / height
    scale = 1
    while scale * math.ceil(scale / ratio) <= num_crops:
        scale += 1
    scale -= 1
    new_w = int(scale * _PHI3V_CROP)
    new_h = int(new_w / ratio)
    if new_h == 0:
        msg = (
            f"Phi-3.5-vision cannot resize {width}x{height}: the short side scales to 0 px "
            f"at {new_w} px wide (aspect ratio above {new_w}:1)"
        )
        raise ValueError(msg)
    padded_h = math.ceil(new_h / _PHI3V_CROP) * _PHI3V_CROP
    return (padded_h, new_w) if transposed else (new_w, padded_h)


def phi3v_image_units(item: ImageInput, p: Phi3VImageParams) -> ImageUnits:
    """Phi-3.5-vision image units.

    ``tokens``: ``(rows·cols + 1) × 144 + 1 + (rows + 1) × 12`` — 144 per
    336-px crop and for the global view, one separator, and 12 newline
    embeddings per crop row and for the global view. ``tiles``: crops + 1
    (the global view).
    """
    width, height = check_size(item.width, item.height)
    hd_w, hd_h = phi3v_hd_size(width, height, p.num_crops)
    rows, cols = hd_h // _PHI3V_CROP, hd_w // _PHI3V_CROP
    tokens = (rows * cols + 1) * 144 + 1 + (rows + 1) * 12
    return ImageUnits(tokens=tokens, tiles=rows * cols + 1)


PHI35_VISION = Profile(
    name="phi-3.5-vision",
    description=(
        "Phi-3.5-vision (reference microsoft/Phi-3.5-vision-instruct): HD transform "
        "into up to num_crops (default 4) 336-px crops plus a global view."
    ),
    image=Counter(
        id="phi-3.5-vision.image",
        version=1,
        params=Phi3VImageParams(),
        fn=phi3v_image_units,
        source=(
            "microsoft/Phi-3.5-vision-instruct image_processing_phi3_v.py "
            "(calc_hd_transform_size, calc_num_image_tokens_from_image_size); "
            "vllm@vllm/model_executor/models/phi3v.py (get_num_image_tokens); "
            "vllm@tests/models/multimodal/processing/test_phi3v.py (default num_crops 4: "
            "757 tokens, 1921 at num_crops 16)"
        ),
    ),
    aliases=("phi3_v", "phi-3-vision"),
)


# --- Phi-4-multimodal: image ----------------------------------------------------
class Phi4ImageParams(Params):
    """Phi-4-multimodal image parameters (``microsoft/Phi-4-multimodal-instruct``).

    ``dynamic_hd``: most HD crops per image (36). SigLIP at 448 px with
    14-px patches and 2×2 token compression.
    """

    dynamic_hd: int = Field(default=36, gt=0)
    crop_size: int = Field(default=448, gt=0)
    patch_size: int = Field(default=14, gt=0)
    token_compression_factor: int = Field(default=2, gt=0)


def phi4_image_grid(width: int, height: int, crop_size: int, max_num: int) -> tuple[int, int]:
    """HD crop grid ``(columns, rows)`` of an image.

    ``ceil(w/448) × ceil(h/448)`` when that is at most ``max_num`` crops;
    otherwise the grid of at most ``max_num`` crops closest in aspect ratio
    (ties to the later, larger grid when the image covers more than half of
    it), enumerated as vLLM's ``_find_target_aspect_ratio`` does.
    """
    cols = math.ceil(width / float(crop_size))
    rows = math.ceil(height / float(crop_size))
    if cols * rows <= max_num:
        return cols, rows
    ratios = {
        (i, j)
        for i in range(1, max_num + 1)
        for j in range(1, max_num + 1)
        if 1 <= i * j <= max_num
    }
    grids = sorted(ratios, key=lambda r: r[0] * r[1])
    return closest_aspect_ratio(width, height, grids, crop_size)


def phi4_image_tokens(width: int, height: int, p: Phi4ImageParams) -> tuple[int, int]:
    """``(tokens, crops)`` of one image for Phi-4-multimodal.

    The image is resized into the crop grid and padded right or bottom;
    feature columns (or rows) that are only padding are dropped, the rest are
    2×2-compressed (rounding up). Tokens: the HD features, one newline per HD
    row, one separator, the 16×16 global view and its 16 newlines.

    Raises:
        ValueError: When the resized image is under 10 px on a side, where the
            processor raises "the aspect ratio is very extreme".
    """
    cols, rows = phi4_image_grid(width, height, p.crop_size, p.dynamic_hd)
    target_w, target_h = p.crop_size * cols, p.crop_size * rows
    ratio_w, ratio_h = target_w / width, target_h / height
    if ratio_w < ratio_h:
        new_w, new_h = target_w, int(height * ratio_w)
        pad_w, pad_h = 0, target_h - new_h
    else:
        new_w, new_h = int(width * ratio_h), target_h
        pad_w, pad_h = target_w - new_w, 0
    if min(new_w, new_h) < 10:
        msg = f"Phi-4-multimodal cannot process {width}x{height}: the aspect ratio is too extreme"
        raise ValueError(msg)
    feat_w, feat_h = target_w // p.patch_size, target_h // p.patch_size
    if pad_w >= p.patch_size:
        feat_w -= math.floor(pad_w / p.patch_size)
    elif pad_h >= p.patch_size:
        feat_h -= math.floor(pad_h / p.patch_size)
    k = p.token_compression_factor
    hd_w, hd_h = math.ceil(feat_w / k), math.ceil(feat_h / k)
    global_side = p.crop_size // p.patch_size // k
    tokens = hd_w * hd_h + hd_h + 1 + global_side**2 + global_side
    return tokens, cols * rows


def phi4_image_units(item: ImageInput, p: Phi4ImageParams) -> ImageUnits:
    """Phi-4-multimodal image units.

    ``tokens``: ``256 + 1 + hd_w·hd_h + hd_h + 16`` (global view, separator,
    HD features without padding-only ones, HD newlines, global newlines).
    ``tiles``: HD crops + 1 (the global view).
    """
    width, height = check_size(item.width, item.height)
    tokens, crops = phi4_image_tokens(width, height, p)
    return ImageUnits(tokens=tokens, tiles=crops + 1)


# --- Phi-4-multimodal: audio ----------------------------------------------------
class Phi4AudioParams(Params):
    """Phi-4-multimodal audio parameters (feature extractor defaults).

    ``resample_method``: vLLM's resampling backend, pinned to "scipy" by its
    Phi-4-multimodal processor (not an HF kwarg).
    """

    sampling_rate: int = Field(default=16_000, gt=0)
    win_length: int = Field(default=400, gt=0)
    hop_length: int = Field(default=160, gt=0)
    audio_compression_rate: int = Field(default=8, gt=0)
    audio_downsample_rate: int = Field(default=1, gt=0)
    resample_method: ResampleMethod = "scipy"


def phi4_audio_frames(num_samples: int, p: Phi4AudioParams) -> int:
    """Filterbank frames of a 16 kHz clip: ``(N - 400) // 160 + 1``.

    Raises:
        ValueError: Under one frame (fewer than 400 samples, 25 ms), which
            vLLM rejects ("Waveform too short").
    """
    frames = (num_samples - p.win_length) // p.hop_length + 1
    if frames < 1:
        msg = (
            f"audio too short for Phi-4-multimodal: {num_samples} samples at "
            f"{p.sampling_rate} Hz, under one {p.win_length}-sample frame"
        )
        raise ValueError(msg)
    return frames


def phi4_audio_units(item: AudioInput, p: Phi4AudioParams) -> AudioUnits:
    """Phi-4-multimodal audio units.

    ``frames``: filterbank frames after resampling (:func:`phi4_audio_frames`).
    ``tokens``: ``ceil(ceil(frames / 8) / 1)`` audio placeholders (about
    12.5 per second); no length cap.
    """
    n = samples_at_rate(item, p.sampling_rate, p.resample_method)
    frames = phi4_audio_frames(n, p)
    tokens = ceil_div(frames, p.audio_compression_rate)
    tokens = ceil_div(tokens, p.audio_downsample_rate)
    return AudioUnits(frames=frames, tokens=tokens)


PHI4_MULTIMODAL = Profile(
    name="phi-4-multimodal",
    description=(
        "Phi-4-multimodal (reference microsoft/Phi-4-multimodal-instruct): dynamic HD "
        "448-px crops (dynamic_hd 36) with padding-aware token count; audio at "
        "~12.5 tokens/s after 16 kHz resampling."
    ),
    image=Counter(
        id="phi-4-multimodal.image",
        version=1,
        params=Phi4ImageParams(),
        fn=phi4_image_units,
        source=(
            "vllm@vllm/model_executor/models/phi4mm.py (_find_target_aspect_ratio, "
            "_compute_num_image_tokens); transformers@src/transformers/models/"
            "phi4_multimodal/image_processing_phi4_multimodal.py (dynamic_hd=36, "
            "dynamic_preprocess); vllm@tests/models/multimodal/processing/test_phi4mm.py "
            "(3136x3136: 1329/4433/9585 at dynamic_hd 4/16/36)"
        ),
    ),
    audio=Counter(
        id="phi-4-multimodal.audio",
        version=1,
        params=Phi4AudioParams(),
        fn=phi4_audio_units,
        source=(
            "vllm@vllm/model_executor/models/phi4mm.py (get_audio_num_frames, "
            "_compute_audio_embed_size, scipy resampling); "
            "transformers@src/transformers/models/phi4_multimodal/"
            "feature_extraction_phi4_multimodal.py (win 400, hop 160, compression 8)"
        ),
    ),
    aliases=("phi4mm", "phi4_multimodal"),
)

PROFILES: tuple[Profile, ...] = (PHI35_VISION, PHI4_MULTIMODAL)
