"""Moving a megatron-core training state (weights, gradient buffers, optimizer) to CPU memory and back.

Every tensor stays on its device: only its storage is emptied (``untyped_storage().resize_(0)``) after a copy to
pinned CPU memory, and refilled on reload. A parameter is never re-bound (``param.data = cpu_tensor``): a change of
device drops the parameter's gradient accumulator, and with it the hooks megatron's DDP registered there, which
copy each gradient into the DDP gradient buffer. A re-bound actor then trains with an all-zero gradient buffer
(grad norm 0, no update): that is what the agentic pipeline's colocated Megatron actor did before this module kept
storages in place. Gradient buffers are empty between steps (zeroed before each), so their storage is freed and
re-created without a copy.
"""

from __future__ import annotations

from typing import Any

import torch


def _buffers(model: list[torch.nn.Module]) -> list[Any]:
    return [b for m in model for b in list(getattr(m, "buffers", [])) + list(getattr(m, "expert_parallel_buffers", []))]


def _bytes(storage: torch.UntypedStorage, device: torch.device) -> torch.Tensor:
    """A uint8 tensor over the whole of ``storage``."""
    return torch.empty(0, dtype=torch.uint8, device=device).set_(storage)


def offload(model: list[torch.nn.Module], optimizers: list[torch.optim.Optimizer]) -> dict[str, Any]:
    """Copy weights and optimizer states to pinned CPU memory and free their device storage; free the gradient
    buffers. Returns what :func:`reload` needs."""
    grads, tensors = [], []
    for buf in _buffers(model):
        if getattr(buf, "param_data", None) is not None:
            tensors.append(buf.param_data)
        if getattr(buf, "grad_data", None) is not None:
            grads.append(buf.grad_data)
    tensors += [p for m in model for p in m.parameters()]
    for opt in optimizers:
        for group in opt.param_groups:
            tensors += group["params"]
        for per_param in opt.state.values():
            tensors += [v for v in per_param.values() if torch.is_tensor(v)]
    state: dict[str, Any] = {"grad": [], "moved": []}
    grad_ptrs = set()
    for g in grads:
        storage = g.untyped_storage()
        grad_ptrs.add(storage.data_ptr())
        state["grad"].append((g, storage.size()))
    seen = set(grad_ptrs)
    for t in tensors:
        storage = t.untyped_storage()
        if not t.is_cuda or storage.size() == 0 or storage.data_ptr() in seen:
            continue  # a parameter inside a DDP buffer moves with the buffer's storage
        seen.add(storage.data_ptr())
        cpu = torch.empty(storage.size(), dtype=torch.uint8, pin_memory=True)
        cpu.copy_(_bytes(storage, t.device), non_blocking=True)
        state["moved"].append((storage, t.device, cpu))
    torch.cuda.synchronize()
    for storage, _, _ in state["moved"]:
        storage.resize_(0)
    for g, _ in state["grad"]:
        g.untyped_storage().resize_(0)
    return state


def reload(state: dict[str, Any], device: torch.device) -> None:
    """Undo :func:`offload` (each storage returns to the device it came from; ``device`` is that device)."""
    for g, size in state["grad"]:
        g.untyped_storage().resize_(size)
        g.zero_()
    for storage, dev, cpu in state["moved"]:
        storage.resize_(cpu.numel())
        _bytes(storage, dev).copy_(cpu, non_blocking=True)
    torch.cuda.synchronize()
