"""Hypothetical dollars from attributed GPU seconds.

The rate is a planning assumption, never an invoice: every figure carries
``hypothetical=True`` and the id of the rate that produced it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .units import check_number

__all__ = ["Cost", "Rate", "price"]

SECONDS_PER_HOUR = 3600.0


class Rate(BaseModel):
    """A hypothetical price of one GPU hour, in US dollars."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    usd_per_gpu_hour: float
    id: str = Field(default="default", min_length=1)

    @field_validator("usd_per_gpu_hour", mode="before")
    @classmethod
    def _rate(cls, value: object) -> float:
        return check_number("usd_per_gpu_hour", value)

    @property
    def usd_per_gpu_second(self) -> float:
        """The price of one GPU second."""
        return self.usd_per_gpu_hour / SECONDS_PER_HOUR


class Cost(BaseModel):
    """Hypothetical dollars per modality."""

    model_config = ConfigDict(frozen=True)

    usd: dict[str, float]
    usd_total: float
    usd_per_gpu_hour: float
    rate_id: str
    hypothetical: bool = True


def price(gpu_seconds: Mapping[str, float], rate: Rate) -> Cost:
    """Price GPU seconds per modality at a hypothetical hourly rate.

    >>> price({"text": 1.70}, Rate(usd_per_gpu_hour=2.0)).usd_total  # doctest: +ELLIPSIS
    0.000944...
    """
    per_second = rate.usd_per_gpu_second
    usd = {m: s * per_second for m, s in gpu_seconds.items()}
    return Cost(
        usd=usd,
        usd_total=math.fsum(usd.values()),
        usd_per_gpu_hour=rate.usd_per_gpu_hour,
        rate_id=rate.id,
    )
