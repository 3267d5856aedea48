"""Measuring GPU seconds in engine code.

``GpuTimer`` times one request (whole and by component) with the wall clock
or CUDA events; ``StepLedger`` shares a batching engine's step times across
the requests of each batch. Both return ``modtrace.timers.GpuTimers``. Pure
Python: torch is optional and OpenTelemetry is not used here.
"""

from __future__ import annotations

from .gpu_timer import CudaEvent, GpuTimer, TimerSource, cuda_event_factory
from .ledger import LedgerTotals, StepLedger, split_largest_remainder

__all__ = [
    "CudaEvent",
    "GpuTimer",
    "LedgerTotals",
    "StepLedger",
    "TimerSource",
    "cuda_event_factory",
    "split_largest_remainder",
]
