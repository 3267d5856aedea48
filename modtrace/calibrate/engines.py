"""Engines a probe run can send to: an OpenAI-compatible endpoint, or the reference engine.

Both are :class:`~modtrace.calibrate.runner.Engine` callables,
``engine(body, headers) -> GpuTimers``, with an ``info`` saying honestly
what they are (recorded in the probe file and the calibration):

* :class:`HttpEngine` POSTs each probe to ``/v1/chat/completions`` and reads
  the GPU timers the engine returned in its ``x-modtrace-gpu-seconds*``
  response headers (:func:`modtrace.engine.timers_from_headers`). A request
  that fails (connection refused, timeout, an HTTP error, a body that is not
  a chat completion, missing or malformed timer headers) raises
  :class:`EngineRequestError`: the runner records a failed probe with the
  reason.
* :class:`ReferenceProbeEngine` runs each probe in-process on the reference
  engine (``modtrace[engine]``): a tiny random Qwen2.5-Omni thinker on the
  CPU, whose timers are **CPU seconds standing in for GPU seconds**. Its
  weights say how this CPU spends time on this tiny model, not what a GPU
  would: they exercise the workflow on real encoders, real preprocessing and
  real component timers, and nothing more.

The reference engine tokenizes text byte by byte (one token per UTF-8 byte).
:func:`reference_counting` gives the counting configuration that counts text
the same way (a byte-level ``tokenizer.json``, and the chat template's
tokens), so that a plan's units are the engine's.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._version import __version__
from ..timers import GpuTimers
from .plan import ProbePlan
from .probes import EngineInfo

__all__ = [
    "REFERENCE_CAVEAT",
    "EngineRequestError",
    "HttpEngine",
    "ReferenceProbeEngine",
    "chat_completions_url",
    "reference_counting",
    "write_byte_tokenizer",
]

#: Recorded with every probe file and calibration made on the reference engine.
REFERENCE_CAVEAT = (
    "CPU seconds stand in for GPU seconds: the reference engine runs a tiny random "
    "Qwen2.5-Omni thinker on the CPU; these weights describe that, not a GPU"
)
#: The reference chat template's tokens (modtrace/engine/reference/model.py):
#: ``<|im_start|>{role}\n`` ... ``<|im_end|>\n`` per message, whose role name the request
#: parser already counts as text, and ``<|im_start|>assistant\n`` once per request.
_TEMPLATE_PER_MESSAGE = 1 + len(b"\n") + 1 + len(b"\n")
_TEMPLATE_PER_REQUEST = 1 + len(b"assistant\n")
#: An error body shown in a failure reason, at most.
_ERROR_CHARS = 300


class EngineRequestError(RuntimeError):
    """A probe request the engine did not answer with a completion and its GPU timers."""


def chat_completions_url(url: str) -> str:
    """The chat completions endpoint of ``url``.

    ``http://host:8000``, ``http://host:8000/v1`` and the full
    ``.../v1/chat/completions`` all name the same endpoint.

    Raises:
        ValueError: not an ``http`` or ``https`` URL.
    """
    text = url.strip()
    if not text.startswith(("http://", "https://")) or len(text.split("://", 1)[1]) == 0:
        msg = f"engine URL {url!r}: expected http://HOST[:PORT][/v1]"
        raise ValueError(msg)
    text = text.rstrip("/")
    if text.endswith("/chat/completions"):
        return text
    if text.endswith("/v1"):
        return text + "/chat/completions"
    return text + "/v1/chat/completions"


def _flat(text: object) -> str:
    """``text`` on one line."""
    return " ".join(str(text).split())


def _error_message(raw: bytes) -> str:
    """The ``error.message`` of an OpenAI-style error body, else the body's start."""
    try:
        body = json.loads(raw)
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return _flat(error["message"])[:_ERROR_CHARS]
        if isinstance(error, str):
            return _flat(error)[:_ERROR_CHARS]
    except ValueError:
        pass
    return _flat(raw.decode("utf-8", errors="replace"))[:_ERROR_CHARS] or "(empty body)"


class HttpEngine:
    """An OpenAI-compatible endpoint as a probe engine (see the module doc).

    Args:
        url: The server (``http://host:8000``), its ``/v1`` base, or the full
            chat completions URL.
        timeout: Seconds to wait for each response.
        headers: Extra request headers (authorization...). Never recorded.
        name: What the engine is (``vllm 0.11.0``); default: the endpoint.
        driver: GPU driver and runtime, as you know them; recorded as given.
        gpu: The accelerator model, as you know it.
        model: The model the endpoint serves, when it differs from the plan's.
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 300.0,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        driver: str | None = None,
        gpu: str | None = None,
        model: str | None = None,
    ) -> None:
        if not timeout > 0:
            msg = f"timeout must be positive, got {timeout}"
            raise ValueError(msg)
        self.url = chat_completions_url(url)
        self.timeout = timeout
        self._headers = dict(headers or {})
        self._info = EngineInfo(
            name=name or f"openai-compatible endpoint {self.url}",
            driver=driver,
            gpu=gpu,
            model=model,
            details={"url": self.url, "timers": "x-modtrace-gpu-seconds* response headers"},
        )

    @property
    def info(self) -> EngineInfo:
        """What the probes ran on, as far as the caller told."""
        return self._info

    def __call__(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> GpuTimers:
        """POST one probe; return the GPU timers from the response headers.

        Raises:
            EngineRequestError: the request failed, or the response is not a
                chat completion with valid timer headers.
        """
        from ..engine.hooks import timers_from_headers

        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode("utf-8"),
            method="POST",
            headers={
                "Content-Type": "application/json",
                "Accept": "application/json",
                **self._headers,
                **headers,
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read()
                pairs = list(response.headers.items())
        except urllib.error.HTTPError as exc:
            detail = _error_message(exc.read() or b"")
            msg = f"HTTP {exc.code} from {self.url}: {detail}"
            raise EngineRequestError(msg) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            msg = f"cannot reach {self.url}: {_flat(reason)}"
            raise EngineRequestError(msg) from None
        try:
            completion = json.loads(raw)
        except ValueError:
            msg = f"the response is not JSON: {_error_message(raw)}"
            raise EngineRequestError(msg) from None
        if not isinstance(completion, dict) or not isinstance(completion.get("choices"), list):
            msg = f"the response is not a chat completion: {_error_message(raw)}"
            raise EngineRequestError(msg)
        reasons: list[str] = []
        timers = timers_from_headers(pairs, errors=reasons)
        if timers is None:
            why = "; ".join(reasons) or "no x-modtrace-gpu-seconds headers in the response"
            msg = f"no GPU timers from the engine: {why}"
            raise EngineRequestError(msg)
        return timers


class ReferenceProbeEngine:
    """The in-process reference engine as a probe engine (CPU seconds for GPU seconds).

    Needs ``modtrace[engine]`` (torch, transformers, soundfile).

    Args:
        engine: A built :class:`~modtrace.engine.reference.ReferenceEngine`;
            one is built from ``config`` when omitted (and stopped by :meth:`close`).
        config: Settings of the engine built here (default: one thread).
    """

    def __init__(self, engine: Any | None = None, *, config: Any | None = None) -> None:
        from ..engine.reference import EngineConfig, ReferenceEngine

        self._owned = engine is None
        self.engine = engine or ReferenceEngine(config or EngineConfig(threads=1))
        self.engine.start()

    @property
    def model_name(self) -> str:
        """The model name the engine answers to."""
        return str(self.engine.config.model_name)

    @property
    def info(self) -> EngineInfo:
        """The reference engine, labelled: CPU seconds stand in for GPU seconds."""
        import torch
        import transformers

        config = self.engine.config
        device = str(config.device)
        on_gpu = device.startswith("cuda")
        return EngineInfo(
            name=f"modtrace reference engine {__version__} ({'GPU' if on_gpu else 'CPU'})",
            driver=(
                f"CUDA {torch.version.cuda}, torch {torch.__version__}"
                if on_gpu
                else f"none: CPU, torch {torch.__version__}"
            ),
            gpu=torch.cuda.get_device_name() if on_gpu else None,
            model=self.model_name,
            caveats=[] if on_gpu else [REFERENCE_CAVEAT],
            details={
                "model": "tiny random Qwen2.5-Omni thinker "
                "(transformers Qwen2_5OmniThinkerForConditionalGeneration)",
                "seed": config.seed,
                "device": device,
                "timer_source": self.engine.timer.source,
                "torch_threads": torch.get_num_threads(),
                "transformers": transformers.__version__,
                "profile": self.engine.processor.profile.name,
            },
        )

    def check_plan(self, plan: ProbePlan) -> None:
        """Refuse, before sending anything, a plan this engine cannot run as planned.

        Raises:
            ValueError: the plan's model is not the engine's, its profile is
                not the one the engine's counts follow, or it probes video.
        """
        model = plan.model or plan.profile
        if model != self.model_name:
            msg = (
                f"the reference engine serves model {self.model_name!r}, the plan sends "
                f"{model!r}: make the plan with --model {self.model_name} "
                "(or 'modtrace calibrate plan --reference-engine')"
            )
            raise ValueError(msg)
        profile = self.engine.processor.profile.name
        if plan.profile != profile:
            msg = (
                f"the reference engine processes media as profile {profile!r}, the plan "
                f"counts with {plan.profile!r}: make the plan with --profile {profile}"
            )
            raise ValueError(msg)
        videos = "video" in plan.modalities or any(h.videos for h in plan.holdout_requests())
        if videos:
            msg = (
                "the reference engine has no video (transformers' video processor needs "
                "torchvision): make the plan without video (--modality text --modality image "
                "--modality audio)"
            )
            raise ValueError(msg)

    def __call__(self, body: Mapping[str, Any], headers: Mapping[str, str]) -> GpuTimers:
        """Run one probe in-process; return its timers.

        Raises:
            EngineRequestError: the engine refused or failed the request.
        """
        from ..engine.reference import RequestError

        try:
            completion = self.engine.complete(dict(body))
        except RequestError as exc:
            msg = f"HTTP {exc.status} {exc.kind}: {_flat(exc.message)}"
            raise EngineRequestError(msg) from None
        if completion.timers is None:
            msg = "the reference engine recorded no step for the request"
            raise EngineRequestError(msg)
        return completion.timers

    def close(self) -> None:
        """Stop the engine thread of an engine built here."""
        if self._owned:
            self.engine.stop()

    def __enter__(self) -> ReferenceProbeEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_byte_tokenizer(path: str | Path) -> Path:
    """Write a ``tokenizer.json`` that makes one token of each UTF-8 byte, as the reference does.

    A byte-level BPE with the 256 byte symbols and no merges: the text
    counter (``text.kind = "hf"``) then counts text exactly as the
    reference engine's ``encode_text``. Needs the ``tokenizers`` package.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    p = Path(path)
    tokenizer.save(str(p))
    return p


def reference_counting(tokenizer_json: str | Path) -> dict[str, Any]:
    """The plan ``counting`` that counts text as the reference engine tokenizes it.

    One token per UTF-8 byte of text and role names (``tokenizer_json``
    from :func:`write_byte_tokenizer`), plus the chat template's tokens: 4
    per message and 11 per request. The markers around each image and audio
    placeholder run (2 tokens per item) are not counted: they are not in
    vLLM's ``image_tokens`` / ``audio_tokens`` either, and no text counter
    sees items.
    """
    return {
        "text": {
            "kind": "hf",
            "tokenizer_json": str(Path(tokenizer_json).resolve()),
            "tokens_per_message": _TEMPLATE_PER_MESSAGE,
            "tokens_per_request": _TEMPLATE_PER_REQUEST,
        }
    }
