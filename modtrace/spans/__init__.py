"""Inference spans and the attributes they carry.

:func:`inference_span` (``with`` / ``async with``) and :func:`trace_inference`
(a decorator) open one span per request; :mod:`modtrace.spans.attributes`
turns counts, timers and results into span attributes and back.
"""

from __future__ import annotations

from .attributes import (
    attributed_from_attributes,
    attribution_attributes,
    cost_attributes,
    cost_from_attributes,
    count_attributes,
    is_inference_span,
    timer_attributes,
    timers_from_attributes,
    units_from_attributes,
)
from .inference import (
    InferenceSpan,
    InferenceSpanContext,
    current_inference_span,
    inference_span,
    refresh_settings,
    trace_inference,
)

__all__ = [
    "InferenceSpan",
    "InferenceSpanContext",
    "attributed_from_attributes",
    "attribution_attributes",
    "cost_attributes",
    "cost_from_attributes",
    "count_attributes",
    "current_inference_span",
    "inference_span",
    "is_inference_span",
    "refresh_settings",
    "timer_attributes",
    "timers_from_attributes",
    "trace_inference",
    "units_from_attributes",
]
