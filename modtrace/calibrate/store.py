"""Calibration records and the directory store that keeps every version.

A :class:`CalibrationRecord` is a :class:`~modtrace.calibration.Calibration`
(so :func:`~modtrace.attribution.attribute` takes it as is) with the
provenance a platform team needs to trust and restate it: the model and
preprocessor versions, the engine and driver, the probe plan's digest, the
weights with their standard errors and covariance, the per-request
overhead and the fit's quality. Every field is required: a file missing one
is an error naming it.

The store is a directory::

    calibrations/
      CURRENT                          the version in force (one line)
      history.jsonl                    every change of CURRENT, appended
      2026-11-29T120000Z-qwen2.5-vl.json
      2026-12-29T120000Z-qwen2.5-vl.json

Versions are never overwritten: saving a version that exists is an error
(the file is created with an atomic, exclusive link). ``CURRENT`` is the
only file ever replaced, and ``history.jsonl`` keeps every value it had.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..calibration import Calibration, Weight
from ..errors import load_json_model
from .fit import OVERHEAD, FitResult, UnitChoice
from .probes import ProbeFile
from .validate import HoldoutReport

__all__ = [
    "CALIBRATION_FORMAT",
    "CalibrationDiff",
    "CalibrationRecord",
    "CalibrationStore",
    "FitQuality",
    "StoreError",
    "VersionInfo",
    "WeightChange",
    "calibration_from_fit",
    "diff_calibrations",
    "load_record",
]

CALIBRATION_FORMAT = "modtrace.calibration/1"
_VERSION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,127}$")
_DIGEST_RE = r"^sha256:[0-9a-f]{64}$"


class StoreError(ValueError):
    """A store operation that cannot be done: the message says why."""


def check_version_id(version: str) -> str:
    """Return ``version`` if it is a safe file name, else raise ``StoreError``."""
    if not _VERSION_RE.match(version) or version.endswith((".json", ".tmp")):
        msg = (
            f"version id {version!r}: use 1-128 letters, digits, '.', '_', '+' or '-', "
            "starting with a letter or digit"
        )
        raise StoreError(msg)
    return version


class FitQuality(BaseModel):
    """How well the weights fit the probes.

    Attributes:
        n: Probes fitted.
        df: Residual degrees of freedom.
        r2: R^2 of the joint fit.
        adj_r2: Adjusted R^2.
        residual_se: Residual standard error, GPU seconds.
        choices: The unit chosen per media modality, the rule and the alternatives' scores.
        excluded: Probe ids left out of the fit, by reason.
        holdout: Median and worst absolute share error per modality on the
            held-out requests, in points (empty when not validated).
        holdout_factor_median: Median reconciliation factor on the held-out requests.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int
    df: int
    r2: float
    adj_r2: float
    residual_se: float
    choices: dict[str, UnitChoice]
    excluded: dict[str, list[str]] = Field(default_factory=dict)
    holdout: dict[str, dict[str, float]] = Field(default_factory=dict)
    holdout_factor_median: float | None = None


class CalibrationRecord(Calibration):
    """A calibration with its provenance: what the store keeps (see the module doc).

    Attributes:
        format: The file format.
        counters: Modality -> ``id@version`` of the counters that produced the units.
        driver: GPU driver and runtime of the engine.
        simulated: True when the probes ran on the simulated engine.
        plan_digest: The probe plan's ``sha256:`` digest.
        probes_digest: The probe file's ``sha256:`` digest.
        overhead: The fitted per-request intercept, GPU seconds (not a weight).
        covariance: Covariance of the overhead and the weights, by name.
        fit: The fit's quality.
        notes: Free-form remarks.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["modtrace.calibration/1"]
    created: datetime
    model: str = Field(min_length=1)
    preprocessor: str = Field(min_length=1)
    counters: dict[str, str]
    engine: str = Field(min_length=1)
    driver: str
    simulated: bool
    plan_digest: str = Field(pattern=_DIGEST_RE)
    probes_digest: str = Field(pattern=_DIGEST_RE)
    weights: dict[str, Weight]
    overhead: Weight
    covariance: dict[str, dict[str, float]]
    fit: FitQuality
    notes: list[str] = Field(default_factory=list)

    @field_validator("version")
    @classmethod
    def _version(cls, value: str) -> str:
        return check_version_id(value)

    @field_validator("created")
    @classmethod
    def _aware(cls, value: datetime) -> datetime:
        # A creation time without a zone would make ages depend on the reader's clock.
        if value.tzinfo is None:
            msg = "created: needs a time zone (e.g. 2026-11-29T12:00:00Z)"
            raise ValueError(msg)
        return value

    @field_validator("covariance")
    @classmethod
    def _covariance(cls, value: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
        for a, row in value.items():
            for b, c in row.items():
                if not math.isfinite(c):
                    msg = f"covariance.{a}.{b}: must be finite"
                    raise ValueError(msg)
        return value


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._+-]+", "-", text.rsplit("/", 1)[-1]).strip("-.") or "model"


def calibration_from_fit(
    fit: FitResult,
    probes: ProbeFile,
    *,
    version: str | None = None,
    created: datetime | None = None,
    holdout: HoldoutReport | None = None,
    model: str | None = None,
    notes: list[str] | None = None,
) -> CalibrationRecord:
    """Build the calibration record of a fit, with the provenance from its probe file.

    Args:
        fit: The fitted weights.
        probes: The probe file they were fitted on (plan, engine, counters).
        version: The version id (default: ``<created, UTC>-<model>``).
        created: Creation time (default: now, UTC).
        holdout: The held-out validation, recorded in the fit quality.
        model: The model name (default: the engine's, else the plan's model, else profile).
        notes: Remarks to keep with the record.

    Raises:
        ValueError: a fitted weight is negative (the probes do not resolve it).
    """
    header = probes.header
    plan = header.plan
    negative = {u: e for u, e in fit.weights.items() if e.value < 0}
    if negative:
        shown = ", ".join(f"{u} {e.value:.3g} ± {e.stderr:.2g}" for u, e in negative.items())
        msg = (
            f"negative fitted weight(s): {shown}. The probes do not resolve these units: "
            "probe larger sizes or more repeats"
        )
        raise ValueError(msg)
    created = created or datetime.now(timezone.utc)
    model = model or header.engine.model or plan.model or plan.profile
    counters: dict[str, str] = {}
    for record in probes.latest().values():
        if record.status == "ok":
            for modality, ref in record.counters.items():
                counters.setdefault(modality, ref)
    refs = ", ".join(f"{m} {r}" for m, r in sorted(counters.items()))
    quality = FitQuality(
        n=fit.n,
        df=fit.df,
        r2=fit.r2,
        adj_r2=fit.adj_r2,
        residual_se=fit.residual_se,
        choices=fit.choices,
        excluded=fit.excluded,
        holdout=({m: e.model_dump() for m, e in holdout.per_modality.items()} if holdout else {}),
        holdout_factor_median=holdout.factor_median if holdout else None,
    )
    engine = header.engine
    all_notes = list(notes or [])
    all_notes[:0] = [c for c in engine.caveats if c not in all_notes]
    if engine.simulated:
        all_notes.insert(0, "SIMULATED engine: these weights measure nothing real")
    return CalibrationRecord(
        format=CALIBRATION_FORMAT,
        version=version or f"{created.astimezone(timezone.utc):%Y-%m-%dT%H%M%SZ}-{_slug(model)}",
        created=created,
        model=model,
        preprocessor=f"{plan.profile} ({refs})" if refs else plan.profile,
        counters=counters,
        engine=engine.name + (f" on {engine.gpu}" if engine.gpu else ""),
        driver=engine.driver or "unknown",
        simulated=engine.simulated,
        plan_digest=header.plan_digest,
        probes_digest=probes.digest,
        weights={u: {"value": e.value, "stderr": e.stderr} for u, e in fit.weights.items()},
        overhead=Weight(value=fit.overhead.value, stderr=fit.overhead.stderr),
        covariance=fit.covariance,
        fit=quality,
        notes=all_notes,
    )


def load_record(path: str | Path) -> CalibrationRecord:
    """Read a calibration record file.

    Raises:
        StoreError: unreadable, not JSON, or a missing or invalid field; the
            message names the file and the field.
    """
    return load_json_model(path, CalibrationRecord, "calibration", error=StoreError)


class VersionInfo(BaseModel):
    """One stored version, as listed."""

    model_config = ConfigDict(frozen=True)

    version: str
    created: datetime
    model: str
    engine: str
    simulated: bool
    current: bool
    path: Path


class CalibrationStore:
    """A directory of calibration records that keeps every version (see the module doc).

    Args:
        root: The store directory; created on first save.
    """

    POINTER = "CURRENT"
    HISTORY = "history.jsonl"

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)

    def path(self, version: str) -> Path:
        """Where ``version`` is (or would be) stored."""
        return self.root / f"{check_version_id(version)}.json"

    def save(self, record: CalibrationRecord, *, make_current: bool = True) -> Path:
        """Store a new version; never overwrites one.

        Raises:
            StoreError: the version already exists.
        """
        self.root.mkdir(parents=True, exist_ok=True)
        target = self.path(record.version)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(record.to_json() + "\n")
                f.flush()
                os.fsync(f.fileno())
            # link() fails if the target exists: an atomic "create, never replace".
            os.link(tmp, target)
        except FileExistsError:
            msg = (
                f"calibration version {record.version!r} already exists in {self.root}; "
                "versions are never overwritten: save it under a new version id"
            )
            raise StoreError(msg) from None
        finally:
            Path(tmp).unlink(missing_ok=True)
        if make_current:
            self.set_current(record.version)
        return target

    def load(self, version: str) -> CalibrationRecord:
        """The stored record of ``version``.

        Raises:
            StoreError: no such version (the message lists some), or an invalid file.
        """
        path = self.path(version)
        if not path.exists():
            known = [v.version for v in self.versions()]
            msg = (
                f"no calibration version {version!r} in {self.root}; "
                f"stored: {', '.join(known[-5:]) or 'none'}"
            )
            raise StoreError(msg)
        record = load_record(path)
        if record.version != version:
            msg = f"{path} holds version {record.version!r}, not {version!r}: the file was renamed"
            raise StoreError(msg)
        return record

    def current_version(self) -> str | None:
        """The version ``CURRENT`` points to, or ``None``."""
        pointer = self.root / self.POINTER
        if not pointer.exists():
            return None
        version = pointer.read_text(encoding="utf-8").strip()
        return check_version_id(version) if version else None

    def current(self) -> CalibrationRecord | None:
        """The record in force, or ``None`` when nothing is current."""
        version = self.current_version()
        return self.load(version) if version else None

    def set_current(self, version: str) -> None:
        """Point ``CURRENT`` at a stored version and log the change in ``history.jsonl``."""
        if not self.path(version).exists():
            self.load(version)  # raises with the list of known versions
        previous = self.current_version()
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(version + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.root / self.POINTER)
        entry = {
            "time": datetime.now(timezone.utc).isoformat(),
            "current": version,
            "previous": previous,
        }
        with (self.root / self.HISTORY).open("a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")

    def versions(self) -> list[VersionInfo]:
        """Every stored version, oldest first.

        Raises:
            StoreError: a stored file is invalid (named in the message).
        """
        if not self.root.exists():
            return []
        current = self.current_version()
        out = []
        for path in sorted(self.root.glob("*.json")):
            record = load_record(path)
            out.append(
                VersionInfo(
                    version=record.version,
                    created=record.created,
                    model=record.model,
                    engine=record.engine,
                    simulated=record.simulated,
                    current=record.version == current,
                    path=path,
                )
            )
        return sorted(out, key=lambda v: (v.created, v.version))


# --- Diff ---------------------------------------------------------------------------
class WeightChange(BaseModel):
    """One unit's weight in two calibrations.

    Attributes:
        unit: The unit name (or ``overhead``).
        old: The weight in the first calibration, if any.
        new: The weight in the second, if any.
        change: ``new - old`` when both exist.
        relative: ``change / old`` when both exist and ``old`` is not 0.
        z: ``change / sqrt(se_old^2 + se_new^2)`` when both standard errors
            are known: beyond about 2, the change is more than noise.
    """

    model_config = ConfigDict(frozen=True)

    unit: str
    old: Weight | None
    new: Weight | None
    change: float | None = None
    relative: float | None = None
    z: float | None = None


class CalibrationDiff(BaseModel):
    """Two calibrations compared weight by weight, and their differing metadata."""

    model_config = ConfigDict(frozen=True)

    old: str
    new: str
    weights: list[WeightChange]
    metadata: dict[str, tuple[Any, Any]] = Field(default_factory=dict)


def _change(unit: str, old: Weight | None, new: Weight | None) -> WeightChange:
    if old is None or new is None:
        return WeightChange(unit=unit, old=old, new=new)
    change = new.value - old.value
    relative = change / old.value if old.value else None
    z = None
    if old.stderr is not None and new.stderr is not None:
        spread = math.hypot(old.stderr, new.stderr)
        z = change / spread if spread > 0 else None
    return WeightChange(unit=unit, old=old, new=new, change=change, relative=relative, z=z)


_META_FIELDS = ("model", "preprocessor", "counters", "engine", "driver", "simulated", "plan_digest")


def diff_calibrations(old: Calibration, new: Calibration) -> CalibrationDiff:
    """Compare two calibrations weight by weight (any :class:`Calibration`; records add metadata).

    Units in only one calibration appear with the other side ``None``.
    """
    units = list(old.weights) + [u for u in new.weights if u not in old.weights]
    rows = [_change(u, old.weights.get(u), new.weights.get(u)) for u in units]
    old_overhead = getattr(old, OVERHEAD, None)
    new_overhead = getattr(new, OVERHEAD, None)
    if isinstance(old_overhead, Weight) or isinstance(new_overhead, Weight):
        rows.append(_change(OVERHEAD, _as_weight(old_overhead), _as_weight(new_overhead)))
    meta = {}
    for name in _META_FIELDS:
        a, b = getattr(old, name, None), getattr(new, name, None)
        if a != b:
            meta[name] = (a, b)
    return CalibrationDiff(old=old.version, new=new.version, weights=rows, metadata=meta)


def _as_weight(value: object) -> Weight | None:
    if isinstance(value, Weight):
        return value
    if isinstance(value, Mapping):
        return Weight.model_validate(value)
    return None
