"""Error bars on attributed seconds and shares, from the weights' standard errors.

Two methods, both pure:

* **Delta method** (default where it applies: methods ``weights`` and
  ``unreconciled``). With estimates ``E_m = sum(w_u c_u for u in m)`` and
  ``S = sum(E_m)``, a modality's share is ``s_m = E_m / S`` and its gradient
  in the weights is ``ds_m/dw_u = c_u (1[u in m] - s_m) / S``. Then
  ``Var(s_m) = g' Cov(w) g``; reconciled seconds are ``T s_m`` (the measured
  total ``T`` carries no weight error), unreconciled seconds are ``E_m``
  with ``Var(E_m) = sum(c_u c_v Cov(w_u, w_v) for u, v in m)``. Intervals
  are ``value ± z sd`` with ``z`` the normal quantile at the confidence,
  clipped to ``[0, 1]`` for shares and ``[0, inf)`` for seconds. First order:
  accurate while the weights' relative errors are small.
* **Monte Carlo** (``method="monte_carlo"``; used automatically for
  ``mixed`` attributions, where a component split fell back to weights):
  draw weight vectors from ``N(w, Cov(w))`` with a fixed seed (negative draws
  are clipped to 0: a weight cannot be negative), re-run
  :func:`~modtrace.attribution.attribute` for each, and take the central
  percentiles. Reproducible, exact in the model, slower (``samples``
  attributions).

Attributions by component timers alone (method ``components``) do not
depend on the weights: their interval has zero width.

The covariance comes from the calibration's ``covariance`` field when it
has one (calibration records do: the fitted weights are correlated), else
from each weight's ``stderr`` as if independent; a weight without a
``stderr`` counts as exact, and a note says so.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..attribution import Attribution, AttributionConfig, attribute
from ..calibration import Calibration
from ..timers import GpuTimers
from ..units import UnitCounts, modality_of
from ._stats import two_sided

__all__ = ["AttributionIntervals", "attribution_intervals", "weight_covariance"]

Bounds = tuple[float, float]


class AttributionIntervals(BaseModel):
    """Intervals on one attribution at a stated confidence.

    Attributes:
        confidence: E.g. 0.95.
        method: ``delta``, ``monte_carlo`` or ``exact`` (no weight uncertainty).
        gpu_seconds: ``(low, high)`` attributed seconds per modality.
        share: ``(low, high)`` share per modality.
        stderr: Standard deviation of attributed seconds per modality.
        samples: Draws used (Monte Carlo).
        seed: Seed used (Monte Carlo).
        notes: Assumptions taken (independent weights, exact weights...).
    """

    model_config = ConfigDict(frozen=True)

    confidence: float
    method: Literal["delta", "monte_carlo", "exact"]
    gpu_seconds: dict[str, Bounds]
    share: dict[str, Bounds]
    stderr: dict[str, float] = Field(default_factory=dict)
    samples: int | None = None
    seed: int | None = None
    notes: list[str] = Field(default_factory=list)


def weight_covariance(
    calibration: Calibration, units: list[str] | None = None
) -> tuple[dict[tuple[str, str], float], list[str]]:
    """The covariance of the calibration's weights, and notes on how it was obtained.

    Args:
        calibration: The weights; a ``covariance`` field (``{a: {b: cov}}``) is used when present.
        units: Restrict to these units (default: every weighted unit).
    """
    names = [u for u in (units or calibration.weights) if u in calibration.weights]
    notes: list[str] = []
    stored = getattr(calibration, "covariance", None)
    cov: dict[tuple[str, str], float] = {}
    if isinstance(stored, Mapping) and all(u in stored for u in names):
        for a in names:
            row = stored[a]
            for b in names:
                cov[a, b] = float(row.get(b, 0.0))
        return cov, notes
    exact = []
    for a in names:
        se = calibration.weights[a].stderr
        if se is None:
            exact.append(a)
        cov[a, a] = (se or 0.0) ** 2
        for b in names:
            cov.setdefault((a, b), 0.0)
    notes.append("weights treated as independent (no covariance in the calibration)")
    if exact:
        notes.append(f"no stderr for {', '.join(exact)}: treated as exact")
    return cov, notes


def attribution_intervals(
    units: UnitCounts | Mapping[str, float],
    timers: GpuTimers | Mapping[str, object] | None,
    calibration: Calibration,
    *,
    attribution: Attribution | None = None,
    confidence: float = 0.95,
    method: Literal["auto", "delta", "monte_carlo"] = "auto",
    samples: int = 2000,
    seed: int = 0,
    config: AttributionConfig | None = None,
) -> AttributionIntervals:
    """Intervals on the seconds and shares that ``attribute(units, timers, calibration)`` gives.

    Args:
        units: The request's unit counts.
        timers: Its timers (as passed to ``attribute``).
        calibration: The weights, with standard errors (and covariance).
        attribution: The point attribution, if already computed.
        confidence: Two-sided confidence level.
        method: ``auto`` (delta where it applies, Monte Carlo for ``mixed``),
            ``delta`` or ``monte_carlo``.
        samples: Monte Carlo draws.
        seed: Monte Carlo seed (results are reproducible).
        config: The attribution configuration used.
    """
    units = units if isinstance(units, UnitCounts) else UnitCounts(units)
    if timers is not None and not isinstance(timers, GpuTimers):
        timers = GpuTimers.model_validate(timers)
    point = attribution or attribute(units, timers, calibration, config=config)
    if point.method == "components":
        return AttributionIntervals(
            confidence=confidence,
            method="exact",
            gpu_seconds={m: (s, s) for m, s in point.gpu_seconds.items()},
            share={m: (s, s) for m, s in point.share.items()},
            stderr=dict.fromkeys(point.gpu_seconds, 0.0),
            notes=["attributed by component timers: no weight uncertainty"],
        )
    if method == "monte_carlo" or (method == "auto" and point.method == "mixed"):
        return _monte_carlo(units, timers, calibration, point, confidence, samples, seed, config)
    if point.method == "mixed":
        msg = "the delta method does not apply to a mixed attribution: use monte_carlo"
        raise ValueError(msg)
    return _delta(units, calibration, point, confidence)


def _used_units(units: UnitCounts, calibration: Calibration) -> list[str]:
    return [u for u, c in units.items() if c > 0 and calibration.weight(u) is not None]


def _delta(
    units: UnitCounts, calibration: Calibration, point: Attribution, confidence: float
) -> AttributionIntervals:
    used = _used_units(units, calibration)
    cov, notes = weight_covariance(calibration, used)
    estimate: dict[str, float] = {}
    for u in used:
        m = modality_of(u)
        estimate[m] = estimate.get(m, 0.0) + calibration.weights[u].value * units[u]
    total_estimate = math.fsum(estimate.values())
    z = two_sided(confidence)
    seconds_b: dict[str, Bounds] = {}
    share_b: dict[str, Bounds] = {}
    stderr: dict[str, float] = {}
    for m, seconds in point.gpu_seconds.items():
        share = point.share[m]
        if m not in estimate or total_estimate <= 0:
            # ``unknown`` and zero-estimate cases do not move with the weights.
            seconds_b[m], share_b[m], stderr[m] = (seconds, seconds), (share, share), 0.0
            continue
        grad = {
            u: units[u] * ((1.0 if modality_of(u) == m else 0.0) - share) / total_estimate
            for u in used
        }
        var_share = math.fsum(grad[a] * grad[b] * cov[a, b] for a in used for b in used)
        sd_share = math.sqrt(max(var_share, 0.0))
        if point.reconciled and point.measured_gpu_seconds is not None:
            sd_seconds = point.measured_gpu_seconds * sd_share
        else:
            own = [u for u in used if modality_of(u) == m]
            var = math.fsum(units[a] * units[b] * cov[a, b] for a in own for b in own)
            sd_seconds = math.sqrt(max(var, 0.0))
        stderr[m] = sd_seconds
        seconds_b[m] = (max(seconds - z * sd_seconds, 0.0), seconds + z * sd_seconds)
        share_b[m] = (max(share - z * sd_share, 0.0), min(share + z * sd_share, 1.0))
    return AttributionIntervals(
        confidence=confidence,
        method="delta",
        gpu_seconds=seconds_b,
        share=share_b,
        stderr=stderr,
        notes=notes,
    )


def _cholesky(matrix: list[list[float]]) -> list[list[float]] | None:
    """Lower-triangular ``L`` with ``L L' = matrix``, or ``None`` if not positive semi-definite."""
    n = len(matrix)
    low = [[0.0] * n for _ in range(n)]
    scale = max((abs(matrix[i][i]) for i in range(n)), default=0.0)
    for i in range(n):
        for j in range(i + 1):
            s = matrix[i][j] - math.fsum(low[i][k] * low[j][k] for k in range(j))
            if i == j:
                if s < -1e-12 * scale:
                    return None
                low[i][i] = math.sqrt(max(s, 0.0))
            else:
                low[i][j] = s / low[j][j] if low[j][j] > 0 else 0.0
    return low


def _percentile(sorted_values: list[float], q: float) -> float:
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _monte_carlo(
    units: UnitCounts,
    timers: GpuTimers | None,
    calibration: Calibration,
    point: Attribution,
    confidence: float,
    samples: int,
    seed: int,
    config: AttributionConfig | None,
) -> AttributionIntervals:
    if samples < 10:
        msg = f"samples: need at least 10 Monte Carlo draws, got {samples}"
        raise ValueError(msg)
    names = list(calibration.weights)
    cov, notes = weight_covariance(calibration, names)
    low = _cholesky([[cov[a, b] for b in names] for a in names])
    if low is None:
        notes.append("covariance not positive semi-definite: weights drawn independently")
        low = [[math.sqrt(cov[a, a]) if a == b else 0.0 for b in names] for a in names]
    rng = random.Random(seed)
    means = [calibration.weights[u].value for u in names]
    draws_s: dict[str, list[float]] = {m: [] for m in point.gpu_seconds}
    draws_f: dict[str, list[float]] = {m: [] for m in point.gpu_seconds}
    clipped = 0
    for _ in range(samples):
        normal = [rng.gauss(0.0, 1.0) for _ in names]
        weights = {}
        for i, u in enumerate(names):
            value = means[i] + math.fsum(low[i][k] * normal[k] for k in range(i + 1))
            clipped += value < 0
            weights[u] = max(value, 0.0)
        drawn = attribute(
            units, timers, Calibration.from_weights(weights, calibration.version), config=config
        )
        for m in draws_s:
            draws_s[m].append(drawn.gpu_seconds.get(m, 0.0))
            draws_f[m].append(drawn.share.get(m, 0.0))
    if clipped:
        notes.append(f"{clipped} negative weight draws clipped to 0")
    q_lo, q_hi = (1.0 - confidence) / 2.0, (1.0 + confidence) / 2.0
    seconds_b, share_b, stderr = {}, {}, {}
    for m in draws_s:
        s_sorted, f_sorted = sorted(draws_s[m]), sorted(draws_f[m])
        seconds_b[m] = (_percentile(s_sorted, q_lo), _percentile(s_sorted, q_hi))
        share_b[m] = (_percentile(f_sorted, q_lo), _percentile(f_sorted, q_hi))
        mean = math.fsum(s_sorted) / samples
        stderr[m] = math.sqrt(math.fsum((v - mean) ** 2 for v in s_sorted) / (samples - 1))
    return AttributionIntervals(
        confidence=confidence,
        method="monte_carlo",
        gpu_seconds=seconds_b,
        share=share_b,
        stderr=stderr,
        samples=samples,
        seed=seed,
        notes=notes,
    )
