"""Raw probe results: an append-only JSON lines file, one record per request sent.

The first line is a header naming the plan (embedded, with its digest) and
the engine; every other line is one :class:`ProbeRecord`, ``ok`` with the
engine's GPU timers or ``failed`` with the reason. The file is only ever
appended to, one line per write, flushed and synced, so a run that stops
(crash, Ctrl-C) can be resumed: the runner skips the probes already
recorded.

Nothing is dropped silently when reading: a line that is not JSON, not a
valid record, a second header, or a last line cut off mid-write is an
error naming the file and the line (:class:`ProbeFileError`). A probe
recorded more than once (a failed probe retried) is kept in the file; the
latest record wins and the earlier ones are reported as superseded.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import one_line
from ..timers import GpuTimers
from ..units import UnitCounts
from .plan import ProbeKind, ProbePlan

__all__ = [
    "PROBES_FORMAT",
    "EngineInfo",
    "ProbeFile",
    "ProbeFileError",
    "ProbeFileHeader",
    "ProbeRecord",
    "ProbeWriter",
    "read_probes",
    "repair_torn_tail",
]

PROBES_FORMAT = "modtrace.probes/1"


class ProbeFileError(ValueError):
    """A probe file that cannot be read as a whole; the message names the line."""


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class EngineInfo(BaseModel):
    """What the probes ran on.

    Attributes:
        name: The engine and its version (``vllm 0.11.0``, ``simulated``).
        driver: GPU driver and runtime (``NVIDIA 570.86.15, CUDA 12.8``).
        gpu: The accelerator model.
        model: The model the engine served, if it says.
        simulated: True for the synthetic engine: its weights measure nothing.
        caveats: What the measurements do not mean, in plain sentences (the
            reference engine's CPU seconds standing in for GPU seconds...);
            carried into the notes of every calibration made from them.
        details: Anything else worth keeping (cost model, flags).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    driver: str | None = None
    gpu: str | None = None
    model: str | None = None
    simulated: bool = False
    caveats: list[str] = Field(default_factory=list)
    details: dict[str, Any] = Field(default_factory=dict)

    def same_engine(self, other: EngineInfo) -> bool:
        """Whether probes from ``self`` and ``other`` may share one file."""
        keys = ("name", "driver", "gpu", "model", "simulated")
        return all(getattr(self, k) == getattr(other, k) for k in keys)


class ProbeFileHeader(BaseModel):
    """The first line of a probe file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["header"] = "header"
    format: Literal["modtrace.probes/1"] = PROBES_FORMAT
    plan_digest: str
    plan: ProbePlan
    engine: EngineInfo
    created: datetime = Field(default_factory=_utcnow)

    @model_validator(mode="after")
    def _digest_matches(self) -> ProbeFileHeader:
        if self.plan.digest() != self.plan_digest:
            msg = (
                f"plan_digest {self.plan_digest} does not match the embedded plan "
                f"({self.plan.digest()}): the header was edited"
            )
            raise ValueError(msg)
        return self


class ProbeRecord(BaseModel):
    """The result of sending one probe.

    Attributes:
        id: The probe id from the plan.
        kind: ``warmup``, ``probe`` or ``holdout``.
        modality: The modality measured, or ``mixed``.
        size: The size label from the plan.
        status: ``ok`` (``timers.total`` is set) or ``failed`` (``error`` says why).
        units: The request's units, as counted by the plan's profile.
        counters: Modality -> ``id@version`` of the counter used.
        timers: The GPU timers the engine reported.
        error: Why the probe failed.
        started: When the request was sent.
        wall_seconds: Wall time of the request as seen by the runner.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["probe"] = "probe"
    id: str = Field(min_length=1)
    kind: ProbeKind
    modality: Literal["text", "image", "audio", "video", "mixed"]
    size: str
    status: Literal["ok", "failed"]
    units: UnitCounts = Field(default_factory=lambda: UnitCounts({}))
    counters: dict[str, str] = Field(default_factory=dict)
    timers: GpuTimers | None = None
    error: str | None = None
    started: datetime = Field(default_factory=_utcnow)
    wall_seconds: float | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> ProbeRecord:
        if self.status == "ok":
            if self.timers is None or self.timers.total is None:
                msg = "an ok probe needs timers with a measured total"
                raise ValueError(msg)
            if self.error:
                msg = "an ok probe cannot carry an error"
                raise ValueError(msg)
        elif not self.error:
            msg = "a failed probe needs an error saying why"
            raise ValueError(msg)
        return self

    @property
    def gpu_seconds(self) -> float:
        """The measured GPU seconds of an ok probe."""
        if self.timers is None or self.timers.total is None:
            msg = f"probe {self.id} has no measured total ({self.status})"
            raise ValueError(msg)
        return self.timers.total


@dataclass
class ProbeFile:
    """A probe file, read whole.

    Attributes:
        path: Where it was read from.
        header: The first line.
        records: Every record, in file order.
        digest: ``sha256:<hex>`` of the file's bytes.
    """

    path: Path
    header: ProbeFileHeader
    records: list[ProbeRecord] = field(default_factory=list)
    digest: str = ""

    def latest(self) -> dict[str, ProbeRecord]:
        """The last record of each probe id, in first-seen order."""
        out: dict[str, ProbeRecord] = {}
        for record in self.records:
            out.pop(record.id, None)
            out[record.id] = record
        return out

    def superseded(self) -> list[ProbeRecord]:
        """Records replaced by a later record of the same probe (failed probes retried)."""
        last = self.latest()
        return [r for r in self.records if last[r.id] is not r]

    def failures(self) -> list[ProbeRecord]:
        """The probes whose latest record is a failure."""
        return [r for r in self.latest().values() if r.status == "failed"]

    def missing(self) -> list[str]:
        """Probe ids of the plan with no record yet."""
        done = self.latest()
        return [s.id for s in self.header.plan.probes() if s.id not in done]


def _where(path: Path, line_no: int) -> str:
    return f"{path} line {line_no}"


def _parse_line(path: Path, line_no: int, raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        msg = f"{_where(path, line_no)}: not valid JSON ({one_line(exc)})"
        raise ProbeFileError(msg) from None
    if not isinstance(data, dict):
        msg = f"{_where(path, line_no)}: expected a JSON object, got {type(data).__name__}"
        raise ProbeFileError(msg)
    return data


M = TypeVar("M", bound=BaseModel)


def _validated(model: type[M], obj: dict[str, Any], path: Path, line_no: int, what: str) -> M:
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        msg = f"{_where(path, line_no)}: invalid {what}: {one_line(exc)}"
        raise ProbeFileError(msg) from None


def read_probes(path: str | Path) -> ProbeFile:
    """Read and check a whole probe file.

    Raises:
        ProbeFileError: the file is missing or empty, a line is not JSON or
            not a valid header or record, the header is missing or repeated,
            a record's id is not in the plan, or the last line was cut off
            mid-write (no final newline). The message names the line.
    """
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        msg = f"cannot read probe file {p}: {exc.strerror or exc}"
        raise ProbeFileError(msg) from exc
    if not data:
        msg = f"{p}: empty probe file (no header line)"
        raise ProbeFileError(msg)
    lines = data.split(b"\n")
    if lines[-1]:
        # Every write ends with a newline: a last line without one is a torn write.
        msg = (
            f"{_where(p, len(lines))}: incomplete last line ({len(lines[-1])} bytes, no "
            "newline): the run stopped while writing it; resume with "
            "'modtrace calibrate run --repair' to cut it off and send that probe again"
        )
        raise ProbeFileError(msg)
    header: ProbeFileHeader | None = None
    records: list[ProbeRecord] = []
    ids: set[str] | None = None
    for n, raw in enumerate(lines[:-1], start=1):
        if not raw.strip():
            msg = f"{_where(p, n)}: blank line (probe files have one JSON object per line)"
            raise ProbeFileError(msg)
        obj = _parse_line(p, n, raw)
        kind = obj.get("type")
        if n == 1:
            if kind != "header":
                msg = f"{_where(p, n)}: the first line must be the header, got type {kind!r}"
                raise ProbeFileError(msg)
            header = _validated(ProbeFileHeader, obj, p, n, "header")
            ids = {s.id for s in header.plan.probes()}
            continue
        if kind != "probe":
            msg = f"{_where(p, n)}: expected a probe record, got type {kind!r}"
            raise ProbeFileError(msg)
        record = _validated(ProbeRecord, obj, p, n, "probe record")
        if ids is not None and record.id not in ids:
            msg = f"{_where(p, n)}: probe {record.id!r} is not in the file's plan"
            raise ProbeFileError(msg)
        records.append(record)
    assert header is not None  # the first line is always parsed as the header
    return ProbeFile(
        path=p, header=header, records=records, digest="sha256:" + hashlib.sha256(data).hexdigest()
    )


def repair_torn_tail(path: str | Path) -> bytes:
    """Cut off a last line left incomplete by an interrupted write; returns what was cut.

    Only an incomplete final line (no newline) is removed; any other damage
    stays an error for :func:`read_probes` to report.
    """
    p = Path(path)
    data = p.read_bytes()
    cut = data.rfind(b"\n") + 1
    if cut == len(data):
        return b""
    with p.open("r+b") as f:
        f.truncate(cut)
        f.flush()
        os.fsync(f.fileno())
    return data[cut:]


class ProbeWriter:
    """Appends to a probe file, one synced line per record.

    Opening a new file writes the header; opening an existing one checks
    that it belongs to the same plan and engine.
    """

    def __init__(self, path: str | Path, plan: ProbePlan, engine: EngineInfo) -> None:
        self.path = Path(path)
        self.plan = plan
        if self.path.exists() and self.path.stat().st_size > 0:
            existing = read_probes(self.path)
            if existing.header.plan_digest != plan.digest():
                msg = (
                    f"{self.path} was recorded for plan {existing.header.plan_digest}, not this "
                    f"plan ({plan.digest()}): write to a new probe file"
                )
                raise ProbeFileError(msg)
            if not existing.header.engine.same_engine(engine):
                msg = (
                    f"{self.path} was recorded on engine {existing.header.engine.name!r} "
                    f"(driver {existing.header.engine.driver!r}), not {engine.name!r} "
                    f"(driver {engine.driver!r}): write to a new probe file"
                )
                raise ProbeFileError(msg)
            self.existing: ProbeFile | None = existing
        else:
            header = ProbeFileHeader(plan_digest=plan.digest(), plan=plan, engine=engine)
            self._append(header.model_dump_json())
            self.existing = None

    def recorded(self) -> dict[str, ProbeRecord]:
        """The latest record of each probe already in the file when it was opened."""
        return self.existing.latest() if self.existing else {}

    def append(self, record: ProbeRecord) -> None:
        """Append one record."""
        self._append(record.model_dump_json(exclude_none=True))

    def extend(self, records: Iterable[ProbeRecord]) -> None:
        """Append records in order."""
        for record in records:
            self.append(record)

    def _append(self, line: str) -> None:
        if "\n" in line:  # pragma: no cover - pydantic's compact JSON has no newline
            msg = "a probe record must serialise to one line"
            raise ValueError(msg)
        # One write per line, synced: a crash can only tear the last line.
        with self.path.open("ab") as f:
            f.write(line.encode("utf-8") + b"\n")
            f.flush()
            os.fsync(f.fileno())
