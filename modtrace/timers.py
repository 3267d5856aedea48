"""The GPU seconds measured for one request."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, field_validator

from .units import check_number

__all__ = ["COMPONENTS", "ENCODER_COMPONENTS", "LM_COMPONENTS", "GpuTimers"]

#: Component timers, in the order they run in an engine.
COMPONENTS: tuple[str, ...] = ("vision_encoder", "audio_encoder", "prefill", "decode")
ENCODER_COMPONENTS: tuple[str, ...] = ("vision_encoder", "audio_encoder")
LM_COMPONENTS: tuple[str, ...] = ("prefill", "decode")


class GpuTimers(BaseModel):
    """Measured GPU seconds of one request.

    Attributes:
        total: The measured GPU seconds of the whole request (wall seconds
            times GPUs, or summed CUDA event time). ``None`` when unmeasured.
        vision_encoder: Seconds in the vision encoder (images and video).
        audio_encoder: Seconds in the audio encoder.
        prefill: Seconds of language-model prefill.
        decode: Seconds of language-model decode.
        gpu_count: GPUs the request ran on.
        source: How the timers were measured (``wall_clock``, ``cuda_events``,
            ``step_ledger``, ``engine_headers``, ...).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    total: float | None = None
    vision_encoder: float | None = None
    audio_encoder: float | None = None
    prefill: float | None = None
    decode: float | None = None
    gpu_count: int = 1
    source: str = "unknown"

    @field_validator("total", *COMPONENTS, mode="before")
    @classmethod
    def _seconds(cls, value: object, info: object) -> float | None:
        if value is None:
            return None
        return check_number(f"timers.{info.field_name}", value)  # type: ignore[attr-defined]

    @field_validator("gpu_count")
    @classmethod
    def _gpus(cls, value: int) -> int:
        if value < 1:
            msg = f"timers.gpu_count: must be at least 1, got {value}"
            raise ValueError(msg)
        return value

    def components(self) -> dict[str, float]:
        """The component timers that were measured, by name."""
        return {name: v for name in COMPONENTS if (v := getattr(self, name)) is not None}
