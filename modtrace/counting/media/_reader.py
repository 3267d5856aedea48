"""Random access to the bytes of a payload, held raw or as base64.

Parsers read through a :class:`Reader` so that they can jump (a JPEG
segment length, an MP4 box size, the last OGG page) without decoding the
bytes in between. Reads go through a small window cache because parsers
walk headers in many tiny reads (2-byte lengths, 4-byte tags).
"""

from __future__ import annotations

import struct

from .b64 import B64View
from .errors import MediaError

__all__ = ["Reader"]

#: Bytes fetched per window miss: headers are walked in many tiny reads, and
#: one decode of ~700 base64 characters serves most of a header (PNG, WAV,
#: the first JPEG segments) without decoding much past it.
_WINDOW = 512


class Reader:
    """Bounds-checked reads over ``bytes`` or a :class:`B64View`.

    Args:
        source: The payload: bytes-like, or a base64 view.
        fmt: Format name used to prefix error messages (``"PNG"``...).
    """

    __slots__ = ("_buf", "_fmt", "_len", "_src", "_win", "_win_start")

    def __init__(self, source: bytes | bytearray | memoryview | B64View, fmt: str) -> None:
        self._fmt = fmt
        if isinstance(source, B64View):
            self._src: B64View | None = source
            self._buf = b""
        else:
            self._src = None
            self._buf = bytes(source) if not isinstance(source, bytes) else source
        # A base64 view's length costs a scan of the whole text: ask only when needed.
        self._len: int | None = None if self._src is not None else len(self._buf)
        self._win = b""
        self._win_start = 0

    def __len__(self) -> int:
        if self._len is None:
            self._len = len(self._src)  # type: ignore[arg-type]
        return self._len

    @property
    def fmt(self) -> str:
        """Format name used in error messages."""
        return self._fmt

    @fmt.setter
    def fmt(self, value: str) -> None:
        self._fmt = value

    def error(self, what: str) -> MediaError:
        """Return a :class:`MediaError` whose message is ``"<fmt>: <what>"``."""
        return MediaError(f"{self._fmt}: {what}")

    def read(self, offset: int, size: int) -> bytes:
        """Return up to ``size`` bytes at ``offset`` (fewer at the end of the payload)."""
        if offset < 0 or size < 0:
            raise self.error(f"negative offset or size ({offset}, {size})")
        if self._src is None:
            return self._buf[offset : offset + size]
        rel = offset - self._win_start
        if rel >= 0 and rel + size <= len(self._win):
            return self._win[rel : rel + size]
        self._win = self._src.read(offset, max(size, _WINDOW))
        self._win_start = offset
        return self._win[:size]

    def exact(self, offset: int, size: int, what: str = "header") -> bytes:
        """Return exactly ``size`` bytes at ``offset`` or raise a truncation error."""
        data = self.read(offset, size)
        if len(data) != size:
            have = max(0, min(size, len(self) - offset))
            msg = f"truncated {what}: need {size} bytes at offset {offset}, have {have}"
            raise self.error(msg)
        return data

    def unpack(self, fmt: str, offset: int, what: str = "header") -> tuple[int, ...]:
        """``struct.unpack`` the bytes at ``offset``, raising on truncation."""
        return struct.unpack(fmt, self.exact(offset, struct.calcsize(fmt), what))

    def tail(self, size: int) -> tuple[int, bytes]:
        """Return ``(offset, bytes)`` of the last ``size`` bytes (all of them if shorter)."""
        start = max(0, len(self) - size)
        if self._src is None:
            return start, self._buf[start:]
        return start, self._src.read(start, len(self) - start)
