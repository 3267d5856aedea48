"""The integrations' arithmetic: engine usage beside the counts, timers over retries, claims."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider

from modtrace import semconv
from modtrace.integrations._common import (
    GATEWAY_WALL_CLOCK,
    claim_current_span,
    engine_tokens,
    sum_timers,
    usage_attributes,
    usage_mapping,
    wall_clock_timers,
)
from modtrace.spans import inference_span
from modtrace.timers import GpuTimers
from modtrace.units import UnitCounts

# vLLM with --enable-prompt-tokens-details: 1176 image and 37 audio placeholder tokens
# in a prompt of 1290 (so 77 template and text tokens), 9 generated.
VLLM_USAGE = {
    "prompt_tokens": 1290,
    "completion_tokens": 9,
    "total_tokens": 1299,
    "prompt_tokens_details": {"cached_tokens": 0, "image_tokens": 1176, "audio_tokens": 37},
}
ESTIMATE = UnitCounts(
    {"text.tokens": 60, "image.count": 1, "image.tokens": 1176, "audio.tokens": 40}
)


class TestEngineTokens:
    """engine_tokens: media from the details, text as the remainder."""

    def test_media_and_text_remainder(self) -> None:
        """Text is the prompt minus every reported media token."""
        assert engine_tokens(VLLM_USAGE, ESTIMATE) == {"text": 77, "image": 1176, "audio": 37}

    def test_no_text_while_a_counted_modality_is_unreported(self) -> None:
        """An engine without details for a counted modality: its tokens would pollute text."""
        usage = {"prompt_tokens": 1290, "prompt_tokens_details": {"image_tokens": 1176}}
        assert engine_tokens(usage, ESTIMATE) == {"image": 1176}

    def test_text_tokens_reported_directly(self) -> None:
        """``text_tokens`` in the details wins over the remainder."""
        usage = {"prompt_tokens": 100, "prompt_tokens_details": {"text_tokens": 12}}
        assert engine_tokens(usage, None) == {"text": 12}

    def test_plain_openai_usage(self) -> None:
        """No details at all: the whole prompt is text when nothing else was counted."""
        assert engine_tokens({"prompt_tokens": 31, "completion_tokens": 2}) == {"text": 31}

    @pytest.mark.parametrize("bad", [None, -1, 1.5, True, "12"])
    def test_malformed_counts_are_skipped(self, bad) -> None:
        """Counts that are not non-negative integers are not counts."""
        usage = {"prompt_tokens": bad, "prompt_tokens_details": {"image_tokens": bad}}
        assert engine_tokens(usage, None) == {}


class TestUsageAttributes:
    """usage_attributes: the engine's figures and the differences."""

    def test_attributes_and_differences(self) -> None:
        """Engine counts, engine minus estimate per modality, and the GenAI output tokens."""
        attrs = usage_attributes(VLLM_USAGE, ESTIMATE)
        assert attrs == {
            semconv.ENGINE_USAGE_PROMPT_TOKENS: 1290,
            semconv.ENGINE_USAGE_COMPLETION_TOKENS: 9,
            semconv.GEN_AI_USAGE_OUTPUT_TOKENS: 9,
            "modtrace.engine.usage.text.tokens": 77,
            "modtrace.engine.usage.image.tokens": 1176,
            "modtrace.engine.usage.audio.tokens": 37,
            "modtrace.units.text.tokens.diff": 17,
            "modtrace.units.image.tokens.diff": 0,
            "modtrace.units.audio.tokens.diff": -3,
        }
        assert all(type(v) is int for v in attrs.values())

    def test_no_difference_without_an_estimate(self) -> None:
        """A request not counted: the engine's figures only."""
        attrs = usage_attributes(VLLM_USAGE, None)
        assert not any(k.endswith(".diff") for k in attrs)
        assert attrs["modtrace.engine.usage.image.tokens"] == 1176

    def test_genai_switch_none(self) -> None:
        """Convention ``none``: no gen_ai attribute."""
        attrs = usage_attributes(VLLM_USAGE, ESTIMATE, convention=semconv.GENAI_SEMCONV_NONE)
        assert not any(k.startswith("gen_ai.") for k in attrs)

    def test_usage_models_and_mappings(self) -> None:
        """A parsed openai usage reads like its JSON."""
        from openai.types import CompletionUsage

        parsed = CompletionUsage.model_validate(VLLM_USAGE)
        assert usage_attributes(usage_mapping(parsed), ESTIMATE) == usage_attributes(
            VLLM_USAGE, ESTIMATE
        )
        assert usage_mapping(None) is None
        assert usage_mapping("usage") is None


class TestTimers:
    """sum_timers and the wall-clock fallback."""

    def test_retries_add_up(self) -> None:
        """Every attempt's seconds count; a component any attempt measured is kept."""
        first = GpuTimers(total=0.5, vision_encoder=0.5, source="step_ledger")
        second = GpuTimers(
            total=1.25, vision_encoder=0.25, prefill=0.5, decode=0.5, gpu_count=2, source="x"
        )
        summed = sum_timers([first, second])
        assert summed == GpuTimers(
            total=1.75, vision_encoder=0.75, prefill=0.5, decode=0.5, gpu_count=2, source="x"
        )

    def test_one_or_none(self) -> None:
        """One attempt is itself; none is None."""
        one = GpuTimers(total=0.25, source="step_ledger")
        assert sum_timers([one]) is one
        assert sum_timers([]) is None

    def test_wall_clock_is_labelled(self) -> None:
        """The fallback says where it comes from."""
        assert wall_clock_timers(0.125) == GpuTimers(total=0.125, source=GATEWAY_WALL_CLOCK)


class TestClaims:
    """The first engine call inside an inference span enriches it; later ones do not."""

    def test_claimed_once(self) -> None:
        """claim_current_span returns the current span once."""
        provider = TracerProvider()
        assert claim_current_span() is None
        with inference_span("m", tracer_provider=provider) as handle:
            assert claim_current_span() is handle
            assert claim_current_span() is None
        with inference_span("m", tracer_provider=provider) as other:
            assert claim_current_span() is other
        provider.shutdown()


class TestStreamTimers:
    """Where a stream's timers are read: the usage chunk's object and the SSE comment block."""

    TIMERS = GpuTimers(total=0.5, vision_encoder=0.125, prefill=0.25, source="step_ledger")

    def test_usage_chunk_extension(self) -> None:
        """The ``modtrace`` object of the usage chunk, as the openai client parses it."""
        from openai.types.chat import ChatCompletionChunk

        from modtrace.engine import USAGE_EXTENSION, timers_to_headers
        from modtrace.integrations.openai import OpenAISettings, _Call

        chunk = ChatCompletionChunk.model_validate(
            {
                "id": "c1",
                "object": "chat.completion.chunk",
                "created": 0,
                "model": "m",
                "choices": [],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                USAGE_EXTENSION: timers_to_headers(self.TIMERS),
            }
        )
        call = _Call(OpenAISettings.build(), {"stream": True}, is_async=False)
        call.observe(chunk)
        assert call.extension_timers == self.TIMERS
        assert call.usage is chunk.usage

    def test_sse_comment_split_across_chunks(self) -> None:
        """Comment lines cut anywhere, with any line ending, are read whole."""
        from modtrace.engine import sse_comment, timers_from_sse, timers_to_headers
        from modtrace.integrations.openai import _CommentScanner

        raw = (
            b'data: {"choices": []}\r\n\r\n'
            + sse_comment(timers_to_headers(self.TIMERS)).replace(b"\n", b"\r\n")
            + b"data: [DONE]\r\n\r\n"
        )
        for size in (1, 7, 64, len(raw)):
            scanner = _CommentScanner()
            for start in range(0, len(raw), size):
                scanner.feed(raw[start : start + size])
            assert timers_from_sse(scanner.text()) == self.TIMERS, size
