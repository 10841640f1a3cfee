"""Weights through a shared-memory file, for the copy-mode weight sync between processes of one machine (a CPU Ray
run): the trainer writes its CPU tensors into one file under ``/dev/shm`` and returns their layout; an engine maps
the same file and loads views of it. Two memory copies and no serialization, where the Ray object store pickles
the tensors into its store and unpickles them on the other side.

Layout: one ``[name, dtype name, shape, byte offset]`` per tensor, in the trainer's order; offsets are aligned to
:data:`ALIGN` bytes, so every view starts aligned for its dtype.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

#: Byte alignment of each tensor in the file.
ALIGN = 64
#: Where a CPU run on one machine passes the weights (``copy`` mode): a RAM-backed file system.
SHARED_DIR = "/dev/shm"

Layout = list[list]


def nbytes(t: torch.Tensor) -> int:
    """Bytes of ``t``'s elements."""
    return t.numel() * t.element_size()


def write_shared(path: str, named: Iterable[tuple[str, torch.Tensor]]) -> Layout:
    """Write ``(name, CPU tensor)`` pairs into a new file ``path`` (mapped shared) and return their layout.

    >>> import tempfile; p = os.path.join(tempfile.mkdtemp(), "w")
    >>> write_shared(p, [("a", torch.ones(3)), ("b", torch.zeros(2, dtype=torch.bfloat16))])
    [['a', 'float32', [3], 0], ['b', 'bfloat16', [2], 64]]
    """
    named = list(named)
    layout, offset = [], 0
    for name, t in named:
        layout.append([name, str(t.dtype).removeprefix("torch."), list(t.shape), offset])
        offset += -(-nbytes(t) // ALIGN) * ALIGN
    with open(path, "wb") as f:
        f.truncate(max(offset, 1))
    buf = torch.from_file(path, shared=True, size=max(offset, 1), dtype=torch.uint8)
    for (_, _, _, start), (_, t) in zip(layout, named):
        buf[start : start + nbytes(t)].view(t.dtype).view(t.shape).copy_(t)
    return layout


def read_shared(path: str, layout: Layout) -> list[tuple[str, torch.Tensor]]:
    """Views of the tensors :func:`write_shared` wrote to ``path`` (valid while they live; copy what you keep)."""
    size = os.path.getsize(path)
    buf = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    out = []
    for name, dtype_name, shape, start in layout:
        dtype = getattr(torch, dtype_name)
        count = int(torch.Size(shape).numel()) * torch.empty((), dtype=dtype).element_size()
        out.append((name, buf[start : start + count].view(dtype).view(shape)))
    return out
