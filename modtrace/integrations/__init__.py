"""Integrations for serving code: the openai client and ASGI gateways.

* :mod:`modtrace.integrations.openai`: :func:`instrument_openai`,
  :func:`uninstrument_openai`, :func:`is_instrumented`: count, trace and
  time the chat completions of an ``openai`` client, and propagate the
  trace to the engine (``modtrace[openai]``).
* :mod:`modtrace.integrations.instrumentor`: the same for every client, as
  the OpenTelemetry instrumentor :class:`ModtraceInstrumentor`
  (``opentelemetry-instrument`` loads it).
* :mod:`modtrace.integrations.asgi`: :class:`GatewayMiddleware`, the
  inference span of each request a gateway receives (no dependency).

The openai names are imported on first use, so the ASGI middleware works
without the ``openai`` package.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .asgi import GATEWAY_STATE_KEY, GatewayMiddleware, gateway_span_from_scope

if TYPE_CHECKING:
    from .instrumentor import ModtraceInstrumentor
    from .openai import instrument_openai, is_instrumented, uninstrument_openai

__all__ = [
    "GATEWAY_STATE_KEY",
    "GatewayMiddleware",
    "ModtraceInstrumentor",
    "gateway_span_from_scope",
    "instrument_openai",
    "is_instrumented",
    "uninstrument_openai",
]

_LAZY = {
    "ModtraceInstrumentor": "instrumentor",
    "instrument_openai": "openai",
    "is_instrumented": "openai",
    "uninstrument_openai": "openai",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
