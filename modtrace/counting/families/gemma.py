"""Gemma 3, Gemma 3n and Gemma 4: image, audio and video units as vLLM expands them.

Token counts are the length of the placeholder range vLLM records for the
item (``PlaceholderRange.length``), which is what ``prompt_tokens`` and
``prompt_tokens_details`` count. Each counter's docstring says exactly
which structural tokens that range holds.

Audio arrives at any sample rate; vLLM resamples it to the feature
extractor's 16 kHz first. The resampled length follows the shared
:func:`~modtrace.counting.families.audio_common.samples_at_rate` with the
backend in each audio counter's ``resample_method`` (vLLM's default).

Video frames come from vLLM's generic uniform loader: ``min(num_frames,
total)`` frames, as
:func:`~modtrace.counting.families.video_loader.vllm_video_frame_count`
counts them. (vLLM now picks a loader from the model's video processor; that
Gemma 4 gets the generic one is UNVERIFIED.)
"""

from __future__ import annotations

import math

from pydantic import Field, field_validator

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
from .audio_common import DEFAULT_RESAMPLE_METHOD, ResampleMethod, samples_at_rate
from .video_loader import check_num_frames, vllm_video_frame_count

__all__ = [
    "GEMMA3",
    "GEMMA3N",
    "GEMMA4",
    "GEMMA4_SOFT_TOKEN_BUDGETS",
    "PROFILES",
    "Gemma3ImageParams",
    "Gemma3nAudioParams",
    "Gemma3nImageParams",
    "Gemma4AudioParams",
    "Gemma4ImageParams",
    "Gemma4VideoParams",
    "gemma3_image_units",
    "gemma3_pan_and_scan_crops",
    "gemma3n_audio_frames",
    "gemma3n_audio_units",
    "gemma3n_image_units",
    "gemma4_audio_frames",
    "gemma4_audio_soft_tokens",
    "gemma4_audio_units",
    "gemma4_image_units",
    "gemma4_resized_size",
    "gemma4_soft_tokens",
    "gemma4_video_units",
]

#: The per-image (and per-frame) soft-token budgets Gemma 4 supports.
GEMMA4_SOFT_TOKEN_BUDGETS: tuple[int, ...] = (70, 140, 280, 560, 1120)

# "\n\n" before <start_of_image> and after <end_of_image>, and the two
# markers: Gemma 3 and 3n wrap every image (and 3n every clip) this way, and
# "\n\n" is one token in their vocabulary (vLLM gemma3_mm.py reads
# vocab["\n\n"]).
_GEMMA3_WRAPPER_TOKENS = 4

# Pan-and-scan wraps the crops in fixed English text. Counted by hand for the
# Gemma 3 SentencePiece vocabulary: "Here", " is", " the", " original",
# " image", " " before the first image; " and" ... " better", " " before the
# crops; one " " between crops. UNVERIFIED: no Gemma tokenizer could be run
# here.
_PAS_INTRO_TOKENS = 6
_PAS_CROPS_TEXT_TOKENS = 11


# --- Gemma 3 ------------------------------------------------------------------
class Gemma3ImageParams(Params):
    """Gemma 3 image parameters (``google/gemma-3-4b-it``; pan-and-scan off by default)."""

    image_seq_length: int = Field(default=256, gt=0)
    do_pan_and_scan: bool = False
    pan_and_scan_min_crop_size: int = Field(default=256, gt=0)
    pan_and_scan_max_num_crops: int = Field(default=4, gt=0)
    pan_and_scan_min_ratio_to_activate: float = Field(default=1.2, gt=0)


def gemma3_pan_and_scan_crops(
    width: int,
    height: int,
    *,
    min_crop_size: int,
    max_num_crops: int,
    min_ratio_to_activate: float,
) -> int:
    """Number of pan-and-scan crops Gemma 3 adds for an image (0 when none).

    Follows ``Gemma3ImageProcessor.pan_and_scan``: crops along the long side,
    ``clamp(min(floor(long/short + 0.5), floor(long/min_crop)), 2, max)``;
    none when the aspect ratio is under ``min_ratio_to_activate`` or a crop
    would be under ``min_crop_size``.
    """
    if width >= height:
        if width / height < min_ratio_to_activate:
            return 0
        crops_w = min(math.floor(width / min_crop_size), math.floor(width / height + 0.5))
        crops_w = min(max_num_crops, max(2, crops_w))
        crops_h = 1
    else:
        if height / width < min_ratio_to_activate:
            return 0
        crops_h = min(math.floor(height / min_crop_size), math.floor(height / width + 0.5))
        crops_h = min(max_num_crops, max(2, crops_h))
        crops_w = 1
    if min(math.ceil(width / crops_w), math.ceil(height / crops_h)) < min_crop_size:
        return 0
    return crops_w * crops_h


def gemma3_image_units(item: ImageInput, p: Gemma3ImageParams) -> ImageUnits:
    """Gemma 3 image units.

    ``tokens``: each view (the image, plus each pan-and-scan crop) is
    ``"\\n\\n" <start_of_image> image_seq_length×<image_soft_token>
    <end_of_image> "\\n\\n"`` = ``image_seq_length + 4`` tokens, all inside
    vLLM's placeholder range. With crops, the fixed wrapper text ("Here is
    the original image ... crops to help you see better ...") is in the
    range too: ``16 + num_crops`` tokens (UNVERIFIED count, see module).
    ``tiles``: ``1 + num_crops`` when pan-and-scan is on, else ``None``.
    """
    width, height = check_size(item.width, item.height)
    crops = 0
    if p.do_pan_and_scan:
        crops = gemma3_pan_and_scan_crops(
            width,
            height,
            min_crop_size=p.pan_and_scan_min_crop_size,
            max_num_crops=p.pan_and_scan_max_num_crops,
            min_ratio_to_activate=p.pan_and_scan_min_ratio_to_activate,
        )
    tokens = (1 + crops) * (p.image_seq_length + _GEMMA3_WRAPPER_TOKENS)
    if crops:
        tokens += _PAS_INTRO_TOKENS + _PAS_CROPS_TEXT_TOKENS + (crops - 1)
    return ImageUnits(tokens=tokens, tiles=1 + crops if p.do_pan_and_scan else None)


GEMMA3 = Profile(
    name="gemma-3",
    description=(
        "Gemma 3 (reference google/gemma-3-4b-it): 256 soft tokens per image at 896x896; "
        "optional pan-and-scan crops (do_pan_and_scan)."
    ),
    image=Counter(
        id="gemma-3.image",
        version=1,
        params=Gemma3ImageParams(),
        fn=gemma3_image_units,
        source=(
            "transformers@src/transformers/models/gemma3/processing_gemma3.py "
            "(image_seq_length=256, full_image_sequence, pan-and-scan defaults); "
            "transformers@src/transformers/models/gemma3/image_processing_pil_gemma3.py "
            "(pan_and_scan); vllm@vllm/model_executor/models/gemma3_mm.py (get_image_repl)"
        ),
    ),
    aliases=("gemma3", "gemma-3-it"),
)


# --- Gemma 3n -----------------------------------------------------------------
class Gemma3nImageParams(Params):
    """Gemma 3n image parameters (``google/gemma-3n-E2B-it``)."""

    image_seq_length: int = Field(default=256, gt=0)


def gemma3n_image_units(item: ImageInput, p: Gemma3nImageParams) -> ImageUnits:
    """Gemma 3n image units.

    ``tokens``: ``"\\n\\n" <start_of_image> 256×<image_soft_token>
    <end_of_image> "\\n\\n"`` = ``image_seq_length + 4``, whatever the size
    (the image is resized to the encoder's square input). ``tiles``: None.
    """
    check_size(item.width, item.height)
    return ImageUnits(tokens=p.image_seq_length + _GEMMA3_WRAPPER_TOKENS)


class Gemma3nAudioParams(Params):
    """Gemma 3n audio parameters (feature extractor defaults, 16 kHz, 30 s cap).

    ``resample_method``: vLLM's resampling backend (not an HF kwarg).
    """

    audio_seq_length: int = Field(default=188, gt=0)
    sampling_rate: int = Field(default=16_000, gt=0)
    max_length: int = Field(default=480_000, gt=0)
    pad_to_multiple_of: int = Field(default=128, gt=0)
    frame_length_ms: float = Field(default=32.0, gt=0)
    hop_length_ms: float = Field(default=10.0, gt=0)
    resample_method: ResampleMethod = DEFAULT_RESAMPLE_METHOD


def gemma3n_audio_frames(num_samples: int, p: Gemma3nAudioParams) -> int:
    """Valid mel frames ``Gemma3nAudioFeatureExtractor`` makes from a clip.

    The clip is truncated to ``max_length`` samples (30 s), zero-padded to a
    multiple of ``pad_to_multiple_of``, framed with windows of
    ``frame_length + 1`` samples every ``hop_length``; a frame counts when
    the attention mask, sampled every hop, marks it as real audio.

    Args:
        num_samples: Samples at ``p.sampling_rate``.
        p: The parameters.

    Returns:
        ``input_features_mask.sum()``.
    """
    frame_length = round(p.sampling_rate * p.frame_length_ms / 1000.0)
    hop = round(p.sampling_rate * p.hop_length_ms / 1000.0)
    n = min(num_samples, p.max_length)
    padded = math.ceil(n / p.pad_to_multiple_of) * p.pad_to_multiple_of
    frames = (padded - (frame_length + 1)) // hop + 1
    return max(0, min(frames, math.ceil(n / hop)))


def gemma3n_audio_units(item: AudioInput, p: Gemma3nAudioParams) -> AudioUnits:
    """Gemma 3n audio units.

    ``tokens``: fixed, whatever the clip length: ``"\\n\\n" <start_of_audio>
    188×<audio_soft_token> <end_of_audio> "\\n\\n"`` = ``audio_seq_length +
    4`` (vLLM pads or truncates the encoder output to 188). ``frames``: mel
    frames of the first 30 s (:func:`gemma3n_audio_frames`).
    """
    n = samples_at_rate(item, p.sampling_rate, p.resample_method)
    return AudioUnits(
        frames=gemma3n_audio_frames(n, p),
        tokens=p.audio_seq_length + _GEMMA3_WRAPPER_TOKENS,
    )


GEMMA3N = Profile(
    name="gemma-3n",
    description=(
        "Gemma 3n (reference google/gemma-3n-E2B-it): 256 tokens per image, "
        "188 per audio clip (first 30 s), both fixed."
    ),
    image=Counter(
        id="gemma-3n.image",
        version=1,
        params=Gemma3nImageParams(),
        fn=gemma3n_image_units,
        source=(
            "transformers@src/transformers/models/gemma3n/processing_gemma3n.py "
            "(image_seq_length=256, full_image_sequence); "
            "vllm@vllm/model_executor/models/gemma3n_mm.py (get_image_repl)"
        ),
    ),
    audio=Counter(
        id="gemma-3n.audio",
        version=1,
        params=Gemma3nAudioParams(),
        fn=gemma3n_audio_units,
        source=(
            "transformers@src/transformers/models/gemma3n/processing_gemma3n.py "
            "(audio_seq_length=188); "
            "transformers@src/transformers/models/gemma3n/feature_extraction_gemma3n.py "
            "(max_length=480000, pad_to_multiple_of=128, 32 ms / 10 ms frames); "
            "vllm@vllm/model_executor/models/gemma3n_mm.py (get_audio_repl); "
            "resampling: modtrace.counting.families.audio_common"
        ),
    ),
    aliases=("gemma3n",),
)


# --- Gemma 4 ------------------------------------------------------------------
def _check_budget(value: int) -> int:
    if value not in GEMMA4_SOFT_TOKEN_BUDGETS:
        msg = f"max_soft_tokens must be one of {GEMMA4_SOFT_TOKEN_BUDGETS}, got {value}"
        raise ValueError(msg)
    return value


class Gemma4ImageParams(Params):
    """Gemma 4 image parameters (``google/gemma-4-E2B-it``: 280 soft tokens)."""

    max_soft_tokens: int = 280
    patch_size: int = Field(default=16, gt=0)
    pooling_kernel_size: int = Field(default=3, gt=0)

    @field_validator("max_soft_tokens")
    @classmethod
    def _budget(cls, value: int) -> int:
        return _check_budget(value)


def gemma4_resized_size(
    height: int,
    width: int,
    *,
    patch_size: int,
    max_soft_tokens: int,
    pooling_kernel_size: int,
) -> tuple[int, int]:
    """Size Gemma 4 resizes an image (or frame) to, as ``(height, width)``.

    Follows ``get_aspect_ratio_preserving_size``: scale to the patch budget
    ``max_soft_tokens * k²`` (``k`` = pooling kernel), round each side down to
    a multiple of ``k * patch_size``; a side that rounds to 0 becomes one unit
    and the other ``floor(long/short)`` units, capped at ``max_soft_tokens``.

    Raises:
        ValueError: Where the processor raises (both sides round to 0, or the
            result exceeds the budget).
    """
    max_patches = max_soft_tokens * pooling_kernel_size**2
    target_px = max_patches * patch_size**2
    factor = math.sqrt(target_px / (height * width))
    side = pooling_kernel_size * patch_size
    target_h = math.floor(factor * height / side) * side
    target_w = math.floor(factor * width / side) * side
    if target_h == 0 and target_w == 0:
        msg = f"Gemma 4 cannot resize {width}x{height}: both sides round to 0"
        raise ValueError(msg)
    max_side = (max_patches // pooling_kernel_size**2) * side
    if target_h == 0:
        target_h = side
        target_w = min(math.floor(width / height) * side, max_side)
    elif target_w == 0:
        target_w = side
        target_h = min(math.floor(height / width) * side, max_side)
    if target_h * target_w > target_px:
        msg = f"Gemma 4 resize of {width}x{height} exceeds {max_patches} patches"
        raise ValueError(msg)
    return target_h, target_w


def gemma4_soft_tokens(
    width: int,
    height: int,
    *,
    patch_size: int,
    max_soft_tokens: int,
    pooling_kernel_size: int,
) -> int:
    """Soft tokens the Gemma 4 vision tower emits for one image or frame."""
    h, w = gemma4_resized_size(
        height,
        width,
        patch_size=patch_size,
        max_soft_tokens=max_soft_tokens,
        pooling_kernel_size=pooling_kernel_size,
    )
    return (h // patch_size) * (w // patch_size) // pooling_kernel_size**2


def gemma4_image_units(item: ImageInput, p: Gemma4ImageParams) -> ImageUnits:
    """Gemma 4 image units.

    ``tokens``: ``<boi> n×<|image|> <eoi>`` = soft tokens + 2, where soft
    tokens follow the aspect-preserving resize to ``max_soft_tokens``
    (70/140/280/560/1120). ``tiles``: None.
    """
    width, height = check_size(item.width, item.height)
    soft = gemma4_soft_tokens(
        width,
        height,
        patch_size=p.patch_size,
        max_soft_tokens=p.max_soft_tokens,
        pooling_kernel_size=p.pooling_kernel_size,
    )
    return ImageUnits(tokens=soft + 2)


class Gemma4VideoParams(Params):
    """Gemma 4 video parameters.

    ``num_frames`` and ``loader_fps`` are vLLM's ``media_io_kwargs.video``
    ``num_frames`` (32, as HF's) and ``fps`` (unset). vLLM forces 70 soft
    tokens per frame whatever the request says, so that budget is not named
    ``max_soft_tokens`` here. ``timestamp_tokens``: text tokens of each
    frame's ``"mm:ss "`` prefix; vLLM's own budget assumes ~6 (UNVERIFIED).
    """

    num_frames: int = Field(default=32)
    loader_fps: float | None = Field(default=None, ge=0)
    video_max_soft_tokens: int = 70
    patch_size: int = Field(default=16, gt=0)
    pooling_kernel_size: int = Field(default=3, gt=0)
    timestamp_tokens: int = Field(default=6, ge=0)

    @field_validator("num_frames")
    @classmethod
    def _frames(cls, value: int) -> int:
        return check_num_frames(value)

    @field_validator("video_max_soft_tokens")
    @classmethod
    def _budget(cls, value: int) -> int:
        return _check_budget(value)


def gemma4_video_units(item: VideoInput, p: Gemma4VideoParams) -> VideoUnits:
    """Gemma 4 video units.

    Gemma 4 has no video tower: each sampled frame goes through the image
    path at 70 soft tokens. ``frames``: ``min(num_frames, round(seconds *
    fps))`` (:func:`~.video_loader.vllm_video_frame_count`). ``tokens``: per frame
    ``"mm:ss "`` (``timestamp_tokens``) + ``<boi>`` + soft tokens +
    ``<eoi>``, all inside vLLM's placeholder range.

    Raises:
        ValueError: A bad duration, rate or size, or frame counts past the
            caps of :func:`~.video_loader.vllm_video_frame_count`.
    """
    width, height = check_size(item.width, item.height)
    frames = vllm_video_frame_count(item.seconds, item.fps, p.num_frames, p.loader_fps)
    soft = gemma4_soft_tokens(
        width,
        height,
        patch_size=p.patch_size,
        max_soft_tokens=p.video_max_soft_tokens,
        pooling_kernel_size=p.pooling_kernel_size,
    )
    return VideoUnits(frames=frames, tokens=frames * (soft + 2 + p.timestamp_tokens))


class Gemma4AudioParams(Params):
    """Gemma 4 audio parameters (16 kHz, 20 ms / 10 ms frames, cap 750 tokens).

    ``audio_seq_length`` is the processor's default cap (750); vLLM reads it
    from the checkpoint's processor config, whose value was not seen here
    (UNVERIFIED). ``resample_method``: vLLM's resampling backend (not an HF
    kwarg).
    """

    audio_seq_length: int = Field(default=750, gt=0)
    sampling_rate: int = Field(default=16_000, gt=0)
    max_length: int = Field(default=480_000, gt=0)
    frame_length_ms: float = Field(default=20.0, gt=0)
    hop_length_ms: float = Field(default=10.0, gt=0)
    resample_method: ResampleMethod = DEFAULT_RESAMPLE_METHOD


def _gemma4_mel_frames(num_samples: int, p: Gemma4AudioParams) -> int:
    # Semicausal padding prepends frame_length // 2 zeros; windows are
    # frame_length + 1 samples, one every hop.
    frame_length = round(p.sampling_rate * p.frame_length_ms / 1000.0)
    hop = round(p.sampling_rate * p.hop_length_ms / 1000.0)
    return max(0, (num_samples + frame_length // 2 - (frame_length + 1)) // hop + 1)


def gemma4_audio_frames(num_samples: int, p: Gemma4AudioParams) -> int:
    """Valid mel frames of the clip's first ``max_length`` samples (HF feature extractor)."""
    return _gemma4_mel_frames(min(num_samples, p.max_length), p)


def gemma4_audio_soft_tokens(num_samples: int, p: Gemma4AudioParams) -> int:
    """Gemma 4 audio soft tokens: mel frames through two stride-2 convs, capped.

    ``t -> (t + 2 - 3) // 2 + 1`` twice (kernel 3, padding 1), then
    ``min(t, audio_seq_length)``; 0 when the clip has no full mel frame.
    About 25 tokens per second, 750 at 30 s and beyond.
    """
    t = _gemma4_mel_frames(num_samples, p)
    if t <= 0:
        return 0
    for _ in range(2):
        t = (t + 2 - 3) // 2 + 1
    return min(t, p.audio_seq_length)


def gemma4_audio_units(item: AudioInput, p: Gemma4AudioParams) -> AudioUnits:
    """Gemma 4 audio units.

    ``tokens``: ``<boa> n×<|audio|> <eoa>`` = soft tokens + 2
    (:func:`gemma4_audio_soft_tokens`). ``frames``: valid mel frames of the
    first 30 s (:func:`gemma4_audio_frames`).
    """
    n = samples_at_rate(item, p.sampling_rate, p.resample_method)
    return AudioUnits(
        frames=gemma4_audio_frames(n, p),
        tokens=gemma4_audio_soft_tokens(n, p) + 2,
    )


GEMMA4 = Profile(
    name="gemma-4",
    description=(
        "Gemma 4 (reference google/gemma-4-E2B-it): images at max_soft_tokens "
        "(default 280), video as 32 timestamped frames of 70 soft tokens, "
        "audio at ~25 tokens/s capped at 750."
    ),
    image=Counter(
        id="gemma-4.image",
        version=1,
        params=Gemma4ImageParams(),
        fn=gemma4_image_units,
        source=(
            "transformers@src/transformers/models/gemma4/image_processing_pil_gemma4.py "
            "(get_aspect_ratio_preserving_size, patch 16, pooling 3); "
            "vllm@vllm/model_executor/models/gemma4_mm.py (get_image_repl); "
            "vllm@tests/models/multimodal/processing/test_gemma4.py (default 280 for "
            "google/gemma-4-E2B-it)"
        ),
    ),
    video=Counter(
        id="gemma-4.video",
        version=1,
        params=Gemma4VideoParams(),
        fn=gemma4_video_units,
        source=(
            "vllm@vllm/model_executor/models/gemma4_mm.py (_VIDEO_MAX_SOFT_TOKENS=70, "
            "_VIDEO_MAX_FRAMES=32, get_video_repl, '~6 ts tokens'); "
            "transformers@src/transformers/models/gemma4/processing_gemma4.py "
            "(replace_video_token)"
        ),
    ),
    audio=Counter(
        id="gemma-4.audio",
        version=1,
        params=Gemma4AudioParams(),
        fn=gemma4_audio_units,
        source=(
            "transformers@src/transformers/models/gemma4/processing_gemma4.py "
            "(_compute_audio_num_tokens, audio_seq_length=750); "
            "transformers@src/transformers/models/gemma4/feature_extraction_gemma4.py; "
            "vllm@vllm/model_executor/models/gemma4_mm.py (get_audio_repl)"
        ),
    ),
    aliases=("gemma4",),
)

PROFILES: tuple[Profile, ...] = (GEMMA3, GEMMA3N, GEMMA4)
