"""HTTP header names modtrace reads or writes, in one place."""

from __future__ import annotations

__all__ = [
    "AUDIO_DURATION",
    "AUDIO_DURATION_LLMD",
    "VIDEO_DURATION",
    "VIDEO_FPS",
    "VIDEO_RESOLUTION",
]

# Video metadata a client sends with a request, as llm-d's router reads it.
VIDEO_FPS = "x-llm-d-video-fps"
VIDEO_DURATION = "x-llm-d-video-duration-seconds"
VIDEO_RESOLUTION = "x-llm-d-video-resolution"

# Audio behind a URL: llm-d has no audio header yet, so modtrace defines one
# and also reads the llm-d-style spelling for symmetry with video.
AUDIO_DURATION = "x-modtrace-audio-duration-seconds"
AUDIO_DURATION_LLMD = "x-llm-d-audio-duration-seconds"
