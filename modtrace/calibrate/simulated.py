"""A **simulated** engine: a documented synthetic cost model with known weights and noise.

It exists so that the calibration workflow (plan, run, fit, store) can be
run end to end, tested, and demonstrated without a GPU. Its numbers
measure nothing: every probe file and calibration made with it says
``simulated`` in its engine.

The cost model mirrors how a multimodal engine spends GPU time::

    vision_encoder = sum(encoder[u] * count[u]  for image and video units u)
    audio_encoder  = sum(encoder[u] * count[u]  for audio units u)
    prefill        = prefill_per_token * (text + image + audio + video tokens)
    decode         = decode_per_token * max_tokens
    total          = overhead + vision_encoder + audio_encoder + prefill + decode

Each term is multiplied by its own log-normal noise ``exp(N(0, noise))``,
seeded from the simulator's seed and the request body, so the same request
always costs the same. Units are counted with the plan's counting profile,
i.e. the simulated engine "sees" exactly the units the gateway counts.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..timers import GpuTimers
from ..units import check_number, check_unit_name, modality_of
from .plan import CountFn
from .probes import EngineInfo

__all__ = ["PROMPT_TOKEN_UNITS", "SimulatedCost", "SimulatedEngine"]

#: The units that occupy prompt positions, and so cost prefill time.
PROMPT_TOKEN_UNITS: tuple[str, ...] = (
    "text.tokens",
    "image.tokens",
    "audio.tokens",
    "video.tokens",
)


class SimulatedCost(BaseModel):
    """The synthetic engine's cost model, in GPU seconds.

    The defaults are illustrative round numbers of a 7B-class model on one
    GPU, not measurements.

    Attributes:
        overhead: Per request (scheduling, sampling, launch).
        prefill_per_token: Per prompt token of any modality.
        decode_per_token: Per generated token (``max_tokens`` of the body).
        encoders: Encoder seconds per unit, by unit name.
        noise: Standard deviation of the log-normal noise on each term.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    overhead: float = 0.015
    prefill_per_token: float = 1.0e-4
    decode_per_token: float = 0.012
    encoders: dict[str, float] = Field(
        default_factory=lambda: {
            "image.tokens": 5.0e-5,
            "video.tokens": 5.0e-5,
            "audio.seconds": 4.0e-3,
        }
    )
    noise: float = Field(default=0.03, ge=0, le=1)

    @field_validator("overhead", "prefill_per_token", "decode_per_token", mode="before")
    @classmethod
    def _seconds(cls, value: object, info: Any) -> float:
        return check_number(info.field_name, value)

    @field_validator("encoders")
    @classmethod
    def _encoders(cls, value: dict[str, float]) -> dict[str, float]:
        for unit, seconds in value.items():
            check_unit_name(unit)
            check_number(f"encoders.{unit}", seconds)
            if modality_of(unit) == "text":
                msg = f"encoders.{unit}: text has no encoder"
                raise ValueError(msg)
        return value

    def marginal_weights(self) -> dict[str, float]:
        """GPU seconds per unit of the noiseless model's terms, by unit (prefill + encoder).

        A fit that chooses unit ``u`` for a modality recovers ``w[u]`` plus,
        for every other term ``v`` of that modality proportional to ``u``,
        ``w[v] * v / u`` (e.g. audio tokens absorb the per-second encoder cost).
        """
        out = dict.fromkeys(PROMPT_TOKEN_UNITS, self.prefill_per_token)
        for unit, seconds in self.encoders.items():
            out[unit] = out.get(unit, 0.0) + seconds
        return out


class SimulatedEngine:
    """The synthetic engine: ``engine(body, headers) -> GpuTimers`` (see the module doc).

    Args:
        count: Counts a request's units, as the plan's profile does.
        cost: The cost model.
        seed: Seeds the noise, together with each request's body.
        fail_every: Make every n-th call raise, to exercise failure handling
            (0: never).
    """

    def __init__(
        self,
        count: CountFn,
        cost: SimulatedCost | None = None,
        *,
        seed: int = 0,
        fail_every: int = 0,
    ) -> None:
        self.count = count
        self.cost = cost or SimulatedCost()
        self.seed = seed
        self.fail_every = fail_every
        self.calls = 0

    @property
    def info(self) -> EngineInfo:
        """Labels every probe file made with it as simulated."""
        return EngineInfo(
            name="simulated",
            driver="none",
            simulated=True,
            details={"cost": self.cost.model_dump(), "seed": self.seed},
        )

    def _rng(self, body: Mapping[str, Any]) -> random.Random:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(f"{self.seed}:{text}".encode()).digest()
        return random.Random(int.from_bytes(digest[:8], "big"))

    def __call__(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> GpuTimers:
        """GPU timers of one request under the cost model."""
        self.calls += 1
        if self.fail_every and self.calls % self.fail_every == 0:
            msg = f"simulated failure (call {self.calls})"
            raise RuntimeError(msg)
        units = self.count(body, headers).units
        c = self.cost
        rng = self._rng(body)

        def noisy(seconds: float) -> float:
            return seconds * math.exp(rng.gauss(0.0, c.noise)) if c.noise else seconds

        def encoder(modalities: tuple[str, ...]) -> float:
            return math.fsum(
                w * units[u] for u, w in c.encoders.items() if modality_of(u) in modalities
            )

        tokens = math.fsum(units[u] for u in PROMPT_TOKEN_UNITS)
        vision = noisy(encoder(("image", "video")))
        audio = noisy(encoder(("audio",)))
        prefill = noisy(c.prefill_per_token * tokens)
        decode = noisy(c.decode_per_token * float(body.get("max_tokens") or 1))
        overhead = noisy(c.overhead)
        return GpuTimers(
            total=overhead + vision + audio + prefill + decode,
            vision_encoder=vision if vision > 0 else None,
            audio_encoder=audio if audio > 0 else None,
            prefill=prefill,
            decode=decode,
            source="simulated",
        )
