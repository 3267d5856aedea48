"""Calibrate the reference engine end to end and check the weights on held-out mixed requests.

The acceptance run of the calibration workflow (issue 6), on the CPU in
well under a minute, through the real command line::

    modtrace calibrate plan --profile qwen2.5-omni --reference-engine -o DIR/plan.json
    modtrace calibrate run DIR/plan.json -o DIR/probes.jsonl --engine reference
    modtrace calibrate fit DIR/probes.jsonl --store DIR/calibrations --json

then prints, for the held-out mixed requests (text+image, text+2 images,
text+audio, text+image+audio; 3 repeats each), the absolute difference
between each modality's share attributed by the fitted weights alone and by
the engine's component timers, in percentage points: the median and the
worst per modality. Goal: every median within 5 points.

The reference engine is a tiny random Qwen2.5-Omni thinker on the CPU: CPU
seconds stand in for GPU seconds. The figures say that the workflow
(probes, counting, fit, validation) holds together on real encoders and real
component timers, not what any GPU would measure.

Run: ``.venv/bin/python examples/calibrate_reference.py [--workdir DIR] [--text-words N,N,...]``
(needs ``modtrace[engine]``). Exit status 0 when the goal is met, 1 when not.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

GOAL_POINTS = 5.0


def modtrace(args: list[str], *, capture: bool = False) -> str:
    """Run ``modtrace ARGS`` in a child process, echoing the command; return its stdout."""
    print(f"$ modtrace {shlex.join(args)}", file=sys.stderr, flush=True)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "modtrace", *args],
        check=True,
        stdout=subprocess.PIPE if capture else None,
        text=True,
    )
    print(f"  ({time.perf_counter() - start:.1f} s)", file=sys.stderr, flush=True)
    return done.stdout or ""


def table(rows: list[list[str]], header: list[str]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def report(fit: dict[str, Any], seconds: float) -> bool:
    """Print the held-out share errors; whether every median is within the goal."""
    holdout = fit["holdout"]
    per_modality = holdout["per_modality"]
    print(f"\nplan + run + fit: {seconds:.1f} s on this machine")
    print(f"fit: {fit['n']} probes, R^2 {fit['r2']:.4f}, residual SE {fit['residual_se']:.4g} s")
    weights = ", ".join(
        f"{unit} {w['value']:.4g} ± {w['stderr']:.2g}" for unit, w in fit["weights"].items()
    )
    print(f"weights (CPU s/unit): {weights}; overhead {fit['overhead']['value']:.4g} s")
    print(f"held-out median reconciliation factor: {holdout['factor_median']:.3f}\n")
    rows = [
        [m, str(e["n"]), f"{e['median_pp']:.2f}", f"{e['worst_pp']:.2f}"]
        for m, e in per_modality.items()
    ]
    print(table(rows, ["modality", "n", "median (points)", "worst (points)"]))
    print()
    detail = [
        [
            r["id"],
            f"{r['factor']:.3f}",
            ", ".join(f"{m} {100 * s:.1f}" for m, s in r["by_weights"].items()),
            ", ".join(f"{m} {100 * s:.1f}" for m, s in r["by_components"].items()),
        ]
        for r in holdout["rows"]
    ]
    print(table(detail, ["held-out request", "factor", "share by weights %", "by components %"]))
    met = bool(per_modality) and all(e["median_pp"] <= GOAL_POINTS for e in per_modality.values())
    verdict = "met" if met else "MISSED"
    print(f"\ngoal (every median within {GOAL_POINTS:g} points): {verdict}")
    return met


def main(argv: list[str] | None = None) -> int:
    """Plan, run and fit on the reference engine; print the held-out share errors."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="keep the plan, probes and store here (default: temp)")
    parser.add_argument(
        "--text-words",
        metavar="N,N,...",
        help="text probe sizes in words (default: the --reference-engine plan's)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="sends per probe size")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args(argv)
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="modtrace-calibrate-"))
    workdir.mkdir(parents=True, exist_ok=True)
    plan, probes = str(workdir / "plan.json"), str(workdir / "probes.jsonl")
    sizes = ["--text-words", args.text_words] if args.text_words else []
    start = time.perf_counter()
    modtrace(
        [
            "calibrate",
            "plan",
            "--profile",
            "qwen2.5-omni",
            "--reference-engine",
            "--repeats",
            str(args.repeats),
            *sizes,
            "-o",
            plan,
        ]
    )
    modtrace(
        [
            "calibrate",
            "run",
            plan,
            "-o",
            probes,
            "--engine",
            "reference",
            "--threads",
            str(args.threads),
            "--progress",
            "none",
        ]
    )
    out = modtrace(
        ["calibrate", "fit", probes, "--store", str(workdir / "calibrations"), "--json"],
        capture=True,
    )
    return 0 if report(json.loads(out), time.perf_counter() - start) else 1


if __name__ == "__main__":
    raise SystemExit(main())
