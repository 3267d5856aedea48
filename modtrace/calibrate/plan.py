"""Probe plans: which requests a calibration run sends, as real request bodies.

A plan lists single-modality probes at representative sizes (text lengths;
image sizes such as 224, 448, 1024 and 1920x1080; audio durations; video
lengths and frame sizes), each sent ``repeats`` times, preceded by warm-up
requests, plus a few mixed requests held out of the fit to validate it.

A plan is a small JSON document; its **digest** (sha256 of its canonical
JSON) is stamped on every probe file and calibration made from it, so a
calibration always says exactly what was measured. Requests are built from
the plan on demand, deterministically: the same plan yields the same bodies.

Every request carries different content (each probe has its own seed), so
repeats do not hit the engine's prefix cache or multimodal processor cache,
and ``max_tokens`` is fixed (default 1) so decode time is the same for all
probes and falls into the fitted per-request overhead.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .. import headers as H
from ..errors import load_json_model
from .media import avi_mjpeg, data_url, image_bytes, video_frame_count, wav_bytes

if TYPE_CHECKING:
    from ..units import UnitCounts

__all__ = [
    "PLAN_FORMAT",
    "AudioItem",
    "CountFn",
    "CountResult",
    "ImageItem",
    "MixedRequest",
    "ProbeKind",
    "ProbePlan",
    "ProbeRequest",
    "ProbeSpec",
    "VideoItem",
    "build_request",
    "default_count_fn",
    "iter_requests",
    "load_plan",
    "profile_modalities",
    "save_plan",
]

PLAN_FORMAT = "modtrace.probe-plan/1"
ProbeKind = Literal["warmup", "probe", "holdout"]
PROBE_MODALITIES: tuple[str, ...] = ("text", "image", "audio", "video")

# Everyday English words: text probes are seeded word salads of these.
_WORD_LIST = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy process music market sense nation plan college interest "
    "death experience effect use class control care field development role effort rate heart "
    "drug show leader light voice wife police mind price report decision son view relationship "
    "town road arm difference value building action model season society tax director position "
    "player record paper space ground form event official matter center couple site project "
    "activity star table need court oil situation cost industry figure street image phone data"
)
_WORDS = tuple(_WORD_LIST.split())

_PROMPTS = {
    "image": "Describe this image.",
    "audio": "Transcribe this audio.",
    "video": "Describe this video.",
    "mixed": "Answer using all of the attached content.",
}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class ImageItem(_Frozen):
    """One image of a probe: its size and file format."""

    width: int = Field(gt=0, le=16384)
    height: int = Field(gt=0, le=16384)
    format: Literal["png", "jpeg"] = "png"

    @property
    def label(self) -> str:
        """``WIDTHxHEIGHT``."""
        return f"{self.width}x{self.height}"


class AudioItem(_Frozen):
    """One audio clip of a probe: duration and sample rate (16-bit mono WAV)."""

    seconds: float = Field(gt=0, le=3600)
    sample_rate: int = Field(default=16000, gt=0)

    @property
    def label(self) -> str:
        """``<seconds>s``."""
        return f"{self.seconds:g}s"


class VideoItem(_Frozen):
    """One video of a probe: duration, frame rate and frame size (MJPEG AVI)."""

    seconds: float = Field(gt=0, le=600)
    fps: float = Field(gt=0, le=120)
    width: int = Field(gt=0, le=4096)
    height: int = Field(gt=0, le=4096)

    @property
    def label(self) -> str:
        """``<seconds>s@<fps>fps-WIDTHxHEIGHT``."""
        return f"{self.seconds:g}s@{self.fps:g}fps-{self.width}x{self.height}"


class MixedRequest(_Frozen):
    """A held-out request mixing modalities, used to validate a fit, never to fit."""

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
    text_words: int = Field(default=128, ge=1)
    images: tuple[ImageItem, ...] = ()
    audios: tuple[AudioItem, ...] = ()
    videos: tuple[VideoItem, ...] = ()

    def modalities(self) -> list[str]:
        """The modalities the request carries, text included."""
        items = {"image": self.images, "audio": self.audios, "video": self.videos}
        return ["text", *(m for m, v in items.items() if v)]


class ProbeSpec(_Frozen):
    """One request of a plan, before its bytes are made.

    Attributes:
        id: Unique within the plan: ``image/1024x1024/r1``, ``warmup/audio/r0``...
        kind: ``warmup`` (sent first, never fitted), ``probe`` (fitted) or
            ``holdout`` (mixed, used to validate).
        modality: The one modality a probe measures, or ``mixed``.
        size: The size label (``1024x1024``, ``20s``, ``512w``...).
        text_words: Words of generated text.
        seed: Seeds the text and the media bytes.
    """

    id: str
    kind: ProbeKind
    modality: Literal["text", "image", "audio", "video", "mixed"]
    size: str
    text_words: int
    images: tuple[ImageItem, ...] = ()
    audios: tuple[AudioItem, ...] = ()
    videos: tuple[VideoItem, ...] = ()
    seed: int


def _default_images() -> tuple[ImageItem, ...]:
    sizes = ((224, 224), (448, 448), (640, 480), (1024, 1024), (1280, 720), (1920, 1080))
    # Alternate PNG and JPEG: both are what clients send.
    return tuple(
        ImageItem(width=w, height=h, format="png" if i % 2 == 0 else "jpeg")
        for i, (w, h) in enumerate(sizes)
    )


def _default_videos() -> tuple[VideoItem, ...]:
    shapes = ((2, 640, 360), (4, 640, 360), (8, 640, 360), (4, 1280, 720), (8, 1280, 720))
    return tuple(VideoItem(seconds=s, fps=12, width=w, height=h) for s, w, h in shapes)


def _default_holdout() -> tuple[MixedRequest, ...]:
    img = ImageItem
    return (
        MixedRequest(name="text+image", text_words=256, images=(img(width=1024, height=1024),)),
        MixedRequest(
            name="text+2images",
            text_words=128,
            images=(img(width=640, height=480), img(width=1920, height=1080, format="jpeg")),
        ),
        MixedRequest(name="text+audio", text_words=256, audios=(AudioItem(seconds=20),)),
        MixedRequest(
            name="text+image+audio",
            text_words=600,
            images=(img(width=1280, height=720, format="jpeg"),),
            audios=(AudioItem(seconds=10),),
        ),
        MixedRequest(
            name="text+video",
            text_words=128,
            videos=(VideoItem(seconds=4, fps=12, width=640, height=360),),
        ),
        MixedRequest(
            name="text+image+video",
            text_words=256,
            images=(img(width=448, height=448),),
            videos=(VideoItem(seconds=2, fps=12, width=640, height=360),),
        ),
    )


class ProbePlan(_Frozen):
    """What a calibration run sends, for one counting profile.

    Attributes:
        format: The plan file format.
        profile: The counting profile whose units are fitted.
        model: The ``model`` field of every request body (default: the profile name).
        counting: Extra :class:`~modtrace.counting.counter.CountingConfig`
            fields (text tokenizer, parameter overrides), as JSON.
        modalities: The modalities probed; text is always probed.
        repeats: How many times each probe size is sent (fresh content each time).
        warmup: Warm-up requests per probed modality, sent first, never fitted.
        seed: Seeds the content of every request and the send order.
        shuffle: Send probes in a seeded random order, so that slow drifts of
            the machine (clocks, heat) do not line up with probe size.
        max_tokens: ``max_tokens`` of every request.
        prompt_words: Extra words of text in each media probe.
        text_words: Sizes of the text probes, in words.
        images: Image probe sizes.
        audios: Audio probe durations.
        videos: Video probe shapes.
        holdout: Mixed requests held out of the fit; those needing a modality
            that is not probed are left out of the requests.
    """

    format: Literal["modtrace.probe-plan/1"] = PLAN_FORMAT
    profile: str = Field(min_length=1)
    model: str | None = None
    counting: dict[str, Any] = Field(default_factory=dict)
    modalities: tuple[Literal["text", "image", "audio", "video"], ...] = PROBE_MODALITIES
    repeats: int = Field(default=3, ge=1, le=1000)
    warmup: int = Field(default=2, ge=0, le=100)
    seed: int = 0
    shuffle: bool = True
    max_tokens: int = Field(default=1, ge=1)
    prompt_words: int = Field(default=0, ge=0)
    text_words: tuple[int, ...] = (16, 128, 512, 1024, 2048, 4096)
    images: tuple[ImageItem, ...] = Field(default_factory=_default_images)
    audios: tuple[AudioItem, ...] = tuple(AudioItem(seconds=s) for s in (1, 5, 10, 20, 30))
    videos: tuple[VideoItem, ...] = Field(default_factory=_default_videos)
    holdout: tuple[MixedRequest, ...] = Field(default_factory=_default_holdout)

    @field_validator("modalities")
    @classmethod
    def _with_text(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if "text" not in value:
            # Every probe carries some text: its weight must be fitted.
            value = ("text", *value)
        return tuple(m for m in PROBE_MODALITIES if m in value)

    @field_validator("text_words")
    @classmethod
    def _words(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        if any(w < 1 for w in value):
            msg = f"text_words: every size must be at least 1 word, got {list(value)}"
            raise ValueError(msg)
        return value

    @field_validator("counting")
    @classmethod
    def _counting(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "profile" in value:
            msg = "counting: set the profile with the plan's 'profile' field, not here"
            raise ValueError(msg)
        return value

    @classmethod
    def for_profile(
        cls,
        profile: str,
        *,
        modalities: Sequence[str] | None = None,
        **fields: Any,
    ) -> ProbePlan:
        """The default plan for ``profile``, probing the modalities it counts.

        Args:
            profile: A counting profile name.
            modalities: The modalities to probe; default: those the profile
                has a counter for (see :func:`profile_modalities`).
            **fields: Any other plan field (``repeats=5``, ``images=...``).
        """
        chosen = tuple(modalities) if modalities is not None else profile_modalities(profile)
        return cls(profile=profile, modalities=chosen, **fields)  # type: ignore[arg-type]

    def canonical_json(self) -> str:
        """The plan as canonical JSON: sorted keys, no spaces. What the digest hashes."""
        return json.dumps(
            self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"), allow_nan=False
        )

    def digest(self) -> str:
        """``sha256:<hex>`` of :meth:`canonical_json`."""
        return "sha256:" + hashlib.sha256(self.canonical_json().encode("utf-8")).hexdigest()

    def to_json(self) -> str:
        """The plan as indented JSON, as written to disk."""
        return self.model_dump_json(indent=2)

    def holdout_requests(self) -> list[MixedRequest]:
        """The held-out requests whose modalities are all probed."""
        return [h for h in self.holdout if set(h.modalities()) <= set(self.modalities)]

    def probes(self) -> list[ProbeSpec]:
        """Every request of the plan, in send order: warm-ups, probes (shuffled), held-out."""
        measured: list[ProbeSpec] = []
        sizes: dict[str, list[tuple[str, ProbeSpec]]] = {}
        for modality in self.modalities:
            for label, spec in self._sizes(modality):
                sizes.setdefault(modality, []).append((label, spec))
                for r in range(self.repeats):
                    measured.append(self._spec(spec, f"{modality}/{label}/r{r}", "probe"))
        warm: list[ProbeSpec] = []
        for modality, options in sizes.items():
            # Warm up on a mid-sized probe of each modality: compiles kernels, fills pools.
            label, spec = options[len(options) // 2]
            warm.extend(
                self._spec(spec, f"warmup/{modality}/{label}/r{r}", "warmup")
                for r in range(self.warmup)
            )
        if self.shuffle:
            random.Random(_seed(self.seed, "order")).shuffle(measured)
        held = []
        for mixed in self.holdout_requests():
            spec = ProbeSpec(
                id="",
                kind="holdout",
                modality="mixed",
                size=mixed.name,
                text_words=mixed.text_words,
                images=mixed.images,
                audios=mixed.audios,
                videos=mixed.videos,
                seed=0,
            )
            held.extend(
                self._spec(spec, f"holdout/{mixed.name}/r{r}", "holdout")
                for r in range(self.repeats)
            )
        return [*warm, *measured, *held]

    def _sizes(self, modality: str) -> list[tuple[str, ProbeSpec]]:
        def spec(size: str, words: int, **media: Any) -> ProbeSpec:
            return ProbeSpec(
                id="", kind="probe", modality=modality, size=size, text_words=words, seed=0, **media
            )  # type: ignore[arg-type]

        if modality == "text":
            return [(f"{w}w", spec(f"{w}w", w)) for w in self.text_words]
        words = self.prompt_words
        if modality == "image":
            return [(i.label, spec(i.label, words, images=(i,))) for i in self.images]
        if modality == "audio":
            return [(a.label, spec(a.label, words, audios=(a,))) for a in self.audios]
        return [(v.label, spec(v.label, words, videos=(v,))) for v in self.videos]

    def _spec(self, template: ProbeSpec, probe_id: str, kind: ProbeKind) -> ProbeSpec:
        return template.model_copy(
            update={"id": probe_id, "kind": kind, "seed": _seed(self.seed, probe_id)}
        )


def _seed(plan_seed: int, probe_id: str) -> int:
    """A stable 63-bit seed from the plan seed and a probe id (``hash()`` is salted per run)."""
    digest = hashlib.sha256(f"{plan_seed}:{probe_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def profile_modalities(profile: str) -> tuple[str, ...]:
    """The modalities ``profile`` counts: text, plus each modality it has a counter for."""
    from ..counting.profiles import get_profile

    prof = get_profile(profile)
    return ("text", *(m for m in ("image", "audio", "video") if getattr(prof, m) is not None))


def save_plan(plan: ProbePlan, path: str | Path) -> Path:
    """Write ``plan`` as JSON to ``path``; returns the path."""
    p = Path(path)
    p.write_text(plan.to_json() + "\n", encoding="utf-8")
    return p


def load_plan(path: str | Path) -> ProbePlan:
    """Read a plan JSON file.

    Raises:
        ValueError: unreadable, not JSON, or an invalid field; the message
            names the file and the field.
    """
    return load_json_model(path, ProbePlan, "plan")


# --- Requests -----------------------------------------------------------------
@dataclass(frozen=True)
class ProbeRequest:
    """One request ready to send: the JSON body and the HTTP headers a client adds."""

    spec: ProbeSpec
    body: dict[str, Any]
    headers: dict[str, str]


def _words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(n))


def build_request(spec: ProbeSpec, plan: ProbePlan) -> ProbeRequest:
    """The OpenAI-style chat request of one probe, with its media encoded inline.

    Images are ``image_url`` parts with PNG or JPEG ``data:`` URLs, audio is
    ``input_audio`` with WAV data, video is a ``video_url`` part with an
    MJPEG AVI ``data:`` URL. Video metadata also goes in llm-d's headers
    (fps, duration, resolution), which is how a gateway learns it.
    """
    rng = random.Random(spec.seed)
    text = _words(spec.text_words, rng.getrandbits(63))
    if spec.modality in _PROMPTS:
        text = f"{_PROMPTS[spec.modality]} {text}".strip()
    parts: list[dict[str, Any]] = [{"type": "text", "text": text}]
    headers: dict[str, str] = {}
    for image in spec.images:
        data, mime = image_bytes(image.width, image.height, rng.getrandbits(63), image.format)
        parts.append({"type": "image_url", "image_url": {"url": data_url(mime, data)}})
    for clip in spec.audios:
        wav = wav_bytes(clip.seconds, rng.getrandbits(63), clip.sample_rate)
        encoded = data_url("audio/wav", wav).partition(",")[2]
        parts.append({"type": "input_audio", "input_audio": {"data": encoded, "format": "wav"}})
    for video in spec.videos:
        avi = avi_mjpeg(video.seconds, video.fps, video.width, video.height, rng.getrandbits(63))
        parts.append({"type": "video_url", "video_url": {"url": data_url("video/x-msvideo", avi)}})
        frames = video_frame_count(video.seconds, video.fps)
        # llm-d's router carries one video's metadata per request.
        headers[H.VIDEO_FPS] = f"{video.fps:g}"
        headers[H.VIDEO_DURATION] = f"{frames / video.fps:g}"
        headers[H.VIDEO_RESOLUTION] = f"{video.width}x{video.height}"
    content: Any = text if spec.modality == "text" else parts
    body = {
        "model": plan.model or plan.profile,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": plan.max_tokens,
        "temperature": 0,
    }
    return ProbeRequest(spec=spec, body=body, headers=headers)


# --- Counting -------------------------------------------------------------------
class CountResult(Protocol):
    """**Protocol:** what counting a request yields (a ``RequestCount`` fits)."""

    @property
    def units(self) -> UnitCounts: ...

    @property
    def counters(self) -> Mapping[str, str]: ...

    @property
    def errors(self) -> Sequence[str]: ...


#: Counts one request: ``(body, headers) -> RequestCount``.
CountFn = Callable[[Mapping[str, Any], Mapping[str, str]], CountResult]


def default_count_fn(plan: ProbePlan) -> CountFn:
    """Count with :class:`~modtrace.counting.counter.RequestCounter`, configured by the plan."""
    from ..counting.counter import CountingConfig, RequestCounter

    counter = RequestCounter(
        CountingConfig.model_validate({**plan.counting, "profile": plan.profile})
    )

    def count(body: Mapping[str, Any], headers: Mapping[str, str]) -> CountResult:
        return counter.count(body, headers)

    return count


def iter_requests(
    plan: ProbePlan, skip: Callable[[str], bool] | None = None
) -> Iterator[ProbeRequest]:
    """Build the plan's requests in send order, lazily; ``skip(id)`` leaves a probe out."""
    for spec in plan.probes():
        if skip is None or not skip(spec.id):
            yield build_request(spec, plan)
