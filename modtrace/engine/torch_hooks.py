"""Time a torch model's passes with forward hooks, one ledger step per pass.

An engine does not need to wrap its own code in timers: it names the
submodules that do the work once, and every forward pass of them that runs
inside :meth:`ForwardTimer.step` is timed and recorded in a
:class:`modtrace.timing.StepLedger` as a step of the named component::

    timer = ForwardTimer(ledger, source="cuda_events")  # "wall_clock" on a CPU
    timer.attach(model.visual, "vision_encoder")
    timer.attach(model.audio_tower, "audio_encoder")
    timer.attach(model.language_model)                 # the step's component
    timer.attach(model.lm_head)

    with timer.step({"req-1": 1176, "req-2": 64}, component="vision_encoder"):
        model.visual(pixel_values, grid_thw=grid)      # one batched encoder pass

    with timer.step({"req-1": 300}, component="prefill"):
        logits = model.lm_head(model.language_model(...).last_hidden_state)

A hooked module called inside another hooked module is not timed again:
only the outermost pass counts, so nothing is counted twice.

Sources:

* ``wall_clock``: ``time.perf_counter_ns`` around each pass. On a CPU, as in
  the reference engine, these are CPU seconds standing in for GPU seconds;
  on a GPU they would include host time the GPU hides, so use events there.
* ``cuda_events``: a ``torch.cuda.Event(enable_timing=True)`` recorded on
  the current stream before and after each pass. Nothing synchronizes on
  the hot path; the events are read when the step ends, which an engine
  does anyway when it reads the sampled tokens back. This is how the same
  hooks run on a GPU.

Not thread-safe: one engine thread drives one timer, as one scheduler loop
drives a vLLM worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Literal

from ..timers import COMPONENTS
from ..timing import StepLedger
from ..timing.gpu_timer import CudaEvent, cuda_event_factory

__all__ = ["ForwardTimer", "ForwardTimerSource"]

ForwardTimerSource = Literal["wall_clock", "cuda_events"]
_STEP = ""  # attach(module) without a component: the step's component


class ForwardTimer:
    """Forward hooks that feed a step ledger (see the module docstring).

    Args:
        ledger: Where each timed pass is recorded as a step.
        source: ``wall_clock`` or ``cuda_events`` (raises ``RuntimeError``
            without CUDA).
        event_factory: Makes one timing CUDA event; defaults to
            ``torch.cuda.Event(enable_timing=True)``. For engines with their
            own event pool, and for tests.
        clock: The wall clock in integer nanoseconds.
    """

    def __init__(
        self,
        ledger: StepLedger,
        *,
        source: ForwardTimerSource = "wall_clock",
        event_factory: Callable[[], CudaEvent] | None = None,
        clock: Callable[[], int] = time.perf_counter_ns,
    ) -> None:
        if source not in ("wall_clock", "cuda_events"):
            msg = f"source: expected wall_clock or cuda_events, got {source!r}"
            raise ValueError(msg)
        if source == "cuda_events":
            event_factory = event_factory or cuda_event_factory()
            if event_factory is None:
                msg = "source='cuda_events' needs torch with a CUDA device"
                raise RuntimeError(msg)
        self.ledger = ledger
        self.source = source
        self._events = event_factory if source == "cuda_events" else None
        self._clock = clock
        self._handles: list[Any] = []
        self._depth = 0
        self._open: tuple[str, Any] | None = None  # (component, start mark)
        self._intervals: list[tuple[str, Any, Any]] | None = None  # None: no step open
        self._step_component = "prefill"
        #: Steps recorded so far (one per component with time in a ``step``).
        self.steps = 0

    # -- Hooks --------------------------------------------------------------------------
    def attach(self, module: Any, component: str | None = None) -> None:
        """Time every forward pass of ``module`` (a ``torch.nn.Module``).

        Args:
            module: The submodule doing one kind of work.
            component: A ``modtrace.timers.COMPONENTS`` name for modules that
                always do the same work (an encoder); ``None`` for modules
                whose work depends on the step (the language model: prefill
                or decode).
        """
        if component is not None and component not in COMPONENTS:
            msg = f"unknown component {component!r}; expected one of: {', '.join(COMPONENTS)}"
            raise ValueError(msg)
        name = component or _STEP
        self._handles.append(module.register_forward_pre_hook(lambda _m, _a: self._enter(name)))
        self._handles.append(module.register_forward_hook(lambda _m, _a, _o: self._exit()))

    def detach(self) -> None:
        """Remove every hook this timer added."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _mark(self) -> Any:
        if self._events is None:
            return self._clock()
        event = self._events()
        event.record()
        return event

    def _enter(self, component: str) -> None:
        self._depth += 1
        if self._depth == 1 and self._intervals is not None:
            self._open = (component or self._step_component, self._mark())

    def _exit(self) -> None:
        self._depth = max(self._depth - 1, 0)
        if self._depth == 0 and self._open is not None and self._intervals is not None:
            component, start = self._open
            self._open = None
            self._intervals.append((component, start, self._mark()))

    # -- Steps --------------------------------------------------------------------------
    @contextmanager
    def step(self, tokens: Mapping[Hashable, int], component: str = "prefill") -> Iterator[None]:
        """Record the hooked passes run inside as one ledger step per component.

        Args:
            tokens: Request id -> tokens this step did for it (encoder output
                tokens, prompt tokens, or 1 per decoded token).
            component: The component of hooked modules attached without one.

        A pass interrupted by an exception is not recorded; the passes that
        completed before it are.
        """
        if self._intervals is not None:
            msg = "ForwardTimer.step is already open: steps do not nest"
            raise RuntimeError(msg)
        if component not in COMPONENTS:
            msg = f"unknown component {component!r}; expected one of: {', '.join(COMPONENTS)}"
            raise ValueError(msg)
        self._step_component = component
        self._intervals = []
        try:
            yield
        finally:
            intervals, self._intervals = self._intervals, None
            self._open, self._depth = None, 0
            self._record(intervals, tokens)

    def _record(
        self, intervals: list[tuple[str, Any, Any]], tokens: Mapping[Hashable, int]
    ) -> None:
        totals: dict[str, int] = {}
        for component, start, end in intervals:
            totals[component] = totals.get(component, 0) + self._ns(start, end)
        for component, ns in totals.items():
            self.ledger.record_step_ns(ns, tokens, component)
            self.steps += 1

    def _ns(self, start: Any, end: Any) -> int:
        if self._events is None:
            return max(0, int(end) - int(start))
        end.synchronize()
        # elapsed_time is in milliseconds.
        return max(0, round(float(start.elapsed_time(end)) * 1_000_000))
