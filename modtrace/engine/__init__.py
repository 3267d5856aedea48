"""The engine side: continue the caller's trace, time requests, return GPU timers.

* :mod:`modtrace.engine.hooks`: framework-free hooks (trace context, ledger
  id, engine span) and the header codec of the GPU timers.
* :mod:`modtrace.engine.asgi`: the same as an ASGI middleware, with the
  timers in response headers or at the end of a stream.
* :mod:`modtrace.engine.torch_hooks`: forward hooks that time a torch
  model's encoder, prefill and decode passes into a step ledger.
* :mod:`modtrace.engine.reference`: the reference engine (``modtrace[engine]``),
  an OpenAI-compatible server running a tiny random Qwen2.5-Omni thinker.
"""

from __future__ import annotations

from .asgi import INFERENCE_PATHS, STATE_KEY, EngineMiddleware, engine_request_from_scope
from .hooks import (
    USAGE_EXTENSION,
    EngineHooks,
    EngineRequest,
    current_engine_request,
    extract_context,
    normalize_headers,
    sse_comment,
    timers_from_headers,
    timers_from_sse,
    timers_to_headers,
    usage_units,
)

__all__ = [
    "INFERENCE_PATHS",
    "STATE_KEY",
    "USAGE_EXTENSION",
    "EngineHooks",
    "EngineMiddleware",
    "EngineRequest",
    "current_engine_request",
    "engine_request_from_scope",
    "extract_context",
    "normalize_headers",
    "sse_comment",
    "timers_from_headers",
    "timers_from_sse",
    "timers_to_headers",
    "usage_units",
]
