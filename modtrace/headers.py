"""HTTP header names modtrace reads or writes, in one place."""

from __future__ import annotations

__all__ = [
    "AUDIO_DURATION",
    "AUDIO_DURATION_LLMD",
    "GPU_COUNT",
    "GPU_SECONDS",
    "GPU_SECONDS_COMPONENTS",
    "GPU_SOURCE",
    "REQUEST_ID",
    "TIMER_HEADERS",
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

# GPU timers an engine returns with its response (``modtrace.engine``). Values
# are decimal seconds (``repr`` of a float, so they round-trip exactly), the
# GPU count an integer, the source a short label (``step_ledger``...).
GPU_SECONDS = "x-modtrace-gpu-seconds"
#: Component name (``modtrace.timers.COMPONENTS``) -> its header.
GPU_SECONDS_COMPONENTS: dict[str, str] = {
    "vision_encoder": "x-modtrace-gpu-seconds-vision-encoder",
    "audio_encoder": "x-modtrace-gpu-seconds-audio-encoder",
    "prefill": "x-modtrace-gpu-seconds-prefill",
    "decode": "x-modtrace-gpu-seconds-decode",
}
GPU_COUNT = "x-modtrace-gpu-count"
GPU_SOURCE = "x-modtrace-gpu-source"
#: Every timer header, in the order an engine writes them.
TIMER_HEADERS: tuple[str, ...] = (
    GPU_SECONDS,
    *GPU_SECONDS_COMPONENTS.values(),
    GPU_COUNT,
    GPU_SOURCE,
)

# The request id an engine server keys its work by. vLLM's OpenAI server
# derives its internal id from this header when a client sends one.
REQUEST_ID = "x-request-id"
