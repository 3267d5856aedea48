"""RequestCounter under hostile or broken input: nothing escapes, nothing private is echoed.

One class per defect of the review: client-sized videos (1.1), a broken text
configuration (1.3), resolver failures and URLs in messages (4.1), echoed
user values (4.2) and the prepared-profile cache under concurrent clears (5.1).
"""

from __future__ import annotations

import base64
import io
import time
import tracemalloc

import pytest
from PIL import Image

from modtrace.counting import CountingConfig, RequestCounter, TextConfig
from modtrace.counting.counter import CountingError
from modtrace.counting.families.video_loader import MAX_VIDEO_FRAMES
from modtrace.counting.safe import redact_url

SECRET = "SSN 078-05-1120"
PRESIGNED = (
    "https://alice:hunter2@bucket.s3.amazonaws.com/private/cat.png"
    "?X-Amz-Credential=AKIAEXAMPLE%2F20260101&X-Amz-Signature=deadbeef#frag"
)


def chat(*parts, **extra):
    return {"model": "m", "messages": [{"role": "user", "content": list(parts)}], **extra}


def text(t):
    return {"type": "text", "text": t}


def img(url, **kw):
    return {"type": "image_url", "image_url": {"url": url, **kw}}


def video(url="https://example.invalid/v.mp4"):
    return {"type": "video_url", "video_url": {"url": url}}


def png_url(w: int = 64, h: int = 48) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h)).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def png_bytes(w: int = 64, h: int = 48) -> bytes:
    return base64.b64decode(png_url(w, h).split(",", 1)[1])


def assert_private_data_absent(result) -> None:
    """No secret, payload byte, credential or query string in any message."""
    blob = " | ".join([*result.errors, *(i.error or "" for i in result.items)])
    for leaked in (
        SECRET,
        SECRET.encode().hex()[:16],
        "078-05",
        "hunter2",
        "alice",
        "X-Amz",
        "AKIAEXAMPLE",
        "deadbeef",
    ):
        assert leaked not in blob, (leaked, blob)


# --- 1.1 ---------------------------------------------------------------------
#: The review's scenario: 200,000 s at 100 fps, 20 million source frames.
HUGE_VIDEO_HEADERS = {"x-llm-d-video-duration-seconds": "200000", "x-llm-d-video-fps": "100"}


class TestClientSizedVideo:
    def test_huge_all_frames_video_is_flagged_fast(self):
        """The review's request (qwen2.5-vl, opencv, num_frames=-1) is flagged, not worked."""
        counter = RequestCounter(CountingConfig(profile="qwen2.5-vl"))
        body = chat(
            text("describe"),
            video(),
            media_io_kwargs={"video": {"num_frames": -1, "video_backend": "opencv"}},
        )
        tracemalloc.start()
        start = time.perf_counter()
        r = counter.count(body, HUGE_VIDEO_HEADERS)
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < 5_000_000 and elapsed < 0.5
        (item,) = r.items
        assert item.error and str(MAX_VIDEO_FRAMES) in item.error and "video_url #0" in item.error
        assert "video.tokens" not in r.units
        assert r.units["text.tokens"] > 0

    def test_request_max_frames_past_the_cap_flags_the_item(self):
        """mm_processor_kwargs max_frames=1e9 flags the video; the text still counts."""
        counter = RequestCounter(CountingConfig(profile="qwen3-vl"))
        body = chat(text("hi"), video(), mm_processor_kwargs={"max_frames": 10**9})
        r = counter.count(body, HUGE_VIDEO_HEADERS)
        assert r.items[0].error and "max_frames" in r.items[0].error
        assert r.units["text.tokens"] > 0

    def test_overflowing_headers_are_an_item_error(self):
        """Headers whose product overflows to infinity flag the video, never raise."""
        headers = {"x-llm-d-video-duration-seconds": "1e300", "x-llm-d-video-fps": "1e300"}
        for profile in ("qwen3-vl", "qwen2.5-vl", "gemma-4", "internvl"):
            r = RequestCounter(CountingConfig(profile=profile)).count(chat(video()), headers)
            assert r.items[0].error and "source frames" in r.items[0].error, profile


# --- 1.3 ---------------------------------------------------------------------
class _BrokenText:
    ref = "broken@1"

    def count(self, texts, messages):
        raise RuntimeError(f"tokenizer exploded on {texts[0]!r}")


class TestTextCounter:
    def test_uncached_tiktoken_fails_at_construction(self, tmp_path, monkeypatch):
        """TextConfig(kind='tiktoken') without a local cache: a ValueError when built."""
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
        with pytest.raises(ValueError, match="not in the local cache"):
            RequestCounter(CountingConfig(text=TextConfig(kind="tiktoken")))

    def test_unreadable_tokenizer_json_is_a_value_error(self, tmp_path):
        """A missing tokenizer.json is a clear ValueError at construction, not a bare Exception."""
        config = CountingConfig(
            text=TextConfig(kind="hf", tokenizer_json=str(tmp_path / "no.json"))
        )
        with pytest.raises(ValueError, match="text counter"):
            RequestCounter(config)

    def test_missing_tiktoken_file_is_a_value_error(self, tmp_path):
        """A tiktoken_file that does not exist is a ValueError at construction."""
        config = CountingConfig(
            text=TextConfig(kind="tiktoken", tiktoken_file=str(tmp_path / "none.tiktoken"))
        )
        with pytest.raises(ValueError, match="text counter"):
            RequestCounter(config)

    def test_text_counter_is_built_once(self, monkeypatch):
        """The text counter is built at construction, not per request."""
        import modtrace.counting.counter as counter_module

        calls = []
        real = counter_module.text_counter

        def spy(*args, **kwargs):
            calls.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(counter_module, "text_counter", spy)
        counter = RequestCounter()
        assert len(calls) == 1
        for _ in range(3):
            counter.count(chat(text("hello")))
        assert len(calls) == 1

    def test_failing_text_count_keeps_media_and_records_the_error(self):
        """A text counter that raises per request: media still count, the error is recorded."""
        counter = RequestCounter(CountingConfig(profile="qwen2.5-vl"))
        counter.text = _BrokenText()
        r = counter.count(chat(text(SECRET), img(png_url(448, 448))))
        assert r.units["image.count"] == 1 and r.units["image.tokens"] > 0
        assert "text.tokens" not in r.units
        assert any("text" in e and "RuntimeError" in e for e in r.errors)
        assert_private_data_absent(r)

    def test_failing_text_count_raises_in_strict_mode(self):
        """strict=True turns the text failure into a CountingError."""
        counter = RequestCounter(CountingConfig(strict=True))
        counter.text = _BrokenText()
        with pytest.raises(CountingError, match="RuntimeError"):
            counter.count(chat(text("hi")))


# --- 4.1 ---------------------------------------------------------------------
class TestResolverFailures:
    @pytest.mark.parametrize("error", [RuntimeError, ValueError, OSError, KeyError])
    def test_resolver_exception_is_an_item_error_without_the_url(self, error):
        """Any resolver exception flags only its item, naming the type, never the URL's secrets."""

        def resolver(url):
            raise error(f"GET {url} failed: 403 for {SECRET}")

        counter = RequestCounter(CountingConfig(profile="qwen2.5-vl"), resolver=resolver)
        r = counter.count(chat(text("two images"), img(PRESIGNED), img(png_url(448, 448))))
        assert r.units["text.tokens"] > 0
        assert r.units["image.count"] == 1
        bad = r.items[0]
        assert bad.error and error.__name__ in bad.error
        assert "https://bucket.s3.amazonaws.com/private/cat.png" in bad.error
        assert_private_data_absent(r)

    def test_resolver_returning_junk_is_an_item_error(self):
        """A resolver returning something that is not bytes flags the item."""
        counter = RequestCounter(CountingConfig(profile="llm-d"), resolver=lambda url: 42)
        r = counter.count(chat(text("hi"), img(PRESIGNED)))
        assert r.items[0].error
        assert r.units["text.tokens"] > 0
        assert_private_data_absent(r)

    def test_unexpected_exception_in_a_formula_is_an_item_error(self, monkeypatch):
        """A bug in a formula (any exception type) flags the item with its type only."""
        counter = RequestCounter(CountingConfig(profile="qwen2.5-vl"))

        def boom(*_a, **_k):
            raise KeyError(SECRET)

        monkeypatch.setattr(counter, "_image", boom)
        r = counter.count(chat(text("hi"), img(png_url())))
        assert r.items[0].error and "KeyError" in r.items[0].error
        assert r.units["text.tokens"] > 0
        assert_private_data_absent(r)

    def test_strict_mode_raises_the_fixed_message(self):
        """strict=True raises CountingError with the sanitised message, not the resolver's."""

        def resolver(url):
            raise RuntimeError(url)

        counter = RequestCounter(CountingConfig(strict=True), resolver=resolver)
        with pytest.raises(CountingError) as info:
            counter.count(chat(img(PRESIGNED)))
        assert "X-Amz" not in str(info.value) and "hunter2" not in str(info.value)

    @pytest.mark.parametrize(
        "headers",
        [
            {"x-llm-d-video-resolution": "\u00b2x\u00b2"},  # str.isdigit() but not int()-able
            {"x-llm-d-video-resolution": "9" * 5000 + "x1"},
        ],
    )
    def test_odd_resolution_headers_never_raise(self, headers):
        """Resolution headers that are digits to str.isdigit but not to int() fall back."""
        r = RequestCounter(CountingConfig(profile="llm-d")).count(chat(video()), headers)
        assert r.units["video.count"] == 1 or r.items[0].error
        assert all(len(e) < 400 for e in r.errors)

    @pytest.mark.parametrize(
        "message",
        [
            {"role": "assistant", "content": None, "tool_calls": 5},
            {"role": "assistant", "content": None, "tool_calls": [{"function": "f"}]},
            {"role": "assistant", "content": None, "tool_calls": [7]},
        ],
    )
    def test_malformed_tool_calls_are_flagged_not_raised(self, message):
        """tool_calls of the wrong shape are reported; the rest of the request counts."""
        body = {"messages": [{"role": "user", "content": "hello"}, message]}
        r = RequestCounter().count(body)
        assert r.units["text.tokens"] > 0
        assert any("tool_calls" in e for e in r.errors)

    def test_tool_calls_of_other_kinds_are_not_errors(self):
        """A tool call without a function object (another tool kind) is skipped quietly."""
        call = {"type": "custom", "custom": {"name": "grep", "input": "x"}}
        body = {"messages": [{"role": "assistant", "content": "hi", "tool_calls": [call]}]}
        assert RequestCounter().count(body).errors == []


class TestRedactUrl:
    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            (PRESIGNED, "https://bucket.s3.amazonaws.com/private/cat.png"),
            ("http://host:8080/a/b.mp3?sig=1", "http://host:8080/a/b.mp3"),
            ("https://u@[::1]:8443/x", "https://[::1]:8443/x"),
            ("https://example.com", "https://example.com"),
            ("not a url at all " + SECRET, "(url not shown)"),
            ("ftp://user:pw@host/file", "ftp://host/file"),
        ],
    )
    def test_userinfo_query_and_fragment_are_stripped(self, url, expected):
        """Only scheme, host, port and path survive."""
        assert redact_url(url) == expected

    def test_long_paths_are_bounded(self):
        """A very long path is cut, so a message stays short."""
        out = redact_url("https://h/" + "a" * 10_000)
        assert len(out) <= 120 and out.startswith("https://h/")


# --- 4.2 ---------------------------------------------------------------------
class TestNoEchoedUserValues:
    def test_text_document_sent_as_image_leaks_no_bytes(self):
        """A text document posing as an image: its length is reported, not its bytes."""
        payload = base64.b64encode(SECRET.encode() * 4).decode()
        r = RequestCounter().count(chat(img("data:image/png;base64," + payload)))
        assert r.items[0].error and "60 bytes" in r.items[0].error
        assert_private_data_absent(r)

    def test_text_document_sent_as_audio_leaks_no_bytes(self):
        """The same for audio, including the declared format, which is not echoed unless safe."""
        data = base64.b64encode(SECRET.encode() * 4).decode()
        part = {"type": "input_audio", "input_audio": {"data": data, "format": SECRET}}
        r = RequestCounter(CountingConfig(profile="qwen2-audio")).count(chat(part))
        assert r.items[0].error and "unrecognised format" in r.items[0].error
        assert_private_data_absent(r)
        part["input_audio"]["format"] = "wav"
        r = RequestCounter(CountingConfig(profile="qwen2-audio")).count(chat(part))
        assert "'wav'" in r.items[0].error

    def test_unknown_part_type_is_named_only_when_safe(self):
        """An unknown part type is named when it is a plain identifier, else not shown."""
        r = RequestCounter().count(chat({"type": "mystery_box"}, {"type": SECRET}))
        assert "'mystery_box'" in r.items[0].error
        assert r.items[1].error and "not shown" in r.items[1].error
        assert_private_data_absent(r)
        long_name = RequestCounter().count(chat({"type": "x" * 33}))
        assert "x" * 33 not in long_name.items[0].error

    def test_data_url_parameters_are_named_not_valued(self):
        """A malformed data-URL parameter is named only when safe; values never appear."""
        r = RequestCounter().count(chat(img(f"data:image/png;{SECRET};base64,AAAA")))
        assert r.items[0].error and "malformed parameter" in r.items[0].error
        assert_private_data_absent(r)

    @pytest.mark.parametrize(
        "name",
        [
            "x-llm-d-video-fps",
            "x-llm-d-video-duration-seconds",
            "x-llm-d-video-resolution",
        ],
    )
    def test_header_values_are_not_echoed(self, name):
        """A bad video header is named, its value is not."""
        r = RequestCounter(CountingConfig(profile="llm-d")).count(chat(video()), {name: SECRET})
        assert any(name in e for e in r.errors)
        assert_private_data_absent(r)

    def test_audio_duration_header_value_not_echoed(self):
        """The same for the audio duration header."""
        body = chat({"type": "audio_url", "audio_url": {"url": "https://example.invalid/a.mp3"}})
        r = RequestCounter(CountingConfig(profile="qwen2-audio")).count(
            body, {"x-modtrace-audio-duration-seconds": SECRET}
        )
        assert any("x-modtrace-audio-duration-seconds" in e for e in r.errors)
        assert_private_data_absent(r)

    @pytest.mark.parametrize(
        ("profile", "kwargs"),
        [
            ("qwen2.5-vl", {"size": SECRET * 100}),
            ("qwen2.5-vl", {"max_pixels": SECRET}),
            ("qwen2.5-vl", {"video_backend": SECRET}),
            ("gemma-4", {"max_soft_tokens": 10**4000}),
        ],
    )
    def test_bad_mm_processor_kwargs_are_bounded_and_not_echoed(self, profile, kwargs):
        """A rejected override names the field; the value is neither echoed nor unbounded."""
        counter = RequestCounter(CountingConfig(profile=profile))
        r = counter.count(chat(img(png_url()), mm_processor_kwargs=kwargs))
        (note,) = [e for e in r.errors if "mm_processor_kwargs" in e]
        assert next(iter(kwargs)) in note
        assert len(note) <= 300
        assert_private_data_absent(r)
        assert r.units["image.count"] == 1

    def test_openai_detail_is_not_echoed(self):
        """An unknown OpenAI image detail is refused without repeating it."""
        r = RequestCounter(CountingConfig(profile="openai")).count(
            chat(img(png_url(), detail=SECRET))
        )
        assert r.items[0].error and "detail" in r.items[0].error
        assert_private_data_absent(r)

    def test_messages_are_bounded(self):
        """Every message stays one bounded line whatever the request holds."""
        r = RequestCounter(CountingConfig(profile="qwen2.5-vl")).count(
            chat(
                {"type": "é" * 5000},
                img("data:image/png;base64," + "!" * 10_000),
                img("data:" + "x" * 10_000),
            )
        )
        assert len(r.errors) == 3
        assert all(len(e) <= 300 and "\n" not in e for e in r.errors)


# --- 5.1 ---------------------------------------------------------------------
class _ClearedAfterStore(dict):
    """A prepared-profile cache that another thread clears right after each store."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        self.clear()


class TestProfileCache:
    def test_clear_between_store_and_return_is_harmless(self):
        """Another thread's clear() between the store and the return loses nothing."""
        counter = RequestCounter(CountingConfig(profile="openai"))
        counter._profiles = _ClearedAfterStore()
        for model in ("gpt-4o", "gpt-4.1-mini", "o3"):
            body = chat(img(png_url()))
            body["model"] = model
            assert counter.count(body).units["image.count"] == 1

    def test_concurrent_requests_with_many_models(self):
        """Threads counting requests for many hosted model names all succeed."""
        from concurrent.futures import ThreadPoolExecutor

        import modtrace.counting.counter as counter_module

        counter = RequestCounter(CountingConfig(profile="openai"))
        original = counter_module._MAX_PREPARED
        counter_module._MAX_PREPARED = 4
        try:

            def one(i):
                body = chat(img(png_url(32, 32)))
                body["model"] = f"gpt-4o-{i % 64}"
                return counter.count(body).units["image.count"]

            with ThreadPoolExecutor(8) as pool:
                assert list(pool.map(one, range(2000))) == [1] * 2000
        finally:
            counter_module._MAX_PREPARED = original
