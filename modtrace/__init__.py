"""modtrace: what each modality of a multimodal LLM request really costs in GPU seconds.

The data flows request -> units (:mod:`modtrace.counting`) -> span
(:mod:`modtrace.spans`) -> attribution (:func:`attribute`, in
:class:`AttributionSpanProcessor`) -> export (:func:`configure`).
"""

from ._version import __version__
from .attribution import Attribution, AttributionConfig, attribute, weighted_estimates
from .calibration import Calibration, Weight, load_calibration
from .cost import Cost, Rate, price
from .counting import CountingConfig, RequestCount, RequestCounter, count_request
from .export import configure
from .processor import AttributionSpanProcessor
from .spans import current_inference_span, inference_span, trace_inference
from .timers import GpuTimers
from .timing import GpuTimer, StepLedger
from .units import MODALITIES, UNIT_NAMES, UnitCounts

__all__ = [
    "MODALITIES",
    "UNIT_NAMES",
    "Attribution",
    "AttributionConfig",
    "AttributionSpanProcessor",
    "Calibration",
    "Cost",
    "CountingConfig",
    "GpuTimer",
    "GpuTimers",
    "Rate",
    "RequestCount",
    "RequestCounter",
    "StepLedger",
    "UnitCounts",
    "Weight",
    "__version__",
    "attribute",
    "configure",
    "count_request",
    "current_inference_span",
    "inference_span",
    "load_calibration",
    "price",
    "trace_inference",
    "weighted_estimates",
]
