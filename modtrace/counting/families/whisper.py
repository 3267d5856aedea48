"""Whisper (encoder-decoder speech recognition) as vLLM serves it.

Reference checkpoint: ``openai/whisper-large-v3`` (every OpenAI Whisper
checkpoint has the same audio geometry; v3 differs only in 128 mel bins,
which changes no count).

What the engine does with a clip (vLLM ``model_executor/models/whisper.py``,
``entrypoints/openai/speech_to_text``):

* The transcription endpoint resamples the clip to 16 kHz and, when it
  lasts more than ``max_audio_clip_s`` (the feature extractor's
  ``chunk_length``, 30 s), splits it into chunks at quiet points
  (:func:`~.audio_common.speech_to_text_chunks`); each chunk is one engine
  request.
* ``WhisperFeatureExtractor`` pads (or truncates) every chunk to 30 s:
  always 3000 mel frames, whatever the chunk's length. A 5 s clip costs
  the encoder as much as a 30 s one.
* The encoder's two convolutions (the second with stride 2) turn 3000
  frames into 1500 positions. vLLM writes the encoder prompt as
  ``max_source_positions`` (1500) placeholder tokens
  (``PromptReplacement(target=[0], replacement=[0] * 1500)``), and counts
  them in the request's prompt tokens.

So per chunk: ``audio.frames`` = 3000 mel frames, ``audio.tokens`` = 1500.
The decoder prompt (``<|startoftranscript|><|en|>...``) is text, not
counted here. vLLM's streaming usage estimate is different: it reports
``ceil(seconds * 16000 / hop_length)`` (unpadded mel frames) as audio
prompt tokens (``WhisperForConditionalGeneration.get_num_audio_tokens``).
"""

from __future__ import annotations

from pydantic import PositiveInt

from ..profile import AudioInput, AudioUnits, Counter, Params, Profile
from .audio_common import (
    DEFAULT_RESAMPLE_METHOD,
    ResampleMethod,
    samples_at_rate,
    speech_to_text_chunks,
    whisper_mel_frames,
)

__all__ = ["PROFILES", "WHISPER", "WhisperAudioParams", "whisper_audio_units"]


class WhisperAudioParams(Params):
    """Whisper feature extractor and encoder geometry (``openai/whisper-large-v3``).

    Attributes:
        sampling_rate: Feature extractor rate (``preprocessor_config.json``).
        hop_length: Samples per mel frame (``preprocessor_config.json``).
        chunk_length: Seconds every chunk is padded to, and vLLM's
            ``max_audio_clip_s`` (``preprocessor_config.json``).
        max_source_positions: Encoder positions per chunk (``config.json``).
        overlap_chunk_second: Seconds searched for a quiet split point
            (vLLM ``SpeechToTextConfig`` default).
        resample_method: vLLM's resampling backend (not an HF kwarg).
    """

    sampling_rate: PositiveInt = 16_000
    hop_length: PositiveInt = 160
    chunk_length: PositiveInt = 30
    max_source_positions: PositiveInt = 1500
    overlap_chunk_second: PositiveInt = 1
    resample_method: ResampleMethod = DEFAULT_RESAMPLE_METHOD


def whisper_audio_units(item: AudioInput, p: WhisperAudioParams) -> AudioUnits:
    """Mel frames and encoder tokens of one clip sent to Whisper.

    ``frames`` = chunks x ``chunk_length * sampling_rate / hop_length``
    (3000: the padded mel frames the encoder reads) and ``tokens`` =
    chunks x ``max_source_positions`` (1500: the encoder prompt vLLM
    builds). A clip of at most 30 s is one chunk, an empty one included
    (the extractor pads it); longer clips are chunked as vLLM's
    transcription endpoint does (exact for silence and constant-level audio,
    at most one chunk too many otherwise; see ``speech_to_text_chunks``).
    """
    samples = samples_at_rate(item, p.sampling_rate, p.resample_method)
    chunks = speech_to_text_chunks(
        samples,
        sample_rate=p.sampling_rate,
        max_clip_s=p.chunk_length,
        overlap_s=p.overlap_chunk_second,
    )
    _, frames_per_chunk = whisper_mel_frames(
        0, hop_length=p.hop_length, max_length=p.chunk_length * p.sampling_rate
    )
    return AudioUnits(frames=chunks * frames_per_chunk, tokens=chunks * p.max_source_positions)


WHISPER = Profile(
    name="whisper",
    description=(
        "OpenAI Whisper via vLLM's transcription endpoint (reference: "
        "openai/whisper-large-v3): every chunk of up to 30 s is padded to 3000 mel "
        "frames and occupies 1500 encoder prompt tokens."
    ),
    audio=Counter(
        id="whisper.audio",
        version=1,
        params=WhisperAudioParams(),
        fn=whisper_audio_units,
        source=(
            "vllm@vllm/model_executor/models/whisper.py (PromptReplacement of "
            "max_source_positions tokens); vllm@vllm/multimodal/audio.py (split_audio); "
            "transformers@models/whisper/feature_extraction_whisper.py; "
            "openai/whisper-large-v3 preprocessor_config.json (chunk_length 30, hop_length "
            "160, sampling_rate 16000) and config.json (max_source_positions 1500)"
        ),
    ),
    aliases=("openai-whisper", "whisper-large-v3", "whisper-large-v3-turbo"),
)

PROFILES: tuple[Profile, ...] = (WHISPER,)
