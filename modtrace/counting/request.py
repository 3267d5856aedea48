"""Parse OpenAI-compatible request bodies into text and media parts, as vLLM accepts them.

Content part types follow vLLM's chat parser (``MM_PARSER_MAP`` in
``vllm/entrypoints/chat_utils.py``): text parts ``text``, ``input_text``,
``output_text``, ``thinking``, ``refusal``; images ``image_url`` (http(s)
or ``data:`` URL) and ``input_image``; audio ``input_audio`` (``{data,
format}``) and ``audio_url``; video ``video_url``. A part without a
``type`` is recognised by its key, as vLLM does. Plain completion prompts
(``prompt``: text, texts or token ids) and Responses-style ``input`` are
parsed too.

Parsing never raises on a bad part: the part is kept with an ``error`` so
that every other part of the request is still counted. Errors name a
client's part type only when it is a plain identifier
(:func:`~modtrace.counting.safe.safe_name`), never its content.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .safe import is_safe_name, safe_name

__all__ = ["ParsedRequest", "Part", "parse_request"]

TEXT_PARTS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "thinking": "thinking",
    "refusal": "refusal",
}
MEDIA_PARTS = {
    "image_url": "image",
    "input_image": "image",
    "image_embeds": "image",
    "image_pil": "image",
    "input_audio": "audio",
    "audio_url": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
    "video_embeds": "video",
}
_KEY_ORDER = ("image_url", "input_audio", "audio_url", "video_url", "text")


@dataclass(frozen=True, slots=True)
class Part:
    """One media content part (or a part that could not be parsed).

    Attributes:
        index: Position among the request's media parts, in order.
        modality: ``image``, ``audio``, ``video`` or ``unknown``.
        kind: The content part type (``image_url``, ``input_audio``...).
        url: The ``image_url``/``audio_url``/``video_url`` URL.
        data: Inline base64 (``input_audio.data``).
        format: The declared audio format (``input_audio.format``).
        detail: OpenAI's image ``detail`` (``low``, ``high``, ``auto``).
        error: Why the part cannot be counted.
    """

    index: int
    modality: str
    kind: str
    url: str | None = None
    data: str | None = None
    format: str | None = None
    detail: str | None = None
    error: str | None = None


@dataclass
class ParsedRequest:
    """The countable content of one request body."""

    model: str | None = None
    texts: list[str] = field(default_factory=list)
    messages: int = 0
    prompt_token_ids: int = 0
    parts: list[Part] = field(default_factory=list)
    mm_processor_kwargs: dict[str, Any] = field(default_factory=dict)
    media_io_kwargs: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def parse_request(body: Mapping[str, Any]) -> ParsedRequest:
    """Split a chat, completion or Responses request body into texts and media parts.

    Raises:
        ValueError: ``body`` is not a JSON object; everything below that
            level is reported per part instead.
    """
    if not isinstance(body, Mapping):
        msg = f"request body must be a JSON object, got {type(body).__name__}"
        raise ValueError(msg)
    out = ParsedRequest(model=body.get("model") if isinstance(body.get("model"), str) else None)
    for name in ("mm_processor_kwargs", "media_io_kwargs"):
        kwargs = body.get(name)
        if isinstance(kwargs, Mapping):
            setattr(out, name, dict(kwargs))
        elif kwargs is not None:
            out.errors.append(f"{name}: expected an object; ignored")

    if "messages" in body:
        _messages(body["messages"], out, "messages")
    elif "input" in body:
        inp = body["input"]
        if isinstance(inp, str):
            out.texts.append(inp)
        else:
            _messages(inp, out, "input")
    elif "prompt" in body:
        _prompt(body["prompt"], out)
    else:
        out.errors.append("request has no messages, input or prompt")
    tools = body.get("tools")
    if tools:
        # Tool schemas reach the prompt through the chat template.
        out.texts.append(json.dumps(tools, separators=(",", ":"), ensure_ascii=False, default=str))
    return out


def _prompt(prompt: object, out: ParsedRequest) -> None:
    if isinstance(prompt, str):
        out.texts.append(prompt)
    elif isinstance(prompt, list) and all(isinstance(p, int) for p in prompt):
        out.prompt_token_ids += len(prompt)
    elif isinstance(prompt, list):
        for i, p in enumerate(prompt):
            if isinstance(p, str):
                out.texts.append(p)
            elif isinstance(p, list) and all(isinstance(t, int) for t in p):
                out.prompt_token_ids += len(p)
            else:
                out.errors.append(f"prompt[{i}]: expected text or token ids")
    else:
        out.errors.append("prompt: expected text, a list of texts or token ids")


def _messages(messages: object, out: ParsedRequest, where: str) -> None:
    if not isinstance(messages, list):
        out.errors.append(f"{where}: expected a list")
        return
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            out.errors.append(f"{where}[{i}]: expected an object")
            continue
        out.messages += 1
        role = message.get("role")
        if isinstance(role, str):
            out.texts.append(role)
        _content(message.get("content"), out, f"{where}[{i}].content")
        _tool_calls(message.get("tool_calls"), out, f"{where}[{i}].tool_calls")


def _tool_calls(calls: object, out: ParsedRequest, where: str) -> None:
    """Tool-call names and arguments reach the prompt: they count as text."""
    if not calls:
        return
    if not isinstance(calls, list):
        out.errors.append(f"{where}: expected a list")
        return
    for j, call in enumerate(calls):
        if not isinstance(call, Mapping):
            out.errors.append(f"{where}[{j}]: expected an object")
            continue
        fn = call.get("function")
        if fn is None:  # another kind of tool call: nothing of it is counted
            continue
        if not isinstance(fn, Mapping):
            out.errors.append(f"{where}[{j}].function: expected an object")
            continue
        out.texts.extend(str(fn[k]) for k in ("name", "arguments") if fn.get(k))


def _content(content: object, out: ParsedRequest, where: str) -> None:
    if content is None:
        return
    if isinstance(content, str):
        out.texts.append(content)
        return
    if not isinstance(content, list):
        out.errors.append(f"{where}: expected text or a list of parts")
        return
    for j, part in enumerate(content):
        _part(part, out, f"{where}[{j}]")


def _part_type(part: Mapping[str, Any]) -> str | None:
    kind = part.get("type")
    if isinstance(kind, str):
        return kind
    # vLLM accepts a part without "type" when its payload key says what it is.
    return next((k for k in _KEY_ORDER if k in part), None)


def _part(part: object, out: ParsedRequest, where: str) -> None:
    index = len(out.parts)
    if isinstance(part, str):
        out.texts.append(part)
        return
    if not isinstance(part, Mapping):
        out.parts.append(Part(index, "unknown", "?", error=f"{where}: expected an object"))
        return
    kind = _part_type(part)
    if kind in TEXT_PARTS:
        value = part.get(TEXT_PARTS[kind])
        if isinstance(value, str):
            out.texts.append(value)
        else:
            out.parts.append(Part(index, "text", kind, error=f"{where}: {kind} part without text"))
        return
    modality = MEDIA_PARTS.get(kind or "")
    if modality is None:
        # The type is the client's text: named only when it is a plain identifier.
        error = f"{where}: unknown content part type {safe_name(kind)}"
        out.parts.append(Part(index, "unknown", kind if is_safe_name(kind) else "?", error=error))
        return
    out.parts.append(_media_part(index, modality, str(kind), part, where))


def _url_of(value: object) -> tuple[str | None, str | None]:
    """``image_url`` is ``{"url": ..., "detail": ...}`` or a bare string."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, Mapping) and isinstance(value.get("url"), str):
        detail = value.get("detail")
        return value["url"], detail if isinstance(detail, str) else None
    return None, None


def _media_part(index: int, modality: str, kind: str, part: Mapping[str, Any], where: str) -> Part:
    if kind.endswith("_embeds") or kind == "image_pil":
        return Part(
            index, modality, kind, error=f"{where}: {kind} cannot be counted at the gateway"
        )
    if kind == "input_audio":
        audio = part.get("input_audio")
        if not isinstance(audio, Mapping) or not isinstance(audio.get("data"), str):
            return Part(index, modality, kind, error=f"{where}: input_audio needs {{data, format}}")
        fmt = audio.get("format")
        return Part(
            index, modality, kind, data=audio["data"], format=fmt if isinstance(fmt, str) else None
        )
    if kind == "input_image":
        # Responses style: {"type": "input_image", "image_url": "...", "detail": "..."}.
        url, detail = _url_of(part.get("image_url"))
        detail = detail or (part.get("detail") if isinstance(part.get("detail"), str) else None)
        if url is None and part.get("file_id"):
            return Part(index, modality, kind, url=f"file_id:{part['file_id']}", detail=detail)
    else:
        url, detail = _url_of(part.get(kind))
    if url is None:
        return Part(index, modality, kind, error=f"{where}: {kind} part without a url")
    return Part(index, modality, kind, url=url, detail=detail)
