"""Fit GPU seconds per unit from single-modality probes, by ordinary least squares.

The model, over every ``ok`` probe of kind ``probe`` (warm-ups and held-out
requests are left out)::

    gpu_seconds = overhead + w_text * text.tokens + sum(w_m * unit_m) + noise

``overhead`` is a per-request intercept (scheduling, sampling, the decode of
``max_tokens``), reported separately: it is not a weight, and attribution
never uses it (reconciliation spreads it over the modalities). Every probe
carries some text, so ``w_text`` is fitted jointly with the others.

**Which unit per modality.** For each media modality every unit that varies
across its probes is a candidate (image: tokens, pixels, tiles; audio:
seconds, frames, tokens; video: seconds, frames, tokens). Each candidate is
scored by a fit on the text probes and that modality's probes alone
(``overhead + w_text * text.tokens + w * unit``); the one with the smallest
residual standard error (equivalently, the highest R^2: same data, same
number of parameters) is chosen. Candidates within 5 % of the best
(``tie_tolerance``) are a tie (for Qwen-style processors tokens are
pixels / 784 up to rounding, so noise alone would pick): the tie goes to
tokens, then tiles, frames, seconds, pixels. The choice, the rule applied
and every candidate's score are recorded. To compare versions weight by
weight, pin the units (``units={"image": "image.tokens"}``). Only the chosen
unit gets a weight: two weights of one modality would count its cost twice.

**Errors.** Standard errors are the classical OLS ones,
``sqrt(diag(s^2 (X'X)^-1))`` with ``s^2 = RSS / (n - p)``; intervals use
Student's t with ``n - p`` degrees of freedom. They are exact when the noise
is independent, of constant variance and normal; with noise that grows with
request size they are too narrow for large requests (look at the residual
plots). The full covariance is kept so that intervals on attributed seconds
can account for correlated weights.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from ..units import UNIT_NAMES, modality_of
from ._stats import two_sided
from .probes import ProbeFile, ProbeRecord

__all__ = [
    "OVERHEAD",
    "Estimate",
    "FitError",
    "FitResult",
    "OlsFit",
    "Residual",
    "UnitChoice",
    "UnitScore",
    "candidate_units",
    "fit_probe_file",
    "fit_probes",
    "ols",
    "residual_plots",
]

#: The name of the per-request intercept in fits and covariances.
OVERHEAD = "overhead"
TEXT_UNIT = "text.tokens"
MEDIA: tuple[str, ...] = ("image", "audio", "video")
#: Candidates whose residual SE is within this fraction of the best are tied.
#: A residual SE estimated on n probes is itself uncertain by about
#: 1 / sqrt(2 (n - p)) (16 % at 20 degrees of freedom): 5 % keeps the choice
#: from flapping between near-proportional units from one run to the next.
TIE_TOLERANCE = 0.05
#: Among tied candidates, the unit kind taken: tokens are what the engine
#: schedules and reports, tiles and frames what the encoder runs on.
_PREFERENCE: tuple[str, ...] = ("tokens", "tiles", "frames", "seconds", "pixels", "count")


class FitError(ValueError):
    """The probes cannot support the fit asked for; the message says why."""


# --- Ordinary least squares ------------------------------------------------------
@dataclass(frozen=True)
class OlsFit:
    """An ordinary least-squares fit with its classical covariance.

    Attributes:
        names: Column names, in order.
        coef: Estimated coefficients.
        cov: ``s^2 (X'X)^-1``.
        fitted: Fitted values.
        residuals: ``y - fitted``.
        rss: Residual sum of squares.
        tss: Total sum of squares about the mean of ``y``.
    """

    names: tuple[str, ...]
    coef: np.ndarray
    cov: np.ndarray
    fitted: np.ndarray
    residuals: np.ndarray
    rss: float
    tss: float

    @property
    def n(self) -> int:
        """Observations."""
        return len(self.fitted)

    @property
    def p(self) -> int:
        """Parameters."""
        return len(self.names)

    @property
    def df(self) -> int:
        """Residual degrees of freedom, ``n - p``."""
        return self.n - self.p

    @property
    def r2(self) -> float:
        """Coefficient of determination, ``1 - RSS / TSS``."""
        return 1.0 - self.rss / self.tss if self.tss > 0 else 1.0

    @property
    def adj_r2(self) -> float:
        """R^2 adjusted for the number of parameters."""
        return 1.0 - (1.0 - self.r2) * (self.n - 1) / self.df

    @property
    def residual_se(self) -> float:
        """Residual standard error, ``sqrt(RSS / (n - p))``."""
        return math.sqrt(self.rss / self.df)

    @property
    def stderr(self) -> np.ndarray:
        """Standard errors of the coefficients."""
        return np.sqrt(np.clip(np.diag(self.cov), 0.0, None))


def ols(x: np.ndarray, y: np.ndarray, names: Sequence[str]) -> OlsFit:
    """Fit ``y ~ x`` by least squares (``x`` includes the intercept column if wanted).

    Columns are scaled to unit norm before the QR solve: unit counts span
    ten orders of magnitude (one request, a million pixels).

    Raises:
        FitError: fewer observations than parameters plus one, or columns
            that are linearly dependent (the message names them).
    """
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    n, p = x.shape
    if n <= p:
        msg = f"{n} probes cannot fit {p} parameters ({', '.join(names)}): need at least {p + 1}"
        raise FitError(msg)
    scale = np.linalg.norm(x, axis=0)
    zero = [names[i] for i in range(p) if scale[i] == 0]
    if zero:
        msg = f"no probe has any {', '.join(zero)}: cannot fit its weight"
        raise FitError(msg)
    q, r = np.linalg.qr(x / scale)
    diag = np.abs(np.diag(r))
    if diag.min() < 1e-10 * diag.max():
        worst = names[int(np.argmin(diag))]
        msg = (
            f"the probes cannot separate {worst} from the other columns "
            f"({', '.join(names)}): they move together; add probes that vary it alone"
        )
        raise FitError(msg)
    coef_scaled = np.linalg.solve(r, q.T @ y)
    fitted = x @ (coef_scaled / scale)
    residuals = y - fitted
    rss = float(residuals @ residuals)
    r_inv = np.linalg.solve(r, np.eye(p))
    cov = (r_inv @ r_inv.T) * (rss / (n - p)) / np.outer(scale, scale)
    return OlsFit(
        names=tuple(names),
        coef=coef_scaled / scale,
        cov=cov,
        fitted=fitted,
        residuals=residuals,
        rss=rss,
        tss=float(((y - y.mean()) ** 2).sum()),
    )


# --- Results -------------------------------------------------------------------
class Estimate(BaseModel):
    """A fitted value with its standard error."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    value: float
    stderr: float


class UnitScore(BaseModel):
    """How well one candidate unit explains its modality (fit on text + that modality)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    unit: str
    weight: Estimate
    r2: float
    residual_se: float
    n: int


class UnitChoice(BaseModel):
    """The unit chosen for a modality, why, and every candidate's score (best first)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    modality: str
    unit: str
    rule: str
    scores: list[UnitScore] = Field(default_factory=list)


class Residual(BaseModel):
    """One probe's fitted units, measured and fitted GPU seconds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    modality: str
    size: str
    units: dict[str, float] = Field(default_factory=dict)
    measured: float
    fitted: float
    residual: float


class FitResult(BaseModel):
    """Fitted weights (GPU seconds per unit) with their errors and the fit's quality.

    Attributes:
        weights: One weight per probed modality: ``text.tokens`` and the
            chosen unit of each media modality.
        overhead: The per-request intercept, in GPU seconds.
        covariance: Covariance of ``overhead`` and the weights, by name.
        n: Probes fitted.
        df: Residual degrees of freedom.
        r2: R^2 of the joint fit.
        adj_r2: Adjusted R^2.
        residual_se: Residual standard error, in GPU seconds.
        choices: The unit chosen per media modality, with the alternatives.
        residuals: One row per fitted probe.
        excluded: Probe ids not fitted, by reason (``warmup``, ``holdout``,
            ``failed``, ``superseded``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    weights: dict[str, Estimate]
    overhead: Estimate
    covariance: dict[str, dict[str, float]]
    n: int
    df: int
    r2: float
    adj_r2: float
    residual_se: float
    choices: dict[str, UnitChoice] = Field(default_factory=dict)
    residuals: list[Residual] = Field(default_factory=list)
    excluded: dict[str, list[str]] = Field(default_factory=dict)

    def interval(self, name: str, confidence: float = 0.95) -> tuple[float, float]:
        """The two-sided t interval of a weight (or of ``overhead``) at ``confidence``."""
        est = self.overhead if name == OVERHEAD else self.weights.get(name)
        if est is None:
            msg = f"no fitted weight for {name!r}; fitted: {', '.join(self.weights)}"
            raise KeyError(msg)
        half = two_sided(confidence, self.df) * est.stderr
        return est.value - half, est.value + half


# --- Fitting ----------------------------------------------------------------------
def candidate_units(records: Sequence[ProbeRecord], modality: str) -> list[str]:
    """Units of ``modality`` that vary across its probes, in ``UNIT_NAMES`` order."""
    own = [r for r in records if r.modality == modality]
    out = []
    for unit in UNIT_NAMES:
        if modality_of(unit) != modality:
            continue
        values = {r.units[unit] for r in own}
        if len(values) > 1:
            out.append(unit)
    return out


def _design(records: Sequence[ProbeRecord], units: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    x = np.array([[1.0, *(r.units[u] for u in units)] for r in records])
    y = np.array([r.gpu_seconds for r in records])
    return x, y


def _score(records: Sequence[ProbeRecord], modality: str, unit: str) -> UnitScore:
    subset = [r for r in records if r.modality in ("text", modality)]
    x, y = _design(subset, (TEXT_UNIT, unit))
    fit = ols(x, y, (OVERHEAD, TEXT_UNIT, unit))
    return UnitScore(
        unit=unit,
        weight=Estimate(value=float(fit.coef[2]), stderr=float(fit.stderr[2])),
        r2=fit.r2,
        residual_se=fit.residual_se,
        n=fit.n,
    )


def _choose(
    records: Sequence[ProbeRecord], modality: str, forced: str | None, tie_tolerance: float
) -> UnitChoice:
    candidates = candidate_units(records, modality)
    if forced is not None:
        if modality_of(forced) != modality:
            msg = f"unit {forced!r} is not a {modality} unit"
            raise FitError(msg)
        if forced not in candidates:
            msg = (
                f"{forced} does not vary across the {modality} probes; "
                f"candidates: {', '.join(candidates) or 'none'}"
            )
            raise FitError(msg)
    if not candidates:
        msg = f"no {modality} unit varies across the {modality} probes: probe several sizes"
        raise FitError(msg)
    scores = sorted(
        (_score(records, modality, u) for u in candidates),
        key=lambda s: (s.residual_se, UNIT_NAMES.index(s.unit)),
    )
    if forced is not None:
        return UnitChoice(modality=modality, unit=forced, rule="forced", scores=scores)
    if len(scores) == 1:
        return UnitChoice(
            modality=modality, unit=scores[0].unit, rule="only candidate", scores=scores
        )
    best = scores[0]
    tied = [s for s in scores if s.residual_se <= best.residual_se * (1.0 + tie_tolerance)]
    preferred = min(tied, key=lambda s: _PREFERENCE.index(s.unit.partition(".")[2]))
    if preferred is best:
        rule = "smallest residual standard error"
    else:
        rule = (
            f"within {tie_tolerance:.0%} of the smallest residual standard error "
            f"({best.unit}): {preferred.unit.partition('.')[2]} preferred"
        )
    return UnitChoice(modality=modality, unit=preferred.unit, rule=rule, scores=scores)


def fit_probes(
    records: Iterable[ProbeRecord],
    *,
    units: Mapping[str, str] | None = None,
    allow_failed: bool = False,
    tie_tolerance: float = TIE_TOLERANCE,
) -> FitResult:
    """Fit weights from probe records (see the module doc for the model).

    Args:
        records: Probe records; when an id appears several times the last
            one counts and the earlier ones are reported as superseded.
        units: Force the unit of a modality (``{"image": "image.tiles"}``)
            instead of choosing the best one.
        allow_failed: Fit even though some probes failed (they are left out
            and listed in ``excluded["failed"]``); without it, failures are
            an error.
        tie_tolerance: Candidate units whose residual SE is within this
            fraction of the best are tied; the tie goes to tokens, tiles,
            frames, seconds, pixels, in that order.

    Raises:
        FitError: failed probes (without ``allow_failed``), too few probes,
            or units the probes cannot separate.
    """
    latest: dict[str, ProbeRecord] = {}
    superseded = []
    for record in records:
        if record.id in latest:
            superseded.append(record.id)
            del latest[record.id]
        latest[record.id] = record
    excluded: dict[str, list[str]] = {"warmup": [], "holdout": [], "failed": []}
    fitted: list[ProbeRecord] = []
    for record in latest.values():
        if record.status == "failed":
            excluded["failed"].append(record.id)
        elif record.kind != "probe":
            excluded[record.kind].append(record.id)
        else:
            fitted.append(record)
    if superseded:
        excluded["superseded"] = superseded
    if excluded["failed"] and not allow_failed:
        failed = [latest[i] for i in excluded["failed"]]
        shown = "; ".join(f"{r.id}: {r.error}" for r in failed[:3])
        more = f" (and {len(failed) - 3} more)" if len(failed) > 3 else ""
        msg = (
            f"{len(failed)} probe(s) failed: {shown}{more}. Re-run them "
            "('modtrace calibrate run --retry-failed') or fit without them (--allow-failed)"
        )
        raise FitError(msg)
    if not any(r.modality == "text" for r in fitted):
        msg = "no text probe succeeded: the text weight cannot be fitted"
        raise FitError(msg)
    forced = dict(units or {})
    unknown = set(forced) - set(MEDIA)
    if unknown:
        msg = f"units: {', '.join(sorted(unknown))} is not a media modality (image, audio, video)"
        raise FitError(msg)

    choices = {
        m: _choose(fitted, m, forced.get(m), tie_tolerance)
        for m in MEDIA
        if any(r.modality == m for r in fitted)
    }
    names = [TEXT_UNIT, *(c.unit for c in choices.values())]
    x, y = _design(fitted, names)
    fit = ols(x, y, (OVERHEAD, *names))
    se = fit.stderr
    estimates = {
        name: Estimate(value=float(fit.coef[i]), stderr=float(se[i]))
        for i, name in enumerate(fit.names)
    }
    covariance = {
        a: {b: float(fit.cov[i, j]) for j, b in enumerate(fit.names)}
        for i, a in enumerate(fit.names)
    }
    residuals = [
        Residual(
            id=r.id,
            modality=r.modality,
            size=r.size,
            units={n: r.units[n] for n in names},
            measured=float(y[k]),
            fitted=float(fit.fitted[k]),
            residual=float(fit.residuals[k]),
        )
        for k, r in enumerate(fitted)
    ]
    return FitResult(
        weights={n: estimates[n] for n in names},
        overhead=estimates[OVERHEAD],
        covariance=covariance,
        n=fit.n,
        df=fit.df,
        r2=fit.r2,
        adj_r2=fit.adj_r2,
        residual_se=fit.residual_se,
        choices=choices,
        residuals=residuals,
        excluded={k: v for k, v in excluded.items() if v},
    )


def fit_probe_file(
    probes: ProbeFile, *, units: Mapping[str, str] | None = None, allow_failed: bool = False
) -> FitResult:
    """:func:`fit_probes` on every record of a probe file."""
    return fit_probes(probes.records, units=units, allow_failed=allow_failed)


# --- Plots ------------------------------------------------------------------------
def residual_plots(fit: FitResult, directory: str | Path, *, prefix: str = "") -> list[Path]:
    """Write residual plots as PNG files (needs matplotlib: ``pip install modtrace[plots]``).

    Writes ``residuals.png`` (residual against fitted GPU seconds, one colour
    per modality) and ``residuals-<modality>.png`` (residual against the
    modality's chosen unit, and against text tokens for text).

    Returns:
        The paths written.

    Raises:
        ImportError: matplotlib is not installed (the message says how to get it).
    """
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError as exc:
        msg = "residual plots need matplotlib: pip install 'modtrace[plots]'"
        raise ImportError(msg) from exc

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    by_modality: dict[str, list[Residual]] = {}
    for row in fit.residuals:
        by_modality.setdefault(row.modality, []).append(row)
    written = []

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for modality, rows in by_modality.items():
        ax.scatter([r.fitted for r in rows], [r.residual for r in rows], s=14, label=modality)
    ax.axhline(0.0, color="grey", linewidth=0.8)
    ax.set_xlabel("fitted GPU seconds")
    ax.set_ylabel("residual (measured - fitted), GPU seconds")
    ax.set_title(f"residuals: R^2 {fit.r2:.4f}, residual SE {fit.residual_se:.3g} s")
    ax.legend()
    written.append(_save(fig, out / f"{prefix}residuals.png"))
    plt.close(fig)

    for modality, rows in by_modality.items():
        unit = TEXT_UNIT if modality == "text" else fit.choices[modality].unit
        fig, ax = plt.subplots(figsize=(7, 4.5))
        ax.scatter([r.units.get(unit, 0.0) for r in rows], [r.residual for r in rows], s=14)
        ax.axhline(0.0, color="grey", linewidth=0.8)
        ax.set_xlabel(unit)
        ax.set_ylabel("residual, GPU seconds")
        ax.set_title(f"{modality} probes: residual against {unit}")
        written.append(_save(fig, out / f"{prefix}residuals-{modality}.png"))
        plt.close(fig)
    return written


def _save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return path
