"""The arithmetic of numpy and torch that counts depend on, in pure Python, bit for bit.

Processors size media with numpy and torch: a frame index truncated from a
``linspace``, a sample count rounded up from a float32 tensor. One unit of
rounding moves a frame or a token, so the counters repeat those operations
exactly rather than approximately.
"""

from __future__ import annotations

import struct

__all__ = ["ceil_div", "float32", "linspace"]


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for integers, without floating point."""
    return -(-a // b)


def float32(value: float) -> float:
    """Round a Python float to the nearest IEEE single, as a float32 tensor stores it.

    ``torch.as_tensor(<python float>)`` and ``torch.arange`` elements are
    float32 (torch's default dtype); ``struct`` rounds to nearest-even
    exactly as that conversion does.
    """
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def linspace(start: float, stop: float, num: int) -> list[float]:
    """``numpy.linspace(start, stop, num)`` in pure Python, bit for bit.

    numpy computes ``i * ((stop - start) / (num - 1)) + start`` and sets the
    last element to ``stop``; the same float operations give the same values.
    """
    if num <= 0:
        return []
    if num == 1:
        return [float(start)]
    step = (stop - start) / (num - 1)
    values = [i * step + start for i in range(num)]
    values[-1] = float(stop)
    return values
