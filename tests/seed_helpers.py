"""The worked example of the method: seed weights, one request's units, a hypothetical plan."""

from __future__ import annotations

from modtrace import Calibration, Rate

#: GPU seconds per unit of the worked example.
SEED_WEIGHTS = {"text.tokens": 0.0008, "image.tiles": 0.012, "audio.seconds": 0.05}
#: The seed weights as a calibration.
SEED = Calibration.from_weights(SEED_WEIGHTS, version="seed-1")
#: The worked example's request: 600 text tokens, 8 image tiles, 20 seconds of audio.
SEED_COUNTS = {"text.tokens": 600, "image.tiles": 8, "audio.seconds": 20}
#: A hypothetical 2 USD per GPU hour.
PLAN = Rate(usd_per_gpu_hour=2.0, id="plan-2usd")
