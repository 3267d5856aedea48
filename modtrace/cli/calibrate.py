"""``modtrace calibrate``: plan probes, run them, fit weights, and keep every version.

::

    modtrace calibrate plan --profile qwen2.5-vl -o plan.json
    modtrace calibrate run plan.json -o probes.jsonl --engine http://localhost:8000
    modtrace calibrate fit probes.jsonl --store calibrations
    modtrace calibrate list | show [VERSION] | diff OLD [NEW]

Engines: an OpenAI-compatible URL (GPU timers from the response headers),
``reference`` (the in-process reference engine: CPU seconds stand in for
GPU seconds) or ``simulated`` (a synthetic cost model).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ..report.render import plain_table as table
from ._options import add_counting_options, parse_headers

__all__ = ["register", "run"]

HELP = "calibrate weights: plan | run | fit | list | show | diff"
#: Text probe sizes of a reference-engine plan, in words. At one token per byte (about
#: 6.3 a word) they span about 100 to 6,500 tokens, the range of the default plan's
#: 16 to 4,096 words under a BPE tokenizer (about 1.3 a word).
REFERENCE_TEXT_WORDS: tuple[int, ...] = (16, 64, 128, 256, 512, 1024)
DEFAULT_STORE = "calibrations"

_EPILOG = """\
workflow:
  modtrace calibrate plan --profile qwen2.5-vl -o plan.json
  modtrace calibrate run plan.json -o probes.jsonl --engine http://localhost:8000
  modtrace calibrate fit probes.jsonl --store calibrations --plots plots/
  modtrace calibrate list
  modtrace calibrate show
  modtrace calibrate diff OLD_VERSION NEW_VERSION

Run 'modtrace calibrate COMMAND --help' for each command.
"""


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``calibrate`` command and its sub-commands."""
    p = commands.add_parser(
        "calibrate",
        help=HELP,
        description=(
            "Measure calibrated weights (GPU seconds per unit) with single-modality probes, "
            "fit them with error bars, and keep every version in a store."
        ),
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.set_defaults(run=_missing_action(p))
    sub = p.add_subparsers(dest="action", metavar="ACTION")
    _register_plan(sub)
    _register_run(sub)
    _register_fit(sub)
    _register_list(sub)
    _register_show(sub)
    _register_diff(sub)


def _missing_action(parser: argparse.ArgumentParser) -> Any:
    def run(args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return 2

    return run


def _store_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        default=DEFAULT_STORE,
        metavar="DIR",
        help=f"the calibration store directory (default: {DEFAULT_STORE})",
    )


# --- plan -------------------------------------------------------------------------
def _register_plan(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="write a probe plan for a counting profile",
        description=(
            "Write a probe plan: single-modality probes at representative sizes (text lengths, "
            "image sizes, audio durations, video lengths and sizes), repeats, warm-ups and "
            "held-out mixed requests. Prints a summary and the plan's digest."
        ),
        epilog=(
            "examples:\n"
            "  modtrace calibrate plan --profile qwen2.5-vl -o plan.json\n"
            "  modtrace calibrate plan --profile qwen2.5-vl --modality image --repeats 5 \\\n"
            "      --image-size 448x448 --image-size 1920x1080:jpeg -o plan.json\n"
            "  modtrace calibrate plan --profile qwen2.5-omni --reference-engine -o plan.json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--profile", required=True, help="the counting profile to calibrate")
    p.add_argument("--model", help="the 'model' of every request (default: the profile name)")
    p.add_argument(
        "--modality",
        action="append",
        choices=("text", "image", "audio", "video"),
        help="a modality to probe (repeatable; default: those the profile counts)",
    )
    p.add_argument("--repeats", type=int, default=3, help="sends per probe size (default: 3)")
    p.add_argument("--warmup", type=int, default=2, help="warm-ups per modality (default: 2)")
    p.add_argument("--seed", type=int, default=0, help="content and order seed (default: 0)")
    p.add_argument("--max-tokens", type=int, default=1, help="max_tokens of each request")
    p.add_argument("--no-shuffle", action="store_true", help="send probes in plan order")
    p.add_argument("--no-holdout", action="store_true", help="no held-out mixed requests")
    p.add_argument(
        "--text-words",
        metavar="N,N,...",
        help="text probe sizes in words (default: 16,128,512,1024,2048,4096)",
    )
    p.add_argument(
        "--image-size",
        action="append",
        metavar="WxH[:png|jpeg]",
        help="an image probe size (repeatable; replaces the defaults)",
    )
    p.add_argument(
        "--audio-seconds",
        metavar="S,S,...",
        help="audio probe durations (default: 1,5,10,20,30)",
    )
    p.add_argument(
        "--video",
        action="append",
        metavar="SECONDS:FPS:WxH",
        help="a video probe (repeatable; replaces the defaults), e.g. 4:12:640x360",
    )
    add_counting_options(p, "a counting configuration override, as for 'modtrace count --set'")
    p.add_argument(
        "--reference-engine",
        action="store_true",
        help=(
            "a plan for the reference engine: its model name, no video (default modalities "
            "text, image, audio), text counted one token per byte as it tokenizes (a "
            "byte-level tokenizer.json is written next to the plan), and default text sizes "
            f"{','.join(map(str, REFERENCE_TEXT_WORDS))} words: the default plan's range in "
            "tokens at its 6 to 7 tokens a word"
        ),
    )
    p.add_argument("-o", "--out", metavar="FILE", help="write the plan here (default: stdout)")
    p.set_defaults(run=run_plan_cmd)


def _numbers(text: str, option: str, kind: type) -> list[Any]:
    try:
        return [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        msg = f"{option} {text!r}: expected comma-separated numbers"
        raise ValueError(msg) from None


def _size(text: str, option: str) -> tuple[int, int]:
    w, sep, h = text.lower().partition("x")
    if not sep or not w.isdigit() or not h.isdigit():
        msg = f"{option} {text!r}: expected WIDTHxHEIGHT"
        raise ValueError(msg)
    return int(w), int(h)


def _plan_fields(args: argparse.Namespace) -> dict[str, Any]:
    from ..calibrate.plan import AudioItem, ImageItem, VideoItem

    fields: dict[str, Any] = {
        "repeats": args.repeats,
        "warmup": args.warmup,
        "seed": args.seed,
        "max_tokens": args.max_tokens,
        "shuffle": not args.no_shuffle,
    }
    if args.model:
        fields["model"] = args.model
    if args.no_holdout:
        fields["holdout"] = ()
    if args.text_words:
        fields["text_words"] = tuple(_numbers(args.text_words, "--text-words", int))
    if args.image_size:
        images = []
        for spec in args.image_size:
            size, _, fmt = spec.partition(":")
            w, h = _size(size, "--image-size")
            images.append(ImageItem(width=w, height=h, format=fmt or "png"))
        fields["images"] = tuple(images)
    if args.audio_seconds:
        seconds = _numbers(args.audio_seconds, "--audio-seconds", float)
        fields["audios"] = tuple(AudioItem(seconds=s) for s in seconds)
    if args.video:
        videos = []
        for spec in args.video:
            parts = spec.split(":")
            if len(parts) != 3:
                msg = f"--video {spec!r}: expected SECONDS:FPS:WxH"
                raise ValueError(msg)
            seconds, fps = _numbers(f"{parts[0]},{parts[1]}", "--video", float)
            w, h = _size(parts[2], "--video")
            videos.append(VideoItem(seconds=seconds, fps=fps, width=w, height=h))
        fields["videos"] = tuple(videos)
    if args.settings or args.config:
        from .count import build_config

        ns = argparse.Namespace(
            config=args.config, settings=args.settings, profile=args.profile, strict=False
        )
        counting = build_config(ns).model_dump(mode="json", exclude_defaults=True)
        counting.pop("profile", None)
        fields["counting"] = counting
    if args.reference_engine:
        fields.update(_reference_fields(args, fields.get("counting", {})))
    return fields


def _reference_fields(args: argparse.Namespace, counting: dict[str, Any]) -> dict[str, Any]:
    """The plan fields that fit the reference engine: model, text counting (see --help)."""
    from ..calibrate.engines import reference_counting, write_byte_tokenizer
    from ..engine.reference import EngineConfig

    if args.model and args.model != EngineConfig().model_name:
        msg = f"--reference-engine: the reference engine serves {EngineConfig().model_name!r}"
        raise ValueError(msg)
    out = Path(args.out) if args.out else Path("plan.json")
    tokenizer = write_byte_tokenizer(out.with_name(out.stem + ".tokenizer.json"))
    print(f"byte-level tokenizer for text counting -> {tokenizer}", file=sys.stderr)
    # The text counting is the reference engine's; other counting settings stay.
    fields: dict[str, Any] = {
        "model": EngineConfig().model_name,
        "counting": {**counting, **reference_counting(tokenizer)},
    }
    if not args.text_words:
        fields["text_words"] = REFERENCE_TEXT_WORDS
    return fields


def run_plan_cmd(args: argparse.Namespace) -> int:
    """Run ``modtrace calibrate plan``."""
    from ..calibrate.plan import ProbePlan

    modalities = args.modality
    if args.reference_engine and not modalities:
        modalities = ["text", "image", "audio"]  # the reference engine has no video
    plan = ProbePlan.for_profile(args.profile, modalities=modalities, **_plan_fields(args))
    text = plan.to_json() + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    specs = plan.probes()
    counts: dict[str, int] = {}
    for s in specs:
        key = s.kind if s.kind != "probe" else s.modality
        counts[key] = counts.get(key, 0) + 1
    summary = ", ".join(f"{k} {v}" for k, v in counts.items())
    print(
        f"plan {plan.digest()}: profile {plan.profile}, {len(specs)} requests ({summary})"
        + (f" -> {args.out}" if args.out else ""),
        file=sys.stderr,
    )
    return 0


# --- run --------------------------------------------------------------------------
def _register_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="send a plan's probes to an engine and record the results",
        description=(
            "Send every probe of a plan to an engine and append its GPU timers to a probe "
            "file (JSON lines). Resumable: probes already in the file are skipped. A probe "
            "that fails is recorded as failed with its reason."
        ),
        epilog=(
            "engines:\n"
            "  URL         an OpenAI-compatible server (http://host:8000, .../v1, or the full\n"
            "              .../v1/chat/completions): each probe is POSTed to\n"
            "              /v1/chat/completions and its GPU timers read from the response's\n"
            "              x-modtrace-gpu-seconds* headers (modtrace.engine on the server);\n"
            "              a failed request or missing timers is a failed probe. Say what\n"
            "              it runs on with --engine-name, --driver and --gpu\n"
            "  reference   the reference engine in this process (modtrace[engine]): a tiny\n"
            "              random Qwen2.5-Omni thinker on the CPU; CPU seconds stand in for\n"
            "              GPU seconds (make the plan with --reference-engine)\n"
            "  simulated   a synthetic cost model with known weights and noise (no GPU):\n"
            "              for trying the workflow; its weights measure nothing\n\n"
            "exit status: 0 when every probe sent succeeded, 1 when some failed (they are\n"
            "recorded; send them again with --retry-failed), 2 on bad input.\n\n"
            "examples:\n"
            "  modtrace calibrate run plan.json -o probes.jsonl --engine http://localhost:8000 \\\n"
            "      --engine-name 'vllm 0.11.0' --driver 'NVIDIA 570.86, CUDA 12.8' --gpu H100\n"
            "  modtrace calibrate run plan.json -o probes.jsonl --engine reference\n"
            "  modtrace calibrate run plan.json -o probes.jsonl --engine simulated"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("plan", metavar="PLAN", help="the plan JSON file")
    p.add_argument("-o", "--out", required=True, metavar="FILE", help="the probe file")
    p.add_argument("--engine", required=True, help="the engine: a URL, 'reference' or 'simulated'")
    p.add_argument("--retry-failed", action="store_true", help="send failed probes again")
    p.add_argument(
        "--repair",
        action="store_true",
        help="cut off a last line torn by an interrupted run before resuming",
    )
    p.add_argument("--limit", type=int, metavar="N", help="send at most N probes, then stop")
    p.add_argument(
        "--progress",
        choices=("auto", "rich", "plain", "none"),
        default="auto",
        help="progress display on stderr (default: auto)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="URL engine: seconds to wait for each response (default: 300)",
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="URL engine: a request header, e.g. 'Authorization: Bearer ...' (never recorded)",
    )
    p.add_argument("--engine-name", metavar="TEXT", help="URL engine: what it is (vllm 0.11.0)")
    p.add_argument("--driver", metavar="TEXT", help="URL engine: GPU driver and CUDA version")
    p.add_argument("--gpu", metavar="TEXT", help="URL engine: the GPU model")
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="reference engine: torch CPU threads (default: 1)",
    )
    p.add_argument("--sim-seed", type=int, default=0, help="simulated engine: noise seed")
    p.add_argument(
        "--sim-noise", type=float, default=None, help="simulated engine: log-normal noise sd"
    )
    p.add_argument(
        "--sim-fail-every",
        type=int,
        default=0,
        metavar="N",
        help="simulated engine: fail every N-th request (to try failure handling)",
    )
    p.set_defaults(run=run_run_cmd)


def _engine(args: argparse.Namespace, plan: Any, count: Any) -> Any:
    """The engine named by ``--engine``, after checking it can run ``plan``."""
    from ..calibrate.engines import HttpEngine, ReferenceProbeEngine
    from ..calibrate.simulated import SimulatedCost, SimulatedEngine

    choice = args.engine.strip()
    if choice == "simulated":
        cost = SimulatedCost() if args.sim_noise is None else SimulatedCost(noise=args.sim_noise)
        engine: Any = SimulatedEngine(
            count, cost, seed=args.sim_seed, fail_every=args.sim_fail_every
        )
        print("engine: SIMULATED (synthetic cost model; measures nothing)", file=sys.stderr)
        return engine
    if choice == "reference":
        from ..engine.reference import EngineConfig

        if args.threads < 1:
            msg = f"--threads: must be at least 1, got {args.threads}"
            raise ValueError(msg)
        engine = ReferenceProbeEngine(config=EngineConfig(threads=args.threads))
        try:
            engine.check_plan(plan)
        except ValueError:
            engine.close()
            raise
        caveats = "; ".join(engine.info.caveats)
        print(f"engine: {engine.info.name}" + (f": {caveats}" if caveats else ""), file=sys.stderr)
        return engine
    if choice.startswith(("http://", "https://")):
        engine = HttpEngine(
            choice,
            timeout=args.timeout,
            headers=parse_headers(args.header, echo=False),
            name=args.engine_name,
            driver=args.driver,
            gpu=args.gpu,
        )
        print(f"engine: {engine.info.name} ({engine.url})", file=sys.stderr)
        return engine
    msg = (
        f"--engine {args.engine!r}: unknown engine; expected an http(s) URL, "
        "'reference' or 'simulated'"
    )
    raise ValueError(msg)


def run_run_cmd(args: argparse.Namespace) -> int:
    """Run ``modtrace calibrate run``."""
    from ..calibrate.plan import default_count_fn, load_plan
    from ..calibrate.runner import run_plan

    plan = load_plan(args.plan)
    count = default_count_fn(plan)
    engine = _engine(args, plan, count)
    try:
        summary = run_plan(
            plan,
            engine,
            args.out,
            count=count,
            retry_failed=args.retry_failed,
            repair=args.repair,
            limit=args.limit,
            progress=args.progress,
        )
    finally:
        close = getattr(engine, "close", None)
        if close is not None:
            close()
    if summary.repaired:
        print(f"repaired: cut off a torn last line ({summary.repaired} bytes)", file=sys.stderr)
    print(
        f"{summary.path}: {summary.sent} sent ({summary.ok} ok, {summary.failed} failed), "
        f"{summary.skipped} already recorded, {summary.planned} planned, "
        f"{summary.seconds:.1f} s"
    )
    for probe_id, reason in summary.failures:
        print(f"failed: {probe_id}: {reason}")
    return 1 if summary.failed else 0


# --- fit --------------------------------------------------------------------------
def _register_fit(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fit",
        help="fit weights with error bars from a probe file and store them",
        description=(
            "Fit GPU seconds per unit by least squares with a per-request overhead, choose "
            "the best unit per modality, validate on the held-out requests, and save the "
            "calibration as a new version in the store (never overwriting one)."
        ),
        epilog=(
            "examples:\n"
            "  modtrace calibrate fit probes.jsonl --store calibrations\n"
            "  modtrace calibrate fit probes.jsonl --unit image=image.tokens --dry-run --json"
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("probes", metavar="PROBES", help="the probe file (JSON lines)")
    _store_option(p)
    p.add_argument("--version", metavar="ID", help="the new version id (default: time-model)")
    p.add_argument(
        "--unit",
        action="append",
        default=[],
        metavar="MODALITY=UNIT",
        help="force a modality's unit, e.g. image=image.tiles (repeatable)",
    )
    p.add_argument(
        "--allow-failed",
        action="store_true",
        help="fit without the failed probes (they are listed in the calibration)",
    )
    p.add_argument("--no-current", action="store_true", help="store without making it current")
    p.add_argument("--dry-run", action="store_true", help="fit and print, store nothing")
    p.add_argument("--plots", metavar="DIR", help="write residual plots here (needs matplotlib)")
    p.add_argument(
        "--confidence", type=float, default=0.95, help="interval level shown (default: 0.95)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run_fit_cmd)


def _pairs(pairs: list[str], option: str) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or not value:
            msg = f"{option} {pair!r}: expected MODALITY=UNIT"
            raise ValueError(msg)
        out[key.strip()] = value.strip()
    return out


def run_fit_cmd(args: argparse.Namespace) -> int:
    """Run ``modtrace calibrate fit``."""
    from ..calibrate.fit import OVERHEAD, fit_probe_file, residual_plots
    from ..calibrate.probes import read_probes
    from ..calibrate.store import CalibrationStore, calibration_from_fit
    from ..calibrate.validate import validate_holdout

    probes = read_probes(args.probes)
    fit = fit_probe_file(probes, units=_pairs(args.unit, "--unit"), allow_failed=args.allow_failed)
    draft = calibration_from_fit(fit, probes, version=args.version)
    holdout = validate_holdout(draft, probes.records)
    record = calibration_from_fit(
        fit, probes, version=draft.version, created=draft.created, holdout=holdout
    )
    path = None
    if not args.dry_run:
        path = CalibrationStore(args.store).save(record, make_current=not args.no_current)
    plots = []
    if args.plots:
        plots = residual_plots(fit, args.plots)
    if args.json:
        out = {
            "version": record.version,
            "path": str(path) if path else None,
            "simulated": record.simulated,
            "weights": {u: w.model_dump() for u, w in fit.weights.items()},
            "intervals": {n: fit.interval(n, args.confidence) for n in [*fit.weights, OVERHEAD]},
            "confidence": args.confidence,
            "overhead": fit.overhead.model_dump(),
            "r2": fit.r2,
            "residual_se": fit.residual_se,
            "n": fit.n,
            "choices": {m: c.model_dump() for m, c in fit.choices.items()},
            "excluded": fit.excluded,
            "holdout": holdout.model_dump(mode="json"),
            "plots": [str(p) for p in plots],
        }
        print(json.dumps(out, indent=2))
        return 0
    level = f"{args.confidence:.0%}"
    rows = []
    for name in [*fit.weights, OVERHEAD]:
        est = fit.overhead if name == OVERHEAD else fit.weights[name]
        low, high = fit.interval(name, args.confidence)
        rows.append([name, f"{est.value:.6g}", f"{est.stderr:.3g}", f"[{low:.6g}, {high:.6g}]"])
    lines = [
        ("SIMULATED engine: these weights measure nothing real\n" if record.simulated else "")
        + f"fit of {fit.n} probes: R^2 {fit.r2:.5f}, residual SE {fit.residual_se:.4g} s, "
        f"df {fit.df}",
        *(f"note: {n}" for n in record.notes if not n.startswith("SIMULATED")),
        table(["weight (GPU s/unit)", "value", "stderr", f"{level} interval"], rows),
        "",
    ]
    for modality, choice in fit.choices.items():
        alts = ", ".join(f"{s.unit} R^2 {s.r2:.5f} SE {s.residual_se:.4g}" for s in choice.scores)
        lines.append(f"{modality}: {choice.unit} ({choice.rule}); candidates: {alts}")
    for reason, ids in fit.excluded.items():
        lines.append(f"not fitted ({reason}): {len(ids)}")
    if holdout.per_modality:
        hold_rows = [
            [m, str(e.n), f"{e.median_pp:.2f}", f"{e.worst_pp:.2f}"]
            for m, e in holdout.per_modality.items()
        ]
        lines += [
            "",
            "held-out mixed requests: |share by weights - share by components|, points",
            table(["modality", "n", "median", "worst"], hold_rows),
        ]
    if holdout.factor_median is not None:
        lines.append(f"held-out median reconciliation factor {holdout.factor_median:.4f}")
    lines.append("")
    lines.append(
        f"calibration {record.version}"
        + (f" saved to {path}" if path else " (dry run: not saved)")
        + (" (not current)" if path and args.no_current else "")
    )
    lines.extend(f"plot: {p}" for p in plots)
    print("\n".join(lines))
    return 0


# --- list / show / diff -------------------------------------------------------------
def _register_list(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "list",
        help="list the stored calibration versions",
        description="List every calibration version in the store, oldest first.",
    )
    _store_option(p)
    p.add_argument("--json", action="store_true", help="print a JSON array")
    p.set_defaults(run=run_list_cmd)


def run_list_cmd(args: argparse.Namespace) -> int:
    """Run ``modtrace calibrate list``."""
    from ..calibrate.store import CalibrationStore

    versions = CalibrationStore(args.store).versions()
    if args.json:
        print(json.dumps([v.model_dump(mode="json") for v in versions], indent=2))
        return 0
    if not versions:
        print(f"no calibrations in {args.store}")
        return 0
    rows = [
        [
            ("* " if v.current else "  ") + v.version,
            v.created.isoformat(),
            v.model,
            v.engine + (" (SIMULATED)" if v.simulated else ""),
        ]
        for v in versions
    ]
    print(table(["version (* current)", "created", "model", "engine"], rows))
    return 0


def _register_show(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "show",
        help="show one calibration version",
        description="Show a stored calibration: provenance, weights with errors, fit quality.",
    )
    p.add_argument(
        "version", nargs="?", metavar="VERSION", help="a version id (default: the current one)"
    )
    _store_option(p)
    p.add_argument("--json", action="store_true", help="print the calibration JSON")
    p.set_defaults(run=run_show_cmd)


def _load(store_dir: str, version: str | None) -> Any:
    from ..calibrate.store import CalibrationStore, StoreError, load_record

    if version and version.endswith(".json") and Path(version).exists():
        return load_record(version)
    store = CalibrationStore(store_dir)
    if version:
        return store.load(version)
    record = store.current()
    if record is None:
        msg = f"no current calibration in {store_dir}; name a version"
        raise StoreError(msg)
    return record


def run_show_cmd(args: argparse.Namespace) -> int:
    """Run ``modtrace calibrate show``."""
    record = _load(args.store, args.version)
    if args.json:
        print(record.to_json())
        return 0
    fit = record.fit
    meta = [
        ["version", record.version],
        ["created", record.created.isoformat()],
        ["model", record.model],
        ["preprocessor", record.preprocessor],
        ["engine", record.engine + (" (SIMULATED)" if record.simulated else "")],
        ["driver", record.driver],
        ["plan", record.plan_digest],
        ["probes", record.probes_digest],
        ["fit", f"n {fit.n}, R^2 {fit.r2:.5f}, residual SE {fit.residual_se:.4g} s"],
    ]
    rows = [
        [u, f"{w.value:.6g}", "—" if w.stderr is None else f"{w.stderr:.3g}"]
        for u, w in record.weights.items()
    ]
    rows.append(["overhead (per request)", f"{record.overhead.value:.6g}", _se(record.overhead)])
    width = max(len(k) for k, _ in meta)
    lines = [f"{k.ljust(width)}  {v}" for k, v in meta]
    lines += ["", table(["weight", "GPU s/unit", "stderr"], rows)]
    for modality, choice in record.fit.choices.items():
        lines.append(f"{modality}: {choice.unit} ({choice.rule})")
    for modality, err in record.fit.holdout.items():
        lines.append(
            f"held-out {modality}: median {err['median_pp']:.2f} points, "
            f"worst {err['worst_pp']:.2f} points"
        )
    lines.extend(f"note: {n}" for n in record.notes)
    print("\n".join(lines))
    return 0


def _se(weight: Any) -> str:
    return "—" if weight.stderr is None else f"{weight.stderr:.3g}"


def _register_diff(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="compare two calibration versions weight by weight",
        description=(
            "Compare two calibrations weight by weight: old and new value, change, relative "
            "change and z = change / sqrt(se_old^2 + se_new^2) (beyond about 2: more than "
            "noise), and the metadata that differs. VERSION may also be a calibration file."
        ),
    )
    p.add_argument("old", metavar="OLD", help="the older version")
    p.add_argument("new", nargs="?", metavar="NEW", help="the newer version (default: current)")
    _store_option(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run_diff_cmd)


def run_diff_cmd(args: argparse.Namespace) -> int:
    """Run ``modtrace calibrate diff``."""
    from ..calibrate.store import diff_calibrations

    diff = diff_calibrations(_load(args.store, args.old), _load(args.store, args.new))
    if args.json:
        print(json.dumps(diff.model_dump(mode="json"), indent=2))
        return 0

    def num(value: float | None, fmt: str) -> str:
        return "—" if value is None else format(value, fmt)

    rows = [
        [
            c.unit,
            "—" if c.old is None else f"{c.old.value:.6g} ± {_se(c.old)}",
            "—" if c.new is None else f"{c.new.value:.6g} ± {_se(c.new)}",
            num(c.change, "+.4g"),
            num(c.relative, "+.1%"),
            num(c.z, "+.2f"),
        ]
        for c in diff.weights
    ]
    lines = [
        f"{diff.old} -> {diff.new}",
        table(["unit", "old", "new", "change", "relative", "z"], rows),
    ]
    for name, (a, b) in diff.metadata.items():
        lines.append(f"{name}: {a} -> {b}")
    print("\n".join(lines))
    return 0


def run(args: argparse.Namespace) -> int:
    """Dispatch to the chosen action (``args.run`` is set per action)."""
    return int(args.run(args) or 0)
