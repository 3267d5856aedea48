"""Share the GPU seconds of a batching engine's steps across its requests.

A continuous-batching engine runs one step (forward pass) for many requests
at once, so a request's own wall-clock interval is shared with everyone in
its batch: summing per-request intervals counts the same GPU seconds once
per request. The ledger instead takes each step's measured duration once
(vLLM's ``ForwardPassMetrics.wall_time`` is such a per-step measure) and
*splits* it:

1. The step's duration is converted to integer nanoseconds and multiplied
   by ``gpu_count`` (every GPU of the engine is held for the step).
2. Each request in the step gets ``ns x tokens / total_tokens`` of it, by
   largest remainder: everyone gets the floor of their exact share, and the
   nanoseconds left over (fewer than the number of requests) go one each to
   the largest fractional parts, ties to the request listed first. If every
   count is 0, the step is shared equally.
3. Shares accumulate per request and per component, in integer nanoseconds;
   seconds (floats) appear only in what ``snapshot`` and ``finish`` return.

So conservation is exact, never approximate: at every moment the recorded
step nanoseconds equal finished + open + evicted + unattributed (steps with
no request) nanoseconds, see ``LedgerTotals``.

What a step's token counts should be: a decode step gives 1 per running
request; a prefill step (or a prefill chunk) the prompt tokens scheduled for
each request; an encoder step each request's encoder tokens or patches. A
mixed step (chunked prefill with decodes) can be recorded as one step under
one component, or as two calls with the step's time split between them by
the caller.

Memory is bounded: ``finish`` removes a request, and requests that are never
finished (a client that went away, a lost ``finish`` call) are evicted, the
least recently stepped first, when more than ``max_open`` are open or when
one had no step for ``max_idle_s`` seconds. Evictions are counted
(``LedgerTotals.evictions``, ``LedgerTotals.evicted_ns``), so lost time is
visible rather than silently dropped.

The ledger is thread-safe: an engine's worker thread records steps while
HTTP handlers finish requests.
"""

from __future__ import annotations

import operator
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar, overload

from ..timers import COMPONENTS, GpuTimers
from ..units import check_number

__all__ = ["LedgerTotals", "StepLedger", "split_largest_remainder"]

NS_PER_S = 1_000_000_000
_INDEX: dict[str, int] = {name: i for i, name in enumerate(COMPONENTS)}

T = TypeVar("T")
_MISSING = object()


def split_largest_remainder(total: int, weights: list[int]) -> list[int]:
    """Split ``total`` into integer parts proportional to ``weights``, exactly.

    Each part is ``floor(total x w / sum(w))``; the remainder (less than
    ``len(weights)``) goes one unit each to the largest fractional parts,
    ties to the lower index. If every weight is 0 the split is equal.

    Args:
        total: A non-negative integer to split.
        weights: Non-negative integers, at least one.

    Returns:
        Non-negative integers, one per weight, summing to ``total`` exactly.
    """
    if not weights:
        msg = "split_largest_remainder: needs at least one weight"
        raise ValueError(msg)
    weight_sum = sum(weights)
    if weight_sum == 0:
        weights = [1] * len(weights)
        weight_sum = len(weights)
    parts: list[int] = []
    remainders: list[int] = []
    for weight in weights:
        part, remainder = divmod(total * weight, weight_sum)
        parts.append(part)
        remainders.append(remainder)
    left = total - sum(parts)
    if left:
        # Largest fractional part first; the stable sort keeps ties in input order.
        order = sorted(range(len(weights)), key=lambda i: -remainders[i])
        for i in order[:left]:
            parts[i] += 1
    return parts


@dataclass(frozen=True, slots=True)
class LedgerTotals:
    """Ledger-wide nanoseconds; ``recorded == finished + open + evicted + unattributed``.

    Attributes:
        steps: Steps recorded.
        recorded_ns: GPU nanoseconds of all recorded steps (x ``gpu_count``).
        finished_ns: Nanoseconds returned by ``finish``.
        open_ns: Nanoseconds held by requests still open.
        evicted_ns: Nanoseconds of requests evicted unfinished.
        unattributed_ns: Nanoseconds of steps that named no request.
        evictions: Requests evicted unfinished.
        open_requests: Requests still open.
    """

    steps: int
    recorded_ns: int
    finished_ns: int
    open_ns: int
    evicted_ns: int
    unattributed_ns: int
    evictions: int
    open_requests: int


class _Account:
    """One open request: nanoseconds per component, ``None`` where it had no step."""

    __slots__ = ("last_step", "ns")

    def __init__(self, now: float) -> None:
        self.ns: list[int | None] = [None] * len(COMPONENTS)
        self.last_step = now

    def total(self) -> int:
        return sum(v for v in self.ns if v is not None)


def _check_tokens(tokens: Mapping[Hashable, int]) -> tuple[list[Hashable], list[int]]:
    """Return the request ids and their token counts as ints, or raise ``ValueError``."""
    if not isinstance(tokens, Mapping):
        msg = f"tokens: expected a mapping of request id to token count, got {tokens!r}"
        raise ValueError(msg)
    ids: list[Hashable] = []
    counts: list[int] = []
    for request_id, count in tokens.items():
        # operator.index accepts ints and numpy integers, never floats; bools are
        # ints to Python but always a caller's mistake here.
        try:
            if isinstance(count, bool):
                raise TypeError
            value = operator.index(count)
        except TypeError:
            msg = f"tokens[{request_id!r}]: expected an integer, got {count!r}"
            raise ValueError(msg) from None
        if value < 0:
            msg = f"tokens[{request_id!r}]: must not be negative, got {count!r}"
            raise ValueError(msg)
        ids.append(request_id)
        counts.append(value)
    return ids, counts


def _seconds_to_ns(duration_s: float) -> int:
    """Nanoseconds of a duration in seconds, rounded to the nearest."""
    return round(check_number("duration_s", duration_s) * NS_PER_S)


class StepLedger:
    """Per-request GPU seconds of a batching engine, from its steps.

    >>> ledger = StepLedger(gpu_count=2)
    >>> ledger.record_step(0.030, {"a": 100, "b": 50}, component="prefill")
    >>> ledger.record_step(0.010, {"a": 1, "b": 1}, component="decode")
    >>> ledger.finish("a").total
    0.05
    >>> ledger.finish("b").total
    0.03

    See the module docstring for the method.

    Args:
        gpu_count: GPUs the engine runs on; each step counts this many times.
        max_open: Most requests held open; beyond it the least recently
            stepped one is evicted.
        max_idle_s: A request with no step for this many seconds is evicted
            at the next ``record_step``; ``None`` never evicts by age.
        clock: Monotonic seconds, for ``max_idle_s`` (``time.monotonic``).
    """

    __slots__ = (
        "_accounts",
        "_clock",
        "_evicted_ns",
        "_evictions",
        "_finished_ns",
        "_gpu_count",
        "_lock",
        "_max_idle_s",
        "_max_open",
        "_recorded_ns",
        "_steps",
        "_unattributed_ns",
    )

    def __init__(
        self,
        gpu_count: int = 1,
        *,
        max_open: int = 100_000,
        max_idle_s: float | None = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        for field, value in (("gpu_count", gpu_count), ("max_open", max_open)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = f"{field}: must be an integer of at least 1, got {value!r}"
                raise ValueError(msg)
        if max_idle_s is not None and (check_number("max_idle_s", max_idle_s) <= 0):
            msg = f"max_idle_s: must be positive or None, got {max_idle_s!r}"
            raise ValueError(msg)
        self._gpu_count = gpu_count
        self._max_open = max_open
        self._max_idle_s = max_idle_s
        self._clock = clock
        self._lock = threading.Lock()
        # Least recently stepped first, so eviction pops from the front.
        self._accounts: OrderedDict[Hashable, _Account] = OrderedDict()
        self._steps = 0
        self._recorded_ns = 0
        self._finished_ns = 0
        self._evicted_ns = 0
        self._unattributed_ns = 0
        self._evictions = 0

    @property
    def gpu_count(self) -> int:
        """GPUs the engine runs on."""
        return self._gpu_count

    # -- Recording ---------------------------------------------------------------
    def record_step(
        self,
        duration_s: float,
        tokens: Mapping[Hashable, int],
        component: str = "prefill",
    ) -> None:
        """Share one step's GPU seconds across its requests by token count.

        Args:
            duration_s: The step's measured seconds (one GPU's timeline; the
                ledger multiplies by ``gpu_count``).
            tokens: Request id -> tokens this step processed for it (1 per
                decoding request; prompt tokens or encoder tokens otherwise).
                An empty mapping records the time as unattributed.
            component: One of ``modtrace.timers.COMPONENTS``.
        """
        self.record_step_ns(_seconds_to_ns(duration_s), tokens, component)

    def record_step_ns(
        self,
        duration_ns: int,
        tokens: Mapping[Hashable, int],
        component: str = "prefill",
    ) -> None:
        """Like ``record_step``, with the duration in integer nanoseconds.

        For engines timing with ``time.perf_counter_ns`` or integer CUDA
        timestamps: no float ever touches the arithmetic.
        """
        if isinstance(duration_ns, bool) or not isinstance(duration_ns, int) or duration_ns < 0:
            msg = f"duration_ns: must be a non-negative integer, got {duration_ns!r}"
            raise ValueError(msg)
        slot = _INDEX.get(component)
        if slot is None:
            msg = f"unknown component {component!r}; expected one of: {', '.join(COMPONENTS)}"
            raise ValueError(msg)
        ids, counts = _check_tokens(tokens)
        step_ns = duration_ns * self._gpu_count
        # The split is pure arithmetic: do it before taking the lock.
        shares = split_largest_remainder(step_ns, counts) if counts else []
        with self._lock:
            now = self._clock()
            self._steps += 1
            self._recorded_ns += step_ns
            if not counts:
                self._unattributed_ns += step_ns
            accounts = self._accounts
            for request_id, share in zip(ids, shares, strict=True):
                account = accounts.get(request_id)
                if account is None:
                    account = accounts[request_id] = _Account(now)
                else:
                    account.last_step = now
                    accounts.move_to_end(request_id)
                previous = account.ns[slot]
                account.ns[slot] = share if previous is None else previous + share
            self._evict(now)

    def _evict(self, now: float) -> None:
        """Evict over-count and idle requests, oldest first (caller holds the lock)."""
        accounts = self._accounts
        while len(accounts) > self._max_open:
            self._drop(next(iter(accounts)))
        if self._max_idle_s is None:
            return
        deadline = now - self._max_idle_s
        # Ordered by last step, so the idle ones are all at the front.
        while accounts:
            request_id, account = next(iter(accounts.items()))
            if account.last_step > deadline:
                return
            self._drop(request_id)

    def _drop(self, request_id: Hashable) -> None:
        account = self._accounts.pop(request_id)
        self._evicted_ns += account.total()
        self._evictions += 1

    # -- Reading -----------------------------------------------------------------
    def _timers(self, ns: list[int | None]) -> GpuTimers:
        measured = _measured(ns)
        return GpuTimers(
            # The total is summed in integers, so it is the exact sum of the parts
            # before the one rounding to float.
            total=sum(measured.values()) / NS_PER_S,
            gpu_count=self._gpu_count,
            source="step_ledger",
            **{name: v / NS_PER_S for name, v in measured.items()},
        )

    def _open_ns(self, request_id: Hashable) -> list[int | None]:
        """A copy of an open request's nanoseconds per component.

        Raises:
            KeyError: The request is not open.
        """
        with self._lock:
            account = self._accounts.get(request_id)
            if account is None:
                raise _not_open(request_id)
            return list(account.ns)

    def _close(self, request_id: Hashable) -> list[int | None] | None:
        """Close a request: its nanoseconds per component, or ``None`` if it is not open."""
        with self._lock:
            account = self._accounts.pop(request_id, None)
            if account is None:
                return None
            self._finished_ns += account.total()
            return account.ns

    def snapshot_ns(self, request_id: Hashable) -> dict[str, int]:
        """Nanoseconds of an open request so far, by component it had steps in.

        Raises:
            KeyError: The request is not open.
        """
        return _measured(self._open_ns(request_id))

    def snapshot(self, request_id: Hashable) -> GpuTimers:
        """GPU seconds of an open request so far, without closing it.

        Raises:
            KeyError: The request is not open.
        """
        return self._timers(self._open_ns(request_id))

    def finish_ns(self, request_id: Hashable) -> dict[str, int]:
        """Close a request; return its nanoseconds by component it had steps in.

        Raises:
            KeyError: The request is not open (never stepped, finished, or evicted).
        """
        ns = self._close(request_id)
        if ns is None:
            raise _not_open(request_id)
        return _measured(ns)

    @overload
    def finish(self, request_id: Hashable) -> GpuTimers: ...

    @overload
    def finish(self, request_id: Hashable, default: T) -> GpuTimers | T: ...

    def finish(self, request_id: Hashable, default: object = _MISSING) -> object:
        """Close a request and return its GPU seconds (``source="step_ledger"``).

        ``total`` is the sum of the request's components; a component it had
        no step in is ``None``.

        Args:
            request_id: The id used in ``record_step``.
            default: Returned, like ``dict.pop``'s, when the request is not
                open (it never had a step, was finished, or was evicted).

        Raises:
            KeyError: The request is not open and no ``default`` was given.
        """
        ns = self._close(request_id)
        if ns is None:
            if default is _MISSING:
                raise _not_open(request_id)
            return default
        return self._timers(ns)

    def open_requests(self) -> list[Hashable]:
        """Ids of the open requests, least recently stepped first."""
        with self._lock:
            return list(self._accounts)

    def __contains__(self, request_id: object) -> bool:
        with self._lock:
            return request_id in self._accounts

    def __len__(self) -> int:
        with self._lock:
            return len(self._accounts)

    def totals(self) -> LedgerTotals:
        """Ledger-wide nanoseconds and counters, read atomically."""
        with self._lock:
            return LedgerTotals(
                steps=self._steps,
                recorded_ns=self._recorded_ns,
                finished_ns=self._finished_ns,
                open_ns=sum(a.total() for a in self._accounts.values()),
                evicted_ns=self._evicted_ns,
                unattributed_ns=self._unattributed_ns,
                evictions=self._evictions,
                open_requests=len(self._accounts),
            )

    @property
    def evictions(self) -> int:
        """Requests evicted unfinished (over ``max_open`` or idle past ``max_idle_s``)."""
        with self._lock:
            return self._evictions


def _measured(ns: list[int | None]) -> dict[str, int]:
    """Nanoseconds by component name, for the components a request had steps in."""
    return {name: v for name, v in zip(COMPONENTS, ns, strict=True) if v is not None}


def _not_open(request_id: Hashable) -> KeyError:
    msg = f"request {request_id!r} is not open (never stepped, finished, or evicted)"
    return KeyError(msg)
