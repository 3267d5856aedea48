"""GpuTimer: whole-request and component timers, wall clock and CUDA events."""

from __future__ import annotations

import asyncio
import contextvars
import sys
import threading
import time
import types

import pytest

from modtrace.timers import COMPONENTS, GpuTimers
from modtrace.timing import GpuTimer, cuda_event_factory


class ManualClock:
    """A wall clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeGpu:
    """Test double of a CUDA device timeline for ``torch.cuda.Event``'s API.

    Work is queued by ``launch``; an event recorded on the stream completes
    when the GPU has executed everything queued before it (``run``), as CUDA
    events do. ``synchronize`` drives the GPU to the event. ``elapsed_time``
    returns milliseconds and, like torch, fails if either event is incomplete.
    """

    def __init__(self) -> None:
        self.queued_ms = 0.0  # GPU time of all work launched so far
        self.done_ms = 0.0  # GPU time executed so far
        self.synchronize_calls = 0
        self.events: list[FakeEvent] = []

    def launch(self, ms: float) -> None:
        """Queue ``ms`` of kernel time on the current stream."""
        self.queued_ms += ms

    def run(self) -> None:
        """Let the GPU execute everything queued."""
        self.done_ms = self.queued_ms

    def event(self, *, enable_timing: bool = False) -> FakeEvent:
        """``torch.cuda.Event(enable_timing=...)``."""
        event = FakeEvent(self, enable_timing)
        self.events.append(event)
        return event

    def timing_event(self) -> FakeEvent:
        """What an ``event_factory`` returns: a timing event."""
        return self.event(enable_timing=True)


class FakeEvent:
    """One ``torch.cuda.Event`` on a ``FakeGpu``."""

    def __init__(self, gpu: FakeGpu, enable_timing: bool) -> None:
        self.gpu = gpu
        self.enable_timing = enable_timing
        self.at_ms: float | None = None

    def record(self) -> None:
        self.at_ms = self.gpu.queued_ms

    def query(self) -> bool:
        return self.at_ms is not None and self.gpu.done_ms >= self.at_ms

    def synchronize(self) -> None:
        self.gpu.synchronize_calls += 1
        if self.at_ms is not None:
            self.gpu.done_ms = max(self.gpu.done_ms, self.at_ms)

    def elapsed_time(self, end_event: FakeEvent) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            msg = "Both events must be created with argument 'enable_timing=True'"
            raise RuntimeError(msg)
        if not (self.query() and end_event.query()):
            msg = "Both events must be completed before calculating elapsed time"
            raise RuntimeError(msg)
        assert self.at_ms is not None
        assert end_event.at_ms is not None
        return end_event.at_ms - self.at_ms


@pytest.fixture
def clock() -> ManualClock:
    """A manual wall clock."""
    return ManualClock()


class TestWallClock:
    """The default source: wall seconds x gpu_count."""

    def test_whole_request_and_component(self, clock: ManualClock) -> None:
        """Total and a component are the clock differences, times gpu_count."""
        timer = GpuTimer(gpu_count=4, clock=clock)
        with timer:
            clock.now += 0.5
            with timer.component("prefill"):
                clock.now += 2.0
            clock.now += 0.25
        result = timer.timers()
        assert result == GpuTimers(total=11.0, prefill=8.0, gpu_count=4, source="wall_clock")

    def test_real_perf_counter(self) -> None:
        """With the real clock, a sleep is measured at least as long as it slept."""
        timer = GpuTimer(gpu_count=2)
        start = time.perf_counter()
        with timer, timer.component("decode"):
            time.sleep(0.02)
        elapsed = time.perf_counter() - start
        result = timer.timers()
        assert result.source == "wall_clock"
        assert result.decode is not None
        assert result.total is not None
        assert 2 * 0.02 <= result.decode <= result.total <= 2 * elapsed

    def test_repeated_components_accumulate(self, clock: ManualClock) -> None:
        """Each interval of a component adds to it."""
        timer = GpuTimer(clock=clock)
        for seconds in (0.25, 0.5, 1.0):
            with timer.component("decode"):
                clock.now += seconds
        assert timer.timers().decode == 1.75

    def test_nested_components_are_exclusive(self, clock: ManualClock) -> None:
        """An inner component's time is taken out of the outer one."""
        timer = GpuTimer(clock=clock)
        with timer:
            with timer.component("prefill"):
                clock.now += 1.0
                with timer.component("vision_encoder"):
                    clock.now += 3.0
                clock.now += 2.0
            clock.now += 4.0
        result = timer.timers()
        assert (result.prefill, result.vision_encoder, result.total) == (3.0, 3.0, 10.0)

    def test_nested_same_component_counts_once(self, clock: ManualClock) -> None:
        """A component nested in itself sums to the outer interval, not more."""
        timer = GpuTimer(clock=clock)
        with timer.component("decode"):
            clock.now += 1.0
            with timer.component("decode"):
                clock.now += 5.0
            clock.now += 1.0
        assert timer.timers().decode == 7.0

    def test_nested_request_scope_counts_once(self, clock: ManualClock) -> None:
        """A ``with timer`` inside an open one does not add its interval again."""
        timer = GpuTimer(clock=clock)
        with timer:
            clock.now += 1.0
            with timer:
                clock.now += 2.0
        assert timer.timers().total == 3.0

    def test_repeated_request_scopes_accumulate(self, clock: ManualClock) -> None:
        """A request timed in two separate intervals (preempted, resumed) sums both."""
        timer = GpuTimer(clock=clock)
        with timer:
            clock.now += 1.0
        clock.now += 100.0  # preempted: not on the GPU
        with timer:
            clock.now += 2.0
        assert timer.timers().total == 3.0

    def test_unmeasured_is_none(self, clock: ManualClock) -> None:
        """No closed request scope gives total None; components never run are None."""
        timer = GpuTimer(clock=clock)
        with timer.component("audio_encoder"):
            clock.now += 1.0
        with timer:
            clock.now += 1.0
            open_result = timer.timers()
        assert open_result.total is None
        assert open_result.components() == {"audio_encoder": 1.0}
        assert timer.timers().total == 1.0

    def test_backwards_clock_is_not_negative(self, clock: ManualClock) -> None:
        """A clock that steps back yields 0 seconds, never negative ones."""
        timer = GpuTimer(clock=clock)
        with timer.component("prefill"):
            clock.now -= 5.0
        assert timer.timers().prefill == 0.0

    def test_all_components_accepted(self, clock: ManualClock) -> None:
        """Every name in modtrace.timers.COMPONENTS is a valid component."""
        timer = GpuTimer(clock=clock)
        for name in COMPONENTS:
            with timer.component(name):
                clock.now += 1.0
        assert timer.timers().components() == dict.fromkeys(COMPONENTS, 1.0)


class TestErrors:
    """Exceptions inside a timed block, and misuse."""

    def test_component_exception_records_and_reraises(self, clock: ManualClock) -> None:
        """A raising component still records its time; the same exception propagates."""
        timer = GpuTimer(clock=clock)
        error = KeyError("boom")

        def encode() -> None:
            with timer, timer.component("vision_encoder"):
                clock.now += 2.0
                raise error

        with pytest.raises(KeyError) as raised:
            encode()
        assert raised.value is error
        result = timer.timers()
        assert (result.vision_encoder, result.total) == (2.0, 2.0)

    def test_base_exception_propagates(self, clock: ManualClock) -> None:
        """Even KeyboardInterrupt is recorded and re-raised unchanged."""
        timer = GpuTimer(clock=clock)

        def decode() -> None:
            with timer.component("decode"):
                clock.now += 1.0
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            decode()
        assert timer.timers().decode == 1.0

    def test_unknown_component(self) -> None:
        """A component name outside COMPONENTS is rejected."""
        with pytest.raises(ValueError, match="unknown component 'encoder'"):
            GpuTimer().component("encoder")

    @pytest.mark.parametrize("gpu_count", [0, -1, True, 1.5])
    def test_bad_gpu_count(self, gpu_count: object) -> None:
        """gpu_count must be an integer of at least 1."""
        with pytest.raises(ValueError, match="gpu_count"):
            GpuTimer(gpu_count=gpu_count)  # type: ignore[arg-type]

    def test_bad_source(self) -> None:
        """An unknown source is rejected."""
        with pytest.raises(ValueError, match="source"):
            GpuTimer(source="nvml")  # type: ignore[arg-type]

    def test_event_factory_needs_cuda_source(self) -> None:
        """An event factory with the wall-clock source is a contradiction."""
        with pytest.raises(ValueError, match="event_factory"):
            GpuTimer(event_factory=FakeGpu().timing_event)

    def test_out_of_order_close(self, clock: ManualClock) -> None:
        """Closing an outer scope before its inner one is an error (strict mode)."""
        timer = GpuTimer(clock=clock, strict=True)
        outer = timer.component("prefill")
        inner = timer.component("vision_encoder")
        outer.__enter__()
        inner.__enter__()
        with pytest.raises(RuntimeError, match="out of order"):
            outer.__exit__(None, None, None)

    def test_scope_is_single_use_at_a_time(self, clock: ManualClock) -> None:
        """Entering one component scope object twice at once is an error."""
        scope = GpuTimer(clock=clock).component("decode")
        with scope, pytest.raises(RuntimeError, match="already open"), scope:
            pass


class TestOutOfOrder:
    """A scope closed before the ones opened inside it: unwound, noted, never raised."""

    @staticmethod
    def stream(timer: GpuTimer):
        """A generator that holds a component open between its items (a streamed decode)."""

        def gen():
            with timer.component("decode"):
                yield 1
                yield 2

        return gen()

    def leave_open(self, timer: GpuTimer, error: BaseException | None = None):
        """``with timer:`` around a started stream (raising ``error`` inside); the stream."""
        with timer:
            stream = self.stream(timer)
            next(stream)
            if error is not None:
                raise error
        return stream

    def test_a_generator_left_open_is_unwound(self, clock: ManualClock) -> None:
        """The reviewer's case: no error into engine code, later blocks still measure."""
        timer = GpuTimer(clock=clock)
        with timer:
            stream = self.stream(timer)
            next(stream)
            clock.now += 2.0
        assert timer.out_of_order == 1
        first = timer.timers()
        assert first.total == 2.0
        assert first.decode == 2.0  # the unwound component closed with the request
        with timer:
            clock.now += 1.0
        assert timer.timers().total == 3.0  # not taken for a nested scope
        stream.close()  # its exit finds nothing open: noted, not raised
        assert timer.out_of_order == 2
        assert timer.timers().total == 3.0
        with timer, timer.component("prefill"):
            clock.now += 0.5
        assert timer.timers().prefill == 0.5

    def test_an_exception_in_flight_is_not_masked(self, clock: ManualClock) -> None:
        """The engine's own exception propagates, whatever is left open."""
        timer = GpuTimer(clock=clock, strict=True)
        with pytest.raises(KeyError, match="engine"):
            self.leave_open(timer, KeyError("engine"))
        assert timer.out_of_order >= 1  # the dropped generator's own exit may add one

    def test_strict_raises_after_unwinding(self, clock: ManualClock) -> None:
        """Strict mode raises, yet leaves no stale scope behind."""
        timer = GpuTimer(clock=clock, strict=True)
        stream = self.stream(timer)
        with pytest.raises(RuntimeError, match="out of order"), timer:
            next(stream)
        with timer:
            clock.now += 1.0
        assert timer.timers().total == 1.0
        assert next(stream) == 2
        with pytest.raises(RuntimeError, match="out of order"):
            next(stream)  # the generator's own exit finds its scope gone

    def test_strict_from_the_environment(
        self, clock: ManualClock, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """MODTRACE_STRICT=true raises as strict=True does."""
        monkeypatch.setenv("MODTRACE_STRICT", "true")
        timer = GpuTimer(clock=clock)
        with pytest.raises(RuntimeError, match="out of order"):
            self.leave_open(timer)
        assert timer.out_of_order >= 1  # the dropped generator's own exit may add one


class TestConcurrency:
    """Nesting is tracked per thread and per asyncio task."""

    def test_async_context_managers(self, clock: ManualClock) -> None:
        """``async with`` works for the request and its components."""
        timer = GpuTimer(clock=clock)

        async def request() -> None:
            async with timer:
                async with timer.component("prefill"):
                    clock.now += 1.0
                    await asyncio.sleep(0)
                async with timer.component("decode"):
                    clock.now += 2.0

        asyncio.run(request())
        result = timer.timers()
        assert (result.total, result.prefill, result.decode) == (3.0, 1.0, 2.0)

    def test_concurrent_tasks_do_not_nest(self, clock: ManualClock) -> None:
        """Components open at once in two tasks are siblings, not parent and child."""
        timer = GpuTimer(clock=clock)
        order: list[str] = []

        async def encode(name: str, started: asyncio.Event, other: asyncio.Event) -> None:
            async with timer.component(name):
                order.append(name)
                started.set()
                await other.wait()
                clock.now += 1.0

        async def main() -> None:
            a, b = asyncio.Event(), asyncio.Event()
            await asyncio.gather(encode("vision_encoder", a, b), encode("audio_encoder", b, a))

        asyncio.run(main())
        result = timer.timers()
        # With one shared stack the task that closed first would be "out of
        # order", or the inner one would be subtracted from the outer one.
        assert order == ["vision_encoder", "audio_encoder"]
        assert result.vision_encoder is not None
        assert result.audio_encoder is not None
        assert result.vision_encoder + result.audio_encoder == 3.0

    def test_threads_share_one_timer(self) -> None:
        """Components timed from several threads at once all land, none nested."""
        timer = GpuTimer()
        barrier = threading.Barrier(4)
        errors: list[BaseException] = []

        def work() -> None:
            try:
                for _ in range(50):
                    with timer.component("decode"):
                        barrier.wait(timeout=5)
            except BaseException as error:  # surfaced by the assert below
                errors.append(error)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert (timer.timers().decode or 0.0) > 0.0

    def test_no_context_growth_per_timer(self) -> None:
        """Many timers leave no per-timer entries in a long-lived context."""

        def many_requests() -> int:
            for _ in range(200):
                timer = GpuTimer()
                with timer, timer.component("prefill"):
                    pass
            return len(contextvars.copy_context())

        context = contextvars.Context()
        assert context.run(many_requests) <= 1


class TestCudaEvents:
    """The CUDA-event source, through a test double of torch's Event API."""

    def test_events_measure_gpu_time(self) -> None:
        """Seconds are the elapsed ms between events / 1000, times gpu_count."""
        gpu = FakeGpu()
        timer = GpuTimer(gpu_count=2, source="cuda_events", event_factory=gpu.timing_event)
        with timer:
            with timer.component("vision_encoder"):
                gpu.launch(30.0)
            with timer.component("prefill"):
                gpu.launch(120.0)
            gpu.launch(50.0)
        result = timer.timers()
        assert result == GpuTimers(
            total=0.4,
            vision_encoder=0.06,
            prefill=0.24,
            gpu_count=2,
            source="cuda_events",
        )
        assert all(event.enable_timing for event in gpu.events)

    def test_no_synchronize_until_read(self) -> None:
        """Recording never blocks: synchronize happens only in timers()."""
        gpu = FakeGpu()
        timer = GpuTimer(source="cuda_events", event_factory=gpu.timing_event)
        with timer:
            for _ in range(10):
                with timer.component("decode"):
                    gpu.launch(2.0)
        assert gpu.synchronize_calls == 0
        assert timer.timers().decode == pytest.approx(0.02)
        assert gpu.synchronize_calls > 0

    def test_completed_events_are_read_without_blocking(self) -> None:
        """Intervals whose events completed are drained on close, never synchronized."""
        gpu = FakeGpu()
        timer = GpuTimer(source="cuda_events", event_factory=gpu.timing_event)
        for _ in range(5):
            with timer.component("decode"):
                gpu.launch(1.0)
            gpu.run()  # the GPU caught up before the next interval closed
        with timer.component("decode"):
            pass
        gpu.run()
        with timer.component("decode"):
            pass
        assert gpu.synchronize_calls == 0
        assert timer.timers().decode == pytest.approx(0.005)
        assert gpu.synchronize_calls == 0

    def test_exception_with_events(self) -> None:
        """A raising component records its end event and re-raises unchanged."""
        gpu = FakeGpu()
        timer = GpuTimer(source="auto", event_factory=gpu.timing_event)
        error = RuntimeError("CUDA out of memory")

        def encode() -> None:
            with timer.component("audio_encoder"):
                gpu.launch(7.0)
                raise error

        with pytest.raises(RuntimeError) as raised:
            encode()
        assert raised.value is error
        assert timer.timers().audio_encoder == pytest.approx(0.007)


def _fake_torch(available: bool, gpu: FakeGpu) -> types.ModuleType:
    """A stand-in ``torch`` module exposing only ``torch.cuda``'s used API."""
    torch = types.ModuleType("torch")
    torch.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        is_available=lambda: available, Event=gpu.event
    )
    return torch


class TestSourceSelection:
    """``source="auto"`` picks CUDA events only when torch sees a CUDA device."""

    def test_auto_without_torch_falls_back(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """No importable torch: auto uses the wall clock."""
        monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` fail
        assert cuda_event_factory() is None
        assert GpuTimer(source="auto").source == "wall_clock"

    def test_auto_without_cuda_falls_back(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """torch without a CUDA device: auto uses the wall clock."""
        monkeypatch.setitem(sys.modules, "torch", _fake_torch(False, FakeGpu()))
        timer = GpuTimer(source="auto")
        with timer:
            pass
        assert timer.timers().source == "wall_clock"

    def test_auto_with_cuda_uses_events(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """torch with CUDA: auto records timing events from torch.cuda.Event."""
        gpu = FakeGpu()
        monkeypatch.setitem(sys.modules, "torch", _fake_torch(True, gpu))
        timer = GpuTimer(source="auto")
        with timer:
            gpu.launch(5.0)
        assert timer.timers().source == "cuda_events"
        assert timer.timers().total == pytest.approx(0.005)
        assert [e.enable_timing for e in gpu.events] == [True, True]

    def test_cuda_events_required(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Asking for cuda_events without CUDA is an error, not a silent fallback."""
        monkeypatch.setitem(sys.modules, "torch", None)
        with pytest.raises(RuntimeError, match="cuda_events"):
            GpuTimer(source="cuda_events")


@pytest.fixture
def cuda() -> types.ModuleType:
    """Real torch with a CUDA device, else skip."""
    if cuda_event_factory() is None:
        pytest.skip("needs torch with a CUDA device")
    import torch

    return torch


def test_real_cuda_events(cuda: types.ModuleType) -> None:
    """On a real GPU, event time of a matmul is positive and within the wall time."""
    torch = cuda
    a = torch.randn(4096, 4096, device="cuda")
    torch.cuda.synchronize()
    timer = GpuTimer(source="auto")
    start = time.perf_counter()
    with timer, timer.component("prefill"):
        for _ in range(10):
            a = a @ a / 4096
    result = timer.timers()  # synchronizes
    wall = time.perf_counter() - start
    assert result.source == "cuda_events"
    assert result.prefill is not None
    assert result.total is not None
    assert 0.0 < result.prefill <= result.total <= wall
