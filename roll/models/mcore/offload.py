"""Moving a megatron-core training state (weights, gradient buffers, optimizer) to CPU memory and back.

Gradient buffers are empty between steps (zeroed before each), so their storage is freed and re-created rather
than copied. Weights held in a DDP parameter buffer (distributed optimizer) move as that one buffer; the others,
and the optimizer's fp32 master weights and Adam states, move tensor by tensor (``.data`` swapped in place, so
every holder of the parameter object sees the move).
"""

from __future__ import annotations

from typing import Any

import torch


def _buffers(model: list[torch.nn.Module]) -> list[Any]:
    return [b for m in model for b in list(getattr(m, "buffers", [])) + list(getattr(m, "expert_parallel_buffers", []))]


def offload(model: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
    """Move everything to CPU; returns what :func:`reload` needs."""
    state: dict[str, Any] = {"param_data": [], "grad_data": [], "tensors": []}
    in_buffers = set()
    for buf in _buffers(model):
        if getattr(buf, "param_data", None) is not None:
            state["param_data"].append((buf.param_data, buf.param_data.to("cpu", copy=True).pin_memory()))
            in_buffers.update(id(p) for p in buf.params)
            buf.param_data.untyped_storage().resize_(0)
        if getattr(buf, "grad_data", None) is not None:
            state["grad_data"].append((buf.grad_data, buf.grad_data.untyped_storage().size()))
            buf.grad_data.untyped_storage().resize_(0)
    tensors = [p for m in model for p in m.parameters() if id(p) not in in_buffers]
    for opt in optimizers:
        for group in opt.param_groups:
            tensors += group["params"]
        for per_param in opt.state.values():
            tensors += [v for k, v in per_param.items() if torch.is_tensor(v) and v.is_cuda]
    seen = set()
    for t in tensors:
        if id(t) in seen or not t.is_cuda:
            continue
        seen.add(id(t))
        t.data = t.data.to("cpu", non_blocking=True)
        state["tensors"].append(t)
    torch.cuda.synchronize()
    return state


def reload(state: dict[str, Any], device: torch.device) -> None:
    """Undo :func:`offload` onto ``device``."""
    for gpu, size in state["grad_data"]:
        gpu.untyped_storage().resize_(size)
        gpu.zero_()
    for gpu, cpu in state["param_data"]:
        gpu.untyped_storage().resize_(cpu.numel() * cpu.element_size())
        gpu.copy_(cpu, non_blocking=True)
    for t in state["tensors"]:
        t.data = t.data.to(device, non_blocking=True)
    torch.cuda.synchronize()
