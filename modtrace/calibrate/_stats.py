"""Student's t quantiles without SciPy: the regularized incomplete beta, inverted by bisection.

The incomplete beta uses the continued fraction of Numerical Recipes
(Press et al., 3rd ed., section 6.4, ``betacf``) evaluated with the
modified Lentz method; the t CDF is ``1 - I_x(df/2, 1/2) / 2`` with
``x = df / (df + t^2)`` for ``t > 0``.
"""

from __future__ import annotations

import math
from statistics import NormalDist

__all__ = ["normal_quantile", "t_cdf", "t_quantile", "two_sided"]

_EPS = 1e-15
_TINY = 1e-300


def _betacf(a: float, b: float, x: float) -> float:
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 10_000):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)),
                   -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):  # fmt: skip
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + aa / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            return h
    return h  # pragma: no cover - converges in well under 100 steps for t quantiles


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)``."""
    if not 0.0 <= x <= 1.0:
        msg = f"betainc: x must be in [0, 1], got {x}"
        raise ValueError(msg)
    if x in (0.0, 1.0):
        return x
    ln_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(ln_front)
    # The continued fraction converges fast on one side of the mean; use symmetry on the other.
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        msg = f"degrees of freedom must be positive, got {df}"
        raise ValueError(msg)
    tail = 0.5 * betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def normal_quantile(q: float) -> float:
    """The standard normal quantile."""
    return NormalDist().inv_cdf(q)


def t_quantile(q: float, df: float) -> float:
    """The ``q`` quantile of Student's t with ``df`` degrees of freedom (``inf``: normal)."""
    if not 0.0 < q < 1.0:
        msg = f"quantile level must be in (0, 1), got {q}"
        raise ValueError(msg)
    if math.isinf(df):
        return normal_quantile(q)
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < q:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


def two_sided(confidence: float, df: float = math.inf) -> float:
    """The half-width multiplier of a two-sided interval at ``confidence`` (e.g. 1.96 at 0.95)."""
    if not 0.0 < confidence < 1.0:
        msg = f"confidence must be in (0, 1), got {confidence}"
        raise ValueError(msg)
    return t_quantile(0.5 + confidence / 2.0, df)
