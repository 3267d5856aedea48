"""Gemma 3 / 3n / 4 counters against the real transformers processors (Pil, no torch).

The oracles are the installed transformers code: image processors run on
generated PIL images, feature extractors on generated waveforms, and the
processors' own prompt-expansion methods build the replacement text. A tiny
in-test WordLevel tokenizer (real ``tokenizers`` object) lets the processors
be built without downloading one; only special tokens are counted from it.
"""

from __future__ import annotations

import inspect
import random
from types import SimpleNamespace

import numpy as np
import pytest
from counting_helpers import image_corpus, tiny_tokenizer
from PIL import Image
from pydantic import ValidationError
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil
from transformers.models.gemma3.processing_gemma3 import Gemma3Processor
from transformers.models.gemma3n.feature_extraction_gemma3n import Gemma3nAudioFeatureExtractor
from transformers.models.gemma3n.processing_gemma3n import Gemma3nProcessor
from transformers.models.gemma4 import image_processing_pil_gemma4 as hf_gemma4_image
from transformers.models.gemma4.feature_extraction_gemma4 import Gemma4AudioFeatureExtractor
from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil
from transformers.models.gemma4.processing_gemma4 import Gemma4Processor
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

from modtrace.counting.families import gemma
from modtrace.counting.families.audio_common import samples_at_rate
from modtrace.counting.families.gemma import (
    GEMMA3,
    GEMMA3N,
    GEMMA4,
    PROFILES,
    Gemma4AudioParams,
    Gemma4ImageParams,
    Gemma4VideoParams,
)
from modtrace.counting.profile import AudioInput, ImageInput, VideoInput

GEMMA_SPECIALS = {
    "boi_token": "<start_of_image>",
    "image_token": "<image_soft_token>",
    "eoi_token": "<end_of_image>",
    "boa_token": "<start_of_audio>",
    "audio_token": "<audio_soft_token>",
    "eoa_token": "<end_of_audio>",
}


#: Sizes checked first: extremes and this family's tile and patch edges.
FIXED_SIZES = [
    (1, 1), (1, 2), (2, 1), (3, 500), (500, 3), (1, 150), (150, 1), (10, 10),
    (9, 9), (13, 17), (47, 49), (48, 48), (96, 47), (255, 256), (256, 255), (307, 256),
    (336, 336), (448, 448), (640, 480), (480, 640), (800, 600), (896, 896), (1023, 767),
    (1024, 768), (768, 1024), (1280, 720), (720, 1280), (1920, 1080), (1080, 1920),
    (2048, 1536), (2400, 16), (16, 2400), (2400, 2400), (1000, 3), (3, 1000), (311, 1),
]  # fmt: skip

IMAGES = image_corpus(FIXED_SIZES, n=200, seed=7, limit=1600)
HUGE = [(20000, 20000), (20000, 133), (133, 20000), (30000, 1), (1, 30000), (4032, 3024)]
AUDIO_LENGTHS = sorted(
    {0, 1, 100, 159, 160, 161, 320, 321, 400, 480, 481, 511, 512, 513, 640, 641, 1000, 1600,
     16000, 16001, 47_999, 160_000, 479_839, 479_840, 480_000, 480_001, 600_000, 1_000_000}
    | set(random.Random(3).sample(range(2, 120_000), 30))
)  # fmt: skip


def _special_and_newline_count(text: str, specials: list[str]) -> int:
    """Tokens of a replacement text that are special tokens or ``"\\n\\n"`` (one token each)."""
    return sum(text.count(tok) for tok in specials) + text.count("\n\n")


@pytest.fixture(scope="module")
def gemma3_processor() -> Gemma3Processor:
    """The real Gemma3Processor around a tiny tokenizer (images at 224 px for speed)."""
    return Gemma3Processor(
        image_processor=Gemma3ImageProcessorPil(size={"height": 224, "width": 224}),
        tokenizer=tiny_tokenizer(GEMMA_SPECIALS),
    )


class TestGemma3Image:
    """Gemma 3 images: 256 soft tokens in a 4-token frame, pan-and-scan opt-in."""

    def test_seq_length_matches_processor_default(self):
        """The counter's 256 is the processor's own default."""
        default = inspect.signature(Gemma3Processor.__init__).parameters["image_seq_length"]
        assert GEMMA3.image.params.image_seq_length == default.default == 256

    @pytest.mark.parametrize("pan_and_scan", [False, True])
    def test_corpus_matches_processor(self, gemma3_processor, pan_and_scan):
        """Views, image tokens and frame tokens match the processor over 200+ sizes."""
        counter = GEMMA3.with_params({"do_pan_and_scan": pan_and_scan}).image
        specials = [GEMMA_SPECIALS[k] for k in ("boi_token", "image_token", "eoi_token")]
        for index, (width, height) in enumerate(IMAGES):
            image = Image.new("RGB", (width, height))
            pixels = gemma3_processor.image_processor(
                image, **{**Gemma3Processor.images_kwargs, "do_pan_and_scan": pan_and_scan}
            )
            crops = int(pixels["num_crops"][0])
            repl = gemma3_processor.replace_image_token({"num_crops": [crops]}, 0)
            expected = _special_and_newline_count(repl, specials)
            if index % 10 == 0:
                # The full prompt expansion places the same number of special tokens.
                out = gemma3_processor(
                    text=["<start_of_image>"], images=[[image]], do_pan_and_scan=pan_and_scan
                )
                ids = out["input_ids"][0]
                assert sum(ids.count(i) for i in (1, 2, 3)) == (crops + 1) * 258
            units = counter(ImageInput(width, height))
            text_tokens = (16 + crops) if crops else 0  # UNVERIFIED wrapper text, see module
            assert units.tokens - text_tokens == expected, (width, height)
            assert units.tiles == ((crops + 1) if pan_and_scan else None)

    def test_pan_and_scan_rule_on_huge_sizes(self):
        """Crop counts for huge sizes match ``pan_and_scan`` run on zero-copy arrays."""
        processor = Gemma3ImageProcessorPil()
        counter = GEMMA3.with_params({"do_pan_and_scan": True}).image
        for width, height in [*HUGE, *IMAGES]:
            array = np.broadcast_to(np.zeros((1, 1, 1), np.uint8), (3, height, width))
            crops = processor.pan_and_scan(array, 256, 4, 1.2)
            assert counter(ImageInput(width, height)).tiles == len(crops) + 1, (width, height)

    def test_worked_example_1920x1080(self):
        """1920×1080 with pan-and-scan gives 2 crops, i.e. 3 × 256 soft tokens (research §3)."""
        units = GEMMA3.with_params({"do_pan_and_scan": True}).image(ImageInput(1920, 1080))
        assert units.tiles == 3
        assert units.tokens == 3 * 260 + 16 + 2

    def test_nested_images_kwargs_override(self):
        """``images_kwargs`` nested overrides reach the flat fields."""
        counter = GEMMA3.with_params(
            {"images_kwargs": {"do_pan_and_scan": True, "pan_and_scan_max_num_crops": 2}}
        ).image
        assert counter(ImageInput(4000, 500)).tiles == 3

    @pytest.mark.parametrize("bad", [(0, 10), (10, 0), (-1, 5), (2.5, 3)])
    def test_rejects_bad_sizes(self, bad):
        """Non-positive or non-integer sizes raise ValueError."""
        with pytest.raises(ValueError, match="must be a positive integer"):
            GEMMA3.image(ImageInput(*bad))


@pytest.fixture(scope="module")
def gemma3n_processor() -> Gemma3nProcessor:
    """The real Gemma3nProcessor around a tiny tokenizer."""
    return Gemma3nProcessor(
        feature_extractor=Gemma3nAudioFeatureExtractor(),
        image_processor=SiglipImageProcessorPil(),
        tokenizer=tiny_tokenizer(GEMMA_SPECIALS),
    )


@pytest.fixture(scope="module")
def namespace() -> SimpleNamespace:
    """Stand-in ``self`` for the Gemma 4 processor's replacement methods."""
    return SimpleNamespace(**GEMMA_SPECIALS)


class TestGemma3n:
    """Gemma 3n: fixed 256 image and 188 audio soft tokens."""

    def test_image_tokens_match_processor(self, gemma3n_processor):
        """Every size expands to the processor's full image sequence."""
        specials = [GEMMA_SPECIALS[k] for k in ("boi_token", "image_token", "eoi_token")]
        processor = gemma3n_processor
        expected = _special_and_newline_count(processor.full_image_sequence, specials)
        for width, height in IMAGES[:40]:
            out = processor(text=["<image_soft_token>"], images=[Image.new("RGB", (width, height))])
            assert sum(out["input_ids"][0].count(i) for i in (1, 2, 3)) == 258
            assert GEMMA3N.image(ImageInput(width, height)).tokens == expected == 260

    def test_audio_matches_feature_extractor_and_processor(self, gemma3n_processor):
        """Frames equal the mask sum; tokens the processor's fixed audio sequence."""
        specials = [GEMMA_SPECIALS[k] for k in ("boa_token", "audio_token", "eoa_token")]
        processor = gemma3n_processor
        expected_tokens = _special_and_newline_count(processor.full_audio_sequence, specials)
        fe = processor.feature_extractor
        for n in AUDIO_LENGTHS:
            if n == 0:
                continue
            mask = fe([np.zeros(n, dtype=np.float32)])["input_features_mask"][0]
            units = GEMMA3N.audio(AudioInput(seconds=n / 16000, sample_rate=16000, num_samples=n))
            assert units.frames == int(mask.sum()), n
            assert units.tokens == expected_tokens == 192

    def test_audio_capped_at_30_seconds(self):
        """Frames stop growing past the 480 000-sample (30 s) truncation."""
        assert GEMMA3N.audio(AudioInput(30.0)).frames == GEMMA3N.audio(AudioInput(300.0)).frames

    def test_empty_clip(self):
        """A clip with no samples has no frames but keeps its fixed placeholder."""
        assert GEMMA3N.audio(AudioInput(0.0)) == gemma.AudioUnits(frames=0, tokens=192)


class TestGemma4Image:
    """Gemma 4 images: aspect-preserving resize to the soft-token budget."""

    def test_default_budget_matches_processor(self):
        """280 is both the image processor's and the processor's default."""
        assert GEMMA4.image.params.max_soft_tokens == Gemma4ImageProcessorPil.max_soft_tokens
        default = inspect.signature(Gemma4Processor.__init__).parameters["image_seq_length"]
        assert default.default == 280

    def test_corpus_matches_image_processor(self, namespace):
        """Tokens equal the processor's replacement for 200+ generated images."""
        processor = Gemma4ImageProcessorPil()
        for width, height in IMAGES:
            out = processor(Image.new("RGB", (width, height)))
            repl = Gemma4Processor.replace_image_token(namespace, out, 0)
            expected = _special_and_newline_count(
                repl, [GEMMA_SPECIALS[k] for k in ("boi_token", "image_token", "eoi_token")]
            )
            assert GEMMA4.image(ImageInput(width, height)).tokens == expected, (width, height)

    @pytest.mark.parametrize("budget", [70, 140, 560, 1120])
    def test_other_budgets_match_image_processor(self, budget):
        """Each supported budget matches the processor on a sample of sizes."""
        processor = Gemma4ImageProcessorPil(max_soft_tokens=budget)
        counter = GEMMA4.with_params({"max_soft_tokens": budget}).image
        for width, height in IMAGES[::20]:
            out = processor(Image.new("RGB", (width, height)))
            expected = out["num_soft_tokens_per_image"][0] + 2
            assert counter(ImageInput(width, height)).tokens == expected, (width, height)

    @pytest.mark.parametrize("budget", [70, 280, 1120])
    def test_huge_sizes_match_size_helper(self, budget):
        """Huge and extreme sizes match the processor's own size helper."""
        for width, height in [*HUGE, (20000, 40), (40, 20000)]:
            h, w = hf_gemma4_image.get_aspect_ratio_preserving_size(
                height, width, 16, budget * 9, 3
            )
            counter = GEMMA4.with_params({"max_soft_tokens": budget}).image
            assert counter(ImageInput(width, height)).tokens == (h // 16) * (w // 16) // 9 + 2

    def test_worked_example(self):
        """1024×768 → 912×672 → 266 soft tokens at 280 (research §3)."""
        assert GEMMA4.image(ImageInput(1024, 768)).tokens == 266 + 2

    def test_rejects_unsupported_budget(self):
        """A budget outside {70, 140, 280, 560, 1120} is refused like the processor does."""
        with pytest.raises(ValidationError, match="max_soft_tokens must be one of"):
            Gemma4ImageParams(max_soft_tokens=300)
        with pytest.raises(ValueError, match="max_soft_tokens"):
            Gemma4ImageProcessorPil(max_soft_tokens=300)

    def test_nested_images_kwargs(self):
        """vLLM's nested ``images_kwargs`` form sets the budget."""
        counter = GEMMA4.with_params({"images_kwargs": {"max_soft_tokens": 560}}).image
        assert counter.params.max_soft_tokens == 560


class TestGemma4Video:
    """Gemma 4 video: 32 timestamped frames of 70 soft tokens each."""

    def test_per_frame_soft_tokens_match_image_processor(self):
        """Per-frame soft tokens equal the image processor at budget 70."""
        processor = Gemma4ImageProcessorPil(max_soft_tokens=70)
        for width, height in IMAGES[::5]:
            soft = processor(Image.new("RGB", (width, height)))["num_soft_tokens_per_image"][0]
            units = GEMMA4.video(VideoInput(seconds=1.0, fps=1.0, width=width, height=height))
            assert units.frames == 1
            assert units.tokens == soft + 2 + 6, (width, height)

    @pytest.mark.parametrize(
        ("seconds", "fps", "frames"),
        [(10.0, 30.0, 32), (1.0, 30.0, 30), (0.5, 2.0, 1), (600.0, 24.0, 32), (1.06, 30.0, 32)],
    )
    def test_frame_count(self, seconds, fps, frames):
        """Frames are min(32, round(seconds × fps)), as vLLM's loader samples."""
        units = GEMMA4.video(VideoInput(seconds=seconds, fps=fps, width=640, height=360))
        assert units.frames == frames

    def test_vllm_budget_bound(self):
        """No video exceeds vLLM's own per-item budget, 32 × (70 + 2 + 6)."""
        for width, height in IMAGES:
            units = GEMMA4.video(VideoInput(seconds=60, fps=30, width=width, height=height))
            assert units.tokens <= 32 * (70 + 2 + 6)

    def test_request_max_soft_tokens_does_not_change_video(self):
        """vLLM forces 70 per frame: an image budget override leaves video alone."""
        item = VideoInput(seconds=10, fps=30, width=1280, height=720)
        assert GEMMA4.with_params({"max_soft_tokens": 1120}).video(item) == GEMMA4.video(item)

    def test_shortest_video_has_one_frame(self):
        """A clip shorter than a frame still yields the one frame the loader decodes."""
        assert GEMMA4.video(VideoInput(seconds=0.0, fps=30, width=640, height=360)).frames == 1

    def test_loader_fps_caps_frames(self):
        """``media_io_kwargs.video.fps`` caps the frames at floor(seconds × fps)."""
        counter = GEMMA4.with_params({"loader_fps": 1.0}).video
        assert counter(VideoInput(seconds=10.0, fps=30, width=640, height=360)).frames == 10

    def test_rejects_bad_video(self):
        """Negative durations and zero frame rates are refused."""
        for seconds, fps in [(-1.0, 30.0), (10.0, 0.0), (float("inf"), 30.0)]:
            with pytest.raises(ValueError, match="video"):
                GEMMA4.video(VideoInput(seconds=seconds, fps=fps, width=640, height=360))

    def test_num_frames_validation(self):
        """num_frames must be positive or -1."""
        assert Gemma4VideoParams(num_frames=-1).num_frames == -1
        with pytest.raises(ValidationError, match="num_frames"):
            Gemma4VideoParams(num_frames=0)


class TestGemma4Audio:
    """Gemma 4 audio: ~25 tokens/s capped at 750."""

    def test_matches_processor_both_paths(self):
        """Tokens equal both the mask path and the length path of the processor."""
        fe = Gemma4AudioFeatureExtractor()
        cap = inspect.signature(Gemma4Processor.__init__).parameters["audio_seq_length"].default
        ns = SimpleNamespace(**GEMMA_SPECIALS, feature_extractor=fe, audio_seq_length=cap)
        for n in AUDIO_LENGTHS:
            units = GEMMA4.audio(AudioInput(seconds=n / 16000, sample_rate=16000, num_samples=n))
            by_length = Gemma4Processor._compute_audio_num_tokens(ns, np.zeros(n), 16000)
            assert units.tokens == by_length + 2, n
            if n == 0:
                continue
            out = fe([np.zeros(n, dtype=np.float32)])  # batched, as the processor calls it
            assert units.frames == int(out["input_features_mask"][0].sum()), n
            repl = Gemma4Processor.replace_audio_token(ns, out, 0)
            expected = _special_and_newline_count(
                repl, [GEMMA_SPECIALS[k] for k in ("boa_token", "audio_token", "eoa_token")]
            )
            assert units.tokens == expected, n

    def test_worked_examples(self):
        """10 s → 250 soft tokens; 30 s and more → 750 (research §3)."""
        assert GEMMA4.audio(AudioInput(10.0)).tokens == 252
        assert GEMMA4.audio(AudioInput(30.0)).tokens == 752
        assert GEMMA4.audio(AudioInput(3600.0)).tokens == 752

    def test_resampled_clip(self):
        """A 44.1 kHz clip is counted at its length after vLLM's resampling."""
        item = AudioInput(seconds=10.0, sample_rate=44_100, num_samples=441_000)
        params = Gemma4AudioParams()
        resampled = samples_at_rate(item, 16_000, params.resample_method)
        expected = gemma.gemma4_audio_soft_tokens(resampled, params) + 2
        assert GEMMA4.audio(item).tokens == expected == 252

    def test_resample_method_is_a_parameter(self):
        """The resampling backend can be chosen like vLLM's ``AudioResampler``."""
        item = AudioInput(seconds=0.0, sample_rate=44_100, num_samples=441_001)
        for method in ("librosa", "scipy", "soxr", "torchaudio"):
            counter = GEMMA3N.with_params({"resample_method": method}).audio
            n = samples_at_rate(item, 16_000, method)
            assert counter(item).frames == gemma.gemma3n_audio_frames(n, counter.params)

    @pytest.mark.parametrize(
        "item",
        [
            AudioInput(seconds=-1.0),
            AudioInput(seconds=float("nan")),
            AudioInput(seconds=1.0, sample_rate=0),
            AudioInput(seconds=1.0, sample_rate=16_000, num_samples=-5),
        ],
    )
    def test_rejects_bad_audio(self, item):
        """Negative, NaN or zero-rate clips raise ValueError."""
        with pytest.raises(ValueError, match=r"seconds|sample_rate|num_samples"):
            GEMMA4.audio(item)


def test_profiles_export():
    """The module exports its three profiles with versioned counter ids."""
    assert [p.name for p in PROFILES] == ["gemma-3", "gemma-3n", "gemma-4"]
    refs = {c.ref for p in PROFILES for c in (p.image, p.audio, p.video) if c is not None}
    assert refs == {
        "gemma-3.image@1",
        "gemma-3n.image@1",
        "gemma-3n.audio@1",
        "gemma-4.image@1",
        "gemma-4.video@1",
        "gemma-4.audio@1",
    }
