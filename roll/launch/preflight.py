"""Preflight: the checks of a loaded config that need more than the config itself, run once at launch before any
worker starts (:func:`roll.launch.command.run_pipeline`), with the same one-line :class:`ConfigError` (exit code
2) as the pure rules of :mod:`roll.config.validation`.

What each check asks:

- strategies: the strategy registry (the name, the roles it serves, its backend installed, its typed
  ``strategy_config`` options, the weight-sync mode its abilities and the placement allow);
- memory (GPU runs): each GPU's estimated peak against its memory (:mod:`roll.launch.memory_plan`,
  ``memory_check``);
- algorithms: the registries of :mod:`roll.algorithms` (the estimator, policy loss, KL types, aggregation mode and
  score normalization exist, and what the estimator declares it needs is configured: a critic, groups, turns);
- envs (agentic): the env registry (every tag's ``env_type`` exists and accepts its ``env_config``); tags played
  by agent runners: the runner imports and is built, the tool-call parser is registered, the gateway's packages
  are installed;
- data and rewards (RLVR): the data files exist and parse, every reward named exists and accepts its options, and
  every data tag has a reward.

Names may be ``"package.module:name"``: the module is imported here, in the driver, so a user estimator, loss,
reward or env fails fast with the import error.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from roll.config.agentic import AgenticConfig
from roll.config.errors import ConfigError
from roll.config.rlvr import RLVRConfig
from roll.config.validation import unused_settings, worker_blocks
from roll.launch.memory_plan import check_memory


def preflight(cfg: Any, gpus: int | None = None) -> list[str]:
    """Run every check that applies to ``cfg``; print and return the warnings (keys accepted but not used).
    ``gpus``: the GPUs this machine has (:func:`visible_gpus`; the launch passes it), None = not checked.

    Raises:
        ConfigError: the first failed check (one line: key, value, what is allowed).
    """
    warnings: list[str] = unused_settings(cfg)
    if gpus is not None:
        check_gpus(cfg, gpus)
    check_strategies(cfg)
    check_kernels(cfg)
    warnings += check_strategy_options(cfg) + check_async_threads(cfg)
    check_weight_sync(cfg)
    check_lora(cfg)
    warnings += check_memory(cfg)
    check_algorithms(cfg)
    check_tracker(cfg)
    if isinstance(cfg, AgenticConfig):
        check_envs(cfg)
        check_agents(cfg)
    if isinstance(cfg, RLVRConfig):
        check_rewards(cfg, check_data(cfg))
    for line in warnings:
        print(f"roll: config warning: {line}", file=sys.stderr, flush=True)
    return warnings


def _lookup(registry: Any, key: str, name: str) -> dict[str, Any]:
    """``registry.capabilities(name)``, or a ConfigError naming ``key`` (unknown name, or a user module that does
    not import)."""
    try:
        return registry.capabilities(name)
    except KeyError as exc:
        raise ConfigError(key, name, str(exc.args[0])) from None
    except ImportError as exc:
        raise ConfigError(key, name, str(exc)) from None


# ---------------------------------------------------------------------------- strategies
def visible_gpus() -> int:
    """The CUDA GPUs this process can use (after ``CUDA_VISIBLE_DEVICES``)."""
    import torch

    return torch.cuda.device_count()


def check_gpus(cfg: Any, gpus: int) -> None:
    """A launch that starts its own single-node Ray (no ``ray_address``) maps roles only onto the ``gpus`` GPUs
    this machine has (a cluster's GPUs are checked against Ray's resources when the placement groups form)."""
    if cfg.ray_address or cfg.num_nodes > 1:
        return
    where = f"this machine has {gpus} visible GPU(s) (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')})"
    for role, worker in worker_blocks(cfg).items():
        if worker.device_mapping and max(worker.device_mapping) >= gpus:
            fix = (
                f"use ids 0..{gpus - 1}"
                if gpus
                else "clear the device mappings and set num_gpus_per_node: 0 for a CPU run"
            )
            raise ConfigError(f"{role}.device_mapping", worker.device_mapping, f"{where}; {fix}")
    if cfg.num_gpus_per_node > gpus:
        raise ConfigError("num_gpus_per_node", cfg.num_gpus_per_node, f"{where}; set it to at most {gpus}")


def check_strategies(cfg: Any) -> None:
    """Each role's strategy is registered, its backend is installed, and it serves that role.

    The install check runs only when this process starts the workers (no ``ray_address``): a driver that joins a
    cluster may lack packages its workers have."""
    from roll.strategies.registry import list_strategies, strategy_spec

    for role, worker in worker_blocks(cfg).items():
        name, key = worker.strategy_args.strategy_name, f"{role}.strategy_args.strategy_name"
        if name == "vllm" and name not in list_strategies():  # the sglang options that replace the vLLM ones
            from roll.config.vllm_compat import vllm_instead

            raise ConfigError(key, name, vllm_instead(worker.strategy_args.strategy_config))
        try:
            spec = strategy_spec(name)
        except ValueError as exc:
            raise ConfigError(key, name, str(exc)) from None
        if spec.module and not cfg.ray_address and not _importable(spec.module):
            raise ConfigError(
                key,
                name,
                f"the {name} backend (python module {spec.module}) is not installed; "
                f"install it with `pip install '{spec.requires or spec.module}'`, or pick "
                f"another strategy",
            )
        if role not in spec.roles:
            valid = [n for n in list_strategies() if role in strategy_spec(n).roles]
            raise ConfigError(key, name, f"{name} cannot serve {role}; valid for {role}: {', '.join(valid)}")
        if worker.use_prefix_sharing not in ("auto", False) and spec.prefix_sharing != "roll":
            from roll.strategies.registry import PREFIX_SHARING

            able = [n for n in list_strategies() if strategy_spec(n).prefix_sharing == "roll"]
            raise ConfigError(
                f"{role}.use_prefix_sharing",
                True,
                f"{name} {PREFIX_SHARING[spec.prefix_sharing]}; "
                f"prefix sharing is for {', '.join(able)}: remove "
                f"the key",
            )


def check_lora(cfg: Any) -> None:
    """LoRA on actor_train needs a strategy that builds adapters (its class sets ``supports_lora``); ``all-linear``
    on one of actor_train / actor_infer and module names on the other must name the same modules of the model."""
    from roll.config.lora import ALL_LINEAR, actor_lora, lora_settings
    from roll.strategies.registry import get_strategy_class

    train = actor_lora(cfg)
    if train is None:
        return
    name = cfg.actor_train.strategy_args.strategy_name
    if not get_strategy_class(name, "actor_train").supports_lora:
        raise ConfigError(
            "actor_train.strategy_args.strategy_name",
            name,
            "LoRA (actor_train.model_args.lora_target) trains on deepspeed_train or fsdp2_train; this strategy "
            "builds no adapters (docs/lora.md)",
        )
    engine = lora_settings(cfg.actor_infer.model_args, "actor_infer.model_args")
    if engine is None or engine.target == train.target:
        return  # other differences are refused by the config's own rules (roll.config.lora.check_agreement)
    from roll.models.lora import linear_names

    linear = linear_names(cfg.actor_train.model_args.model_name_or_path or cfg.pretrain)
    if linear != set(train.names or engine.names or ()):
        where = (
            f"{ALL_LINEAR} is {','.join(sorted(linear))} in this model"
            if linear
            else "the model cannot be read before start; write the same lora_target on both"
        )
        raise ConfigError(
            "actor_infer.model_args.lora_target",
            engine.target_text,
            f"differs from actor_train.model_args.lora_target ({train.target_text}): {where}",
        )


def check_async_threads(cfg: Any, cores: int | None = None) -> list[str]:
    """A warning when ``async_generation_ratio`` runs actor_train and actor_infer at the same time on CPU with more
    threads than cores: idle OpenMP threads spin, and oversubscribed roles slow each other down (measured on 2 cores:
    1.0 s/step against 0.42 s synchronous)."""
    if not getattr(cfg, "async_generation_ratio", 0):
        return []
    cpu_roles = [getattr(cfg, r) for r in ("actor_train", "actor_infer") if not getattr(cfg, r).device_mapping]
    if len(cpu_roles) < 2:
        return []
    cores = cores or os.cpu_count() or 1
    threads = sum(int(max(1, w.num_cpus_per_worker)) * w.world_size for w in cpu_roles)
    if threads <= cores:
        return []
    return [
        f"async_generation_ratio={cfg.async_generation_ratio:g}: actor_train and actor_infer generate and train at "
        f"the same time on CPU with {threads} threads on {cores} cores; oversubscribed OpenMP threads spin and "
        f"slow both down: give them num_cpus_per_worker summing to <= {cores}"
    ]


def check_kernels(cfg: Any) -> None:
    """``model_args.use_liger_kernel`` needs GPUs for the role (Liger's kernels are Triton kernels) and, when this
    process starts the workers, the ``liger-kernel`` package (:mod:`roll.models.kernels`)."""
    for role, worker in worker_blocks(cfg).items():
        if not worker.model_args.use_liger_kernel:
            continue
        key = f"{role}.model_args.use_liger_kernel"
        if not worker.device_mapping:
            raise ConfigError(
                key,
                True,
                f"Liger's kernels run on CUDA GPUs; give {role} a device_mapping or set use_liger_kernel: false",
            )
        if not cfg.ray_address and not _importable("liger_kernel"):
            raise ConfigError(
                key,
                True,
                "the liger-kernel package is not installed; pip install liger-kernel (or "
                "pip install 'roll[gpu]'), or set use_liger_kernel: false",
            )


def _importable(module: str) -> bool:
    """Whether ``module`` (possibly dotted) can be imported here, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # the parent package of a dotted module is missing
        return False


def check_strategy_options(cfg: Any) -> list[str]:
    """Each role's ``strategy_config`` parses into its strategy's options class, kept for every later reader
    (:func:`roll.strategies.registry.strategy_options`: the worker hands it to its strategy); returns warnings for
    keys that are accepted but not used."""
    from roll.strategies.registry import strategy_options

    warnings = []
    for role, worker in worker_blocks(cfg).items():
        key = f"{role}.strategy_args.strategy_config"
        options = strategy_options(worker, key)  # the one parse: every later reader gets this object
        check_worker = getattr(options, "check_worker", None)  # rules involving the worker block or model files
        if check_worker is not None:
            check_worker(worker, key)
        for name, why in getattr(options, "ignored", lambda: [])():
            warnings.append(f"{key}.{name} is ignored: {why}")
    return warnings


def check_weight_sync(cfg: Any) -> None:
    """actor_infer's ``weight_sync`` option fits the placement, and on GPU an engine's TP size equals its worker's
    ``num_gpus_per_worker`` (its TP ranks run on those GPUs); see
    :func:`roll.distributed.placement.weight_sync_mode`."""
    from roll.distributed.placement import ipc_sync_blocker, nccl_sync_blocker, role_mappings
    from roll.strategies.registry import get_strategy_class, strategy_options, strategy_spec

    infer = getattr(cfg, "actor_infer", None)
    if getattr(cfg, "actor_train", None) is None or infer is None:
        return
    key = "actor_infer.strategy_args.strategy_config"
    spec = strategy_spec(infer.strategy_args.strategy_name)
    receives = spec.can("weight_group")
    if not receives:
        return  # such a strategy has no weight_sync option: it always receives weights by copy (or CUDA IPC)
    options = strategy_options(infer, key)
    requested = options.weight_sync
    mappings = role_mappings(cfg)
    blocker = nccl_sync_blocker(mappings, cfg.distributed, receives)
    if requested == "nccl" and blocker:
        raise ConfigError(f"{key}.weight_sync", requested, f"NCCL sync is impossible: {blocker}; use auto or copy")
    ipc_blocker = ipc_sync_blocker(mappings, cfg.distributed, spec.can("ipc_weights"), receives)
    if requested == "cuda_ipc" and ipc_blocker:
        raise ConfigError(
            f"{key}.weight_sync", requested, f"CUDA IPC sync is impossible: {ipc_blocker}; use auto or copy"
        )
    ranks = get_strategy_class(spec.name, "actor_infer").weight_group_ranks(infer, options)
    if infer.device_mapping and ranks != infer.num_gpus_per_worker:
        raise ConfigError(
            f"{key}.tp_size",
            ranks,
            f"must equal actor_infer.num_gpus_per_worker "
            f"({infer.num_gpus_per_worker}): an engine's TP ranks run on its "
            f"worker's GPUs",
        )


def check_tracker(cfg: Any) -> None:
    """``track_with`` names a registered tracker (a user module's tracker is imported here) that accepts
    ``tracker_kwargs``."""
    from roll.tracking import get_tracker_class
    from roll.tracking.base import build_options

    try:
        build_options(get_tracker_class(cfg.track_with), cfg.track_with, dict(cfg.tracker_kwargs))
    except (ValueError, ImportError) as exc:
        raise ConfigError("track_with", cfg.track_with, str(exc)) from None


# ---------------------------------------------------------------------------- algorithms
def check_algorithms(cfg: Any) -> None:
    """Every algorithm name is registered, and what the estimator declares it needs is configured."""
    from roll.algorithms.advantages import ADVANTAGES, estimator_parameters
    from roll.algorithms.aggregation import AGG_MODES
    from roll.algorithms.kl import KL_TYPES
    from roll.algorithms.policy_losses import POLICY_LOSSES
    from roll.algorithms.reward_norm import REWARD_NORM_SCOPES, SCORE_NORMS, resolve_norm_types

    if cfg.reward_norm is not None:
        _lookup(REWARD_NORM_SCOPES, "reward_norm", cfg.reward_norm)
    name = cfg.adv_estimator
    needs = _lookup(ADVANTAGES, "adv_estimator", name)
    known = estimator_parameters(name)
    for key, value in cfg.estimator_args().items():  # the estimator's keyword parameters are its hyperparameters
        if key not in known:
            where = f"adv_estimator_args.{key}" if key in cfg.adv_estimator_args else key
            raise ConfigError(
                where, value, f"not a hyperparameter of adv_estimator {name}; it has {', '.join(known) or 'none'}"
            )
    if needs["needs_critic"] and cfg.critic is None:
        raise ConfigError(
            "adv_estimator",
            name,
            f"{name} needs a critic (its values): add a `critic:` worker block, "
            f"or use a critic-free estimator such as grpo",
        )
    if cfg.critic is not None and not needs["needs_critic"]:
        raise ConfigError(
            "critic",
            "<worker block>",
            f"adv_estimator={name} does not use critic values; remove the "
            f"`critic:` block or use an estimator that needs one (gae)",
        )
    if needs["needs_turns"] and not isinstance(cfg, AgenticConfig):
        raise ConfigError(
            "adv_estimator",
            name,
            f"{name} compares turns that act in the same env state and needs "
            f"multi-turn trajectories (agentic pipeline); use grpo here",
        )
    if needs["needs_groups"] and isinstance(cfg, RLVRConfig) and cfg.num_return_sequences_in_group < 2:
        raise ConfigError(
            "num_return_sequences_in_group",
            cfg.num_return_sequences_in_group,
            f"{name} compares responses of one prompt: use >= 2 (e.g. 8)",
        )
    for key in ("kl_penalty", "kl_loss_type"):
        if _lookup(KL_TYPES, key, getattr(cfg, key))["needs_logits"]:
            raise ConfigError(
                key,
                getattr(cfg, key),
                "this KL type needs the actor's and the reference's full "
                "logits (B x L x V) in one process, which roll's workers do "
                "not exchange; use low_var_kl (k3), kl, abs or mse",
            )
    _lookup(POLICY_LOSSES, "policy_loss", cfg.policy_loss)
    _lookup(AGG_MODES, "loss_agg_mode", cfg.loss_agg_mode)
    if isinstance(cfg, AgenticConfig):
        norm = cfg.reward_normalization
        _lookup(SCORE_NORMS, "reward_normalization.method", norm.method)
        try:
            types = resolve_norm_types(norm.method, norm.norm_mean_type, norm.norm_std_type, norm.grouping == "batch")
        except ValueError as exc:
            key = "norm_mean_type" if norm.norm_mean_type is not None else "norm_std_type"
            raise ConfigError(f"reward_normalization.{key}", getattr(norm, key), str(exc)) from None
        check_group_signal(cfg, needs, types)


def check_group_signal(cfg: AgenticConfig, needs: dict[str, bool], types: tuple[str | None, str | None] | None) -> None:
    """Groups of one env can never give a group-normalized signal: refuse what would train on zeros only (a
    turn-level estimator such as gigpo keeps its same-state term, so it is allowed). ``types``: the normalization's
    (mean, std) scopes (:func:`~roll.algorithms.reward_norm.resolve_norm_types`; None = a user's method): with
    ``grouping: state`` a group's mean, or any std (ROLL's rule), gives a group of one 0."""
    norm, size = cfg.reward_normalization, cfg.train_env_manager.group_size
    if size != 1 or needs["needs_turns"]:
        return
    if needs["needs_groups"]:
        raise ConfigError(
            "train_env_manager.group_size",
            size,
            f"adv_estimator={cfg.adv_estimator} compares the "
            f"episodes of a group, and a group of one gives "
            f"advantage 0 on every step: use >= 2 (e.g. 8)",
        )
    zeroes_singletons = types is None or types[0] == "group" or types[1] is not None
    if norm.grouping == "state" and zeroes_singletons:
        what = f"method {norm.method}" if types is None else f"mean {types[0]}, std {types[1]}"
        raise ConfigError(
            "train_env_manager.group_size",
            size,
            f"reward_normalization (grouping state, {what}) normalizes within groups, and a group of one becomes 0 "
            f"on every step: use >= 2, or grouping batch / method identity",
        )


# ---------------------------------------------------------------------------- envs (agentic)
def check_envs(cfg: AgenticConfig) -> None:
    """Every tag an env manager uses names a registered env that accepts its ``env_config`` and is built within
    ``env_step_timeout`` (the constructor is user code: it runs on a :class:`~roll.calls.CallPool` thread)."""
    from roll.calls import CallPool
    from roll.envs.registry import get_env_class, make_env

    managers = [m for m in (cfg.train_env_manager, cfg.val_env_manager) if m is not None]
    timeout = min(m.env_step_timeout for m in managers) if managers else 0.0
    pool = CallPool(1)
    for tag in dict.fromkeys(t for m in managers for t in m.tags):
        spec = cfg.custom_envs[tag]
        try:
            get_env_class(spec.env_type)
        except (ValueError, ImportError) as exc:
            raise ConfigError(f"custom_envs.{tag}.env_type", spec.env_type, str(exc)) from None
        built = pool.run_all([lambda spec=spec: make_env(spec.env_type, dict(spec.env_config))], timeout)[0]
        if built.timed_out:
            raise ConfigError(
                f"custom_envs.{tag}.env_type",
                spec.env_type,
                f"building the env did not return within env_step_timeout={timeout}s; its constructor hangs",
            )
        if isinstance(built.error, (TypeError, ValueError)):
            raise ConfigError(f"custom_envs.{tag}.env_config", dict(spec.env_config), str(built.error)) from None
        if built.error is not None:
            raise built.error


def check_agents(cfg: AgenticConfig) -> None:
    """Tags with ``env_manager_cls: proxy``: fastapi and uvicorn are installed, ``agent_runner_cls`` imports and is
    built with ``agent_runner_kwargs``, ``tool_parser`` is registered."""
    managers = [m for m in (cfg.train_env_manager, cfg.val_env_manager) if m is not None]
    tags = [t for t in dict.fromkeys(t for m in managers for t in m.tags) if cfg.custom_envs[t].uses_gateway]
    if not tags:
        return
    from roll.agentic.gateway.runners import RunnerArgumentsError, load_runner
    from roll.agentic.gateway.tool_parsers import TOOL_PARSERS

    missing = [p for p in ("fastapi", "uvicorn") if not _importable(p)]
    if missing:
        raise ConfigError(
            f"custom_envs.{tags[0]}.env_manager_cls",
            cfg.custom_envs[tags[0]].env_manager_cls,
            f"the gateway needs {', '.join(missing)}: pip install 'roll[agents]'",
        )
    for tag in tags:
        spec = cfg.custom_envs[tag]
        try:
            load_runner(spec.agent_runner_cls or "", spec.agent_runner_kwargs)
        except RunnerArgumentsError as exc:
            raise ConfigError(f"custom_envs.{tag}.agent_runner_kwargs", spec.agent_runner_kwargs, str(exc)) from None
        except (ImportError, TypeError, ValueError) as exc:
            raise ConfigError(f"custom_envs.{tag}.agent_runner_cls", spec.agent_runner_cls, str(exc)) from None
        try:
            TOOL_PARSERS.resolve(spec.tool_parser)
        except (KeyError, ImportError) as exc:
            raise ConfigError(f"custom_envs.{tag}.tool_parser", spec.tool_parser, str(exc)) from None


# ---------------------------------------------------------------------------- data and rewards (RLVR)
def data_files(cfg: RLVRConfig) -> dict[str, list[str]]:
    """The absolute paths of the train and validation data files (``{"train": [...], "validation": [...]}``)."""
    from roll.data.files import resolve_data_files

    out = {}
    for what, key, files in (
        ("train", "actor_train.data_args.file_name", cfg.actor_train.data_args.file_name),
        ("validation", "validation.file_name", cfg.validation.file_name),
    ):
        try:
            out[what] = resolve_data_files(list(files or []))
        except ValueError as exc:
            name, _, why = str(exc).partition(": ")
            raise ConfigError(key, name, why) from None
    return out


def check_data(cfg: RLVRConfig) -> set[str]:
    """The data files exist and every row is well formed (malformed rows are listed with their row numbers);
    returns the data's tags."""
    from roll.data.rlvr_dataset import DatasetValidationError, load_rlvr_dataset

    args, tags = cfg.actor_train.data_args, set()
    for what, files in data_files(cfg).items():
        if not files:
            continue
        try:
            examples = load_rlvr_dataset(
                files,
                prompt_key=args.prompt or "prompt",
                messages_key=args.messages,
                ground_truth_key=cfg.ground_truth_key,
                tag_key=cfg.tag_key,
                default_tag=cfg.default_tag,
            )
        except DatasetValidationError as exc:
            key = "actor_train.data_args.file_name" if what == "train" else "validation.file_name"
            raise ConfigError(key, files, str(exc)) from None
        tags |= {ex.tag for ex in examples}
    return tags


def check_rewards(cfg: RLVRConfig, tags: set[str]) -> None:
    """Every reward named in ``rewards`` is registered and accepts its options; every data tag (``tags``) has one."""
    from roll.rewards import math_answer  # noqa: F401  (registers the built-in rewards)
    from roll.rewards.registry import REWARDS, reward_option_names

    rewards = cfg.rewards
    for tag, name in rewards.tag_to_reward.items():
        _lookup(REWARDS, f"rewards.tag_to_reward.{tag}", name)
    for name, options in rewards.reward_options.items():
        _lookup(REWARDS, f"rewards.reward_options.{name}", name)
        accepted = reward_option_names(REWARDS.resolve(name))
        unknown = sorted(set(options) - set(accepted)) if accepted is not None else []
        if unknown:
            raise ConfigError(
                f"rewards.reward_options.{name}.{unknown[0]}",
                options[unknown[0]],
                f"not an option of reward {name!r}; it accepts {accepted}",
            )
    for tag in sorted(tags):
        name = rewards.tag_to_reward.get(tag, tag)
        try:
            REWARDS.get(name)
        except (KeyError, ImportError):
            raise ConfigError(
                "rewards.tag_to_reward",
                dict(rewards.tag_to_reward),
                f"data tag {tag!r} has no reward: map it to one of {REWARDS.names()} (e.g. "
                f"{{{tag}: math}}), or register a reward named {tag!r}",
            ) from None
