"""Modalities, unit names and the counts a request carries.

A unit name is ``<modality>.<unit>``: ``text.tokens``, ``image.tiles``,
``audio.seconds``... The list is closed on purpose: a typo in a unit name
would otherwise silently attribute nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Literal

from pydantic import RootModel, field_validator

__all__ = [
    "MODALITIES",
    "UNIT_NAMES",
    "UNKNOWN",
    "Modality",
    "UnitCounts",
    "modality_of",
]

Modality = Literal["text", "image", "audio", "video", "unknown"]

#: The modalities that can carry GPU seconds, in report order.
MODALITIES: tuple[str, ...] = ("text", "image", "audio", "video")
#: Where seconds go that no modality can carry: they are never dropped.
UNKNOWN = "unknown"

#: Every unit modtrace knows, grouped by modality.
UNIT_NAMES: tuple[str, ...] = (
    "text.tokens",
    "image.count",
    "image.pixels",
    "image.tiles",
    "image.tokens",
    "audio.count",
    "audio.seconds",
    "audio.frames",
    "audio.tokens",
    "video.count",
    "video.seconds",
    "video.frames",
    "video.tokens",
)
_UNIT_SET = frozenset(UNIT_NAMES)
#: Unit name -> modality, precomputed: the attribution hot path looks it up per unit.
UNIT_MODALITY: dict[str, str] = {u: u.partition(".")[0] for u in UNIT_NAMES}


def modality_of(unit: str) -> str:
    """Return the modality part of a unit name (``"image.tiles"`` -> ``"image"``)."""
    return UNIT_MODALITY.get(unit) or unit.partition(".")[0]


def check_number(field: str, value: object) -> float:
    """Return ``value`` as a float, or raise ``ValueError`` naming ``field``.

    Rejects booleans, NaN, infinities and negative numbers: each would
    silently corrupt a sum of seconds.
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        msg = f"{field}: expected a number, got {value!r}"
        raise ValueError(msg)
    number = float(value)
    if math.isnan(number) or math.isinf(number):
        msg = f"{field}: must be finite, got {value!r}"
        raise ValueError(msg)
    if number < 0:
        msg = f"{field}: must not be negative, got {value!r}"
        raise ValueError(msg)
    return number


def check_unit_name(name: str) -> str:
    """Return ``name`` if it is a known unit name, else raise ``ValueError``."""
    if name not in _UNIT_SET:
        msg = f"unknown unit {name!r}; expected one of: {', '.join(UNIT_NAMES)}"
        raise ValueError(msg)
    return name


class UnitCounts(RootModel[dict[str, float]]):
    """Preprocessed units of one request, by unit name.

    >>> UnitCounts({"text.tokens": 600, "image.tiles": 8})["image.tiles"]
    8.0

    Counts are non-negative finite numbers; a missing unit reads as 0.
    """

    model_config = {"frozen": True}

    @field_validator("root", mode="before")
    @classmethod
    def _validate(cls, value: object) -> dict[str, float]:
        if not isinstance(value, Mapping):
            msg = f"unit counts must be a mapping of unit name to number, got {value!r}"
            raise ValueError(msg)
        return {
            check_unit_name(str(name)): check_number(str(name), count)
            for name, count in value.items()
        }

    def __getitem__(self, unit: str) -> float:
        return self.root.get(unit, 0.0)

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]
        return iter(self.root)

    def __len__(self) -> int:
        return len(self.root)

    def items(self) -> Iterator[tuple[str, float]]:
        """Yield ``(unit name, count)`` pairs."""
        return iter(self.root.items())

    def modalities(self) -> list[str]:
        """The modalities with at least one non-zero count, in report order."""
        present = {UNIT_MODALITY[unit] for unit, count in self.root.items() if count > 0}
        return [m for m in MODALITIES if m in present]

    def for_modality(self, modality: str) -> dict[str, float]:
        """The counts of one modality, keyed by unit name."""
        return {u: c for u, c in self.root.items() if modality_of(u) == modality}
