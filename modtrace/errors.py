"""Exceptions, and how they are told to a person in one line.

::

    ValueError
    ├── modtrace.counting.CountingError   strict mode: an item could not be counted
    └── modtrace.counting.media.MediaError bytes that are not the media they claim to be
"""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["one_line"]


def one_line(exc: BaseException) -> str:
    """A one-line reason for ``exc``, naming the field where there is one.

    pydantic's own text spans several lines and links to its docs; this
    keeps the first error's location and message.
    """
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        reason = first["msg"].removeprefix("Value error, ")
        return f"{where}: {reason}" if where and where not in reason else reason
    return " ".join(str(exc).split())
