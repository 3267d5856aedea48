"""ForwardTimer: forward hooks on torch modules record ledger steps."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from modtrace.engine.torch_hooks import ForwardTimer  # noqa: E402
from modtrace.timing import StepLedger  # noqa: E402


class Ticks:
    """A nanosecond clock that advances 1000 ns per reading."""

    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        self.now += 1000
        return self.now


class Tower(torch.nn.Module):
    """An encoder with a hooked inner layer, to check nesting."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x)


class FakeEvent:
    """A timing CUDA event stand-in: records a tick, elapsed in milliseconds."""

    clock = 0

    def __init__(self) -> None:
        self.at = 0
        self.synced = False

    def record(self) -> None:
        FakeEvent.clock += 2
        self.at = FakeEvent.clock

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        self.synced = True

    def elapsed_time(self, end: FakeEvent) -> float:
        return float(end.at - self.at)


@pytest.fixture
def parts():
    """A ledger, a tower and a head, timed by a ticking clock."""
    ledger = StepLedger()
    timer = ForwardTimer(ledger, clock=Ticks())
    tower, head = Tower(), torch.nn.Linear(4, 2)
    timer.attach(tower, "vision_encoder")
    timer.attach(tower.inner, "audio_encoder")  # nested: must not count
    timer.attach(head)
    return ledger, timer, tower, head


def test_passes_become_steps_of_their_component(parts) -> None:
    """Each component timed in a step is one ledger step, shared by the step's tokens."""
    ledger, timer, tower, head = parts
    x = torch.ones(1, 4)
    with timer.step({"a": 3, "b": 1}, component="decode"):
        head(tower(x))
    assert timer.steps == 2
    a, b = ledger.finish_ns("a"), ledger.finish_ns("b")
    # The tower pass is 1000 ns (its nested layer is not timed again), the head 1000 ns.
    assert a == {"vision_encoder": 750, "decode": 750}
    assert b == {"vision_encoder": 250, "decode": 250}


def test_passes_outside_a_step_are_not_recorded(parts) -> None:
    """Warm-up passes outside step() leave the ledger empty."""
    ledger, timer, tower, _ = parts
    tower(torch.ones(1, 4))
    assert ledger.totals().steps == 0
    assert timer.steps == 0


def test_failed_pass_is_dropped_and_earlier_ones_kept(parts) -> None:
    """An exception inside a step: completed passes recorded, the broken one not."""
    ledger, timer, tower, head = parts

    def run() -> None:
        with timer.step({"a": 1}, component="prefill"):
            head(torch.ones(1, 4))
            tower(torch.ones(1, 5))  # wrong width: raises inside the pass

    with pytest.raises(RuntimeError):
        run()
    assert ledger.finish_ns("a") == {"prefill": 1000}
    with timer.step({"c": 1}):  # the timer is usable again
        head(torch.ones(1, 4))
    assert ledger.finish_ns("c") == {"prefill": 1000}


def test_steps_do_not_nest_and_components_are_checked(parts) -> None:
    """A step inside a step, or an unknown component, is refused."""
    _, timer, tower, _ = parts
    with timer.step({"a": 1}), pytest.raises(RuntimeError, match="nest"), timer.step({"b": 1}):
        pass
    with pytest.raises(ValueError, match="unknown component"), timer.step({}, "encoder"):
        pass
    with pytest.raises(ValueError, match="unknown component"):
        timer.attach(tower, "vision")
    with pytest.raises(ValueError, match="source"):
        ForwardTimer(StepLedger(), source="gpu")  # type: ignore[arg-type]


def test_cuda_events_are_read_when_the_step_ends() -> None:
    """With events, each pass records two, synchronized and read in milliseconds."""
    ledger = StepLedger()
    made: list[FakeEvent] = []

    def factory() -> FakeEvent:
        made.append(FakeEvent())
        return made[-1]

    timer = ForwardTimer(ledger, source="cuda_events", event_factory=factory)
    head = torch.nn.Linear(4, 2)
    timer.attach(head, "prefill")
    with timer.step({"a": 1}):
        head(torch.ones(1, 4))
    assert len(made) == 2
    assert made[1].synced
    assert ledger.finish_ns("a") == {"prefill": 2_000_000}  # 2 ms


def test_detach_removes_the_hooks(parts) -> None:
    """After detach, passes are not timed even inside a step."""
    ledger, timer, tower, head = parts
    timer.detach()
    with timer.step({"a": 1}):
        head(tower(torch.ones(1, 4)))
    assert "a" not in ledger
