"""The counting pipeline end to end: real media bytes in a request, real processors as oracle."""

from __future__ import annotations

import base64
import io
import json
import math
import wave

import numpy as np
import pytest
from PIL import Image

from modtrace.cli import main
from modtrace.counting.counter import CountingConfig, CountingError, RequestCounter, count_request

QWEN25_CHECKPOINT = {"min_pixels": 3136, "max_pixels": 12845056, "patch_size": 14, "merge_size": 2}


def image_url(w: int, h: int, fmt: str = "PNG", **save) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (120, 30, 200)).save(buf, fmt, **save)
    mime = {"PNG": "png", "JPEG": "jpeg", "WEBP": "webp", "GIF": "gif"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def wav_b64(seconds: float, rate: int = 16000) -> str:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(b"\0\0" * round(seconds * rate))
    return base64.b64encode(buf.getvalue()).decode()


def chat(*parts, **extra):
    return {"model": "m", "messages": [{"role": "user", "content": list(parts)}], **extra}


def text(t):
    return {"type": "text", "text": t}


def img(url, **kw):
    return {"type": "image_url", "image_url": {"url": url, **kw}}


def qwen_oracle_tokens(w: int, h: int, **params) -> int:
    """Tokens of one image per the real Hugging Face Qwen2-VL image processor."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    cfg = {**QWEN25_CHECKPOINT, **params}
    proc = Qwen2VLImageProcessorPil(
        min_pixels=cfg["min_pixels"],
        max_pixels=cfg["max_pixels"],
        patch_size=cfg["patch_size"],
        merge_size=cfg["merge_size"],
    )
    grid = proc(images=[Image.new("RGB", (w, h))], return_tensors="np")["image_grid_thw"][0]
    return int(np.prod(grid)) // cfg["merge_size"] ** 2


class TestImages:
    @pytest.mark.parametrize(
        ("w", "h", "fmt"),
        [
            (1920, 1080, "JPEG"),
            (640, 480, "PNG"),
            (37, 1500, "WEBP"),
            (333, 222, "GIF"),
        ],
    )
    def test_inline_images_match_processor(self, w, h, fmt):
        """Inline images of each format count as the real Qwen processor sees them."""
        r = count_request(chat(text("hi"), img(image_url(w, h, fmt))), profile="qwen2.5-vl")
        assert r.units["image.count"] == 1
        assert r.units["image.pixels"] == w * h
        assert r.units["image.tokens"] == qwen_oracle_tokens(w, h)
        assert r.counters["image"].startswith("qwen2.5-vl.image@")
        assert r.defaulted["image"] is False

    def test_mm_processor_kwargs_override(self):
        """A request's max_pixels reaches the counter, as it reaches the engine's processor."""
        body = chat(img(image_url(1920, 1080, "JPEG")), mm_processor_kwargs={"max_pixels": 1003520})
        r = count_request(body, profile="qwen2.5-vl")
        assert r.units["image.tokens"] == qwen_oracle_tokens(1920, 1080, max_pixels=1003520) == 1222

    def test_config_params_override(self):
        """Configured parameters override the checkpoint defaults."""
        r = RequestCounter(CountingConfig(profile="qwen2.5-vl", params={"max_pixels": 1003520}))
        assert r.count(chat(img(image_url(1920, 1080, "JPEG")))).units["image.tokens"] == 1222

    def test_url_is_not_fetched(self):
        """An http(s) image gets the default size and is flagged; no resolver, no fetch."""
        r = count_request(chat(img("https://example.invalid/cat.png")), profile="llm-d")
        assert r.units["image.pixels"] == 640 * 360
        assert r.units["image.tokens"] == 225  # llm-d: 640*360 // 1024
        assert r.defaulted["image"] is True

    def test_resolver_is_used_when_configured(self):
        """A user-supplied resolver sizes URL images from their bytes."""
        payload = base64.b64decode(image_url(800, 600, "PNG").split(",", 1)[1])
        seen = []

        def resolver(url):
            seen.append(url)
            return payload

        r = RequestCounter(CountingConfig(profile="llm-d"), resolver=resolver)
        out = r.count(chat(img("https://example.invalid/a.png")))
        assert seen == ["https://example.invalid/a.png"]
        assert out.units["image.pixels"] == 800 * 600
        assert out.defaulted["image"] is False

    def test_openai_detail_and_model(self):
        """OpenAI detail low/high and the model's formula family are honoured."""
        low = count_request(chat(img(image_url(1024, 1024), detail="low")), profile="openai")
        high = count_request(chat(img(image_url(1024, 1024), detail="high")), profile="openai")
        assert (low.units["image.tokens"], high.units["image.tokens"]) == (85, 765)
        body = chat(img(image_url(1024, 1024)))
        body["model"] = "gpt-4.1-mini"
        patch = count_request(body, profile="openai")
        assert patch.units["image.tokens"] == math.ceil(1024 * 1.62)


class TestAudioVideo:
    def test_inline_wav_duration(self):
        """Inline WAV: seconds from the header; frames and tokens from the profile."""
        body = chat(
            text("listen"),
            {"type": "input_audio", "input_audio": {"data": wav_b64(20), "format": "wav"}},
        )
        r = count_request(body, profile="qwen2-audio")
        assert r.units["audio.count"] == 1
        assert r.units["audio.seconds"] == pytest.approx(20.0)
        assert r.units["audio.tokens"] == 500  # 25 tokens per second up to 30 s
        assert r.defaulted["audio"] is False

    def test_audio_url_uses_header_duration(self):
        """Audio behind a URL takes its duration from a header, else the default."""
        body = chat({"type": "audio_url", "audio_url": {"url": "https://example.invalid/a.mp3"}})
        r = count_request(
            body, profile="qwen2-audio", headers={"X-Modtrace-Audio-Duration-Seconds": "4"}
        )
        assert r.units["audio.seconds"] == 4
        assert r.defaulted["audio"] is False
        assert count_request(body, profile="qwen2-audio").defaulted["audio"] is True

    def test_video_headers_seed_qwen3_preset(self):
        """The seed's Qwen3-VL config: 10 s of 1280x720 gives 9,000 tokens."""
        headers = {
            "x-llm-d-video-duration-seconds": "10",
            "x-llm-d-video-fps": "30",
            "x-llm-d-video-resolution": "1280x720",
        }
        body = chat({"type": "video_url", "video_url": {"url": "https://example.invalid/v.mp4"}})
        r = count_request(body, profile="llm-d-qwen3-vl", headers=headers)
        assert r.units["video.tokens"] == 9000
        assert r.units["video.seconds"] == 10
        assert r.defaulted["video"] is False

    def test_video_seed_gemma4_preset(self):
        """The seed's Gemma 4 config: 10 s gives min(60, 8) x 296 = 2,368 tokens."""
        body = chat({"type": "video_url", "video_url": {"url": "https://example.invalid/v.mp4"}})
        r = count_request(
            body, profile="llm-d-gemma4", headers={"x-llm-d-video-duration-seconds": "10"}
        )
        assert r.units["video.tokens"] == 2368
        assert r.defaulted["video"] is True  # fps and resolution came from defaults

    @pytest.mark.parametrize(
        "headers",
        [
            {"x-llm-d-video-resolution": "wide"},
            {"x-llm-d-video-fps": "fast"},
            {"x-llm-d-video-duration-seconds": "-3"},
            {"x-llm-d-video-duration-seconds": "nan"},
        ],
    )
    def test_malformed_video_headers(self, headers):
        """A malformed header falls back to the default with a note; the video still counts."""
        body = chat({"type": "video_url", "video_url": {"url": "https://example.invalid/v.mp4"}})
        r = count_request(body, profile="llm-d", headers=headers)
        assert r.units["video.count"] == 1
        assert r.defaulted["video"] is True
        assert any(next(iter(headers)) in e for e in r.errors)


class TestBadInput:
    def test_bad_items_flagged_others_counted(self):
        """Each bad item gets its own flag; the rest of the request still counts."""
        good = image_url(448, 448)
        body = chat(
            text("compare these"),
            img("data:image/png;base64,iVBORw0KGgo="),  # truncated PNG
            img("data:image/png;base64,@@@notbase64@@@"),  # not base64
            img("data:image/png;base64," + base64.b64encode(b"hello world, no image").decode()),
            img(good),
            {
                "type": "input_audio",
                "input_audio": {"data": base64.b64encode(b"RIFFxxxx").decode(), "format": "wav"},
            },
            {"type": "mystery", "mystery": 1},
        )
        r = count_request(body, profile="qwen2.5-vl")
        assert r.units["image.count"] == 1
        assert r.units["image.tokens"] == qwen_oracle_tokens(448, 448)
        assert r.units["text.tokens"] > 0
        bad = [i for i in r.items if i.error]
        assert len(bad) == 5
        assert all("\n" not in i.error for i in bad)
        assert len(r.errors) == 5

    def test_profile_without_modality(self):
        """A modality the model does not take is flagged, not guessed."""
        r = count_request(chat(img(image_url(64, 64))), profile="whisper")
        assert r.items[0].error and "does not count image" in r.items[0].error

    def test_strict_mode_raises(self):
        """strict=True raises on the first item that cannot be counted."""
        counter = RequestCounter(CountingConfig(strict=True))
        with pytest.raises(CountingError, match=r"PNG|base64|image"):
            counter.count(chat(img("data:image/png;base64,iVBORw0KGgo=")))

    def test_bad_mm_processor_kwargs(self):
        """Invalid mm_processor_kwargs are reported and the defaults used."""
        body = chat(img(image_url(448, 448)), mm_processor_kwargs={"max_pixels": "lots"})
        r = count_request(body, profile="qwen2.5-vl")
        assert r.units["image.tokens"] == qwen_oracle_tokens(448, 448)
        assert any("mm_processor_kwargs" in e for e in r.errors)


class TestCommand:
    def test_count_json(self, tmp_path, capsys):
        """`modtrace count --json` prints profile, counters and one object per modality."""
        body = chat(
            text("hello"), img(image_url(1920, 1080, "JPEG")), img("https://x.invalid/a.png")
        )
        f = tmp_path / "req.json"
        f.write_text(json.dumps(body))
        assert main(["count", "--profile", "qwen2.5-vl", "--json", str(f)]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["profile"] == "qwen2.5-vl"
        assert set(out["counters"]) == {"text", "image"}
        assert out["image"]["count"] == 2
        assert out["image"]["tiles"] is None
        assert out["image"]["defaulted"] is True
        assert out["image"]["tokens"] == qwen_oracle_tokens(1920, 1080) + qwen_oracle_tokens(
            640, 360
        )
        assert out["text"]["tokens"] > 0

    def test_count_set_and_header(self, tmp_path, capsys):
        """--set overrides parameters; --header supplies video metadata."""
        body = chat({"type": "video_url", "video_url": {"url": "https://x.invalid/v.mp4"}})
        f = tmp_path / "req.json"
        f.write_text(json.dumps(body))
        assert (
            main(
                [
                    "count",
                    "--profile",
                    "llm-d",
                    "--header",
                    "x-llm-d-video-duration-seconds:2",
                    "--set",
                    "max_video_tokens=100",
                    "--json",
                    str(f),
                ]
            )
            == 0
        )
        out = json.loads(capsys.readouterr().out)
        assert out["video"]["seconds"] == 2
        assert out["video"]["tokens"] <= 100

    def test_unreadable_json(self, tmp_path, capsys):
        """Unreadable JSON exits non-zero with one clear line."""
        f = tmp_path / "bad.json"
        f.write_text("{not json")
        assert main(["count", str(f)]) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "not valid JSON" in err

    def test_list_profiles(self, capsys):
        """--list-profiles names every required profile."""
        assert main(["count", "--list-profiles", "--json"]) == 0
        names = {p["name"] for p in json.loads(capsys.readouterr().out)}
        required = {
            "qwen2-vl",
            "qwen2.5-vl",
            "qwen3-vl",
            "gemma-3",
            "gemma-3n",
            "gemma-4",
            "llava-1.5",
            "llava-next",
            "internvl",
            "pixtral",
            "phi-3.5-vision",
            "phi-4-multimodal",
            "qwen2-audio",
            "qwen2.5-omni",
            "whisper",
            "ultravox",
            "openai",
            "claude",
            "gemini",
            "llm-d",
        }
        assert required <= names
