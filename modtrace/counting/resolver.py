"""A reference URL resolver: bounded in time and size, with an allow-list. Opt-in only.

:class:`~modtrace.counting.RequestCounter` never fetches a URL on its own.
Pass a resolver to size media behind http(s) URLs from their bytes::

    from modtrace.counting import RequestCounter
    from modtrace.counting.resolver import url_resolver

    resolver = url_resolver(
        timeout=2.0,
        max_bytes=8 * 2**20,
        allow=lambda url: url.startswith("https://media.example.com/"),
    )
    counter = RequestCounter(config, resolver=resolver)

The counter calls the resolver **synchronously**, in the thread that calls
``count()``, once per URL item of a request: every second it waits is a
second that request's counting (and, on an event loop, the loop) waits.
Keep ``timeout`` short, ``max_bytes`` small, and ``allow`` strict: the URLs
come from clients, and a gateway that fetches whatever it is given can be
pointed at internal addresses.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from typing import Any

__all__ = ["RedirectRefused", "ResponseTooLarge", "url_resolver"]

_CHUNK = 64 * 1024


class ResponseTooLarge(ValueError):
    """The response is longer than the resolver's ``max_bytes``."""


class RedirectRefused(ValueError):
    """A redirect to a URL that ``allow`` refuses, or to a scheme other than http(s)."""


def url_resolver(
    *,
    allow: Callable[[str], bool],
    timeout: float = 5.0,
    max_bytes: int = 16 * 2**20,
    headers: dict[str, str] | None = None,
) -> Callable[[str], bytes | None]:
    """Build a resolver that fetches http(s) URLs with ``urllib``, bounded.

    Args:
        allow: Which URLs may be fetched (required: the URLs come from
            clients). A URL it refuses is not fetched and the item keeps the
            configured defaults (the resolver returns ``None``); a redirect
            to a refused URL fails the fetch.
        timeout: Seconds for connecting and for each socket read, and for
            reading the whole body (checked after every read, each of which
            returns what has arrived).
        max_bytes: Largest response accepted; a longer one (by its
            ``Content-Length`` or by what arrives) fails the fetch with
            :class:`ResponseTooLarge` rather than being cut (a cut file
            would be sized wrongly).
        headers: Extra request headers (a ``User-Agent``, an API key for
            your media store).

    Returns:
        ``url -> bytes | None``, for ``RequestCounter(resolver=...)``. It
        raises on a failed fetch; the counter flags that item only and
        records the exception type, never its message.
    """
    if timeout <= 0 or max_bytes <= 0:
        msg = "url_resolver: timeout and max_bytes must be positive"
        raise ValueError(msg)
    opener = urllib.request.build_opener(_CheckedRedirects(allow))
    extra = dict(headers or {})

    def resolve(url: str) -> bytes | None:
        if not url.lower().startswith(("http://", "https://")) or not allow(url):
            return None
        deadline = time.monotonic() + timeout
        request = urllib.request.Request(url, headers=extra)
        with opener.open(request, timeout=timeout) as response:
            declared = response.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > max_bytes:
                msg = f"response of {declared} bytes exceeds max_bytes={max_bytes}"
                raise ResponseTooLarge(msg)
            return _read_bounded(response, max_bytes, deadline)

    return resolve


def _read_bounded(response: Any, max_bytes: int, deadline: float) -> bytes:
    """Read until EOF, failing past ``max_bytes`` or past ``deadline``."""
    chunks: list[bytes] = []
    size = 0
    while True:
        if time.monotonic() > deadline:
            msg = "fetch exceeded its timeout"
            raise TimeoutError(msg)
        # read1 returns what has arrived: a slow sender cannot hold one read open.
        chunk = response.read1(min(_CHUNK, max_bytes + 1 - size))
        if not chunk:
            return b"".join(chunks)
        size += len(chunk)
        if size > max_bytes:
            msg = f"response exceeds max_bytes={max_bytes}"
            raise ResponseTooLarge(msg)
        chunks.append(chunk)


class _CheckedRedirects(urllib.request.HTTPRedirectHandler):
    """Follow a redirect only to an http(s) URL that ``allow`` accepts."""

    def __init__(self, allow: Callable[[str], bool]) -> None:
        self._allow = allow

    def redirect_request(  # type: ignore[override]
        self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str
    ) -> Any:
        if not newurl.lower().startswith(("http://", "https://")) or not self._allow(newurl):
            msg = "redirect refused by allow"
            raise RedirectRefused(msg)
        return super().redirect_request(req, fp, code, msg, headers, newurl)
