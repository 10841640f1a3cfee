"""Weight sync helpers: split named tensors into byte-size buckets, describe them for a distributed broadcast.

A weight sync sends the whole model (0.5B parameters = 1 GB in bf16) from the trainer to the inference engine.
Sending it in buckets of ``bucket_bytes`` bounds the extra memory a sync needs on either side (one bucket, not a
second copy of the model) and lets the engine load bucket k while bucket k+1 is being prepared.

Bucketing rule (greedy, order-preserving): tensors are taken in the given order; a tensor joins the current bucket
if the bucket's bytes plus its bytes stay <= ``bucket_bytes``, else it starts a new bucket. A tensor larger than
``bucket_bytes`` gets a bucket of its own (tensors are never split). No bucket is empty.

Distributed sync: the trainer plans the buckets once from the weights' names, full shapes and dtypes
(:func:`plan_bucket_metas`); the receivers allocate from those :class:`BucketMeta` and the trainer broadcasts the
tensors of each bucket in the same order, so names, dtypes and shapes agree by construction.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

import torch

from roll.config.strategies import DEFAULT_BUCKET_BYTES  # noqa: F401  (512 MiB: two buckets for a 0.5B bf16 model)

NamedTensors = list[tuple[str, torch.Tensor]]


def tensor_nbytes(tensor: torch.Tensor) -> int:
    """Bytes of a tensor's elements: ``numel * element_size``."""
    return tensor.numel() * tensor.element_size()


def plan_buckets(sizes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``sizes`` grouped into buckets by the greedy rule of the module docstring.

    >>> plan_buckets([4, 4, 4, 10, 1], 8)
    [[0, 1], [2], [3], [4]]
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes}: must be > 0 (e.g. {DEFAULT_BUCKET_BYTES} for 512 MiB)")
    buckets: list[list[int]] = []
    used = 0
    for i, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"sizes[{i}]={size}: tensor sizes must be >= 0")
        if buckets and used + size <= bucket_bytes:
            buckets[-1].append(i)
            used += size
        else:
            buckets.append([i])
            used = size
    return buckets


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int, skip: frozenset[str] | set[str] = frozenset()
) -> Iterator[NamedTensors]:
    """Yield ``(name, tensor)`` buckets of at most ``bucket_bytes`` (see :func:`plan_buckets`).

    Streams: only the current bucket is held, so a generator of gathered tensors is never materialised whole.
    Names in ``skip`` are dropped (e.g. ``lm_head.weight`` of a tied-embedding model, which SGLang does not have).
    """
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes={bucket_bytes}: must be > 0 (e.g. {DEFAULT_BUCKET_BYTES} for 512 MiB)")
    bucket: NamedTensors = []
    used = 0
    for name, tensor in named_tensors:
        if name in skip:
            continue
        size = tensor_nbytes(tensor)
        if bucket and used + size > bucket_bytes:
            yield bucket
            bucket, used = [], 0
        bucket.append((name, tensor))
        used += size
    if bucket:
        yield bucket


@dataclass(frozen=True)
class BucketMeta:
    """What a receiver needs to allocate a broadcast bucket: names, dtype names ("bfloat16") and shapes."""

    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]

    @property
    def nbytes(self) -> int:
        """Total bytes of the bucket's tensors."""
        total = 0
        for dtype, shape in zip(self.dtypes, self.shapes):
            numel = 1
            for d in shape:
                numel *= d
            total += numel * torch.empty((), dtype=getattr(torch, dtype)).element_size()
        return total

    def to_dict(self) -> dict[str, list]:
        """Plain fields (what crosses to a worker: ``SGLangStrategy.update_weights_distributed`` takes dicts)."""
        return asdict(self)


def bucket_meta(bucket: NamedTensors) -> BucketMeta:
    """The :class:`BucketMeta` of a bucket (dtype names as SGLang's ``update_weights_from_distributed`` wants)."""
    return BucketMeta(
        names=[n for n, _ in bucket],
        dtypes=[dtype_name(t.dtype) for _, t in bucket],
        shapes=[list(t.shape) for _, t in bucket],
    )


#: ``(name, full shape, dtype)`` of one weight, as the receiver allocates it.
WeightSpec = tuple[str, "list[int] | torch.Size", torch.dtype]


def plan_bucket_metas(
    specs: Iterable[WeightSpec], bucket_bytes: int, skip: frozenset[str] | set[str] = frozenset()
) -> list[BucketMeta]:
    """Buckets of weights described by ``specs`` (no tensor needed: ZeRO-3 shards report their full shape), by the
    same greedy rule as :func:`iter_buckets`, so ``iter_buckets`` over the tensors gives the same buckets.

    >>> [m.names for m in plan_bucket_metas([("a", [2], torch.float32), ("b", [2], torch.float32)], 8)]
    [['a'], ['b']]
    """
    kept = [(n, [int(d) for d in shape], dtype) for n, shape, dtype in specs if n not in skip]
    sizes = [math.prod(shape) * torch.empty((), dtype=dtype).element_size() for _, shape, dtype in kept]
    return [
        BucketMeta(
            names=[kept[i][0] for i in idx],
            dtypes=[dtype_name(kept[i][2]) for i in idx],
            shapes=[kept[i][1] for i in idx],
        )
        for idx in plan_buckets(sizes, bucket_bytes)
    ]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (the form SGLang's ``update_weights_from_distributed`` takes)."""
    return str(dtype).removeprefix("torch.")
