"""Reports as a terminal table, JSON, CSV, and PNG charts.

The table is plain text, or a ``rich`` table when ``rich`` is installed and
the output is a terminal. Charts need ``matplotlib`` (the ``report`` extra);
everything else needs nothing beyond the standard library.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from .base import RESULT_MODALITIES, Report

__all__ = [
    "FORMATS",
    "Section",
    "render",
    "render_csv",
    "render_json",
    "render_table",
    "sections",
    "write_chart",
]

#: Output formats of :func:`render`.
FORMATS: tuple[str, ...] = ("table", "json", "csv")

#: One colour per modality, the same in every chart.
COLOURS: dict[str, str] = {
    "text": "#4C72B0",
    "image": "#DD8452",
    "audio": "#55A868",
    "video": "#C44E52",
    "unknown": "#8C8C8C",
}
#: Series drawn at most in one chart (the largest by requests).
MAX_SERIES = 6


@dataclass
class Section:
    """A titled table of a report: the unit both the plain and the rich table render."""

    title: str
    header: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


def plain_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A plain-text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            str(c).ljust(w) if i == 0 else str(c).rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths]), *(line(r) for r in rows)])


# --- Number formats -------------------------------------------------------------------------
def _num(x: float | None) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "—"
    if isinstance(x, int) or (float(x).is_integer() and abs(x) >= 1):
        return f"{int(x):,}"
    if abs(x) >= 100:
        return f"{x:,.1f}"
    if abs(x) >= 1:
        return f"{x:.3f}"
    return f"{x:.4g}"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.1%}"


def _usd(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:,.4f}" if abs(x) >= 0.01 else f"{x:.3g}"


def _signed_pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.1%}"


def _present(rows: Sequence[dict[str, Any]], prefix: str) -> list[str]:
    """Modalities with a non-zero ``<prefix><modality>`` in any row."""
    return [m for m in RESULT_MODALITIES if any(r.get(f"{prefix}{m}") for r in rows)]


# --- Sections per report --------------------------------------------------------------------
def _shares_sections(report: Report) -> list[Section]:
    by = report.params.get("by")
    totals = report.extra.get("totals", [])
    modalities = _present([*report.rows, *totals], "gpu_seconds.") or ["text"]
    header = [
        "bucket",
        *([by] if by else []),
        "calibration",
        "requests",
        "GPU s",
        *(f"{m} share" for m in modalities),
        *(f"{m} GPU s" for m in modalities),
        "USD (hyp.)",
    ]

    def line(row: dict[str, Any]) -> list[str]:
        return [
            row["bucket"],
            *([row[by] or "—"] if by else []),
            row["calibration_version"] or "—",
            _num(row["requests"]),
            _num(row["gpu_seconds"]),
            *(_pct(row[f"share.{m}"]) for m in modalities),
            *(_num(row[f"gpu_seconds.{m}"]) for m in modalities),
            _usd(row["usd"]),
        ]

    basis = report.params.get("usd_basis")
    rate = (
        f"at a hypothetical {report.params['usd_per_gpu_hour']:g} USD per GPU hour"
        if basis == "rate"
        else "as recorded on the spans (rates: "
        + (", ".join(report.params.get("rate_ids") or []) or "none")
        + ")"
    )
    out = [
        Section(
            f"Modality shares of GPU seconds per {report.params.get('bucket')}",
            header,
            [line(r) for r in report.rows],
        )
    ]
    if totals and report.params.get("bucket") != "all":
        out.append(Section("Totals", header, [line(r) for r in totals]))
    out[-1].notes.append(f"USD are hypothetical, {rate}.")
    return out


def _drift_sections(report: Report) -> list[Section]:
    by = report.params.get("by")
    metrics: list[tuple[str, str | None]] = []
    cells: dict[tuple[str, str], dict[tuple[str, str | None], str]] = {}
    for row in report.rows:
        key = (row.get(by, "") if by else "", row["bucket"])
        metric = (row["metric"], row["calibration_version"])
        if metric not in metrics:
            metrics.append(metric)
        value = row["value"]
        text = _pct(value) if row["metric"].startswith("share.") else _num(value)
        cells.setdefault(key, {})[metric] = text + (" *" if row["flagged"] else "")
    names = [m if not v else f"{m} [{v}]" for m, v in metrics]
    header = [*([by] if by else []), "bucket", *names]
    rows = [
        [*([group or "—"] if by else []), bucket, *(values.get(m, "—") for m in metrics)]
        for (group, bucket), values in sorted(cells.items())
    ]
    summary = report.extra.get("summary") or []
    notes = (
        ["* flagged: beyond the threshold against the baseline", *summary]
        if summary
        else ["no shift beyond the thresholds"]
    )
    return [Section(f"Drift per {report.params.get('bucket')}", header, rows, notes)]


def _restate_sections(report: Report) -> list[Section]:
    by = report.params.get("by")
    totals = report.extra.get("totals", [])
    everything = [*report.rows, *totals]
    modalities = _present(everything, "restated.gpu_seconds.") or ["text"]
    header = [
        "bucket",
        *([by] if by else []),
        "recorded cal.",
        "requests",
        "recorded GPU s",
        "restated GPU s",
        *(f"{m} share rec -> res" for m in modalities),
        "recorded USD",
        "restated USD",
        "delta USD",
    ]

    def line(row: dict[str, Any]) -> list[str]:
        return [
            row["bucket"],
            *([row[by] or "—"] if by else []),
            row["recorded_calibration"] or "—",
            _num(row["requests"]),
            _num(row["recorded.gpu_seconds"]),
            _num(row["restated.gpu_seconds"]),
            *(
                f"{_pct(row[f'recorded.share.{m}'])} -> {_pct(row[f'restated.share.{m}'])}"
                for m in modalities
            ),
            _usd(row["recorded.usd"]),
            _usd(row["restated.usd"]),
            _usd(row["delta.usd"]),
        ]

    version = report.params.get("calibration_version") or "the recorded seconds"
    rate = report.params.get("usd_per_gpu_hour")
    note = f"Restated with {version}, " + (
        f"priced at a hypothetical {rate:g} USD per GPU hour."
        if rate is not None
        else "priced at each span's recorded rate."
    )
    out = [Section("Recorded and restated", header, [line(r) for r in report.rows])]
    if totals and report.params.get("bucket") != "all":
        out.append(Section("Totals", header, [line(r) for r in totals]))
    out[-1].notes.append(note)
    return out


def _compare_sections(report: Report) -> list[Section]:
    a, b = report.params["a"]["label"], report.params["b"]["label"]

    def value(metric: str, x: float | None) -> str:
        if metric.startswith("share."):
            return _pct(x)
        if metric.startswith("usd"):
            return _usd(x)
        return _num(x)

    rows = []
    for row in report.rows:
        metric = row["metric"]
        change = row["change"]
        shown = (
            ("—" if change is None else f"{change * 100:+.1f} pts")
            if metric.startswith("share.")
            else value(metric, change)
        )
        rows.append(
            [
                metric,
                value(metric, row["a"]),
                value(metric, row["b"]),
                shown,
                _signed_pct(row["relative_change"]),
            ]
        )
    header = ["metric", f"A: {a}", f"B: {b}", "change", "relative"]
    return [Section("Compare, modality line by modality line", header, rows)]


def _subsidy_sections(report: Report) -> list[Section]:
    modalities = _present(report.rows, "cost.") or ["text"]
    header = [
        "tier",
        "mix",
        "requests",
        "revenue",
        "cost",
        *(f"{m} cost" for m in modalities),
        "margin",
        "margin/request",
        "role",
    ]
    rows = [
        [
            r["tier"],
            r["mix"],
            _num(r["requests"]),
            _usd(r["revenue"]),
            _usd(r["cost"]),
            *(_usd(r[f"cost.{m}"]) for m in modalities),
            _usd(r["margin"]),
            _usd(r["margin_per_request"]),
            r["role"],
        ]
        for r in report.rows
    ]
    per_modality = [
        [m["modality"], _usd(m["cost"]), _pct(m["cost_to_revenue"])]
        for m in report.extra.get("by_modality", [])
        if m["cost"]
    ]
    return [
        Section("Revenue against attributed cost (USD, hypothetical cost)", header, rows),
        Section(
            "Cost per modality against revenue",
            ["modality", "cost", "of revenue"],
            per_modality,
            list(report.extra.get("summary", [])),
        ),
    ]


_SECTIONS = {
    "shares": _shares_sections,
    "drift": _drift_sections,
    "restate": _restate_sections,
    "compare": _compare_sections,
    "subsidy": _subsidy_sections,
}


def sections(report: Report) -> list[Section]:
    """The titled tables that show ``report`` in a terminal."""
    make = _SECTIONS.get(report.kind)
    if make is not None:
        return make(report)
    rows = [
        ["—" if r.get(c) is None else str(r.get(c)) for c in report.columns] for r in report.rows
    ]
    return [Section(report.kind, list(report.columns), rows)]


def _input_line(report: Report) -> str:
    seen = report.input
    parts = [
        f"{seen[k]} {label}"
        for k, label in (
            ("spans", "spans"),
            ("modtrace_spans", "modtrace"),
            ("spans_without_modtrace", "without modtrace attributes"),
            ("malformed_lines", "malformed lines"),
            ("malformed_spans", "malformed spans"),
            ("invalid_spans", "invalid"),
        )
        if seen.get(k)
    ]
    return "input: " + (", ".join(parts) if parts else "no spans")


def render_table(report: Report, *, use_rich: bool = False, width: int | None = None) -> str:
    """The report as text tables, with its warnings and notes.

    Args:
        report: The report.
        use_rich: Draw with ``rich`` (falls back to plain text when it is
            not installed).
        width: The console width for ``rich``.
    """
    parts = sections(report)
    if use_rich:
        try:
            return _rich_table(report, parts, width)
        except ImportError:
            pass
    lines: list[str] = []
    for section in parts:
        lines += [
            section.title,
            plain_table(section.header, section.rows) if section.rows else "(no rows)",
        ]
        lines += [f"  {n}" for n in section.notes]
        lines.append("")
    lines.append(_input_line(report))
    lines += [f"warning: {w}" for w in report.warnings]
    return "\n".join(lines)


def _rich_table(report: Report, parts: list[Section], width: int | None) -> str:
    from rich.console import Console
    from rich.table import Table

    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=True)
    for section in parts:
        table = Table(title=section.title, title_justify="left")
        for i, name in enumerate(section.header):
            table.add_column(name, justify="left" if i == 0 else "right")
        for row in section.rows:
            table.add_row(*row)
        console.print(table)
        for note in section.notes:
            console.print(f"  {note}", highlight=False)
    console.print(_input_line(report), highlight=False)
    for warning in report.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}", highlight=False)
    return buffer.getvalue().rstrip("\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    msg = f"not JSON serializable: {type(value).__name__}"
    raise TypeError(msg)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def render_json(report: Report) -> str:
    """The report as one indented JSON object (NaN and infinities become ``null``)."""
    return json.dumps(_finite(report.to_dict()), indent=2, default=_json_default)


def render_csv(report: Report) -> str:
    """The report's rows as CSV, header first; ``None`` is an empty cell."""
    buffer = io.StringIO()
    writer = csv.DictWriter(
        buffer, fieldnames=report.columns, extrasaction="ignore", lineterminator="\n"
    )
    writer.writeheader()
    for row in report.rows:
        writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
    return buffer.getvalue()


def render(report: Report, fmt: str, *, use_rich: bool = False, width: int | None = None) -> str:
    """The report in ``fmt``: ``table``, ``json`` or ``csv``.

    Raises:
        ValueError: an unknown format.
    """
    if fmt == "table":
        return render_table(report, use_rich=use_rich, width=width)
    if fmt == "json":
        return render_json(report)
    if fmt == "csv":
        return render_csv(report)
    msg = f"format {fmt!r}: expected one of {', '.join(FORMATS)}"
    raise ValueError(msg)


# --- Charts ---------------------------------------------------------------------------------
def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        msg = "charts need matplotlib: pip install 'modtrace[plots]'"
        raise ValueError(msg) from exc
    matplotlib.use("Agg")  # files only: no display is needed or wanted
    import matplotlib.pyplot as plt

    return plt


def _shares_chart(report: Report, plt: Any) -> Any:
    by = report.params.get("by")
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in report.rows:
        key = (row.get(by, "") if by else "", row["calibration_version"] or "")
        series.setdefault(key, []).append(row)
    ranked = sorted(series.items(), key=lambda kv: -sum(r["requests"] for r in kv[1]))
    shown = ranked[:MAX_SERIES]
    modalities = _present(report.rows, "gpu_seconds.") or ["text"]
    fig, axes = plt.subplots(
        len(shown) or 1, 1, figsize=(10, 3.2 * max(len(shown), 1)), squeeze=False
    )
    for ax, ((group, version), rows) in zip(axes[:, 0], shown, strict=False):
        buckets = [r["bucket"] for r in rows]
        bottom = [0.0] * len(rows)
        for m in modalities:
            values = [r[f"share.{m}"] or 0.0 for r in rows]
            ax.bar(buckets, values, bottom=bottom, label=m, color=COLOURS[m], width=0.8)
            bottom = [b + v for b, v in zip(bottom, values, strict=True)]
        title = " · ".join(x for x in (group, f"calibration {version}" if version else "") if x)
        ax.set_title(title or "all requests", fontsize=10)
        ax.set_ylim(0, 1)
        ax.set_ylabel("share of GPU seconds")
        ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
        ax.tick_params(axis="x", labelrotation=45, labelsize=8)
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    fig.suptitle(f"Modality share of GPU seconds per {report.params.get('bucket')}")
    return fig


def _drift_chart(report: Report, plt: Any) -> Any:
    by = report.params.get("by")
    fig, (units_ax, share_ax) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    lines: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for row in report.rows:
        key = (row.get(by, "") if by else "", row["metric"], row["calibration_version"] or "")
        lines.setdefault(key, []).append(row)
    for (group, metric, version), rows in sorted(lines.items()):
        share = metric.startswith("share.")
        ax = share_ax if share else units_ax
        if share:
            ys = [r["value"] for r in rows]
        else:
            ys = [r["value"] / r["baseline"] if r["baseline"] else None for r in rows]
        xs = [r["bucket"] for r in rows]
        label = " ".join(x for x in (group, metric, f"[{version}]" if version else "") if x)
        colour = COLOURS.get(metric.removeprefix("share.").split(".")[0])
        drawn = ax.plot(
            xs,
            [y if y is not None else float("nan") for y in ys],
            marker="o",
            label=label,
            color=colour if share else None,
            markersize=3,
        )
        flagged = [(x, y) for x, y, r in zip(xs, ys, rows, strict=True) if r["flagged"]]
        if flagged:
            ax.scatter(
                *zip(*flagged, strict=True),
                s=80,
                facecolors="none",
                edgecolors=drawn[0].get_color(),
                linewidths=1.5,
            )
    units_ax.axhline(1.0, color="grey", linewidth=0.8)
    units_ax.set_ylabel("per request / baseline")
    units_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    share_ax.set_ylabel("share of GPU seconds")
    share_ax.yaxis.set_major_formatter(lambda v, _: f"{v:.0%}")
    share_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    share_ax.tick_params(axis="x", labelrotation=45, labelsize=8)
    fig.suptitle("Drift: units per request and modality shares (circled: flagged)")
    return fig


def _compare_chart(report: Report, plt: Any) -> Any:
    rows = [r for r in report.rows if r["metric"].startswith("gpu_seconds.")]
    labels = [r["modality"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(rows))
    ax.bar(
        [x - 0.2 for x in xs],
        [r["a"] or 0 for r in rows],
        width=0.4,
        label=f"A: {report.params['a']['label']}",
        color="#9DB4D8",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [r["b"] or 0 for r in rows],
        width=0.4,
        label=f"B: {report.params['b']['label']}",
        color="#4C72B0",
    )
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("GPU seconds per request")
    ax.legend(fontsize=8)
    fig.suptitle("Compare: GPU seconds per request, modality by modality")
    return fig


def _restate_chart(report: Report, plt: Any) -> Any:
    totals = report.extra.get("totals", [])
    modalities = _present(totals, "restated.gpu_seconds.") or ["text"]
    fig, ax = plt.subplots(figsize=(8, 4))
    xs = range(len(modalities))
    recorded = [sum(r[f"recorded.gpu_seconds.{m}"] for r in totals) for m in modalities]
    restated = [sum(r[f"restated.gpu_seconds.{m}"] for r in totals) for m in modalities]
    ax.bar([x - 0.2 for x in xs], recorded, width=0.4, label="recorded", color="#BBBBBB")
    ax.bar(
        [x + 0.2 for x in xs],
        restated,
        width=0.4,
        label=f"restated ({report.params.get('calibration_version') or 'recorded seconds'})",
        color="#4C72B0",
    )
    ax.set_xticks(list(xs), modalities)
    ax.set_ylabel("GPU seconds")
    ax.legend(fontsize=8)
    fig.suptitle("Restated attribution per modality")
    return fig


def _subsidy_chart(report: Report, plt: Any) -> Any:
    rows = report.rows
    labels = [f"{r['tier']}/{r['mix']}" for r in rows]
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 1.5))
    colours = ["#55A868" if r["margin"] >= 0 else "#C44E52" for r in rows]
    ax.barh(labels, [r["margin"] for r in rows], color=colours)
    ax.axvline(0, color="grey", linewidth=0.8)
    ax.set_xlabel("margin, USD (revenue - hypothetical attributed cost)")
    fig.suptitle("Who subsidises whom")
    return fig


_CHARTS = {
    "shares": _shares_chart,
    "drift": _drift_chart,
    "compare": _compare_chart,
    "restate": _restate_chart,
    "subsidy": _subsidy_chart,
}


def write_chart(report: Report, path: str | Path | IO[bytes]) -> None:
    """Draw the report's chart as a PNG: shares stacked over time, drift lines, bars.

    Raises:
        ValueError: ``matplotlib`` is missing, or the report has no rows.
    """
    if not report.rows:
        msg = "no rows to chart"
        raise ValueError(msg)
    plt = _pyplot()
    fig = _CHARTS[report.kind](report, plt)
    try:
        fig.tight_layout()
        fig.savefig(path, format="png", dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)
