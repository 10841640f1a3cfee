"""Running megatron-core on CPU in tests: a two-line shim and a multi-process launcher (gloo).

megatron-core 0.16 / 0.19 assume CUDA wherever they create a tensor: ``torch.cuda.current_device()`` (RoPE
frequencies, gradient buffers), ``device="cuda"`` literals (optimizer scalars, gradient-norm buffers, schedule
token counts), ``.cuda()`` calls, and the CUDA RNG tracker that attention dropout forks (dropout is 0 in roll's
models). :func:`apply_cpu_shim` makes ``current_device()`` return ``"cpu"``, turns the tracker's fork into a
no-op and installs a torch function mode that maps a CUDA ``device`` argument to CPU, ``Tensor.cuda()`` to the
identity and ``Tensor.type()`` to the CUDA type name (gradient clipping asserts it). It is for tests only: the
strategies never patch megatron, and on GPU nothing is patched.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import socket
import traceback
from collections.abc import Callable
from typing import Any

import torch
import torch.multiprocessing as mp
from torch.overrides import TorchFunctionMode


class CudaToCpu(TorchFunctionMode):
    """Calls that name a CUDA device get the CPU instead; ``Tensor.cuda()`` returns the tensor itself."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:  # asserted to be "torch.cuda.*Tensor"
            return func(*args).replace("torch.", "torch.cuda.", 1)
        device = kwargs.get("device")
        if device is not None and "cuda" in str(device):
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def apply_cpu_shim() -> None:
    """Patch this process so that megatron-core runs on CPU (see the module docstring)."""
    try:
        from megatron.core.tensor_parallel import random
    except ImportError:  # tests of roll's own collectives need no megatron
        return

    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None  # distributed checkpoints synchronize before writing
    random.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    CudaToCpu().__enter__()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple, queue: Any, shim: bool) -> None:
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank) if not shim else "0",
            "WORLD_SIZE": str(world),
            "HF_HUB_OFFLINE": "1",
        }
    )
    # one thread on CPU (tiny models; the ranks of a CPU run share the cores, 4 threads each spun on 2), a few for
    # a GPU rank's host-side work
    torch.set_num_threads(4 if torch.cuda.is_available() and not shim else 1)
    try:
        if shim:
            apply_cpu_shim()
        queue.put((rank, pickle.dumps(fn(rank, *args)), None))  # plain bytes: no shared memory
    except BaseException:  # report every failure to the parent
        queue.put((rank, None, traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable, world: int, *args: Any, timeout: float = 600, shim: bool = True) -> list[Any]:
    """``fn(rank, *args)`` in ``world`` fresh processes joined by torch.distributed env variables; results in rank
    order. A failure on any rank raises with that rank's traceback. ``shim=False`` (GPU): no CPU shim, rank r
    uses GPU r."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, queue, shim)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    try:
        for _ in range(world):
            rank, value, error = queue.get(timeout=timeout)
            if error:
                raise RuntimeError(f"rank {rank} failed:\n{error}")
            results[rank] = pickle.loads(value)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(world)]
