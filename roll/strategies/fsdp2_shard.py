"""What ``fsdp2_train`` and ``fsdp2_infer`` share: the process group and device mesh, ``fully_shard`` of a Hugging
Face model by its wrap policy, and moving full tensors in and out of sharded (DTensor) parameters.

Sharding: every module named by ``wrap_policy.transformer_layer_cls_to_wrap`` (default: the model's
``_no_split_modules``, i.e. its decoder layers), optionally the input embeddings and the LM head, becomes an FSDP
unit of its own; the root module holds the rest (embeddings, final norm, LM head). FSDP2 keeps the root's
parameters gathered from its forward to the end of backward, so the LM head's weight is a plain tensor when
:func:`roll.models.logprobs.token_log_probs` applies it (the fused log-prob kernel); a head sharded as its own unit
is a DTensor there, and its log-probs run checkpointed through the module instead.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from roll.config.fsdp2 import FSDP2Options, dtype_name
from roll.models.loading import DTYPES


def init_fsdp2_distributed(seed: int) -> torch.device:
    """Seed torch, pick this worker's GPU (``LOCAL_RANK``) and join the role's process group (NCCL on GPU, gloo on
    CPU; the worker sets the rendezvous variables) unless this process already has one; returns the device."""
    import torch.distributed as dist

    torch.manual_seed(seed)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return device


def device_mesh(device: torch.device, world_size: int, fsdp_size: int):
    """The role's mesh: 1-D ``(world_size,)`` (FSDP) when ``fsdp_size`` is 0, 1 or >= ``world_size``, else 2-D
    ``(world_size / fsdp_size, fsdp_size)`` named ``("replicate", "shard")`` (HSDP: replicas of a sharded model)."""
    from torch.distributed.device_mesh import init_device_mesh

    if fsdp_size <= 1 or fsdp_size >= world_size:
        return init_device_mesh(device.type, (world_size,), mesh_dim_names=("shard",))
    return init_device_mesh(device.type, (world_size // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard"))


def wrap_units(model: torch.nn.Module, options: FSDP2Options) -> list[torch.nn.Module]:
    """The submodules that become FSDP units of their own, in module order (see the module docstring)."""
    policy = options.wrap_policy
    names = set(policy.transformer_layer_cls_to_wrap or getattr(model, "_no_split_modules", None) or ())
    units = [m for m in model.modules() if type(m).__name__ in names and m is not model]
    if not units:
        found = sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(
            f"fsdp2: wrap_policy.transformer_layer_cls_to_wrap={sorted(names)} matches no module of "
            f"{type(model).__name__}; its module classes: {', '.join(found)}"
        )
    extra = []
    if policy.wrap_embeddings or policy.wrap_lm_output:
        embed, head = model.get_input_embeddings(), model.get_output_embeddings()
        if head is not None and embed is not None and head.weight is embed.weight:
            raise ValueError(
                "fsdp2: wrap_policy.wrap_embeddings / wrap_lm_output shard a weight of their own, but "
                f"{type(model).__name__} ties its LM head to the input embeddings; leave both false"
            )
        if policy.wrap_lm_output and head is None:
            raise ValueError(f"fsdp2: wrap_policy.wrap_lm_output=true, but {type(model).__name__} has no LM head")
        extra = ([embed] if policy.wrap_embeddings else []) + ([head] if policy.wrap_lm_output else [])
    return units + extra


def shard_model(
    model: torch.nn.Module, mesh: Any, options: FSDP2Options, compute_dtype: str, reduce_dtype: str | None = None
) -> torch.nn.Module:
    """``fully_shard`` the units of :func:`wrap_units`, then the root. Parameters keep the dtype they were loaded
    in (the sharded master copy); ``compute_dtype`` is what forward and backward run in (cast on gathering);
    ``reduce_dtype`` that of gradient accumulation and reduction. ``offload_policy`` keeps shards on CPU.
    ``reshard_after_forward`` applies to the units; the root is resharded after its backward (or by
    ``model.reshard()`` after a forward without one), so the LM head is whole when the log-prob pass applies it."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

    storage = next(model.parameters()).dtype
    compute = DTYPES[compute_dtype]
    mp = MixedPrecisionPolicy(
        param_dtype=None if compute == storage else compute, reduce_dtype=DTYPES[reduce_dtype] if reduce_dtype else None
    )
    offload = CPUOffloadPolicy(pin_memory=torch.cuda.is_available()) if options.offload_policy else OffloadPolicy()
    kwargs = dict(mesh=mesh, mp_policy=mp, offload_policy=offload)
    units = [  # inner units first: a unit manages what is left to it
        fully_shard(unit, reshard_after_forward=options.reshard_after_forward, **kwargs)
        for unit in reversed(wrap_units(model, options))
    ]
    fully_shard(model, reshard_after_forward=False, **kwargs)  # the root stays gathered until its backward is done
    # FSDP sets up a unit's gathered parameters at its first gather, and a backward that accumulates gradients
    # (reduce_dtype set, no gradient sync yet) fails on a unit that no forward has gathered: a vision-language
    # model's vision blocks on a batch without images. So gather each unit once now, one at a time.
    for unit in units:
        unit.unshard()
        unit.reshard()
    return model


def reshard_all(model: torch.nn.Module) -> None:
    """Free every unit's gathered parameters, so each parameter is its sharded DTensor again. A forward without
    backward leaves the root (and, without ``reshard_after_forward``, every unit) gathered, and while gathered,
    ``named_parameters`` yields the gathered copies: weights read or written then would miss the shards."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def enable_activation_checkpointing(model: torch.nn.Module) -> None:
    """Checkpoint every decoder layer, non-reentrant (FSDP2 re-gathers a unit when backward recomputes it)."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.2x renamed it
        model.activation_checkpointing_enable(kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    model.config.use_cache = False


def compute_dtype_of(options: FSDP2Options, model_dtype: str) -> str:
    """The dtype forward and backward run in: ``param_dtype``, else ``model_args.dtype`` (roll's names)."""
    return dtype_name(options.param_dtype) or model_dtype


def clip_grad_norm(params: list[torch.Tensor], max_norm: float, mesh: Any, device: torch.device) -> float:
    """Clip the gradients of sharded parameters to a global L2 norm of ``max_norm`` (0: no clipping); returns the
    norm before clipping. Works on the local shards: one all-reduce of the squared norm over the mesh's ``shard``
    dimension (replicas of HSDP hold equal gradients), on ``device`` (CPU-offloaded shards too), instead of
    DTensor's per-tensor dispatch."""
    from torch.distributed.tensor import DTensor

    grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    norms = torch.stack(torch._foreach_norm(grads, 2, dtype=torch.float32)).to(device)  # one per tensor
    if mesh.size() == 1:
        total = torch.linalg.vector_norm(norms)
    else:
        squared = norms.pow(2).sum()
        torch.distributed.all_reduce(squared, group=mesh.get_group("shard"))
        total = squared.sqrt()
    norm = float(total)
    if max_norm > 0 and norm > max_norm:
        torch._foreach_mul_(grads, max_norm / (norm + 1e-6))
    return norm


def full_tensor(param: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The whole tensor of a (sharded) parameter on ``device``, cast to ``dtype`` before gathering (half the bytes
    on the wire for bf16). Collective for a DTensor: every rank of its mesh must call it, in the same order."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param.detach().to(device, dtype or param.dtype)
    local = param.to_local().detach().to(device, dtype or param.dtype)  # a CPU-offloaded shard goes to the device
    gathered = DTensor.from_local(
        local, param.device_mesh, param.placements, run_check=False, shape=param.shape, stride=param.stride()
    )
    return gathered.full_tensor()


@torch.no_grad()
def load_full(param: torch.Tensor, tensor: torch.Tensor) -> None:
    """Copy a whole tensor (the same on every rank) into a parameter: a DTensor takes its own shard, with no
    communication."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if list(tensor.shape) != list(param.shape):
        raise ValueError(f"fsdp2: weight of shape {list(tensor.shape)} for a parameter of shape {list(param.shape)}")
    if not isinstance(param, DTensor):
        param.copy_(tensor.to(param.device, param.dtype))
        return
    local = param.to_local()
    shard = distribute_tensor(
        tensor.to(local.device, param.dtype), param.device_mesh, param.placements, src_data_rank=None
    )
    local.copy_(shard.to_local())
