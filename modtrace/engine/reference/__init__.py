"""The reference engine: a real multimodal model behind an OpenAI-compatible server.

Needs the ``modtrace[engine]`` extra (torch, transformers, soundfile,
uvicorn). It runs transformers' Qwen2.5-Omni thinker with a tiny, randomly
initialised configuration on the CPU, so that images and audio go through
real encoders and a real language model in milliseconds, with no download:

* :class:`ReferenceEngine`: the model, the Hugging Face processors and a
  scheduler loop whose encoder, prefill and decode passes are timed by
  forward hooks into a :class:`modtrace.timing.StepLedger`;
* :func:`create_app` / :func:`start_server`: ``/v1/chat/completions`` with
  vLLM's request shapes and ``usage`` (``prompt_tokens_details``), behind
  :class:`modtrace.engine.EngineMiddleware`;
* ``python -m modtrace.engine.reference --port 0``: the same from a shell.

CPU seconds stand in for GPU seconds here; see ``docs/engine.md``.
"""

from __future__ import annotations

from .engine import Completion, EngineConfig, EngineEvent, ReferenceEngine, chat_completion, usage
from .processing import InputProcessor, PreparedRequest, RequestError
from .server import FAULT_HEADER, ReferenceApp, RunningServer, create_app, start_server

__all__ = [
    "FAULT_HEADER",
    "Completion",
    "EngineConfig",
    "EngineEvent",
    "InputProcessor",
    "PreparedRequest",
    "ReferenceApp",
    "ReferenceEngine",
    "RequestError",
    "RunningServer",
    "chat_completion",
    "create_app",
    "start_server",
    "usage",
]
