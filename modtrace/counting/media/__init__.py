"""Media header probing: image sizes and audio durations from inline payloads.

Reads only the header bytes of a payload, and when the payload is base64
(a ``data:`` URL, an OpenAI ``input_audio.data``) decodes only the base64
groups that hold them, so probing costs microseconds where a full decode
costs milliseconds.
"""

from __future__ import annotations

from .audio import AudioHeader, probe_audio
from .b64 import B64View, DataUrl, parse_data_url
from .errors import MediaError
from .image import MAX_PIXELS, MAX_SIDE, ImageHeader, probe_image

__all__ = [
    "MAX_PIXELS",
    "MAX_SIDE",
    "AudioHeader",
    "B64View",
    "DataUrl",
    "ImageHeader",
    "MediaError",
    "parse_data_url",
    "probe_audio",
    "probe_image",
]
