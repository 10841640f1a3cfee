"""Validation of a loaded config: field choices, device mappings and the rules that span several fields.

All cross-field rules live here (one place), each raising :class:`ConfigError` with the key, value and fix.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from roll.config.errors import ConfigError

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


def check_strategies(cfg: Any) -> None:
    """Each role's strategy exists and can serve that role."""
    from roll.strategies.registry import strategy_roles

    for role in ROLES:
        worker = getattr(cfg, role, None)
        if worker is None:
            continue
        name = worker.strategy_args.strategy_name
        roles = strategy_roles()
        key = f"{role}.strategy_args.strategy_name"
        if name not in roles:
            raise ConfigError(key, name, f"unknown strategy; valid: {', '.join(sorted(roles))}")
        if role not in roles[name]:
            valid = sorted(n for n, r in roles.items() if role in r)
            raise ConfigError(key, name, f"{name} cannot serve {role}; valid for {role}: {', '.join(valid)}")


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


def check_train_batch(cfg: Any, role: str, samples_per_step: int) -> None:
    """``per_device_train_batch_size x gradient_accumulation_steps x world_size`` must divide the rollout."""
    worker = getattr(cfg, role)
    ta = worker.training_args
    global_batch = ta.per_device_train_batch_size * ta.gradient_accumulation_steps * worker.world_size
    if ta.per_device_train_batch_size < 1 or ta.gradient_accumulation_steps < 1:
        raise ConfigError(f"{role}.training_args.per_device_train_batch_size", ta.per_device_train_batch_size,
                          "per_device_train_batch_size and gradient_accumulation_steps must be >= 1")
    if samples_per_step % global_batch:
        raise ConfigError(
            f"{role}.training_args.gradient_accumulation_steps", ta.gradient_accumulation_steps,
            f"the global train batch per_device_train_batch_size ({ta.per_device_train_batch_size}) x "
            f"gradient_accumulation_steps ({ta.gradient_accumulation_steps}) x world_size ({worker.world_size}) = "
            f"{global_batch} must divide the {samples_per_step} samples of a step; for one optimizer step per "
            f"rollout set gradient_accumulation_steps = {samples_per_step} / "
            f"({ta.per_device_train_batch_size} x {worker.world_size})")


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


def validate(cfg: Any) -> None:
    """Run every check that applies to ``cfg``'s pipeline type."""
    check_choices(cfg)
    check_workers(cfg)
    check_strategies(cfg)
    for key in ("max_steps", "rollout_batch_size", "sequence_length"):
        if getattr(cfg, key) < 1:
            raise ConfigError(key, getattr(cfg, key), "must be >= 1")
    check_ppo(cfg)
    from roll.config.agentic import AgenticConfig

    if isinstance(cfg, AgenticConfig):
        check_agentic(cfg)
    else:
        from roll.config.rlvr import RLVRConfig, check_rlvr

        if isinstance(cfg, RLVRConfig):
            check_rlvr(cfg)


def check_env_manager(cfg: Any, name: str) -> None:
    """Tags exist in custom_envs, group counts add up, env types and kwargs are known."""
    from roll.envs.registry import list_envs, make_env  # noqa: F401  (import registers the built-in envs)

    manager = getattr(cfg, name)
    if not manager.tags:
        raise ConfigError(f"{name}.tags", manager.tags, "list at least one env tag from custom_envs")
    for tag in manager.tags:
        if tag not in cfg.custom_envs:
            raise ConfigError(f"{name}.tags", tag, f"not in custom_envs; defined tags: {', '.join(cfg.custom_envs)}")
    if manager.group_size < 1 or manager.env_groups < 1:
        raise ConfigError(f"{name}.group_size", manager.group_size, "group_size and env_groups must be >= 1")
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
        if spec.env_type not in envs:
            raise ConfigError(f"custom_envs.{tag}.env_type", spec.env_type, f"unknown env; registered: {', '.join(envs)}")
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
    if cfg.sft_warmup.enabled and cfg.sft_warmup.tag is not None and cfg.sft_warmup.tag not in cfg.custom_envs:
        raise ConfigError("sft_warmup.tag", cfg.sft_warmup.tag, f"not in custom_envs ({', '.join(cfg.custom_envs)})")
    check_train_batch(cfg, "actor_train", cfg.rollout_batch_size)
    if cfg.critic is not None:
        check_train_batch(cfg, "critic", cfg.rollout_batch_size)
