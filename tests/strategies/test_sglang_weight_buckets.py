"""Weight bucketing (CPU): greedy byte-size buckets, order kept, oversize tensors alone, skipped names dropped."""

from __future__ import annotations

import pytest
import torch

from roll.weights.buckets import BucketMeta, bucket_meta, iter_buckets, plan_buckets, tensor_nbytes


def test_plan_buckets_hand_computed():
    # 4+4 fit in 8; the third 4 would make 12 -> new bucket; 10 > 8 alone; 1 cannot join the full 10-bucket
    assert plan_buckets([4, 4, 4, 10, 1], 8) == [[0, 1], [2], [3], [4]]
    assert plan_buckets([1, 1, 1], 100) == [[0, 1, 2]]
    assert plan_buckets([], 8) == []
    assert plan_buckets([0, 8, 0], 8) == [[0, 1, 2]]


def test_plan_buckets_rejects_bad_sizes():
    with pytest.raises(ValueError, match="bucket_bytes=0"):
        plan_buckets([1], 0)
    with pytest.raises(ValueError, match=r"sizes\[1\]=-3"):
        plan_buckets([1, -3], 8)


def test_iter_buckets_matches_plan_and_keeps_order():
    named = [(f"w{i}", torch.zeros(n, dtype=torch.bfloat16)) for i, n in enumerate([3, 5, 2, 20, 1, 1])]
    buckets = list(iter_buckets(named, bucket_bytes=16))  # bf16: 2 bytes/element -> sizes 6, 10, 4, 40, 2, 2
    assert [[n for n, _ in b] for b in buckets] == [["w0", "w1"], ["w2"], ["w3"], ["w4", "w5"]]
    plan = plan_buckets([tensor_nbytes(t) for _, t in named], 16)
    assert [[int(n[1:]) for n, _ in b] for b in buckets] == plan
    assert [n for b in buckets for n, _ in b] == [n for n, _ in named]


def test_iter_buckets_skips_names_and_streams():
    def gen():  # a generator: buckets must be produced without materialising the whole model
        for i in range(4):
            yield (f"layer{i}", torch.ones(2, 2))
        yield ("lm_head.weight", torch.ones(2, 2))

    buckets = list(iter_buckets(gen(), bucket_bytes=32, skip={"lm_head.weight"}))  # fp32 2x2 = 16 bytes
    assert [[n for n, _ in b] for b in buckets] == [["layer0", "layer1"], ["layer2", "layer3"]]


def test_bucket_meta():
    bucket = [("a", torch.zeros(2, 3, dtype=torch.bfloat16)), ("b", torch.zeros(4, dtype=torch.float32))]
    meta = bucket_meta(bucket)
    assert meta == BucketMeta(names=["a", "b"], dtypes=["bfloat16", "float32"], shapes=[[2, 3], [4]])
    assert meta.nbytes == 2 * 3 * 2 + 4 * 4
