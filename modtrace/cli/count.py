"""``modtrace count``: the units of one request body, as the gateway counts them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..report.render import plain_table as table
from ..units import MODALITIES
from ._options import add_counting_options, parse_headers

if TYPE_CHECKING:
    from ..counting.counter import CountingConfig
    from ..counting.result import RequestCount

__all__ = ["register", "request_count_json", "run"]

MODALITY_FIELDS: dict[str, tuple[str, ...]] = {
    "text": ("tokens",),
    "image": ("count", "pixels", "tiles", "tokens"),
    "audio": ("count", "seconds", "frames", "tokens"),
    "video": ("count", "seconds", "frames", "tokens"),
}


def register(commands: argparse._SubParsersAction) -> None:
    """Add the ``count`` sub-command."""
    p = commands.add_parser(
        "count",
        help="count the units of one request body (JSON) per modality",
        description=(
            "Read one OpenAI-compatible request body (chat, completion or Responses) and "
            "print its units per modality, counted with a profile exactly as the serving "
            "engine will. Media is read from inline bytes' headers only; URLs are never "
            "fetched (they get the configured default size and are flagged defaulted)."
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=(
            "examples:\n"
            "  modtrace count --profile qwen2.5-vl request.json\n"
            "  modtrace count --profile qwen3-vl --set max_pixels=1003520 --json - < request.json\n"
            "  modtrace count --header x-llm-d-video-duration-seconds:30 request.json\n"
            "  modtrace count --set text.kind=tiktoken --set text.tiktoken_file=o200k.tiktoken \\\n"
            "      request.json\n"
            "  modtrace count --list-profiles"
        ),
    )
    p.add_argument(
        "file",
        nargs="?",
        default="-",
        metavar="FILE | -",
        help="the request body (default: standard input)",
    )
    p.add_argument(
        "--profile",
        default=None,
        help="counting profile (default: llm-d); see --list-profiles",
    )
    add_counting_options(
        p,
        "override a counter parameter (max_pixels=1003520) or a configuration field "
        "(text.kind=tiktoken, default_image_size=[1024,768]); VALUE is JSON or text "
        "(repeatable)",
    )
    p.add_argument(
        "--header",
        action="append",
        default=[],
        metavar="NAME:VALUE",
        help="a request header, e.g. x-llm-d-video-fps:30 (repeatable)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="exit non-zero on the first item that cannot be counted",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument(
        "--list-profiles",
        action="store_true",
        help="list the profiles with their counters and parameters",
    )
    p.set_defaults(run=run)


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def build_config(args: argparse.Namespace) -> CountingConfig:
    """The counting configuration from ``--config``, ``--set``, ``--profile`` and ``--strict``."""
    # Imported here so that other commands start without the counting stack.
    from ..counting.counter import CountingConfig

    data: dict[str, Any] = {}
    if args.config:
        try:
            data = json.loads(Path(args.config).read_text(encoding="utf-8"))
        except OSError as exc:
            msg = f"cannot read config {args.config}: {exc.strerror or exc}"
            raise ValueError(msg) from exc
    fields = CountingConfig.model_fields
    for setting in args.settings:
        key, sep, raw = setting.partition("=")
        if not sep or not key:
            msg = f"--set {setting!r}: expected KEY=VALUE"
            raise ValueError(msg)
        head, _, rest = key.partition(".")
        if rest and head in fields:
            data.setdefault(head, {})[rest] = _value(raw)
        elif key in fields and key != "params":
            data[key] = _value(raw)
        else:
            data.setdefault("params", {})[key] = _value(raw)
    if args.profile:
        data["profile"] = args.profile
    if args.strict:
        data["strict"] = True
    return CountingConfig.model_validate(data)


def _read_body(file: str) -> Any:
    try:
        text = sys.stdin.read() if file == "-" else Path(file).read_text(encoding="utf-8")
    except OSError as exc:
        msg = f"cannot read {file}: {exc.strerror or exc}"
        raise ValueError(msg) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        msg = f"{'stdin' if file == '-' else file}: not valid JSON ({exc.msg} at line {exc.lineno})"
        raise ValueError(msg) from None


def _number(value: float) -> float | int:
    return int(value) if float(value).is_integer() else value


def request_count_json(result: RequestCount) -> dict[str, Any]:
    """The documented JSON object of ``modtrace count --json``."""
    out: dict[str, Any] = {"profile": result.profile, "counters": result.counters}
    present = {item.modality for item in result.items if not item.error}
    if "text" in result.counters:
        present.add("text")
    for modality in MODALITIES:
        if modality not in present:
            continue
        block: dict[str, Any] = {}
        for field in MODALITY_FIELDS[modality]:
            name = f"{modality}.{field}"
            has = name in result.units.root
            block[field] = _number(result.units[name]) if has else (None if field == "tiles" else 0)
        if modality != "text":
            block["defaulted"] = result.defaulted.get(modality, False)
        out[modality] = block
    out["items"] = [item.model_dump(exclude_defaults=True) for item in result.items]
    out["errors"] = result.errors
    return out


def _list_profiles(as_json: bool) -> int:
    from ..counting.profiles import list_profiles

    rows = []
    for profile in list_profiles():
        entry = {
            "name": profile.name,
            "description": profile.description,
            "aliases": list(profile.aliases),
            "counters": {},
        }
        for modality in ("image", "audio", "video"):
            counter = getattr(profile, modality)
            if counter is not None:
                entry["counters"][modality] = {
                    "ref": counter.ref,
                    "params": counter.params.model_dump(),
                    "source": counter.source,
                }
        rows.append(entry)
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    for entry in rows:
        print(f"{entry['name']}: {entry['description']}")
        for modality, c in entry["counters"].items():
            params = ", ".join(f"{k}={v}" for k, v in c["params"].items())
            print(f"  {modality:<5} {c['ref']}  {params}")
    return 0


def run(args: argparse.Namespace) -> int:
    """Run ``modtrace count``."""
    if args.list_profiles:
        return _list_profiles(args.json)
    from ..counting.counter import RequestCounter

    config = build_config(args)
    counter = RequestCounter(config)
    result = counter.count(_read_body(args.file), parse_headers(args.header))
    if args.json:
        print(json.dumps(request_count_json(result), indent=2))
    else:
        print(render(result))
    return 0


def render(result: RequestCount) -> str:
    """A readable table of one request's counts."""
    data = request_count_json(result)
    rows = []
    for modality in MODALITIES:
        if modality not in data:
            continue
        block = data[modality]
        detail = "  ".join(
            f"{k}={v}" for k, v in block.items() if k != "defaulted" and v is not None
        )
        flag = " (defaulted)" if block.get("defaulted") else ""
        rows.append([modality, detail + flag, result.counters.get(modality, "")])
    lines = [f"profile {result.profile}", table(["modality", "units", "counter"], rows)]
    lines.extend(f"error: {e}" for e in result.errors)
    return "\n".join(lines)
