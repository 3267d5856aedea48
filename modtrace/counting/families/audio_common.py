"""What the audio models share: samples at the model's rate, and Whisper mel frames.

Every audio model here takes 16 kHz mono samples through a Hugging Face
``WhisperFeatureExtractor`` (a 25 ms window every ``hop_length`` = 160
samples, i.e. 100 mel frames per second). Two steps decide how many mel
frames a clip becomes; both are reproduced here, exactly but for one backend:

1. **Resampling** (vLLM ``vllm/multimodal/audio.py``, ``AudioResampler``):
   a clip sent at another rate is resampled to the feature extractor's rate
   before the processor sees it. Every backend vLLM has used returns about
   ``N * target / orig`` samples, but they round differently, and one
   sample can move a mel frame. :func:`resampled_length` reproduces each
   backend's length rule; the backend is a setting (``resample_method``)
   because vLLM changed its default over time: ``librosa`` until vLLM
   dropped it (PR #37058, March 2026), then ``pyav``, then ``torchaudio``
   (PR #52598, August 2026: the default here). ``pyav`` is modelled to
   within one sample. Phi-4-MM pins ``scipy``; no model here does.
2. **Padding and the attention mask** (transformers
   ``models/whisper/feature_extraction_whisper.py``): the extractor pads
   or truncates the samples, and the mel frames that carry audio are the
   ones its ``attention_mask`` marks. :func:`whisper_mel_frames` reproduces
   that count, including its quirk when audio is longer than
   ``max_length`` and not truncated.

Whisper-style chunking of long clips by vLLM's transcription endpoint is in
:func:`speech_to_text_chunks`.
"""

from __future__ import annotations

import math
from typing import Literal

from ...units import check_number
from ..profile import AudioInput
from .numerics import ceil_div, float32

__all__ = [
    "DEFAULT_RESAMPLE_METHOD",
    "ResampleMethod",
    "resampled_length",
    "samples_at_rate",
    "speech_to_text_chunks",
    "whisper_mel_frames",
]

#: vLLM's resampling backends, by the name ``AudioResampler(method=...)`` takes.
ResampleMethod = Literal["torchaudio", "pyav", "scipy", "soxr", "librosa"]
#: vLLM main's default since PR #52598 (torchaudio became the default backend).
DEFAULT_RESAMPLE_METHOD: ResampleMethod = "torchaudio"
_METHODS: tuple[str, ...] = ("torchaudio", "pyav", "scipy", "soxr", "librosa")


def _check_rate(field: str, rate: float) -> float:
    number = check_number(field, rate)
    if number <= 0:
        msg = f"{field}: must be positive, got {rate!r}"
        raise ValueError(msg)
    return number


def _check_samples(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"{field}: expected a non-negative integer, got {value!r}"
        raise ValueError(msg)
    return value


def resampled_length(
    num_samples: int,
    orig_sr: float,
    target_sr: float,
    method: ResampleMethod = DEFAULT_RESAMPLE_METHOD,
) -> int:
    """Samples vLLM's ``AudioResampler`` returns for ``num_samples`` at ``orig_sr``.

    Rates within 1e-6 Hz of each other are not resampled (``AudioResampler``
    returns the input). Otherwise, per backend:

    * ``torchaudio``: rates rounded to integers and divided by their gcd
      ``o, t``; ``ceil(float32(t * N / o))``, capped at ``(N // o + 1) * t``,
      the samples the sinc kernel produces (torchaudio
      ``functional._apply_sinc_resample_kernel``). The float32 step makes it
      one short of the exact ceiling when ``t * N / o`` lies just above an
      integer, e.g. 44.1 kHz clips near 30 s.
    * ``scipy``: ``resample_poly(x, t, o)`` returns ``ceil(N * t / o)``.
    * ``soxr``: ``int(N * t / o + 0.5)`` (python-soxr one-shot resample).
    * ``librosa``: ``ceil(N * (target / orig))`` in float64 on the unrounded
      rates (``librosa.resample`` with ``fix=True``).
    * ``pyav``: vLLM trims libswresample's output to ``ceil(N * t / o)``;
      libswresample sometimes returns one sample less, which this does not
      model (off by at most one sample, UNVERIFIED beyond the rates tested).

    Args:
        num_samples: Samples of the clip at its own rate.
        orig_sr: The clip's sample rate in Hz.
        target_sr: The feature extractor's rate in Hz.
        method: The vLLM resampling backend.

    Returns:
        The number of samples at ``target_sr``.
    """
    if method not in _METHODS:
        msg = f"unknown resample_method {method!r}; expected one of: {', '.join(_METHODS)}"
        raise ValueError(msg)
    n = _check_samples("num_samples", num_samples)
    orig = _check_rate("sample_rate", orig_sr)
    target = _check_rate("target_sr", target_sr)
    if math.isclose(orig, target, rel_tol=0.0, abs_tol=1e-6):
        return n
    if method == "librosa":
        return math.ceil(n * (target / orig))
    o, t = round(orig), round(target)
    if o == t:
        return n
    if method == "soxr":
        return int(n * t / o + 0.5)
    if method == "torchaudio":
        g = math.gcd(o, t)
        o, t = o // g, t // g
        return min(math.ceil(float32(t * n / o)), (n // o + 1) * t)
    return ceil_div(n * t, o)  # scipy, pyav


def samples_at_rate(
    item: AudioInput,
    target_sr: int,
    method: ResampleMethod = DEFAULT_RESAMPLE_METHOD,
) -> int:
    """Samples of ``item`` once vLLM has brought it to ``target_sr``.

    * ``num_samples`` and ``sample_rate`` known: :func:`resampled_length`.
    * ``num_samples`` without a rate: taken as already at ``target_sr``, as
      vLLM does for raw arrays sent without a rate.
    * only ``seconds`` (and perhaps ``sample_rate``): the samples are
      ``round(seconds * rate)`` at that rate, then resampled. A duration
      read from a header is exact to a sample only if it was.

    Raises:
        ValueError: negative or non-finite seconds, a non-positive rate, or
            a non-integer sample count.
    """
    if item.num_samples is not None:
        n = _check_samples("num_samples", item.num_samples)
        if item.sample_rate is None:
            return n
        return resampled_length(n, item.sample_rate, target_sr, method)
    seconds = check_number("seconds", item.seconds)
    if item.sample_rate is None:
        return math.floor(seconds * target_sr + 0.5)
    rate = _check_rate("sample_rate", item.sample_rate)
    return resampled_length(math.floor(seconds * rate + 0.5), rate, target_sr, method)


def whisper_mel_frames(
    num_samples: int,
    *,
    hop_length: int = 160,
    n_fft: int = 400,
    max_length: int = 480_000,
    padding: Literal["max_length", "longest"] = "max_length",
    truncation: bool = True,
    pad_to_multiple_of: int | None = None,
) -> tuple[int, int]:
    """Mel frames of one clip through ``WhisperFeatureExtractor``: (with audio, in total).

    As ``SequenceFeatureExtractor.pad`` does: with ``truncation`` the clip
    is cut to ``max_length`` (rounded up to ``pad_to_multiple_of``); it is
    then padded to ``max_length`` (``padding="max_length"``) or to its own
    length (``"longest"``, one clip), rounded up likewise, giving ``P``
    samples and ``P // hop_length`` feature frames. The frames with audio
    are those the ``attention_mask`` marks: the mask keeps every
    ``hop_length``-th sample, and drops its last entry when ``P`` is not a
    multiple of ``hop_length``. So a padded clip has ``ceil(N / hop)`` such
    frames, and an untruncated clip longer than ``max_length`` ``N // hop``.

    Args:
        num_samples: Samples at the extractor's rate.
        hop_length: Samples per mel frame.
        n_fft: STFT window; ``torch.stft`` needs over ``n_fft // 2`` samples.
        max_length: Samples the extractor pads or truncates to
            (``chunk_length * sampling_rate``, its ``n_samples``).
        padding: ``"max_length"`` (Qwen, Whisper) or ``"longest"`` (Ultravox).
        truncation: Whether samples past ``max_length`` are cut.
        pad_to_multiple_of: Round lengths up to a multiple of this.

    Returns:
        ``(frames with audio, frames in the feature tensor)``.

    Raises:
        ValueError: the padded clip has at most ``n_fft // 2`` samples: the
            extractor's ``torch.stft`` (reflect padding) refuses it, as it
            does in vLLM. (Without torch, transformers' numpy path refuses
            only clips under one hop.)
    """
    n = _check_samples("num_samples", num_samples)
    multiple = pad_to_multiple_of or 1
    cap = ceil_div(max_length, multiple) * multiple
    if truncation:
        n = min(n, cap)
    target = cap if padding == "max_length" else ceil_div(n, multiple) * multiple
    padded = max(n, target)
    if padded <= n_fft // 2:
        msg = (
            f"{num_samples} samples are too few for the mel spectrogram: "
            f"the feature extractor needs more than {n_fft // 2}"
        )
        raise ValueError(msg)
    marked = ceil_div(n, hop_length)
    if padded % hop_length and marked == ceil_div(padded, hop_length):
        marked -= 1
    return marked, padded // hop_length


def speech_to_text_chunks(
    num_samples: int,
    *,
    sample_rate: int = 16_000,
    max_clip_s: float = 30,
    overlap_s: float = 1,
) -> int:
    """Chunks vLLM's transcription endpoint splits a clip into.

    ``split_audio`` (vLLM ``vllm/multimodal/audio.py``) cuts a clip longer
    than ``max_clip_s`` at the quietest 0.1 s window of the last
    ``overlap_s`` of each chunk, so each chunk but the last lasts between
    ``max_clip_s - overlap_s`` and ``max_clip_s - 0.1`` seconds. The quietest
    window depends on the audio; this returns the count for cuts at the
    start of the overlap (what silence or constant-level audio gives), an
    upper bound otherwise. vLLM's docstring example: 65 s → 3 chunks.
    """
    n = _check_samples("num_samples", num_samples)
    chunk = int(sample_rate * max_clip_s)
    step = chunk - int(sample_rate * overlap_s)
    if n <= chunk:
        return 1
    return 1 + ceil_div(n - chunk, step)
