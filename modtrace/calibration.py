"""Calibrations: versioned weights in GPU seconds per unit.

A calibration is what a probe run produced. It is a file users keep and
diff, so it is a pydantic model with a stable JSON form::

    {
      "version": "2026-11-qwen2.5-vl-7b-a",
      "created": "2026-11-29T12:00:00Z",
      "model": "Qwen/Qwen2.5-VL-7B-Instruct",
      "preprocessor": "qwen2.5-vl@1",
      "engine": "vllm 0.11.0",
      "weights": {"text.tokens": {"value": 0.0008, "stderr": 0.00001},
                  "image.tiles": 0.012}
    }
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .errors import load_json_model
from .units import check_number, check_unit_name

__all__ = ["Calibration", "Weight", "load_calibration"]


class Weight(BaseModel):
    """GPU seconds per unit, with an optional standard error."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float
    stderr: float | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_number(cls, data: object) -> object:
        # A bare number is the common hand-written form.
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return {"value": data}
        return data


class Calibration(BaseModel):
    """A versioned set of weights (GPU seconds per unit).

    Attributes:
        version: The id stamped on every span attributed with it.
        created: When the probes were measured.
        model: The model the probes ran on.
        preprocessor: The counting profile and version the units came from.
        engine: The serving engine (and driver) the probes ran on.
        weights: GPU seconds per unit, by unit name.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    version: str = Field(min_length=1)
    created: datetime = Field(default_factory=lambda: datetime.now(timezone.utc))
    model: str | None = None
    preprocessor: str | None = None
    engine: str | None = None
    weights: dict[str, Weight] = Field(default_factory=dict)

    @field_validator("weights", mode="before")
    @classmethod
    def _check_weights(cls, value: object) -> object:
        if not isinstance(value, Mapping):
            msg = f"weights: expected a mapping of unit name to weight, got {value!r}"
            raise ValueError(msg)
        checked = {}
        for name, weight in value.items():
            check_unit_name(str(name))
            raw = weight.get("value") if isinstance(weight, Mapping) else weight
            if isinstance(weight, Weight):
                raw = weight.value
            check_number(f"weights.{name}", raw)
            if isinstance(weight, Mapping) and weight.get("stderr") is not None:
                check_number(f"weights.{name}.stderr", weight["stderr"])
            checked[str(name)] = weight
        return checked

    @classmethod
    def from_weights(cls, weights: Mapping[str, float], version: str = "adhoc") -> Calibration:
        """Build a calibration from plain ``{unit: seconds per unit}`` weights."""
        return cls(version=version, weights=dict(weights))

    def weight(self, unit: str) -> float | None:
        """The weight of ``unit`` in GPU seconds per unit, or ``None``."""
        return self.values.get(unit)

    @cached_property
    def values(self) -> dict[str, float]:
        """Weights as plain ``{unit: seconds per unit}`` (computed once; the model is frozen)."""
        return {unit: w.value for unit, w in self.weights.items()}

    def to_json(self) -> str:
        """The calibration as indented JSON, as written to disk."""
        return self.model_dump_json(indent=2, exclude_none=True)


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration JSON file.

    Raises:
        ValueError: the file is missing, not JSON, or misses a field; the
            message names the file and the field.
    """
    return load_json_model(path, Calibration, "calibration")
