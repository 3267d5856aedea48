"""Text token counters: tiktoken, Hugging Face ``tokenizer.json``, or the llm-d byte estimate.

A text counter turns the text of a request into ``text.tokens``. Which text
is counted is decided by the request parser (see ``docs/counting.md``):
the role and content of every message, and the JSON of ``tools``.

Chat templates: the engine wraps each message in template tokens
(``<|im_start|>user\\n`` ... ``<|im_end|>``) that are not in the request.
modtrace does not render templates; instead a counter adds
``tokens_per_message`` for each message and ``tokens_per_request`` once
(for the assistant prefix). Both default to 0; set them for your model's
template, or take ``text.tokens`` from the engine's reported usage where
exactness matters.

Nothing here downloads at run time unless asked: a tiktoken encoding is
loaded from a local ``.tiktoken`` file, or by name from tiktoken's cache
only if ``allow_download`` is set or the cache already holds it.
"""

from __future__ import annotations

import hashlib
import math
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Protocol

__all__ = [
    "ByteEstimateCounter",
    "HfTokenizerCounter",
    "TextCounter",
    "TiktokenCounter",
    "text_counter",
]


class TextCounter(Protocol):
    """**Protocol:** counts the tokens of a request's text."""

    ref: str

    def count(self, texts: Sequence[str], messages: int) -> int:
        """Tokens of ``texts``, plus the template overhead of ``messages`` messages."""
        ...


@dataclass(frozen=True)
class _Overhead:
    tokens_per_message: int = 0
    tokens_per_request: int = 0

    def add(self, tokens: int, messages: int) -> int:
        if messages == 0:
            return tokens
        return tokens + messages * self.tokens_per_message + self.tokens_per_request


@dataclass(frozen=True)
class ByteEstimateCounter(_Overhead):
    """llm-d's estimator: 4 bytes of UTF-8 per token, no tokenizer needed.

    The text stream is packed 4 bytes per pseudo-token with a zero-padded
    tail, as llm-d's router does, so the count is ``ceil(bytes / 4)``.
    """

    bytes_per_token: int = 4

    @property
    def ref(self) -> str:
        return f"llm-d.text.bytes{self.bytes_per_token}@1"

    def count(self, texts: Sequence[str], messages: int) -> int:
        size = sum(len(t.encode("utf-8")) for t in texts)
        return self.add(math.ceil(size / self.bytes_per_token), messages)


@dataclass(frozen=True)
class TiktokenCounter(_Overhead):
    """Exact token counts with a tiktoken encoding.

    Special-token text in a prompt (``<|endoftext|>``) is counted as plain
    text, as a server that does not allow special tokens in user text does.
    """

    encoding: object = None  # tiktoken.Encoding
    name: str = ""

    @property
    def ref(self) -> str:
        return f"tiktoken.{self.name}@1"

    def count(self, texts: Sequence[str], messages: int) -> int:
        encode = self.encoding.encode_ordinary  # type: ignore[attr-defined]
        return self.add(sum(len(encode(t)) for t in texts), messages)


@dataclass(frozen=True)
class HfTokenizerCounter(_Overhead):
    """Exact token counts with a Hugging Face ``tokenizer.json`` (``modtrace[hf]``)."""

    tokenizer: object = None  # tokenizers.Tokenizer
    name: str = ""

    @property
    def ref(self) -> str:
        return f"hf.{self.name}@1"

    def count(self, texts: Sequence[str], messages: int) -> int:
        if not texts:
            return self.add(0, messages)
        encoded = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)  # type: ignore[attr-defined]
        return self.add(sum(len(e.ids) for e in encoded), messages)


_patch_lock = threading.Lock()


def _run_constructor(name: str, load_ranks: Callable[..., dict]) -> dict:
    """Run tiktoken's constructor of encoding ``name`` with its rank loader replaced.

    tiktoken keeps each encoding's regex and special tokens in the function
    that would download the ranks, so this is how those constants stay
    tiktoken's while the ranks come from elsewhere. An unknown name gets
    the ``o200k_base`` pattern and no special tokens.
    """
    from tiktoken_ext import openai_public

    constructor = getattr(openai_public, name, None)
    known = constructor is not None and name in openai_public.ENCODING_CONSTRUCTORS
    with _patch_lock:
        original = openai_public.load_tiktoken_bpe
        openai_public.load_tiktoken_bpe = load_ranks
        try:
            spec = dict((constructor if known else openai_public.o200k_base)())
        finally:
            openai_public.load_tiktoken_bpe = original
    if not known:
        spec.update(name=name, special_tokens={})
    return spec


class _Url(Exception):
    pass


def _tiktoken_cached(name: str) -> bool:
    """Whether tiktoken's cache already holds encoding ``name``, so no download happens."""

    def capture(url: str, *_a: object, **_k: object) -> dict:
        raise _Url(url)

    try:
        _run_constructor(name, capture)
    except _Url as found:
        url = str(found)
    else:  # pragma: no cover - every known constructor loads ranks
        return False
    cache_dir = os.environ.get("TIKTOKEN_CACHE_DIR") or os.environ.get("DATA_GYM_CACHE_DIR")
    cache_dir = cache_dir or os.path.join(tempfile.gettempdir(), "data-gym-cache")
    # tiktoken's cache key is the SHA-1 of the blob URL.
    return os.path.exists(os.path.join(cache_dir, hashlib.sha1(url.encode()).hexdigest()))


@cache
def _load_tiktoken(name: str, path: str | None, allow_download: bool) -> object:
    import tiktoken
    import tiktoken.load

    if path:
        ranks = tiktoken.load.load_tiktoken_bpe(path)
        return tiktoken.Encoding(**_run_constructor(name, lambda *_a, **_k: ranks))
    if not allow_download and not _tiktoken_cached(name):
        msg = (
            f"tiktoken encoding {name!r} is not in the local cache and downloads are off: "
            "pass a local .tiktoken file (tiktoken_file=...) or allow_download=True"
        )
        raise ValueError(msg)
    return tiktoken.get_encoding(name)


@cache
def _load_hf(path: str) -> object:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        msg = "a tokenizer.json needs the 'tokenizers' package: pip install 'modtrace[hf]'"
        raise ValueError(msg) from None
    return Tokenizer.from_file(path)


def text_counter(
    kind: str = "bytes",
    *,
    encoding: str = "o200k_base",
    tiktoken_file: str | os.PathLike[str] | None = None,
    tokenizer_json: str | os.PathLike[str] | None = None,
    allow_download: bool = False,
    tokens_per_message: int = 0,
    tokens_per_request: int = 0,
) -> TextCounter:
    """Build a text counter.

    Args:
        kind: ``bytes`` (llm-d's 4-bytes-per-token estimate, the default),
            ``tiktoken`` or ``hf``.
        encoding: The tiktoken encoding name (``o200k_base``, ``cl100k_base``...).
        tiktoken_file: A local ``.tiktoken`` file with the encoding's ranks,
            for air-gapped servers.
        tokenizer_json: A Hugging Face ``tokenizer.json`` for ``kind="hf"``.
        allow_download: Let tiktoken fetch a missing encoding by name.
        tokens_per_message: Chat-template tokens added per message.
        tokens_per_request: Template tokens added once per chat request.

    Raises:
        ValueError: unknown kind, or a tokenizer that cannot be loaded offline.
    """
    overhead = {"tokens_per_message": tokens_per_message, "tokens_per_request": tokens_per_request}
    if kind == "bytes":
        return ByteEstimateCounter(**overhead)
    if kind == "tiktoken":
        enc = _load_tiktoken(
            encoding, str(tiktoken_file) if tiktoken_file else None, allow_download
        )
        return TiktokenCounter(encoding=enc, name=encoding, **overhead)
    if kind == "hf":
        if tokenizer_json is None:
            msg = "kind='hf' needs tokenizer_json=PATH"
            raise ValueError(msg)
        path = Path(tokenizer_json)
        return HfTokenizerCounter(
            tokenizer=_load_hf(str(path)), name=path.parent.name or path.stem, **overhead
        )
    msg = f"unknown text counter {kind!r}; expected bytes, tiktoken or hf"
    raise ValueError(msg)
