"""A receiving member of a gloo weight group, run as its own process by ``test_weight_group.py``.

``python weight_group_peer.py PORT RANK WORLD_SIZE METAS_JSON KIND`` receives the buckets of ``METAS_JSON`` (a list
of ``BucketMeta`` dicts) from rank 0 and prints ``{name: sha256 of the received bytes}`` as JSON.

KIND ``roll``: :class:`roll.weights.group.WeightGroup`. KIND ``sglang``: a stand-in for SGLang's engine
side, which joins the way SGLang 0.5.16 does (``tcp://`` rendezvous, ``PrefixStore(group_name)``, torch's own
process-group constructor, then ``torch.distributed.broadcast(..., async_op=True)`` per tensor), so the test checks
that roll's sender finds the store keys and collective order of that construction.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from datetime import timedelta

import torch

GROUP = "roll_weights"


def sglang_style_group(init_method: str, rank: int, world_size: int, backend: str = "gloo"):
    """Join like SGLang's ``init_custom_process_group``: rendezvous store under ``PrefixStore(GROUP)``, then
    torch's group constructor (not ``new_group``: this process has no default group)."""
    from torch.distributed.distributed_c10d import Backend, PrefixStore, _new_process_group_helper, _world
    from torch.distributed.rendezvous import rendezvous

    timeout = timedelta(seconds=60)
    store, rank, world_size = next(rendezvous(init_method, rank, world_size, timeout=timeout))
    store.set_timeout(timeout)
    options = (
        "backend_options"
        if "backend_options" in inspect.signature(_new_process_group_helper).parameters
        else "pg_options"
    )
    pg, _ = _new_process_group_helper(
        world_size,
        rank,
        [],
        Backend(backend),
        PrefixStore(GROUP, store),
        group_name=GROUP,
        timeout=timeout,
        **{options: None},
    )
    _world.pg_group_ranks[pg] = {i: i for i in range(world_size)}
    return pg


def receive_sglang_style(pg, meta: dict) -> list[tuple[str, torch.Tensor]]:
    """One bucket the way the engine receives it: allocate, post every broadcast, then wait for all."""
    import torch.distributed as dist

    tensors = [torch.empty(shape, dtype=getattr(torch, dtype)) for dtype, shape in zip(meta["dtypes"], meta["shapes"])]
    handles = [dist.broadcast(t, src=0, group=pg, async_op=True) for t in tensors]
    for h in handles:
        h.wait()
    return list(zip(meta["names"], tensors))


def digest(tensor: torch.Tensor) -> str:
    """sha256 of a tensor's bytes (exact equality, any dtype)."""
    return hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()


def main(port: int, rank: int, world_size: int, metas_path: str, kind: str) -> None:
    metas = json.loads(open(metas_path).read())
    received: list[tuple[str, torch.Tensor]] = []
    if kind == "sglang":
        pg = sglang_style_group(f"tcp://127.0.0.1:{port}", rank, world_size)
        for meta in metas:
            received += receive_sglang_style(pg, meta)
    else:
        from roll.weights.buckets import BucketMeta
        from roll.weights.group import WeightGroup

        group = WeightGroup("127.0.0.1", port, rank, world_size, GROUP, backend="gloo", timeout_s=60)
        for meta in metas:
            received += group.receive_bucket(BucketMeta(**meta))
        group.close()
    print(json.dumps({name: digest(t) for name, t in received}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
