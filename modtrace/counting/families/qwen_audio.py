"""Qwen2-Audio and Qwen2.5-Omni audio, as vLLM serves them.

Both run a clip through ``WhisperFeatureExtractor`` (16 kHz, 160-sample
hop: 100 mel frames per second) with ``padding="max_length"`` and, by
default, ``truncation=True``; the mel frames with audio are
``L = feature_attention_mask.sum()``. The audio encoder (two convolutions,
the second with stride 2, then a stride-2 average pool) gives

    tokens = ((L - 1) // 2 + 1 - 2) // 2 + 1          # 25 per second

(transformers ``Qwen2AudioProcessor._process_audio`` and
``qwen2_5_omni.processing_qwen2_5_omni._get_feat_extract_output_lengths``;
vLLM ``qwen2_audio._get_feat_extract_output_lengths``).

What differs is the checkpoint's ``chunk_length``, the longest audio the
extractor keeps:

* Qwen2-Audio-7B(-Instruct): 30 s, so ``L <= 3000`` and at most 750 tokens;
  anything past 30 s is cut, not chunked.
* Qwen2.5-Omni-7B/3B: 300 s, so ``L <= 30000`` and at most 7500 tokens.

Placeholder range: vLLM replaces each ``<|AUDIO|>`` with ``tokens`` audio
tokens (``PromptReplacement(target=[audio_token_id], ...)``). The
``<|audio_bos|>``/``<|audio_eos|>`` around it come from the chat template
and are outside the range, so ``audio.tokens`` excludes them (they are 2
text tokens per clip). A clip of ``L <= 2`` frames (at most 320 samples)
gives 0 tokens, which vLLM rejects ("too short to be represented").

``audio.frames`` is ``L``. Qwen2-Audio's encoder still runs on the full
padded 3000 frames (vLLM trims its output), Qwen2.5-Omni's only on ``L``.

Qwen2.5-Omni images and videos use the Qwen2.5-VL formulas of
:mod:`.qwen`. Images: ``Qwen2VLImageProcessor`` with the checkpoint's
``min_pixels`` 3136 and ``max_pixels`` 12845056 (patch 14, merge 2), as
Qwen2.5-VL. Videos: ``Qwen2_5OmniProcessor`` passes its own default
``size={"shortest_edge": 128*28*28, "longest_edge": 768*28*28}`` to the
video processor, so each frame pair gets 128 to 768 tokens, not
Qwen2.5-VL's 4 to 16384. ``use_audio_in_video`` (the clip's audio tokens
interleaved into the video placeholder, with ``<|audio_bos|>``/
``<|audio_eos|>``) is not modelled: count the soundtrack as an audio item.
"""

from __future__ import annotations

from pydantic import PositiveInt

from ..profile import AudioInput, AudioUnits, Counter, Params, Profile
from .audio_common import (
    DEFAULT_RESAMPLE_METHOD,
    ResampleMethod,
    samples_at_rate,
    whisper_mel_frames,
)
from .qwen import QwenImageParams, QwenVideoParams, qwen_image_units, qwen_video_units

__all__ = [
    "PROFILES",
    "QWEN2_AUDIO",
    "QWEN25_OMNI",
    "QWEN25_OMNI_VIDEO_MAX_PIXELS",
    "QWEN25_OMNI_VIDEO_MIN_PIXELS",
    "QwenAudioParams",
    "QwenOmniAudioParams",
    "qwen_audio_output_length",
    "qwen_audio_units",
]


#: ``Qwen2_5OmniProcessor.videos_kwargs["size"]``: 128 and 768 tokens of 28x28 px per frame.
QWEN25_OMNI_VIDEO_MIN_PIXELS = 128 * 28 * 28
QWEN25_OMNI_VIDEO_MAX_PIXELS = 768 * 28 * 28


class QwenAudioParams(Params):
    """Qwen2-Audio feature extractor settings (``Qwen/Qwen2-Audio-7B-Instruct``).

    Attributes:
        sampling_rate: Feature extractor rate (``preprocessor_config.json``).
        hop_length: Samples per mel frame (``preprocessor_config.json``).
        chunk_length: Seconds the extractor pads or truncates to
            (``preprocessor_config.json``: 30).
        truncation: The extractor's ``truncation`` call kwarg (default True;
            neither vLLM nor the processor sets it).
        resample_method: vLLM's resampling backend (not an HF kwarg).
    """

    sampling_rate: PositiveInt = 16_000
    hop_length: PositiveInt = 160
    chunk_length: PositiveInt = 30
    truncation: bool = True
    resample_method: ResampleMethod = DEFAULT_RESAMPLE_METHOD


class QwenOmniAudioParams(QwenAudioParams):
    """Qwen2.5-Omni audio settings: as Qwen2-Audio, but 300 s per clip.

    ``chunk_length`` 300 (``n_samples`` 4800000, ``nb_max_frames`` 30000)
    is from ``Qwen/Qwen2.5-Omni-7B`` ``preprocessor_config.json``.
    """

    chunk_length: PositiveInt = 300


def qwen_audio_output_length(mel_frames: int) -> int:
    """Audio tokens for ``mel_frames`` valid mel frames: ``((L-1)//2 + 1 - 2)//2 + 1``.

    Returns 0 for ``L <= 2``.
    """
    after_conv = (mel_frames - 1) // 2 + 1
    return max((after_conv - 2) // 2 + 1, 0)


def qwen_audio_units(item: AudioInput, p: QwenAudioParams) -> AudioUnits:
    """Mel frames and prompt tokens of one clip for Qwen2-Audio or Qwen2.5-Omni.

    ``tokens`` counts the ``<|AUDIO|>`` tokens vLLM's placeholder range
    holds, not the ``<|audio_bos|>``/``<|audio_eos|>`` around them.

    Raises:
        ValueError: the clip gives no token (at most two mel frames, i.e.
            320 samples at 16 kHz), which vLLM rejects.
    """
    samples = samples_at_rate(item, p.sampling_rate, p.resample_method)
    frames, _ = whisper_mel_frames(
        samples,
        hop_length=p.hop_length,
        max_length=p.chunk_length * p.sampling_rate,
        truncation=p.truncation,
    )
    tokens = qwen_audio_output_length(frames)
    if tokens == 0:
        msg = (
            f"audio of {samples} samples ({frames} mel frames) is too short: "
            "Qwen audio needs more than 2 mel frames (over 320 samples at 16 kHz)"
        )
        raise ValueError(msg)
    return AudioUnits(frames=frames, tokens=tokens)


_AUDIO_SOURCE = (
    "transformers@models/qwen2_audio/processing_qwen2_audio.py (num_audio_tokens); "
    "transformers@models/qwen2_5_omni/processing_qwen2_5_omni.py "
    "(_get_feat_extract_output_lengths); transformers@models/whisper/"
    "feature_extraction_whisper.py (attention_mask); vllm@vllm/model_executor/models/"
    "qwen2_audio.py (PromptReplacement target=[audio_token_id])"
)

QWEN2_AUDIO = Profile(
    name="qwen2-audio",
    description=(
        "Qwen2-Audio (reference: Qwen/Qwen2-Audio-7B-Instruct): 25 audio tokens per "
        "second, clips cut at 30 s (750 tokens)."
    ),
    audio=Counter(
        id="qwen2-audio.audio",
        version=1,
        params=QwenAudioParams(),
        fn=qwen_audio_units,
        source=_AUDIO_SOURCE
        + "; Qwen/Qwen2-Audio-7B-Instruct preprocessor_config.json (chunk_length 30)",
    ),
    aliases=("qwen2_audio", "qwen2-audio-7b", "qwen2-audio-7b-instruct"),
)

QWEN25_OMNI = Profile(
    name="qwen2.5-omni",
    description=(
        "Qwen2.5-Omni thinker (reference: Qwen/Qwen2.5-Omni-7B): audio at 25 tokens "
        "per second up to 300 s (7500 tokens)."
    ),
    audio=Counter(
        id="qwen2.5-omni.audio",
        version=1,
        params=QwenOmniAudioParams(),
        fn=qwen_audio_units,
        source=_AUDIO_SOURCE + "; vllm@vllm/model_executor/models/qwen2_5_omni_thinker.py; "
        "Qwen/Qwen2.5-Omni-7B preprocessor_config.json (chunk_length 300, "
        "nb_max_frames 30000)",
    ),
    image=Counter(
        id="qwen2.5-omni.image",
        version=1,
        params=QwenImageParams(),
        fn=qwen_image_units,
        source=(
            "transformers@models/qwen2_vl/image_processing_pil_qwen2_vl.py; "
            "vllm@vllm/model_executor/models/qwen2_5_omni_thinker.py "
            "(get_replacement_qwen2_vision); Qwen/Qwen2.5-Omni-7B preprocessor_config.json "
            "(min_pixels 3136, max_pixels 12845056, patch_size 14, merge_size 2)"
        ),
    ),
    video=Counter(
        id="qwen2.5-omni.video",
        version=1,
        params=QwenVideoParams(
            min_pixels=QWEN25_OMNI_VIDEO_MIN_PIXELS, max_pixels=QWEN25_OMNI_VIDEO_MAX_PIXELS
        ),
        fn=qwen_video_units,
        source=(
            "transformers@models/qwen2_5_omni/processing_qwen2_5_omni.py (videos_kwargs "
            "size 128*28*28..768*28*28, fps 2.0); transformers@models/qwen2_vl/"
            "video_processing_qwen2_vl.py; vllm@vllm/model_executor/models/"
            "qwen2_5_omni_thinker.py"
        ),
    ),
    aliases=("qwen2_5_omni", "qwen2.5-omni-7b", "qwen2.5-omni-3b"),
)

PROFILES: tuple[Profile, ...] = (QWEN2_AUDIO, QWEN25_OMNI)
