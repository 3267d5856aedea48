"""Drift alarm: the median reconciliation factor over a sliding window, against a band.

Every request attributed by weights yields a factor ``measured / predicted``.
One request's factor is noisy (batching, caching); their **median** over a
window is not: when it leaves the band (default 0.9 to 1.1) the weights no
longer match what the engine spends, and reports built on them are wrong
before anyone reads them. The span processor feeds the tracker and turns
its signals into a log line and a metric.

The window holds the last ``window`` factors, and, with ``window_seconds``,
only those observed within that many seconds. A change of calibration
version starts a new window: old factors measured other weights.
:meth:`DriftTracker.observe` returns a :class:`DriftSignal` only when the
state changes (into drift, or back into the band), so a caller logs once
per change, not once per request. The tracker is thread-safe.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from ..units import check_number

__all__ = ["DEFAULT_BAND", "DriftSignal", "DriftTracker"]

DEFAULT_BAND: tuple[float, float] = (0.9, 1.1)


@dataclass(frozen=True)
class DriftSignal:
    """The tracker's state after an observation.

    Attributes:
        drifting: The window's median is outside the band.
        median: The median factor of the window.
        band: ``(low, high)``.
        samples: Factors in the window.
        calibration_version: The calibration the factors were measured against.
        changed: This observation changed the state (into or out of drift).
    """

    drifting: bool
    median: float
    band: tuple[float, float]
    samples: int
    calibration_version: str | None
    changed: bool

    @property
    def message(self) -> str:
        """One line for the log."""
        low, high = self.band
        where = f"calibration {self.calibration_version or '(none)'}"
        if self.drifting:
            side = "below" if self.median < low else "above"
            return (
                f"drift: median reconciliation factor {self.median:.3f} over the last "
                f"{self.samples} requests is {side} the band [{low:g}, {high:g}]: the weights of "
                f"{where} no longer match the engine; recalibrate"
            )
        return (
            f"drift cleared: median reconciliation factor {self.median:.3f} over the last "
            f"{self.samples} requests is back in [{low:g}, {high:g}] for {where}"
        )


class DriftTracker:
    """Tracks reconciliation factors and signals when their median leaves the band.

    Args:
        band: ``(low, high)``; the median is in drift outside it.
        window: Most recent factors kept.
        window_seconds: Also drop factors older than this (``None``: count only).
        min_samples: No judgement before the window holds this many factors.
        clock: Seconds, monotonic (tests pass their own).
    """

    def __init__(
        self,
        *,
        band: tuple[float, float] = DEFAULT_BAND,
        window: int = 200,
        window_seconds: float | None = None,
        min_samples: int = 20,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        low, high = (check_number(f"band[{i}]", v) for i, v in enumerate(band))
        if not low < high:
            msg = f"band: low {low} must be below high {high}"
            raise ValueError(msg)
        if window < 1 or min_samples < 1 or min_samples > window:
            msg = f"need 1 <= min_samples ({min_samples}) <= window ({window})"
            raise ValueError(msg)
        if window_seconds is not None and not window_seconds > 0:
            msg = f"window_seconds must be positive, got {window_seconds}"
            raise ValueError(msg)
        self.band = (low, high)
        self.window = window
        self.window_seconds = window_seconds
        self.min_samples = min_samples
        self._clock = clock
        self._lock = threading.Lock()
        self._times: deque[tuple[float, float]] = deque()
        self._sorted: list[float] = []
        self._version: str | None = None
        self._drifting = False

    def observe(
        self, factor: float, *, calibration_version: str | None = None, at: float | None = None
    ) -> DriftSignal | None:
        """Add one request's factor; return a signal when the drift state changes.

        Args:
            factor: ``measured / predicted`` of one request.
            calibration_version: The calibration it was measured against; a
                new version starts a new window.
            at: Observation time on the tracker's clock (default: now).

        Raises:
            ValueError: ``factor`` is negative, NaN or infinite.
        """
        value = check_number("factor", factor)
        with self._lock:
            now = self._clock() if at is None else at
            if calibration_version != self._version:
                self._clear()
                self._version = calibration_version
            self._times.append((now, value))
            bisect.insort(self._sorted, value)
            while len(self._times) > self.window:
                self._drop()
            self._expire(now)
            # The per-request path: a median and two comparisons; a signal only on change.
            values = self._sorted
            n = len(values)
            if n < self.min_samples:
                return None
            mid = n // 2
            median = values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2
            low, high = self.band
            drifting = not low <= median <= high
            if drifting == self._drifting:
                return None
            self._drifting = drifting
            return DriftSignal(
                drifting=drifting,
                median=median,
                band=self.band,
                samples=n,
                calibration_version=self._version,
                changed=True,
            )

    def status(self, *, at: float | None = None) -> DriftSignal | None:
        """The current state, or ``None`` while the window holds fewer than ``min_samples``."""
        with self._lock:
            self._expire(self._clock() if at is None else at)
            return self._state(changed=False)

    def reset(self) -> None:
        """Forget every factor and the drift state."""
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._times.clear()
        self._sorted.clear()
        self._drifting = False

    def _drop(self) -> None:
        _, value = self._times.popleft()
        del self._sorted[bisect.bisect_left(self._sorted, value)]

    def _expire(self, now: float) -> None:
        if self.window_seconds is None:
            return
        while self._times and now - self._times[0][0] > self.window_seconds:
            self._drop()

    def _state(self, *, changed: bool) -> DriftSignal | None:
        n = len(self._sorted)
        if n < self.min_samples:
            return None
        mid = n // 2
        median = self._sorted[mid] if n % 2 else (self._sorted[mid - 1] + self._sorted[mid]) / 2
        low, high = self.band
        return DriftSignal(
            drifting=not low <= median <= high,
            median=median,
            band=self.band,
            samples=n,
            calibration_version=self._version,
            changed=changed,
        )
