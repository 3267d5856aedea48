"""Probe files: append-only JSON lines, damage is an error naming the line, nothing dropped."""

from __future__ import annotations

import json

import pytest

from modtrace.calibrate.plan import ImageItem, ProbePlan
from modtrace.calibrate.probes import (
    EngineInfo,
    ProbeFileError,
    ProbeRecord,
    ProbeWriter,
    read_probes,
    repair_torn_tail,
)
from modtrace.timers import GpuTimers

PLAN = ProbePlan(
    profile="p",
    modalities=("text", "image"),
    text_words=(8, 64),
    images=(ImageItem(width=64, height=64), ImageItem(width=128, height=64)),
    repeats=1,
    warmup=0,
    holdout=(),
)
ENGINE = EngineInfo(name="vllm 0.11.0", driver="570.86", gpu="H100")


def record(probe_id: str, **fields: object) -> ProbeRecord:
    """A record for a probe of PLAN (``modality/size/...``), with ``fields``."""
    modality = probe_id.partition("/")[0]
    return ProbeRecord(
        id=probe_id, kind="probe", modality=modality, size=probe_id.split("/")[1], **fields
    )


def ok(probe_id: str, total: float = 0.5) -> ProbeRecord:
    """An ok record for a probe of PLAN."""
    timers = GpuTimers(total=total, prefill=total)
    return record(probe_id, status="ok", units={"text.tokens": 10}, timers=timers)


def failed(probe_id: str) -> ProbeRecord:
    """A failed record for a probe of PLAN."""
    return record(probe_id, status="failed", error="engine: ConnectionError: refused")


@pytest.fixture
def probe_file(tmp_path):
    """A probe file with a header and two records."""
    path = tmp_path / "probes.jsonl"
    writer = ProbeWriter(path, PLAN, ENGINE)
    writer.extend([ok("text/8w/r0"), failed("image/64x64/r0")])
    return path


def lines(path) -> list[str]:
    """The file's lines."""
    return path.read_text(encoding="utf-8").splitlines()


class TestRoundTrip:
    def test_read_back(self, probe_file):
        """Header and records read back as written."""
        pf = read_probes(probe_file)
        assert pf.header.plan_digest == PLAN.digest()
        assert pf.header.engine == ENGINE
        assert [r.id for r in pf.records] == ["text/8w/r0", "image/64x64/r0"]
        assert pf.records[0].timers.total == 0.5
        assert [r.id for r in pf.failures()] == ["image/64x64/r0"]
        assert set(pf.missing()) == {"text/64w/r0", "image/128x64/r0"}
        assert pf.digest.startswith("sha256:")

    def test_one_json_object_per_line(self, probe_file):
        """Every line is one JSON object ending in a newline."""
        raw = probe_file.read_bytes()
        assert raw.endswith(b"\n")
        objs = [json.loads(x) for x in lines(probe_file)]
        assert [o["type"] for o in objs] == ["header", "probe", "probe"]

    def test_latest_record_wins(self, probe_file):
        """A retried probe: the latest record counts, the earlier one is superseded, both kept."""
        writer = ProbeWriter(probe_file, PLAN, ENGINE)
        writer.append(ok("image/64x64/r0", 0.7))
        pf = read_probes(probe_file)
        assert len(pf.records) == 3
        assert pf.latest()["image/64x64/r0"].status == "ok"
        assert [r.status for r in pf.superseded()] == ["failed"]
        assert pf.failures() == []

    def test_reopen_checks_plan_and_engine(self, probe_file):
        """A file belongs to one plan and one engine."""
        with pytest.raises(ProbeFileError, match="recorded for plan"):
            ProbeWriter(probe_file, PLAN.model_copy(update={"repeats": 2}), ENGINE)
        other = EngineInfo(name="vllm 0.11.0", driver="575.00", gpu="H100")
        with pytest.raises(ProbeFileError, match=r"driver '570\.86'"):
            ProbeWriter(probe_file, PLAN, other)
        assert set(ProbeWriter(probe_file, PLAN, ENGINE).recorded()) == {
            "text/8w/r0",
            "image/64x64/r0",
        }


class TestRecords:
    def test_ok_needs_total(self):
        """An ok record without a measured total is invalid."""
        with pytest.raises(ValueError, match="measured total"):
            ProbeRecord(
                id="x", kind="probe", modality="text", size="1", status="ok", timers=GpuTimers()
            )

    def test_failed_needs_reason(self):
        """A failed record must say why."""
        with pytest.raises(ValueError, match="error saying why"):
            ProbeRecord(id="x", kind="probe", modality="text", size="1", status="failed")

    def test_gpu_seconds_of_failure(self):
        """Asking a failed probe for its seconds is an error naming it."""
        with pytest.raises(ValueError, match="image/64x64/r0 has no measured total"):
            _ = failed("image/64x64/r0").gpu_seconds


class TestDamage:
    def test_corrupt_line(self, probe_file):
        """A line that is not JSON: error naming the file and line 2."""
        text = lines(probe_file)
        text[1] = text[1][:40] + "#" + text[1][41:]
        probe_file.write_text("\n".join(text) + "\n", encoding="utf-8")
        with pytest.raises(ProbeFileError, match=r"probes\.jsonl line 2: not valid JSON"):
            read_probes(probe_file)

    def test_partial_last_line(self, probe_file):
        """A last line cut off mid-write: error naming the line; repair cuts only that."""
        raw = probe_file.read_bytes()
        torn = json.dumps(json.loads(lines(probe_file)[1]))[:30]
        probe_file.write_bytes(raw + torn.encode())
        with pytest.raises(ProbeFileError, match=r"line 4: incomplete last line \(30 bytes"):
            read_probes(probe_file)
        assert repair_torn_tail(probe_file) == torn.encode()
        assert probe_file.read_bytes() == raw
        assert len(read_probes(probe_file).records) == 2
        assert repair_torn_tail(probe_file) == b""

    def test_invalid_record_field(self, probe_file):
        """A record missing a field: error naming the line and the field."""
        text = lines(probe_file)
        obj = json.loads(text[2])
        del obj["status"]
        text[2] = json.dumps(obj)
        probe_file.write_text("\n".join(text) + "\n", encoding="utf-8")
        with pytest.raises(
            ProbeFileError, match="line 3: invalid probe record: status: Field required"
        ):
            read_probes(probe_file)

    def test_ok_record_without_total(self, probe_file):
        """An ok record whose timers lost the total is not read as a success."""
        text = lines(probe_file)
        obj = json.loads(text[1])
        del obj["timers"]["total"]
        text[1] = json.dumps(obj)
        probe_file.write_text("\n".join(text) + "\n", encoding="utf-8")
        with pytest.raises(ProbeFileError, match=r"line 2: .*measured total"):
            read_probes(probe_file)

    @pytest.mark.parametrize(
        ("mutate", "message"),
        [
            (lambda t: [t[1], *t], "first line must be the header"),
            (lambda t: [*t, t[0]], "line 4: expected a probe record, got type 'header'"),
            (lambda t: [t[0], "", *t[1:]], "line 2: blank line"),
            (lambda t: [*t, "[1, 2]"], "line 4: expected a JSON object"),
            (lambda t: [*t, '{"type": "note"}'], "line 4: expected a probe record"),
        ],
    )
    def test_structure(self, probe_file, mutate, message):
        """Header misplaced or repeated, blank lines, non-objects, unknown types: errors."""
        probe_file.write_text("\n".join(mutate(lines(probe_file))) + "\n", encoding="utf-8")
        with pytest.raises(ProbeFileError, match=message):
            read_probes(probe_file)

    def test_unknown_probe_id(self, probe_file):
        """A record for a probe the plan does not have is an error."""
        ProbeWriter(probe_file, PLAN, ENGINE).append(ok("image/999x999/r0"))
        with pytest.raises(ProbeFileError, match="line 4: probe 'image/999x999/r0' is not in"):
            read_probes(probe_file)

    def test_edited_header(self, probe_file):
        """A header whose plan was edited no longer matches its digest."""
        text = lines(probe_file)
        obj = json.loads(text[0])
        obj["plan"]["repeats"] = 9
        text[0] = json.dumps(obj)
        probe_file.write_text("\n".join(text) + "\n", encoding="utf-8")
        with pytest.raises(ProbeFileError, match=r"line 1: invalid header: .*edited"):
            read_probes(probe_file)

    def test_empty_and_missing(self, tmp_path):
        """An empty or missing file is an error, not an empty run."""
        empty = tmp_path / "e.jsonl"
        empty.write_bytes(b"")
        with pytest.raises(ProbeFileError, match="empty probe file"):
            read_probes(empty)
        with pytest.raises(ProbeFileError, match="cannot read probe file"):
            read_probes(tmp_path / "none.jsonl")
