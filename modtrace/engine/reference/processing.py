"""Requests in, model inputs out: what vLLM's input processor does for Qwen2.5-Omni.

An OpenAI chat request is parsed into messages, its media decoded and run
through the real Hugging Face processors configured as
``Qwen/Qwen2.5-Omni-7B``'s ``preprocessor_config.json`` says:

* images: ``Qwen2VLImageProcessorPil`` (``min_pixels`` 3136, ``max_pixels``
  12845056, patch 14, merge 2, temporal patch 2, CLIP mean and std), giving
  ``pixel_values`` and ``image_grid_thw``; the image becomes
  ``grid_t * grid_h * grid_w / merge**2`` ``<|IMAGE|>`` tokens, as vLLM's
  ``qwen2_5_omni_thinker`` prompt update expands it;
* audio: ``WhisperFeatureExtractor`` (128 mel bins, 160-sample hop,
  ``chunk_length`` 300 s, ``padding="max_length"``, attention mask on),
  after decoding the clip to 16 kHz mono; the clip becomes
  ``((L - 1) // 2 + 1 - 2) // 2 + 1`` ``<|AUDIO|>`` tokens for its ``L``
  mel frames with audio (the encoder's two convolutions and pooling).

Every item's token count is then checked against modtrace's counting profile
for the same request (``qwen2.5-omni``): the two are computed independently,
so a disagreement is a counting bug, reported as a 500 naming the item.

Video is refused (400): Hugging Face's ``Qwen2VLVideoProcessor`` needs
torchvision, which has no build for the pinned CPU torch.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...counting.counter import CountingConfig, RequestCounter
from ...counting.profile import Profile
from .model import AUDIO, IMAGE, render_chat

__all__ = [
    "AudioItem",
    "ImageItem",
    "InputProcessor",
    "PreparedRequest",
    "RequestError",
    "audio_output_length",
]

#: ``Qwen/Qwen2.5-Omni-7B`` ``preprocessor_config.json``, image side.
IMAGE_PROCESSOR_CONFIG: dict[str, Any] = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
}
#: ``Qwen/Qwen2.5-Omni-7B`` ``preprocessor_config.json``, audio side.
FEATURE_EXTRACTOR_CONFIG: dict[str, Any] = {
    "feature_size": 128,
    "sampling_rate": 16000,
    "hop_length": 160,
    "chunk_length": 300,
    "n_fft": 400,
    "padding_value": 0.0,
    "dither": 0.0,
    "return_attention_mask": True,
}
SAMPLING_RATE = 16000
#: Request keys of ``mm_processor_kwargs`` that reach the image processor.
IMAGE_KWARGS = ("min_pixels", "max_pixels", "size")
_TEXT_PARTS = ("text", "input_text")


class RequestError(Exception):
    """A request the engine refuses or fails: HTTP status, OpenAI error type, message."""

    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message


@dataclass(frozen=True)
class ImageItem:
    """One processed image: its patches, grid and placeholder tokens."""

    index: int
    pixel_values: Any  # torch.Tensor (patches, 3 * 2 * 14 * 14)
    grid_thw: tuple[int, int, int]
    tokens: int


@dataclass(frozen=True)
class AudioItem:
    """One processed clip: mel features of its ``frames`` mel frames, and its tokens."""

    index: int
    features: Any  # torch.Tensor (128, frames)
    frames: int
    tokens: int


@dataclass
class PreparedRequest:
    """What the engine runs for one request."""

    request_id: str
    model: str
    input_ids: list[int]
    images: list[ImageItem] = field(default_factory=list)
    audios: list[AudioItem] = field(default_factory=list)
    max_tokens: int = 16
    stream: bool = False
    include_usage: bool = False
    fault: str | None = None

    @property
    def image_tokens(self) -> int:
        """Placeholder tokens of all images."""
        return sum(i.tokens for i in self.images)

    @property
    def audio_tokens(self) -> int:
        """Placeholder tokens of all clips."""
        return sum(a.tokens for a in self.audios)


def audio_output_length(mel_frames: int) -> int:
    """Audio encoder output tokens for ``mel_frames`` frames (two convolutions, stride-2 pool).

    The model's own ``audio_tower._get_feat_extract_output_lengths`` is the
    authority; the engine checks this against it when it runs.
    """
    after_conv = (mel_frames - 1) // 2 + 1
    return (after_conv - 2) // 2 + 1


def _data_url_bytes(url: str, what: str) -> bytes:
    if not url.lower().startswith("data:"):
        msg = f"{what}: only data: URLs are accepted (the reference engine never fetches URLs)"
        raise RequestError(400, msg)
    header, sep, payload = url.partition(",")
    if not sep or ";base64" not in header.lower():
        raise RequestError(400, f"{what}: expected a base64 data: URL")
    return _b64(payload, what)


def _b64(payload: str, what: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(400, f"{what}: bad base64: {exc}") from None


class InputProcessor:
    """Parses requests and runs the Hugging Face processors (see the module docstring).

    Args:
        profile: The counting profile the engine's counts are checked against.
        check_counts: Raise a 500 when an item's tokens differ from the profile's.
    """

    def __init__(self, profile: Profile, *, check_counts: bool = True) -> None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )
        from transformers.models.whisper.feature_extraction_whisper import (
            WhisperFeatureExtractor,
        )

        self.profile = profile
        self.check_counts = check_counts
        self.image_processor = Qwen2VLImageProcessorPil(**IMAGE_PROCESSOR_CONFIG)
        self.feature_extractor = WhisperFeatureExtractor(**FEATURE_EXTRACTOR_CONFIG)
        self.counter = RequestCounter(CountingConfig())

    # -- The request -------------------------------------------------------------------
    def prepare(
        self,
        body: Mapping[str, Any],
        *,
        request_id: str,
        model: str,
        headers: Mapping[str, str] | None = None,
        default_max_tokens: int = 16,
        max_tokens_limit: int = 4096,
    ) -> PreparedRequest:
        """Parse and process one chat request.

        Raises:
            RequestError: 400 for a request the engine cannot run, 500 when
                the counts disagree with the profile.
        """
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise RequestError(400, "messages: expected a non-empty list")
        kwargs = body.get("mm_processor_kwargs") or {}
        if not isinstance(kwargs, Mapping):
            raise RequestError(400, "mm_processor_kwargs: expected an object")
        image_kwargs = _image_kwargs(kwargs)
        rendered: list[tuple[str, list[tuple[str, str]]]] = []
        images: list[ImageItem] = []
        audios: list[AudioItem] = []
        media_index = 0
        for n, message in enumerate(messages):
            if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
                raise RequestError(400, f"messages[{n}]: expected an object with a role")
            parts: list[tuple[str, str]] = []
            content = message.get("content")
            if isinstance(content, str):
                parts.append(("text", content))
            elif isinstance(content, list):
                for part in content:
                    kind = self._part(part, media_index, image_kwargs, images, audios, n)
                    if kind[0] != "text":
                        media_index += 1
                    parts.append(kind)
            elif content is not None:
                raise RequestError(400, f"messages[{n}].content: expected a string or a list")
            rendered.append((message["role"], parts))
        prepared = PreparedRequest(
            request_id=request_id,
            model=model,
            input_ids=_expand(render_chat(rendered), images, audios),
            images=images,
            audios=audios,
            max_tokens=_max_tokens(body, default_max_tokens, max_tokens_limit),
            stream=bool(body.get("stream", False)),
            include_usage=_include_usage(body),
        )
        if self.check_counts:
            self._check(body, headers, images, audios)
        return prepared

    def _part(
        self,
        part: object,
        index: int,
        image_kwargs: Mapping[str, Any],
        images: list[ImageItem],
        audios: list[AudioItem],
        message: int,
    ) -> tuple[str, str]:
        where = f"messages[{message}]"
        if not isinstance(part, Mapping):
            raise RequestError(400, f"{where}: content parts must be objects")
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            text = part.get("text")
            if not isinstance(text, str):
                raise RequestError(400, f"{where}: a text part needs a text string")
            return ("text", text)
        if kind == "image_url":
            image_url = part.get("image_url")
            url = image_url.get("url") if isinstance(image_url, Mapping) else image_url
            if not isinstance(url, str):
                raise RequestError(400, f"{where}: image_url needs a url")
            images.append(self.image(_data_url_bytes(url, "image_url"), index, image_kwargs))
            return ("image", "")
        if kind == "input_audio":
            audio = part.get("input_audio")
            if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str):
                raise RequestError(400, f"{where}: input_audio needs base64 data")
            audios.append(self.audio(_b64(audio["data"], "input_audio"), index))
            return ("audio", "")
        if kind == "audio_url":
            audio_url = part.get("audio_url")
            url = audio_url.get("url") if isinstance(audio_url, Mapping) else audio_url
            if not isinstance(url, str):
                raise RequestError(400, f"{where}: audio_url needs a url")
            audios.append(self.audio(_data_url_bytes(url, "audio_url"), index))
            return ("audio", "")
        if kind == "video_url":
            msg = "video is not supported by the reference engine (no torchvision for its torch)"
            raise RequestError(400, msg)
        raise RequestError(400, f"{where}: unsupported content part type {kind!r}")

    # -- Media ----------------------------------------------------------------------------
    def image(
        self, data: bytes, index: int = 0, kwargs: Mapping[str, Any] | None = None
    ) -> ImageItem:
        """Decode one image and run the image processor on it.

        Raises:
            RequestError: 400 for bytes PIL cannot read or rejected kwargs.
        """
        from PIL import Image, UnidentifiedImageError

        try:
            with Image.open(io.BytesIO(data)) as opened:
                image = opened.convert("RGB")
        except (UnidentifiedImageError, OSError, ValueError) as exc:
            raise RequestError(400, f"image #{index}: cannot decode: {exc}") from None
        try:
            out = self.image_processor(images=[image], return_tensors="pt", **(kwargs or {}))
        except (ValueError, TypeError) as exc:
            raise RequestError(400, f"image #{index}: {exc}") from None
        grid = tuple(int(v) for v in out["image_grid_thw"][0].tolist())
        merge = self.image_processor.merge_size
        tokens = grid[0] * grid[1] * grid[2] // (merge * merge)
        return ImageItem(index, out["pixel_values"], (grid[0], grid[1], grid[2]), tokens)

    def audio(self, data: bytes, index: int = 0) -> AudioItem:
        """Decode one clip to 16 kHz mono and run the feature extractor on it.

        Raises:
            RequestError: 400 for bytes soundfile cannot read, or a clip too
                short to give one audio token (vLLM refuses those too).
        """
        samples = self.samples(data, index)
        fe = self.feature_extractor
        n = min(len(samples), fe.n_samples)
        # padding="max_length" pads every clip to 300 s of zeros before the
        # STFT. The frames with audio are the same for any pad that is a
        # multiple of the hop and reaches past the clip's last window, and
        # the log-mel floor (max - 8) comes from the audio frames, so pad to
        # just past the clip: same features, a fraction of the time.
        hops = -(-n // fe.hop_length) + -(-fe.n_fft // fe.hop_length)
        pad_to = min(fe.n_samples, hops * fe.hop_length)
        out = fe(
            samples[:n],
            sampling_rate=SAMPLING_RATE,
            padding="max_length",
            max_length=pad_to,
            truncation=True,
            return_attention_mask=True,
            return_tensors="pt",
        )
        frames = int(out["attention_mask"][0].sum())
        tokens = audio_output_length(frames)
        if tokens <= 0:
            msg = f"audio #{index}: {n} samples are too short to be represented"
            raise RequestError(400, msg)
        return AudioItem(index, out["input_features"][0, :, :frames], frames, tokens)

    def samples(self, data: bytes, index: int = 0) -> Any:
        """The clip as float32 16 kHz mono samples (``numpy``).

        Channels are averaged, as vLLM's librosa-style loading does. Other
        rates are resampled by linear interpolation to the sample count
        ``round(n * 16000 / rate)``; UNVERIFIED against vLLM's resampler,
        whose length rule differs by backend (see
        ``modtrace.counting.families.audio_common``), so send 16 kHz audio
        where counts must match to the token.
        """
        import numpy as np
        import soundfile

        try:
            wave, rate = soundfile.read(io.BytesIO(data), dtype="float32", always_2d=True)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise RequestError(400, f"audio #{index}: cannot decode: {exc}") from None
        mono = wave.mean(axis=1).astype(np.float32)
        if rate == SAMPLING_RATE or len(mono) == 0:
            return mono
        target = max(1, round(len(mono) * SAMPLING_RATE / rate))
        grid = np.linspace(0.0, len(mono) - 1, target)
        return np.interp(grid, np.arange(len(mono)), mono).astype(np.float32)

    # -- The profile check ------------------------------------------------------------------
    def _check(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str] | None,
        images: list[ImageItem],
        audios: list[AudioItem],
    ) -> None:
        """Compare every item's tokens with the counting profile's; raise a 500 on a difference."""
        try:
            count = self.counter.count(body, headers, profile=self.profile)
        except Exception as exc:
            msg = f"counting profile {self.profile.name} failed on this request: {exc}"
            raise RequestError(500, msg, "CountMismatchError") from exc
        engine = {i.index: ("image", i.tokens) for i in images}
        engine.update({a.index: ("audio", a.tokens) for a in audios})
        problems: list[str] = []
        for item in count.items:
            ours = engine.get(item.index)
            if ours is None:
                continue
            modality, tokens = ours
            counted = item.units.get(f"{modality}.tokens")
            if item.error or counted is None or not math.isclose(counted, tokens):
                why = item.error or f"profile says {counted}"
                problems.append(f"{modality} #{item.index}: engine {tokens} tokens, {why}")
        if problems:
            msg = f"counting profile {self.profile.name} disagrees: " + "; ".join(problems)
            raise RequestError(500, msg, "CountMismatchError")


def _expand(ids: list[int], images: list[ImageItem], audios: list[AudioItem]) -> list[int]:
    """Replace each placeholder with its item's number of placeholder tokens, in order."""
    image_iter = iter(images)
    audio_iter = iter(audios)
    out: list[int] = []
    for token in ids:
        if token == IMAGE:
            out += [IMAGE] * next(image_iter).tokens
        elif token == AUDIO:
            out += [AUDIO] * next(audio_iter).tokens
        else:
            out.append(token)
    return out


def _image_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The image processor kwargs of a request's ``mm_processor_kwargs``.

    ``min_pixels``/``max_pixels`` are passed as the ``size`` bounds they
    stand for (transformers 5 deprecates the flat names in a call), on top
    of the checkpoint's bounds.
    """
    if not any(k in kwargs for k in IMAGE_KWARGS):
        return {}
    size = {
        "shortest_edge": IMAGE_PROCESSOR_CONFIG["min_pixels"],
        "longest_edge": IMAGE_PROCESSOR_CONFIG["max_pixels"],
    }
    given = kwargs.get("size")
    if given is not None and not isinstance(given, Mapping):
        raise RequestError(400, "mm_processor_kwargs.size: expected an object")
    size.update(given or {})
    for name, edge in (("min_pixels", "shortest_edge"), ("max_pixels", "longest_edge")):
        if name in kwargs:
            size[edge] = kwargs[name]
    return {"size": size}


def _max_tokens(body: Mapping[str, Any], default: int, limit: int) -> int:
    value = body.get("max_completion_tokens", body.get("max_tokens"))
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RequestError(400, f"max_tokens: expected a positive integer, got {value!r}")
    return min(value, limit)


def _include_usage(body: Mapping[str, Any]) -> bool:
    options = body.get("stream_options")
    return isinstance(options, Mapping) and bool(options.get("include_usage", False))
