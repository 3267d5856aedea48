"""What counting one request produces."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from ..units import UnitCounts

__all__ = ["ItemCount", "RequestCount"]


class ItemCount(BaseModel):
    """The units of one content item (one image, one clip...), or why it has none.

    Attributes:
        index: Position of the item among the request's content parts.
        modality: ``text``, ``image``, ``audio`` or ``video``.
        units: Unit name -> count for this item (``image.tokens``...).
        defaulted: True when a size or duration came from configured defaults
            (a URL that was not fetched, a missing header).
        error: Why the item could not be counted; its units are then empty.
    """

    model_config = ConfigDict(frozen=True)

    index: int
    modality: str
    units: dict[str, float] = Field(default_factory=dict)
    defaulted: bool = False
    error: str | None = None


class RequestCount(BaseModel):
    """The counted units of one request, with the methods that produced them.

    Attributes:
        profile: The profile name used.
        counters: Modality -> ``id@version`` of the counter used.
        units: Summed units over all items.
        defaulted: Modality -> whether any item of it used defaults.
        items: Per-item detail.
        errors: One clear line per item or part that could not be counted.
    """

    model_config = ConfigDict(frozen=True)

    profile: str
    counters: dict[str, str] = Field(default_factory=dict)
    units: UnitCounts = Field(default_factory=lambda: UnitCounts({}))
    defaulted: dict[str, bool] = Field(default_factory=dict)
    items: list[ItemCount] = Field(default_factory=list)
    errors: list[str] = Field(default_factory=list)
