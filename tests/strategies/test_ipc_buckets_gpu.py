"""CUDA IPC weight buckets between two real processes on one GPU (skipped without a GPU; run on the GPU machine by
``scripts/verify_gpu_step.sh``). The CPU half (flattening, the payload's refusal of CPU tensors) is in
``tests/distributed/test_weight_sync.py``."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (CUDA IPC); verified on the GPU machine"
)

CHILD = """
import sys, torch
from roll.weights.ipc import open_bucket
named = open_bucket(sys.stdin.buffer.read())
for name, t in named:
    print("|".join([name, t.device.type, str(t.dtype).removeprefix("torch."), str(tuple(t.shape)),
                    repr(float(t.float().sum()))]))
"""


def test_payload_opens_in_another_process_without_copy():
    from roll.weights.ipc import payload_globals, share_bucket

    gen = torch.Generator(device="cuda").manual_seed(0)
    named = [
        ("a.weight", torch.randn(64, 32, device="cuda", dtype=torch.bfloat16, generator=gen)),
        ("a.bias", torch.randn(64, device="cuda", generator=gen)),
        ("b.weight", torch.randn(8, 8, device="cuda", dtype=torch.float16, generator=gen)),
    ]
    payload, buffer = share_bucket(named)
    assert len(payload) < 4096  # a handle and metadata, not the weights
    # only what SGLang's safe unpickler accepts (torch.*, types.*, builtins / copyreg)
    assert all(
        g.split(".")[0] in {"torch", "types", "builtins", "copyreg", "collections"} for g in payload_globals(payload)
    ), payload_globals(payload)
    out = subprocess.run([sys.executable, "-c", CHILD], input=payload, capture_output=True, timeout=120)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    lines = out.stdout.decode().split("\n")
    for (name, t), line in zip(named, lines):
        got_name, device, dtype, shape, total = line.split("|")
        assert (got_name, device, dtype) == (name, "cuda", str(t.dtype).removeprefix("torch."))
        assert shape == str(tuple(t.shape))
        assert float(total) == pytest.approx(float(t.float().sum()), rel=1e-6, abs=1e-4)
    del buffer
