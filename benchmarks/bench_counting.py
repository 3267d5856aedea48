"""Counting a mixed request: modtrace's header probing against the naive full decode.

The request: about 1,000 text tokens, two inline 1920x1080 JPEGs and 20 s of
inline WAV. The naive way decodes all base64 and all pixels and samples to
learn the same sizes; modtrace reads only the headers. Both run here, in the
same process, on the same request, and the script prints the ratio.

    python benchmarks/bench_counting.py [--repeats 200]

Text is real English prose (docstrings of the standard library) tokenized
with tiktoken on a 16k-rank BPE trained here on other docstrings (no
download), so the "image and audio cost less than the text" comparison uses
a real tokenizer on realistic text.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import statistics
import tempfile
import time
import wave
from pathlib import Path

import numpy as np
from PIL import Image

from modtrace.counting.counter import CountingConfig, RequestCounter, TextConfig
from modtrace.counting.profile import AudioInput, ImageInput
from modtrace.counting.profiles import get_profile
from modtrace.counting.request import parse_request

PROFILE = "qwen2.5-omni"


def prose() -> tuple[str, str]:
    """English prose from standard-library docstrings: (training text, held-out text)."""
    import importlib
    import inspect

    docs = []
    for name in (
        "argparse",
        "logging",
        "json",
        "collections",
        "unittest",
        "email",
        "asyncio",
        "threading",
        "subprocess",
        "pathlib",
        "typing",
        "dataclasses",
        "functools",
        "os",
        "shutil",
        "tarfile",
        "zipfile",
        "csv",
        "datetime",
        "decimal",
        "statistics",
        "random",
        "http.client",
        "urllib.request",
    ):
        module = importlib.import_module(name)
        docs += [d for _, obj in inspect.getmembers(module) if (d := inspect.getdoc(obj))]
    docs = sorted(set(docs))
    held_out = docs[::10]
    return "\n\n".join(d for d in docs if d not in held_out), "\n\n".join(held_out)


def make_jpeg(seed: int) -> str:
    rng = np.random.default_rng(seed)
    # Smooth noise compresses like a photo: a few hundred kB, not a flat colour.
    small = rng.integers(0, 255, (135, 240, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((1920, 1080), Image.BILINEAR)
    buf = io.BytesIO()
    img.save(buf, "JPEG", quality=90)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()


def make_wav(seconds: float, rate: int = 16000) -> str:
    rng = np.random.default_rng(1)
    samples = (rng.standard_normal(int(seconds * rate)) * 3000).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return base64.b64encode(buf.getvalue()).decode()


def train_tiktoken(path: Path) -> None:
    """A byte-level BPE (16k ranks) trained with `tokenizers`, written as a .tiktoken file."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from tokenizers.pre_tokenizers import ByteLevel

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=16000, initial_alphabet=ByteLevel.alphabet())
    tok.train_from_iterator([prose()[0]], trainer)
    # Byte-level BPE spells bytes with GPT-2's printable stand-ins: invert that table.
    bs = [*range(33, 127), *range(161, 173), *range(174, 256)]
    cs = bs[:]
    unprintable = [b for b in range(256) if b not in bs]
    bs += unprintable
    cs += [256 + i for i in range(len(unprintable))]
    byte_of = {chr(c): b for b, c in zip(bs, cs, strict=True)}
    ranks = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    lines = []
    for rank, (token, _id) in enumerate(ranks):
        raw = bytes(byte_of[c] for c in token)
        lines.append(f"{base64.b64encode(raw).decode()} {rank}\n")
    path.write_text("".join(lines))


def naive_count(body: dict) -> dict:
    """Decode everything, then apply the same formulas."""
    profile = get_profile(PROFILE)
    parsed = parse_request(body)
    out = {"image.tokens": 0, "audio.seconds": 0.0}
    for part in parsed.parts:
        if part.modality == "image":
            data = base64.b64decode(part.url.split(",", 1)[1])
            with Image.open(io.BytesIO(data)) as im:
                im.load()  # the full pixel decode
                w, h = im.size
            out["image.tokens"] += profile.image(ImageInput(w, h)).tokens
        elif part.modality == "audio":
            data = base64.b64decode(part.data)
            with wave.open(io.BytesIO(data)) as wf:
                frames = wf.readframes(wf.getnframes())
                seconds = len(frames) / (wf.getsampwidth() * wf.getnchannels()) / wf.getframerate()
            out["audio.seconds"] += seconds
            profile.audio(AudioInput(seconds=seconds, sample_rate=wf.getframerate()))
    return out


def timed(fn, repeats: int) -> float:
    """Median seconds per call."""
    fn()  # warm up
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        ranks = Path(tmp) / "bench.tiktoken"
        train_tiktoken(ranks)
        text_cfg = TextConfig(kind="tiktoken", encoding="bench", tiktoken_file=str(ranks))
        counter = RequestCounter(CountingConfig(profile=PROFILE, text=text_cfg))
        words = prose()[1].split(" ")
        prompt = " ".join(words[:650])  # about 1,000 tokens of held-out prose
        body = {
            "model": "bench",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": prompt},
                        {"type": "image_url", "image_url": {"url": make_jpeg(1)}},
                        {"type": "image_url", "image_url": {"url": make_jpeg(2)}},
                        {
                            "type": "input_audio",
                            "input_audio": {"data": make_wav(20), "format": "wav"},
                        },
                    ],
                }
            ],
        }
        media_only = json.loads(json.dumps(body))
        media_only["messages"][0]["content"][0]["text"] = ""
        text_only = {"model": "bench", "messages": [{"role": "user", "content": prompt}]}
        # The fixed cost of any request (parsing, result models), paid by both sides.
        empty = {"model": "bench", "messages": [{"role": "user", "content": ""}]}

        result = counter.count(body)
        assert not result.errors, result.errors
        assert naive_count(body)["image.tokens"] == result.units["image.tokens"]

        t_modtrace = timed(lambda: counter.count(body), args.repeats)

        def naive() -> None:
            naive_count(body)
            counter.text.count([prompt], 1)

        t_naive = timed(naive, max(args.repeats // 10, 5))
        t_empty = timed(lambda: counter.count(empty), args.repeats)
        t_media = timed(lambda: counter.count(media_only), args.repeats) - t_empty
        t_text = timed(lambda: counter.count(text_only), args.repeats) - t_empty

    size_kb = len(json.dumps(body)) / 1024
    print(
        f"request: {result.units['text.tokens']:.0f} text tokens, 2 x 1920x1080 JPEG, "
        f"20 s WAV; body {size_kb:.0f} kB; profile {PROFILE}"
    )
    print(f"modtrace count (headers only)   {t_modtrace * 1e6:10.1f} us")
    print(f"naive (full decode + tokenize)  {t_naive * 1e6:10.1f} us")
    print(f"  speed-up naive / modtrace     {t_naive / t_modtrace:10.1f} x   (goal >= 50 x)")
    print(f"fixed cost of any request       {t_empty * 1e6:10.1f} us  (subtracted below)")
    print(f"image + audio parts             {t_media * 1e6:10.1f} us")
    print(f"text tokenization               {t_text * 1e6:10.1f} us")
    print(f"  media / text                  {t_media / t_text:10.2f}     (goal < 1)")


if __name__ == "__main__":
    main()
