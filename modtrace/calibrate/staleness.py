"""Is a calibration still fit to attribute a span? Reasons it is not, as plain sentences.

Weights decay (tokenizer updates, encoder swaps, quantization, driver
updates): the seed asks for recalibration monthly or after any serving-stack
change. A calibration is stale for a span when:

* it is older than ``max_age`` (default 30 days) at the span's time;
* it was measured on another model than the span's;
* it was measured with another preprocessor than the span's: a different
  profile, or a different counter ``id@version`` for a modality the span
  carries (the units no longer mean what the weights were fitted on).

The result is a list of reasons (empty: fresh). The span processor turns a
non-empty list into a warning and a mark on the span, through
:class:`StalenessCheck`, which caches what does not change from span to span
so that the check costs a comparison of integers and a dictionary look-up.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from datetime import datetime, timedelta, timezone

from ..calibration import Calibration

__all__ = ["DEFAULT_MAX_AGE", "FUTURE_SKEW", "StalenessCheck", "is_stale", "staleness_reasons"]

#: Recalibrate at least monthly.
DEFAULT_MAX_AGE = timedelta(days=30)
#: A calibration created later than this after the span is flagged (clock or restatement error).
FUTURE_SKEW = timedelta(minutes=5)


def _utc(moment: datetime) -> datetime:
    # Naive times are taken as UTC, as the calibration examples write them.
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment


def _profile_of(preprocessor: str) -> str:
    """``"qwen2.5-vl (image qwen2.5-vl.image@1)"`` -> ``"qwen2.5-vl"``."""
    return preprocessor.split(" (", 1)[0].strip()


def staleness_reasons(
    calibration: Calibration,
    *,
    now: datetime | None = None,
    model: str | None = None,
    preprocessor: str | None = None,
    counters: Mapping[str, str] | None = None,
    max_age: timedelta = DEFAULT_MAX_AGE,
) -> list[str]:
    """Why ``calibration`` should not be trusted for a span; empty when it is fresh.

    Args:
        calibration: The calibration applied.
        now: The span's time (default: now, UTC).
        model: The span's model (``gen_ai.request.model``).
        preprocessor: The span's counting profile (``modtrace.units.profile``).
        counters: The span's counter ``id@version`` per modality.
        max_age: The oldest acceptable calibration.

    A field the calibration or the span does not know is not compared.
    """
    if max_age <= timedelta(0):
        msg = f"max_age must be positive, got {max_age}"
        raise ValueError(msg)
    reasons = []
    when = _utc(now or datetime.now(timezone.utc))
    created = _utc(calibration.created)
    age = when - created
    if age > max_age:
        reasons.append(
            f"calibration {calibration.version} is {age.days} days old "
            f"(max {max_age.days} days): recalibrate"
        )
    elif -age > FUTURE_SKEW:
        reasons.append(
            f"calibration {calibration.version} was created after the span "
            f"({created.isoformat()} > {when.isoformat()})"
        )
    if model and calibration.model and model != calibration.model:
        reasons.append(
            f"calibration {calibration.version} was measured on model {calibration.model}, "
            f"not {model}"
        )
    if preprocessor and calibration.preprocessor:
        theirs = _profile_of(calibration.preprocessor)
        if _profile_of(preprocessor) != theirs:
            reasons.append(
                f"calibration {calibration.version} was measured with preprocessor {theirs}, "
                f"not {_profile_of(preprocessor)}"
            )
    fitted = getattr(calibration, "counters", None)
    if counters and isinstance(fitted, Mapping):
        for modality, ref in counters.items():
            theirs = fitted.get(modality)
            if theirs is not None and theirs != ref:
                reasons.append(
                    f"calibration {calibration.version} fitted {modality} units of {theirs}, "
                    f"the span's are {ref}"
                )
    return reasons


def is_stale(calibration: Calibration, **span: object) -> bool:
    """Whether :func:`staleness_reasons` finds any reason (same keyword arguments)."""
    return bool(staleness_reasons(calibration, **span))  # type: ignore[arg-type]


_NS_PER_DAY = 86_400 * 10**9
#: Distinct (model, preprocessor, counters) combinations remembered per calibration.
_MEMO_MAX = 1024


def _ns(moment: datetime) -> int:
    delta = _utc(moment) - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return (delta.days * 86_400 + delta.seconds) * 10**9 + delta.microseconds * 1000


class StalenessCheck:
    """:func:`staleness_reasons` for many spans, cheaply: what the span processor calls.

    The reasons that do not depend on time (model, preprocessor, counters)
    are computed once per combination and remembered; the age is two integer
    comparisons against bounds computed once per calibration. Only a stale
    span pays for formatting its age reason (remembered per day of age).

    Args:
        max_age: The oldest acceptable calibration.
    """

    def __init__(self, max_age: timedelta = DEFAULT_MAX_AGE) -> None:
        if max_age <= timedelta(0):
            msg = f"max_age must be positive, got {max_age}"
            raise ValueError(msg)
        self.max_age = max_age
        self._lock = threading.Lock()
        self._calibration: Calibration | None = None
        self._bounds = (0, 0, 0)
        self._same: dict[tuple[object, ...], tuple[str, ...]] = {}
        self._age: dict[int, tuple[str, ...]] = {}

    def reasons(
        self,
        calibration: Calibration,
        *,
        at_ns: int,
        model: str | None = None,
        preprocessor: str | None = None,
        counters: tuple[tuple[str, str], ...] = (),
    ) -> tuple[str, ...]:
        """Why ``calibration`` is stale for a span that ended at ``at_ns``; empty when fresh.

        Args:
            calibration: The calibration applied.
            at_ns: The span's time, nanoseconds since the Unix epoch.
            model: The span's model.
            preprocessor: The span's counting profile.
            counters: The span's ``(modality, id@version)`` pairs.
        """
        with self._lock:
            if calibration is not self._calibration:
                # A new calibration: forget what was remembered for the old one.
                created = _ns(calibration.created)
                skew = int(FUTURE_SKEW.total_seconds() * 10**9)
                self._bounds = (created, created - skew, created + _ns_span(self.max_age))
                self._same.clear()
                self._age.clear()
                self._calibration = calibration
            created, earliest, latest = self._bounds
            key = (model, preprocessor, counters)
            same = self._same.get(key)
            if same is None:
                same = tuple(
                    staleness_reasons(
                        calibration,
                        now=calibration.created,
                        model=model,
                        preprocessor=preprocessor,
                        counters=dict(counters),
                        max_age=self.max_age,
                    )
                )
                if len(self._same) >= _MEMO_MAX:
                    self._same.clear()
                self._same[key] = same
            if earliest <= at_ns <= latest:
                return same
            # Stale by age (or made after the span): one reason per day of age.
            day = (at_ns - created) // _NS_PER_DAY
            aged = self._age.get(day) if at_ns > latest else None
            if aged is None:
                when = datetime.fromtimestamp(at_ns / 1e9, tz=timezone.utc)
                aged = tuple(staleness_reasons(calibration, now=when, max_age=self.max_age))
                if at_ns > latest:  # the text of an age reason only changes by the day
                    if len(self._age) >= _MEMO_MAX:
                        self._age.clear()
                    self._age[day] = aged
            return aged + same


def _ns_span(span: timedelta) -> int:
    return (span.days * 86_400 + span.seconds) * 10**9 + span.microseconds * 1000
