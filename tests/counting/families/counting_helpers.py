"""Scaffolding of the family tests: size corpora, tiny tokenizers, shape-only extractors.

The oracles are the real transformers processors; these helpers only build
what they need without a download (a tokenizer that knows the special
tokens) or that does not change a count (the mel values).
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Mapping

import numpy as np
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast, WhisperFeatureExtractor


def image_corpus(
    fixed: Iterable[tuple[int, int]], *, n: int, seed: int, limit: int
) -> list[tuple[int, int]]:
    """At least ``n`` (width, height) sizes: ``fixed`` first, then log-uniform random.

    The random sizes have sides from 1 to ``limit`` px, drawn with ``seed``.
    """
    rng = random.Random(seed)
    sizes = list(dict.fromkeys(fixed))
    while len(sizes) < n:
        w = round(math.exp(rng.uniform(0, math.log(limit))))
        h = round(math.exp(rng.uniform(0, math.log(limit))))
        if (w, h) not in sizes:
            sizes.append((w, h))
    return sizes


def tiny_tokenizer(specials: Mapping[str, str]) -> PreTrainedTokenizerFast:
    """A real fast tokenizer whose vocabulary is just the special tokens.

    ``specials`` maps the attribute names processors read (``image_token``,
    ``boi_token``...) to the tokens; their ids are 1, 2... in that order
    (0 is ``[UNK]``).
    """
    vocab = {"[UNK]": 0, **{tok: i + 1 for i, tok in enumerate(specials.values())}}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="[UNK]",
        additional_special_tokens=list(specials.values()),
        extra_special_tokens=dict(specials),
    )


def shape_only(extractor: WhisperFeatureExtractor) -> WhisperFeatureExtractor:
    """The same extractor with its spectrogram replaced by zeros of the same shape.

    Padding, truncation and the attention mask stay the extractor's own code;
    only the numeric mel values (which no count depends on) are skipped.
    """

    def stub(waveform: np.ndarray, device: str = "cpu") -> np.ndarray:
        frames = waveform.shape[-1] // extractor.hop_length
        return np.zeros((waveform.shape[0], extractor.feature_size, frames), np.float32)

    extractor._np_extract_fbank_features = stub  # type: ignore[method-assign]
    extractor._torch_extract_fbank_features = stub  # type: ignore[method-assign]
    return extractor
