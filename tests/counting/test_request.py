"""Request parsing: every content part shape vLLM accepts, and bad parts flagged in place."""

from __future__ import annotations

import pytest

from modtrace.counting.request import parse_request


def chat(*parts, **extra):
    return {"model": "m", "messages": [{"role": "user", "content": list(parts)}], **extra}


class TestText:
    def test_string_content_and_roles(self):
        """Roles and string contents are text; each message counts once."""
        p = parse_request(
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hi"},
                ]
            }
        )
        assert p.texts == ["system", "be brief", "user", "hi"]
        assert p.messages == 2
        assert p.parts == []

    @pytest.mark.parametrize(
        ("kind", "key"),
        [
            ("text", "text"),
            ("input_text", "text"),
            ("output_text", "text"),
            ("thinking", "thinking"),
            ("refusal", "refusal"),
        ],
    )
    def test_text_part_types(self, kind, key):
        """All of vLLM's text part types contribute their text."""
        p = parse_request(chat({"type": kind, key: "words"}))
        assert "words" in p.texts

    def test_tools_and_tool_calls(self):
        """Tool schemas and tool-call arguments reach the prompt and are counted."""
        p = parse_request(
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {"type": "function", "function": {"name": "f", "arguments": '{"x":1}'}}
                        ],
                    }
                ],
                "tools": [{"type": "function", "function": {"name": "f"}}],
            }
        )
        assert "f" in p.texts and '{"x":1}' in p.texts
        assert any('"function"' in t for t in p.texts)

    def test_completion_prompts(self):
        """Completion prompts: text, list of texts, token ids."""
        assert parse_request({"prompt": "abc"}).texts == ["abc"]
        assert parse_request({"prompt": ["a", "b"]}).texts == ["a", "b"]
        assert parse_request({"prompt": [1, 2, 3]}).prompt_token_ids == 3
        assert parse_request({"prompt": [[1, 2], [3]]}).prompt_token_ids == 3

    def test_responses_input(self):
        """Responses-style input: a string or messages with input_text/input_image."""
        assert parse_request({"input": "hello"}).texts == ["hello"]
        p = parse_request(
            {
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": "look"},
                            {
                                "type": "input_image",
                                "image_url": "data:image/png;base64,AAAA",
                                "detail": "low",
                            },
                        ],
                    }
                ]
            }
        )
        assert "look" in p.texts
        assert p.parts[0].modality == "image" and p.parts[0].detail == "low"


class TestMedia:
    def test_image_url_forms(self):
        """image_url as an object with detail, or as a bare string."""
        p = parse_request(
            chat(
                {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "high"}},
                {"type": "image_url", "image_url": "https://x/b.png"},
            )
        )
        assert [(x.url, x.detail) for x in p.parts] == [
            ("https://x/a.png", "high"),
            ("https://x/b.png", None),
        ]

    def test_audio_and_video(self):
        """input_audio keeps data and format; audio_url and video_url keep their URL."""
        p = parse_request(
            chat(
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {"type": "audio_url", "audio_url": {"url": "https://x/a.mp3"}},
                {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}},
            )
        )
        assert [(x.modality, x.kind) for x in p.parts] == [
            ("audio", "input_audio"),
            ("audio", "audio_url"),
            ("video", "video_url"),
        ]
        assert (p.parts[0].data, p.parts[0].format) == ("UklGRg==", "wav")

    def test_part_without_type(self):
        """A part without 'type' is recognised by its key, as vLLM does."""
        p = parse_request(chat({"image_url": {"url": "https://x/a.png"}}, {"text": "t"}))
        assert p.parts[0].kind == "image_url"
        assert "t" in p.texts

    def test_mm_processor_kwargs(self):
        """Per-request mm_processor_kwargs are carried to the counters."""
        p = parse_request(
            chat({"type": "text", "text": "x"}, mm_processor_kwargs={"max_pixels": 100})
        )
        assert p.mm_processor_kwargs == {"max_pixels": 100}


class TestBadInput:
    def test_unknown_part_is_flagged_others_kept(self):
        """An unknown part type is flagged on its own; the other parts still count."""
        p = parse_request(
            chat(
                {"type": "hologram", "hologram": {}},
                {"type": "text", "text": "still here"},
                {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
            )
        )
        assert "still here" in p.texts
        assert p.parts[0].error and "hologram" in p.parts[0].error
        assert p.parts[1].error is None

    @pytest.mark.parametrize(
        "part",
        [
            {"type": "image_url"},
            {"type": "image_url", "image_url": {"detail": "low"}},
            {"type": "input_audio", "input_audio": {"format": "wav"}},
            {"type": "image_embeds", "image_embeds": "..."},
            {"type": "text"},
            42,
        ],
    )
    def test_malformed_parts(self, part):
        """Malformed parts carry a one-line error and never raise."""
        p = parse_request(chat(part))
        assert len(p.parts) == 1 and p.parts[0].error
        assert "\n" not in p.parts[0].error

    def test_not_an_object(self):
        """A body that is not an object is the one thing that raises."""
        with pytest.raises(ValueError, match="JSON object"):
            parse_request([1, 2])  # type: ignore[arg-type]

    @pytest.mark.parametrize(
        "body",
        [
            {"messages": "hi"},
            {"messages": [1]},
            {"prompt": {"a": 1}},
            {},
            {"messages": [], "mm_processor_kwargs": 3},
        ],
    )
    def test_bad_structure_is_reported(self, body):
        """Structural problems are reported as request errors."""
        assert parse_request(body).errors
