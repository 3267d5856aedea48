"""Cost of ``StepLedger.record_step`` per engine step, against a bare float split.

The baseline is the least an engine could do to share a step: one float
division per request added into a plain dict (no validation, no lock, no
exact integers). Both run in the same process on the same batches, so the
ratio is what the ledger's exactness and safety cost.

Run: ``.venv/bin/python benchmarks/bench_ledger.py [--batch 64] [--steps 20000]``
"""

from __future__ import annotations

import argparse
import random
import time
from collections import defaultdict
from collections.abc import Callable

from modtrace.timing import StepLedger


def _batches(batch: int, steps: int, seed: int) -> list[tuple[float, dict[str, int]]]:
    """Steps of ``batch`` requests: decode-like (1 token) and prefill-like (many)."""
    rng = random.Random(seed)
    ids = [f"req-{i}" for i in range(batch * 4)]
    out = []
    for step in range(steps):
        members = rng.sample(ids, batch)
        prefill = step % 8 == 0
        tokens = {r: rng.randint(1, 2048) if prefill else 1 for r in members}
        out.append((rng.uniform(0.005, 0.050), tokens))
    return out


def _best_of(repeats: int, run: Callable[[], None]) -> float:
    """The fastest of ``repeats`` timed runs, in seconds."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    """Time both on the same batches and print per-step microseconds and the ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=64, help="requests per step")
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    batches = _batches(args.batch, args.steps, seed=0)

    def bare() -> None:
        seconds: defaultdict[str, float] = defaultdict(float)
        for duration, tokens in batches:
            total = sum(tokens.values())
            for request_id, count in tokens.items():
                seconds[request_id] += duration * count / total

    def ledger() -> None:
        book = StepLedger()
        for duration, tokens in batches:
            book.record_step(duration, tokens, "decode")

    bare_s = _best_of(args.repeats, bare)
    ledger_s = _best_of(args.repeats, ledger)
    per_step = 1e6 / args.steps
    print(f"batch={args.batch} steps={args.steps} (best of {args.repeats})")
    print(f"bare dict split : {bare_s * per_step:8.2f} us/step")
    print(f"StepLedger      : {ledger_s * per_step:8.2f} us/step")
    print(f"ratio           : {ledger_s / bare_s:8.2f}x")


if __name__ == "__main__":
    main()
