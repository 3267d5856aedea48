"""Count the units of one request: parse, size each item, apply the profile's counters.

The hot path is the gateway's: everything that can be prepared once (the
profile, its parameters, the text tokenizer) lives on a
:class:`RequestCounter`; a call only parses the body, reads media headers
and runs the pure formulas. Media is never fully decoded and URLs are never
fetched unless a resolver is configured.

Nothing a client sends can make :meth:`RequestCounter.count` raise past a
non-object body: every item is counted in its own ``try``, and messages
carry no request data (see :mod:`modtrace.counting.safe`).
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .. import headers as H
from ..errors import one_line
from ..units import UnitCounts
from .media import B64View, MediaError, parse_data_url, probe_audio, probe_image
from .profile import AudioInput, ImageInput, Profile, VideoInput
from .profiles import DEFAULT_PROFILE, get_profile
from .request import Part, parse_request
from .result import ItemCount, RequestCount
from .safe import bounded, redact_url
from .text import TextCounter, text_counter

__all__ = [
    "CountingConfig",
    "CountingError",
    "RequestCounter",
    "Resolver",
    "TextConfig",
    "VideoDefaults",
    "count_request",
]

#: Fetches a URL's bytes when the user allows it; ``None`` means "unknown".
#: Called synchronously by :meth:`RequestCounter.count`, in the calling
#: thread: it must be bounded (a timeout, a size cap); see
#: :func:`modtrace.counting.resolver.url_resolver`.
Resolver = Callable[[str], bytes | None]


#: vLLM's video loader kwargs -> the video counters' parameter names.
VIDEO_LOADER_PARAMS = {
    "num_frames": "num_frames",
    "fps": "loader_fps",
    "video_backend": "video_backend",
}
#: Prepared profiles kept per counter; model names come from requests, so bound them.
_MAX_PREPARED = 256


def loader_params(media_io_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Counter parameters from vLLM ``media_io_kwargs`` (only ``video`` changes counts)."""
    video = media_io_kwargs.get("video")
    if not isinstance(video, Mapping):
        return {}
    return {VIDEO_LOADER_PARAMS[k]: v for k, v in video.items() if k in VIDEO_LOADER_PARAMS}


class CountingError(ValueError):
    """Raised in strict mode for the first item that cannot be counted."""


class TextConfig(BaseModel):
    """How text is tokenized (see :func:`modtrace.counting.text.text_counter`).

    ``kind="engine"`` leaves ``text.tokens`` to the engine's reported usage.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["bytes", "tiktoken", "hf", "engine"] = "bytes"
    encoding: str = "o200k_base"
    tiktoken_file: str | None = None
    tokenizer_json: str | None = None
    allow_download: bool = False
    tokens_per_message: int = Field(default=0, ge=0)
    tokens_per_request: int = Field(default=0, ge=0)


class VideoDefaults(BaseModel):
    """Video metadata used when the request headers do not carry it (llm-d's defaults)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    seconds: float = Field(default=10.0, gt=0)
    fps: float = Field(default=24.0, gt=0)
    width: int = Field(default=640, gt=0)
    height: int = Field(default=360, gt=0)


class CountingConfig(BaseModel):
    """Configuration of request counting (a file users edit).

    Attributes:
        profile: The default profile name.
        model_profiles: Model name -> profile, used when a request names its model.
        params: Counter parameter overrides by name (``max_pixels``, ``fps``...).
        text: How text is tokenized.
        default_image_size: Width and height assumed for an image that is
            not inline (a URL not fetched).
        default_audio_seconds: Duration assumed for audio behind a URL.
        video: Defaults for video metadata headers.
        media_io_kwargs: The server's ``--media-io-kwargs`` (video loader
            ``num_frames``, ``fps``, ``video_backend``).
        mm_processor_kwargs: Honour a request's ``mm_processor_kwargs`` and
            ``media_io_kwargs``.
        strict: Raise :class:`CountingError` instead of flagging bad items.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    profile: str = DEFAULT_PROFILE
    model_profiles: dict[str, str] = Field(default_factory=dict)
    params: dict[str, Any] = Field(default_factory=dict)
    text: TextConfig = TextConfig()
    default_image_size: tuple[int, int] = (640, 360)
    default_audio_seconds: float = Field(default=10.0, gt=0)
    video: VideoDefaults = VideoDefaults()
    media_io_kwargs: dict[str, Any] = Field(default_factory=dict)
    mm_processor_kwargs: bool = True
    strict: bool = False

    @field_validator("default_image_size")
    @classmethod
    def _size(cls, value: tuple[int, int]) -> tuple[int, int]:
        if min(value) <= 0:
            msg = f"default_image_size: both sides must be positive, got {value}"
            raise ValueError(msg)
        return value


class RequestCounter:
    """Counts requests with one configuration; build once, call per request.

    The text counter is built here, once: a configuration that cannot load
    (a tiktoken encoding neither cached nor downloadable, an unreadable
    ``tokenizer.json``) fails now, not on every request.

    Args:
        config: The counting configuration.
        resolver: Optional ``url -> bytes`` for media behind http(s) URLs.
            Without it, URLs are never fetched: the item gets the configured
            default size and is flagged ``defaulted``. :meth:`count` calls it
            synchronously, in the calling thread, once per URL item: bound it
            (timeout, maximum size; :func:`~modtrace.counting.resolver.url_resolver`
            is a reference), and call :meth:`count` off the event loop when
            one is configured. Whatever it raises flags only its item.

    Attributes:
        text: The text counter (``None`` when the engine reports text tokens).

    Raises:
        ValueError: The text configuration cannot be loaded.
    """

    def __init__(self, config: CountingConfig | None = None, resolver: Resolver | None = None):
        self.config = config or CountingConfig()
        self.resolver = resolver
        self.text: TextCounter | None = _build_text_counter(self.config.text)
        self._profiles: dict[tuple[str, str | None], Profile] = {}
        self._profiles_lock = threading.Lock()

    def profile(self, name: str | None = None, model: str | None = None) -> Profile:
        """Profile ``name`` (default: the configured one) with the configuration applied.

        Overrides apply in order: the profile's own parameters for ``model``
        (hosted APIs), the server's ``media_io_kwargs``, then ``params``.
        """
        name = name or self.config.profile
        prof = get_profile(name)
        key = (name, model if prof.model_params else None)
        # Another thread may clear the cache at any time: keep what we return local.
        prepared = self._profiles.get(key)
        if prepared is None:
            if model and prof.model_params:
                prof = prof.with_params(prof.model_params(model))
            prof = prof.with_params(loader_params(self.config.media_io_kwargs))
            prepared = prof.with_params(self.config.params)
            with self._profiles_lock:
                if len(self._profiles) >= _MAX_PREPARED:
                    self._profiles.clear()
                self._profiles[key] = prepared
        return prepared

    def profile_for_model(self, model: str | None) -> str:
        """The profile name for a request's model, from ``model_profiles``."""
        if model and model in self.config.model_profiles:
            return self.config.model_profiles[model]
        return self.config.profile

    def count(
        self,
        body: Mapping[str, Any],
        headers: Mapping[str, str] | None = None,
        *,
        profile: str | Profile | None = None,
    ) -> RequestCount:
        """Count one request body.

        Args:
            body: The JSON body (chat, completion or Responses request).
            headers: Request headers (video metadata, audio duration).
            profile: A profile name or object; default from the model map,
                else the configured profile.

        Every item is counted on its own: an item (or the text) that cannot
        be counted, whatever the exception, is flagged in ``errors`` and the
        rest of the request still counts. Messages carry no payload bytes,
        header values or URL credentials.

        Raises:
            ValueError: ``body`` is not an object, or an unknown profile.
            CountingError: in strict mode, the first item that cannot be counted.
        """
        parsed = parse_request(body)
        if isinstance(profile, Profile):
            prof = profile
        else:
            prof = self.profile(profile or self.profile_for_model(parsed.model), parsed.model)
        errors = list(parsed.errors)
        if self.config.mm_processor_kwargs:
            for name, overrides in (
                ("media_io_kwargs", loader_params(parsed.media_io_kwargs)),
                ("mm_processor_kwargs", parsed.mm_processor_kwargs),
            ):
                if not overrides:
                    continue
                try:
                    prof = prof.with_params(overrides)
                except (ValidationError, ValueError) as exc:
                    errors.append(bounded(f"{name} ignored: {one_line(exc)}"))
                except Exception as exc:  # any other failure: the defaults, its type only
                    errors.append(f"{name} ignored: {type(exc).__name__}")
        self._check_strict(errors)

        units: dict[str, float] = {}
        counters: dict[str, str] = {}
        defaulted: dict[str, bool] = {}
        items: list[ItemCount] = []
        if parsed.texts or parsed.messages or parsed.prompt_token_ids:
            tokens = parsed.prompt_token_ids
            if self.text is not None:
                try:
                    tokens += self.text.count(parsed.texts, parsed.messages)
                except Exception as exc:  # the media still count; the type only, no text
                    error = f"text not counted: the text counter raised {type(exc).__name__}"
                    errors.append(error)
                    self._check_strict([error])
                else:
                    counters["text"] = self.text.ref
                    units["text.tokens"] = float(tokens)
            elif parsed.prompt_token_ids:
                counters["text"] = "prompt-token-ids@1"
                units["text.tokens"] = float(tokens)

        # Headers matter only to videos and to audio behind a URL: most requests skip them.
        meta = _NO_META
        if any(
            p.modality == "video" or (p.modality == "audio" and p.data is None)
            for p in parsed.parts
        ):
            meta = _HeaderMeta.read(headers or {}, self.config)
            errors.extend(meta.errors)
        for part in parsed.parts:
            item = self._item(part, prof, meta)
            items.append(item)
            if item.error:
                errors.append(item.error)
                self._check_strict([item.error])
                continue
            for unit, value in item.units.items():
                units[unit] = units.get(unit, 0.0) + value
            counter = getattr(prof, item.modality)
            counters[item.modality] = counter.ref
            defaulted[item.modality] = defaulted.get(item.modality, False) or item.defaulted
        return RequestCount(
            profile=prof.name,
            counters=counters,
            units=UnitCounts(units),
            defaulted=defaulted,
            items=items,
            errors=errors,
        )

    def _check_strict(self, errors: list[str]) -> None:
        if self.config.strict and errors:
            raise CountingError(errors[0])

    # --- one item -----------------------------------------------------------
    def _item(self, part: Part, prof: Profile, meta: _HeaderMeta) -> ItemCount:
        base = {"index": part.index, "modality": part.modality}
        if part.error:
            return ItemCount(**base, error=part.error)
        counter = getattr(prof, part.modality)
        if counter is None:
            return ItemCount(**base, error=f"profile {prof.name} does not count {part.modality}")
        where = f"{part.kind} #{part.index}"
        try:
            if part.modality == "image":
                units, was_defaulted = self._image(part, counter)
            elif part.modality == "audio":
                units, was_defaulted = self._audio(part, counter, meta)
            else:
                units, was_defaulted = self._video(counter, meta)
        except _FetchFailed as exc:
            return ItemCount(**base, error=bounded(f"{where}: {exc}"))
        except (MediaError, ValueError) as exc:
            # modtrace's own messages: no payload bytes, echoed values bounded.
            return ItemCount(**base, error=bounded(f"{where}: {one_line(exc)}"))
        except Exception as exc:  # one item never fails the request; its type only
            error = f"{where}: could not be counted ({type(exc).__name__})"
            return ItemCount(**base, error=error)
        return ItemCount(**base, units=units, defaulted=was_defaulted)

    def _fetch(self, url: str) -> bytes | None:
        if self.resolver is None or not url.lower().startswith(("http://", "https://")):
            return None
        try:
            data = self.resolver(url)
        except Exception as exc:  # its message may hold the URL's credentials: type only
            raise _FetchFailed(url, exc) from None
        if data is not None and not isinstance(data, (bytes, bytearray, memoryview)):
            raise _FetchFailed(url, TypeError())
        return data

    def _image(self, part: Part, counter: Any) -> tuple[dict[str, float], bool]:
        url = part.url or ""
        defaulted = False
        if url[:5].lower() == "data:":
            header = probe_image(parse_data_url(url).source())
            width, height = header.width, header.height
        elif (data := self._fetch(url)) is not None:
            header = probe_image(data)
            width, height = header.width, header.height
        else:
            (width, height), defaulted = self.config.default_image_size, True
        result = counter(ImageInput(width=width, height=height, detail=part.detail))
        units = {
            "image.count": 1.0,
            "image.pixels": float(width * height),
            "image.tokens": float(result.tokens),
        }
        if result.tiles is not None:
            units["image.tiles"] = float(result.tiles)
        return units, defaulted

    def _audio(self, part: Part, counter: Any, meta: _HeaderMeta) -> tuple[dict[str, float], bool]:
        source: Any = None
        if part.data is not None:
            source = B64View(part.data)
        elif (part.url or "")[:5].lower() == "data:":
            source = parse_data_url(part.url or "").source()
        else:
            source = self._fetch(part.url or "")
        if source is None:
            clip, defaulted = AudioInput(seconds=meta.audio_seconds), meta.audio_defaulted
        else:
            header = probe_audio(source, part.format)
            clip = AudioInput(
                seconds=header.seconds,
                sample_rate=header.sample_rate,
                num_samples=header.num_samples,
            )
            defaulted = False
        result = counter(clip)
        return {
            "audio.count": 1.0,
            "audio.seconds": clip.seconds,
            "audio.frames": float(result.frames),
            "audio.tokens": float(result.tokens),
        }, defaulted

    def _video(self, counter: Any, meta: _HeaderMeta) -> tuple[dict[str, float], bool]:
        result = counter(meta.video)
        return {
            "video.count": 1.0,
            "video.seconds": meta.video.seconds,
            "video.frames": float(result.frames),
            "video.tokens": float(result.tokens),
        }, meta.video_defaulted


class _FetchFailed(Exception):
    """A resolver failed: the message names the redacted URL and the exception type only."""

    def __init__(self, url: str, exc: BaseException) -> None:
        super().__init__(f"fetching {redact_url(url)} failed ({type(exc).__name__})")


def _build_text_counter(t: TextConfig) -> TextCounter | None:
    """The text counter of ``t``, built once (``None`` for ``kind="engine"``).

    Raises:
        ValueError: It cannot be loaded; the message says why.
    """
    if t.kind == "engine":
        return None
    try:
        return text_counter(
            t.kind,
            encoding=t.encoding,
            tiktoken_file=t.tiktoken_file,
            tokenizer_json=t.tokenizer_json,
            allow_download=t.allow_download,
            tokens_per_message=t.tokens_per_message,
            tokens_per_request=t.tokens_per_request,
        )
    except ValueError:
        raise
    except Exception as exc:
        source = t.tokenizer_json if t.kind == "hf" else t.tiktoken_file or t.encoding
        msg = f"text counter {t.kind} ({source}) cannot be loaded: {one_line(exc)}"
        raise ValueError(msg) from exc


class _HeaderMeta:
    """Video and audio metadata from request headers, read once per request."""

    __slots__ = ("audio_defaulted", "audio_seconds", "errors", "video", "video_defaulted")

    def __init__(self) -> None:
        self.errors: list[str] = []

    @classmethod
    def read(cls, headers: Mapping[str, str], config: CountingConfig) -> _HeaderMeta:
        meta = cls()
        # Header names are case-insensitive.
        lower = {str(k).lower(): str(v) for k, v in headers.items()}
        d = config.video
        fps = meta._positive(lower, H.VIDEO_FPS)
        seconds = meta._positive(lower, H.VIDEO_DURATION)
        size = meta._resolution(lower)
        meta.video = VideoInput(
            seconds=seconds or d.seconds,
            fps=fps or d.fps,
            width=size[0] if size else d.width,
            height=size[1] if size else d.height,
        )
        meta.video_defaulted = fps is None or seconds is None or size is None
        audio = meta._positive(lower, H.AUDIO_DURATION) or meta._positive(
            lower, H.AUDIO_DURATION_LLMD
        )
        meta.audio_seconds = audio or config.default_audio_seconds
        meta.audio_defaulted = audio is None
        return meta

    def _positive(self, headers: Mapping[str, str], name: str) -> float | None:
        raw = headers.get(name)
        if raw is None:
            return None
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value <= 0:
            # The value is the client's: name the header, never echo it.
            self.errors.append(f"header {name}: not a positive number; default used")
            return None
        return value

    def _resolution(self, headers: Mapping[str, str]) -> tuple[int, int] | None:
        raw = headers.get(H.VIDEO_RESOLUTION)
        if raw is None:
            return None
        w, sep, h = raw.strip().lower().partition("x")
        if sep and _DIMENSION.fullmatch(w) and _DIMENSION.fullmatch(h):
            return int(w), int(h)
        self.errors.append(
            f"header {H.VIDEO_RESOLUTION}: not WIDTHxHEIGHT (positive integers); default used"
        )
        return None


#: A frame side in a resolution header: 1 to 9 ASCII digits, not all zeros.
_DIMENSION = re.compile(r"0*[1-9][0-9]{0,8}")


_NO_META = _HeaderMeta()
_default_counter: RequestCounter | None = None


def count_request(
    body: Mapping[str, Any],
    *,
    profile: str | Profile | None = None,
    headers: Mapping[str, str] | None = None,
    config: CountingConfig | None = None,
    **params: Any,
) -> RequestCount:
    """Count the units of one request body.

    A convenience over :class:`RequestCounter`; servers should build one
    ``RequestCounter`` and reuse it.

    Args:
        body: The JSON request body.
        profile: Profile name or object (default ``llm-d``).
        headers: Request headers (video metadata, audio duration).
        config: Counting configuration.
        **params: Counter parameter overrides (``max_pixels=...``).
    """
    global _default_counter
    if config is None and not params:
        if _default_counter is None:
            _default_counter = RequestCounter()
        counter = _default_counter
    else:
        config = config or CountingConfig()
        if params:
            config = config.model_copy(update={"params": {**config.params, **params}})
        counter = RequestCounter(config)
    return counter.count(body, headers, profile=profile)
