"""Instrument the ``openai`` client: count, trace and time chat completions.

::

    client = instrument_openai(
        openai.OpenAI(base_url="http://vllm:8000/v1", api_key="-"),
        config=CountingConfig(model_profiles={"Qwen/Qwen2.5-Omni-7B": "qwen2.5-omni"}),
    )
    client.chat.completions.create(model="Qwen/Qwen2.5-Omni-7B", messages=[...])

Per ``chat.completions.create`` call, sync or async, streaming or not:

1. **Count** the request's units with the counting profile its model maps to
   (``CountingConfig.model_profiles``), from the call's arguments; media
   headers (``x-llm-d-video-*``) come from ``extra_headers``.
2. **Open the inference span** (kind ``CLIENT``, ``chat {model}``), or,
   when a modtrace inference span is already current (the gateway
   middleware's, :mod:`modtrace.integrations.asgi`, or one the application
   opened), **enrich that one** instead: the first engine call inside it
   writes its usage and timers there, later ones get their own spans. One
   inference span per engine call, so no request is attributed twice.
3. **Propagate the trace at send time**: an httpx request hook on the
   client's HTTP client injects ``traceparent`` into every request it sends,
   retries included, from the context current at that moment.
4. **Record the response**: the engine's ``usage`` (``prompt_tokens``,
   ``completion_tokens``, vLLM's ``prompt_tokens_details`` image, audio and
   video tokens) beside modtrace's counts, with the difference
   (``modtrace.units.<modality>.tokens.diff``), and the GPU timers the engine
   reported: the ``x-modtrace-gpu-seconds*`` response headers, or for a
   stream the ``modtrace`` object of its usage chunk or the SSE comment block
   before ``data: [DONE]`` (see ``docs/engine.md``). Retries add up. Without
   engine timers the span gets the call's wall clock, labelled
   ``modtrace.gpu.source = gateway_wall_clock``, and is attributed by the
   calibrated weights reconciled to it.

Streams end their span when they end: exhausted, closed, left by a ``with``
block, or garbage-collected; a stream closed early records what it has
(``modtrace.stream.ended_early``, wall clock). Errors (an HTTP error status,
a timeout, a refused connection) reach the caller exactly as without
modtrace; the span records them, with any timers the failed response carried.
A call that fails while enriching another span gives that span back, so
that the application's retry enriches it instead of opening a second one.

Once counted, a call keeps neither the request body nor its headers. On the
async client, a counter with a URL resolver (which fetches media,
synchronously) counts in a worker thread, off the event loop.

The wrapping is done once, at class level (``Completions.create`` and
``AsyncCompletions.create``, with ``wrapt``), and only acts for clients whose
HTTP client was instrumented here or, with :class:`ModtraceInstrumentor`,
for every client. Instrumentation follows the HTTP client: copies made with
``client.with_options(...)`` share it and are traced too.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import logging
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import openai
import wrapt
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind

from .. import semconv
from ..counting.counter import CountingConfig, RequestCounter
from ..engine.hooks import USAGE_EXTENSION, timers_from_headers, timers_from_sse
from ..spans.inference import InferenceSpan, InferenceSpanContext, inference_span
from ..timers import GpuTimers
from ._common import (
    claim_current_span,
    fill_engine_text,
    release_claim,
    sum_timers,
    usage_attributes,
    usage_mapping,
    wall_clock_timers,
    was_released,
)

__all__ = [
    "OpenAISettings",
    "instrument_openai",
    "is_instrumented",
    "uninstrument_openai",
]

_log = logging.getLogger(__name__)

#: The header the openai client sets for ``with_raw_response`` (``"true"``) and
#: ``with_streaming_response`` (``"stream"``); their bodies are read by the caller.
_RAW_RESPONSE_HEADER = "x-stainless-raw-response"
#: ``create`` arguments that are not part of the JSON body.
_NOT_BODY = frozenset({"extra_headers", "extra_query", "extra_body", "timeout"})
# An SSE line longer than this cannot be a timer comment: keep only its end.
_MAX_TAIL = 4096
_TIMER_MARK = b"x-modtrace-"


# --- Settings and registries --------------------------------------------------------------
@dataclass(frozen=True)
class OpenAISettings:
    """How instrumented calls are counted and traced.

    Attributes:
        counter: Counts each request (its ``config.model_profiles`` picks the
            profile by model).
        tracer_provider: Where the spans go; the global provider when ``None``.
        meter_provider: Where failures are counted; the global one when ``None``.
        wall_clock_fallback: Without engine timers, record the call's wall
            clock (source ``gateway_wall_clock``) on a successful call.
    """

    counter: RequestCounter
    tracer_provider: trace.TracerProvider | None = None
    meter_provider: object | None = None
    wall_clock_fallback: bool = True

    @classmethod
    def build(
        cls,
        *,
        counter: RequestCounter | None = None,
        config: CountingConfig | None = None,
        tracer_provider: trace.TracerProvider | None = None,
        meter_provider: object | None = None,
        wall_clock_fallback: bool = True,
    ) -> OpenAISettings:
        """Settings from the public arguments (``counter`` wins over ``config``)."""
        if counter is not None and config is not None:
            msg = "pass counter= or config=, not both"
            raise ValueError(msg)
        return cls(
            counter=counter or RequestCounter(config),
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
            wall_clock_fallback=wall_clock_fallback,
        )


_lock = threading.RLock()
# HTTP client -> settings of the openai clients instrumented with instrument_openai.
_clients: weakref.WeakKeyDictionary[Any, OpenAISettings] = weakref.WeakKeyDictionary()
# HTTP clients carrying the hooks (instrument_openai, or lazily under the instrumentor).
_hooked: weakref.WeakSet[Any] = weakref.WeakSet()
_global: OpenAISettings | None = None
# The call in progress in this thread or task, for the HTTP hooks.
_in_call: contextvars.ContextVar[_Call | None] = contextvars.ContextVar(
    "modtrace_openai_call", default=None
)


def _http_client(client: object) -> Any:
    """The httpx client an openai client sends through (``client._client``)."""
    return getattr(client, "_client", None)


def instrument_openai(
    client: Any,
    *,
    counter: RequestCounter | None = None,
    config: CountingConfig | None = None,
    tracer_provider: trace.TracerProvider | None = None,
    meter_provider: object | None = None,
    wall_clock_fallback: bool = True,
) -> Any:
    """Trace the chat completions of one ``openai.OpenAI`` or ``openai.AsyncOpenAI`` client.

    Calling it again replaces the settings; hooks are never added twice.

    Args:
        client: The client. Copies made with ``with_options`` share its HTTP
            client and are traced too.
        counter: A reusable request counter.
        config: The counting configuration (``model_profiles`` maps model
            names to counting profiles), when ``counter`` is not given.
        tracer_provider: Where the spans go; the global provider when ``None``.
        meter_provider: Where failures are counted; the global one when ``None``.
        wall_clock_fallback: Record the call's wall clock when the engine
            reports no timers.

    Returns:
        The same client, for chaining.

    Raises:
        TypeError: ``client`` is not an openai client.
        ValueError: both ``counter`` and ``config`` were given.
    """
    http = _http_client(client)
    if http is None or not hasattr(http, "event_hooks") or not hasattr(client, "chat"):
        msg = f"instrument_openai: expected an openai.OpenAI or AsyncOpenAI, got {type(client)!r}"
        raise TypeError(msg)
    settings = OpenAISettings.build(
        counter=counter,
        config=config,
        tracer_provider=tracer_provider,
        meter_provider=meter_provider,
        wall_clock_fallback=wall_clock_fallback,
    )
    with _lock:
        _clients[http] = settings
        _install_hooks(http)
        _patch()
    return client


def uninstrument_openai(client: Any) -> None:
    """Stop tracing ``client`` (and the clients sharing its HTTP client).

    Under :class:`ModtraceInstrumentor` the client stays traced with the
    instrumentor's settings.
    """
    http = _http_client(client)
    with _lock:
        if http is not None:
            with contextlib.suppress(TypeError):
                _clients.pop(http, None)
            if _global is None:
                _remove_hooks(http)
        _unpatch_if_unused()


def is_instrumented(client: Any) -> bool:
    """Whether calls of ``client`` are traced (by :func:`instrument_openai` or the instrumentor)."""
    return _settings_for_http(_http_client(client)) is not None and _is_patched()


def _settings_for_http(http: Any) -> OpenAISettings | None:
    if http is None:
        return None
    try:
        found = _clients.get(http)
    except TypeError:  # not weak-referenceable
        found = None
    return found if found is not None else _global


def _enable_global(settings: OpenAISettings) -> None:
    """Trace every client (the instrumentor); hooks are added at each client's first call."""
    global _global
    with _lock:
        _global = settings
        _patch()


def _disable_global() -> None:
    """Undo :func:`_enable_global`; explicitly instrumented clients stay traced."""
    global _global
    with _lock:
        _global = None
        for http in list(_hooked):
            try:
                explicit = http in _clients
            except TypeError:
                explicit = False
            if not explicit:
                _remove_hooks(http)
        _unpatch_if_unused()


# --- Class-level wrapping --------------------------------------------------------------------
def _classes() -> tuple[type, type]:
    from openai.resources.chat.completions import AsyncCompletions, Completions

    return Completions, AsyncCompletions


def _wrapped_by_us(cls: type) -> bool:
    found = inspect.getattr_static(cls, "create", None)
    return isinstance(found, wrapt.FunctionWrapper) and getattr(found, "_self_wrapper", None) in (
        _traced_create,
        _atraced_create,
    )


def _is_patched() -> bool:
    sync_cls, async_cls = _classes()
    return _wrapped_by_us(sync_cls) and _wrapped_by_us(async_cls)


def _patch() -> None:
    sync_cls, async_cls = _classes()
    if not _wrapped_by_us(sync_cls):
        wrapt.wrap_function_wrapper(sync_cls, "create", _traced_create)
    if not _wrapped_by_us(async_cls):
        wrapt.wrap_function_wrapper(async_cls, "create", _atraced_create)


def _unpatch_if_unused() -> None:
    if _global is not None or len(_clients) > 0:
        return
    for cls in _classes():
        found = inspect.getattr_static(cls, "create", None)
        if _wrapped_by_us(cls):
            setattr(cls, "create", found.__wrapped__)  # noqa: B010 (the attribute is dynamic)


# --- HTTP hooks: traceparent at send time, response headers ---------------------------------
def _on_request(request: Any) -> None:
    try:
        # The context current *now*: each retry carries the span that sends it.
        propagate.inject(request.headers)
        call = _in_call.get()
        if call is not None:
            call.attempts += 1
    except Exception:  # a hook must never fail the request
        _log.exception("modtrace: could not inject the trace context")


def _on_response(response: Any) -> None:
    call = _in_call.get()
    if call is None:
        return
    try:
        call.on_response(response)
    except Exception:
        _log.exception("modtrace: could not read the engine response headers")


async def _aon_request(request: Any) -> None:
    _on_request(request)


async def _aon_response(response: Any) -> None:
    _on_response(response)


def _is_async_client(http: Any) -> bool:
    return inspect.iscoroutinefunction(getattr(http, "send", None))


def _install_hooks(http: Any) -> None:
    """Add the request and response hooks to an httpx client, once."""
    with _lock:
        hooks = http.event_hooks
        request_hook, response_hook = (
            (_aon_request, _aon_response) if _is_async_client(http) else (_on_request, _on_response)
        )
        requests, responses = list(hooks.get("request", [])), list(hooks.get("response", []))
        if request_hook not in requests:
            requests.append(request_hook)
        if response_hook not in responses:
            responses.append(response_hook)
        http.event_hooks = {"request": requests, "response": responses}
        with contextlib.suppress(TypeError):
            _hooked.add(http)


def _remove_hooks(http: Any) -> None:
    ours = (_on_request, _on_response, _aon_request, _aon_response)
    with contextlib.suppress(Exception):
        hooks = http.event_hooks
        http.event_hooks = {
            "request": [h for h in hooks.get("request", []) if h not in ours],
            "response": [h for h in hooks.get("response", []) if h not in ours],
        }
    with contextlib.suppress(TypeError):
        _hooked.discard(http)


# --- SSE comment block, read from the raw bytes ----------------------------------------------
class _CommentScanner:
    """Keeps the ``: x-modtrace-...`` comment lines of an SSE stream as it passes by."""

    __slots__ = ("_tail", "lines")

    def __init__(self) -> None:
        self._tail = b""
        self.lines: list[bytes] = []

    def feed(self, data: bytes) -> None:
        """Look at one chunk of the raw stream (lines may straddle chunks)."""
        buffer = self._tail + data if self._tail else data
        cut = max(buffer.rfind(b"\n"), buffer.rfind(b"\r")) + 1
        complete, self._tail = buffer[:cut], buffer[cut:][-_MAX_TAIL:]
        if _TIMER_MARK in complete:
            self.lines.extend(
                line for line in complete.splitlines() if line[:1] == b":" and _TIMER_MARK in line
            )

    def text(self) -> bytes:
        """The timer comment lines seen so far."""
        return b"\n".join(self.lines)


@functools.cache
def _scanning_stream_classes(package: Any) -> tuple[type, type]:
    """Byte-stream wrappers subclassing ``package``'s (httpx or httpx2) stream types.

    httpx checks ``isinstance(response.stream, SyncByteStream)`` before
    reading, so the wrapper must be one.
    """

    class SyncScanningStream(package.SyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, scanner: _CommentScanner) -> None:
            self._inner, self._scanner = inner, scanner

        def __iter__(self) -> Iterator[bytes]:
            for chunk in self._inner:
                self._scanner.feed(chunk)
                yield chunk

        def close(self) -> None:
            self._inner.close()

    class AsyncScanningStream(package.AsyncByteStream):  # type: ignore[name-defined,misc]
        def __init__(self, inner: Any, scanner: _CommentScanner) -> None:
            self._inner, self._scanner = inner, scanner

        async def __aiter__(self) -> AsyncIterator[bytes]:
            async for chunk in self._inner:
                self._scanner.feed(chunk)
                yield chunk

        async def aclose(self) -> None:
            await self._inner.aclose()

    return SyncScanningStream, AsyncScanningStream


def _scan_stream(response: Any, scanner: _CommentScanner, is_async: bool) -> bool:
    """Route ``response``'s raw bytes past ``scanner``; ``False`` if the stream type is unknown."""
    package = sys.modules.get(type(response).__module__.partition(".")[0])
    if package is None or not hasattr(package, "SyncByteStream"):
        return False
    sync_cls, async_cls = _scanning_stream_classes(package)
    response.stream = (async_cls if is_async else sync_cls)(response.stream, scanner)
    return True


# --- One call ----------------------------------------------------------------------------------
def _omitted(value: object) -> bool:
    return isinstance(value, (openai.NotGiven, openai.Omit))


def request_body(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON body ``create(**kwargs)`` sends: its arguments, then ``extra_body``."""
    body = {k: v for k, v in kwargs.items() if k not in _NOT_BODY and not _omitted(v)}
    extra = kwargs.get("extra_body")
    if isinstance(extra, Mapping):
        body.update(extra)
    return body


def _request_headers(client: Any, kwargs: Mapping[str, Any]) -> dict[str, str]:
    """Headers the call sends that counting reads (media metadata): defaults, then extras."""
    out: dict[str, str] = {}
    with contextlib.suppress(Exception):
        for source in (getattr(client, "default_headers", None), kwargs.get("extra_headers")):
            if isinstance(source, Mapping):
                out.update({str(k): v for k, v in source.items() if isinstance(v, str)})
    return out


def _server_attributes(client: Any) -> dict[str, Any]:
    attrs: dict[str, Any] = {}
    with contextlib.suppress(Exception):
        url = client.base_url
        if url.host:
            attrs[semconv.SERVER_ADDRESS] = url.host
            port = url.port or {"https": 443, "http": 80}.get(url.scheme)
            if port:
                attrs[semconv.SERVER_PORT] = port
    return attrs


class _Call:
    """The bookkeeping of one ``create`` call: its span, responses, timers and usage."""

    __slots__ = (
        "_done",
        "_observe_failed",
        "attempts",
        "earlier_timers",
        "enriching",
        "extension_timers",
        "finish_reasons",
        "handle",
        "is_async",
        "raw",
        "response_id",
        "response_model",
        "response_timers",
        "scanner",
        "scope",
        "settings",
        "started",
        "status",
        "stream",
        "stream_header_timers",
        "timer_errors",
        "usage",
    )

    def __init__(self, settings: OpenAISettings, kwargs: Mapping[str, Any], is_async: bool) -> None:
        self.settings = settings
        self.is_async = is_async
        self.started = time.perf_counter()
        self.stream = kwargs.get("stream") is True
        extra = kwargs.get("extra_headers")
        raw = None
        if isinstance(extra, Mapping):
            found = (v for k, v in extra.items() if str(k).lower() == _RAW_RESPONSE_HEADER)
            raw = next(found, None)
        self.raw: str | None = raw if isinstance(raw, str) else None
        self.handle: InferenceSpan | None = None
        self.scope: InferenceSpanContext | None = None
        self.enriching = False
        # The timers a failed earlier call left on the span this call enriches.
        self.earlier_timers: GpuTimers | None = None
        self._observe_failed = False
        self.attempts = 0
        self.status: int | None = None
        self.response_timers: list[GpuTimers] = []  # per finished (non-stream) response
        self.stream_header_timers: GpuTimers | None = None
        self.extension_timers: GpuTimers | None = None
        self.timer_errors: list[str] = []
        self.scanner: _CommentScanner | None = None
        self.usage: object | None = None
        self.response_model: str | None = None
        self.response_id: str | None = None
        self.finish_reasons: list[str] = []
        self._done = False

    # -- Start --------------------------------------------------------------------------------
    # The request body and headers are locals of begin(): once counted, the call
    # keeps none of them (a stream's call lives as long as the stream).
    @classmethod
    def begin(
        cls, settings: OpenAISettings, client: Any, kwargs: Mapping[str, Any], is_async: bool
    ) -> _Call:
        """Count the request and open (or claim) its inference span, made current."""
        call = cls(settings, kwargs, is_async)
        body, headers = request_body(kwargs), _request_headers(client, kwargs)
        claimed = call._claim()
        if claimed is not None:
            try:
                if claimed.units is None:
                    claimed.count_request(body, headers=headers, counter=settings.counter)
            except BaseException:  # strict mode: the span is not this call's after all
                release_claim(claimed)
                raise
            return call
        scope = call._scope(client, body, headers)
        call.handle = scope.__enter__()
        call.scope = scope
        return call

    @classmethod
    async def abegin(
        cls, settings: OpenAISettings, client: Any, kwargs: Mapping[str, Any]
    ) -> _Call:
        """:meth:`begin` for the async client: a count that may fetch URLs runs in a thread."""
        call = cls(settings, kwargs, True)
        body, headers = request_body(kwargs), _request_headers(client, kwargs)
        claimed = call._claim()
        if claimed is not None:
            try:
                if claimed.units is None:
                    await claimed.count_request_async(
                        body, headers=headers, counter=settings.counter
                    )
            except BaseException:  # strict mode or cancelled: give the span back
                release_claim(claimed)
                raise
            return call
        scope = call._scope(client, body, headers)
        del body, headers  # the scope holds them until counted
        call.handle = await scope.__aenter__()
        call.scope = scope
        return call

    def _claim(self) -> InferenceSpan | None:
        """Enrich the current inference span when no engine call has yet."""
        claimed = claim_current_span()
        if claimed is not None:
            self.handle, self.enriching = claimed, True
            if was_released(claimed):
                self.earlier_timers = claimed.timers
        return claimed

    def _scope(
        self, client: Any, body: Mapping[str, Any], headers: Mapping[str, str]
    ) -> InferenceSpanContext:
        """This call's own inference span (not entered yet)."""
        settings = self.settings
        model = body.get("model")
        return inference_span(
            model if isinstance(model, str) else None,
            request=body,
            headers=headers,
            counter=settings.counter,
            kind=SpanKind.CLIENT,
            attributes=_server_attributes(client),
            tracer_provider=settings.tracer_provider,
            meter_provider=settings.meter_provider,
        )

    # -- HTTP responses (from the hook) ------------------------------------------------------
    def on_response(self, response: Any) -> None:
        """Note one HTTP response: status, timer headers; watch an SSE body for the timer block."""
        self.status = response.status_code
        timers = timers_from_headers(response.headers, errors=self.timer_errors)
        content_type = response.headers.get("content-type", "").lower()
        if content_type.startswith("text/event-stream") and response.status_code < 400:
            self.stream_header_timers = timers
            scanner = _CommentScanner()
            if _scan_stream(response, scanner, self.is_async):
                self.scanner = scanner
        elif timers is not None:
            self.response_timers.append(timers)

    # -- Chunks of a stream --------------------------------------------------------------------
    def observe_safely(self, chunk: Any) -> None:
        """:meth:`observe`, never raising into the reader: the first failure goes on the span."""
        try:
            self.observe(chunk)
        except Exception as exc:
            if self._observe_failed:
                return
            self._observe_failed = True
            handle = self.handle
            if handle is not None:
                with contextlib.suppress(Exception):  # strict mode raises: not into the stream
                    handle.fail("stream", exc)

    def observe(self, chunk: Any) -> None:
        """Note one streamed chunk: the model, finish reasons, the usage and its timers."""
        self._note_response(chunk)
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.usage = usage
            extra = getattr(chunk, "model_extra", None) or {}
            found = extra.get(USAGE_EXTENSION)
            if isinstance(found, Mapping):
                self.extension_timers = timers_from_headers(found, errors=self.timer_errors)

    # -- End ----------------------------------------------------------------------------------
    def returned(self, result: Any) -> Any:
        """The call returned: record a completion and end, or hand back a traced stream."""
        if self.raw is not None:
            return self._returned_raw(result)
        if self.stream and (hasattr(result, "__next__") or hasattr(result, "__anext__")):
            self._leave_open()
            wrapper = _AsyncTracedStream if self.is_async else _TracedStream
            return wrapper(result, self)
        self._note_completion(result)
        self.finish(complete=True)
        return result

    def _returned_raw(self, result: Any) -> Any:
        # with_raw_response: the body is read and parse() caches, so the caller's
        # parse() gets the same object. Streams and with_streaming_response are
        # read by the caller later: the span ends with the counts alone.
        if self.raw == "true" and not self.stream:
            with contextlib.suppress(Exception):
                self._note_completion(result.parse())
            self.finish(complete=True)
        else:
            self.finish(complete=False)
        return result

    def _leave_open(self) -> None:
        """The span outlives this call (a stream): restore the caller's context now."""
        if self.scope is not None:
            # Detach here, in the context that attached; the span ends with the stream.
            self.scope.detach()

    def _note_completion(self, completion: Any) -> None:
        self.usage = getattr(completion, "usage", None)
        self._note_response(completion)

    def _note_response(self, response: Any) -> None:
        """The model and id of a completion or of a stream's first chunk; finish reasons."""
        if self.response_model is None:
            self.response_model = getattr(response, "model", None)
            self.response_id = getattr(response, "id", None)
        for choice in getattr(response, "choices", None) or ():
            reason = getattr(choice, "finish_reason", None)
            if reason:
                self.finish_reasons.append(str(reason))

    def _engine_timers(self, *, stream_ended: bool) -> GpuTimers | None:
        found = list(self.response_timers)
        if stream_ended:
            timers = self.extension_timers
            if timers is None and self.scanner is not None and self.scanner.lines:
                timers = timers_from_sse(self.scanner.text(), errors=self.timer_errors)
            timers = timers or self.stream_header_timers
            if timers is not None:
                found.append(timers)
        return sum_timers(found)

    def finish(
        self,
        *,
        complete: bool,
        exc: BaseException | None = None,
        ended_early: bool | None = None,
    ) -> None:
        """Write usage, response attributes and timers, then end the span (once).

        Args:
            complete: The engine's answer arrived (all of it, for a stream).
            exc: The exception the call or stream raised.
            ended_early: For a stream, whether it was closed before its end.
        """
        if self._done:
            return
        self._done = True
        handle = self.handle
        if handle is None:
            return
        try:
            self._record(handle, complete=complete, exc=exc, ended_early=ended_early)
        except Exception as internal:
            with contextlib.suppress(Exception):
                handle.fail("usage", internal)
        finally:
            self._end(handle, exc)

    def _record(
        self,
        handle: InferenceSpan,
        *,
        complete: bool,
        exc: BaseException | None,
        ended_early: bool | None,
    ) -> None:
        attrs: dict[str, Any] = {}
        usage = usage_mapping(self.usage)
        if usage is not None:
            attrs.update(usage_attributes(usage, handle.units, convention=handle.convention))
            fill_engine_text(handle, usage)
        if handle.convention != semconv.GENAI_SEMCONV_NONE:
            if self.response_model:
                attrs[semconv.GEN_AI_RESPONSE_MODEL] = self.response_model
            if self.response_id:
                attrs[semconv.GEN_AI_RESPONSE_ID] = self.response_id
            if self.finish_reasons:
                attrs[semconv.GEN_AI_RESPONSE_FINISH_REASONS] = list(self.finish_reasons)
        if ended_early is not None:
            attrs[semconv.STREAM_ENDED_EARLY] = ended_early
        if not self.enriching:
            # HTTP client attributes describe this span's own request only.
            if self.status is not None:
                attrs[semconv.HTTP_RESPONSE_STATUS_CODE] = self.status
            if self.attempts > 1:
                attrs[semconv.HTTP_REQUEST_RESEND_COUNT] = self.attempts - 1
        if attrs:
            handle.span.set_attributes(attrs)
        for reason in self.timer_errors:
            handle.fail("timers", reason)
        stream_ended = self.stream and (complete or bool(ended_early)) and exc is None
        timers = self._engine_timers(stream_ended=stream_ended)
        # Wall clock only for an answered call: a refused or failed request may
        # never have reached a GPU, and a raw response is still being read.
        answered = exc is None and (complete or bool(ended_early))
        if timers is None and answered and self.settings.wall_clock_fallback:
            timers = wall_clock_timers(time.perf_counter() - self.started)
        if timers is not None and self.earlier_timers is not None:
            # A retry of a failed call on the same span: both attempts used the GPU.
            timers = sum_timers([self.earlier_timers, timers])
        if timers is not None:
            handle.set_timers(timers)

    def _end(self, handle: InferenceSpan, exc: BaseException | None) -> None:
        scope, self.scope = self.scope, None
        if scope is not None:
            if exc is None:
                scope.__exit__(None, None, None)
            else:
                scope.__exit__(type(exc), exc, exc.__traceback__)
        elif exc is not None and isinstance(exc, Exception):
            # Enriching a span we do not own: an event only; its owner sets the
            # status from its own outcome (the gateway may still answer). The
            # span goes back to its owner: the application's retry enriches it,
            # instead of opening a second span beside the owner's wall clock.
            with contextlib.suppress(Exception):
                handle.span.record_exception(exc)
            release_claim(handle)


# --- Traced streams ---------------------------------------------------------------------------
class _TracedStreamBase(wrapt.ObjectProxy):  # type: ignore[misc]
    """A stream proxy that ends its call's span when the stream ends, however it ends."""

    def __init__(self, stream: Any, call: _Call) -> None:
        super().__init__(stream)
        self._self_call = call

    def _stopped(self, exc: BaseException) -> None:
        """The stream raised ``exc`` instead of a chunk: its end, an error, or the caller left."""
        call = self._self_call
        if isinstance(exc, (StopIteration, StopAsyncIteration)):
            call.finish(complete=True, ended_early=False)
        elif isinstance(exc, Exception):
            call.finish(complete=False, exc=exc, ended_early=False)
        else:  # cancelled or interrupted: the caller stopped reading
            call.finish(complete=False, ended_early=True)

    def _left(self) -> None:
        """The caller closed or left the stream: end the span with what it has."""
        self._self_call.finish(complete=False, ended_early=True)

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self._left()


class _TracedStream(_TracedStreamBase):
    """An ``openai.Stream`` that ends its call's span when it ends, however it ends."""

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            chunk = self.__wrapped__.__next__()
        except BaseException as exc:
            self._stopped(exc)
            raise
        self._self_call.observe_safely(chunk)
        return chunk

    def __enter__(self) -> _TracedStream:
        self.__wrapped__.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> Any:
        try:
            return self.__wrapped__.__exit__(*exc_info)
        finally:
            self._left()

    def close(self) -> None:
        """Close the response and end the span with what it has."""
        try:
            self.__wrapped__.close()
        finally:
            self._left()


class _AsyncTracedStream(_TracedStreamBase):
    """An ``openai.AsyncStream`` that ends its call's span when it ends, however it ends."""

    def __aiter__(self) -> _AsyncTracedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            chunk = await self.__wrapped__.__anext__()
        except BaseException as exc:
            self._stopped(exc)
            raise
        self._self_call.observe_safely(chunk)
        return chunk

    async def __aenter__(self) -> _AsyncTracedStream:
        await self.__wrapped__.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        try:
            return await self.__wrapped__.__aexit__(*exc_info)
        finally:
            self._left()

    async def close(self) -> None:
        """Close the response and end the span with what it has."""
        try:
            await self.__wrapped__.close()
        finally:
            self._left()

    async def aclose(self) -> None:
        """Alias of :meth:`close`."""
        await self.close()


# --- The wrappers -----------------------------------------------------------------------------
def _traced_client(instance: Any) -> tuple[Any, OpenAISettings] | None:
    """The openai client of a ``Completions`` resource and its settings, if it is traced."""
    if _in_call.get() is not None:
        return None  # a create inside a traced create: the outer one traces
    client = getattr(instance, "_client", None)
    http = _http_client(client)
    settings = _settings_for_http(http)
    if settings is None:
        return None
    if http not in _hooked:
        _install_hooks(http)  # under the instrumentor: at the client's first call
    return client, settings


def _start(instance: Any, kwargs: Mapping[str, Any], is_async: bool) -> _Call | None:
    """The call's bookkeeping, or ``None`` when this call is not traced."""
    try:
        found = _traced_client(instance)
        return None if found is None else _Call.begin(found[1], found[0], kwargs, is_async)
    except Exception:
        _log.exception("modtrace: could not trace an openai call; it runs untraced")
        return None


async def _astart(instance: Any, kwargs: Mapping[str, Any]) -> _Call | None:
    """:func:`_start` for the async client (counting off the event loop when it may block)."""
    try:
        found = _traced_client(instance)
        return None if found is None else await _Call.abegin(found[1], found[0], kwargs)
    except Exception:
        _log.exception("modtrace: could not trace an openai call; it runs untraced")
        return None


@contextlib.contextmanager
def _calling(call: _Call) -> Iterator[None]:
    """``call`` is the call in progress while ``create`` runs; what it raises ends the call."""
    token = _in_call.set(call)
    try:
        yield
    except BaseException as exc:
        _in_call.reset(token)
        call.finish(complete=False, exc=exc)
        raise
    _in_call.reset(token)


def _traced_create(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``Completions.create``, traced."""
    call = _start(instance, kwargs, is_async=False)
    if call is None:
        return wrapped(*args, **kwargs)
    with _calling(call):
        result = wrapped(*args, **kwargs)
    return _safely_returned(call, result)


async def _atraced_create(
    wrapped: Callable[..., Any], instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """``AsyncCompletions.create``, traced."""
    call = await _astart(instance, kwargs)
    if call is None:
        return await wrapped(*args, **kwargs)
    with _calling(call):
        result = await wrapped(*args, **kwargs)
    return _safely_returned(call, result)


def _safely_returned(call: _Call, result: Any) -> Any:
    """``call.returned(result)``; on an internal failure, the result untouched."""
    try:
        return call.returned(result)
    except Exception:
        _log.exception("modtrace: could not record an openai response")
        with contextlib.suppress(Exception):
            call.finish(complete=False)
        return result
