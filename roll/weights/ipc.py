"""Zero-copy weight buckets between processes on one GPU: a flattened bucket shared by CUDA IPC.

A bucket of weights is flattened into one contiguous ``uint8`` buffer on the trainer's GPU (:func:`flatten_bucket`:
every tensor a byte range, any mix of dtypes), and the buffer is shared by one CUDA IPC handle. The payload
(:func:`share_bucket`) is the ForkingPickler byte string of ``{"flattened_tensor": buffer, "metadata": [entry...]}``
with entries carrying ``name, shape, dtype, start_idx, end_idx, numel``: SGLang's ``flattened_bucket`` load format,
so an SGLang engine opens it in its scheduler process with ``update_weights_from_tensor(payloads,
load_format="flattened_bucket")``; :func:`open_bucket` opens it anywhere else (``hf_infer``).

The device travels as the GPU's UUID rather than an index (SGLang's receiver maps UUIDs; :func:`open_bucket` does
too): processes that see different ``CUDA_VISIBLE_DEVICES`` still open the right GPU. The pickle references only
``torch`` and ``types`` (SGLang's safe unpickler accepts those). The sender must keep the buffer alive until every
receiver has loaded it; no host copy is made anywhere.
"""

from __future__ import annotations

import io
import pickle
import types
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.reduction import ForkingPickler
from typing import Any

import torch

from roll.weights.buckets import NamedTensors, tensor_nbytes

#: Position of the device argument in ``torch.multiprocessing.reductions.rebuild_cuda_tensor``'s arguments.
_DEVICE_ARG = 6


@dataclass(frozen=True)
class Slot:
    """Where one tensor of a flattened bucket lives: bytes ``[start_idx, end_idx)`` of the buffer."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int


def flatten_bucket(named: NamedTensors) -> tuple[torch.Tensor, list[Slot]]:
    """One contiguous uint8 buffer on the tensors' device (a copy) and the slot of each tensor."""
    if not named:
        raise ValueError("flatten_bucket: an empty bucket")
    total = sum(tensor_nbytes(t) for _, t in named)
    buffer = torch.empty(total, dtype=torch.uint8, device=named[0][1].device)
    slots, offset = [], 0
    for name, tensor in named:
        size = tensor_nbytes(tensor)
        buffer[offset : offset + size].copy_(tensor.detach().contiguous().view(-1).view(torch.uint8))
        slots.append(Slot(name, tuple(tensor.shape), tensor.dtype, offset, offset + size, size))
        offset += size
    return buffer, slots


def unflatten_bucket(buffer: torch.Tensor, slots: list[Any]) -> NamedTensors:
    """Views of ``buffer`` as the bucket's tensors (no copy): the inverse of :func:`flatten_bucket`. ``slots`` may
    be any objects with the :class:`Slot` attributes."""
    return [(s.name, buffer[s.start_idx : s.end_idx].view(s.dtype).view(tuple(s.shape))) for s in slots]


class _SharedCudaTensor:
    """Pickles as ``rebuild_cuda_tensor(...)`` with the device given by UUID (see the module docstring)."""

    def __init__(self, tensor: torch.Tensor):
        from torch.multiprocessing import reductions

        rebuild, args = reductions.reduce_tensor(tensor)
        args = list(args)
        args[_DEVICE_ARG] = str(torch.cuda.get_device_properties(args[_DEVICE_ARG]).uuid)
        self.reduced = (rebuild, tuple(args))

    def __reduce__(self):
        return self.reduced


def share_bucket(named: NamedTensors) -> tuple[bytes, torch.Tensor]:
    """The IPC payload of a bucket of CUDA tensors and the flattened buffer it points to (keep it alive until the
    receivers are done)."""
    buffer, slots = flatten_bucket(named)
    if buffer.device.type != "cuda":
        raise ValueError(f"share_bucket: tensors are on {buffer.device}; CUDA IPC needs GPU tensors")
    meta = [
        types.SimpleNamespace(
            name=s.name,
            shape=torch.Size(s.shape),
            dtype=s.dtype,
            start_idx=s.start_idx,
            end_idx=s.end_idx,
            numel=s.numel,
        )
        for s in slots
    ]
    out = io.BytesIO()
    ForkingPickler(out).dump({"flattened_tensor": _SharedCudaTensor(buffer), "metadata": meta})
    return out.getvalue(), buffer


def _rebuild_by_uuid(*args: Any) -> torch.Tensor:
    """``rebuild_cuda_tensor`` with a device UUID mapped to this process's index of that GPU."""
    from torch.multiprocessing import reductions

    args = list(args)
    device = args[_DEVICE_ARG]
    if isinstance(device, str):
        uuids = {str(torch.cuda.get_device_properties(i).uuid): i for i in range(torch.cuda.device_count())}
        if device not in uuids:
            raise RuntimeError(
                f"open_bucket: GPU {device} is not visible in this process (CUDA_VISIBLE_DEVICES); "
                f"CUDA IPC needs sender and receiver on the same GPU"
            )
        args[_DEVICE_ARG] = uuids[device]
    return reductions.rebuild_cuda_tensor(*args)


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"):
            return _rebuild_by_uuid
        return super().find_class(module, name)


def open_bucket(payload: bytes) -> NamedTensors:
    """The tensors of a payload from :func:`share_bucket`, as views of the sender's GPU buffer (no copy)."""
    data = _Unpickler(io.BytesIO(payload)).load()
    return unflatten_bucket(data["flattened_tensor"], data["metadata"])


class _Reduced:
    """A pickled call kept unmade: pickles again as the same call (:func:`rename_payload`)."""

    def __init__(self, fn: Any, args: tuple):
        self.fn, self.args = fn, args

    def __reduce__(self):
        return self.fn, self.args


class _KeepingUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        fn = super().find_class(module, name)
        if (module, name) == ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"):
            return lambda *args: _Reduced(fn, args)
        return fn


def rename_payload(payload: bytes, rename: Callable[[str], str]) -> bytes:
    """A payload of :func:`share_bucket` with every tensor's name passed through ``rename``; the CUDA IPC handle is
    carried over unopened (this process need not see the GPU)."""
    data = _KeepingUnpickler(io.BytesIO(payload)).load()
    for slot in data["metadata"]:
        slot.name = rename(slot.name)
    out = io.BytesIO()
    ForkingPickler(out).dump(data)
    return out.getvalue()


def payload_globals(payload: bytes) -> set[str]:
    """``module.name`` of every global a payload's pickle loads (what an unpickler must allow)."""
    import pickletools

    found, pushed, memo, last = set(), [], [], None
    for op, arg, _ in pickletools.genops(payload):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
            pushed.append(arg)
            last = arg
            continue
        if op.name == "MEMOIZE":  # every memoized object takes the next index; strings are all we track
            memo.append(last)
        elif op.name in ("BINGET", "LONG_BINGET", "GET"):
            value = memo[int(arg)] if int(arg) < len(memo) else None
            if value is not None:
                pushed.append(value)
        elif op.name == "STACK_GLOBAL":
            found.add(f"{pushed[-2]}.{pushed[-1]}")
        elif op.name == "GLOBAL":
            found.add(arg.replace(" ", "."))
        last = None
    return found
