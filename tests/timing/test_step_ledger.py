"""StepLedger: batch steps shared across requests, exactly, in integer nanoseconds."""

from __future__ import annotations

import random
import sys
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modtrace.timers import COMPONENTS, GpuTimers
from modtrace.timing import LedgerTotals, StepLedger, split_largest_remainder

NS = 1_000_000_000


class ManualClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _balance(totals: LedgerTotals) -> int:
    """Recorded minus every place the nanoseconds can be: 0 when conserved."""
    return totals.recorded_ns - (
        totals.finished_ns + totals.open_ns + totals.evicted_ns + totals.unattributed_ns
    )


class TestSplitLargestRemainder:
    """The integer split, against exact rational shares."""

    @given(
        total=st.integers(min_value=0, max_value=10**15),
        weights=st.lists(st.integers(min_value=0, max_value=10**6), min_size=1, max_size=40),
    )
    @settings(max_examples=300, deadline=None)
    def test_is_the_largest_remainder_split(self, total: int, weights: list[int]) -> None:
        """Parts sum to total, each is floor or ceil of the exact share, top remainders win."""
        parts = split_largest_remainder(total, weights)
        weight_sum = sum(weights)
        if weight_sum == 0:
            weights, weight_sum = [1] * len(weights), len(weights)
        exact = [Fraction(total * w, weight_sum) for w in weights]
        assert sum(parts) == total
        assert all(p >= 0 for p in parts)
        floors = [e.numerator // e.denominator for e in exact]
        bumped = [p - f for p, f in zip(parts, floors, strict=True)]
        assert set(bumped) <= {0, 1}
        fractions = [e - f for e, f in zip(exact, floors, strict=True)]
        # Nobody left at the floor has a larger fraction than someone rounded up.
        if 1 in bumped and 0 in bumped:
            up = [f for f, b in zip(fractions, bumped, strict=True) if b]
            down = [f for f, b in zip(fractions, bumped, strict=True) if not b]
            assert min(up) >= max(down)

    def test_ties_go_to_the_first(self) -> None:
        """Equal remainders are broken by input order, deterministically."""
        assert split_largest_remainder(10, [1, 1, 1]) == [4, 3, 3]
        assert split_largest_remainder(11, [1, 1, 1]) == [4, 4, 3]

    def test_all_zero_weights_split_equally(self) -> None:
        """All-zero weights share equally."""
        assert split_largest_remainder(9, [0, 0, 0]) == [3, 3, 3]

    def test_proportional(self) -> None:
        """Weights 2:1 split 30 ms as 20:10."""
        assert split_largest_remainder(30_000_000, [100, 50]) == [20_000_000, 10_000_000]

    def test_needs_a_weight(self) -> None:
        """No weights is an error."""
        with pytest.raises(ValueError, match="at least one"):
            split_largest_remainder(5, [])


class TestStepLedger:
    """Recording, snapshot and finish."""

    def test_shares_by_tokens(self) -> None:
        """A prefill step is shared by prompt tokens; a decode step equally."""
        ledger = StepLedger()
        ledger.record_step(0.030, {"a": 100, "b": 50}, component="prefill")
        ledger.record_step(0.010, {"a": 1, "b": 1}, component="decode")
        assert ledger.finish("a") == GpuTimers(
            total=0.025, prefill=0.020, decode=0.005, source="step_ledger"
        )
        assert ledger.finish_ns("b") == {"prefill": 10_000_000, "decode": 5_000_000}

    def test_overlap_is_not_double_counted(self) -> None:
        """Two requests in the same steps get shares summing to the step time, not 2x."""
        ledger = StepLedger()
        steps = [0.012, 0.007, 0.009]
        for duration in steps:
            ledger.record_step(duration, {"a": 1, "b": 1}, component="decode")
        a, b = ledger.finish("a"), ledger.finish("b")
        assert a.total is not None
        assert b.total is not None
        assert a.total + b.total == pytest.approx(sum(steps), abs=1e-12)
        assert a.total == pytest.approx(sum(steps) / 2, abs=1e-9)

    def test_gpu_count_multiplies(self) -> None:
        """Each step counts gpu_count times; the timers carry gpu_count."""
        ledger = StepLedger(gpu_count=8)
        ledger.record_step(0.5, {"a": 3}, component="vision_encoder")
        result = ledger.finish("a")
        assert (result.total, result.vision_encoder, result.gpu_count) == (4.0, 4.0, 8)

    def test_zero_tokens_share_equally(self) -> None:
        """A step whose requests all report 0 tokens is shared equally."""
        ledger = StepLedger()
        ledger.record_step_ns(9, {"a": 0, "b": 0, "c": 0}, component="audio_encoder")
        assert [ledger.finish_ns(r) for r in "abc"] == [{"audio_encoder": 3}] * 3

    def test_components_accumulate_separately(self) -> None:
        """Per-component sums; components without steps stay None; total is their sum."""
        ledger = StepLedger()
        ledger.record_step_ns(300, {"a": 1}, component="vision_encoder")
        ledger.record_step_ns(200, {"a": 1}, component="prefill")
        ledger.record_step_ns(100, {"a": 1}, component="prefill")
        ledger.record_step_ns(50, {"a": 1}, component="decode")
        result = ledger.finish("a")
        assert result.components() == {
            "vision_encoder": 300e-9,
            "prefill": 300e-9,
            "decode": 50e-9,
        }
        assert result.audio_encoder is None
        assert result.total == 650e-9

    def test_mixed_step_as_two_calls(self) -> None:
        """A chunked-prefill step reported as prefill and decode calls lands in both."""
        ledger = StepLedger()
        ledger.record_step_ns(800, {"new": 500, "old": 300}, component="prefill")
        ledger.record_step_ns(200, {"old": 1, "older": 1}, component="decode")
        assert ledger.finish_ns("old") == {"prefill": 300, "decode": 100}
        assert ledger.totals().open_ns == 500 + 100

    def test_snapshot_keeps_the_request(self) -> None:
        """snapshot returns the timers so far and leaves the request open."""
        ledger = StepLedger()
        ledger.record_step_ns(1000, {"a": 1}, component="prefill")
        assert ledger.snapshot("a").total == 1e-6
        assert ledger.snapshot_ns("a") == {"prefill": 1000}
        ledger.record_step_ns(500, {"a": 1}, component="decode")
        assert ledger.finish("a").total == 1.5e-6
        assert "a" not in ledger

    def test_finish_removes(self) -> None:
        """A finished request is gone: finishing it again raises KeyError or gives default."""
        ledger = StepLedger()
        ledger.record_step(0.001, {"a": 1})
        ledger.finish("a")
        with pytest.raises(KeyError, match="not open"):
            ledger.finish("a")
        assert ledger.finish("a", None) is None
        with pytest.raises(KeyError):
            ledger.snapshot("a")
        assert ledger.open_requests() == []

    def test_open_requests_least_recent_first(self) -> None:
        """open_requests lists the open ids, least recently stepped first."""
        ledger = StepLedger()
        ledger.record_step_ns(1, {"a": 1, "b": 1})
        ledger.record_step_ns(1, {"c": 1, "a": 1})
        assert ledger.open_requests() == ["b", "c", "a"]
        assert len(ledger) == 3

    def test_empty_step_is_unattributed(self) -> None:
        """A step naming no request is kept as unattributed, not lost."""
        ledger = StepLedger()
        ledger.record_step_ns(70, {})
        totals = ledger.totals()
        assert (totals.recorded_ns, totals.unattributed_ns, totals.steps) == (70, 70, 1)

    def test_numpy_token_counts(self) -> None:
        """Integer token counts from numpy arrays are accepted."""
        ledger = StepLedger()
        counts = np.array([3, 1], dtype=np.int64)
        ledger.record_step_ns(40, {"a": counts[0], "b": counts[1]})
        assert ledger.finish_ns("a") == {"prefill": 30}

    def test_any_hashable_request_id(self) -> None:
        """Request ids need only be hashable (vLLM uses strings, engines may use ints)."""
        ledger = StepLedger()
        ledger.record_step_ns(10, {7: 1, ("x", 1): 1}, component="decode")
        assert ledger.finish_ns(7) == {"decode": 5}


class TestValidation:
    """Bad input is rejected with ValueError before anything is recorded."""

    @pytest.mark.parametrize("duration", [-0.1, float("nan"), float("inf"), True, "1"])
    def test_bad_duration(self, duration: object) -> None:
        """Durations must be finite non-negative numbers."""
        ledger = StepLedger()
        with pytest.raises(ValueError, match="duration_s"):
            ledger.record_step(duration, {"a": 1})  # type: ignore[arg-type]
        assert ledger.totals().steps == 0

    @pytest.mark.parametrize("duration", [-1, 1.5, True])
    def test_bad_duration_ns(self, duration: object) -> None:
        """Nanosecond durations must be non-negative integers."""
        with pytest.raises(ValueError, match="duration_ns"):
            StepLedger().record_step_ns(duration, {"a": 1})  # type: ignore[arg-type]

    @pytest.mark.parametrize("count", [-1, 1.0, True, None, "3"])
    def test_bad_token_count(self, count: object) -> None:
        """Token counts must be non-negative integers."""
        ledger = StepLedger()
        with pytest.raises(ValueError, match=r"tokens\['b'\]"):
            ledger.record_step(0.1, {"a": 1, "b": count})  # type: ignore[dict-item]
        assert ledger.open_requests() == []

    def test_tokens_must_be_a_mapping(self) -> None:
        """A list of ids is not a token map."""
        with pytest.raises(ValueError, match="mapping"):
            StepLedger().record_step(0.1, ["a", "b"])  # type: ignore[arg-type]

    def test_unknown_component(self) -> None:
        """Components are validated against modtrace.timers.COMPONENTS."""
        with pytest.raises(ValueError, match="unknown component 'encode'"):
            StepLedger().record_step(0.1, {"a": 1}, component="encode")

    @pytest.mark.parametrize(
        "kwargs",
        [{"gpu_count": 0}, {"max_open": 0}, {"max_idle_s": 0}, {"max_idle_s": -1.0}],
    )
    def test_bad_settings(self, kwargs: dict[str, object]) -> None:
        """gpu_count and max_open are at least 1; max_idle_s is positive."""
        with pytest.raises(ValueError, match=next(iter(kwargs))):
            StepLedger(**kwargs)  # type: ignore[arg-type]


class TestEviction:
    """Bounded memory: unfinished requests are evicted and counted."""

    def test_max_open_evicts_least_recent(self) -> None:
        """Over max_open, the least recently stepped request goes, and is counted."""
        ledger = StepLedger(max_open=2)
        ledger.record_step_ns(10, {"a": 1})
        ledger.record_step_ns(20, {"b": 1})
        ledger.record_step_ns(30, {"a": 1})  # a is now the most recent
        ledger.record_step_ns(40, {"c": 1})
        assert ledger.open_requests() == ["a", "c"]
        totals = ledger.totals()
        assert (totals.evictions, totals.evicted_ns) == (1, 20)
        assert ledger.evictions == 1
        assert ledger.finish("b", None) is None
        assert _balance(totals) == 0

    def test_idle_requests_evicted(self) -> None:
        """A request with no step for max_idle_s is evicted at the next step."""
        clock = ManualClock()
        ledger = StepLedger(max_idle_s=60.0, clock=clock)
        ledger.record_step_ns(5, {"stale": 1, "live": 1})
        clock.now = 59.0
        ledger.record_step_ns(6, {"live": 1})
        assert ledger.open_requests() == ["stale", "live"]
        clock.now = 61.0
        ledger.record_step_ns(7, {"live": 1})
        assert ledger.open_requests() == ["live"]
        totals = ledger.totals()
        assert (totals.evictions, totals.evicted_ns) == (1, 3)
        assert _balance(totals) == 0

    def test_no_age_eviction(self) -> None:
        """max_idle_s=None never evicts by age."""
        clock = ManualClock()
        ledger = StepLedger(max_idle_s=None, clock=clock)
        ledger.record_step_ns(5, {"a": 1})
        clock.now = 1e9
        ledger.record_step_ns(5, {"b": 1})
        assert ledger.open_requests() == ["a", "b"]


# --- Conservation, as a property ----------------------------------------------
_IDS = [f"r{i}" for i in range(12)]
_step = st.tuples(
    st.one_of(
        st.integers(min_value=0, max_value=10**12),  # integer nanoseconds
        st.floats(min_value=0, max_value=1e3, allow_nan=False),  # float seconds
    ),
    st.dictionaries(st.sampled_from(_IDS), st.integers(min_value=0, max_value=10**5), max_size=8),
    st.sampled_from(COMPONENTS),
)
_operation = st.one_of(
    st.tuples(st.just("step"), _step),
    st.tuples(st.just("finish"), st.sampled_from(_IDS)),
)


@given(
    operations=st.lists(_operation, max_size=60),
    gpu_count=st.integers(min_value=1, max_value=8),
    max_open=st.integers(min_value=1, max_value=15),
)
@settings(max_examples=300, deadline=None)
def test_conservation_is_exact(
    operations: list[tuple[str, object]], gpu_count: int, max_open: int
) -> None:
    """Finished + open + evicted + unattributed ns equal the steps' ns, always, exactly."""
    ledger = StepLedger(gpu_count=gpu_count, max_open=max_open)
    step_ns = 0
    empty_ns = 0
    finished_ns = 0
    for kind, payload in operations:
        if kind == "step":
            duration, tokens, component = payload  # type: ignore[misc]
            if isinstance(duration, int):
                ns = duration
                ledger.record_step_ns(duration, tokens, component)
            else:
                ns = round(duration * NS)
                ledger.record_step(duration, tokens, component)
            step_ns += ns * gpu_count
            empty_ns += 0 if tokens else ns * gpu_count
        else:
            parts = ledger.finish_ns(payload) if payload in ledger else {}
            finished_ns += sum(parts.values())
        totals = ledger.totals()
        assert _balance(totals) == 0
        assert totals.recorded_ns == step_ns
        assert totals.finished_ns == finished_ns
        assert totals.unattributed_ns == empty_ns
    open_ns = 0
    for request_id in ledger.open_requests():
        snapshot = ledger.snapshot_ns(request_id)
        timers = ledger.finish(request_id)
        # The one float rounding happens after the integer sum.
        assert timers.total == sum(snapshot.values()) / NS
        open_ns += sum(snapshot.values())
    evicted_ns = ledger.totals().evicted_ns
    assert finished_ns + open_ns + evicted_ns + empty_ns == step_ns
    if max_open >= len(_IDS):
        assert evicted_ns == 0


# --- Threads --------------------------------------------------------------------
def _workload(seed: int, threads: int) -> list[list[tuple[int, dict[str, int], str]]]:
    """Per thread, a list of steps over its own requests and two shared ones."""
    rng = random.Random(seed)
    plans = []
    for t in range(threads):
        own = [f"t{t}-r{i}" for i in range(6)]
        steps = []
        for _ in range(150):
            batch = rng.sample(own, rng.randint(1, 4)) + rng.sample(["s0", "s1"], rng.randint(0, 2))
            tokens = {r: rng.randint(0, 600) for r in batch}
            steps.append((rng.randint(0, 10**8), tokens, rng.choice(COMPONENTS)))
        plans.append(steps)
    return plans


def test_thread_pool_matches_serial() -> None:
    """Steps recorded and requests finished from a thread pool give the serial result."""
    threads = 8
    plans = _workload(seed=4, threads=threads)

    serial = StepLedger(gpu_count=2)
    for steps in plans:
        for duration, tokens, component in steps:
            serial.record_step_ns(duration, tokens, component)
    expected = {r: serial.finish_ns(r) for r in serial.open_requests()}

    ledger = StepLedger(gpu_count=2)
    results: dict[str, dict[str, int]] = {}
    start = threading.Barrier(threads)

    def run(steps: list[tuple[int, dict[str, int], str]]) -> dict[str, dict[str, int]]:
        start.wait(timeout=10)
        own = sorted({r for _, tokens, _ in steps for r in tokens if not r.startswith("s")})
        for duration, tokens, component in steps:
            ledger.record_step_ns(duration, tokens, component)
        # Finish this thread's own requests while other threads still record.
        return {r: ledger.finish_ns(r) for r in own}

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for finished in pool.map(run, plans):
            results.update(finished)
    results.update({r: ledger.finish_ns(r) for r in ledger.open_requests()})

    assert results == expected
    per_step = sum(d * 2 for steps in plans for d, _, _ in steps)
    assert sum(sum(parts.values()) for parts in results.values()) == per_step
    totals = ledger.totals()
    assert (totals.open_requests, totals.evictions, _balance(totals)) == (0, 0, 0)


def test_concurrent_finish_and_record() -> None:
    """Finishing requests while another thread records their steps loses nothing."""
    ledger = StepLedger()
    stop = threading.Event()
    finished: defaultdict[str, int] = defaultdict(int)

    def engine() -> None:
        for i in range(3000):
            ledger.record_step_ns(1000 + i, {f"r{i % 7}": 1 + i % 3, "bg": 1}, "decode")
        stop.set()

    def handler() -> None:
        rng = random.Random(1)
        while not stop.is_set():
            request_id = f"r{rng.randrange(7)}"
            timers = ledger.finish(request_id, None)
            if timers is not None:
                finished[request_id] += round((timers.total or 0.0) * NS)

    worker = threading.Thread(target=engine)
    handlers = [threading.Thread(target=handler) for _ in range(3)]
    for thread in (worker, *handlers):
        thread.start()
    for thread in (worker, *handlers):
        thread.join()
    for request_id in ledger.open_requests():
        finished[request_id] += sum(ledger.finish_ns(request_id).values())
    assert sum(finished.values()) == sum(1000 + i for i in range(3000))


def test_thread_pool_hammering_one_request() -> None:
    """Many threads stepping the same requests at once lose no nanosecond."""
    threads, steps = 8, 5000
    ledger = StepLedger()
    start = threading.Barrier(threads)

    def engine(_: int) -> None:
        start.wait(timeout=10)
        for _ in range(steps):
            ledger.record_step_ns(1, {"s": 1, "t": 1}, "decode")

    # Switch threads as often as possible, so an unlocked read-modify-write
    # of a shared request would lose updates (it does, without the lock).
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        with ThreadPoolExecutor(max_workers=threads) as pool:
            list(pool.map(engine, range(threads)))
    finally:
        sys.setswitchinterval(interval)
    totals = ledger.totals()
    assert (totals.recorded_ns, totals.open_ns, totals.steps) == (threads * steps,) * 3
    assert ledger.finish_ns("s")["decode"] + ledger.finish_ns("t")["decode"] == threads * steps
