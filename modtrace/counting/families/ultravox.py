"""Ultravox (Whisper encoder + stacked projector into Llama), as vLLM serves it.

Reference checkpoint: ``fixie-ai/ultravox-v0_5-llama-3_2-1b`` (the v0.5
family shares its ``processor_config.json``: ``audio_context_size`` 3000,
``encoder_ds_factor`` 2, ``stack_factor`` 8).

``UltravoxProcessor`` (the checkpoint's remote code, fixie-ai/ultravox
``ultravox/model/ultravox_processing.py``) does, per clip:

1. pad the samples to at least two hops (320);
2. run ``WhisperFeatureExtractor`` with ``padding="longest"``,
   ``pad_to_multiple_of=hop_length`` and ``truncation=False``: the clip
   keeps all its ``L = ceil(N / 160)`` mel frames;
3. cut the frames into chunks of ``audio_context_size`` (3000 = 30 s);
4. give each chunk ``ceil(frames / (encoder_ds_factor * stack_factor))``
   tokens: ``ceil(frames / 16)``, i.e. one token per 2560 samples (0.16 s).

vLLM replaces the ``<|audio|>`` placeholder with the sum over the clip's
chunks (``get_replacement_ultravox``), so ``audio.tokens`` is that sum and
has no structural tokens. The per-chunk rounding matters: 35 s is
188 + 32 = 220 tokens, not ``ceil(3500 / 16)`` = 219 (fixie-ai's
processor tests). ``audio.frames`` is ``L``.
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
from .numerics import ceil_div

__all__ = [
    "PROFILES",
    "ULTRAVOX",
    "UltravoxAudioParams",
    "ultravox_audio_units",
    "ultravox_chunk_frames",
]


class UltravoxAudioParams(Params):
    """Ultravox processor settings (``fixie-ai/ultravox-v0_5-llama-3_2-1b``).

    Attributes:
        sampling_rate: Whisper feature extractor rate.
        hop_length: Samples per mel frame.
        audio_context_size: Mel frames per encoder chunk
            (``processor_config.json``).
        encoder_ds_factor: Whisper encoder downsampling
            (``processor_config.json``).
        stack_factor: Encoder frames stacked per LLM token
            (``processor_config.json`` and ``config.json``).
        resample_method: vLLM's resampling backend (not an HF kwarg).
    """

    sampling_rate: PositiveInt = 16_000
    hop_length: PositiveInt = 160
    audio_context_size: PositiveInt = 3000
    encoder_ds_factor: PositiveInt = 2
    stack_factor: PositiveInt = 8
    resample_method: ResampleMethod = DEFAULT_RESAMPLE_METHOD


def ultravox_chunk_frames(mel_frames: int, audio_context_size: int) -> list[int]:
    """Mel frames of each chunk: ``audio_context_size`` each, the rest in the last."""
    full, rest = divmod(mel_frames, audio_context_size)
    return [audio_context_size] * full + ([rest] if rest else [])


def ultravox_audio_units(item: AudioInput, p: UltravoxAudioParams) -> AudioUnits:
    """Mel frames and prompt tokens of one clip for Ultravox.

    ``tokens`` = sum over chunks of ``ceil(chunk_frames / (encoder_ds_factor
    * stack_factor))``. An empty or tiny clip is padded to two hops: 1 token.
    """
    samples = samples_at_rate(item, p.sampling_rate, p.resample_method)
    frames, _ = whisper_mel_frames(
        max(samples, 2 * p.hop_length),
        hop_length=p.hop_length,
        padding="longest",
        truncation=False,
        pad_to_multiple_of=p.hop_length,
    )
    per_token = p.encoder_ds_factor * p.stack_factor
    chunks = ultravox_chunk_frames(frames, p.audio_context_size)
    return AudioUnits(frames=frames, tokens=sum(ceil_div(c, per_token) for c in chunks))


ULTRAVOX = Profile(
    name="ultravox",
    description=(
        "Ultravox v0.5 (reference: fixie-ai/ultravox-v0_5-llama-3_2-1b): one audio "
        "token per 0.16 s, rounded up per 30 s chunk."
    ),
    audio=Counter(
        id="ultravox.audio",
        version=1,
        params=UltravoxAudioParams(),
        fn=ultravox_audio_units,
        source=(
            "fixie-ai/ultravox@ultravox/model/ultravox_processing.py (UltravoxProcessor); "
            "vllm@vllm/model_executor/models/ultravox.py (get_replacement_ultravox); "
            "fixie-ai/ultravox-v0_5-llama-3_2-1b processor_config.json "
            "(audio_context_size 3000, encoder_ds_factor 2, stack_factor 8)"
        ),
    ),
    aliases=("ultravox-v0_5", "ultravox-v0.5", "ultravox-v0_5-llama-3_2-1b"),
)

PROFILES: tuple[Profile, ...] = (ULTRAVOX,)
