"""Plain-text tables for terminal output (no dependency needed)."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["table"]


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-align the first column, right-align the others."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])
