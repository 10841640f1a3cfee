"""The actor_train -> actor_infer weight sync a config asks for, decided where config and placement are known: the
mode (from placement, :func:`roll.distributed.placement.weight_sync_mode`, and sglang's ``weight_sync`` key), the
bucket size and the engines' TP size (actor_infer's typed options), the CUDA IPC routes, and whether a copy goes
through shared memory. :class:`roll.weights.sync.WeightSync` runs what is decided here."""

from __future__ import annotations

import os
from typing import Any

from roll.distributed.placement import ipc_routes, role_mappings, weight_sync_mode
from roll.strategies.registry import get_strategy_class, strategy_options, strategy_spec
from roll.weights.shared_memory import SHARED_DIR
from roll.weights.sync import Receiver, Sender, WeightSync


def weight_sync(cfg: Any, sender: Sender, receiver: Receiver) -> WeightSync:
    """The sync ``cfg`` asks for between ``sender`` (``actor_train.weights_out``) and ``receiver``
    (``actor_infer.weights_in``). Prints the mode and why. A LoRA run whose engine serves adapters (ability
    ``lora_adapters``) syncs its adapter alone (mode ``adapter``); an engine without it gets the merged weights."""
    from roll.config.lora import actor_lora

    infer = cfg.actor_infer
    spec = strategy_spec(infer.strategy_args.strategy_name)
    options = strategy_options(infer, "actor_infer.strategy_args.strategy_config")
    if actor_lora(cfg) is not None and spec.can("lora_adapters"):
        print(
            f"[roll] weight sync actor_train -> actor_infer: adapter (LoRA: only the adapter travels; "
            f"{spec.name} serves it on its base weights)",
            flush=True,
        )
        return WeightSync(sender, receiver, "adapter")
    receives = spec.can("weight_group")
    mappings = role_mappings(cfg)
    requested = options.weight_sync if receives else "auto"  # only a weight-group receiver has the choice
    mode, why = weight_sync_mode(
        mappings,
        cfg.distributed,
        receives,
        requested,
        infer_supports_ipc=spec.can("ipc_weights"),
        infer_in_subprocess=receives,
    )
    tp = get_strategy_class(spec.name, "actor_infer").weight_group_ranks(infer, options) if receives else 1
    one_machine = cfg.distributed == "ray" and not cfg.ray_address and not any(mappings.values())
    shared = SHARED_DIR if mode == "copy" and one_machine and os.path.isdir(SHARED_DIR) else None
    how = f", through shared memory in {shared}: a CPU run on one machine" if shared else ""
    print(f"[roll] weight sync actor_train -> actor_infer: {mode} ({why}{how})", flush=True)
    return WeightSync(
        sender,
        receiver,
        mode,
        options.weight_bucket_bytes,
        tp,
        count_buckets=receives,
        ipc_routes=ipc_routes(mappings, infer.num_gpus_per_worker),
        shared_dir=shared,
    )
