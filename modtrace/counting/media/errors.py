"""The one exception every media probe raises."""

from __future__ import annotations

__all__ = ["MediaError"]


class MediaError(ValueError):
    """A payload that is not valid base64, not a known media format, or corrupt.

    The message is one line that names the format and what is wrong, e.g.
    ``"PNG: truncated header: need 8 bytes at offset 16, have 3"``.
    """
