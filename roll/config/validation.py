"""Validation of a loaded config: field choices, device mappings and the rules that span several fields.

All cross-field rules live here (one place), each raising :class:`ConfigError` with the key, value and fix.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from roll.config.errors import ConfigError
from roll.config.megatron import (MEGATRON_STRATEGIES, check_megatron_options, parse_megatron_options,
                                  read_hf_config)

ROLES = ("actor_train", "actor_infer", "reference", "critic")


def check_choices(obj: Any, prefix: str = "") -> None:
    """Check every field with declared ``choices``, recursively through nested dataclasses and dicts."""
    if not dataclasses.is_dataclass(obj):
        return
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        choices = f.metadata.get("choices")
        if choices is not None and value not in choices:
            raise ConfigError(key, value, f"must be one of {', '.join(map(str, choices))}")
        if dataclasses.is_dataclass(value):
            check_choices(value, key + ".")
        elif isinstance(value, dict):
            for k, v in value.items():
                check_choices(v, f"{key}.{k}.")


def parse_device_mapping(value: Any, key: str = "device_mapping") -> list[int]:
    """A device mapping as a list of GPU ids: a list, None/'' (CPU), or the string ``list(range(a, b[, s]))``."""
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, str):
        text = value.strip()
        try:
            tree = ast.parse(text, mode="eval").body
            if (isinstance(tree, ast.Call) and isinstance(tree.func, ast.Name) and tree.func.id == "list"
                    and len(tree.args) == 1 and isinstance(tree.args[0], ast.Call)
                    and getattr(tree.args[0].func, "id", None) == "range"):
                value = list(range(*[ast.literal_eval(a) for a in tree.args[0].args]))
            else:
                value = ast.literal_eval(text)
        except (SyntaxError, ValueError, TypeError):
            raise ConfigError(key, value, "expected a list of GPU ids or 'list(range(a, b))'") from None
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and v >= 0 for v in value):
        raise ConfigError(key, value, "expected a list of non-negative GPU ids")
    if len(set(value)) != len(value):
        raise ConfigError(key, value, "GPU ids must not repeat")
    return list(value)


#: Strategy names of ROLL's guide that roll cannot run (yet): what is missing and what to use instead.
UNAVAILABLE_BACKENDS = {
    "vllm": "needs the vLLM backend, which roll does not implement yet (and `pip install vllm` replaces torch with "
            "the version vllm pins); use sglang on GPU or hf_infer",
    "sglang": "needs the SGLang backend, which is not registered in this install; on a CUDA machine "
              "`pip install 'roll[gpu]'`, on CPU use hf_infer",
    "deepspeed_infer": "is not registered in this install; use hf_infer for reference log-probs",
}


#: The Python module each registered backend imports (its pip requirement, for the install hint, is the
#: strategy's ``requires`` in the registry).
BACKEND_MODULES = {"hf_infer": "transformers", "deepspeed_train": "deepspeed", "deepspeed_infer": "deepspeed",
                   "sglang": "sglang", "megatron_train": "megatron.core", "megatron_infer": "megatron.core"}


def _backend_missing(name: str) -> str | None:
    """The install hint of registered strategy ``name`` when its backend module is not importable here."""
    import importlib.util

    from roll.strategies import registry

    module = BACKEND_MODULES.get(name)
    try:
        if module is None or importlib.util.find_spec(module) is not None:
            return None
    except ModuleNotFoundError:  # the parent package of a dotted module is missing
        pass
    spec = getattr(registry, "_STRATEGIES", {}).get(name)
    return getattr(spec, "requires", "") or module


def check_strategies(cfg: Any) -> None:
    """Each role's strategy exists, can serve that role, and its backend package is installed.

    The install check runs only when this process starts the workers (no ``ray_address``): a driver that joins a
    cluster may lack packages its workers have.
    """
    from roll.strategies.registry import strategy_roles

    for role in ROLES:
        worker = getattr(cfg, role, None)
        if worker is None:
            continue
        name = worker.strategy_args.strategy_name
        roles = strategy_roles()
        key = f"{role}.strategy_args.strategy_name"
        if name not in roles and name in UNAVAILABLE_BACKENDS:
            raise ConfigError(key, name, f"{name} {UNAVAILABLE_BACKENDS[name]}")
        if name not in roles:
            raise ConfigError(key, name, f"unknown strategy; valid: {', '.join(sorted(roles))}")
        missing = None if getattr(cfg, "ray_address", None) else _backend_missing(name)
        if missing:
            raise ConfigError(key, name, f"the {name} backend (python module {BACKEND_MODULES[name]}) is not "
                                         f"installed; install it with `pip install '{missing}'`, or pick another "
                                         f"strategy")
        if role not in roles[name]:
            valid = sorted(n for n, r in roles.items() if role in r)
            raise ConfigError(key, name, f"{name} cannot serve {role}; valid for {role}: {', '.join(valid)}")
        if name in MEGATRON_STRATEGIES:
            check_megatron_role(worker, role)


def check_megatron_role(worker: Any, role: str) -> None:
    """A megatron role's ``strategy_config`` parses as :class:`MegatronOptions` and fits its world size, dtype and
    (when the model directory is local) the model's heads and layers."""
    name = worker.strategy_args.strategy_name
    if not worker.device_mapping:
        raise ConfigError(f"{role}.strategy_args.strategy_name", name,
                          f"{name} needs CUDA GPUs (megatron-core allocates CUDA tensors): give {role} a "
                          "device_mapping, or use deepspeed_train / hf_infer on CPU")
    key = f"{role}.strategy_args.strategy_config"
    opts = parse_megatron_options(dict(worker.strategy_args.strategy_config), key)
    check_megatron_options(opts, key, worker.world_size, worker.model_args.dtype,
                           read_hf_config(worker.model_args.model_name_or_path))


def check_workers(cfg: Any) -> None:
    """Device mappings parse, world sizes are positive, GPU runs fit the declared GPUs."""
    total_gpus = cfg.num_gpus_per_node * cfg.num_nodes
    for role in ROLES:
        worker = getattr(cfg, role, None)
        if worker is None:
            continue
        mapping = parse_device_mapping(worker.device_mapping, f"{role}.device_mapping")
        worker.device_mapping = mapping
        if worker.world_size < 1:
            raise ConfigError(f"{role}.world_size", worker.world_size, "must be >= 1")
        if mapping:
            if total_gpus == 0:
                raise ConfigError(f"{role}.device_mapping", mapping,
                                  "GPU ids given but num_gpus_per_node is 0; set num_gpus_per_node or clear the mapping")
            if max(mapping) >= total_gpus:
                raise ConfigError(f"{role}.device_mapping", mapping,
                                  f"ids must be < num_nodes * num_gpus_per_node = {total_gpus}")
            if len(mapping) % worker.num_gpus_per_worker:
                raise ConfigError(f"{role}.num_gpus_per_worker", worker.num_gpus_per_worker,
                                  f"must divide len(device_mapping) = {len(mapping)}")
            worker.world_size = len(mapping) // worker.num_gpus_per_worker
        if worker.infer_batch_size < 1:
            raise ConfigError(f"{role}.infer_batch_size", worker.infer_batch_size, "must be >= 1")
        if worker.model_update_frequency < 1:
            raise ConfigError(f"{role}.model_update_frequency", worker.model_update_frequency, "must be >= 1")
        for phase in ("train", "infer"):
            budget = getattr(worker, f"max_tokens_per_microbatch_in_{phase}")
            if getattr(worker, f"use_dynamic_batching_in_{phase}") and budget < 1:
                raise ConfigError(f"{role}.max_tokens_per_microbatch_in_{phase}", budget,
                                  f"must be >= 1 with use_dynamic_batching_in_{phase}: true (e.g. 8192)")
        worker.data_args.file_name = _file_list(worker.data_args.file_name, f"{role}.data_args.file_name")


def _file_list(value: Any, key: str) -> list[str] | None:
    """``data_args.file_name`` as a list of paths: None stays None, one path becomes ``[path]``."""
    if value is None or isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    if isinstance(value, str):
        return [value]
    raise ConfigError(key, value, "expected a path or a list of paths")


#: Guide keys the schema accepts but no pipeline acts on yet, with the only value that means "off". A different
#: value is an error rather than silently ignored; delete a key here when a pipeline implements it.
NOT_IMPLEMENTED = {"l2": 0.0, "use_reward_scaling": False, "use_reward_norm": False, "sft_loss_coef": 0.0,
                   "rl_loss_coef": 1.0}
#: Keys the agentic pipeline does not act on yet (the RLVR pipeline does).
NOT_IMPLEMENTED_AGENTIC = {"actor_infer.model_update_frequency": 1, "train_env_manager.worker_cls": None,
                           "val_env_manager.worker_cls": None}


def check_not_implemented(cfg: Any, table: dict[str, Any]) -> None:
    """Reject a non-default value of a key in ``table`` (dotted paths; a missing block is skipped)."""
    for dotted, default in table.items():
        node = cfg
        *path, leaf = dotted.split(".")
        for part in path:
            node = getattr(node, part, None)
        if node is not None and getattr(node, leaf) != default:
            raise ConfigError(dotted, getattr(node, leaf), f"not implemented in roll yet; remove it or set it to "
                                                           f"{default!r}")


def check_scheduling(cfg: Any) -> None:
    """Generation scheduling keys (see ``BaseConfig``): request limits are positive."""
    if cfg.max_running_requests < 1:
        raise ConfigError("max_running_requests", cfg.max_running_requests, "must be >= 1")
    if cfg.max_additional_running_prompts < 0:
        raise ConfigError("max_additional_running_prompts", cfg.max_additional_running_prompts, "must be >= 0")
    if cfg.num_return_sequences_in_group < 1:
        raise ConfigError("num_return_sequences_in_group", cfg.num_return_sequences_in_group, "must be >= 1")


def model_parallel_size(strategy_name: str, strategy_config: dict) -> int:
    """Ranks that share one data-parallel replica: TP x PP x CP for megatron_train / megatron_infer (expert
    parallelism does not divide the batch), 1 for DeepSpeed ZeRO, where every rank is a data-parallel rank."""
    if strategy_name not in MEGATRON_STRATEGIES:
        return 1
    size = 1
    for key in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
        size *= int(strategy_config.get(key, 1) or 1)
    return size


def check_train_batch(cfg: Any, role: str, samples_per_step: int) -> None:
    """The global train batch must divide the samples of one step.

    DeepSpeed: ``global = per_device_train_batch_size x gradient_accumulation_steps x world_size``; Megatron:
    ``global = per_device_train_batch_size x gradient_accumulation_steps x world_size / (TP x PP x CP)``.
    A step holds ``samples_per_step / global`` optimizer steps (per ppo epoch); one optimizer step per rollout
    needs ``gradient_accumulation_steps = samples_per_step x TP x PP x CP / (per_device_train_batch_size x
    world_size)``.
    """
    worker = getattr(cfg, role)
    ta = worker.training_args
    if ta.per_device_train_batch_size < 1 or ta.gradient_accumulation_steps < 1:
        raise ConfigError(f"{role}.training_args.per_device_train_batch_size", ta.per_device_train_batch_size,
                          "per_device_train_batch_size and gradient_accumulation_steps must be >= 1")
    strategy = worker.strategy_args
    mp = model_parallel_size(strategy.strategy_name, dict(strategy.strategy_config))
    if worker.world_size % mp:
        raise ConfigError(f"{role}.strategy_args.strategy_config", dict(strategy.strategy_config),
                          f"TP x PP x CP = {mp} must divide world_size ({worker.world_size})")
    data_parallel = worker.world_size // mp
    global_batch = ta.per_device_train_batch_size * ta.gradient_accumulation_steps * data_parallel
    if samples_per_step % global_batch:
        formula = "world_size" if mp == 1 else "world_size / (TP x PP x CP)"
        sizes = f"{worker.world_size}" if mp == 1 else f"{worker.world_size} / {mp}"
        one_step = samples_per_step / (ta.per_device_train_batch_size * data_parallel)
        fix = (f"for one optimizer step per rollout set gradient_accumulation_steps = {samples_per_step} / "
               f"({ta.per_device_train_batch_size} x {data_parallel}) = {one_step:g}"
               if one_step == int(one_step) else
               f"pick per_device_train_batch_size x {formula} dividing {samples_per_step}")
        raise ConfigError(
            f"{role}.training_args.gradient_accumulation_steps", ta.gradient_accumulation_steps,
            f"the global train batch per_device_train_batch_size ({ta.per_device_train_batch_size}) x "
            f"gradient_accumulation_steps ({ta.gradient_accumulation_steps}) x {formula} ({sizes}) = "
            f"{global_batch} must divide the {samples_per_step} samples of a step; {fix}")


def optimizer_steps_per_rollout(cfg: Any, role: str, samples_per_step: int) -> int:
    """Optimizer steps one rollout makes per ppo epoch: ``samples_per_step / global train batch``."""
    worker = getattr(cfg, role)
    ta = worker.training_args
    strategy = worker.strategy_args
    data_parallel = worker.world_size // model_parallel_size(strategy.strategy_name, dict(strategy.strategy_config))
    return samples_per_step // (ta.per_device_train_batch_size * ta.gradient_accumulation_steps * data_parallel)


def check_ppo(cfg: Any) -> None:
    """Algorithm settings that contradict each other or need a missing role."""
    if cfg.adv_estimator == "gae" and cfg.critic is None:
        raise ConfigError("adv_estimator", "gae", "gae needs a critic: add a `critic:` worker block, or use grpo")
    if cfg.add_token_level_kl and cfg.use_kl_loss and not cfg.allow_kl_in_reward_and_loss:
        raise ConfigError("use_kl_loss", True, "KL is already in the reward (add_token_level_kl: true); use one, "
                                               "or set allow_kl_in_reward_and_loss: true")
    if (cfg.add_token_level_kl or cfg.use_kl_loss) and cfg.reference is None:
        raise ConfigError("reference", None, "a KL term is on (add_token_level_kl or use_kl_loss) but no "
                                             "`reference:` worker block is configured")
    for key in ("use_topr_loss", "add_len_reward", "difficulty_loss_weight", "length_loss_weight"):
        if getattr(cfg, key):
            raise ConfigError(key, True, "not implemented in roll yet; set it to false")
    if cfg.ppo_epochs < 1:
        raise ConfigError("ppo_epochs", cfg.ppo_epochs, "must be >= 1")
    if cfg.dual_clip_loss and cfg.dual_clip_c <= 1:
        raise ConfigError("dual_clip_c", cfg.dual_clip_c, "must be > 1")
    check_algorithm(cfg)


def check_algorithm(cfg: Any) -> None:
    """Advantage, KL and loss settings that a pipeline cannot run, or that it would silently ignore."""
    if cfg.critic is not None and cfg.adv_estimator != "gae":
        raise ConfigError("critic", "<worker block>", f"adv_estimator={cfg.adv_estimator} does not use critic values; "
                                                      "remove the `critic:` block or set adv_estimator: gae")
    if cfg.adv_estimator == "gigpo" and not hasattr(cfg, "train_env_manager"):
        raise ConfigError("adv_estimator", "gigpo", "gigpo compares turns that act in the same env state and needs "
                                                    "multi-turn trajectories (agentic pipeline); use grpo here")
    if cfg.kl_penalty == "full":
        raise ConfigError("kl_penalty", "full", "vocabulary KL needs the actor's and the reference's full logits "
                                                "(B x L x V) in one process, which roll's workers do not exchange; "
                                                "use low_var_kl (k3), kl, abs or mse")
    if cfg.use_kl_loss and cfg.kl_loss_coef <= 0:
        raise ConfigError("kl_loss_coef", cfg.kl_loss_coef, "use_kl_loss is on, so it must be > 0 (e.g. 0.001); "
                                                            "or set use_kl_loss: false")
    if cfg.critic_warmup < 0 or (cfg.critic_warmup > 0 and cfg.critic is None):
        raise ConfigError("critic_warmup", cfg.critic_warmup, "must be >= 0, and > 0 only with a `critic:` block")
    for key in ("value_clip", "advantage_clip", "reward_clip", "target_kl"):
        if getattr(cfg, key) is not None and getattr(cfg, key) <= 0:
            raise ConfigError(key, getattr(cfg, key), "must be > 0, or null to turn it off")
    for key in ("pg_clip", "pg_clip_low"):
        if getattr(cfg, key) is not None and not 0 < getattr(cfg, key) < 1:
            raise ConfigError(key, getattr(cfg, key), "must be in (0, 1): the ratio is clipped at 1 - value")
    if cfg.pg_clip_high is not None and cfg.pg_clip_high <= 0:
        raise ConfigError("pg_clip_high", cfg.pg_clip_high, "must be > 0 (DAPO clip-higher uses 0.28)")
    for key in ("gamma", "lambd"):
        if not 0 <= getattr(cfg, key) <= 1:
            raise ConfigError(key, getattr(cfg, key), "must be in [0, 1]")
    for key in ("entropy_loss_coef", "init_kl_coef", "kl_loss_coef"):
        if getattr(cfg, key) < 0:
            raise ConfigError(key, getattr(cfg, key), "must be >= 0")
    if cfg.kl_horizon < 1:
        raise ConfigError("kl_horizon", cfg.kl_horizon, "must be >= 1 (samples over which the coefficient adapts)")


def validate(cfg: Any) -> None:
    """Run every check that applies to ``cfg``'s pipeline type."""
    check_choices(cfg)
    check_workers(cfg)
    check_placement(cfg)
    check_strategies(cfg)
    check_weight_sync(cfg)
    for key in ("max_steps", "rollout_batch_size", "sequence_length"):
        if getattr(cfg, key) < 1:
            raise ConfigError(key, getattr(cfg, key), "must be >= 1")
    check_ppo(cfg)
    check_scheduling(cfg)
    check_not_implemented(cfg, NOT_IMPLEMENTED)
    from roll.config.agentic import AgenticConfig

    if isinstance(cfg, AgenticConfig):
        check_agentic(cfg)
    else:
        from roll.config.rlvr import RLVRConfig, check_rlvr

        if isinstance(cfg, RLVRConfig):
            check_rlvr(cfg)


def check_env_manager_runtime(manager: Any, name: str) -> None:
    """Fault-isolation, concurrency and batching settings of an env manager are in range."""
    rules = [("env_step_timeout", manager.env_step_timeout >= 0, "must be >= 0 seconds (0 = no limit)"),
             ("env_threads", manager.env_threads >= 1, "must be >= 1"),
             ("max_refill_rounds", manager.max_refill_rounds >= 0, "must be >= 0"),
             ("conformance_samples", manager.conformance_samples >= 0, "must be >= 0 (0 = off)"),
             ("batch_max_size", manager.batch_max_size >= 1, "must be >= 1 prompts"),
             ("batch_max_wait_ms", manager.batch_max_wait_ms >= 0, "must be >= 0 milliseconds")]
    for key, ok, expected in rules:
        if not ok:
            raise ConfigError(f"{name}.{key}", getattr(manager, key), expected)


def check_env_manager(cfg: Any, name: str) -> None:
    """Tags exist in custom_envs, group counts add up, env types and kwargs are known."""
    from roll.envs.registry import get_env_class, list_envs, make_env

    manager = getattr(cfg, name)
    if not manager.tags:
        raise ConfigError(f"{name}.tags", manager.tags, "list at least one env tag from custom_envs")
    for tag in manager.tags:
        if tag not in cfg.custom_envs:
            raise ConfigError(f"{name}.tags", tag, f"not in custom_envs; defined tags: {', '.join(cfg.custom_envs)}")
    if manager.group_size < 1 or manager.env_groups < 1:
        raise ConfigError(f"{name}.group_size", manager.group_size, "group_size and env_groups must be >= 1")
    check_env_manager_runtime(manager, name)
    if manager.n_groups is not None:
        if len(manager.n_groups) != len(manager.tags) or sum(manager.n_groups) != manager.env_groups:
            raise ConfigError(f"{name}.n_groups", manager.n_groups,
                              f"needs one entry per tag ({len(manager.tags)}) summing to env_groups "
                              f"({manager.env_groups})")
    elif manager.env_groups % len(manager.tags):
        raise ConfigError(f"{name}.env_groups", manager.env_groups,
                          f"must split evenly across the {len(manager.tags)} tags, or set n_groups")
    if manager.num_env_managers < 1 or manager.env_groups % manager.num_env_managers:
        raise ConfigError(f"{name}.num_env_managers", manager.num_env_managers,
                          f"must be >= 1 and divide env_groups ({manager.env_groups})")
    envs = list_envs()
    for tag in manager.tags:
        spec = cfg.custom_envs[tag]
        try:
            get_env_class(spec.env_type)
        except (ValueError, ImportError) as exc:
            raise ConfigError(f"custom_envs.{tag}.env_type", spec.env_type,
                              f"unknown env ({exc}); registered: {', '.join(envs)}") from None
        if spec.max_actions_per_traj < 1 or spec.max_tokens_per_step < 1:
            raise ConfigError(f"custom_envs.{tag}.max_actions_per_traj", spec.max_actions_per_traj,
                              "max_actions_per_traj and max_tokens_per_step must be >= 1")
        try:
            make_env(spec.env_type, dict(spec.env_config))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"custom_envs.{tag}.env_config", dict(spec.env_config), str(exc)) from None


def check_agentic(cfg: Any) -> None:
    """Rules of the agentic pipeline (see ARCHITECTURE.md section 3)."""
    check_env_manager(cfg, "train_env_manager")
    check_not_implemented(cfg, NOT_IMPLEMENTED_AGENTIC)
    train = cfg.train_env_manager
    if cfg.rollout_batch_size % train.group_size:
        raise ConfigError("rollout_batch_size", cfg.rollout_batch_size,
                          f"must be a multiple of train_env_manager.group_size ({train.group_size}): "
                          f"a batch holds whole groups")
    groups_needed = cfg.rollout_batch_size // train.group_size
    if train.max_traj_per_env > 0 and groups_needed > train.env_groups * train.max_traj_per_env:
        raise ConfigError("rollout_batch_size", cfg.rollout_batch_size,
                          f"needs {groups_needed} groups but env_groups ({train.env_groups}) x max_traj_per_env "
                          f"({train.max_traj_per_env}) give at most {train.env_groups * train.max_traj_per_env}")
    if cfg.val_env_manager is not None:
        check_env_manager(cfg, "val_env_manager")
    for key in ("trajectory_dump_steps", "trajectory_dump_max"):
        if getattr(cfg, key) < 0:
            raise ConfigError(key, getattr(cfg, key), "must be >= 0 (0 = never / no limit)")
    if cfg.sft_warmup.enabled and cfg.sft_warmup.tag is not None and cfg.sft_warmup.tag not in cfg.custom_envs:
        raise ConfigError("sft_warmup.tag", cfg.sft_warmup.tag, f"not in custom_envs ({', '.join(cfg.custom_envs)})")
    check_train_batch(cfg, "actor_train", cfg.rollout_batch_size)
    if cfg.sft_warmup.enabled:
        ta, strategy = cfg.actor_train.training_args, cfg.actor_train.strategy_args
        data_parallel = cfg.actor_train.world_size // model_parallel_size(strategy.strategy_name,
                                                                          dict(strategy.strategy_config))
        unit = ta.per_device_train_batch_size * ta.gradient_accumulation_steps * data_parallel
        if cfg.sft_warmup.batch_size % unit:
            raise ConfigError("sft_warmup.batch_size", cfg.sft_warmup.batch_size,
                              f"must be a multiple of actor_train's global train batch per_device_train_batch_size x "
                              f"gradient_accumulation_steps x data-parallel size = {unit}")
    if cfg.critic is not None:
        check_train_batch(cfg, "critic", cfg.rollout_batch_size)


def check_weight_sync(cfg: Any) -> None:
    """actor_infer's ``weight_sync`` key (sglang ``strategy_config``: auto, nccl, cuda_ipc, copy) fits the placement, and on
    GPU an sglang engine's ``tp_size`` equals its worker's ``num_gpus_per_worker`` (its TP ranks run on those GPUs).
    See :func:`roll.distributed.placement.weight_sync_mode`; run after :func:`check_strategies`."""
    from roll.distributed.placement import ipc_sync_blocker, nccl_sync_blocker, role_mappings
    from roll.strategies.registry import get_strategy_class
    from roll.strategies.sglang import WEIGHT_SYNC_CHOICES

    train, infer = getattr(cfg, "actor_train", None), getattr(cfg, "actor_infer", None)
    if train is None or infer is None:
        return
    name, sc = infer.strategy_args.strategy_name, dict(infer.strategy_args.strategy_config)
    key = "actor_infer.strategy_args.strategy_config"
    strategy = get_strategy_class(name, "actor_infer")
    receives = bool(getattr(strategy, "supports_weight_group", False))
    if "weight_sync" in sc and not receives:
        raise ConfigError(f"{key}.weight_sync", sc["weight_sync"], f"{name} has no weight_sync setting (it always "
                                                                   f"receives weights by copy); remove the key")
    requested = sc.get("weight_sync", "auto")
    if requested not in WEIGHT_SYNC_CHOICES:
        raise ConfigError(f"{key}.weight_sync", requested, f"must be one of {', '.join(WEIGHT_SYNC_CHOICES)}")
    blocker = nccl_sync_blocker(role_mappings(cfg), cfg.distributed, receives)
    if requested == "nccl" and blocker:
        raise ConfigError(f"{key}.weight_sync", requested, f"NCCL sync is impossible: {blocker}; use auto or copy")
    ipc_blocker = ipc_sync_blocker(role_mappings(cfg), cfg.distributed,
                                   bool(getattr(strategy, "supports_ipc_weights", False)), receives)
    if requested == "cuda_ipc" and ipc_blocker:
        raise ConfigError(f"{key}.weight_sync", requested, f"CUDA IPC sync is impossible: {ipc_blocker}; use auto "
                                                           f"or copy")
    if receives and infer.device_mapping and strategy.weight_group_ranks(infer) != infer.num_gpus_per_worker:
        raise ConfigError(f"{key}.tp_size", strategy.weight_group_ranks(infer),
                          f"must equal actor_infer.num_gpus_per_worker ({infer.num_gpus_per_worker}): an engine's "
                          f"TP ranks run on its worker's GPUs")


CHECKPOINT_KEYS = {"max_to_keep"}


def check_placement(cfg: Any) -> None:
    """Placement rules across roles (after :func:`check_workers`) and the checkpoint keys.

    On a GPU run every role needs a device_mapping (overlapping ids colocate roles); one worker's GPUs must sit on
    one node; ``save_steps`` >= 0; ``resume_from_checkpoint`` is a bool or a path; ``checkpoint_config`` keys are
    known."""
    workers = {r: getattr(cfg, r) for r in ROLES if getattr(cfg, r, None) is not None}
    mapped = sorted(r for r, w in workers.items() if w.device_mapping)
    for role, worker in workers.items():
        if worker.num_gpus_per_worker < 1:
            raise ConfigError(f"{role}.num_gpus_per_worker", worker.num_gpus_per_worker, "must be >= 1")
        if mapped and not worker.device_mapping:
            raise ConfigError(f"{role}.device_mapping", worker.device_mapping,
                              f"empty while {', '.join(mapped)} run on GPUs; give every role GPU ids (overlapping "
                              f"ids colocate roles, e.g. the same list as actor_train)")
        k, per_node = worker.num_gpus_per_worker, max(1, cfg.num_gpus_per_node)
        for i in range(0, len(worker.device_mapping), k):
            gpus = worker.device_mapping[i:i + k]
            if len({g // per_node for g in gpus}) > 1:
                raise ConfigError(f"{role}.device_mapping", worker.device_mapping,
                                  f"worker {i // k} gets GPUs {gpus} on several nodes (num_gpus_per_node="
                                  f"{cfg.num_gpus_per_node}); align each worker's {k} GPUs inside one node")
    if cfg.save_steps < 0:
        raise ConfigError("save_steps", cfg.save_steps, "must be >= 0 (0 = only the final model)")
    if not isinstance(cfg.resume_from_checkpoint, (bool, str)) and cfg.resume_from_checkpoint is not None:
        raise ConfigError("resume_from_checkpoint", cfg.resume_from_checkpoint,
                          "true (newest complete checkpoint in output_dir), false, or a checkpoint directory path")
    unknown = set(cfg.checkpoint_config) - CHECKPOINT_KEYS
    if unknown:
        raise ConfigError("checkpoint_config", dict(cfg.checkpoint_config),
                          f"unknown keys {sorted(unknown)}; known: {sorted(CHECKPOINT_KEYS)}")
    if int(cfg.checkpoint_config.get("max_to_keep", 0)) < 0:
        raise ConfigError("checkpoint_config.max_to_keep", cfg.checkpoint_config["max_to_keep"],
                          "must be >= 0 (0 = keep all)")
