"""Send a probe plan to an engine and record what it measured, resumably.

An engine is anything callable as ``engine(body, headers) -> GpuTimers``:
the OpenAI-style request body and the HTTP headers a client would send
(llm-d's video metadata headers), returning the GPU timers the engine
measured for that request. A Python engine is called directly; an
OpenAI-compatible endpoint is wrapped in such a callable.

Each probe is counted with the plan's profile first (its units go in the
record), then sent. A probe whose counting reports errors, or whose
engine call raises or returns no measured total, is recorded as
``failed`` with the reason: nothing is dropped. Runs resume: probes
already recorded in the file are skipped (failed ones are sent again with
``retry_failed``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, Protocol, TextIO, runtime_checkable

from pydantic import ValidationError

from ..errors import one_line
from ..timers import GpuTimers
from .plan import CountFn, ProbePlan, ProbeRequest, default_count_fn, iter_requests
from .probes import EngineInfo, ProbeRecord, ProbeWriter, repair_torn_tail

__all__ = ["Engine", "ProgressMode", "RunSummary", "engine_info", "run_plan"]

ProgressMode = Literal["auto", "rich", "plain", "none"]


@runtime_checkable
class Engine(Protocol):
    """**Protocol:** runs one request and returns its measured GPU timers.

    An engine may also have an ``info`` attribute (:class:`EngineInfo`)
    naming itself, its driver and GPU; it is recorded in the probe file.
    """

    def __call__(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> GpuTimers:
        """Send ``body`` (with ``headers``) and return the engine's GPU timers."""
        ...


def engine_info(engine: Engine) -> EngineInfo:
    """The engine's own :class:`EngineInfo`, else one named after its type."""
    info = getattr(engine, "info", None)
    if isinstance(info, EngineInfo):
        return info
    return EngineInfo(name=getattr(engine, "__name__", None) or type(engine).__name__)


@dataclass
class RunSummary:
    """What one run did.

    Attributes:
        path: The probe file.
        planned: Requests in the plan.
        skipped: Already recorded, not sent again.
        sent: Sent in this run.
        ok: Sent and measured.
        failed: Sent (or counted) and failed; each is recorded with its reason.
        repaired: Bytes of a torn last line cut off before resuming.
        seconds: Wall time of the run.
        failures: ``(probe id, reason)`` of this run's failures.
    """

    path: Path
    planned: int
    skipped: int = 0
    sent: int = 0
    ok: int = 0
    failed: int = 0
    repaired: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)


class _Progress:
    """A rich progress bar when rich is installed and asked for, else a plain stderr counter."""

    def __init__(self, mode: ProgressMode, total: int, stream: TextIO) -> None:
        self.total, self.stream, self.done = total, stream, 0
        self._bar: Any = None
        if mode == "auto":
            mode = "rich" if _has_rich() and stream.isatty() else "plain"
        self.mode = mode
        if mode == "rich":
            from rich.console import Console
            from rich.progress import Progress

            self._bar = Progress(console=Console(file=stream), transient=False)
            self._bar.start()
            self._task = self._bar.add_task("probes", total=total)

    def step(self, probe_id: str, status: str) -> None:
        self.done += 1
        if self.mode == "rich":
            self._bar.update(self._task, advance=1, description=probe_id)
        elif self.mode == "plain":
            print(f"[{self.done}/{self.total}] {probe_id} {status}", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


def _has_rich() -> bool:
    try:
        import rich.progress  # noqa: F401
    except ImportError:
        return False
    return True


def _measure(
    request: ProbeRequest, engine: Engine, count: CountFn
) -> tuple[dict[str, Any], str | None]:
    """Count and send one probe; returns the record fields and the failure reason, if any."""
    spec = request.spec
    fields: dict[str, Any] = {
        "id": spec.id,
        "kind": spec.kind,
        "modality": spec.modality,
        "size": spec.size,
        "started": datetime.now(timezone.utc),
    }
    try:
        counted = count(request.body, request.headers)
    except Exception as exc:
        return fields, f"counting: {type(exc).__name__}: {one_line(exc)}"
    fields["units"] = counted.units
    fields["counters"] = dict(counted.counters)
    if counted.errors:
        return fields, "counting: " + "; ".join(counted.errors)
    wanted = {"text"} if spec.modality == "text" else {"text", *_request_modalities(spec)}
    missing = wanted - set(counted.units.modalities())
    if missing:
        return fields, f"counting: no {', '.join(sorted(missing))} units counted"
    start = time.perf_counter()
    try:
        timers = engine(request.body, request.headers)
        if not isinstance(timers, GpuTimers):
            timers = GpuTimers.model_validate(timers)
    except ValidationError as exc:
        return fields, f"engine: invalid timers: {one_line(exc)}"
    except Exception as exc:
        return fields, f"engine: {type(exc).__name__}: {one_line(exc)}"
    fields["wall_seconds"] = time.perf_counter() - start
    fields["timers"] = timers
    if timers.total is None:
        return fields, "engine: no measured total in the timers"
    return fields, None


def _request_modalities(spec: Any) -> list[str]:
    """The media modalities a probe spec carries."""
    items = {"image": spec.images, "audio": spec.audios, "video": spec.videos}
    return [m for m, v in items.items() if v]


def run_plan(
    plan: ProbePlan,
    engine: Engine,
    path: str | Path,
    *,
    count: CountFn | None = None,
    info: EngineInfo | None = None,
    retry_failed: bool = False,
    repair: bool = False,
    limit: int | None = None,
    progress: ProgressMode = "auto",
    stream: TextIO | None = None,
) -> RunSummary:
    """Send every probe of ``plan`` not yet in ``path`` to ``engine``; append the results.

    Args:
        plan: The probe plan.
        engine: ``engine(body, headers) -> GpuTimers``.
        path: The probe file (JSON lines); created with its header if absent.
        count: Counts a request (default: the plan's profile via ``RequestCounter``).
        info: What the engine is (default: ``engine.info``, else its type name).
        retry_failed: Send again the probes whose last record is a failure.
        repair: First cut off a last line torn by an interrupted write.
        limit: Send at most this many probes (then stop; run again to resume).
        progress: ``auto`` (rich on a terminal when installed, else plain),
            ``rich``, ``plain`` (one stderr line per probe) or ``none``.
        stream: Where progress goes (default: standard error).

    Raises:
        ProbeFileError: the existing file is damaged, or belongs to another
            plan or engine.
    """
    started = time.perf_counter()
    p = Path(path)
    repaired = len(repair_torn_tail(p)) if repair and p.exists() else 0
    writer = ProbeWriter(p, plan, info or engine_info(engine))
    recorded = writer.recorded()

    def skip(probe_id: str) -> bool:
        record = recorded.get(probe_id)
        return record is not None and (record.status == "ok" or not retry_failed)

    specs = plan.probes()
    todo = [s for s in specs if not skip(s.id)]
    skipped = len(specs) - len(todo)
    if limit is not None:
        todo = todo[: max(limit, 0)]
    wanted = {s.id for s in todo}
    summary = RunSummary(path=p, planned=len(specs), skipped=skipped, repaired=repaired)
    count = count or default_count_fn(plan)
    bar = _Progress(progress, len(todo), stream or sys.stderr)
    try:
        for request in iter_requests(plan, skip=lambda i: i not in wanted):
            fields, failure = _measure(request, engine, count)
            if failure:
                record = ProbeRecord(status="failed", error=failure, **fields)
                summary.failed += 1
                summary.failures.append((record.id, failure))
            else:
                record = ProbeRecord(status="ok", **fields)
                summary.ok += 1
            writer.append(record)
            summary.sent += 1
            bar.step(record.id, "ok" if not failure else f"FAILED: {failure}")
    finally:
        bar.close()
        summary.seconds = time.perf_counter() - started
    return summary
