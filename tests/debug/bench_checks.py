"""Cost of strict batch validation: seconds per full :func:`check_batch` on realistic batches (not a test).

Run: ``.venv/bin/python tests/debug/bench_checks.py``; prints B, L, milliseconds per check (median of 20).
"""

from __future__ import annotations

import statistics
import time

import torch

from roll.data.batch import Batch
from roll.data.checks import check_batch


def realistic_batch(n: int, width: int, seed: int = 0) -> Batch:
    """``n`` samples right-padded to ``width``: random lengths, alternating prompt/response turns, all keys of a
    training batch after advantages (float32 log-prob-aligned keys, score on the last response token)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(width // 2, width + 1, (n,), generator=gen)
    pos = torch.arange(width)[None]
    attn = (pos < lengths[:, None]).long()
    turn = (pos // 48) % 2  # 48-token turns: even = prompt, odd = response
    resp = attn * turn
    ids = torch.randint(1, 1000, (n, width), generator=gen) * attn
    scores = torch.randn(n, generator=gen)
    tls = torch.zeros(n, width - 1)
    shifted = resp[:, 1:]
    last = (shifted * torch.arange(width - 1)).argmax(1)
    has = shifted.sum(1) > 0
    tls[has, last[has]] = scores[has]
    tensors = {
        "input_ids": ids,
        "attention_mask": attn,
        "response_mask": resp,
        "scores": scores,
        "token_level_scores": tls,
    }
    for key in ("old_log_probs", "ref_log_probs", "advantages", "returns"):
        tensors[key] = torch.randn(n, width - 1, generator=gen)
    meta = {"traj_id": [str(i) for i in range(n)], "group_id": [i // 8 for i in range(n)]}
    return Batch(tensors, meta)


def bench(n: int, width: int, reps: int = 20) -> float:
    """Median seconds of one :func:`check_batch` on ``realistic_batch(n, width)``."""
    batch = realistic_batch(n, width)
    check_batch(batch, "bench")  # the batch is valid
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        check_batch(batch, "bench")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


if __name__ == "__main__":
    torch.set_num_threads(1)
    for n, width in [(64, 768), (256, 2048), (512, 4096)]:
        print(f"B={n:4d} L={width:5d}: {bench(n, width) * 1e3:8.2f} ms per check")
