"""Exceptions, and how they are told to a person in one line.

::

    ValueError
    ├── modtrace.counting.CountingError   strict mode: an item could not be counted
    └── modtrace.counting.media.MediaError bytes that are not the media they claim to be
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

__all__ = ["load_json_model", "one_line"]

M = TypeVar("M", bound=BaseModel)


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


def load_json_model(
    path: str | Path, model: type[M], what: str, *, error: type[ValueError] = ValueError
) -> M:
    """Read a JSON file into ``model``, with an error that names the file and the field.

    Args:
        path: The file.
        model: The pydantic model the file holds.
        what: What the file is, for the message (``calibration``, ``plan``...).
        error: The exception raised (a ``ValueError`` subclass).

    Raises:
        ValueError: ``cannot read <what> <path>: <reason>``, or ``invalid <what>
            <path>: <field>: <reason>`` for a file that is not JSON or not a
            valid ``model`` (``error`` when given).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read {what} {p}: {exc.strerror or exc}"
        raise error(msg) from exc
    try:
        return model.model_validate_json(text)
    except ValidationError as exc:
        msg = f"invalid {what} {p}: {one_line(exc)}"
        raise error(msg) from None
