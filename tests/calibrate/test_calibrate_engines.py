"""Probe engines: the reference engine in-process and over HTTP; HTTP failures as failed probes."""

from __future__ import annotations

import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import ClassVar

import pytest

pytest.importorskip("torch")
pytest.importorskip("soundfile")
pytest.importorskip("uvicorn")
pytest.importorskip("tokenizers")

from modtrace.calibrate.engines import (
    REFERENCE_CAVEAT,
    EngineRequestError,
    HttpEngine,
    ReferenceProbeEngine,
    chat_completions_url,
    reference_counting,
    write_byte_tokenizer,
)
from modtrace.calibrate.fit import fit_probe_file
from modtrace.calibrate.plan import (
    AudioItem,
    ImageItem,
    MixedRequest,
    ProbePlan,
    VideoItem,
    build_request,
)
from modtrace.calibrate.probes import read_probes
from modtrace.calibrate.runner import run_plan
from modtrace.calibrate.store import calibration_from_fit
from modtrace.calibrate.validate import validate_holdout
from modtrace.counting.counter import CountingConfig, RequestCounter
from modtrace.engine.reference import FAULT_HEADER, EngineConfig, ReferenceEngine, start_server

MODEL = EngineConfig().model_name
COMPONENTS = ("vision_encoder", "audio_encoder", "prefill", "decode")


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """The byte-level tokenizer.json of the reference engine's text."""
    return write_byte_tokenizer(tmp_path_factory.mktemp("tok") / "tokenizer.json")


@pytest.fixture(scope="module")
def reference():
    """One reference engine (fault injection on), served over HTTP too."""
    engine = ReferenceEngine(EngineConfig(threads=1, allow_fault_injection=True))
    server = start_server(engine)
    yield SimpleNamespace(engine=engine, server=server, url=server.url)
    server.stop()


def small_plan(tokenizer, **fields) -> ProbePlan:
    """A few probes whose costs clearly grow with size, and one held-out mixed request."""
    defaults = {
        "profile": "qwen2.5-omni",
        "model": MODEL,
        "counting": reference_counting(tokenizer),
        "modalities": ("text", "image", "audio"),
        # Sizes far apart and 3 repeats: CPU timings on a busy machine are noisy, and the
        # audio encoder is cheap.
        "repeats": 3,
        "warmup": 1,
        "text_words": (16, 400),
        "images": (ImageItem(width=224, height=224), ImageItem(width=1024, height=1024)),
        "audios": (AudioItem(seconds=1), AudioItem(seconds=30)),
        "holdout": (
            MixedRequest(
                name="text+image+audio",
                text_words=64,
                images=(ImageItem(width=448, height=448, format="jpeg"),),
                audios=(AudioItem(seconds=5),),
            ),
        ),
    }
    return ProbePlan(**{**defaults, **fields})


class TestReferenceCounting:
    def test_text_units_are_the_engines_tokens(self, reference, tokenizer):
        """Counted text tokens = the engine's prompt tokens minus placeholders and their markers."""
        plan = small_plan(tokenizer, text_words=(3, 50), prompt_words=2, repeats=1, warmup=0)
        counter = RequestCounter(
            CountingConfig.model_validate({**plan.counting, "profile": plan.profile})
        )
        checked = 0
        for spec in plan.probes():
            request = build_request(spec, plan)
            body = request.body
            if spec.modality == "text":
                # Non-ASCII text: one token per UTF-8 byte, not per character.
                body = {**body, "messages": [{"role": "user", "content": "héllo wörld ✓ " * 7}]}
            usage = reference.engine.complete(body).response["usage"]
            details = usage["prompt_tokens_details"]
            items = len(spec.images) + len(spec.audios)
            engine_text = (
                usage["prompt_tokens"]
                - details.get("image_tokens", 0)
                - details.get("audio_tokens", 0)
                - 2 * items  # <|vision_bos|>/<|vision_eos|>, <|audio_bos|>/<|audio_eos|>
            )
            assert counter.count(body).units["text.tokens"] == engine_text, spec.id
            checked += 1
        assert checked == len(plan.probes())


class TestReferenceProbeEngine:
    def test_small_plan_end_to_end(self, reference, tokenizer, tmp_path):
        """Plan, run, fit and validate in-process: the path of the acceptance run, kept alive."""
        plan = small_plan(tokenizer)
        path = tmp_path / "probes.jsonl"
        probe_engine = ReferenceProbeEngine(reference.engine)
        summary = run_plan(plan, probe_engine, path, progress="none")
        assert (summary.sent, summary.ok, summary.failed) == (len(plan.probes()), summary.sent, 0)
        probes = read_probes(path)
        info = probes.header.engine
        assert info.model == MODEL and not info.simulated and "CPU" in info.name
        assert info.caveats == [REFERENCE_CAVEAT] and info.gpu is None
        assert info.details["timer_source"] == "wall_clock"
        for record in probes.records:
            timers = record.timers
            parts = [getattr(timers, c) or 0.0 for c in COMPONENTS]
            assert timers.source == "step_ledger"
            assert math.isclose(sum(parts), timers.total, rel_tol=1e-9, abs_tol=1e-9)
            carried = {m for m in ("image", "audio") if record.units[f"{m}.count"] > 0}
            assert (timers.vision_encoder is not None) == ("image" in carried), record.id
            assert (timers.audio_encoder is not None) == ("audio" in carried), record.id
        fit = fit_probe_file(probes)
        assert set(fit.weights) == {"text.tokens", "image.tokens", "audio.tokens"}
        assert all(w.value > 0 for w in fit.weights.values())
        record = calibration_from_fit(fit, probes)
        assert REFERENCE_CAVEAT in record.notes and record.model == MODEL
        assert record.engine == info.name and record.driver.startswith("none: CPU")
        holdout = validate_holdout(record, probes.records)
        assert len(holdout.rows) == 3 and not holdout.without_components
        for row in holdout.rows:
            assert set(row.by_components) == {"text", "image", "audio"}
            assert all(0 <= e <= 100 for e in row.error_pp.values())
        assert set(holdout.per_modality) == {"text", "image", "audio"}

    @pytest.mark.parametrize(
        ("fields", "message"),
        [
            ({"model": "qwen2.5-omni"}, "--model reference-qwen2.5-omni-tiny"),
            ({"profile": "qwen2.5-vl"}, "--profile qwen2.5-omni"),
            ({"modalities": ("text", "video")}, "no video"),
        ],
    )
    def test_check_plan_refuses(self, reference, tokenizer, fields, message):
        """A plan the reference engine cannot run as planned is refused before sending."""
        with pytest.raises(ValueError, match=message):
            ReferenceProbeEngine(reference.engine).check_plan(small_plan(tokenizer, **fields))

    def test_refused_request_is_a_failed_probe(self, reference, tokenizer, tmp_path):
        """A request the engine refuses (video: 400) is recorded as failed, with the reason."""
        plan = small_plan(
            tokenizer,
            modalities=("text", "video"),
            videos=(VideoItem(seconds=1, fps=2, width=64, height=64),),
            text_words=(8,),
            repeats=1,
            warmup=0,
            holdout=(),
        )
        path = tmp_path / "probes.jsonl"
        summary = run_plan(plan, ReferenceProbeEngine(reference.engine), path, progress="none")
        assert summary.failed == 1 and summary.ok == 1
        (failed,) = read_probes(path).failures()
        assert failed.modality == "video"
        assert failed.error.startswith("engine: EngineRequestError: HTTP 400")


class TestHttpEngine:
    def test_plan_over_http(self, reference, tokenizer, tmp_path):
        """The same plan POSTed to the reference server: timers read from the response headers."""
        plan = small_plan(tokenizer, repeats=1, holdout=())
        path = tmp_path / "probes.jsonl"
        engine = HttpEngine(reference.url + "/v1", name="reference over http", gpu="none")
        summary = run_plan(plan, engine, path, progress="none")
        assert summary.ok == len(plan.probes()) and summary.failed == 0
        probes = read_probes(path)
        assert probes.header.engine.name == "reference over http"
        assert probes.header.engine.details["url"] == reference.url + "/v1/chat/completions"
        for record in probes.records:
            assert record.timers.source == "step_ledger" and record.timers.total > 0
            assert record.timers.prefill > 0

    def test_engine_failure_is_a_failed_probe(self, reference, tokenizer, tmp_path):
        """A 500 from the engine is a failed probe naming the status and the engine's message."""
        plan = small_plan(tokenizer, repeats=1, holdout=())
        engine = HttpEngine(reference.url, headers={FAULT_HEADER: "prefill"})
        summary = run_plan(plan, engine, tmp_path / "p.jsonl", limit=2, progress="none")
        assert summary.failed == 2 and summary.ok == 0
        for _, reason in summary.failures:
            assert reason.startswith("engine: EngineRequestError: HTTP 500")
            assert "injected fault" in reason

    @pytest.mark.parametrize(
        ("url", "endpoint"),
        [
            ("http://h:8000", "http://h:8000/v1/chat/completions"),
            ("http://h:8000/", "http://h:8000/v1/chat/completions"),
            ("https://h/v1", "https://h/v1/chat/completions"),
            ("http://h/v1/chat/completions", "http://h/v1/chat/completions"),
        ],
    )
    def test_url_forms(self, url, endpoint):
        """A server, its /v1 base or the full endpoint all name the chat completions URL."""
        assert chat_completions_url(url) == endpoint

    @pytest.mark.parametrize("url", ["localhost:8000", "ftp://h", "http://"])
    def test_bad_url(self, url):
        """Anything but an http(s) URL is refused."""
        with pytest.raises(ValueError, match="expected http"):
            HttpEngine(url)


# --- A scripted HTTP server for the failure modes ----------------------------------------------
COMPLETION = json.dumps({"object": "chat.completion", "choices": [{"index": 0}]}).encode()
TIMERS = [("x-modtrace-gpu-seconds", "0.25"), ("x-modtrace-gpu-seconds-prefill", "0.2")]


class Scripted(BaseHTTPRequestHandler):
    """Answers each POST with the reply scripted for its path; records what it received."""

    replies: ClassVar[dict[str, tuple[int, list[tuple[str, str]], bytes, float]]] = {}
    received: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        length = int(self.headers.get("content-length", 0))
        body = json.loads(self.rfile.read(length))
        # self.headers is case-insensitive, as HTTP header names are.
        Scripted.received.append({"path": self.path, "headers": self.headers, "body": body})
        status, headers, payload, delay = Scripted.replies[self.path.split("/v1")[0]]
        time.sleep(delay)
        try:
            self.send_response(status)
            for name, value in headers:
                self.send_header(name, value)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up (the timeout test)

    def log_message(self, *args: object) -> None:
        """Quiet."""


@pytest.fixture(scope="module")
def scripted():
    """A local HTTP server; each test scripts replies by path prefix."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    Scripted.replies = {
        "/ok": (200, [("content-type", "application/json"), *TIMERS], COMPLETION, 0.0),
        "/no-timers": (200, [("content-type", "application/json")], COMPLETION, 0.0),
        "/bad-timers": (
            200,
            [("x-modtrace-gpu-seconds", "0.1"), ("x-modtrace-gpu-seconds-prefill", "0.5")],
            COMPLETION,
            0.0,
        ),
        "/not-json": (200, TIMERS, b"<html>gateway</html>", 0.0),
        "/not-chat": (200, TIMERS, b'{"data": []}', 0.0),
        "/error": (
            404,
            [("content-type", "application/json")],
            b'{"error": {"message": "The model `x` does not exist.", "type": "NotFoundError"}}',
            0.0,
        ),
        "/slow": (200, TIMERS, COMPLETION, 2.0),
    }
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}


class TestHttpFailures:
    def test_timers_and_headers_sent(self, scripted):
        """Timers come from the headers; the probe's and the caller's headers are sent, not kept."""
        engine = HttpEngine(scripted + "/ok", headers={"Authorization": "Bearer s3cret"})
        timers = engine(BODY, {"x-llm-d-video-fps": "2"})
        assert (timers.total, timers.prefill) == (0.25, 0.2)
        sent = Scripted.received[-1]
        assert sent["path"] == "/ok/v1/chat/completions" and sent["body"] == BODY
        assert sent["headers"]["Authorization"] == "Bearer s3cret"
        assert sent["headers"]["x-llm-d-video-fps"] == "2"
        assert sent["headers"]["Content-Type"] == "application/json"
        assert "s3cret" not in engine.info.model_dump_json()

    @pytest.mark.parametrize(
        ("path", "message"),
        [
            ("/no-timers", "no GPU timers from the engine: no x-modtrace-gpu-seconds headers"),
            ("/bad-timers", "no GPU timers from the engine: engine timers:"),
            ("/not-json", "the response is not JSON: <html>gateway</html>"),
            ("/not-chat", "the response is not a chat completion"),
            ("/error", r"HTTP 404 from .*: The model `x` does not exist\."),
        ],
    )
    def test_bad_reply_raises(self, scripted, path, message):
        """A reply without a completion and valid timers is an error saying why."""
        with pytest.raises(EngineRequestError, match=message):
            HttpEngine(scripted + path)(BODY, {})

    def test_timeout(self, scripted):
        """A response slower than the timeout is an error, not a hang."""
        with pytest.raises(EngineRequestError, match=r"cannot reach .*timed out"):
            HttpEngine(scripted + "/slow", timeout=0.2)(BODY, {})

    def test_unreachable(self):
        """A closed port is an error naming the endpoint."""
        probe = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
        port = probe.server_address[1]
        probe.server_close()
        with pytest.raises(EngineRequestError, match=f"cannot reach http://127.0.0.1:{port}/v1"):
            HttpEngine(f"http://127.0.0.1:{port}", timeout=5)(BODY, {})
