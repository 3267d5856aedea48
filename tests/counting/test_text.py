"""Text counters: llm-d's byte estimate, tiktoken from a local file, a tokenizer.json."""

from __future__ import annotations

import base64
import itertools
import math
import re
from collections import Counter
from unittest import mock

import pytest

from modtrace.counting.text import text_counter

CORPUS = (
    "The quick brown fox jumps over the lazy dog. Multimodal requests mix text, images, "
    "audio and video; each has a very different GPU cost. Ünïcödé façade — naïve café 日本語 "
) * 20
SAMPLES = [
    "",
    "hello world",
    "The lazy dog sleeps.",
    "naïve café façade 日本語 and emoji 🙂🙂",
    "  leading spaces\n\nnew lines\ttabs",
    "<|endoftext|> is plain text here",
    CORPUS[:500],
]


def _train_tiktoken(path, merges: int = 300) -> dict[bytes, int]:
    """A small byte-level BPE trained on CORPUS, written in tiktoken's file format."""
    ranks = {bytes([i]): i for i in range(256)}
    words = [[bytes([b]) for b in w.encode()] for w in re.findall(r"\w+|\s+|[^\w\s]+", CORPUS)]
    for _ in range(merges):
        pairs = Counter((a, b) for w in words for a, b in itertools.pairwise(w))
        if not pairs:
            break
        (a, b), _n = pairs.most_common(1)[0]
        ranks.setdefault(a + b, len(ranks))
        for w in words:
            i = 0
            while i < len(w) - 1:
                if w[i] == a and w[i + 1] == b:
                    w[i : i + 2] = [a + b]
                i += 1
    path.write_text("".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    return ranks


class TestByteEstimate:
    @pytest.mark.parametrize("text", SAMPLES)
    def test_four_bytes_per_token(self, text):
        """llm-d packs UTF-8 bytes four per pseudo-token, zero-padded."""
        assert text_counter("bytes").count([text], 0) == math.ceil(len(text.encode()) / 4)

    def test_stream_is_concatenated(self):
        """The byte stream of all texts is packed together, not per text."""
        assert text_counter("bytes").count(["ab", "cde"], 0) == 2

    def test_template_overhead(self):
        """tokens_per_message and tokens_per_request model the chat template."""
        c = text_counter("bytes", tokens_per_message=3, tokens_per_request=3)
        assert c.count(["abcd"], 2) == 1 + 2 * 3 + 3
        assert c.count(["abcd"], 0) == 1  # a completion prompt has no template


class TestTiktoken:
    def test_local_file_matches_tiktoken(self, tmp_path):
        """Ranks from a local .tiktoken file count exactly as tiktoken's own Encoding."""
        import tiktoken
        from tiktoken_ext import openai_public

        path = tmp_path / "small.tiktoken"
        ranks = _train_tiktoken(path)
        with mock.patch.object(openai_public, "load_tiktoken_bpe", return_value=ranks):
            spec = openai_public.cl100k_base()
        oracle = tiktoken.Encoding(**spec)
        counter = text_counter("tiktoken", encoding="cl100k_base", tiktoken_file=path)
        assert counter.ref == "tiktoken.cl100k_base@1"
        for text in SAMPLES:
            assert counter.count([text], 0) == len(oracle.encode_ordinary(text))
        assert counter.count(SAMPLES, 0) == sum(len(oracle.encode_ordinary(t)) for t in SAMPLES)

    def test_unknown_name_with_local_file(self, tmp_path):
        """A custom encoding name with a local file gets a working encoding."""
        path = tmp_path / "custom.tiktoken"
        _train_tiktoken(path, merges=50)
        counter = text_counter("tiktoken", encoding="my-encoding", tiktoken_file=path)
        assert counter.count(["hello world"], 0) > 0

    def test_no_download_by_default(self, tmp_path, monkeypatch):
        """An encoding by name that is not cached is refused, not downloaded."""
        monkeypatch.setenv("TIKTOKEN_CACHE_DIR", str(tmp_path))
        with pytest.raises(ValueError, match="not in the local cache"):
            text_counter("tiktoken", encoding="o200k_base")


class TestHfTokenizer:
    def test_matches_transformers(self, tmp_path):
        """A tokenizer.json counts exactly as transformers' fast tokenizer without specials."""
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
        from transformers import PreTrainedTokenizerFast

        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.train_from_iterator(
            [CORPUS], trainers.BpeTrainer(vocab_size=400, special_tokens=["[UNK]", "<s>"])
        )
        path = tmp_path / "tokenizer.json"
        tok.save(str(path))
        oracle = PreTrainedTokenizerFast(tokenizer_file=str(path))
        counter = text_counter("hf", tokenizer_json=path)
        for text in SAMPLES:
            assert counter.count([text], 0) == len(oracle(text, add_special_tokens=False).input_ids)

    def test_needs_path(self):
        """kind='hf' without a tokenizer.json is a clear error."""
        with pytest.raises(ValueError, match="tokenizer_json"):
            text_counter("hf")


def test_unknown_kind():
    """An unknown counter kind names the choices."""
    with pytest.raises(ValueError, match="bytes, tiktoken or hf"):
        text_counter("sentencepiece")
