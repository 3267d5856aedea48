"""The runner: every probe counted, sent and recorded; resumable; failures recorded, never lost."""

from __future__ import annotations

import io
from types import SimpleNamespace

import pytest

from modtrace.calibrate.fit import FitError, fit_probe_file
from modtrace.calibrate.plan import AudioItem, ImageItem, ProbePlan, VideoItem, default_count_fn
from modtrace.calibrate.probes import ProbeFileError, read_probes
from modtrace.calibrate.runner import Engine, engine_info, run_plan
from modtrace.calibrate.simulated import SimulatedCost, SimulatedEngine
from modtrace.timers import GpuTimers
from modtrace.units import UnitCounts

PLAN = ProbePlan(
    profile="qwen2.5-omni",
    repeats=2,
    warmup=1,
    text_words=(8, 200, 800),
    images=(
        ImageItem(width=224, height=224),
        ImageItem(width=640, height=480, format="jpeg"),
        ImageItem(width=1024, height=768),
    ),
    audios=(AudioItem(seconds=1), AudioItem(seconds=3), AudioItem(seconds=6)),
    videos=(
        VideoItem(seconds=1, fps=4, width=160, height=120),
        VideoItem(seconds=3, fps=4, width=160, height=120),
        VideoItem(seconds=5, fps=4, width=160, height=120),
    ),
)


@pytest.fixture
def count():
    """The real counter of the plan's profile."""
    return default_count_fn(PLAN)


def fake_count(units: dict[str, float], errors: list[str] | None = None):
    """A count function returning fixed units (for engines that fail on purpose)."""

    def count(body, headers):
        return SimpleNamespace(units=UnitCounts(units), counters={}, errors=errors or [])

    return count


class TestSimulatedRun:
    def test_end_to_end(self, tmp_path, count):
        """Every probe is counted by the real profile, measured, and fitted back."""
        engine = SimulatedEngine(count, SimulatedCost(noise=0.01), seed=2)
        path = tmp_path / "probes.jsonl"
        summary = run_plan(PLAN, engine, path, count=count, progress="none")
        assert (summary.sent, summary.ok, summary.failed) == (len(PLAN.probes()), summary.sent, 0)
        pf = read_probes(path)
        assert pf.header.engine.simulated and pf.header.engine.name == "simulated"
        assert [r.id for r in pf.records] == [s.id for s in PLAN.probes()]
        audio = next(r for r in pf.records if r.id == "audio/3s/r0")
        assert audio.units["audio.seconds"] == 3.0
        assert audio.counters["audio"].startswith("qwen2.5-omni")
        assert audio.timers.audio_encoder > 0 and audio.timers.source == "simulated"
        fit = fit_probe_file(pf)
        assert {m: c.unit for m, c in fit.choices.items()} == {
            "image": "image.tokens",
            "audio": "audio.tokens",
            "video": "video.tokens",
        }
        # The cost model per chosen unit: prefill per token, plus the audio encoder's
        # per-second cost spread over the tokens of a second (a fixed ratio per profile).
        terms = engine.cost.marginal_weights()
        per_second = audio.units["audio.seconds"] / audio.units["audio.tokens"]
        truth = {
            "text.tokens": terms["text.tokens"],
            "image.tokens": terms["image.tokens"],
            "audio.tokens": terms["audio.tokens"] + terms["audio.seconds"] * per_second,
            "video.tokens": terms["video.tokens"],
        }
        for unit, est in fit.weights.items():
            assert est.value == pytest.approx(truth[unit], rel=0.05), unit
        assert set(fit.excluded) == {"warmup", "holdout"}

    def test_resume_skips_recorded(self, tmp_path, count):
        """A run stopped after 5 probes resumes with the rest; no probe is sent twice."""
        engine = SimulatedEngine(count)
        path = tmp_path / "probes.jsonl"
        first = run_plan(PLAN, engine, path, count=count, limit=5, progress="none")
        assert first.sent == 5
        second = run_plan(PLAN, engine, path, count=count, progress="none")
        assert second.skipped == 5 and second.sent == len(PLAN.probes()) - 5
        ids = [r.id for r in read_probes(path).records]
        assert len(ids) == len(set(ids)) == len(PLAN.probes())
        third = run_plan(PLAN, engine, path, count=count, progress="none")
        assert third.sent == 0

    def test_torn_line_repaired_and_resent(self, tmp_path, count):
        """After a torn write, --repair cuts the partial line and that probe is sent again."""
        engine = SimulatedEngine(count)
        path = tmp_path / "probes.jsonl"
        run_plan(PLAN, engine, path, count=count, limit=3, progress="none")
        data = path.read_bytes()
        last_start = data.rstrip(b"\n").rfind(b"\n") + 1
        path.write_bytes(data[: last_start + 25])  # the last record, torn
        with pytest.raises(ProbeFileError, match="incomplete last line"):
            run_plan(PLAN, engine, path, count=count, progress="none")
        summary = run_plan(PLAN, engine, path, count=count, repair=True, limit=1, progress="none")
        assert summary.repaired == 25 and summary.skipped == 2
        assert [r.id for r in read_probes(path).records] == [s.id for s in PLAN.probes()[:3]]


class TestFailures:
    def test_engine_failure_recorded(self, tmp_path, count):
        """An engine that raises: the probe is recorded failed with the reason; the fit refuses."""
        engine = SimulatedEngine(count, fail_every=7)
        path = tmp_path / "probes.jsonl"
        summary = run_plan(PLAN, engine, path, count=count, progress="none")
        assert summary.failed == len(PLAN.probes()) // 7
        assert summary.ok + summary.failed == summary.sent == len(PLAN.probes())
        pf = read_probes(path)
        failures = pf.failures()
        assert len(failures) == summary.failed
        assert failures[0].error.startswith("engine: RuntimeError: simulated failure")
        assert failures[0].units.root  # counted before sending
        measured_failures = [f for f in failures if f.kind == "probe"]
        if measured_failures:
            with pytest.raises(FitError, match="failed"):
                fit_probe_file(pf)

    def test_retry_failed(self, tmp_path, count):
        """Failed probes are skipped on resume unless retried; a retry supersedes the failure."""
        path = tmp_path / "probes.jsonl"
        run_plan(PLAN, SimulatedEngine(count, fail_every=5), path, count=count, progress="none")
        n_failed = len(read_probes(path).failures())
        assert n_failed > 0
        again = run_plan(PLAN, SimulatedEngine(count), path, count=count, progress="none")
        assert again.sent == 0
        retried = run_plan(
            PLAN, SimulatedEngine(count), path, count=count, retry_failed=True, progress="none"
        )
        assert retried.sent == retried.ok == n_failed
        pf = read_probes(path)
        assert pf.failures() == [] and len(pf.superseded()) == n_failed
        fit = fit_probe_file(pf)
        assert len(fit.excluded.get("superseded", [])) == n_failed

    def test_counting_errors_fail_without_sending(self, tmp_path):
        """A probe whose counting reports an error is recorded failed; the engine is not called."""
        calls = []

        def engine(body, headers):
            calls.append(body)
            return GpuTimers(total=1.0)

        summary = run_plan(
            PLAN,
            engine,
            tmp_path / "p.jsonl",
            count=fake_count({"text.tokens": 5}, ["image #0: not an image"]),
            limit=3,
            progress="none",
        )
        assert summary.failed == 3 and calls == []
        record = read_probes(tmp_path / "p.jsonl").records[0]
        assert record.error == "counting: image #0: not an image"

    def test_missing_modality_units(self, tmp_path):
        """An image probe counted without image units is a failure, not a text probe."""
        plan = PLAN.model_copy(update={"modalities": ("text", "image"), "shuffle": False})
        summary = run_plan(
            plan,
            lambda body, headers: GpuTimers(total=1.0),
            tmp_path / "p.jsonl",
            count=fake_count({"text.tokens": 5}),
            progress="none",
        )
        failures = dict(summary.failures)
        assert failures["image/224x224/r0"] == "counting: no image units counted"
        assert "text/8w/r0" not in failures

    def test_no_total_and_bad_timers(self, tmp_path):
        """Timers without a total, or invalid timers, are recorded failures with the reason."""
        replies = iter([GpuTimers(prefill=0.1), {"total": -1}, {"total": 0.2, "prefill": 0.1}])

        def engine(body, headers):
            return next(replies)

        summary = run_plan(
            PLAN,
            engine,
            tmp_path / "p.jsonl",
            count=fake_count({"text.tokens": 5, "image.tokens": 5, "audio.tokens": 5,
                              "video.tokens": 5}),
            limit=3,
            progress="none",
        )  # fmt: skip
        reasons = [reason for _, reason in summary.failures]
        assert reasons[0] == "engine: no measured total in the timers"
        assert reasons[1] == "engine: invalid timers: timers.total: must not be negative, got -1"
        assert summary.ok == 1


def run_two(tmp_path, progress: str, stream: io.StringIO):
    """The first two probes of PLAN on a constant engine, with ``progress`` on ``stream``."""
    units = {"text.tokens": 5, "image.tokens": 5, "audio.tokens": 5, "video.tokens": 5}
    return run_plan(
        PLAN,
        lambda body, headers: GpuTimers(total=0.1),
        tmp_path / "p.jsonl",
        count=fake_count(units),
        limit=2,
        progress=progress,
        stream=stream,
    )


class TestProgressAndEngine:
    def test_plain_progress(self, tmp_path):
        """The plain counter prints one line per probe to the stream."""
        out = io.StringIO()
        run_two(tmp_path, "plain", out)
        assert out.getvalue().splitlines()[0] == f"[1/2] {PLAN.probes()[0].id} ok"

    def test_rich_progress(self, tmp_path):
        """The rich bar runs to completion on any stream."""
        pytest.importorskip("rich")
        out = io.StringIO()
        summary = run_two(tmp_path, "rich", out)
        assert summary.ok == 2
        assert "100%" in out.getvalue() and PLAN.probes()[1].id in out.getvalue()

    def test_engine_protocol_and_info(self, count):
        """The simulated engine is an Engine and says it is simulated; a plain function is named."""
        engine = SimulatedEngine(count)
        assert isinstance(engine, Engine)
        assert engine_info(engine).simulated is True

        def my_engine(body, headers):
            return GpuTimers(total=1.0)

        assert engine_info(my_engine).name == "my_engine"
        assert engine_info(my_engine).simulated is False

    def test_simulated_is_deterministic(self, count):
        """The same request costs the same; the cost model's weights are validated."""
        engine = SimulatedEngine(count, seed=1)
        body = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 1}
        assert engine(body, {}) == engine(body, {})
        assert SimulatedEngine(count, seed=2)(body, {}) != engine(body, {})
        with pytest.raises(ValueError, match="text has no encoder"):
            SimulatedCost(encoders={"text.tokens": 1e-4})
        with pytest.raises(ValueError, match="unknown unit"):
            SimulatedCost(encoders={"image.tile": 1e-4})
