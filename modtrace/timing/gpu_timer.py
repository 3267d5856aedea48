"""Time one request's GPU work, whole and by component, in engine code.

``GpuTimer`` measures intervals with one of two sources:

* ``wall_clock`` (the default): ``time.perf_counter`` seconds. On a GPU
  these are the seconds the GPUs were held, busy or not.
* ``cuda_events``: a pair of ``torch.cuda.Event(enable_timing=True)``
  recorded on the current stream around each interval; the elapsed time
  between them is the GPU timeline's, so host overhead that the GPU hides
  is not counted. Events are only synchronized when the timers are read,
  never on the hot path. torch stays optional: it is imported lazily and
  ``source="auto"`` falls back to the wall clock when it is missing or
  sees no CUDA device.

Either way an interval's seconds are multiplied by ``gpu_count``, since
under tensor parallelism every GPU of the engine is held for the interval.

Components (``vision_encoder``, ``audio_encoder``, ``prefill``, ``decode``)
record *exclusive* time: a component opened inside another one is taken
out of the outer one, so the components never overlap and never add up to
more than the time they cover. Repeated components accumulate. The nesting
is tracked per execution context (``contextvars``), so one timer can be
used from threads and asyncio tasks alike.

Scopes closed out of order (a generator holding ``with timer.component(...)``
open past the ``with timer:`` around it) never raise into engine code: the
timer's scopes opened inside the one closing are closed with it, the timer
counts the event (:attr:`GpuTimer.out_of_order`), and a later exit that finds
its scope gone is ignored. ``strict=True`` (or ``MODTRACE_STRICT=true``)
raises ``RuntimeError`` instead, after the same clean-up, unless an exception
is already propagating.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Protocol

from .._scope import SyncAndAsync
from ..environment_variables import MODTRACE_STRICT
from ..timers import COMPONENTS, GpuTimers

__all__ = ["CudaEvent", "GpuTimer", "TimerSource", "cuda_event_factory"]

#: The sources a timer can be asked for.
TimerSource = Literal["wall_clock", "cuda_events", "auto"]
_SOURCES: tuple[str, ...] = ("wall_clock", "cuda_events", "auto")


class CudaEvent(Protocol):
    """The part of ``torch.cuda.Event`` that the timer uses."""

    def record(self) -> None:
        """Record the event on the current stream."""

    def query(self) -> bool:
        """Whether all work before the event has completed (non-blocking)."""

    def synchronize(self) -> None:
        """Block until all work before the event has completed."""

    def elapsed_time(self, end_event: Any) -> float:
        """Milliseconds between this event and ``end_event``."""


def cuda_event_factory() -> Callable[[], CudaEvent] | None:
    """Return a factory of timing CUDA events, or ``None`` without CUDA.

    torch is imported here, lazily, so that modtrace never requires it.
    A torch that is missing, fails to import (a broken CUDA install raises
    ``OSError``) or sees no device yields ``None``.

    Returns:
        ``lambda: torch.cuda.Event(enable_timing=True)`` when
        ``torch.cuda.is_available()``, else ``None``.
    """
    try:
        torch = importlib.import_module("torch")
    except (ImportError, OSError):
        return None
    try:
        available = bool(torch.cuda.is_available())
    except (AttributeError, RuntimeError):
        return None
    if not available:
        return None
    event_class = torch.cuda.Event
    return lambda: event_class(enable_timing=True)


# --- Interval sources --------------------------------------------------------
class _WallSource:
    """Marks are clock readings; an interval is known as soon as it closes."""

    __slots__ = ("clock",)
    name = "wall_clock"

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock

    def mark(self) -> float:
        return self.clock()

    def ready(self, start: float, end: float) -> bool:
        return True

    def wait(self, start: float, end: float) -> None:
        return None

    def seconds(self, start: float, end: float) -> float:
        # A clock that is not monotonic must not produce negative time.
        return max(0.0, end - start)


class _CudaSource:
    """Marks are recorded CUDA events; an interval is read once both complete."""

    __slots__ = ("factory",)
    name = "cuda_events"

    def __init__(self, factory: Callable[[], CudaEvent]) -> None:
        self.factory = factory

    def mark(self) -> CudaEvent:
        event = self.factory()
        event.record()
        return event

    def ready(self, start: CudaEvent, end: CudaEvent) -> bool:
        # query() never blocks: the hot path only reads what already finished.
        return bool(end.query()) and bool(start.query())

    def wait(self, start: CudaEvent, end: CudaEvent) -> None:
        end.synchronize()
        start.synchronize()

    def seconds(self, start: CudaEvent, end: CudaEvent) -> float:
        # elapsed_time is in milliseconds.
        return max(0.0, float(start.elapsed_time(end)) / 1000.0)


_Source = _WallSource | _CudaSource


# --- Bookkeeping -------------------------------------------------------------
_TOTAL = ""  # the frame name of the whole-request interval

# Open intervals of the current thread or asyncio task, innermost last, for
# all timers. One module-level variable rather than one per timer: a context
# keeps every variable ever set in it, so per-timer variables would leak one
# entry per request on a long-lived engine thread. Back to () when all close.
_OPEN: ContextVar[tuple[_Frame, ...]] = ContextVar("modtrace_gpu_timer_open", default=())


@dataclass(slots=True)
class _Frame:
    """One open interval: its timer, name (``_TOTAL`` or a component), start mark."""

    owner: GpuTimer
    name: str
    start: Any
    parent: str | None  # the enclosing component, whose time this one excludes
    measured: bool  # False for a whole-request interval nested in another


@dataclass(slots=True)
class _Closed:
    """One closed interval whose seconds are not read yet."""

    name: str
    parent: str | None
    start: Any
    end: Any


def _resolve_source(
    source: str, clock: Callable[[], float], event_factory: Callable[[], CudaEvent] | None
) -> _Source:
    """Pick the interval source of a timer (see ``GpuTimer``)."""
    if source not in _SOURCES:
        msg = f"source: expected one of {', '.join(_SOURCES)}, got {source!r}"
        raise ValueError(msg)
    if source == "wall_clock":
        if event_factory is not None:
            msg = "event_factory needs source='auto' or 'cuda_events', not 'wall_clock'"
            raise ValueError(msg)
        return _WallSource(clock)
    factory = event_factory if event_factory is not None else cuda_event_factory()
    if factory is not None:
        return _CudaSource(factory)
    if source == "cuda_events":
        msg = "source='cuda_events' needs torch with a CUDA device (torch.cuda.is_available())"
        raise RuntimeError(msg)
    return _WallSource(clock)


class GpuTimer(SyncAndAsync):
    """GPU seconds of one request, as a context manager, with component timers.

    >>> timer = GpuTimer(gpu_count=2)
    >>> with timer:
    ...     with timer.component("prefill"):
    ...         pass  # run prefill
    >>> timer.timers().source
    'wall_clock'

    ``with timer:`` (or ``async with timer:``) measures the whole request;
    entering it again adds another interval (a request resumed after
    preemption), while a ``with timer:`` nested in an open one is not
    counted twice. ``with timer.component(name):`` measures a component;
    see the module docstring for nesting. An exception raised inside either
    block is recorded like a normal exit and propagates unchanged.

    Args:
        gpu_count: GPUs the request runs on; every interval counts this
            many times.
        source: ``"wall_clock"`` (default), ``"cuda_events"`` (raises
            ``RuntimeError`` without CUDA) or ``"auto"`` (CUDA events when
            available, else the wall clock).
        clock: The wall clock, in seconds (``time.perf_counter``).
        event_factory: Makes one timing CUDA event; defaults to
            ``torch.cuda.Event(enable_timing=True)``. For engines with
            their own event pool, and for tests.
        strict: Raise ``RuntimeError`` when scopes close out of order;
            default :envvar:`MODTRACE_STRICT`. Otherwise they are unwound
            and counted in :attr:`out_of_order`.
    """

    __slots__ = (
        "_closed",
        "_gpu_count",
        "_lock",
        "_out_of_order",
        "_seconds",
        "_source",
        "_strict",
    )

    def __init__(
        self,
        gpu_count: int = 1,
        *,
        source: TimerSource = "wall_clock",
        clock: Callable[[], float] = time.perf_counter,
        event_factory: Callable[[], CudaEvent] | None = None,
        strict: bool | None = None,
    ) -> None:
        if isinstance(gpu_count, bool) or not isinstance(gpu_count, int) or gpu_count < 1:
            msg = f"gpu_count: must be an integer of at least 1, got {gpu_count!r}"
            raise ValueError(msg)
        self._gpu_count = gpu_count
        self._source: _Source = _resolve_source(source, clock, event_factory)
        self._lock = threading.Lock()
        # Closed CUDA intervals not read yet, oldest first.
        self._closed: deque[_Closed] = deque()
        # Seconds per name (``_TOTAL`` and components); absent = never measured.
        self._seconds: dict[str, float] = {}
        self._strict = strict
        self._out_of_order = 0

    @property
    def source(self) -> str:
        """``wall_clock`` or ``cuda_events``: the source actually in use."""
        return self._source.name

    @property
    def gpu_count(self) -> int:
        """GPUs the request runs on."""
        return self._gpu_count

    @property
    def out_of_order(self) -> int:
        """Scope exits that did not close this timer's innermost open scope.

        Each one means the timers may be off: scopes opened inside the one
        that closed were closed with it, or an exit found its scope already
        gone. 0 for a timer used with properly nested ``with`` blocks.
        """
        return self._out_of_order

    @property
    def strict(self) -> bool:
        """Whether out-of-order scopes raise (``strict``, else :envvar:`MODTRACE_STRICT`)."""
        if self._strict is not None:
            return self._strict
        return os.environ.get(MODTRACE_STRICT, "").strip().lower() in ("1", "true", "yes", "on")

    # -- Whole request ---------------------------------------------------------
    def __enter__(self) -> GpuTimer:
        stack = _OPEN.get()
        nested = any(f.owner is self and f.name == _TOTAL for f in stack)
        start = None if nested else self._source.mark()
        _OPEN.set((*stack, _Frame(self, _TOTAL, start, None, not nested)))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._close(_TOTAL, exc is not None)

    # -- Components ------------------------------------------------------------
    def component(self, name: str) -> _ComponentScope:
        """Return a context manager (sync and async) timing component ``name``.

        Args:
            name: One of ``modtrace.timers.COMPONENTS``.

        Returns:
            A single-use scope: ``with timer.component("decode"): ...``.
        """
        if name not in COMPONENTS:
            msg = f"unknown component {name!r}; expected one of: {', '.join(COMPONENTS)}"
            raise ValueError(msg)
        return _ComponentScope(self, name)

    def _open(self, name: str) -> None:
        stack = _OPEN.get()
        parent = next(
            (f.name for f in reversed(stack) if f.owner is self and f.name != _TOTAL), None
        )
        # Mark last, so the bookkeeping above is not timed.
        _OPEN.set((*stack, _Frame(self, name, self._source.mark(), parent, True)))

    def _close(self, name: str, raising: bool = False) -> None:
        """Close this timer's innermost open scope ``name``.

        Out of order (scopes of this timer opened after it still open), they
        are closed first, at the same moment; a scope no longer open is
        ignored. Either way the event is counted, and raised in strict mode
        unless an exception is already propagating (``raising``).
        """
        stack = _OPEN.get()
        mine = [i for i in range(len(stack) - 1, -1, -1) if stack[i].owner is self]
        index = next((i for i in mine if stack[i].name == name), None)
        in_order = index is not None and index == mine[0]
        if index is not None:
            # This scope and every scope of this timer opened inside it, innermost first.
            closing = [i for i in mine if i >= index]
            end = self._source.mark() if any(stack[i].measured for i in closing) else None
            _OPEN.set(tuple(f for i, f in enumerate(stack) if i not in closing))
            finished = [
                _Closed(stack[i].name, stack[i].parent, stack[i].start, end)
                for i in closing
                if stack[i].measured
            ]
            if finished:
                with self._lock:
                    self._closed.extend(finished)
                    self._drain(block=False)
        if in_order:
            return
        with self._lock:
            self._out_of_order += 1
        if self.strict and not raising:
            msg = f"timer scope {name or 'request'!r} closed out of order"
            raise RuntimeError(msg)

    def _drain(self, *, block: bool) -> None:
        """Move closed intervals into the totals (caller holds the lock).

        Non-blocking drains stop at the first interval whose events have
        not completed, so memory stays bounded without waiting on the GPU.
        """
        source = self._source
        while self._closed:
            closed = self._closed[0]
            if not source.ready(closed.start, closed.end):
                if not block:
                    return
                source.wait(closed.start, closed.end)
            self._closed.popleft()
            seconds = source.seconds(closed.start, closed.end)
            self._seconds[closed.name] = self._seconds.get(closed.name, 0.0) + seconds
            if closed.parent is not None:
                # Exclusive time: the outer component does not also own these seconds.
                self._seconds[closed.parent] = self._seconds.get(closed.parent, 0.0) - seconds

    # -- Reading ---------------------------------------------------------------
    def timers(self) -> GpuTimers:
        """Return the GPU seconds measured so far, as ``GpuTimers``.

        Synchronizes on pending CUDA events (the only place it blocks).
        Intervals still open are not included. ``total`` is ``None`` when
        ``with timer:`` never closed; a component that never ran is ``None``.

        Returns:
            ``GpuTimers`` in GPU seconds (interval seconds x ``gpu_count``),
            with ``source`` ``wall_clock`` or ``cuda_events``.
        """
        with self._lock:
            self._drain(block=True)
            seconds = dict(self._seconds)
        # max(): exclusive time subtracts floats, which may leave -1e-17 on an
        # outer component whose inner one covered it entirely.
        scaled = {name: max(0.0, value) * self._gpu_count for name, value in seconds.items()}
        return GpuTimers(
            total=scaled.get(_TOTAL),
            gpu_count=self._gpu_count,
            source=self._source.name,
            **{name: scaled[name] for name in COMPONENTS if name in scaled},
        )


class _ComponentScope(SyncAndAsync):
    """``with`` / ``async with`` scope of one component interval."""

    __slots__ = ("_active", "_name", "_timer")

    def __init__(self, timer: GpuTimer, name: str) -> None:
        self._timer = timer
        self._name = name
        self._active = False

    def __enter__(self) -> _ComponentScope:
        if self._active:
            msg = f"component scope {self._name!r} is already open; call component() again"
            raise RuntimeError(msg)
        self._active = True
        self._timer._open(self._name)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._active = False
        self._timer._close(self._name, exc is not None)
