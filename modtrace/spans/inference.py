"""The inference span: one per request, shaped by the OpenTelemetry GenAI conventions.

Serving code opens it around the work of one request, with ready counts or a
request body to count, and hands it the GPU timers when the engine reports
them::

    with inference_span("Qwen/Qwen2.5-VL-7B-Instruct", request=body) as span:
        result = engine.generate(body)
        span.set_timers({"total": result.gpu_seconds, "gpu_count": 2})

    @trace_inference(request="body")
    async def handle(body): ...

The counts and timers are written as ``modtrace.units.*`` and
``modtrace.gpu.*`` attributes just before the span ends (last, so that the
SDK's attribute-count limit evicts older keys first), and handed to the
attribution span processor beside the span, so that a limit lower than the
number of inputs never loses one. No prompt text or media bytes are ever
written.

Nothing here raises into the caller's code: a failure (a counter raising,
bad timers) is recorded on the span as ``modtrace.error``, counted in the
``modtrace.errors`` metric, and everything else still lands. ``strict=True``
(or ``MODTRACE_STRICT=true``) raises instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import inspect
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from .. import semconv
from .._scope import SyncAndAsync, leave_context
from .._version import __version__
from ..counting.result import RequestCount
from ..environment_variables import (
    MODTRACE_GENAI_PROVIDER,
    MODTRACE_GENAI_SEMCONV,
    MODTRACE_STRICT,
)
from ..timers import GpuTimers
from ..units import UnitCounts
from .attributes import (
    MAX_ERROR_LENGTH,
    Attributes,
    Counts,
    Timers,
    count_attributes,
    genai_request_attributes,
    genai_usage_attributes,
    short_error,
    timer_attributes,
    to_timers,
    to_units,
)

__all__ = [
    "DEFAULT_PROVIDER",
    "InferenceSpan",
    "InferenceSpanContext",
    "SpanInputs",
    "counts_off_loop",
    "current_inference_span",
    "inference_span",
    "refresh_settings",
    "trace_inference",
]

#: ``gen_ai.provider.name`` when neither the code nor ``MODTRACE_GENAI_PROVIDER`` names one.
DEFAULT_PROVIDER = "vllm"
INSTRUMENTATION_NAME = "modtrace"

F = TypeVar("F", bound=Callable[..., Any])

_current: contextvars.ContextVar[InferenceSpan | None] = contextvars.ContextVar(
    "modtrace_inference_span", default=None
)


def current_inference_span() -> InferenceSpan | None:
    """The innermost open inference span of this thread or task, or ``None``.

    Lets code under :func:`trace_inference` report timers without the handle
    being passed down: ``current_inference_span().set_timers(...)``.
    """
    return _current.get()


def _strict_from_env() -> bool:
    # Read when a failure happens (rare), so it is always current.
    return os.environ.get(MODTRACE_STRICT, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True, slots=True)
class _Settings:
    convention: str
    provider: str


_settings: _Settings | None = None


def refresh_settings() -> None:
    """Re-read :envvar:`MODTRACE_GENAI_SEMCONV` and :envvar:`MODTRACE_GENAI_PROVIDER`.

    They are read once, at the first span (an environment lookup per request
    costs more than the rest of the span's bookkeeping);
    :func:`modtrace.export.configure` re-reads them too.
    """
    global _settings
    _settings = None


def _current_settings() -> _Settings:
    global _settings
    found = _settings
    if found is None:
        chosen = os.environ.get(MODTRACE_GENAI_SEMCONV, "").strip().lower()
        found = _settings = _Settings(
            convention=chosen
            if chosen in semconv.GENAI_SEMCONV_VERSIONS
            else semconv.GENAI_SEMCONV_DEVELOPMENT,
            provider=os.environ.get(MODTRACE_GENAI_PROVIDER, "").strip() or DEFAULT_PROVIDER,
        )
    return found


def _convention(value: str | None) -> str:
    if value is None:
        return _current_settings().convention
    chosen = value.strip().lower()
    if chosen not in semconv.GENAI_SEMCONV_VERSIONS:
        return semconv.GENAI_SEMCONV_DEVELOPMENT
    return chosen


# --- Inputs handed to the attribution processor beside the span ----------------------
@dataclass(frozen=True, slots=True)
class SpanInputs:
    """What an inference span carried when it ended, validated.

    Attributes:
        units: The unit counts, or ``None`` when none were set.
        timers: The GPU timers, or ``None`` when none were set.
        attributes: Every attribute modtrace wrote on the span (GenAI request
            attributes, raw counts, timers, ``modtrace.error``).
        model: ``gen_ai.request.model``, or ``None``.
    """

    units: UnitCounts | None
    timers: GpuTimers | None
    attributes: Attributes
    model: str | None


# Filled when an inference span ends, emptied by the processor's on_end, which
# the SDK calls from span.end(), right after: an entry normally lives for
# microseconds. A span that never reaches a processor (it ended on another
# provider than the processor's, or on one without any) leaves its entry
# behind, so entries are bounded in number and in age: the oldest go first
# beyond _PENDING_MAX, and any older than _PENDING_TTL_S goes at the next span.
_PENDING_MAX = 2048
_PENDING_TTL_S = 30.0
_monotonic = time.monotonic
_pending: dict[tuple[int, int], tuple[SpanInputs, float]] = {}
_pending_lock = threading.Lock()
_listeners = 0


def _register_listener(delta: int) -> None:
    """Count live attribution processors: inputs are only kept while one listens."""
    global _listeners
    with _pending_lock:
        _listeners = max(_listeners + delta, 0)
        if _listeners == 0:
            _pending.clear()


def _put_inputs(key: tuple[int, int], inputs: SpanInputs) -> None:
    if not _listeners:
        return
    now = _monotonic()
    with _pending_lock:
        _pending[key] = (inputs, now + _PENDING_TTL_S)
        # Oldest first: insertion order is expiry order.
        while _pending:
            oldest = next(iter(_pending))
            if len(_pending) <= _PENDING_MAX and _pending[oldest][1] > now:
                break
            del _pending[oldest]


def _take_inputs(key: tuple[int, int]) -> SpanInputs | None:
    found = _pending.pop(key, None)
    return found[0] if found is not None else None


# --- Tracers and the error counter, cached per provider -----------------------------
_tracers: weakref.WeakKeyDictionary[object, trace.Tracer] = weakref.WeakKeyDictionary()


def _tracer(provider: trace.TracerProvider | None) -> trace.Tracer:
    provider = provider or trace.get_tracer_provider()
    tracer = _tracers.get(provider)
    if tracer is None:
        tracer = trace.get_tracer(INSTRUMENTATION_NAME, __version__, provider)
        _tracers[provider] = tracer
    return tracer


def _count_error(meter_provider: object | None, stage: str) -> None:
    try:
        from ..metrics import instruments_for

        instruments_for(meter_provider).record_error(stage)  # type: ignore[arg-type]
    except Exception:  # the error counter must never raise into the request
        return


def _count_request(
    body: Mapping[str, Any],
    *,
    profile: object | None,
    headers: Mapping[str, str] | None,
    overrides: Mapping[str, Any] | None,
    counter: Any | None,
) -> RequestCount:
    """Count ``body`` with the counting module (imported here: it pulls in media decoders)."""
    if counter is not None:
        return counter.count(body, headers, profile=profile)
    from ..counting import count_request

    kwargs: dict[str, Any] = dict(overrides or {})
    if profile is not None:
        kwargs["profile"] = profile
    return count_request(body, headers=headers, **kwargs)


def counts_off_loop(counter: object | None) -> bool:
    """Whether counting with ``counter`` may block on I/O: it has a URL resolver.

    Resolvers run synchronously on the counting thread (see
    :class:`~modtrace.counting.counter.RequestCounter`); async integrations
    then count in a worker thread.
    """
    try:
        return getattr(counter, "resolver", None) is not None
    except Exception:  # a counter whose attribute raises: count inline, where failures land
        return False


# --- The handle --------------------------------------------------------------------------
class InferenceSpan:
    """The open inference span of one request: set counts and timers on it.

    Attributes:
        span: The OpenTelemetry span, for any other attribute or event.
        model: ``gen_ai.request.model``.
    """

    __slots__ = (
        "_errors",
        "_meter_provider",
        "_request_count",
        "_start_attributes",
        "_strict",
        "_timers",
        "_units",
        "convention",
        "end_time",
        "model",
        "span",
    )

    def __init__(
        self,
        span: trace.Span,
        *,
        model: str | None,
        convention: str,
        strict: bool | None,
        start_attributes: Attributes,
        meter_provider: object | None = None,
    ) -> None:
        self.span = span
        self.model = model
        self.convention = convention
        self._strict = strict
        self._start_attributes = start_attributes
        self._meter_provider = meter_provider
        self._units: UnitCounts | None = None
        self._request_count: RequestCount | None = None
        self._timers: GpuTimers | None = None
        self._errors: list[str] = []
        #: When the span ends, in ns since the epoch; ``None`` is "now". Set it
        #: to replay recorded traffic (the demo, imports of old logs).
        self.end_time: int | None = None

    @property
    def strict(self) -> bool:
        """Whether failures raise (the ``strict`` argument, else :envvar:`MODTRACE_STRICT`)."""
        return self._strict if self._strict is not None else _strict_from_env()

    @property
    def units(self) -> UnitCounts | None:
        """The unit counts set so far, or ``None``."""
        return self._units

    @property
    def request_count(self) -> RequestCount | None:
        """The :class:`RequestCount` when the request was counted here, else ``None``."""
        return self._request_count

    @property
    def timers(self) -> GpuTimers | None:
        """The GPU timers set so far, or ``None``."""
        return self._timers

    @property
    def errors(self) -> tuple[str, ...]:
        """The failures recorded on this span, one short line each."""
        return tuple(self._errors)

    def fail(self, stage: str, exc: BaseException | str) -> None:
        """Record a failure inside modtrace: ``modtrace.error`` and the error counter.

        Raises:
            Exception: ``exc`` itself (or a ``ValueError``) when the span is strict.
        """
        if self.strict:
            if isinstance(exc, BaseException):
                raise exc
            raise ValueError(exc)
        self._errors.append(short_error(stage, exc))
        _count_error(self._meter_provider, stage)

    def set_counts(self, counts: Counts) -> None:
        """Set ready counts: a :class:`RequestCount`, :class:`UnitCounts` or ``{unit: count}``.

        Replaces counts set before. Bad counts are recorded as an error and
        leave the previous counts in place.
        """
        try:
            self._units, self._request_count = to_units(counts)
        except Exception as exc:
            self.fail("count", exc)

    def count_request(
        self,
        body: Mapping[str, Any],
        *,
        profile: object | None = None,
        headers: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        counter: Any | None = None,
    ) -> RequestCount | None:
        """Count a request body with a counting profile and set its counts.

        Args:
            body: The OpenAI-compatible JSON body (never written to the span).
            profile: Profile name or object; the counting default when ``None``.
            headers: Request headers (media metadata).
            overrides: Counter parameter overrides (``max_pixels=...``).
            counter: A reusable ``RequestCounter``; used instead of ``profile``
                defaults when given.

        Returns:
            The count, or ``None`` when counting failed (recorded on the span).
        """
        try:
            count = _count_request(
                body, profile=profile, headers=headers, overrides=overrides, counter=counter
            )
        except Exception as exc:
            self.fail("count", exc)
            return None
        self._units, self._request_count = count.units, count
        return count

    async def count_request_async(
        self,
        body: Mapping[str, Any],
        *,
        profile: object | None = None,
        headers: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        counter: Any | None = None,
    ) -> RequestCount | None:
        """:meth:`count_request` for async code: off the event loop when it may block.

        A ``counter`` with a URL ``resolver`` may fetch media over the
        network, synchronously: it then counts in a worker thread
        (:func:`asyncio.to_thread`). Any other count takes microseconds to
        milliseconds and runs inline.
        """
        if not counts_off_loop(counter):
            return self.count_request(
                body, profile=profile, headers=headers, overrides=overrides, counter=counter
            )
        try:
            count = await asyncio.to_thread(
                _count_request,
                body,
                profile=profile,
                headers=headers,
                overrides=overrides,
                counter=counter,
            )
        except Exception as exc:
            self.fail("count", exc)
            return None
        self._units, self._request_count = count.units, count
        return count

    def set_timers(self, timers: Timers) -> None:
        """Set the GPU timers: a :class:`GpuTimers` or a mapping of its fields.

        Replaces timers set before. Bad timers are recorded as an error.
        """
        try:
            self._timers = to_timers(timers)
        except Exception as exc:
            self.fail("timers", exc)

    def _input_attributes(self) -> Attributes:
        attrs: Attributes = {}
        if self._units is not None:
            try:
                attrs = count_attributes(self._request_count or self._units)
                attrs.update(genai_usage_attributes(self._units, self.convention))
            except Exception as exc:
                self.fail("count", exc)
        if self._timers is not None:
            attrs.update(timer_attributes(self._timers))
        if self._errors:
            message = "; ".join(self._errors)
            if len(message) > MAX_ERROR_LENGTH:
                message = message[: MAX_ERROR_LENGTH - 1] + "…"
            attrs[semconv.ERROR] = message
        return attrs

    def _finish(self) -> None:
        """Write the inputs on the span and hand them to the attribution processor."""
        span = self.span
        if not span.is_recording():
            return
        attrs = self._input_attributes()
        model, key = self.model, semconv.GEN_AI_REQUEST_MODEL
        named_late = model and self._start_attributes.get(key) != model
        if named_late and self.convention != semconv.GENAI_SEMCONV_NONE:
            # Named after the span started (engine hooks learn it from the body).
            attrs[key] = model
        if attrs:
            span.set_attributes(attrs)
        ctx = span.get_span_context()
        _put_inputs(
            (ctx.trace_id, ctx.span_id),
            SpanInputs(
                units=self._units,
                timers=self._timers,
                attributes={**self._start_attributes, **attrs},
                model=self.model,
            ),
        )


# --- The context manager -----------------------------------------------------------------
class InferenceSpanContext(SyncAndAsync):
    """Opens the inference span of one request on ``with`` or ``async with``; single use.

    :func:`inference_span` is this class: ``with inference_span(model, request=body) as span``
    yields an :class:`InferenceSpan`.

    Args:
        model: ``gen_ai.request.model``; read from ``request["model"]`` when omitted.
        request: A request body to count with a counting profile. Never
            written to the span.
        profile: The counting profile (name or object); the counting default
            (``llm-d``) when ``None``.
        headers: Request headers the counters read (media metadata).
        overrides: Counter parameter overrides (``{"max_pixels": ...}``).
        counter: A reusable ``RequestCounter`` to count ``request`` with.
        counts: Ready counts instead of a request: :class:`RequestCount`,
            :class:`UnitCounts` or ``{unit: count}``.
        timers: GPU timers known up front; usually set later with
            :meth:`InferenceSpan.set_timers`.
        operation: ``gen_ai.operation.name`` (``chat``, ``text_completion``, ...).
        provider: ``gen_ai.provider.name``; default :envvar:`MODTRACE_GENAI_PROVIDER`
            or ``vllm``.
        kind: The span kind: ``INTERNAL`` for a model served in-process (the
            GenAI convention), ``CLIENT`` for a gateway calling an engine.
        attributes: Extra attributes set when the span starts.
        name: The span name; default ``"{operation} {model}"``.
        tracer_provider: The provider to use; the global one when ``None``.
        meter_provider: Where the error counter is recorded; global when ``None``.
        semconv_version: ``development``, ``v1.36`` or ``none``; default
            :envvar:`MODTRACE_GENAI_SEMCONV` or ``development``.
        strict: Raise failures inside modtrace instead of recording them;
            default :envvar:`MODTRACE_STRICT`.
        start_time: When the span started, in ns since the epoch (default
            now); with :attr:`InferenceSpan.end_time` it replays past traffic.
    """

    __slots__ = (
        "_attributes",
        "_convention",
        "_counter",
        "_counts",
        "_deferred_errors",
        "_handle",
        "_headers",
        "_kind",
        "_meter_provider",
        "_model",
        "_name",
        "_operation",
        "_overrides",
        "_profile",
        "_provider",
        "_request",
        "_start_time",
        "_strict",
        "_timers",
        "_tokens",
        "_tracer_provider",
    )

    def __init__(
        self,
        model: str | None = None,
        *,
        request: Mapping[str, Any] | None = None,
        profile: object | None = None,
        headers: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        counter: Any | None = None,
        counts: Counts | None = None,
        timers: Timers | None = None,
        operation: str = "chat",
        provider: str | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Mapping[str, Any] | None = None,
        name: str | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: object | None = None,
        semconv_version: str | None = None,
        strict: bool | None = None,
        start_time: int | None = None,
    ) -> None:
        if model is None and isinstance(request, Mapping):
            found = request.get("model")
            model = found if isinstance(found, str) else None
        self._model = model
        self._request = request
        self._profile = profile
        self._headers = headers
        self._overrides = overrides
        self._counter = counter
        self._counts = counts
        self._timers = timers
        self._operation = operation
        self._provider = provider
        self._kind = kind
        self._attributes = attributes
        self._name = name
        self._tracer_provider = tracer_provider
        self._meter_provider = meter_provider
        self._convention = semconv_version
        self._strict = strict
        self._start_time = start_time
        #: Failures met before the span opened, recorded on it when it does.
        self._deferred_errors: tuple[tuple[str, BaseException], ...] = ()
        self._handle: InferenceSpan | None = None
        self._tokens: tuple[object, contextvars.Token[InferenceSpan | None]] | None = None

    def __enter__(self) -> InferenceSpan:
        strict = self._strict
        convention = _convention(self._convention)
        provider = self._provider or _current_settings().provider
        start = genai_request_attributes(
            operation=self._operation, model=self._model, provider=provider, convention=convention
        )
        default_name = f"{self._operation} {self._model}" if self._model else self._operation
        name = self._name or default_name
        try:
            span = _tracer(self._tracer_provider).start_span(
                name,
                kind=self._kind,
                attributes={**self._attributes, **start} if self._attributes else start,
                start_time=self._start_time,
            )
        except Exception:
            if strict if strict is not None else _strict_from_env():
                raise
            span = trace.INVALID_SPAN
        handle = InferenceSpan(
            span,
            model=self._model,
            convention=convention,
            strict=strict,
            start_attributes=start,
            meter_provider=self._meter_provider,
        )
        self._handle = handle
        self._tokens = (
            otel_context.attach(trace.set_span_in_context(span)),
            _current.set(handle),
        )
        try:
            for stage, exc in self._deferred_errors:
                handle.fail(stage, exc)
            if self._counts is not None:
                handle.set_counts(self._counts)
            elif self._request is not None:
                handle.count_request(
                    self._request,
                    profile=self._profile,
                    headers=self._headers,
                    overrides=self._overrides,
                    counter=self._counter,
                )
            if self._timers is not None:
                handle.set_timers(self._timers)
        except BaseException as exc:  # strict mode only: end the span before raising
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        finally:
            self._let_go()
        return handle

    async def __aenter__(self) -> InferenceSpan:
        """``async with``: like ``with``, counting in a worker thread when it may block.

        A counter with a URL resolver may fetch media: the request is then
        counted with :meth:`InferenceSpan.count_request_async`, so the event
        loop keeps serving other requests meanwhile.
        """
        request = self._request
        if request is None or self._counts is not None or not counts_off_loop(self._counter):
            return self.__enter__()
        self._request = None  # counted below, off the loop
        headers = self._headers
        handle = self.__enter__()
        try:
            await handle.count_request_async(
                request,
                profile=self._profile,
                headers=headers,
                overrides=self._overrides,
                counter=self._counter,
            )
        except BaseException as exc:  # strict mode, or cancelled: end the span before raising
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise
        finally:
            del request, headers
        return handle

    def _let_go(self) -> None:
        """Drop the request, its headers and ready counts: the span has what it needs."""
        self._request = self._headers = self._counts = self._timers = None
        self._deferred_errors = ()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        handle = self._handle
        if handle is None:
            return False
        span = handle.span
        pending: BaseException | None = None
        # Only Exception is an error: GeneratorExit, KeyboardInterrupt and
        # asyncio cancellation are not (as in opentelemetry.trace.use_span).
        # Recording it may fail (an exception whose __str__ raises): the inputs
        # still land, the span still ends, and the caller's exception propagates.
        if isinstance(exc, Exception):
            with contextlib.suppress(Exception):
                if span.is_recording():
                    _record_error(span, exc)
        try:
            handle._finish()
        except Exception as internal:
            if exc is None and handle.strict:
                pending = internal
        finally:
            try:
                span.end(end_time=handle.end_time)
            except Exception as internal:
                if exc is None and pending is None and handle.strict:
                    pending = internal
            self._detach()
        if pending is not None:
            raise pending
        return False

    def detach(self) -> None:
        """Stop being the current span without ending it.

        For a span that outlives the call that opened it (a streamed
        response): the caller's context moves on, the span ends later.
        """
        self._detach()

    def _detach(self) -> None:
        tokens, self._tokens = self._tokens, None
        if tokens is not None:
            ctx_token, handle_token = tokens
            leave_context(_current, handle_token, ctx_token)


def _record_error(span: trace.Span, exc: BaseException) -> None:
    """Mark ``span`` failed by ``exc``: status ERROR, ``error.type``, an exception event.

    The status description is the exception's type alone: a message may echo
    user content (an engine's error body quoting the request). The message
    stays in the ``exception`` event, where the SDK's ``record_exception``
    puts it (``exception.message``), for backends that keep events.
    """
    name = type(exc).__qualname__
    # Each step on its own: an exception whose __str__ raises still gets a status.
    try:
        span.set_status(Status(StatusCode.ERROR, name))
        span.set_attribute(semconv.ERROR_TYPE, name)
    finally:
        span.record_exception(exc)


#: Open the inference span of one request (``with`` or ``async with``): see
#: :class:`InferenceSpanContext` for the arguments.
inference_span = InferenceSpanContext


# --- The decorator ---------------------------------------------------------------------------
RequestGetter = Callable[..., Mapping[str, Any] | None]
TimersGetter = Callable[[Any], Timers | None]


def _request_getter(fn: Callable[..., Any], request: str | RequestGetter | None) -> RequestGetter:
    """A function of the call's arguments returning the request body (or ``None``)."""
    if request is None:
        return lambda *args, **kwargs: None
    if callable(request):
        return request
    signature = inspect.signature(fn)
    if request not in signature.parameters:
        msg = f"trace_inference: {fn.__qualname__} has no parameter {request!r}"
        raise ValueError(msg)

    def get(*args: Any, **kwargs: Any) -> Mapping[str, Any] | None:
        return signature.bind_partial(*args, **kwargs).arguments.get(request)

    return get


def trace_inference(
    model: str | None = None,
    *,
    request: str | RequestGetter | None = None,
    timers_from: TimersGetter | None = None,
    **options: Any,
) -> Callable[[F], F]:
    """Decorate a sync or async request handler with an inference span.

    Args:
        model: ``gen_ai.request.model``; read from the request body when omitted.
        request: The name of the parameter holding the request body, or a
            function of the call's arguments returning it.
        timers_from: A function of the handler's result returning its GPU
            timers (or ``None``). Code inside the handler can also call
            ``current_inference_span().set_timers(...)``.
        **options: Any other :func:`inference_span` argument (``counts``,
            ``profile``, ``operation``, ``tracer_provider``...).

    Raises:
        ValueError: ``request`` names a parameter the function does not have
            (at decoration time, not per request).
    """

    def decorate(fn: F) -> F:
        get_request = _request_getter(fn, request)

        def open_span(args: tuple[Any, ...], kwargs: dict[str, Any]) -> InferenceSpanContext:
            body, errors = None, ()
            try:
                body = get_request(*args, **kwargs)
            except Exception as exc:
                errors = (("count", exc),)
            scope = InferenceSpanContext(model, request=body, **options)
            scope._deferred_errors = errors
            return scope

        def report(handle: InferenceSpan, result: Any) -> None:
            if timers_from is None:
                return
            try:
                timers = timers_from(result)
            except Exception as exc:
                handle.fail("timers", exc)
                return
            if timers is not None:
                handle.set_timers(timers)

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                async with open_span(args, kwargs) as handle:
                    result = await fn(*args, **kwargs)
                    report(handle, result)
                    return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with open_span(args, kwargs) as handle:
                result = fn(*args, **kwargs)
                report(handle, result)
                return result

        return wrapper  # type: ignore[return-value]

    return decorate
