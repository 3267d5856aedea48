"""Profiles: the counters of one model family, each with an id and a version.

A counter is a pure function from what the gateway knows about one media
item (its size, its duration) and a set of parameters to the units the
engine will produce for it. Parameters are pydantic models whose field
names follow the Hugging Face processor kwargs (``max_pixels``, ``fps``,
``max_soft_tokens``...), so a request's ``mm_processor_kwargs`` and the
user's configuration override them by name.

Bump a counter's ``version`` whenever its output can change for the same
input: spans carry ``id@version`` so a method change is never mistaken
for a traffic change.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

__all__ = [
    "AudioCounter",
    "AudioInput",
    "AudioUnits",
    "Counter",
    "ImageCounter",
    "ImageInput",
    "ImageUnits",
    "Params",
    "Profile",
    "VideoCounter",
    "VideoInput",
    "VideoUnits",
    "check_size",
]


class Params(BaseModel):
    """Base class of counter parameters: frozen, unknown keys rejected."""

    model_config = ConfigDict(frozen=True, extra="forbid")


P = TypeVar("P", bound=Params)


# --- What the gateway knows about one item ----------------------------------
@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image as the gateway sees it: original size, and OpenAI ``detail``."""

    width: int
    height: int
    detail: str | None = None


@dataclass(frozen=True, slots=True)
class AudioInput:
    """One audio clip: duration, and the original sample rate and samples if known."""

    seconds: float
    sample_rate: int | None = None
    num_samples: int | None = None


@dataclass(frozen=True, slots=True)
class VideoInput:
    """One video: duration, source frame rate and frame size."""

    seconds: float
    fps: float
    width: int
    height: int


def check_size(width: object, height: object) -> tuple[int, int]:
    """``(width, height)`` of an image or video frame, once both are positive ints.

    Raises:
        ValueError: A side that is not an ``int`` (``bool`` included) or is below 1.
    """
    for value in (width, height):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            msg = (
                "each side must be a positive integer (size at least 1x1), "
                f"got {width!r}x{height!r}"
            )
            raise ValueError(msg)
    return width, height  # type: ignore[return-value]


# --- What a counter returns --------------------------------------------------
@dataclass(frozen=True, slots=True)
class ImageUnits:
    """Units of one image: prompt tokens it occupies, and tiles where the model tiles."""

    tokens: int
    tiles: int | None = None


@dataclass(frozen=True, slots=True)
class AudioUnits:
    """Units of one audio clip: encoder frames and prompt tokens."""

    frames: int
    tokens: int


@dataclass(frozen=True, slots=True)
class VideoUnits:
    """Units of one video: sampled frames and prompt tokens."""

    frames: int
    tokens: int


ItemT = TypeVar("ItemT")
UnitsT = TypeVar("UnitsT")


@dataclass(frozen=True, slots=True)
class Counter(Generic[ItemT, P, UnitsT]):
    """A versioned counting method with its parameters.

    Attributes:
        id: Stable name of the method (``"qwen2-vl.image"``).
        version: Bumped when the output can change for the same input.
        params: Parameter values, defaults from the official checkpoint config.
        fn: The pure formula ``fn(item, params) -> units``.
        source: Where the formula and defaults come from (code, config).
    """

    id: str
    version: int
    params: P
    fn: Callable[[ItemT, P], UnitsT]
    source: str = ""

    @property
    def ref(self) -> str:
        """``id@version``, as carried on spans."""
        return f"{self.id}@{self.version}"

    def __call__(self, item: ItemT) -> UnitsT:
        return self.fn(item, self.params)

    def with_params(self, overrides: Mapping[str, Any]) -> Counter[ItemT, P, UnitsT]:
        """A copy with the parameters that this counter knows replaced.

        Keys the parameters do not define are ignored: ``mm_processor_kwargs``
        often carries keys meant for another modality.
        """
        known = {k: v for k, v in overrides.items() if k in type(self.params).model_fields}
        if not known:
            return self
        merged = {**self.params.model_dump(), **known}
        return replace(self, params=type(self.params).model_validate(merged))


ImageCounter = Counter[ImageInput, Any, ImageUnits]
AudioCounter = Counter[AudioInput, Any, AudioUnits]
VideoCounter = Counter[VideoInput, Any, VideoUnits]


@dataclass(frozen=True)
class Profile:
    """The counters of one model family.

    A modality without a counter is not supported by the model; its items
    are flagged, not guessed.
    """

    name: str
    description: str
    image: ImageCounter | None = None
    audio: AudioCounter | None = None
    video: VideoCounter | None = None
    aliases: tuple[str, ...] = field(default=())
    #: Parameter overrides for a request's model name (hosted APIs price
    #: model families differently); ``None`` when the model does not matter.
    model_params: Callable[[str], Mapping[str, Any]] | None = None

    def with_params(self, overrides: Mapping[str, Any]) -> Profile:
        """A copy with ``overrides`` applied to every counter that knows them.

        vLLM also passes per-modality kwargs nested (``images_kwargs``,
        ``videos_kwargs``, ``audio_kwargs``); those reach only their modality
        and win over the flat keys.
        """
        counters = {}
        for modality, nested in _NESTED_KWARGS.items():
            counter = getattr(self, modality)
            if counter is not None:
                extra = overrides.get(nested)
                merged = {**overrides, **extra} if isinstance(extra, Mapping) else overrides
                counter = counter.with_params(merged)
            counters[modality] = counter
        return replace(self, **counters)


#: The nested kwargs key of each modality in Hugging Face processor calls.
_NESTED_KWARGS = {"image": "images_kwargs", "audio": "audio_kwargs", "video": "videos_kwargs"}
