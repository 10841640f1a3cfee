"""Distributed checkpoints of a megatron-core training state: model, optimizer and RNG, sharded over ranks.

The model and optimizer go through ``megatron.core.dist_checkpointing`` (every rank writes its shards into one
directory; a different TP/PP layout can read them back). Each rank also writes ``extra_<rank>.pt``: megatron's
CUDA RNG tracker states (dropout streams per TP rank) and the caller's ``extra`` dict (e.g. the step count).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def _sharded(chunks: list[torch.nn.Module], optimizer: Any, is_loading: bool) -> dict[str, Any]:
    """The sharded state dict: ``model`` (or ``model0``, ``model1``... per virtual stage) and ``optimizer``."""
    if len(chunks) == 1:
        state = {"model": chunks[0].sharded_state_dict()}
        model_state = state["model"]
    else:
        state = {f"model{i}": c.sharded_state_dict() for i, c in enumerate(chunks)}
        model_state = {k: v for i in range(len(chunks)) for k, v in state[f"model{i}"].items()}
    state["optimizer"] = optimizer.sharded_state_dict(model_state, is_loading=is_loading)
    return state


def _rng_tracker() -> Any:
    from megatron.core import tensor_parallel

    return tensor_parallel.get_cuda_rng_tracker()


def save(path: str, chunks: list[torch.nn.Module], optimizer: Any, extra: dict[str, Any]) -> None:
    """Write the checkpoint into directory ``path`` (collective: every rank of the role calls it)."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    out = Path(path)
    if dist.get_rank() == 0:
        out.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    dist_checkpointing.save(_sharded(chunks, optimizer, False), str(out))
    rng = _rng_tracker().get_states() if torch.cuda.is_available() else {}
    torch.save({"rng_tracker": rng, **extra}, out / f"extra_{dist.get_rank()}.pt")
    dist.barrier()


def load(path: str, chunks: list[torch.nn.Module], optimizer: Any) -> dict[str, Any]:
    """Restore what :func:`save` wrote; returns the ``extra`` dict of this rank."""
    import torch.distributed as dist
    from megatron.core import dist_checkpointing

    state = dist_checkpointing.load(_sharded(chunks, optimizer, True), path)
    for i, chunk in enumerate(chunks):
        chunk.load_state_dict(state["model" if len(chunks) == 1 else f"model{i}"])
    optimizer.load_state_dict(state["optimizer"])
    extra = torch.load(Path(path) / f"extra_{dist.get_rank()}.pt", weights_only=False)
    rng = extra.pop("rng_tracker", {})
    if rng and torch.cuda.is_available():
        _rng_tracker().set_states(rng)
    return extra
