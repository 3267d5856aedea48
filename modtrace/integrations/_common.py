"""What the client and gateway integrations share: engine usage, timers, span claims.

Pure functions for the arithmetic (the engine's usage beside modtrace's
counts, timers summed over retries) and the rule that keeps one inference
span per engine call: an instrumented call made while a modtrace inference
span is current *enriches* that span, once, instead of opening a second one.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Iterable, Mapping
from typing import Any

from .. import semconv
from ..spans.inference import InferenceSpan, current_inference_span
from ..timers import COMPONENTS, GpuTimers
from ..units import UnitCounts

__all__ = [
    "GATEWAY_WALL_CLOCK",
    "MEDIA_MODALITIES",
    "claim_current_span",
    "engine_tokens",
    "fill_engine_text",
    "release_claim",
    "sum_timers",
    "usage_attributes",
    "usage_mapping",
    "wall_clock_timers",
]

#: ``modtrace.gpu.source`` of the fallback: the gateway's own wall clock of the
#: engine call, not a GPU measurement (the engine reported no timers).
GATEWAY_WALL_CLOCK = "gateway_wall_clock"
#: ``modtrace.units.text.counter`` when text tokens came from the engine's usage.
ENGINE_TEXT_COUNTER = "engine-usage@1"
#: Modalities whose prompt tokens vLLM reports in ``prompt_tokens_details``.
MEDIA_MODALITIES: tuple[str, ...] = ("image", "audio", "video")

# Spans an engine call already enriched. Keyed weakly on the OpenTelemetry
# span (InferenceSpan has slots and no weakref), so finished spans drop out.
_claimed: weakref.WeakSet[Any] = weakref.WeakSet()
# Spans whose claim a failed call gave back: the next call adds its timers to theirs.
_released: weakref.WeakSet[Any] = weakref.WeakSet()
_claim_lock = threading.Lock()


def claim_current_span() -> InferenceSpan | None:
    """The current inference span, when no engine call has enriched it yet; else ``None``.

    The first instrumented engine call inside a modtrace inference span (the
    gateway middleware's, or one the application opened) records its usage
    and timers on that span; later calls open their own spans, so that no
    request is attributed twice. A call that fails gives the span back
    (:func:`release_claim`): the application's retry then enriches it.
    """
    handle = current_inference_span()
    if handle is None or not handle.span.is_recording():
        return None
    with _claim_lock:
        try:
            if handle.span in _claimed:
                return None
            _claimed.add(handle.span)
        except TypeError:  # a span type without weak references: never enrich it
            return None
    return handle


def release_claim(handle: InferenceSpan) -> None:
    """Give a claimed span back after its engine call failed, so that the next call enriches it.

    The failed call's timers (an engine that ran, then failed) stay on the
    span; the next call adds its own to them (:func:`was_released`).
    """
    with _claim_lock, contextlib.suppress(TypeError):
        _claimed.discard(handle.span)
        _released.add(handle.span)


def was_released(handle: InferenceSpan) -> bool:
    """Whether a failed engine call gave ``handle``'s span back (its timers are to be added to)."""
    with _claim_lock:
        try:
            return handle.span in _released
        except TypeError:
            return False


def usage_mapping(usage: object) -> Mapping[str, Any] | None:
    """An OpenAI ``usage`` object as a mapping (a parsed model or a dict), or ``None``."""
    if usage is None:
        return None
    if isinstance(usage, Mapping):
        return usage
    dump = getattr(usage, "model_dump", None)
    if callable(dump):
        with contextlib.suppress(Exception):
            found = dump()
            return found if isinstance(found, Mapping) else None
    return None


def _count(value: object) -> int | None:
    """A token count as reported: a non-negative int (bools and floats are not counts)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def engine_tokens(usage: Mapping[str, Any], estimate: UnitCounts | None = None) -> dict[str, int]:
    """The engine's prompt tokens per modality, from an OpenAI/vLLM ``usage`` object.

    ``prompt_tokens_details.{image,audio,video}_tokens`` (vLLM with
    ``--enable-prompt-tokens-details``, PR #45458) give the media modalities.
    Text is ``prompt_tokens_details.text_tokens`` when reported, else what is
    left of ``prompt_tokens`` once every media modality is taken out: only
    when the engine reported a count for each media modality modtrace
    counted, as the rest would still hold unreported placeholder tokens.

    Args:
        usage: The response's ``usage``.
        estimate: modtrace's counts of the same request, if any.

    Returns:
        ``{modality: tokens}`` for each modality the engine's usage accounts for.
    """
    out: dict[str, int] = {}
    details = usage.get("prompt_tokens_details")
    details = details if isinstance(details, Mapping) else {}
    for modality in MEDIA_MODALITIES:
        value = _count(details.get(f"{modality}_tokens"))
        if value is not None:
            out[modality] = value
    text = _count(details.get("text_tokens"))
    if text is None:
        prompt = _count(usage.get("prompt_tokens"))
        counted = estimate.modalities() if estimate is not None else []
        unreported = [m for m in MEDIA_MODALITIES if m in counted and m not in out]
        media = sum(out.values())
        if prompt is not None and not unreported and prompt >= media:
            text = prompt - media
    if text is not None:
        out["text"] = text
    return {m: out[m] for m in ("text", *MEDIA_MODALITIES) if m in out}


def _whole(value: float) -> int | float:
    """An integral float as an int, so that token attributes stay integers."""
    return int(value) if float(value).is_integer() else value


def usage_attributes(
    usage: Mapping[str, Any],
    estimate: UnitCounts | None,
    *,
    convention: str = semconv.GENAI_SEMCONV_DEVELOPMENT,
) -> dict[str, Any]:
    """Span attributes of the engine's ``usage``, beside modtrace's counts.

    * ``modtrace.engine.usage.prompt_tokens`` / ``.completion_tokens``;
    * ``modtrace.engine.usage.<modality>.tokens`` (see :func:`engine_tokens`);
    * ``modtrace.units.<modality>.tokens.diff``: the engine's count minus
      modtrace's, for each modality the engine reported and modtrace counted
      in tokens (0 when they agree);
    * ``gen_ai.usage.output_tokens`` unless the GenAI convention is ``none``.

    Args:
        usage: The response's ``usage``.
        estimate: modtrace's counts of the request (``None`` when not counted).
        convention: The span's GenAI convention switch.
    """
    attrs: dict[str, Any] = {}
    prompt = _count(usage.get("prompt_tokens"))
    completion = _count(usage.get("completion_tokens"))
    if prompt is not None:
        attrs[semconv.ENGINE_USAGE_PROMPT_TOKENS] = prompt
    if completion is not None:
        attrs[semconv.ENGINE_USAGE_COMPLETION_TOKENS] = completion
        if convention != semconv.GENAI_SEMCONV_NONE:
            attrs[semconv.GEN_AI_USAGE_OUTPUT_TOKENS] = completion
    for modality, tokens in engine_tokens(usage, estimate).items():
        attrs[semconv.engine_usage_tokens(modality)] = tokens
        unit = f"{modality}.tokens"
        if estimate is not None and unit in estimate.root:
            attrs[semconv.unit_diff(unit)] = _whole(tokens - estimate[unit])
    return attrs


def fill_engine_text(handle: InferenceSpan, usage: Mapping[str, Any]) -> bool:
    """Count text with the engine's figure where modtrace did not count it.

    With ``TextConfig(kind="engine")`` modtrace leaves ``text.tokens`` to the
    engine; once the engine's usage is known, its text tokens (see
    :func:`engine_tokens`) join the span's counts, so that text is attributed.

    Returns:
        Whether the counts were completed.
    """
    units = handle.units
    if units is None or "text.tokens" in units.root:
        return False
    text = engine_tokens(usage, units).get("text")
    if text is None:
        return False
    filled = UnitCounts({**units.root, "text.tokens": text})
    count = handle.request_count
    if count is not None:
        counters = {**count.counters, "text": ENGINE_TEXT_COUNTER}
        handle.set_counts(count.model_copy(update={"units": filled, "counters": counters}))
    else:
        handle.set_counts(filled)
    return True


def sum_timers(timers: Iterable[GpuTimers]) -> GpuTimers | None:
    """The timers of several engine attempts of one call (retries), added up.

    Every attempt the engine ran used its GPU, so the request's seconds are
    their sum. A field stays unmeasured (``None``) only if no attempt
    measured it; the GPU count is the largest, the source the last one's.
    """
    found = list(timers)
    if not found:
        return None
    if len(found) == 1:
        return found[0]
    fields: dict[str, Any] = {}
    for name in ("total", *COMPONENTS):
        values = [v for t in found if (v := getattr(t, name)) is not None]
        if values:
            fields[name] = sum(values)
    return GpuTimers(**fields, gpu_count=max(t.gpu_count for t in found), source=found[-1].source)


def wall_clock_timers(seconds: float) -> GpuTimers:
    """The fallback timers: the gateway's wall clock of the call, labelled as such."""
    return GpuTimers(total=max(seconds, 0.0), source=GATEWAY_WALL_CLOCK)
