"""``data:`` URL parsing and random access into base64 text."""

from __future__ import annotations

import base64

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from media_samples import b64_forms

from modtrace.counting.media import B64View, DataUrl, MediaError, parse_data_url
from modtrace.counting.media import b64 as b64_module

FORMS = tuple(b64_forms(b"x"))


class TestParseDataUrl:
    def test_plain_base64(self) -> None:
        """A typical OpenAI image URL splits into type, flag and payload."""
        text = "data:image/png;base64,iVBORw0KGgo="
        url = parse_data_url(text)
        assert url == DataUrl("image/png", {}, True, text, len("data:image/png;base64,"))
        assert url.payload == "iVBORw0KGgo="

    def test_extra_parameters(self) -> None:
        """Parameters before ``;base64`` are kept, names lower-cased."""
        url = parse_data_url("data:image/jpeg;charset=utf-8;Name=a.jpg;base64,/9j/4A==")
        assert url.media_type == "image/jpeg"
        assert url.params == {"charset": "utf-8", "name": "a.jpg"}
        assert url.is_base64
        assert url.payload == "/9j/4A=="

    def test_case_and_no_media_type(self) -> None:
        """Scheme and ``base64`` are case-insensitive; the media type may be absent."""
        url = parse_data_url("DATA:;BASE64,QUJD")
        assert url.media_type is None
        assert url.is_base64
        assert url.source().read(0, 3) == b"ABC"

    def test_not_base64_is_percent_decoded(self) -> None:
        """Without ``;base64`` the payload is percent-encoded bytes (RFC 2397)."""
        url = parse_data_url("data:text/plain,a%20b%FF")
        assert not url.is_base64
        assert url.source() == b"a b\xff"

    def test_base64_must_be_last(self) -> None:
        """``base64`` in the middle is a malformed parameter, not the encoding flag."""
        with pytest.raises(MediaError, match="malformed parameter 'base64'"):
            parse_data_url("data:image/png;base64;name=x,AAAA")

    @pytest.mark.parametrize(
        ("url", "message"),
        [
            ("http://example.com/a.png", "must start with 'data:'"),
            ("data:image/png;base64", "missing ','"),
            ("data:image/png;=x;base64,AAAA", "malformed parameter"),
        ],
    )
    def test_malformed(self, url: str, message: str) -> None:
        """Malformed URLs raise MediaError naming the problem."""
        with pytest.raises(MediaError, match=message):
            parse_data_url(url)

    def test_payload_is_not_decoded(self) -> None:
        """Parsing leaves an invalid payload alone; reading it is what fails."""
        url = parse_data_url("data:image/png;base64,!!!!")
        with pytest.raises(MediaError, match="invalid character at character 0"):
            url.source().read(0, 1)


class TestB64ViewLength:
    @pytest.mark.parametrize("form", FORMS)
    @pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 56, 57, 58, 59, 60, 1000])
    def test_length_without_decoding(self, form: str, n: int) -> None:
        """``len`` is the decoded length for every form, including 76-char line edges."""
        raw = bytes(range(256)) * (n // 256 + 1)
        text = b64_forms(raw[:n])[form]
        assert len(B64View(text)) == len(base64.b64decode(b64_forms(raw[:n])["std"]))


class TestB64ViewRead:
    @settings(max_examples=300, deadline=None)
    @given(
        raw=st.binary(max_size=700),
        form=st.sampled_from(FORMS),
        offset=st.integers(0, 720),
        size=st.integers(0, 720),
    )
    def test_read_equals_full_decode(self, raw: bytes, form: str, offset: int, size: int) -> None:
        """Any ``read(offset, size)`` equals the full decode sliced the same way."""
        view = B64View(b64_forms(raw)[form])
        full = base64.b64decode(base64.b64encode(raw))
        assert view.read(offset, size) == full[offset : offset + size]

    @settings(max_examples=100, deadline=None)
    @given(raw=st.binary(min_size=1, max_size=400), line=st.integers(1, 90), crlf=st.booleans())
    def test_any_fixed_line_length(self, raw: bytes, line: int, crlf: bool) -> None:
        """Lines of any fixed length (not only MIME's 76) map arithmetically and read right."""
        std = base64.b64encode(raw).decode()
        sep = "\r\n" if crlf else "\n"
        text = sep.join(std[i : i + line] for i in range(0, len(std), line)) + sep
        view = B64View(text)
        assert len(view) == len(raw)
        assert view.read(0, len(raw)) == raw
        assert view.read(len(raw) // 2, 5) == raw[len(raw) // 2 : len(raw) // 2 + 5]

    def test_leading_and_trailing_whitespace(self) -> None:
        """Whitespace around the payload (a JSON value with stray newlines) is ignored."""
        view = B64View("\n  " + base64.b64encode(b"hello world").decode() + " \r\n")
        assert len(view) == 11
        assert view.read(6, 100) == b"world"

    def test_mixed_alphabets(self) -> None:
        """Standard and URL-safe characters may mix: both decode to the same bits."""
        raw = bytes([0xFB, 0xFF, 0xBF]) * 4
        std = base64.b64encode(raw).decode()
        mixed = std[:8] + std[8:].replace("+", "-").replace("/", "_")
        assert B64View(mixed).read(0, len(raw)) == raw


class TestB64ViewErrors:
    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("QUJDRA=", "bad padding"),  # 7 chars + 1 pad: not a multiple of 4
            ("QUJD===", "bad padding"),
            ("QUJDR", "truncated"),  # a lone final character holds no byte
            ("QUJD\u00e9A==", "non-ASCII"),
        ],
    )
    def test_malformed_text(self, text: str, message: str) -> None:
        """Text no encoder could produce is rejected once its length is needed."""
        with pytest.raises(MediaError, match=message):
            len(B64View(text))

    def test_header_read_does_not_map_the_whole_text(self) -> None:
        """A read near the start scans only the text before it; the length maps the rest."""
        raw = bytes(range(256)) * 2000
        text = base64.b64encode(raw).decode()
        irregular = text[:400000] + "\n" + text[400000:]  # a stray line break far away
        view = B64View(irregular)
        assert view.read(0, 100) == raw[:100]
        assert view._len is None  # nothing past the read was looked at
        assert len(view) == len(raw)  # the length maps the whole text, line break included
        assert view.read(300000, 50) == raw[300000:300050]

    @pytest.mark.parametrize("bad", ["!", "=", "*", "."])
    def test_invalid_character_in_read_range(self, bad: str) -> None:
        """A bad character inside the groups read is reported with its position."""
        text = base64.b64encode(bytes(30)).decode()
        text = text[:12] + bad + text[13:]
        view = B64View(text)
        assert view.read(0, 9) == bytes(9)  # groups before it are fine
        # The position only: the character itself is payload text and is not echoed.
        with pytest.raises(MediaError, match=r"invalid character at character 12$"):
            view.read(8, 4)

    def test_negative_arguments(self) -> None:
        """Negative offsets or sizes are errors, never Python slicing from the end."""
        view = B64View("QUJD")
        with pytest.raises(MediaError):
            view.read(-1, 2)
        with pytest.raises(MediaError):
            view.read(0, -2)

    @settings(max_examples=300, deadline=None)
    @given(text=st.text(max_size=80), offset=st.integers(0, 64), size=st.integers(0, 64))
    def test_random_text_is_media_error_or_bytes(self, text: str, offset: int, size: int) -> None:
        """Arbitrary text gives bytes or MediaError, never another exception."""
        try:
            data = B64View(text).read(offset, size)
        except MediaError:
            return
        assert isinstance(data, bytes)
        assert len(data) <= size


class TestPython310Fallback:
    def test_regex_validation_path(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Without 3.11's strict_mode, the regex path gives the same bytes and errors."""
        monkeypatch.setattr(b64_module, "_HAS_STRICT", False)
        raw = bytes(range(256))
        text = base64.b64encode(raw).decode()
        view = B64View(text)
        assert view.read(10, 100) == raw[10:110]
        with pytest.raises(MediaError, match="invalid character at character 8"):
            B64View(text[:8] + "!" + text[9:]).read(0, 9)


class TestStartOffset:
    @settings(max_examples=100, deadline=None)
    @given(
        raw=st.binary(max_size=300),
        form=st.sampled_from(FORMS),
        name=st.text(st.characters(exclude_characters=",;", exclude_categories=["Cs"]), max_size=5),
    )
    def test_view_inside_data_url(self, raw: bytes, form: str, name: str) -> None:
        """Viewing a data URL's payload in place equals the sliced payload, even after non-ASCII."""
        url = f"data:image/png;name={name};base64," + b64_forms(raw)[form]
        expected = parse_data_url(url).source()
        view = B64View(url, start=url.index(",") + 1)
        assert isinstance(expected, B64View)
        assert len(view) == len(expected) == len(raw)
        assert view.read(0, len(raw)) == expected.read(0, len(raw)) == raw


class TestNoPayloadInErrors:
    """Data-URL errors name parameters only when safe, and never echo values or payload text."""

    @pytest.mark.parametrize(
        ("url", "expected"),
        [
            ("SSN 078-05-1120 data:image/png;base64,AAAA", "must start with 'data:'"),
            ("data:image/png;SSN 078-05-1120;base64,AAAA", "malformed parameter #1"),
            ("data:image/png;a=1;=SSN 078-05-1120;base64,AAAA", "malformed parameter #2"),
            ("data:image/png;flag;base64,AAAA", "malformed parameter 'flag'"),
        ],
    )
    def test_malformed_urls(self, url: str, expected: str) -> None:
        """The message names the problem, and a parameter only as a plain identifier."""
        with pytest.raises(MediaError) as info:
            parse_data_url(url)
        assert expected in str(info.value)
        assert "SSN" not in str(info.value) and "078" not in str(info.value)

    def test_invalid_character_is_located_not_shown(self) -> None:
        """A bad base64 character is reported by position only."""
        with pytest.raises(MediaError) as info:
            B64View("AAAA" + "S$N0").read(0, 6)
        assert str(info.value) == "base64: invalid character at character 5"
