"""``modtrace calibrate plan --reference-engine`` and ``run --engine reference|URL``, in-process."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("soundfile")
pytest.importorskip("uvicorn")
pytest.importorskip("tokenizers")

from modtrace.calibrate.engines import REFERENCE_CAVEAT
from modtrace.calibrate.plan import load_plan
from modtrace.calibrate.probes import read_probes
from modtrace.cli.calibrate import REFERENCE_TEXT_WORDS
from modtrace.engine.reference import EngineConfig, start_server

MODEL = EngineConfig().model_name
#: A plan of a few cheap probes (no held-out requests), for the reference engine.
TINY = [
    "--profile",
    "qwen2.5-omni",
    "--reference-engine",
    "--repeats",
    "1",
    "--warmup",
    "0",
    "--no-holdout",
    "--text-words",
    "8,64",
    "--image-size",
    "224x224",
    "--image-size",
    "448x448",
    "--audio-seconds",
    "1,2",
]


@pytest.fixture(scope="module")
def server():
    """The reference engine served over HTTP."""
    running = start_server(config=EngineConfig(threads=1))
    yield running
    running.stop()


def tiny_plan(cli, tmp_path, *extra: str):
    """Write the tiny reference plan; return its path."""
    path = tmp_path / "plan.json"
    assert cli(["calibrate", "plan", *TINY, *extra, "-o", str(path)]) == 0
    return path


def test_plan_for_the_reference_engine(cli, tmp_path, capsys):
    """--reference-engine: its model, no video, byte-level text counting, its text sizes."""
    out = tmp_path / "plan.json"
    assert (
        cli(
            ["calibrate", "plan", "--profile", "qwen2.5-omni", "--reference-engine", "-o", str(out)]
        )
        == 0
    )
    plan = load_plan(out)
    assert plan.model == MODEL and plan.modalities == ("text", "image", "audio")
    assert plan.text_words == REFERENCE_TEXT_WORDS
    text = plan.counting["text"]
    assert text["kind"] == "hf" and text["tokenizer_json"] == str(tmp_path / "plan.tokenizer.json")
    assert (tmp_path / "plan.tokenizer.json").exists()
    assert "byte-level tokenizer" in capsys.readouterr().err
    assert load_plan(tiny_plan(cli, tmp_path)).text_words == (8, 64)


def test_run_reference(cli, tmp_path, capsys):
    """run --engine reference: every probe measured in-process, the CPU caveat said and kept."""
    plan = tiny_plan(cli, tmp_path)
    probes = tmp_path / "probes.jsonl"
    capsys.readouterr()
    args = ["calibrate", "run", str(plan), "-o", str(probes), "--engine", "reference"]
    assert cli([*args, "--progress", "none"]) == 0
    captured = capsys.readouterr()
    assert "CPU seconds stand in for GPU seconds" in captured.err
    assert "6 sent (6 ok, 0 failed)" in captured.out
    read = read_probes(probes)
    assert read.header.engine.caveats == [REFERENCE_CAVEAT]
    assert {r.status for r in read.records} == {"ok"}
    assert {r.timers.source for r in read.records} == {"step_ledger"}


def test_run_reference_refuses_video(cli, tmp_path, capsys):
    """A plan with video cannot run on the reference engine: refused before anything is sent."""
    plan = tiny_plan(cli, tmp_path, "--modality", "text", "--modality", "video")
    probes = tmp_path / "probes.jsonl"
    args = ["calibrate", "run", str(plan), "-o", str(probes), "--engine", "reference"]
    assert cli(args) == 2
    assert "no video" in capsys.readouterr().err
    assert not probes.exists()


def test_run_url(cli, tmp_path, capsys, server):
    """run --engine URL: probes POSTed, timers from the headers, the engine described as told."""
    plan = tiny_plan(cli, tmp_path)
    probes = tmp_path / "probes.jsonl"
    args = ["calibrate", "run", str(plan), "-o", str(probes), "--engine", server.url]
    described = ["--engine-name", "reference-http 1", "--driver", "none", "--gpu", "cpu"]
    auth = ["--header", "Authorization: Bearer s3cret"]
    assert cli([*args, *described, *auth, "--progress", "none"]) == 0
    read = read_probes(probes)
    info = read.header.engine
    assert (info.name, info.driver, info.gpu) == ("reference-http 1", "none", "cpu")
    assert info.details["url"] == server.url + "/v1/chat/completions"
    assert "s3cret" not in json.dumps(info.model_dump())
    assert len(read.records) == 6 and {r.status for r in read.records} == {"ok"}


def test_run_url_unreachable(cli, tmp_path, capsys):
    """Every probe to an endpoint that does not answer is recorded failed; exit 1."""
    plan = tiny_plan(cli, tmp_path)
    probes = tmp_path / "probes.jsonl"
    args = ["calibrate", "run", str(plan), "-o", str(probes), "--engine", "http://127.0.0.1:9"]
    assert cli([*args, "--timeout", "5", "--limit", "2", "--progress", "none"]) == 1
    out = capsys.readouterr().out
    assert out.count("cannot reach http://127.0.0.1:9/v1/chat/completions") == 2
    assert [r.status for r in read_probes(probes).records] == ["failed", "failed"]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--engine", "gpu-box"], "unknown engine"),
        (["--engine", "http://127.0.0.1:9", "--header", "no-colon"], "expected NAME:VALUE"),
        (["--engine", "reference", "--threads", "0"], "--threads"),
    ],
)
def test_run_bad_engine_options(cli, tmp_path, capsys, extra, message):
    """Bad engine options are one-line errors, exit 2."""
    plan = tiny_plan(cli, tmp_path)
    capsys.readouterr()
    assert cli(["calibrate", "run", str(plan), "-o", str(tmp_path / "p.jsonl"), *extra]) == 2
    assert message in capsys.readouterr().err
