"""The reference URL resolver: opt-in, allow-listed, bounded in time and size (a local server)."""

from __future__ import annotations

import base64
import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from PIL import Image

from modtrace.counting import CountingConfig, RequestCounter
from modtrace.counting.resolver import RedirectRefused, ResponseTooLarge, url_resolver


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h)).save(buf, "PNG")
    return buf.getvalue()


PNG = _png(800, 600)


class _Handler(BaseHTTPRequestHandler):
    hits: list[str]

    def log_message(self, *_args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.server.hits.append(self.path)  # type: ignore[attr-defined]
        path = self.path.split("?", 1)[0]
        if path == "/cat.png":
            self._send(PNG)
        elif path == "/big":
            self._send(bytes(4096))
        elif path == "/big-undeclared":
            self.send_response(200)
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(bytes(4096))
            self.close_connection = True
        elif path == "/slow":
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            for _ in range(100):
                self.wfile.write(b"x")
                self.wfile.flush()
                time.sleep(0.05)
        elif path == "/redirect-out":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/redirect-in":
            self.send_response(302)
            self.send_header("Location", "/cat.png")
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self.send_error(404)

    def _send(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.hits = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield httpd
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def base(server) -> str:
    server.hits.clear()
    return f"http://127.0.0.1:{server.server_address[1]}"


def local_only(base: str):
    return lambda url: url.startswith(base + "/")


def chat_image(url: str) -> dict:
    part = {"type": "image_url", "image_url": {"url": url}}
    return {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, part]}]}


class TestUrlResolver:
    def test_fetches_allowed_urls(self, base):
        """An allowed URL is fetched; the counter sizes the image from its bytes."""
        resolver = url_resolver(allow=local_only(base), timeout=2.0, max_bytes=1 << 20)
        assert resolver(f"{base}/cat.png") == PNG
        counter = RequestCounter(CountingConfig(profile="llm-d"), resolver=resolver)
        r = counter.count(chat_image(f"{base}/cat.png?sig=secret"))
        assert r.units["image.pixels"] == 800 * 600 and r.defaulted["image"] is False

    def test_refused_urls_are_not_fetched(self, base, server):
        """A URL that allow refuses returns None (defaults apply) and reaches no server."""
        resolver = url_resolver(allow=lambda url: False)
        assert resolver(f"{base}/cat.png") is None
        assert resolver("file:///etc/passwd") is None
        assert server.hits == []
        r = RequestCounter(CountingConfig(profile="llm-d"), resolver=resolver).count(
            chat_image(f"{base}/cat.png")
        )
        assert r.defaulted["image"] is True and server.hits == []

    @pytest.mark.parametrize("path", ["/big", "/big-undeclared"])
    def test_responses_past_max_bytes_fail(self, base, path):
        """A body over max_bytes, declared or not, fails instead of being read on."""
        resolver = url_resolver(allow=local_only(base), max_bytes=1024)
        with pytest.raises(ResponseTooLarge):
            resolver(base + path)

    def test_slow_bodies_stop_at_the_timeout(self, base):
        """A body dripping in stops at the timeout, not when the sender finishes (5 s)."""
        resolver = url_resolver(allow=local_only(base), timeout=0.3)
        start = time.monotonic()
        with pytest.raises(TimeoutError):
            resolver(f"{base}/slow")
        assert time.monotonic() - start < 2.0

    def test_redirects_are_checked_against_allow(self, base):
        """A redirect to a refused address fails; one to an allowed URL is followed."""
        resolver = url_resolver(allow=local_only(base))
        with pytest.raises(RedirectRefused):
            resolver(f"{base}/redirect-out")
        assert resolver(f"{base}/redirect-in") == PNG

    def test_failures_flag_the_item_with_the_type_only(self, base):
        """Through the counter, a failed fetch names the redacted URL and the exception type."""
        resolver = url_resolver(allow=local_only(base), max_bytes=1024)
        counter = RequestCounter(CountingConfig(profile="llm-d"), resolver=resolver)
        r = counter.count(chat_image(f"{base}/big?X-Amz-Signature=abc"))
        (error,) = r.errors
        assert error == f"image_url #0: fetching {base}/big failed (ResponseTooLarge)"
        assert r.units["text.tokens"] > 0

    def test_rejects_unbounded_settings(self):
        """A zero timeout or size is refused when the resolver is built."""
        with pytest.raises(ValueError, match="positive"):
            url_resolver(allow=lambda url: True, timeout=0)
        with pytest.raises(ValueError, match="positive"):
            url_resolver(allow=lambda url: True, max_bytes=0)


def test_no_resolver_unless_passed(base, server):
    """RequestCounter never fetches on its own: no resolver, no request to any server."""
    counter = RequestCounter(CountingConfig(profile="llm-d"))
    assert counter.resolver is None
    r = counter.count(chat_image(f"{base}/cat.png"))
    assert r.defaulted["image"] is True
    assert server.hits == []


def test_data_urls_never_reach_the_resolver():
    """Inline data: URLs are read in place; the resolver sees only http(s) URLs."""
    seen = []
    counter = RequestCounter(CountingConfig(profile="llm-d"), resolver=lambda url: seen.append(url))
    url = "data:image/png;base64," + base64.b64encode(_png(10, 10)).decode()
    assert counter.count(chat_image(url)).units["image.pixels"] == 100
    assert seen == []
