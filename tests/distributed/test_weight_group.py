"""Weight group on CPU (gloo): roll's sender (rank 0) broadcasts buckets to receivers in other processes, one joined
the way SGLang's engine joins (``weight_group_peer.py sglang``) and one through roll's own :class:`WeightGroup`;
both must receive bit-identical tensors. Also: the bucket plan the receivers get equals the buckets the sender
iterates (names, dtypes, shapes, order), for plain tensors and for the DeepSpeed strategy's ``weight_buckets``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from roll.distributed.group import free_port
from roll.weights.buckets import BucketMeta, bucket_meta, iter_buckets, plan_bucket_metas
from roll.weights.group import BACKEND_DEVICE, WeightGroup, prefixed_store
from tests.distributed.weight_group_peer import digest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def _weights() -> list[tuple[str, torch.Tensor]]:
    """Mixed dtypes and shapes, one tensor larger than a bucket, one non-contiguous (a transposed view)."""
    g = torch.Generator().manual_seed(0)
    return [
        ("embed.weight", torch.randn(40, 8, generator=g).to(torch.bfloat16)),
        ("layers.0.q.weight", torch.randn(8, 8, generator=g)),
        ("layers.0.norm.weight", torch.randn(8, generator=g).to(torch.bfloat16)),
        ("layers.0.mlp.weight", torch.randn(16, 8, generator=g).t()),
        ("layers.0.mlp.bias", torch.randn(16, generator=g)),
        ("head.scale", torch.tensor([1.5])),
    ]


def test_plan_matches_sender_buckets():
    weights = _weights()
    metas = plan_bucket_metas([(n, t.shape, t.dtype) for n, t in weights], bucket_bytes=300)
    assert metas == [bucket_meta(b) for b in iter_buckets(weights, 300)]
    assert [n for m in metas for n in m.names] == [n for n, _ in weights]
    assert metas[0].names == ["embed.weight"] and metas[0].nbytes == 40 * 8 * 2  # 640 B > 300: alone
    assert metas[-1].dtypes[-1] == "float32" and metas[-1].shapes[-1] == [1]
    skipped = plan_bucket_metas([(n, t.shape, t.dtype) for n, t in weights], 300, skip={"embed.weight"})
    assert "embed.weight" not in [n for m in skipped for n in m.names]
    assert BucketMeta(**metas[1].to_dict()) == metas[1]  # crosses to workers as a dict and back


def test_store_prefixes_and_bad_backend():
    assert BACKEND_DEVICE == {"nccl": "cuda", "gloo": "cpu"}
    from torch.distributed import HashStore

    base = HashStore()
    base.set_timeout(timedelta(seconds=1))  # a wrong key fails fast instead of waiting for it
    prefixed_store(base, "g", "gloo").set("k", b"v")
    assert base.get("g/g//cpu//k") == b"v"  # PrefixStore(group) > "{group}/" > "{device}/", each joined with "/"
    with pytest.raises(ValueError, match="'mpi'"):
        prefixed_store(base, "g", "mpi")
    with pytest.raises(ValueError, match="rank 3 is outside world_size 2"):
        WeightGroup("127.0.0.1", 1, 3, 2, "g", backend="gloo")


def _peer(port: int, rank: int, world: int, metas: Path, kind: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen(
        [sys.executable, str(HERE / "weight_group_peer.py"), str(port), str(rank), str(world), str(metas), kind],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def test_gloo_broadcast_reaches_sglang_style_and_roll_receivers(tmp_path):
    """World of 3 (like a trainer and one engine with TP 2): rank 1 joins SGLang's way, rank 2 roll's way."""
    weights = _weights()
    metas = plan_bucket_metas([(n, t.shape, t.dtype) for n, t in weights], bucket_bytes=300)
    path = tmp_path / "metas.json"
    path.write_text(json.dumps([m.to_dict() for m in metas]))
    port = free_port()
    peers = [_peer(port, 1, 3, path, "sglang"), _peer(port, 2, 3, path, "roll")]
    try:
        group = WeightGroup("127.0.0.1", port, 0, 3, "roll_weights", backend="gloo", timeout_s=60)
        by_name = dict(weights)
        for meta in metas:
            group.send_bucket([(n, by_name[n]) for n in meta.names])
        outs = [p.communicate(timeout=60) for p in peers]
        group.close()
    finally:
        for p in peers:
            p.kill()
    expected = {n: digest(t) for n, t in weights}
    for (out, err), kind in zip(outs, ("sglang", "roll")):
        assert out.strip(), f"{kind} receiver printed nothing: {err[-2000:]}"
        assert json.loads(out.strip().splitlines()[-1]) == expected, kind


def test_send_bucket_rejects_tensors_on_the_wrong_device():
    group = SimpleNamespace(device=torch.device("cuda", 0), group_name="g", backend_name="nccl")
    with pytest.raises(ValueError, match="sends cuda tensors"):
        WeightGroup.send_bucket(group, [("w", torch.zeros(2))])


def test_deepspeed_weight_buckets_follow_the_plan():
    """``DeepSpeedTrainStrategy.weight_bucket_metas`` / ``weight_buckets`` over a plain module (ZeRO stage 0: the
    gather is off): the bucket tensors are the parameters themselves, in plan order."""
    pytest.importorskip("deepspeed")
    from roll.strategies.deepspeed_train import DeepSpeedTrainStrategy

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Embedding(30, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 30))
    module[2].weight = module[0].weight  # tied: one parameter, listed once
    strategy = DeepSpeedTrainStrategy.__new__(DeepSpeedTrainStrategy)
    strategy.engine = SimpleNamespace(module=module)
    strategy.ds_config = {"zero_optimization": {"stage": 0}}
    strategy.export = None  # full weights (a LoRA actor exports merged weights through its plan)
    metas = strategy.weight_bucket_metas(bucket_bytes=1000)
    buckets = list(strategy.weight_buckets(bucket_bytes=1000))
    assert metas == [bucket_meta(b) for b in buckets]
    params = dict(module.named_parameters())
    assert [n for m in metas for n in m.names] == list(params)  # "2.weight" (tied) is not a separate parameter
    assert all(t.data_ptr() == params[n].data_ptr() for b in buckets for n, t in b)
