"""``modtrace calibrate``: every action driven in-process, end to end on the simulated engine."""

from __future__ import annotations

import json

import pytest

ACTIONS = ("plan", "run", "fit", "list", "show", "diff")
SMALL_PLAN = [
    "--profile",
    "qwen2.5-omni",
    "--repeats",
    "2",
    "--warmup",
    "1",
    "--text-words",
    "8,200,800",
    "--image-size",
    "224x224",
    "--image-size",
    "640x480:jpeg",
    "--image-size",
    "1024x768",
    "--audio-seconds",
    "1,3,6",
    "--video",
    "1:4:160x120",
    "--video",
    "3:4:160x120",
    "--video",
    "5:4:160x120",
]


@pytest.fixture
def workflow(tmp_path, cli, capsys):
    """A plan run on the simulated engine: (directory, plan path, probes path)."""
    plan, probes = tmp_path / "plan.json", tmp_path / "probes.jsonl"
    assert cli(["calibrate", "plan", *SMALL_PLAN, "-o", str(plan)]) == 0
    args = ["calibrate", "run", str(plan), "-o", str(probes), "--engine", "simulated"]
    assert cli([*args, "--progress", "none"]) == 0
    capsys.readouterr()
    return tmp_path, plan, probes


@pytest.mark.parametrize("action", ACTIONS)
def test_help(cli, capsys, action):
    """Each action has --help."""
    with pytest.raises(SystemExit) as exc:
        cli(["calibrate", action, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: modtrace calibrate {action}")


def test_no_action_prints_help(cli, capsys):
    """``modtrace calibrate`` alone lists the actions and exits 2."""
    assert cli(["calibrate"]) == 2
    err = capsys.readouterr().err
    assert all(a in err for a in ACTIONS)


def test_plan(tmp_path, cli, capsys):
    """plan writes a valid plan and prints its digest and counts."""
    from modtrace.calibrate.plan import load_plan

    out = tmp_path / "plan.json"
    assert cli(["calibrate", "plan", *SMALL_PLAN, "--seed", "4", "-o", str(out)]) == 0
    plan = load_plan(out)
    assert plan.seed == 4 and plan.repeats == 2 and len(plan.images) == 3
    assert plan.images[1].format == "jpeg" and plan.videos[0].fps == 4
    assert plan.modalities == ("text", "image", "audio", "video")
    err = capsys.readouterr().err
    assert plan.digest() in err and f"{len(plan.probes())} requests" in err


def test_plan_counting_overrides(cli, capsys):
    """--set overrides go into the plan's counting configuration."""
    args = ["calibrate", "plan", "--profile", "qwen2.5-vl", "--set", "max_pixels=1003520"]
    assert cli(args) == 0
    plan = json.loads(capsys.readouterr().out)
    assert plan["counting"] == {"params": {"max_pixels": 1003520}}
    assert plan["modalities"] == ["text", "image", "video"]


def test_plan_bad_sizes(cli, capsys):
    """A malformed size is a one-line error, exit 2."""
    assert cli(["calibrate", "plan", "--profile", "p", "--image-size", "big"]) == 2
    assert "--image-size 'big': expected WIDTHxHEIGHT" in capsys.readouterr().err
    assert cli(["calibrate", "plan", "--profile", "p", "--video", "1:2"]) == 2
    assert "SECONDS:FPS:WxH" in capsys.readouterr().err


def test_end_to_end(workflow, cli, capsys):
    """plan, run, fit twice, list, show and diff, with JSON outputs."""
    tmp, plan, probes = workflow
    store = str(tmp / "store")
    # Pinned units keep versions comparable weight by weight.
    pin = ["--unit", "image=image.tokens", "--unit", "audio=audio.tokens"]
    fit = ["calibrate", "fit", "--store", store, *pin]
    assert cli([*fit, str(probes), "--version", "v1", "--json"]) == 0
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["simulated"] is True and fitted["path"].endswith("v1.json")
    assert set(fitted["weights"]) == {"text.tokens", "image.tokens", "audio.tokens", "video.tokens"}
    low, high = fitted["intervals"]["image.tokens"]
    assert low < fitted["weights"]["image.tokens"]["value"] < high
    assert set(fitted["holdout"]["per_modality"]) >= {"text", "image"}

    # A second run of the same plan on another seed makes a second version.
    probes2 = tmp / "probes2.jsonl"
    args = ["calibrate", "run", str(plan), "-o", str(probes2), "--engine", "simulated"]
    assert cli([*args, "--sim-seed", "5", "--progress", "none"]) == 0
    assert cli([*fit, str(probes2), "--version", "v2"]) == 0
    text = capsys.readouterr().out
    assert "SIMULATED engine" in text and "calibration v2 saved to" in text
    assert "held-out mixed requests" in text

    assert cli(["calibrate", "list", "--store", store, "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(v["version"], v["current"]) for v in listed] == [("v1", False), ("v2", True)]
    assert cli(["calibrate", "list", "--store", store]) == 0
    assert "* v2" in capsys.readouterr().out

    assert cli(["calibrate", "show", "--store", store]) == 0
    shown = capsys.readouterr().out
    assert "v2" in shown and "(SIMULATED)" in shown and "overhead (per request)" in shown
    assert cli(["calibrate", "show", "v1", "--store", store, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["version"] == "v1"

    assert cli(["calibrate", "diff", "v1", "v2", "--store", store, "--json"]) == 0
    diff = json.loads(capsys.readouterr().out)
    assert (diff["old"], diff["new"]) == ("v1", "v2")
    units = [row["unit"] for row in diff["weights"]]
    assert units == ["text.tokens", "image.tokens", "audio.tokens", "video.tokens", "overhead"]
    assert cli(["calibrate", "diff", "v1", "--store", store]) == 0
    table = capsys.readouterr().out
    assert table.startswith("v1 -> v2") and "image.tokens" in table and "z" in table


def test_fit_never_overwrites(workflow, cli, capsys):
    """Fitting into an existing version id is refused, exit 2."""
    tmp, _, probes = workflow
    args = ["calibrate", "fit", str(probes), "--store", str(tmp / "s"), "--version", "v1"]
    assert cli(args) == 0
    capsys.readouterr()
    assert cli(args) == 2
    assert "already exists" in capsys.readouterr().err


def test_fit_dry_run_and_plots(workflow, cli, capsys):
    """--dry-run stores nothing; --plots writes the residual plots."""
    pytest.importorskip("matplotlib")
    tmp, _, probes = workflow
    store = tmp / "s"
    args = ["calibrate", "fit", str(probes), "--store", str(store), "--dry-run"]
    assert cli([*args, "--plots", str(tmp / "plots")]) == 0
    out = capsys.readouterr().out
    assert "dry run: not saved" in out and not store.exists()
    assert sorted(p.name for p in (tmp / "plots").iterdir()) == [
        "residuals-audio.png",
        "residuals-image.png",
        "residuals-text.png",
        "residuals-video.png",
        "residuals.png",
    ]


def test_corrupt_probe_file(workflow, cli, capsys):
    """A corrupt probe file: fit and run both stop with the line named."""
    _, plan, probes = workflow
    lines = probes.read_text().splitlines()
    lines[3] = lines[3][:-5]
    probes.write_text("\n".join(lines) + "\n")
    assert cli(["calibrate", "fit", str(probes), "--dry-run"]) == 2
    assert "probes.jsonl line 4: not valid JSON" in capsys.readouterr().err
    args = ["calibrate", "run", str(plan), "-o", str(probes), "--engine", "simulated"]
    assert cli(args) == 2
    assert "line 4" in capsys.readouterr().err


def test_failed_probes(tmp_path, cli, capsys):
    """Failures are reported (exit 1); fit refuses them unless --allow-failed, then lists them."""
    plan, probes = tmp_path / "plan.json", tmp_path / "probes.jsonl"
    assert cli(["calibrate", "plan", *SMALL_PLAN, "-o", str(plan)]) == 0
    args = ["calibrate", "run", str(plan), "-o", str(probes), "--engine", "simulated"]
    assert cli([*args, "--sim-fail-every", "9", "--progress", "none"]) == 1
    out = capsys.readouterr().out
    assert "failed: " in out and "simulated failure" in out
    assert cli(["calibrate", "fit", str(probes), "--dry-run"]) == 2
    assert "--allow-failed" in capsys.readouterr().err
    assert cli(["calibrate", "fit", str(probes), "--dry-run", "--allow-failed", "--json"]) == 0, (
        capsys.readouterr().err
    )
    fitted = json.loads(capsys.readouterr().out)
    assert fitted["excluded"]["failed"]
    assert cli([*args, "--retry-failed", "--progress", "none"]) == 0
    assert cli(["calibrate", "fit", str(probes), "--dry-run", "--json"]) == 0


def test_unknown_engine_and_version(tmp_path, workflow, cli, capsys):
    """An unknown engine or version is a one-line error, exit 2."""
    _, plan, _ = workflow
    assert cli(["calibrate", "run", str(plan), "-o", str(tmp_path / "x"), "--engine", "x"]) == 2
    assert "unknown engine" in capsys.readouterr().err
    assert cli(["calibrate", "show", "nope", "--store", str(tmp_path / "s")]) == 2
    assert "no calibration version 'nope'" in capsys.readouterr().err
    assert cli(["calibrate", "show", "--store", str(tmp_path / "s")]) == 2
    assert "no current calibration" in capsys.readouterr().err
