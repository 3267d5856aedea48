"""Probe plans and their requests: real encoded media, counted as the engine will see it."""

from __future__ import annotations

import base64
import io
import json
import wave

import pytest
from PIL import Image

from modtrace import headers as H
from modtrace.calibrate.media import avi_mjpeg, image_bytes, video_frame_count, wav_bytes
from modtrace.calibrate.plan import (
    AudioItem,
    ImageItem,
    MixedRequest,
    ProbePlan,
    VideoItem,
    build_request,
    default_count_fn,
    load_plan,
    save_plan,
)

SMALL = {
    "text_words": (8, 64),
    "images": (ImageItem(width=224, height=224), ImageItem(width=320, height=200, format="jpeg")),
    "audios": (AudioItem(seconds=1), AudioItem(seconds=2.5)),
    "videos": (VideoItem(seconds=1, fps=4, width=64, height=48),),
    "holdout": (
        MixedRequest(
            name="all",
            text_words=16,
            images=(ImageItem(width=100, height=80),),
            audios=(AudioItem(seconds=1),),
            videos=(VideoItem(seconds=1, fps=4, width=64, height=48),),
        ),
        MixedRequest(name="ti", text_words=16, images=(ImageItem(width=100, height=80),)),
    ),
}


def decode_data_url(url: str) -> tuple[str, bytes]:
    """``data:<mime>;base64,<data>`` -> (mime, bytes)."""
    head, _, data = url.partition(",")
    assert head.startswith("data:") and head.endswith(";base64")
    return head[5:-7], base64.b64decode(data)


class TestMedia:
    @pytest.mark.parametrize("fmt", ["png", "jpeg"])
    def test_images_decode(self, fmt):
        """Pillow decodes the bytes at the requested size and format."""
        data, mime = image_bytes(1920, 1080, seed=3, fmt=fmt)
        assert mime == f"image/{fmt}"
        with Image.open(io.BytesIO(data)) as img:
            assert img.size == (1920, 1080)
            assert img.format == fmt.upper()
            img.load()

    def test_images_are_seeded(self):
        """Same seed, same bytes; another seed, other bytes."""
        assert image_bytes(64, 64, 1)[0] == image_bytes(64, 64, 1)[0]
        assert image_bytes(64, 64, 1)[0] != image_bytes(64, 64, 2)[0]

    def test_wav(self):
        """The stdlib and libsndfile both read the WAV at its duration and rate."""
        data = wav_bytes(2.5, seed=1, sample_rate=16000)
        with wave.open(io.BytesIO(data)) as w:
            assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 16000)
            assert w.getnframes() == 40000
        soundfile = pytest.importorskip("soundfile")
        samples, rate = soundfile.read(io.BytesIO(data))
        assert rate == 16000 and len(samples) == 40000
        assert 0.05 < abs(samples).max() <= 1.0

    def test_avi_decodes_with_pyav(self):
        """FFmpeg (through PyAV) decodes every MJPEG frame at the stated rate and size."""
        av = pytest.importorskip("av")
        data = avi_mjpeg(2.0, 12.5, 160, 90, seed=4)
        with av.open(io.BytesIO(data)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "mjpeg"
            assert float(stream.average_rate) == 12.5
            frames = list(container.decode(video=0))
        assert len(frames) == video_frame_count(2.0, 12.5) == 25
        assert (frames[0].width, frames[0].height) == (160, 90)
        first, last = frames[0].to_ndarray(), frames[-1].to_ndarray()
        assert (first != last).any()  # the shape moves

    def test_bad_media_arguments(self):
        """Impossible sizes and durations are clear errors."""
        with pytest.raises(ValueError, match="positive"):
            image_bytes(0, 10, 1)
        with pytest.raises(ValueError, match="png or jpeg"):
            image_bytes(10, 10, 1, "gif")
        with pytest.raises(ValueError, match="positive number of seconds"):
            wav_bytes(0, 1)
        with pytest.raises(ValueError, match="fps"):
            avi_mjpeg(1, 0, 10, 10, 1)


class TestPlan:
    def test_default_sizes(self):
        """The defaults carry the issue's sizes: 224, 448, 1024 and 1920x1080 images."""
        plan = ProbePlan(profile="qwen2.5-omni")
        sizes = {(i.width, i.height) for i in plan.images}
        assert {(224, 224), (448, 448), (1024, 1024), (1920, 1080)} <= sizes
        assert plan.repeats == 3 and plan.warmup == 2 and plan.max_tokens == 1
        assert len(plan.audios) >= 3 and len(plan.videos) >= 3 and len(plan.text_words) >= 4

    def test_probe_order_and_counts(self):
        """Warm-ups first, held-out last; every size sent `repeats` times with a unique id."""
        plan = ProbePlan(profile="p", repeats=2, warmup=1, **SMALL)
        specs = plan.probes()
        kinds = [s.kind for s in specs]
        assert kinds == sorted(kinds, key=["warmup", "probe", "holdout"].index)
        assert kinds.count("warmup") == 4  # one per modality
        assert kinds.count("probe") == 2 * (2 + 2 + 2 + 1)
        assert kinds.count("holdout") == 2 * 2
        assert len({s.id for s in specs}) == len(specs)
        assert len({s.seed for s in specs}) == len(specs)
        assert "image/224x224/r1" in {s.id for s in specs}

    def test_shuffle_is_seeded(self):
        """Probe order is shuffled by the seed, reproducibly; shuffle=False keeps plan order."""
        a = [s.id for s in ProbePlan(profile="p", **SMALL).probes()]
        b = [s.id for s in ProbePlan(profile="p", **SMALL).probes()]
        c = [s.id for s in ProbePlan(profile="p", seed=1, **SMALL).probes()]
        assert a == b and a != c and sorted(a) == sorted(c)
        plain = ProbePlan(profile="p", shuffle=False, **SMALL).probes()
        measured = [s.modality for s in plain if s.kind == "probe"]
        assert measured == sorted(measured, key=["text", "image", "audio", "video"].index)

    def test_holdout_needs_probed_modalities(self):
        """A held-out request with an unprobed modality is left out."""
        plan = ProbePlan(profile="p", modalities=("image",), **SMALL)
        assert plan.modalities == ("text", "image")
        assert [h.name for h in plan.holdout_requests()] == ["ti"]

    def test_digest(self):
        """The digest is sha256 of the canonical JSON: stable, and sensitive to any field."""
        import hashlib

        plan = ProbePlan(profile="p", **SMALL)
        assert (
            plan.digest() == "sha256:" + hashlib.sha256(plan.canonical_json().encode()).hexdigest()
        )
        assert plan.digest() == ProbePlan(profile="p", **SMALL).digest()
        assert plan.digest() != ProbePlan(profile="p", repeats=4, **SMALL).digest()
        assert json.loads(plan.canonical_json())["format"] == "modtrace.probe-plan/1"

    def test_save_load_round_trip(self, tmp_path):
        """A saved plan loads back with the same digest."""
        plan = ProbePlan(profile="p", **SMALL)
        path = save_plan(plan, tmp_path / "plan.json")
        assert load_plan(path).digest() == plan.digest()

    def test_load_errors(self, tmp_path):
        """Missing file, bad JSON and a bad field are errors naming the file (and field)."""
        with pytest.raises(ValueError, match="cannot read plan"):
            load_plan(tmp_path / "nope.json")
        bad = tmp_path / "bad.json"
        bad.write_text("{", encoding="utf-8")
        with pytest.raises(ValueError, match=r"invalid plan .*bad\.json"):
            load_plan(bad)
        data = json.loads(ProbePlan(profile="p", **SMALL).to_json())
        data["repeats"] = 0
        bad.write_text(json.dumps(data), encoding="utf-8")
        with pytest.raises(ValueError, match="repeats"):
            load_plan(bad)
        del data["profile"]
        data["repeats"] = 1
        bad.write_text(json.dumps(data), encoding="utf-8")
        with pytest.raises(ValueError, match="profile: Field required"):
            load_plan(bad)

    def test_counting_cannot_set_profile(self):
        """The profile belongs to the plan, not to its counting overrides."""
        with pytest.raises(ValueError, match="profile"):
            ProbePlan(profile="p", counting={"profile": "other"})

    def test_for_profile_uses_the_registry(self):
        """Modalities default to those the profile counts (Qwen2.5-VL: no audio)."""
        assert ProbePlan.for_profile("qwen2.5-vl").modalities == ("text", "image", "video")
        assert ProbePlan.for_profile("qwen2.5-omni").modalities == (
            "text",
            "image",
            "audio",
            "video",
        )


class TestRequests:
    def test_openai_chat_bodies(self):
        """Each probe is a chat request with inline media of its declared size."""
        plan = ProbePlan(profile="p", model="m", **SMALL)
        by_id = {s.id: s for s in plan.probes()}
        image = build_request(by_id["image/320x200/r0"], plan)
        assert image.body["model"] == "m" and image.body["max_tokens"] == 1
        parts = image.body["messages"][0]["content"]
        assert [p["type"] for p in parts] == ["text", "image_url"]
        mime, data = decode_data_url(parts[1]["image_url"]["url"])
        assert mime == "image/jpeg"
        with Image.open(io.BytesIO(data)) as img:
            assert img.size == (320, 200)
        text = build_request(by_id["text/64w/r0"], plan)
        assert isinstance(text.body["messages"][0]["content"], str)
        assert len(text.body["messages"][0]["content"].split()) == 64

    def test_audio_and_video_parts(self):
        """Audio is input_audio WAV; video is an AVI data URL with llm-d's headers."""
        plan = ProbePlan(profile="p", **SMALL)
        by_id = {s.id: s for s in plan.probes()}
        audio = build_request(by_id["audio/2.5s/r0"], plan)
        part = audio.body["messages"][0]["content"][1]
        assert part["type"] == "input_audio" and part["input_audio"]["format"] == "wav"
        with wave.open(io.BytesIO(base64.b64decode(part["input_audio"]["data"]))) as w:
            assert w.getnframes() / w.getframerate() == 2.5
        video = build_request(by_id["video/1s@4fps-64x48/r0"], plan)
        mime, data = decode_data_url(video.body["messages"][0]["content"][1]["video_url"]["url"])
        assert mime == "video/x-msvideo" and data[:4] == b"RIFF" and data[8:12] == b"AVI "
        assert video.headers == {
            H.VIDEO_FPS: "4",
            H.VIDEO_DURATION: "1",
            H.VIDEO_RESOLUTION: "64x48",
        }

    def test_repeats_differ_same_plan_same_bytes(self):
        """Repeats differ in content (no cache hits); the same plan rebuilds the same bytes."""
        plan = ProbePlan(profile="p", **SMALL)
        by_id = {s.id: s for s in plan.probes()}
        r0 = build_request(by_id["image/224x224/r0"], plan).body
        r1 = build_request(by_id["image/224x224/r1"], plan).body
        assert r0 != r1
        assert r0 == build_request(by_id["image/224x224/r0"], plan).body


class TestCountedRequests:
    def test_qwen_image_tokens_match_hf_processor(self):
        """Counted image tokens equal the Hugging Face Qwen2-VL processor's grid on the bytes."""
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
            Qwen2VLImageProcessorPil,
        )

        plan = ProbePlan(
            profile="qwen2.5-vl",
            modalities=("image",),
            images=(ImageItem(width=1920, height=1080), ImageItem(width=448, height=448)),
            repeats=1,
            warmup=0,
            holdout=(),
        )
        count = default_count_fn(plan)
        processor = Qwen2VLImageProcessorPil(size={"shortest_edge": 3136, "longest_edge": 12845056})
        for spec in plan.probes():
            if spec.modality != "image" or spec.kind != "probe":
                continue
            request = build_request(spec, plan)
            counted = count(request.body, request.headers)
            assert counted.errors == []
            url = request.body["messages"][0]["content"][1]["image_url"]["url"]
            with Image.open(io.BytesIO(decode_data_url(url)[1])) as img:
                grid = processor(images=[img.convert("RGB")])["image_grid_thw"][0]
            assert counted.units["image.tokens"] == int(grid[0] * grid[1] * grid[2]) // 4
            assert counted.units["text.tokens"] > 0

    def test_audio_seconds_counted_from_wav(self):
        """The counter reads each WAV's duration from its header: the planned seconds."""
        plan = ProbePlan(
            profile="qwen2.5-omni",
            modalities=("audio",),
            holdout=(),
            **{"audios": (AudioItem(seconds=1), AudioItem(seconds=2.5))},
        )
        count = default_count_fn(plan)
        seen = set()
        for spec in plan.probes():
            if spec.modality == "audio" and spec.kind == "probe":
                request = build_request(spec, plan)
                counted = count(request.body, request.headers)
                assert counted.errors == []
                assert counted.units["audio.seconds"] == spec.audios[0].seconds
                seen.add(spec.audios[0].seconds)
        assert seen == {1.0, 2.5}
