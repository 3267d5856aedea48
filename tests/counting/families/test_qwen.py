"""Qwen2-VL / Qwen2.5-VL / Qwen3-VL counters against the real Hugging Face code.

Images: the real ``Qwen2VLImageProcessorPil`` (the class all three models
load) runs on generated PIL images, built from the checkpoint configs, and
its ``image_grid_thw`` must give our token count for every size of a
corpus of 200+ sizes per configuration. Huge sizes go through the same
processor's ``get_number_of_image_patches`` helper (a full run would
allocate gigabytes).

Videos: the HF video processors import torch/torchvision at module level,
which the project does not install. Their pure helpers (``smart_resize``,
``Qwen3VLVideoProcessor.sample_frames`` and ``get_num_of_video_patches``)
are read from the installed transformers source and executed as they are;
``Qwen3VLProcessor._calculate_timestamps`` runs directly. When torch and
torchvision are importable, the full processors run too.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
import math
import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from PIL import Image
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

from modtrace.counting.families.numerics import linspace
from modtrace.counting.families.qwen import (
    PROFILES,
    QWEN2_VL,
    QWEN3_VL,
    QWEN25_VL,
    Qwen3VideoParams,
    QwenImageParams,
    QwenVideoParams,
    qwen_timestamp_tokens,
    qwen_video_units,
    smart_resize,
    smart_resize_video,
    temporal_group_timestamps,
)
from modtrace.counting.families.video_loader import (
    qwen2_loader_indices,
    qwen3_loader_indices,
    source_frame_count,
    uniform_loader_indices,
)
from modtrace.counting.profile import ImageInput, VideoInput

# --- Checkpoint configs (the oracle's inputs, quoted from the checkpoints) ----
#: Qwen/Qwen2.5-VL-7B-Instruct preprocessor_config.json (Qwen2-VL-7B-Instruct has
#: the same pixel bounds: "visual tokens per image ... 4-16384" in its model card).
QWEN25_PREPROCESSOR: dict[str, Any] = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
}
#: Qwen/Qwen3-VL-8B-Instruct preprocessor_config.json (pixel bounds under ``size``).
QWEN3_PREPROCESSOR: dict[str, Any] = {
    "size": {"longest_edge": 16777216, "shortest_edge": 65536},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
}
#: Qwen3-VL video_preprocessor_config.json (Qwen3-VL-2B-Instruct processor dump).
QWEN3_VIDEO_PREPROCESSOR: dict[str, Any] = {
    "size": {"longest_edge": 25165824, "shortest_edge": 4096},
    "patch_size": 16,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "fps": 2,
    "min_frames": 4,
    "max_frames": 768,
}

# Normalisation does not change the grid; skipping it keeps the corpus fast.
_FAST = {"do_rescale": False, "do_normalize": False}


def _size_corpus(seed: int, factor: int) -> list[tuple[int, int]]:
    """200+ (width, height) pairs: extremes, factor edges, odd and random sizes."""
    rng = random.Random(seed)
    edges = sorted(
        {1, 2, 3, 9, 10, 11, 13, 27, 55, 99, 100, 101, 333, 511, 640, 799}
        | {k * factor + d for k in (1, 2, 7, 13) for d in (-1, 0, 1)}
        | {k * factor // 2 for k in (1, 3, 5)}
    )
    sizes = {(1, 1), (3, 500), (500, 3), (1, 150), (150, 1), (1, 200), (200, 1), (2, 399)}
    sizes |= {(4, 799), (799, 4), (5, 5), (7, 640), (640, 7), (799, 799), (797, 613)}
    while len(sizes) < 150:
        sizes.add((rng.choice(edges), rng.choice(edges)))
    while len(sizes) < 225:
        sizes.add((rng.randint(1, 800), rng.randint(1, 800)))
    return sorted(sizes)


def _grid(processor: Qwen2VLImageProcessorPil, width: int, height: int) -> list[int]:
    out = processor(images=[Image.new("RGB", (width, height))], **_FAST)
    return [int(x) for x in out["image_grid_thw"][0]]


def _assert_matches(processor: Qwen2VLImageProcessorPil, counter: Any, w: int, h: int) -> bool:
    """Our tokens equal the processor's grid, or both refuse the size.

    Returns:
        Whether the processor accepted the size.
    """
    try:
        t, gh, gw = _grid(processor, w, h)
    except ValueError:
        with pytest.raises(ValueError, match="aspect ratio"):
            counter(ImageInput(w, h))
        return False
    assert t == 1
    assert counter(ImageInput(w, h)).tokens == gh * gw // 4, (w, h)
    return True


@pytest.fixture(scope="module")
def qwen25_processor() -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(**QWEN25_PREPROCESSOR)


@pytest.fixture(scope="module")
def qwen3_processor() -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil(**QWEN3_PREPROCESSOR)


# --- Images ------------------------------------------------------------------
class TestImageDefaults:
    def test_qwen2_and_qwen25_defaults_are_the_checkpoint_config(self) -> None:
        """Qwen2/2.5-VL image parameters equal preprocessor_config.json."""
        for profile in (QWEN2_VL, QWEN25_VL):
            params = profile.image.params
            assert params.min_pixels == QWEN25_PREPROCESSOR["min_pixels"]
            assert params.max_pixels == QWEN25_PREPROCESSOR["max_pixels"]
            assert params.patch_size == QWEN25_PREPROCESSOR["patch_size"]
            assert params.merge_size == QWEN25_PREPROCESSOR["merge_size"]

    def test_qwen3_defaults_are_the_checkpoint_config(self) -> None:
        """Qwen3-VL image parameters equal its preprocessor_config.json ``size``."""
        params = QWEN3_VL.image.params
        assert params.min_pixels == QWEN3_PREPROCESSOR["size"]["shortest_edge"]
        assert params.max_pixels == QWEN3_PREPROCESSOR["size"]["longest_edge"]
        assert params.patch_size == 16

    def test_processor_built_from_config_has_the_same_bounds(
        self, qwen3_processor: Qwen2VLImageProcessorPil
    ) -> None:
        """The HF processor reads the same size dict the profile was given."""
        assert qwen3_processor.size["shortest_edge"] == QWEN3_VL.image.params.min_pixels
        assert qwen3_processor.size["longest_edge"] == QWEN3_VL.image.params.max_pixels


class TestImageExactness:
    @pytest.mark.parametrize("profile", [QWEN2_VL, QWEN25_VL], ids=lambda p: p.name)
    def test_qwen2_family_matches_processor_over_corpus(
        self, profile: Any, qwen25_processor: Qwen2VLImageProcessorPil
    ) -> None:
        """Tokens equal grid_h*grid_w/4 of the real processor for 200+ sizes."""
        sizes = _size_corpus(seed=25, factor=28)
        accepted = sum(_assert_matches(qwen25_processor, profile.image, w, h) for w, h in sizes)
        assert accepted >= 200

    def test_qwen3_matches_processor_over_corpus(
        self, qwen3_processor: Qwen2VLImageProcessorPil
    ) -> None:
        """Qwen3-VL tokens equal the 16-px processor's grid for 200+ sizes."""
        sizes = _size_corpus(seed=3, factor=32)
        accepted = sum(_assert_matches(qwen3_processor, QWEN3_VL.image, w, h) for w, h in sizes)
        assert accepted >= 200

    def test_resized_sides_match_processor_grid(
        self, qwen25_processor: Qwen2VLImageProcessorPil
    ) -> None:
        """smart_resize gives the processor's grid sides, not only their product."""
        for w, h in [(1, 1), (3, 500), (333, 799), (641, 479), (150, 1)]:
            _, gh, gw = _grid(qwen25_processor, w, h)
            assert smart_resize(h, w, 28, 3136, 12845056) == (gh * 14, gw * 14)

    @pytest.mark.parametrize(
        "size", [(1200, 900), (2000, 1999), (1999, 13), (640, 1900), (1001, 1001), (1500, 10)]
    )
    def test_downscaling_branch_matches_processor(self, size: tuple[int, int]) -> None:
        """A small max_pixels override (256..1280 tokens) follows the real downscale."""
        kwargs = {"min_pixels": 256 * 28 * 28, "max_pixels": 1280 * 28 * 28}
        processor = Qwen2VLImageProcessorPil(**kwargs)
        counter = QWEN25_VL.image.with_params(kwargs)
        _, gh, gw = _grid(processor, *size)
        assert counter(ImageInput(*size)).tokens == gh * gw // 4

    @pytest.mark.parametrize(
        "size",
        [(20000, 20000), (150, 22500), (22500, 150), (19999, 107), (12000, 3000), (4096, 8192)],
    )
    def test_huge_images_match_processor_helper(
        self,
        size: tuple[int, int],
        qwen25_processor: Qwen2VLImageProcessorPil,
        qwen3_processor: Qwen2VLImageProcessorPil,
    ) -> None:
        """Huge images: the processor's own patch-count helper (what vLLM calls)."""
        w, h = size
        assert QWEN25_VL.image(ImageInput(w, h)).tokens == (
            qwen25_processor.get_number_of_image_patches(h, w) // 4
        )
        assert QWEN3_VL.image(ImageInput(w, h)).tokens == (
            qwen3_processor.get_number_of_image_patches(h, w) // 4
        )

    def test_worked_examples(self) -> None:
        """Research §1a: 1920x1080 -> 2691 (Qwen2.5-VL), 2040 (Qwen3-VL)."""
        assert QWEN25_VL.image(ImageInput(1920, 1080)).tokens == 69 * 39
        assert QWEN3_VL.image(ImageInput(1920, 1080)).tokens == 60 * 34


class TestImageEdges:
    @pytest.mark.parametrize("size", [(1, 201), (201, 1), (2, 403), (1000, 4)])
    def test_aspect_ratio_above_200_raises_like_processor(
        self, size: tuple[int, int], qwen25_processor: Qwen2VLImageProcessorPil
    ) -> None:
        """Both the processor and the counter refuse an aspect ratio above 200."""
        with pytest.raises(ValueError, match="aspect ratio"):
            _grid(qwen25_processor, *size)
        with pytest.raises(ValueError, match="aspect ratio"):
            QWEN25_VL.image(ImageInput(*size))

    def test_zero_size_raises(self) -> None:
        """A zero side is rejected with a clear message."""
        with pytest.raises(ValueError, match="at least 1x1"):
            QWEN3_VL.image(ImageInput(0, 10))

    def test_tiles_are_none(self) -> None:
        """Qwen does not tile."""
        assert QWEN25_VL.image(ImageInput(640, 480)).tiles is None


class TestParams:
    def test_nested_size_overrides_flat_fields(self) -> None:
        """HF's size={shortest_edge, longest_edge} maps onto min/max pixels."""
        counter = QWEN3_VL.image.with_params({"size": {"longest_edge": 1003520}})
        assert counter.params.max_pixels == 1003520
        assert counter.params.min_pixels == 65536
        processor = Qwen2VLImageProcessorPil(
            patch_size=16, size={"shortest_edge": 65536, "longest_edge": 1003520}
        )
        _, gh, gw = _grid(processor, 1920, 1080)
        assert counter(ImageInput(1920, 1080)).tokens == gh * gw // 4

    def test_flat_mm_processor_kwargs_override(self) -> None:
        """A request's max_pixels reaches the counter by name."""
        counter = QWEN25_VL.image.with_params({"max_pixels": 1003520, "fps": 1})
        assert counter.params.max_pixels == 1003520
        assert counter(ImageInput(1920, 1080)).tokens == 1222  # research §1a

    @pytest.mark.parametrize(
        "bad", [{"max_pixels": 0}, {"patch_size": -14}, {"size": [1, 2]}, {"size": {"height": 5}}]
    )
    def test_invalid_values_are_rejected(self, bad: dict[str, Any]) -> None:
        """Non-positive or malformed parameters raise a validation error."""
        with pytest.raises(ValueError):  # noqa: PT011 - pydantic's error is a ValueError
            QwenImageParams.model_validate(bad)

    def test_num_frames_must_be_positive_or_minus_one(self) -> None:
        """num_frames is a count or -1 (all frames), as vLLM's media_io_kwargs."""
        QwenVideoParams(num_frames=-1)
        with pytest.raises(ValueError, match="num_frames"):
            QwenVideoParams(num_frames=0)

    def test_profiles_are_exported(self) -> None:
        """PROFILES holds the three families with their aliases."""
        assert [p.name for p in PROFILES] == ["qwen2-vl", "qwen2.5-vl", "qwen3-vl"]
        assert "qwen2_5_vl" in QWEN25_VL.aliases
        assert QWEN3_VL.video.ref == "qwen3-vl.video@1"


# --- HF video helpers, read from the installed transformers source -----------
def _hf_functions(
    module: str, functions: set[str], class_name: str = "", methods: frozenset[str] = frozenset()
) -> dict[str, Any]:
    """Execute module-level ``functions`` and ``class_name``'s ``methods`` from a module's source.

    The modules import torch at top level; these functions only use math
    and numpy, so they run as written (annotations dropped), sharing one
    namespace so that methods find ``smart_resize``.
    """
    spec = importlib.util.find_spec(module)
    assert spec is not None
    assert spec.origin is not None
    tree = ast.parse(Path(spec.origin).read_text())
    picked = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in functions]
    if class_name:
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
        picked += [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in methods]
    assert {n.name for n in picked} == functions | methods
    for fn in picked:
        fn.decorator_list = []
        fn.returns = None
        for arg in [*fn.args.args, *fn.args.kwonlyargs]:
            arg.annotation = None
    warn = logging.getLogger("hf-oracle")
    namespace: dict[str, Any] = {
        "math": math,
        "np": np,
        "logger": SimpleNamespace(warning_once=warn.debug),
    }
    exec(compile(ast.Module(body=picked, type_ignores=[]), spec.origin, "exec"), namespace)
    return namespace


_QWEN3_VIDEO = "transformers.models.qwen3_vl.video_processing_qwen3_vl"
_QWEN2_VIDEO = "transformers.models.qwen2_vl.video_processing_qwen2_vl"


@pytest.fixture(scope="module")
def hf_qwen3_video() -> dict[str, Any]:
    methods = frozenset({"sample_frames", "get_num_of_video_patches"})
    return _hf_functions(_QWEN3_VIDEO, {"smart_resize"}, "Qwen3VLVideoProcessor", methods)


@pytest.fixture(scope="module")
def hf_qwen2_video() -> dict[str, Any]:
    methods = frozenset({"get_num_of_video_patches"})
    return _hf_functions(_QWEN2_VIDEO, {"smart_resize"}, "Qwen2VLVideoProcessor", methods)


def _qwen3_self(**overrides: Any) -> SimpleNamespace:
    """A stand-in ``self`` with the checkpoint's video processor attributes."""
    cfg = {**QWEN3_VIDEO_PREPROCESSOR, "cap_pixels_per_frame": None, "max_video_tokens": 768}
    cfg.update(overrides)
    return SimpleNamespace(**cfg)


def _video_corpus(seed: int) -> list[tuple[int, int, int]]:
    """(frames, height, width) triples: tiny, odd, extreme and common frame sizes."""
    rng = random.Random(seed)
    triples = {(2, 1, 1), (3, 31, 33), (4, 10, 2000), (5, 2000, 10), (33, 720, 1280)}
    triples |= {(768, 2160, 3840), (2, 7, 1399), (17, 481, 853), (64, 1080, 1920)}
    while len(triples) < 220:
        triples.add((rng.randint(2, 300), rng.randint(1, 2200), rng.randint(1, 2200)))
    return sorted(triples)


class TestVideoResize:
    def test_qwen3_smart_resize_video_matches_hf(self, hf_qwen3_video: dict[str, Any]) -> None:
        """Qwen3-VL's all-frames smart_resize equals the HF function (220 cases)."""
        hf = hf_qwen3_video["smart_resize"]
        for n, h, w in _video_corpus(seed=7):
            try:
                expected = hf(n, h, w, temporal_factor=2, factor=32, min_pixels=4096,
                              max_pixels=25165824)  # fmt: skip
            except ValueError:
                with pytest.raises(ValueError, match="aspect ratio"):
                    smart_resize_video(n, h, w, 32, 4096, 25165824)
                continue
            assert smart_resize_video(n, h, w, 32, 4096, 25165824) == expected, (n, h, w)

    def test_qwen3_single_frame_raises_like_hf(self, hf_qwen3_video: dict[str, Any]) -> None:
        """One frame is below the temporal patch: HF and the counter both refuse."""
        with pytest.raises(ValueError, match="temporal_factor"):
            hf_qwen3_video["smart_resize"](1, 100, 100, temporal_factor=2, factor=32)
        with pytest.raises(ValueError, match="at least 2 frames"):
            smart_resize_video(1, 100, 100, 32, 4096, 25165824)

    def test_qwen2_video_smart_resize_matches_hf(self, hf_qwen2_video: dict[str, Any]) -> None:
        """The per-frame smart_resize equals the copy in the Qwen2-VL video module."""
        hf = hf_qwen2_video["smart_resize"]
        for _, h, w in _video_corpus(seed=8):
            try:
                expected = hf(h, w, factor=28, min_pixels=3136, max_pixels=12845056)
            except ValueError:
                continue
            assert smart_resize(h, w, 28, 3136, 12845056) == expected


class TestVideoSampling:
    def test_qwen3_sampling_matches_hf_sample_frames(self, hf_qwen3_video: dict[str, Any]) -> None:
        """The qwen3_vl loader indices equal HF Qwen3VLVideoProcessor.sample_frames."""
        sample = hf_qwen3_video["sample_frames"]
        me = _qwen3_self()
        for total in [*range(1, 120), 299, 300, 301, 1799, 1800, 36000, 100000]:
            for src_fps in (1.0, 7.5, 23.976, 24.0, 25.0, 29.97, 30.0, 60.0):
                meta = SimpleNamespace(total_num_frames=total, fps=src_fps)
                expected = sample(me, meta).tolist()
                assert qwen3_loader_indices(total, src_fps, 2.0, 4, 768) == expected

    def test_linspace_is_numpy_linspace(self) -> None:
        """The pure-Python linspace reproduces numpy bit for bit (truncated and rounded)."""
        for total in (1, 2, 3, 10, 299, 300, 997, 36000):
            for n in (1, 2, 3, 4, 17, 32, 64, 768):
                if n > total:
                    continue
                ours = linspace(0, total - 1, n)
                assert [int(x) for x in ours] == np.linspace(0, total - 1, n, dtype=int).tolist()
                assert [round(x) for x in ours] == (
                    np.linspace(0, total - 1, n).round().astype(int).tolist()
                )

    def test_uniform_loader_is_vllm_opencv_sampling(self) -> None:
        """vLLM VideoBackend: min(num_frames, total) frames, np.linspace(..., dtype=int)."""
        # vllm@vllm/frontend/processing/multimodal/video.py, VideoBackend:
        #   num_frames_to_sample = min(num_frames, total) if num_frames > 0 else total
        #   if fps > 0: min(..., floor(duration * fps)); max(1, ...)
        #   list(range(n)) if n == total else np.linspace(0, total-1, n, dtype=int)
        assert uniform_loader_indices(300, 30.0, 32, -1) == (
            np.linspace(0, 299, 32, dtype=int).tolist()
        )
        assert uniform_loader_indices(20, 30.0, 32, -1) == list(range(20))
        assert uniform_loader_indices(300, 30.0, -1, -1) == list(range(300))
        assert uniform_loader_indices(300, 30.0, 32, 1.0) == (
            np.linspace(0, 299, 10, dtype=int).tolist()
        )

    def test_qwen2_loader_counts(self) -> None:
        """The qwen2_vl loader keeps floor2(clamp(total/fps*2)) frames, tail clamped."""
        idx = qwen2_loader_indices(300, 30.0, 2.0, 4, 768, 2)
        assert len(idx) == 20
        assert idx[0] == 0
        assert max(idx) <= 299
        assert len(qwen2_loader_indices(3, 30.0, 2.0, 4, 768, 2)) == 2
        with pytest.raises(ValueError, match="too short"):
            qwen2_loader_indices(1, 30.0, 2.0, 4, 768, 2)

    def test_timestamps_match_hf_processor(self) -> None:
        """Group timestamps equal Qwen3VLProcessor._calculate_timestamps."""
        for total, src_fps in [(300, 30.0), (301, 29.97), (7, 24.0), (36000, 25.0)]:
            indices = qwen3_loader_indices(total, src_fps, 2.0, 4, 768)
            for idx in (indices, indices[:-1]):
                expected = Qwen3VLProcessor._calculate_timestamps(None, list(idx), src_fps, 2)
                assert temporal_group_timestamps(idx, src_fps, 2) == expected

    def test_source_frame_count_rounds(self) -> None:
        """A duration and a rate give the container's integer frame count."""
        assert source_frame_count(10.0, 29.97) == 300
        assert source_frame_count(0.01, 24.0) == 1


class TestTimestampTokens:
    def test_qwen_pretokenizer_splits_each_digit(self) -> None:
        """The Qwen2 pre-tokenizer yields one piece per digit and per symbol."""
        from tokenizers import Regex, pre_tokenizers

        # Qwen2/Qwen3 tokenizer.json pre_tokenizer: this Split, then ByteLevel.
        pattern = (
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )
        pre = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        # BPE never merges across pieces; each piece here is one token in the
        # Qwen vocabulary (" seconds" is a single rank in qwen.tiktoken).
        for t in (0.0, 0.5, 9.96, 12.3, 99.9, 123.4, 5000.0):
            pieces = pre.pre_tokenize_str(f"<{t:.1f} seconds>")
            assert len(pieces) == qwen_timestamp_tokens(t), t

    def test_qwen_bpe_when_available(self) -> None:
        """With the Qwen BPE ranks (dashscope's qwen.tiktoken), counts are exact."""
        spec = importlib.util.find_spec("dashscope")
        if spec is None or spec.origin is None:
            pytest.skip("dashscope (ships qwen.tiktoken) is not installed")
        import tiktoken
        from tiktoken.load import load_tiktoken_bpe

        path = Path(spec.origin).parent / "resources" / "qwen.tiktoken"
        pattern = (
            r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
            r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
        )
        enc = tiktoken.Encoding(
            "qwen", pat_str=pattern, mergeable_ranks=load_tiktoken_bpe(str(path)), special_tokens={}
        )
        for tenths in range(0, 200000, 37):
            t = tenths / 10
            assert len(enc.encode(f"<{t:.1f} seconds>")) == qwen_timestamp_tokens(t)


_VIDEO_CASES = [
    (10, 30, 1280, 720),
    (1, 24, 64, 48),
    (95.5, 25, 853, 480),
    (2.2, 60, 3840, 2160),
    (600, 30, 1920, 1080),
    (0.3, 30, 17, 1500),
]


class TestVideoTokens:
    def test_qwen3_tokens_match_hf_patch_helper(self, hf_qwen3_video: dict[str, Any]) -> None:
        """Pads per clip equal Qwen3VLVideoProcessor.get_num_of_video_patches / 4."""
        helper = hf_qwen3_video["get_num_of_video_patches"]
        for cap in (None, True):
            me = _qwen3_self(cap_pixels_per_frame=cap)
            params = Qwen3VideoParams(cap_pixels_per_frame=bool(cap), timestamp_token_count=0)
            for seconds, src_fps, w, h in _VIDEO_CASES:
                item = VideoInput(seconds, src_fps, w, h)
                units = qwen_video_units(item, params)
                patches = helper(me, units.frames, h, w, {})
                grid_t = -(-units.frames // 2)
                assert units.tokens == patches // 4 + 2 * grid_t, (item, cap)

    def test_qwen2_tokens_match_hf_patch_helper(self, hf_qwen2_video: dict[str, Any]) -> None:
        """Qwen2/2.5-VL pads equal Qwen2VLVideoProcessor.get_num_of_video_patches / 4."""
        helper = hf_qwen2_video["get_num_of_video_patches"]
        me = SimpleNamespace(
            size={"shortest_edge": 3136, "longest_edge": 12845056},
            patch_size=14,
            merge_size=2,
            temporal_patch_size=2,
        )
        for backend in ("qwen2_vl", "opencv"):
            counter = QWEN25_VL.video.with_params({"video_backend": backend})
            for seconds, src_fps, w, h in [(10, 30, 1280, 720), (3.3, 24, 640, 360),
                                           (61, 29.97, 1920, 1080), (2, 30, 30, 3000)]:  # fmt: skip
                units = counter(VideoInput(seconds, src_fps, w, h))
                assert units.tokens == helper(me, units.frames, h, w, {}) // 4

    def test_worked_examples_10s_720p(self) -> None:
        """Research §1b/§1c examples for a 10 s 30 fps 1280x720 clip."""
        item = VideoInput(10, 30, 1280, 720)
        # Qwen3-VL, uniform loader (32 frames): 1152x640 -> 16 groups x 720 pads.
        units = QWEN3_VL.video.with_params({"video_backend": "opencv"})(item)
        stamps = temporal_group_timestamps(np.linspace(0, 299, 32, dtype=int).tolist(), 30, 2)
        assert units.frames == 32
        assert units.tokens == 11520 + sum(qwen_timestamp_tokens(t) + 2 for t in stamps)
        # Qwen3-VL, fps sampling (20 frames): uncapped 1280x704 -> 10 x 880.
        units = QWEN3_VL.video(item)
        assert units.frames == 20
        assert units.tokens == 8800 + 10 * (6 + 2)  # "<0.2 seconds>" ... all < 10 s
        # Capped (qwen-vl-utils behaviour): 1152x640 -> 10 x 720.
        capped = QWEN3_VL.video.with_params({"cap_pixels_per_frame": True})(item)
        assert capped.tokens == 7200 + 10 * 8
        # Qwen2.5-VL with the HF class-default video bounds, 32 frames: 1008x560.
        small = QWEN25_VL.video.with_params(
            {"video_backend": "opencv", "min_pixels": 128 * 28 * 28, "max_pixels": 768 * 28 * 28}
        )
        assert small(item) == type(units)(frames=32, tokens=11520)

    @pytest.mark.parametrize(
        ("seconds", "fps", "expected"), [(74, 30, 3675 - 13), (113, 25, 3677 - 13)]
    )
    def test_llmd_benchmark_qwen3_uniform_32_frames(
        self, seconds: float, fps: float, expected: int
    ) -> None:
        """llm-d's Qwen3-VL benchmark: 640x360 clips under vLLM's 32-frame loader.

        llm-d-router mm_estimate_test.go (TestVideoEstimator_Qwen3VLFormula):
        "640x360/74s/30fps" 2220 frames -> 3662 and "640x360/113s/25fps" 2825
        frames -> 3664 visual tokens, "= benchmark - 13 (prompt overhead
        excluded)" from docs/multimodal/video_token_benchmark.py.
        """
        counter = QWEN3_VL.video.with_params({"video_backend": "opencv"})
        assert counter(VideoInput(seconds, fps, 640, 360)).tokens == expected

    def test_whole_clip_is_resampled_by_hf(self) -> None:
        """A clip loaded whole (num_frames=-1) is re-sampled at fps=2 by Qwen3-VL."""
        item = VideoInput(10, 30, 1280, 720)
        whole = QWEN3_VL.video.with_params({"video_backend": "opencv", "num_frames": -1})(item)
        assert whole == QWEN3_VL.video(item)
        # Qwen2-VL's processor does not sample by default: all 300 frames stay.
        q2 = QWEN2_VL.video.with_params({"video_backend": "opencv", "num_frames": -1})(item)
        assert q2.frames == 300

    def test_loader_fps_is_media_io_not_processor_fps(self) -> None:
        """mm_processor_kwargs' fps does not reach vLLM's loader; media_io's fps does."""
        item = VideoInput(10, 30, 1280, 720)
        assert QWEN3_VL.video.with_params({"fps": 1})(item).frames == 20
        assert QWEN3_VL.video.with_params({"loader_fps": 1})(item).frames == 10
        assert QWEN25_VL.video.with_params({"loader_fps": 1})(item).frames == 10

    def test_fixed_timestamp_token_count(self) -> None:
        """timestamp_token_count replaces the tokenizer rule per temporal group."""
        item = VideoInput(10, 30, 1280, 720)
        base = QWEN3_VL.video.with_params({"timestamp_token_count": 0})(item)
        fixed = QWEN3_VL.video.with_params({"timestamp_token_count": 9})(item)
        assert fixed.tokens - base.tokens == 9 * 10

    def test_long_video_caps_at_max_frames(self) -> None:
        """A 20-minute clip samples max_frames (768) frames at 2 fps."""
        units = QWEN3_VL.video(VideoInput(1200, 30, 640, 360))
        assert units.frames == 768

    @pytest.mark.parametrize("item", [VideoInput(0, 30, 640, 360), VideoInput(5, 0, 640, 360)])
    def test_invalid_video_raises(self, item: VideoInput) -> None:
        """A zero duration or fps cannot be counted."""
        with pytest.raises(ValueError, match="positive duration and fps"):
            QWEN3_VL.video(item)

    def test_one_frame_clip_raises_for_qwen3(self) -> None:
        """A one-frame clip is below Qwen3-VL's temporal patch, as in HF."""
        with pytest.raises(ValueError, match="at least 2 frames"):
            QWEN3_VL.video(VideoInput(0.04, 25, 640, 360))


class TestFullVideoProcessors:
    """The real HF video processors, when torch and torchvision are installed."""

    @pytest.fixture(autouse=True)
    def _needs_torchvision(self) -> None:
        pytest.importorskip("torchvision")

    @pytest.mark.parametrize(
        ("seconds", "fps", "width", "height"),
        [(10, 30, 1280, 720), (1, 24, 64, 48), (3.3, 25, 853, 480), (0.5, 30, 30, 3000)],
    )
    def test_qwen3_video_processor_grid(
        self, seconds: float, fps: float, width: int, height: int
    ) -> None:
        """Qwen3VLVideoProcessor's video_grid_thw gives our pads and groups."""
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

        processor = Qwen3VLVideoProcessor(**QWEN3_VIDEO_PREPROCESSOR)
        params = Qwen3VideoParams(timestamp_token_count=0)
        units = qwen_video_units(VideoInput(seconds, fps, width, height), params)
        frames = np.zeros((units.frames, height, width, 3), dtype=np.uint8)
        out = processor(videos=[frames], do_sample_frames=False, cap_pixels_per_frame=False)
        t, gh, gw = (int(x) for x in out["video_grid_thw"][0])
        assert units.tokens == t * (gh * gw // 4) + 2 * t

    @pytest.mark.parametrize("cap", [False, True])
    def test_qwen2_video_processor_grid(self, cap: bool) -> None:
        """Qwen2VLVideoProcessor (checkpoint bounds, optional cap) gives our pads."""
        from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

        processor = Qwen2VLVideoProcessor(**QWEN25_PREPROCESSOR)
        counter = QWEN25_VL.video.with_params({"cap_pixels_per_frame": cap})
        for item in [VideoInput(10, 30, 1280, 720), VideoInput(61, 29.97, 640, 360)]:
            units = counter(item)
            frames = np.zeros((units.frames, item.height, item.width, 3), dtype=np.uint8)
            out = processor(videos=[frames], cap_pixels_per_frame=cap)
            t, gh, gw = (int(x) for x in out["video_grid_thw"][0])
            assert units.tokens == t * gh * gw // 4

    def test_qwen2_loader_matches_hf_torch_sampling(self) -> None:
        """qwen2_loader_indices equals HF's torch.arange sampling, tail clamped."""
        import torch

        for total in range(2, 1500, 7):
            for src_fps in (23.976, 24.0, 29.97, 30.0, 60.0):
                tp = 2
                cap = math.floor(min(768, total) / tp) * tp
                n = math.floor(min(max(total / src_fps * 2, 4), cap, total) / tp) * tp
                if n == 0:
                    continue
                expected = torch.arange(0, total, total / n).int().clamp(max=total - 1).tolist()
                assert qwen2_loader_indices(total, src_fps, 2.0, 4, 768, tp) == expected
