"""Keep request data out of counting messages: safe names, bounded lines, redacted URLs.

Counting messages (``RequestCount.errors``, ``ItemCount.error``) end up on
spans, so they must not carry what a client sent: no payload bytes, no
header values, no presigned-URL credentials. These helpers are how a
message may still mention a user-supplied value:

* :func:`safe_name`: a part type, audio format or parameter name, quoted
  only when it is a plain identifier (``[A-Za-z0-9_]{1,32}``);
* :func:`redact_url`: scheme, host, port and path, without userinfo, query
  or fragment;
* :func:`bounded`: one printable line of bounded length.
"""

from __future__ import annotations

import re
from typing import TypeGuard
from urllib.parse import urlsplit

__all__ = ["MAX_MESSAGE", "bounded", "is_safe_name", "redact_url", "safe_name"]

#: Longest counting message, in characters.
MAX_MESSAGE = 240
#: Longest redacted URL, in characters.
_MAX_URL = 120
_SAFE_NAME = re.compile(r"[A-Za-z0-9_]{1,32}")
_UNPRINTABLE = re.compile(r"[^\x20-\x7e]+")


def is_safe_name(value: object) -> TypeGuard[str]:
    """Whether ``value`` is a short plain identifier, ``[A-Za-z0-9_]{1,32}``."""
    return isinstance(value, str) and _SAFE_NAME.fullmatch(value) is not None


def safe_name(value: object, hidden: str = "(not shown)") -> str:
    """``repr(value)`` when it is a short plain identifier, else ``hidden``."""
    return repr(value) if is_safe_name(value) else hidden


def bounded(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` as one line of printable ASCII, at most ``limit`` characters."""
    line = _UNPRINTABLE.sub("?", " ".join(text.split()))
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return line


def redact_url(url: str) -> str:
    """``scheme://host[:port]/path`` of ``url``: no userinfo, query string or fragment.

    The result is bounded (a long path is cut) and printable; a text that
    does not parse as a URL with a scheme and a host is not shown at all.
    """
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        return "(url not shown)"
    if not parts.scheme or not host:
        return "(url not shown)"
    if ":" in host:  # IPv6 literal
        host = f"[{host}]"
    netloc = host if port is None else f"{host}:{port}"
    out = f"{parts.scheme.lower()}://{netloc}{parts.path}"
    out = _UNPRINTABLE.sub("?", out)
    if len(out) > _MAX_URL:
        out = out[: _MAX_URL - 3] + "..."
    return out
