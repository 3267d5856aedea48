"""``modtrace attribute``: the documented contract, driven in-process and as a real command."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from modtrace.cli import main

SEED_ARGS = [
    "attribute",
    "--unit",
    "text.tokens=600",
    "--unit",
    "image.tiles=8",
    "--unit",
    "audio.seconds=20",
    "--weight",
    "text.tokens=0.0008",
    "--weight",
    "image.tiles=0.012",
    "--weight",
    "audio.seconds=0.05",
    "--measured",
    "1.70",
    "--usd-per-gpu-hour",
    "2.00",
]


def run_json(capsys, *extra: str) -> dict:
    assert main([*SEED_ARGS, *extra, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_seed_example_json(capsys):
    """The seed's worked example through the command: the documented keys and values."""
    out = run_json(capsys)
    assert out["method"] == "weights"
    assert round(out["factor"], 3) == 1.079
    assert out["predicted_gpu_seconds"] == pytest.approx(1.576)
    assert out["measured_gpu_seconds"] == 1.70
    assert {m: round(s, 2) for m, s in out["gpu_seconds"].items()} == {
        "text": 0.52,
        "image": 0.10,
        "audio": 1.08,
    }
    assert sum(out["share"].values()) == pytest.approx(1.0)
    assert round(out["usd_total"], 5) == 0.00094
    assert set(out["usd"]) == {"text", "image", "audio"}
    assert out["hypothetical"] is True
    assert out["calibration_version"] == "adhoc"


def test_seed_example_factor_110(capsys):
    """Predicted 1.40 against measured 1.54 gives factor 1.10 through the command."""
    assert (
        main(
            [
                "attribute",
                "--unit",
                "text.tokens=1000",
                "--unit",
                "image.tiles=40",
                "--weight",
                "text.tokens=0.001",
                "--weight",
                "image.tiles=0.01",
                "--measured",
                "1.54",
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["factor"] == pytest.approx(1.10)
    assert out["usd"] is None


def test_table_output(capsys):
    """Without --json a readable table names each modality and the hypothetical total."""
    assert main(SEED_ARGS) == 0
    text = capsys.readouterr().out
    for word in ("text", "image", "audio", "factor 1.0787", "hypothetical"):
        assert word in text


def test_components_and_calibration_file(tmp_path, capsys):
    """Timers select the components method; a calibration file supplies the version."""
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"version": "v7", "weights": {"text.tokens": 0.001}}))
    assert (
        main(
            [
                "attribute",
                "--unit",
                "text.tokens=100",
                "--unit",
                "image.tokens=100",
                "--timer",
                "vision_encoder=0.5",
                "--timer",
                "prefill=0.5",
                "--measured",
                "1.0",
                "--calibration",
                str(cal),
                "--json",
            ]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "components"
    assert out["calibration_version"] == "v7"
    assert out["gpu_seconds"] == pytest.approx({"text": 0.25, "image": 0.75})


def test_unreconciled_without_measured(capsys):
    """No --measured: method unreconciled, factor 1."""
    assert (
        main(["attribute", "--unit", "text.tokens=10", "--weight", "text.tokens=0.1", "--json"])
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert (out["method"], out["factor"]) == ("unreconciled", 1.0)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--unit", "text.tokens=-5"], "text.tokens"),
        (["--unit", "text.tokens=abc"], "not a number"),
        (["--unit", "pixels"], "NAME=NUMBER"),
        (["--unit", "image.tyles=3"], "unknown unit"),
        (["--measured", "-1"], "total"),
        (["--timer", "gpu=1"], "unknown component"),
        (["--calibration", "/nonexistent/cal.json"], "cannot read calibration"),
    ],
)
def test_bad_input_one_line(capsys, args, needle):
    """Bad input exits non-zero with one line naming the problem."""
    assert main(["attribute", "--unit", "text.tokens=1", *args]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert needle in err


def test_calibration_missing_field(tmp_path, capsys):
    """A calibration file without a version is rejected with the field's name."""
    cal = tmp_path / "cal.json"
    cal.write_text(json.dumps({"weights": {"text.tokens": 0.001}}))
    assert main(["attribute", "--unit", "text.tokens=1", "--calibration", str(cal)]) == 2
    assert "version" in capsys.readouterr().err


def test_help_lists_every_option():
    """`modtrace attribute --help` explains every option; `modtrace --help` lists commands."""
    out = subprocess.run(
        [sys.executable, "-m", "modtrace", "attribute", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for option in (
        "--unit",
        "--weight",
        "--calibration",
        "--measured",
        "--timer",
        "--usd-per-gpu-hour",
        "--rate-id",
        "--outlier-band",
        "--json",
    ):
        assert option in out
    top = subprocess.run(
        [sys.executable, "-m", "modtrace", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "attribute" in top
