"""Calibration records and their store: every version kept, nothing overwritten, clear errors."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pytest
from calibrate_helpers import synthetic_records

from modtrace.attribution import attribute
from modtrace.calibrate.fit import fit_probes
from modtrace.calibrate.plan import AudioItem, ImageItem, ProbePlan
from modtrace.calibrate.probes import EngineInfo, ProbeFile, ProbeFileHeader, ProbeRecord
from modtrace.calibrate.store import (
    CalibrationRecord,
    CalibrationStore,
    StoreError,
    calibration_from_fit,
    diff_calibrations,
    load_record,
)
from modtrace.calibrate.validate import validate_holdout
from modtrace.calibration import Calibration, load_calibration
from modtrace.timers import GpuTimers

TRUE = {"text.tokens": 0.0008, "image.tiles": 0.012, "audio.tokens": 0.002}
T0 = datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc)
PLAN = ProbePlan(
    profile="internvl",
    modalities=("text", "image", "audio"),
    images=(ImageItem(width=64, height=64),),
    audios=(AudioItem(seconds=1),),
)
ENGINE = EngineInfo(name="vllm 0.11.0", driver="NVIDIA 570.86, CUDA 12.8", gpu="H100")
DIGEST = "sha256:" + "ab" * 32


def synthetic_file(seed: int = 0, engine: EngineInfo = ENGINE) -> ProbeFile:
    """A probe file (in memory) of synthetic records with known weights."""
    records = synthetic_records(TRUE, 0.03, 0.004, np.random.default_rng(seed))
    records = [
        r.model_copy(update={"counters": {"image": "internvl.image@2", "text": "hf@1"}})
        for r in records
    ]
    header = ProbeFileHeader(plan_digest=PLAN.digest(), plan=PLAN, engine=engine)
    return ProbeFile(path=Path("probes.jsonl"), header=header, records=records, digest=DIGEST)


def make_record(version: str | None, seed: int = 0, created: datetime = T0) -> CalibrationRecord:
    """A calibration record fitted on synthetic probes."""
    probes = synthetic_file(seed)
    return calibration_from_fit(
        fit_probes(probes.records), probes, version=version, created=created
    )


class TestRecord:
    def test_provenance(self):
        """The record carries model, preprocessor, engine, driver, digests, errors and quality."""
        record = make_record("v1")
        assert record.format == "modtrace.calibration/1"
        assert record.model == "internvl"
        assert record.preprocessor == "internvl (image internvl.image@2, text hf@1)"
        assert record.counters == {"image": "internvl.image@2", "text": "hf@1"}
        assert record.engine == "vllm 0.11.0 on H100"
        assert record.driver == "NVIDIA 570.86, CUDA 12.8"
        assert record.plan_digest == PLAN.digest() and record.simulated is False
        assert set(record.weights) == set(TRUE)
        assert all(w.stderr > 0 for w in record.weights.values())
        assert record.overhead.value == pytest.approx(0.03, abs=0.01)
        assert record.fit.choices["image"].unit == "image.tiles"
        assert record.fit.r2 > 0.99

    def test_attribute_accepts_it(self):
        """A record is a Calibration: attribute() uses its weights and version."""
        record = make_record("v1")
        result = attribute({"text.tokens": 600, "image.tiles": 8}, {"total": 1.0}, record)
        assert result.calibration_version == "v1" and result.method == "weights"

    def test_default_version_id(self):
        """Without a version id, the record is named after its time and model."""
        record = make_record(None)
        assert record.version == "2026-11-01T120000Z-internvl"

    def test_negative_weight_refused(self):
        """A negative fitted weight is an error naming it, not a calibration."""
        probes = synthetic_file()
        fit = fit_probes(probes.records)
        tiles = fit.weights["image.tiles"].model_copy(update={"value": -0.001})
        bad = fit.model_copy(update={"weights": {**fit.weights, "image.tiles": tiles}})
        with pytest.raises(ValueError, match=r"negative fitted weight\(s\): image\.tiles"):
            calibration_from_fit(bad, probes, version="bad")

    def test_simulated_is_labelled(self):
        """Probes from the simulated engine make a record that says so."""
        probes = synthetic_file(engine=EngineInfo(name="simulated", simulated=True))
        record = calibration_from_fit(fit_probes(probes.records), probes, version="s1")
        assert record.simulated is True
        assert record.notes[0].startswith("SIMULATED")


class TestStore:
    def test_save_load_current(self, tmp_path):
        """Saving makes a version current; loading returns it unchanged."""
        store = CalibrationStore(tmp_path / "cal")
        record = make_record("v1")
        path = store.save(record)
        assert path.name == "v1.json"
        assert store.load("v1") == record
        assert store.current_version() == "v1" and store.current() == record

    def test_never_overwrites(self, tmp_path):
        """Saving an existing version is refused and the stored file is untouched."""
        store = CalibrationStore(tmp_path / "cal")
        store.save(make_record("v1", seed=0))
        before = (tmp_path / "cal" / "v1.json").read_bytes()
        with pytest.raises(StoreError, match=r"already exists.*never overwritten"):
            store.save(make_record("v1", seed=1))
        assert (tmp_path / "cal" / "v1.json").read_bytes() == before
        assert not list((tmp_path / "cal").glob(".*.tmp"))

    def test_versions_history_and_pointer(self, tmp_path):
        """Every version is listed oldest first; CURRENT moves; history.jsonl logs each move."""
        store = CalibrationStore(tmp_path / "cal")
        store.save(make_record("v1", created=T0))
        store.save(make_record("v2", created=T0 + timedelta(days=30)))
        store.save(make_record("v3", created=T0 + timedelta(days=60)), make_current=False)
        assert [v.version for v in store.versions()] == ["v1", "v2", "v3"]
        assert [v.current for v in store.versions()] == [False, True, False]
        store.set_current("v1")
        assert store.current_version() == "v1"
        history = [
            json.loads(line)
            for line in (tmp_path / "cal" / "history.jsonl").read_text().splitlines()
        ]
        assert [(h["previous"], h["current"]) for h in history] == [
            (None, "v1"),
            ("v1", "v2"),
            ("v2", "v1"),
        ]
        with pytest.raises(StoreError, match=r"no calibration version 'v9'.*v1, v2, v3"):
            store.set_current("v9")

    def test_missing_field(self, tmp_path):
        """A stored file missing a field: error naming the file and the field."""
        store = CalibrationStore(tmp_path / "cal")
        path = store.save(make_record("v1"))
        data = json.loads(path.read_text())
        del data["plan_digest"]
        path.chmod(0o644)
        path.write_text(json.dumps(data))
        with pytest.raises(
            StoreError, match=r"invalid calibration .*v1\.json: plan_digest: Field required"
        ):
            store.load("v1")
        with pytest.raises(StoreError, match="plan_digest"):
            store.versions()

    @pytest.mark.parametrize("field", ["weights", "fit", "driver", "created", "model"])
    def test_every_provenance_field_required(self, tmp_path, field):
        """Each provenance field is required in a stored record."""
        data = json.loads(make_record("v1").to_json())
        del data[field]
        path = tmp_path / "v1.json"
        path.write_text(json.dumps(data))
        with pytest.raises(StoreError, match=f"{field}: Field required"):
            load_record(path)

    def test_core_loader_reads_records(self, tmp_path):
        """modtrace's own calibration loader reads a stored record (extra fields kept)."""
        store = CalibrationStore(tmp_path / "cal")
        path = store.save(make_record("v1"))
        plain = load_calibration(path)
        assert plain.version == "v1" and set(plain.weights) == set(TRUE)

    def test_bad_version_ids(self, tmp_path):
        """Version ids are plain file names: no paths, no hidden files."""
        store = CalibrationStore(tmp_path / "cal")
        for bad in ("../x", ".hidden", "a/b", "", "x.json"):
            with pytest.raises(StoreError, match="version id"):
                store.path(bad)

    def test_renamed_file(self, tmp_path):
        """A file renamed to another version's name is detected."""
        store = CalibrationStore(tmp_path / "cal")
        store.save(make_record("v1"))
        (tmp_path / "cal" / "v1.json").rename(tmp_path / "cal" / "v2.json")
        with pytest.raises(StoreError, match="holds version 'v1', not 'v2'"):
            store.load("v2")

    def test_empty_store(self, tmp_path):
        """An empty or absent store lists nothing and has no current version."""
        store = CalibrationStore(tmp_path / "none")
        assert store.versions() == [] and store.current() is None


class TestDiff:
    def test_weight_by_weight(self):
        """Each unit's old and new weight, change, relative change and z-score."""
        a = make_record("v1", seed=0)
        b = make_record("v2", seed=1)
        diff = diff_calibrations(a, b)
        assert (diff.old, diff.new) == ("v1", "v2")
        rows = {c.unit: c for c in diff.weights}
        assert set(rows) == {*TRUE, "overhead"}
        tiles = rows["image.tiles"]
        old, new = a.weights["image.tiles"], b.weights["image.tiles"]
        assert tiles.change == pytest.approx(new.value - old.value)
        assert tiles.relative == pytest.approx((new.value - old.value) / old.value)
        assert tiles.z == pytest.approx(
            (new.value - old.value) / (old.stderr**2 + new.stderr**2) ** 0.5
        )
        assert diff.metadata == {}

    def test_units_and_metadata_that_differ(self):
        """A unit on one side only and differing metadata are reported."""
        a = Calibration(
            version="a", model="m1", weights={"text.tokens": 0.001, "image.tiles": 0.01}
        )
        b = Calibration(
            version="b", model="m2", weights={"text.tokens": 0.002, "audio.seconds": 0.05}
        )
        diff = diff_calibrations(a, b)
        rows = {c.unit: c for c in diff.weights}
        assert rows["image.tiles"].new is None and rows["image.tiles"].change is None
        assert rows["audio.seconds"].old is None
        assert rows["text.tokens"].relative == pytest.approx(1.0)
        assert rows["text.tokens"].z is None  # no standard errors
        assert diff.metadata == {"model": ("m1", "m2")}


def held(i: int, units: dict[str, float], **timers: float) -> ProbeRecord:
    """A held-out record."""
    return ProbeRecord(
        id=f"holdout/m/r{i}",
        kind="holdout",
        modality="mixed",
        size="m",
        status="ok",
        units=units,
        timers=GpuTimers(**timers),
    )


class TestHoldout:
    def test_weights_against_components(self):
        """Held-out requests: share errors per modality, median and worst, in points."""
        record = make_record("v1")
        units = {"text.tokens": 600, "image.tiles": 8, "image.tokens": 2048}
        timers = [
            {"total": 0.7, "vision_encoder": 0.05, "prefill": 0.6},
            {"total": 0.7, "vision_encoder": 0.10, "prefill": 0.55},
        ]
        rows = [
            held(0, units, **timers[0]),
            held(1, units, **timers[1]),
            held(2, units, total=0.7),
            ProbeRecord(
                id="holdout/m/r3",
                kind="holdout",
                modality="mixed",
                size="m",
                status="failed",
                error="engine: timeout",
            ),
        ]
        report = validate_holdout(record, rows)
        assert report.failed == ["holdout/m/r3"]
        assert report.without_components == ["holdout/m/r2"]
        by_weights = attribute(units, {"total": 0.7}, record).share
        expected = [
            abs(by_weights["image"] - attribute(units, t, record).share["image"]) * 100
            for t in timers
        ]
        assert [r.error_pp["image"] for r in report.rows[:2]] == pytest.approx(expected)
        assert report.per_modality["image"].n == 2
        assert report.per_modality["image"].worst_pp == pytest.approx(max(expected))
        assert report.per_modality["image"].median_pp == pytest.approx(sum(expected) / 2)
        assert report.factor_median == pytest.approx(report.rows[0].factor)
        assert report.goal_met(100.0) and not report.goal_met(0.0)
