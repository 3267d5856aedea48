"""The tile grid of dynamic-tiling image processors (InternVL, Phi-4-multimodal).

These processors cut an image into ``columns × rows`` tiles of one size,
choosing among candidate grids the one closest to the image's aspect
ratio. vLLM's ``phi4mm.py`` (``_find_target_aspect_ratio``) repeats
InternVL's ``find_closest_aspect_ratio``; each model lists its candidates in
its own order, which decides exact ties, so the caller passes them.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["closest_aspect_ratio"]


def closest_aspect_ratio(
    width: int, height: int, grids: Iterable[tuple[int, int]], tile_size: int
) -> tuple[int, int]:
    """The grid ``(columns, rows)`` closest in aspect ratio to the image.

    Grids are tried in the given order. On an exact tie the later grid wins
    only when the image area exceeds half of that grid's area, as in
    InternVL's ``find_closest_aspect_ratio``. ``(1, 1)`` when ``grids`` is
    empty.
    """
    aspect = width / height
    best_diff = float("inf")
    best = (1, 1)
    area = width * height
    for cols, rows in grids:
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best_diff = diff
            best = (cols, rows)
        elif diff == best_diff and area > 0.5 * tile_size * tile_size * cols * rows:
            best = (cols, rows)
    return best
