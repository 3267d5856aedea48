"""Scopes that serve ``with`` and ``async with`` alike, and leaving them quietly.

modtrace's scopes (inference spans, engine requests, GPU timers) never
await: their ``async with`` form runs the ``with`` form. Leaving one must
never raise into the request, whatever context it is left from.
"""

from __future__ import annotations

import contextlib
import contextvars
from types import TracebackType
from typing import Any

from opentelemetry import context as otel_context

__all__ = ["SyncAndAsync", "leave_context"]


class SyncAndAsync:
    """Mixin: ``async with`` runs the class's own ``__enter__`` and ``__exit__``."""

    __slots__ = ()

    async def __aenter__(self: Any) -> Any:
        return self.__enter__()

    async def __aexit__(
        self: Any,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> Any:
        return self.__exit__(exc_type, exc, tb)


def leave_context(
    variable: contextvars.ContextVar[Any],
    variable_token: contextvars.Token[Any] | None,
    context_token: object | None,
) -> None:
    """Reset ``variable`` and detach the OpenTelemetry context a scope attached, never raising.

    Either token may be ``None`` (nothing to undo). Resetting from another
    context than the one that set the variable raises: the variable is then
    left alone.
    """
    if variable_token is not None:
        with contextlib.suppress(ValueError):
            variable.reset(variable_token)
    if context_token is not None:
        with contextlib.suppress(Exception):
            otel_context.detach(context_token)  # type: ignore[arg-type]
