"""``ModtraceInstrumentor``: the openai integration as an OpenTelemetry instrumentor.

Registered under the ``opentelemetry_instrumentor`` entry point, so
``opentelemetry-instrument python app.py`` picks it up with the other
instrumentations; or in code::

    ModtraceInstrumentor().instrument(
        config=CountingConfig(model_profiles={"Qwen/Qwen2.5-Omni-7B": "qwen2.5-omni"}),
    )

It wraps ``openai.resources.chat.completions.Completions.create`` and
``AsyncCompletions.create`` at class level with ``wrapt``, so every
``openai.OpenAI`` and ``openai.AsyncOpenAI`` client is traced as
:func:`modtrace.integrations.openai.instrument_openai` traces one (the
HTTP hooks are added to each client at its first call). ``uninstrument()``
unwraps them, unless clients instrumented explicitly still need them.

Without a ``counter`` or ``config`` argument (the case under
``opentelemetry-instrument``), the counting configuration is read from the
JSON file named by :envvar:`MODTRACE_COUNTING_CONFIG` (the format of
``modtrace count --config``), else the defaults.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from pathlib import Path
from typing import Any

from opentelemetry.instrumentation.instrumentor import BaseInstrumentor  # type: ignore[attr-defined]

from ..counting.counter import CountingConfig
from ..environment_variables import MODTRACE_COUNTING_CONFIG
from . import openai as _openai

__all__ = ["MODTRACE_COUNTING_CONFIG", "ModtraceInstrumentor", "counting_config_from_env"]

_INSTRUMENTS = ("openai >= 1.40",)


def counting_config_from_env(environ: dict[str, str] | None = None) -> CountingConfig | None:
    """The counting configuration named by :envvar:`MODTRACE_COUNTING_CONFIG`, or ``None``.

    Raises:
        ValueError: the file cannot be read or is not a valid configuration.
    """
    path = (environ if environ is not None else os.environ).get(MODTRACE_COUNTING_CONFIG, "")
    if not path.strip():
        return None
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        return CountingConfig.model_validate(data)
    except (OSError, ValueError) as exc:
        msg = f"{MODTRACE_COUNTING_CONFIG}={path}: {exc}"
        raise ValueError(msg) from exc


class ModtraceInstrumentor(BaseInstrumentor):  # type: ignore[misc]
    """Counts, traces and times the chat completions of every openai client.

    ``instrument(**kwargs)`` accepts ``tracer_provider``, ``meter_provider``,
    ``counter`` (a ``RequestCounter``), ``config`` (a ``CountingConfig``) and
    ``wall_clock_fallback`` (default ``True``); see
    :func:`modtrace.integrations.openai.instrument_openai`. Instrumenting
    twice is a no-op (with the SDK's warning), as for every instrumentor.
    """

    def instrumentation_dependencies(self) -> Collection[str]:
        """The packages this instruments: ``openai >= 1.40``."""
        return _INSTRUMENTS

    def _instrument(self, **kwargs: Any) -> None:
        counter, config = kwargs.get("counter"), kwargs.get("config")
        if counter is None and config is None:
            config = counting_config_from_env()
        settings = _openai.OpenAISettings.build(
            counter=counter,
            config=config,
            tracer_provider=kwargs.get("tracer_provider"),
            meter_provider=kwargs.get("meter_provider"),
            wall_clock_fallback=kwargs.get("wall_clock_fallback", True),
        )
        _openai._enable_global(settings)

    def _uninstrument(self, **kwargs: Any) -> None:
        _openai._disable_global()
