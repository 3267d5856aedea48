"""modtrace: what each modality of a multimodal LLM request really costs in GPU seconds."""

from ._version import __version__
from .attribution import Attribution, AttributionConfig, attribute, weighted_estimates
from .calibration import Calibration, Weight, load_calibration
from .cost import Cost, Rate, price
from .timers import GpuTimers
from .units import MODALITIES, UNIT_NAMES, UnitCounts

__all__ = [
    "MODALITIES",
    "UNIT_NAMES",
    "Attribution",
    "AttributionConfig",
    "Calibration",
    "Cost",
    "GpuTimers",
    "Rate",
    "UnitCounts",
    "Weight",
    "__version__",
    "attribute",
    "load_calibration",
    "price",
    "weighted_estimates",
]
