"""``data:`` URLs and random access into base64 text without decoding all of it.

A request carries images and audio inline as base64: an OpenAI
``image_url.url`` of the form ``data:image/png;base64,...`` or an
``input_audio.data`` string. Probing a header needs a few hundred bytes at
known offsets, so :class:`B64View` maps a byte range to the 4-character
groups that encode it and decodes only those.

What is accepted, and why it is wider than the engine:

* Standard (``+/``) and URL-safe (``-_``) alphabets, even mixed; missing
  ``=`` padding; line breaks (``\\n`` or ``\\r\\n``: MIME's 76-character
  lines, PEM's 64, any fixed length, or none at all) and spaces anywhere;
  any whitespace before and after the payload. The gateway's job is to
  count what the request will cost, not to judge it. vLLM itself is
  stricter: images go
  through ``pybase64.b64decode(data, validate=True)``, which rejects
  whitespace, URL-safe characters and missing padding (vllm-project/vllm@
  vllm/multimodal/media/image.py, ``ImageMediaIO.load_base64``); audio goes
  through ``pybase64.b64decode(data)`` without ``validate``, which skips
  non-alphabet characters (.../media/audio.py). A probe that succeeds is
  therefore no promise that the engine will accept the payload.
* Only the groups a probe reads, and the padding, are validated. A bad
  character in the middle of the pixel data is not seen: finding it would
  cost a pass over the whole payload, which is exactly what this module
  exists to avoid.

Cost: construction scans nothing. A read looks for whitespace (two
``memchr`` scans, for ``\\n`` and for a space, ~6 µs each per 600 kB) only
in the text before it, once, so a header near the start costs only its own
groups; the length, when a format needs it, maps the whole text. Reads are
O(size). Invalid padding or a lone final character is reported when the
length is first needed. With lines of a fixed
length (MIME, PEM), offsets are mapped arithmetically after one strided
check of the separator positions (~1/77 of the text). Only irregular
whitespace falls back to one compacting pass over the text. A tab or a
lone ``\\r`` in a text with neither newline nor space is not looked for:
it counts as an invalid character, like any other stray byte.
"""

from __future__ import annotations

import binascii
import re
import sys
from dataclasses import dataclass
from urllib.parse import unquote_to_bytes

from ..safe import safe_name
from .errors import MediaError

__all__ = ["B64View", "DataUrl", "parse_data_url"]

# Anything outside both alphabets. "=" is here on purpose: padding is
# stripped from the end up front, so one inside the text is an error.
_BAD_CHAR = re.compile(r"[^A-Za-z0-9+/\-_]")
_HAS_STRICT = sys.version_info >= (3, 11)
_WHITESPACE = " \t\r\n\f\v"
_TRAILING = _WHITESPACE + "="
_NOT_WHITESPACE = re.compile(r"[^ \t\r\n\f\v]")


@dataclass(frozen=True, slots=True)
class DataUrl:
    """A parsed RFC 2397 ``data:`` URL.

    Attributes:
        media_type: Lower-cased ``type/subtype``, or ``None`` when absent.
        params: The ``name=value`` parameters, names lower-cased.
        is_base64: Whether the URL ends its header with ``;base64``.
        url: The whole URL; the payload starts at ``start``.
        start: Offset of the payload (after the comma) in ``url``.
    """

    media_type: str | None
    params: dict[str, str]
    is_base64: bool
    url: str
    start: int

    @property
    def payload(self) -> str:
        """The raw, still encoded text after the comma (a copy: large)."""
        return self.url[self.start :]

    def source(self) -> B64View | bytes:
        """Return the payload as something a probe reads, without copying a base64 payload.

        Returns:
            A :class:`B64View` for a base64 payload, else the percent-decoded bytes.
        """
        if self.is_base64:
            return B64View(self.url, self.start)
        return unquote_to_bytes(self.payload)


def parse_data_url(url: str) -> DataUrl:
    """Parse ``data:[<media type>][;name=value]*[;base64],<payload>``.

    Extra parameters (``charset``, ``name``...) are kept in ``params``;
    ``base64`` counts only as the last token, as RFC 2397 and vLLM's
    ``_load_data_url`` both read it.

    Args:
        url: The URL text.

    Returns:
        The parsed URL; the payload is not decoded.

    Raises:
        MediaError: Not a ``data:`` URL, no comma, or a malformed parameter.
    """
    if url[:5].lower() != "data:":
        msg = "data URL: must start with 'data:'"
        raise MediaError(msg)
    comma = url.find(",", 5)
    if comma < 0:
        msg = "data URL: missing ',' between header and payload"
        raise MediaError(msg)
    tokens = [t.strip() for t in url[5:comma].split(";")]
    is_base64 = len(tokens) > 1 and tokens[-1].lower() == "base64"
    if is_base64:
        tokens.pop()
    media_type = tokens[0].lower() or None
    params: dict[str, str] = {}
    for token in tokens[1:]:
        name, eq, value = token.partition("=")
        if not eq or not name.strip():
            # Parameters are the client's text: name one only when it is a plain identifier.
            shown = safe_name(name.strip(), "#" + str(len(params) + 1))
            msg = f"data URL: malformed parameter {shown} (expected name=value)"
            raise MediaError(msg)
        params[name.strip().lower()] = value.strip()
    return DataUrl(media_type, params, is_base64, url, comma + 1)


class B64View:
    """Decoded bytes of a base64 text, readable at any offset without a full decode.

    Args:
        text: The base64 text: standard or URL-safe alphabet, padded or not,
            with or without whitespace and line breaks.
        start: Where the base64 starts in ``text``. Lets a caller view the
            payload of a large ``data:`` URL in place, without the copy that
            slicing it costs (~30 µs for 600 kB):
            ``B64View(url, start=url.index(",") + 1)``.

    Raises:
        MediaError: Non-ASCII text, bad padding, or a length no base64 text can have.
    """

    __slots__ = ("_clean", "_end", "_len", "_line", "_nchars", "_pad", "_start", "_stride", "_text")

    def __init__(self, text: str, start: int = 0) -> None:
        if start and not text.isascii():
            # Non-ASCII before the payload (a data URL parameter): copy the payload.
            text, start = text[start:], 0
        if not text.isascii():  # O(1) in CPython: a flag on the str object
            msg = "base64: non-ASCII character in payload"
            raise MediaError(msg)
        start, end, pad = _trim(text, start)
        self._text = text
        self._start = start
        self._end = end
        self._pad = pad
        self._line = 0  # content characters per line; 0 = no line breaks
        self._stride = 0  # line length including its separator
        # Whitespace is looked for lazily: a probe that reads a header near
        # the start (a JPEG's frame header) never scans the rest of a
        # 600 kB payload. ``_clean`` is how far the text is known to hold no
        # line break or space; ``_len`` stays ``None`` until the whole text
        # has been mapped.
        self._clean = start
        self._len: int | None = None
        self._nchars = 0

    def _prefix_is_clean(self, upto: int) -> bool:
        """Whether ``text[start:upto]`` holds no line break or space (scanning only what is new)."""
        text, lo = self._text, self._clean
        if upto <= lo:
            return True
        # Two memchr scans: line breaks and spaces are the whitespace that
        # occurs in practice. Rarer ones (tab, lone CR) count as invalid
        # characters, found if a read covers them.
        if text.find("\n", lo, upto) >= 0 or text.find(" ", lo, upto) >= 0:
            return False
        self._clean = upto
        return True

    def _map(self) -> int:
        """Map the whole text once (line breaks, length, padding); return the decoded length."""
        if self._len is not None:
            return self._len
        start, end, pad = self._start, self._end, self._pad
        if self._prefix_is_clean(end):
            self._nchars = end - start
        else:
            self._map_lines(end, self._text.find("\n", start, end) >= 0)
        n = self._nchars
        if pad > 2 or (pad and (n + pad) % 4):
            msg = f"base64: bad padding ({pad} '=' after {n} characters)"
            raise MediaError(msg)
        if n % 4 == 1:
            msg = f"base64: truncated ({n} characters leave a lone final character)"
            raise MediaError(msg)
        self._len = n // 4 * 3 + (n % 4 * 3) // 4
        return self._len

    def _map_lines(self, end: int, newline: bool) -> None:
        """Set up arithmetic offset mapping for fixed-length lines, else compact."""
        text, start = self._text, self._start
        nl = text.find("\n", start, end)
        regular = newline and nl > start and text.find(" ", start, end) < 0
        if regular:
            crlf = text[nl - 1] == "\r"
            line = nl - start - crlf
            stride = line + 1 + crlf
            # Every separator must sit exactly where fixed-length lines put it.
            cr = text[start + line : end : stride]
            regular = line > 0 and cr == ("\r" if crlf else "\n") * len(cr)
            if regular and crlf:
                lf = text[start + line + 1 : end : stride]
                regular = len(lf) == len(cr) and lf == "\n" * len(lf)
            last = start + len(cr) * stride
            regular = regular and 0 < end - last <= line
            regular = regular and not any(text.find(ws, last, end) >= 0 for ws in "\r\n")
            if not crlf:
                regular = regular and text.find("\r", start, end) < 0
        if regular:
            self._line, self._stride = line, stride
            self._nchars = len(cr) * line + (end - last)
        else:
            # Irregular whitespace: pay one pass to compact, then read contiguously.
            self._text = "".join(text[start:end].split())
            self._start = 0
            self._nchars = len(self._text)

    def __len__(self) -> int:
        """Return the decoded length in bytes (maps the whole text on first use)."""
        return self._map()

    def _chars(self, c0: int, c1: int) -> str:
        """Return base64 characters ``[c0, c1)``, line breaks removed."""
        text, start, line = self._text, self._start, self._line
        if not line:
            return text[start + c0 : start + c1]
        stride = self._stride
        parts = []
        i = c0
        while i < c1:
            row, col = divmod(i, line)
            take = min(line - col, c1 - i)
            pos = start + row * stride + col
            parts.append(text[pos : pos + take])
            i += take
        return "".join(parts)

    def read(self, offset: int, size: int) -> bytes:
        """Return ``decoded[offset:offset + size]``, decoding only the groups it needs.

        Args:
            offset: Byte offset into the decoded data (>= 0).
            size: Number of bytes (>= 0); fewer come back at the end of the data.

        Returns:
            The bytes, exactly as a full decode sliced the same way.

        Raises:
            MediaError: A negative argument, or an invalid character in the groups read.
        """
        if offset < 0 or size < 0:
            msg = f"base64: negative offset or size ({offset}, {size})"
            raise MediaError(msg)
        g0, g1 = offset // 3, -(-(offset + size) // 3)
        c0 = 4 * g0
        start, c1 = self._start, 4 * g1
        # Well inside the text and no whitespace before the read: character i
        # is at start + i, and nothing past the read needs scanning.
        if self._len is None and start + c1 < self._end and self._prefix_is_clean(start + c1):
            data = self._decode(self._text[start + c0 : start + c1], c0)
            return data[offset - 3 * g0 : offset + size - 3 * g0]
        stop = min(offset + size, self._map())
        if offset >= stop:
            return b""
        g1 = -(-stop // 3)
        chunk = self._chars(c0, min(4 * g1, self._nchars))
        return self._decode(chunk, c0)[offset - 3 * g0 : stop - 3 * g0]

    def _decode(self, chunk: str, c0: int) -> bytes:
        """Decode whole groups of ``chunk`` (characters from ``c0``), naming a bad character."""
        if "-" in chunk or "_" in chunk:
            chunk = chunk.replace("-", "+").replace("_", "/")
        if len(chunk) % 4:
            chunk += "=" * (4 - len(chunk) % 4)
        try:
            return _decode_strict(chunk)
        except binascii.Error:
            bad = _BAD_CHAR.search(chunk)
            at = bad.start() if bad else 0
            # The position, not the character: payload text stays out of messages.
            msg = f"base64: invalid character at character {c0 + at}"
            raise MediaError(msg) from None


def _decode_strict(chunk: str) -> bytes:
    """Decode whole base64 groups, raising ``binascii.Error`` on any non-alphabet character.

    Python 3.11's ``strict_mode`` validates inside the decoding loop for
    free; before it, a regex pass does the same job more slowly.
    """
    if _HAS_STRICT:
        return binascii.a2b_base64(chunk, strict_mode=True)
    if _BAD_CHAR.search(chunk.rstrip("=")) is not None:
        msg = "invalid character"
        raise binascii.Error(msg)
    return binascii.a2b_base64(chunk)


def _trim(text: str, start: int) -> tuple[int, int, int]:
    """Return ``(start, end, pad)``: the span without outer whitespace and trailing ``=``."""
    m = _NOT_WHITESPACE.search(text, start)
    start = m.start() if m else len(text)
    end, pad = len(text), 0
    # A few trailing characters in the common case; pad > 2 is an error anyway.
    while end > start and pad <= 2 and text[end - 1] in _TRAILING:
        pad += text[end - 1] == "="
        end -= 1
    return start, end, pad
