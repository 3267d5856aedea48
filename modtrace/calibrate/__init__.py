"""Calibration: probe plans, probe runs, fitted weights with error bars, history and drift.

The workflow (see ``docs/calibration.md``)::

    plan = ProbePlan.for_profile("qwen2.5-vl")        # what to send
    run_plan(plan, HttpEngine(url), "probes.jsonl")    # send it, resumably
    probes = read_probes("probes.jsonl")
    fit = fit_probe_file(probes)                       # weights ± stderr
    record = calibration_from_fit(fit, probes, holdout=validate_holdout(...))
    CalibrationStore("calibrations").save(record)      # versioned, never overwritten

Names are imported lazily: the span processor can use :mod:`.drift` and
:mod:`.staleness` without loading NumPy, which only the fit needs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ProbePlan": "plan",
    "ProbeSpec": "plan",
    "ProbeRequest": "plan",
    "build_request": "plan",
    "load_plan": "plan",
    "save_plan": "plan",
    "EngineInfo": "probes",
    "ProbeFile": "probes",
    "ProbeFileError": "probes",
    "ProbeRecord": "probes",
    "read_probes": "probes",
    "Engine": "runner",
    "RunSummary": "runner",
    "run_plan": "runner",
    "EngineRequestError": "engines",
    "HttpEngine": "engines",
    "ReferenceProbeEngine": "engines",
    "SimulatedCost": "simulated",
    "SimulatedEngine": "simulated",
    "FitError": "fit",
    "FitResult": "fit",
    "fit_probe_file": "fit",
    "fit_probes": "fit",
    "residual_plots": "fit",
    "HoldoutReport": "validate",
    "validate_holdout": "validate",
    "AttributionIntervals": "intervals",
    "attribution_intervals": "intervals",
    "CalibrationDiff": "store",
    "CalibrationRecord": "store",
    "CalibrationStore": "store",
    "StoreError": "store",
    "calibration_from_fit": "store",
    "diff_calibrations": "store",
    "load_record": "store",
    "DEFAULT_MAX_AGE": "staleness",
    "StalenessCheck": "staleness",
    "staleness_reasons": "staleness",
    "DriftSignal": "drift",
    "DriftTracker": "drift",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__() -> list[str]:
    return __all__
