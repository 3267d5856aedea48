"""The reference engine's scheduler loop: encoders, prefill and decode as ledger steps.

One engine thread runs the model, like a vLLM engine core, and every model
pass it makes is timed by forward hooks (:class:`modtrace.engine.torch_hooks.ForwardTimer`)
and recorded in a :class:`modtrace.timing.StepLedger`:

* **encoder steps, batched across requests.** Requests that arrived since
  the last step (up to ``max_batch``) are admitted together: all their
  images go through the vision encoder in one packed pass, all their clips
  through the audio encoder in another, and each pass is shared among the
  requests by the encoder tokens it produced for each;
* **prefill**, one step per admitted request (the Hugging Face cache is per
  request here);
* **decode**, iteration-level scheduling: every loop advances every running
  request by one token, one step each.

So a request's timers are the sum of its shares of real passes, and the
ledger conserves time: a request's total is exactly the sum of its
components.

CPU seconds stand in for GPU seconds here (``source="wall_clock"``). On a
GPU, build the engine with ``device="cuda"``: the same hooks then record
CUDA events on the stream and the ledger gets GPU time
(``ForwardTimer(source="cuda_events")``).
"""

from __future__ import annotations

import asyncio
import itertools
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from ...counting.profile import Profile
from ...timers import GpuTimers
from ...timing import StepLedger
from ..torch_hooks import ForwardTimer
from .model import AUDIO, EOS, IMAGE, build_model, decode_text
from .processing import InputProcessor, PreparedRequest, RequestError

__all__ = [
    "Completion",
    "EngineConfig",
    "EngineEvent",
    "ReferenceEngine",
]

#: Token ids the sampler may pick: printable ASCII and the end of turn.
_ALLOWED = [*range(32, 127), EOS]
#: Longest wait for the engine thread to let an aborted request go.
_ABORT_WAIT_S = 10.0


@dataclass(frozen=True)
class EngineConfig:
    """Settings of the reference engine.

    Attributes:
        model_name: The name the server answers to (``model`` of requests).
        seed: Seed of the random weights.
        device: ``cpu``, or ``cuda`` to time passes with CUDA events.
        max_batch: Most requests admitted into one encoder step.
        default_max_tokens: Completion tokens when a request sets none.
        max_tokens_limit: Cap on a request's ``max_tokens``.
        threads: ``torch.set_num_threads`` for the process (``None``: leave it).
        check_counts: Fail a request (500) whose media token counts differ
            from the counting profile's.
        gpu_count: GPUs each step counts for (the ledger multiplies by it).
        allow_fault_injection: Honour the ``x-reference-engine-fault`` request
            header (``prefill`` fails the prefill with a 500, ``delay=SECONDS``
            delays the response); for tests of failure paths only.
    """

    model_name: str = "reference-qwen2.5-omni-tiny"
    seed: int = 0
    device: str = "cpu"
    max_batch: int = 8
    default_max_tokens: int = 16
    max_tokens_limit: int = 256
    threads: int | None = None
    check_counts: bool = True
    gpu_count: int = 1
    allow_fault_injection: bool = False


@dataclass(frozen=True)
class EngineEvent:
    """What the engine thread reports for a request.

    Attributes:
        kind: ``token``, ``finished``, ``error`` or ``aborted``.
        text: The decoded text of a token (``""`` for the end-of-turn token).
        finish_reason: ``stop`` or ``length``, when finished.
        prompt_tokens: Prompt length, when finished.
        completion_tokens: Tokens generated, when finished.
        error: The failure, when ``kind == "error"``.
    """

    kind: str
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: BaseException | None = None


@dataclass
class Completion:
    """A finished in-process request: the OpenAI response body and the measured timers."""

    response: dict[str, Any]
    timers: GpuTimers | None


@dataclass
class _Running:
    """A request inside the engine thread."""

    prepared: PreparedRequest
    emit: Callable[[EngineEvent], None]
    cache: Any = None
    rope_delta: int = 0
    position: int = 0
    last_token: int = 0
    generated: list[int] = field(default_factory=list)


class ReferenceEngine:
    """An OpenAI-compatible engine around a tiny Qwen2.5-Omni thinker (see module docstring).

    Args:
        config: Engine settings.
        ledger: Where steps are recorded; a new ``StepLedger(gpu_count)`` by default.
        profile: The counting profile the media counts are checked against
            (default ``qwen2.5-omni``).
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        ledger: StepLedger | None = None,
        profile: Profile | None = None,
    ) -> None:
        import torch

        self.config = config = config or EngineConfig()
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        if profile is None:
            from ...counting.families.qwen_audio import QWEN25_OMNI

            profile = QWEN25_OMNI
        self.ledger = ledger or StepLedger(gpu_count=config.gpu_count)
        self.model = build_model(config.seed, config.device)
        self.processor = InputProcessor(profile, check_counts=config.check_counts)
        self.device = torch.device(config.device)
        thinker = self.model.model
        self.timer = ForwardTimer(
            self.ledger, source="cuda_events" if self.device.type == "cuda" else "wall_clock"
        )
        self.timer.attach(thinker.visual, "vision_encoder")
        self.timer.attach(thinker.audio_tower, "audio_encoder")
        self.timer.attach(thinker.language_model)
        self.timer.attach(self.model.lm_head)
        self._allowed = torch.tensor(_ALLOWED, device=self.device)
        self._inbox: queue.Queue[tuple[PreparedRequest, Callable[[EngineEvent], None]] | None]
        self._inbox = queue.Queue()
        self._aborted: set[str] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._ids = itertools.count()

    # -- Lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine thread (idempotent)."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._thread = threading.Thread(
                target=self._loop, name="modtrace-reference-engine", daemon=True
            )
            self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the engine thread; running requests are dropped."""
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._inbox.put(None)
            thread.join(timeout)

    def __enter__(self) -> ReferenceEngine:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- Requests ------------------------------------------------------------------------
    def prepare(
        self,
        body: dict[str, Any],
        *,
        request_id: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> PreparedRequest:
        """Parse and process a chat request (CPU work; run it off the event loop).

        Raises:
            RequestError: 400 for a bad request, 404 for another model,
                500 for a count that disagrees with the profile.
        """
        model = body.get("model") or self.config.model_name
        if model != self.config.model_name:
            raise RequestError(404, f"The model `{model}` does not exist.", kind="NotFoundError")
        return self.processor.prepare(
            body,
            request_id=request_id or f"req-{next(self._ids)}-{uuid.uuid4().hex[:8]}",
            model=model,
            headers=headers,
            default_max_tokens=self.config.default_max_tokens,
            max_tokens_limit=self.config.max_tokens_limit,
        )

    def submit(self, prepared: PreparedRequest, emit: Callable[[EngineEvent], None]) -> None:
        """Queue a prepared request; ``emit`` is called from the engine thread.

        Requests queued before :meth:`start` are admitted together, in one
        encoder step (up to ``max_batch``).
        """
        self._inbox.put((prepared, emit))

    def abort(self, request_id: str) -> None:
        """Stop a request at its next step (a client went away)."""
        with self._lock:
            self._aborted.add(request_id)

    async def generate(self, prepared: PreparedRequest) -> AsyncIterator[EngineEvent]:
        """Run a request; yield its events on the caller's event loop.

        Leaving the iteration early (the client disconnected) aborts the request.
        """
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[EngineEvent] = asyncio.Queue()
        self.start()
        self.submit(prepared, lambda ev: loop.call_soon_threadsafe(events.put_nowait, ev))
        done = False
        try:
            while not done:
                event = await events.get()
                done = event.kind != "token"
                yield event
        finally:
            if not done:
                await self._abort_and_wait(prepared.request_id, events)

    async def _abort_and_wait(self, request_id: str, events: asyncio.Queue[EngineEvent]) -> None:
        """Abort a request and wait until the engine thread has let it go.

        So that no step of it is recorded after the caller closes its ledger
        account (a late step would open a new one).
        """
        self.abort(request_id)

        async def settled() -> None:
            while (await events.get()).kind == "token":
                pass

        try:
            await asyncio.wait_for(settled(), _ABORT_WAIT_S)
        except asyncio.TimeoutError:
            pass
        finally:
            with self._lock:
                self._aborted.discard(request_id)

    def complete(self, body: dict[str, Any], *, request_id: str | None = None) -> Completion:
        """Run a chat request in-process and close its ledger account.

        Returns:
            The OpenAI ``chat.completion`` body and the request's timers.

        Raises:
            RequestError: As :meth:`prepare`, or 500 when the engine fails.
        """
        prepared = self.prepare(body, request_id=request_id)
        events: queue.Queue[EngineEvent] = queue.Queue()
        self.start()
        self.submit(prepared, events.put)
        text: list[str] = []
        try:
            while True:
                event = events.get()
                if event.kind == "token":
                    text.append(event.text)
                    continue
                if event.kind == "error":
                    raise RequestError(500, str(event.error), "InternalServerError")
                return Completion(
                    chat_completion(prepared, "".join(text), event), self.finish(prepared)
                )
        finally:
            self.ledger.finish(prepared.request_id, None)

    def finish(self, prepared: PreparedRequest) -> GpuTimers | None:
        """Close a request's ledger account; its timers, or ``None`` without steps."""
        return self.ledger.finish(prepared.request_id, None)

    # -- The engine thread -------------------------------------------------------------------
    def _loop(self) -> None:
        import torch

        running: list[_Running] = []
        with torch.inference_mode():
            while True:
                admitted: list[_Running] = []
                try:
                    item = self._inbox.get(timeout=None if not running else 0)
                    while True:
                        if item is None:
                            return
                        admitted.append(_Running(*item))
                        if len(admitted) >= self.config.max_batch:
                            break
                        item = self._inbox.get_nowait()
                except queue.Empty:
                    pass
                running = self._drop_aborted(running)
                if admitted:
                    running += self._admit(self._drop_aborted(admitted))
                running = [r for r in running if self._decode(r)]

    def _drop_aborted(self, requests: list[_Running]) -> list[_Running]:
        """The requests not aborted; the aborted ones are told so and let go."""
        with self._lock:
            if not self._aborted:
                return requests
            aborted = set(self._aborted)
        kept = []
        for request in requests:
            if request.prepared.request_id in aborted:
                request.cache = None
                request.emit(EngineEvent("aborted"))
            else:
                kept.append(request)
        return kept

    def _fail(self, request: _Running, exc: BaseException) -> None:
        request.emit(EngineEvent("error", error=exc))

    def _admit(self, batch: list[_Running]) -> list[_Running]:
        """Encoder steps for the whole batch, then one prefill step per request."""
        try:
            image_embeds = self._encode_images(batch)
            audio_embeds = self._encode_audio(batch)
        except Exception as exc:
            for request in batch:
                self._fail(request, exc)
            return []
        admitted = []
        for request in batch:
            try:
                if self._prefill(request, image_embeds, audio_embeds):
                    admitted.append(request)
            except Exception as exc:
                self._fail(request, exc)
        return admitted

    def _encode_images(self, batch: list[_Running]) -> dict[str, list[Any]]:
        """One vision encoder pass over every image of the batch; embeddings per request."""
        import torch

        items = [(r.prepared.request_id, i) for r in batch for i in r.prepared.images]
        if not items:
            return {}
        pixels = torch.cat([i.pixel_values for _, i in items]).to(self.device)
        grid = torch.tensor([i.grid_thw for _, i in items], device=self.device)
        tokens: dict[str, int] = {}
        for rid, item in items:
            tokens[rid] = tokens.get(rid, 0) + item.tokens
        with self.timer.step(tokens, "vision_encoder"):
            out = self.model.model.get_image_features(pixels, grid)
        per_request: dict[str, list[Any]] = {}
        for (rid, item), embeds in zip(items, out.pooler_output, strict=True):
            if embeds.shape[0] != item.tokens:
                msg = f"vision encoder gave {embeds.shape[0]} embeddings for {item.tokens} tokens"
                raise RuntimeError(msg)
            per_request.setdefault(rid, []).append(embeds)
        return per_request

    def _encode_audio(self, batch: list[_Running]) -> dict[str, list[Any]]:
        """One audio encoder pass over every clip of the batch; embeddings per request."""
        import torch

        items = [(r.prepared.request_id, a) for r in batch for a in r.prepared.audios]
        if not items:
            return {}
        width = max(a.frames for _, a in items)
        features = torch.zeros(len(items), items[0][1].features.shape[0], width)
        mask = torch.zeros(len(items), width, dtype=torch.long)
        for n, (_, clip) in enumerate(items):
            features[n, :, : clip.frames] = clip.features
            mask[n, : clip.frames] = 1
        tokens: dict[str, int] = {}
        for rid, clip in items:
            tokens[rid] = tokens.get(rid, 0) + clip.tokens
        tower = self.model.model.audio_tower
        _, expected = tower._get_feat_extract_output_lengths(mask.sum(-1))
        if expected.tolist() != [clip.tokens for _, clip in items]:
            msg = f"audio encoder lengths {expected.tolist()} differ from the processor's"
            raise RuntimeError(msg)
        with self.timer.step(tokens, "audio_encoder"):
            out = self.model.model.get_audio_features(
                features.to(self.device), mask.to(self.device)
            ).last_hidden_state
        per_request: dict[str, list[Any]] = {}
        for (rid, _), embeds in zip(items, out.split(expected.tolist()), strict=True):
            per_request.setdefault(rid, []).append(embeds)
        return per_request

    def _prefill(
        self,
        request: _Running,
        image_embeds: dict[str, list[Any]],
        audio_embeds: dict[str, list[Any]],
    ) -> bool:
        """Merge the embeddings into the prompt, run prefill, sample the first token."""
        import torch
        from transformers.cache_utils import DynamicCache

        prepared = request.prepared
        rid = prepared.request_id
        thinker = self.model.model
        ids = torch.tensor([prepared.input_ids], device=self.device)
        embeds = thinker.get_input_embeddings()(ids)
        for token, found in ((IMAGE, image_embeds.get(rid)), (AUDIO, audio_embeds.get(rid))):
            if found:
                mask = (ids == token).unsqueeze(-1).expand_as(embeds)
                embeds = embeds.masked_scatter(mask, torch.cat(found).to(embeds.dtype))
        grid = (
            torch.tensor([i.grid_thw for i in prepared.images], device=self.device)
            if prepared.images
            else None
        )
        seqlens = (
            torch.tensor([a.frames for a in prepared.audios], device=self.device)
            if prepared.audios
            else None
        )
        positions, delta = thinker.get_rope_index(
            ids, grid, None, torch.ones_like(ids), False, seqlens, None
        )
        request.cache = DynamicCache(config=self.model.config.text_config)
        if prepared.fault == "prefill":
            msg = "injected fault: prefill failed"
            raise RuntimeError(msg)
        with self.timer.step({rid: ids.shape[1]}, "prefill"):
            hidden = thinker.language_model(
                inputs_embeds=embeds, position_ids=positions, cache=request.cache, use_cache=True
            ).last_hidden_state
            logits = self.model.lm_head(hidden[:, -1])
        request.rope_delta = int(delta.reshape(-1)[0])
        request.position = ids.shape[1]
        return self._sample(request, logits)

    def _decode(self, request: _Running) -> bool:
        """One decode step of one request; whether it keeps running."""
        import torch

        rid = request.prepared.request_id
        try:
            thinker = self.model.model
            ids = torch.tensor([[request.last_token]], device=self.device)
            embeds = thinker.get_input_embeddings()(ids)
            where = request.position + request.rope_delta
            positions = torch.full((3, 1, 1), where, dtype=torch.long, device=self.device)
            with self.timer.step({rid: 1}, "decode"):
                hidden = thinker.language_model(
                    inputs_embeds=embeds,
                    position_ids=positions,
                    cache=request.cache,
                    use_cache=True,
                ).last_hidden_state
                logits = self.model.lm_head(hidden[:, -1])
            request.position += 1
            return self._sample(request, logits)
        except Exception as exc:
            self._fail(request, exc)
            return False

    def _sample(self, request: _Running, logits: Any) -> bool:
        """Greedy pick among the allowed tokens; emit it; whether the request goes on."""
        choice = int(self._allowed[logits[0, self._allowed].argmax()])
        request.generated.append(choice)
        request.last_token = choice
        prepared = request.prepared
        stop = choice == EOS
        if not stop:
            request.emit(EngineEvent("token", text=decode_text([choice])))
        if stop or len(request.generated) >= prepared.max_tokens:
            request.emit(
                EngineEvent(
                    "finished",
                    finish_reason="stop" if stop else "length",
                    prompt_tokens=len(prepared.input_ids),
                    completion_tokens=len(request.generated),
                )
            )
            request.cache = None
            return False
        return True


# --- OpenAI response bodies ------------------------------------------------------------------
def usage(prepared: PreparedRequest, finished: EngineEvent) -> dict[str, Any]:
    """The ``usage`` object, as vLLM writes it with ``--enable-prompt-tokens-details``.

    ``prompt_tokens_details`` carries ``cached_tokens`` (always 0: no prefix
    cache here) and, per modality present, the placeholder tokens of its
    items, as vLLM PR #45458 counts them (``PlaceholderRange.length``: the
    ``<|IMAGE|>``/``<|AUDIO|>`` run, without the bos/eos tokens around it).
    """
    details: dict[str, int] = {"cached_tokens": 0}
    if prepared.images:
        details["image_tokens"] = prepared.image_tokens
    if prepared.audios:
        details["audio_tokens"] = prepared.audio_tokens
    return {
        "prompt_tokens": finished.prompt_tokens,
        "total_tokens": finished.prompt_tokens + finished.completion_tokens,
        "completion_tokens": finished.completion_tokens,
        "prompt_tokens_details": details,
    }


def chat_completion(prepared: PreparedRequest, text: str, finished: EngineEvent) -> dict[str, Any]:
    """The non-streaming ``chat.completion`` body."""
    return {
        "id": f"chatcmpl-{prepared.request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": prepared.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finished.finish_reason,
            }
        ],
        "usage": usage(prepared, finished),
    }
