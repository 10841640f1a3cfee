"""ROLL v0.3+ key names in roll configs: one table of aliases, ignored keys and unsupported keys, applied by the
loader to the composed, resolved config before the dataclasses are built.

Each fact has one owner: roll's dataclasses hold the canonical name; this module holds ROLL's name for it.

- :data:`ALIASES`: ROLL's name -> roll's canonical name, same meaning (``num_env_groups`` -> ``env_groups``). A
  block that sets both is a one-line :class:`ConfigError`.
- :data:`VALUE_ALIASES`: ROLL's values of a roll key (``grouping: traj_group_id`` -> ``state``).
- :data:`IGNORED`: keys that mean nothing in roll (``use_thread_lock``; ``env_manager_cls`` unless it names
  ROLL's ``ProxyEnvManager``): dropped, and named in ONE warning line (:func:`translate` returns them; the loader
  prints the line).
- :data:`UNSUPPORTED`: ROLL features roll does not have: a one-line error saying what to use instead (unless the
  value is off: null, false, 0, empty, or for a key of :data:`ACTED_ON` the value roll acts on, e.g.
  ``rl_loss_coef: 1``), never fields of roll's schema. Such a value is dropped without a word.

Paths are dotted, with ``<manager>`` for ``train_env_manager`` / ``val_env_manager``, ``<role>`` for a worker
block and ``<tag>`` for a ``custom_envs`` entry. The env templates need more than a rename (ROLL's
``agent_template`` serves every turn, its VLTrajEnvManager's ``pre_step_template`` and ``next_step_template`` frame
the image; roll has a first-turn and a later-turn template): :func:`_env_block`.
"""

from __future__ import annotations

from typing import Any

from roll.config.errors import ConfigError
from roll.config.validation import ROLES

MANAGERS = ("train_env_manager", "val_env_manager")

#: ROLL's name -> roll's name (same meaning), per block pattern.
ALIASES: dict[str, dict[str, str]] = {
    "": {
        "step_reward_weight": "step_adv_weight",
        "episode_reward_weight": "episode_adv_weight",
        "step_reward_gamma": "gamma",
    },
    "<manager>": {
        "num_env_groups": "env_groups",
        "num_groups_partition": "n_groups",
        "max_env_num_per_worker": "env_threads",
    },
    "<tag>": {"max_steps": "max_actions_per_traj", "agent_system_template": "system_prompt"},
    "<tag>.env_config": {"action_pattern": "action_format"},
}
#: ROLL's values of a roll key -> roll's value.
VALUE_ALIASES: dict[str, dict[Any, Any]] = {
    "reward_normalization.grouping": {"traj_group_id": "state", "tags": "inductive", "batch": "batch"},
    "<role>.model_args.attn_implementation": {"fa2": "flash_attention_2", "sdpa": "sdpa", "eager": "eager"},
    "<tag>.agent_runner_cls": {
        "roll.pipeline.agentic.agent_runner.gem_runner.GEMRunner": "roll.agentic.gateway.runners.EnvRunner"
    },
}
#: ROLL's action patterns that are roll's named formats (other patterns pass through as regexes).
ACTION_PATTERNS = {"<answer>(.*?)</answer>": "answer", r"<think>(.*?)</think>\s*<answer>(.*?)</answer>": "think_answer"}
#: Keys without meaning in roll: dropped with one warning line naming them (why, in the migration guide).
IGNORED: dict[str, str] = {
    "<tag>.use_thread_lock": "roll steps each env in one thread at a time",
    "<tag>.max_env_step_concurrent": "concurrency is <manager>.env_threads",
    "<tag>.user_prompt_format": "ROLL's env managers do not read it; the answer format is in the templates",
    "<role>.model_args.model_type": "roll loads the model class from its config.json",
    "<role>.model_args.flash_attn": "use model_args.attn_implementation",
    "<role>.use_remove_padding": "roll packs sequences with use_sequence_packing",
    "<role>.offload_nccl": "roll's weight groups are created once and kept",
    "<role>.name": "a role's name is its block",
    "<role>.worker_cls": "roll's workers are chosen by the role",
    "checkpoint_config.type": "roll writes checkpoints to the file system (output_dir)",
    "checkpoint_config.output_dir": "roll writes checkpoints under output_dir",
    "profiler_memory": "use roll's benchmarks/ and the tracker's memory metrics",
    "batch_adjust_mode": "roll trains the samples of a batch of episodes (one per turn in trajectory_mode: step) "
    "in one optimizer step, so their number may vary and is never adjusted",
    "<role>.sequence_length_round_in_train": "roll pads a micro-batch to its longest sample",
    "<role>.sequence_length_round_in_infer": "roll pads a micro-batch to its longest sample",
}
#: ROLL keys of features roll does not have: key -> what to use instead (an error unless the value is off).
UNSUPPORTED: dict[str, str] = {
    "<tag>.tool_wrapper": "tools are envs in roll (docs/envs.md, the tool_use env)",
    "<role>.model_args.freeze_module_prefix": "roll freezes one module, a vision-language model's vision tower: "
    "freeze_module_prefix naming it (vision_model, visual) becomes model_args.freeze_vision_tower; other "
    "prefixes are not implemented",
    "<role>.model_args.ulysses_size": "sequence parallelism is not implemented in roll; use a shorter "
    "sequence_length or Megatron's tensor parallelism",
    "<role>.training_args.warmup_ratio": "use training_args.warmup_steps",
    "<role>.pg_variant": "roll's policy losses are policy_loss (ppo, gspo) and the registry (docs/algorithms.md)",
    "rollout_mock": "record and replay rollouts with trajectory_dump_steps and `roll view`",
    "<manager>.group_size_redundancy": "roll trains complete groups only and bounds staleness by admission; for "
    "stragglers give more env_groups than a batch needs with "
    "async_generation_ratio >= 1 (docs/async.md)",
    "<manager>.worker_cls": "roll's env manager plays every env tag; register an env instead (docs/envs.md)",
    "l2": "an L2 term in the loss is not implemented; use <role>.training_args.weight_decay (AdamW)",
    "sft_loss_coef": "an SFT loss on positive samples is not implemented; sft_warmup trains on demonstrations "
    "before RL",
    "rl_loss_coef": "the policy-gradient loss always has weight 1; remove the key or set it to 1",
    "use_topr_loss": "the TOPR loss is not implemented; policy_loss names the loss (ppo, gspo or a registered one)",
    "use_reward_scaling": "use reward_norm with reward_shift / reward_scale (RLVR) or reward_normalization (agentic)",
    "use_reward_norm": "use reward_norm with reward_shift / reward_scale (RLVR) or reward_normalization (agentic)",
    "add_len_reward": "a response-length reward is not implemented; register a reward that adds one (docs/rlvr.md)",
    "difficulty_loss_weight": "weighting the loss by prompt difficulty is not implemented",
    "length_loss_weight": "weighting the loss by response length is not implemented; loss_agg_mode sets how token "
    "losses are averaged",
}
#: Values that mean "off" for an unsupported key.
OFF: tuple[Any, ...] = (None, False, 0, 0.0, "", [], {})
#: Unsupported keys whose value that changes nothing is not an "off" value: that value (any other is an error).
ACTED_ON = {"rl_loss_coef": 1.0}


def _patterns(path: str) -> list[str]:
    """The table patterns a concrete dotted ``path`` matches (``train_env_manager.x`` -> ``<manager>.x``)."""
    parts = path.split(".")
    out = [path]
    if parts[0] in MANAGERS:
        out.append(".".join(["<manager>", *parts[1:]]))
    if parts[0] in ROLES:
        out.append(".".join(["<role>", *parts[1:]]))
    if parts[0] == "custom_envs" and len(parts) > 1:
        out.append(".".join(["<tag>", *parts[2:]]))
    return out


def _lookup(table: dict[str, Any], path: str) -> Any:
    return next((table[p] for p in _patterns(path) if p in table), None)


def translate(tree: dict[str, Any], given: dict[str, Any] | None = None) -> list[str]:
    """Rewrite ROLL key names and values in a resolved config ``tree`` (in place) to roll's; return the dotted
    paths of the ignored keys that were dropped (for one warning line). ``given`` is the tree as written (before
    the schema's defaults were merged in), to tell a key the config sets from a default.

    Raises:
        ConfigError: a block sets a ROLL name and its roll name; an unsupported ROLL key is set.
    """
    ignored: list[str] = []
    for name, env in (tree.get("custom_envs") or {}).items():
        if isinstance(env, dict):
            ignored += _env_block(env, f"custom_envs.{name}")
    _train_sampling(tree, given if given is not None else tree)
    _block_envs(tree)
    written = given if given is not None else tree
    _norm_types(tree.get("reward_normalization"), written.get("reward_normalization"))
    _walk(tree, "", ignored, tree if given is None else given)
    for name, env in (tree.get("custom_envs") or {}).items():
        if isinstance(env, dict):
            ignored += _manager_cls(env, f"custom_envs.{name}")
    return ignored


def _walk(node: dict[str, Any], prefix: str, ignored: list[str], given: Any) -> None:
    """Translate ``node`` (at dotted ``prefix``); ``given`` is the same block as written (not a mapping where the
    block came by interpolation, whose resolved form then holds only the config's keys)."""
    written = given if isinstance(given, dict) else node
    for key in list(node):
        path = f"{prefix}{key}"
        value = node[key]
        if _lookup(IGNORED, path) is not None:
            del node[key]
            if value is not None:
                ignored.append(path)
            continue
        if key == "freeze_module_prefix" and _names_vision_tower(value):  # ROLL's VL configs freeze the tower
            del node[key]
            node["freeze_vision_tower"] = True
            continue
        instead = _lookup(UNSUPPORTED, path)
        if instead is not None:
            if not _harmless(path, value):
                raise ConfigError(path, value, f"a ROLL key roll does not support: {instead}")
            del node[key]
            continue
        block = _lookup(ALIASES, prefix[:-1]) if prefix else ALIASES[""]
        if block and key in block:
            canonical = block[key]
            if canonical in written:
                raise ConfigError(path, value, f"ROLL's name for {prefix}{canonical}, which is set too; keep one")
            node[canonical] = node.pop(key)
            key, path = canonical, f"{prefix}{canonical}"
            value = node[key]
        values = _lookup(VALUE_ALIASES, path)
        if values and isinstance(value, str) and value in values:
            node[key] = values[value]
            if node[key] == "flash_attention_2" and not _has_flash_attn():  # ROLL's fa2 on a machine without it
                node[key] = None
                ignored.append(f"{path}={value} (flash-attn is not installed here: transformers' default attention)")
        elif isinstance(value, dict) and not path.endswith(("strategy_config", "system_envs", "tracker_kwargs")):
            _walk(value, path + ".", ignored, written.get(key))


#: Module prefixes of a vision tower in ROLL's configs (mcore_adapter's ``vision_model``, transformers' ``visual``).
VISION_TOWER_PREFIXES = ("vision_model", "visual", "model.visual", "vision_tower")


def _names_vision_tower(value: Any) -> bool:
    """Whether ROLL's ``freeze_module_prefix`` (a prefix, a comma string or a list) names only a vision tower."""
    parts = value.split(",") if isinstance(value, str) else value if isinstance(value, list) else []
    return bool(parts) and all(str(p).strip() in VISION_TOWER_PREFIXES for p in parts)


def _has_flash_attn() -> bool:
    """Whether the flash-attn package is installed (found, not imported)."""
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def _is_off(value: Any) -> bool:
    return any(value is off or (type(value) is type(off) and value == off) for off in OFF)


def _harmless(path: str, value: Any) -> bool:
    """Whether an unsupported key's ``value`` changes nothing: its :data:`ACTED_ON` value, else an "off" value."""
    acted_on = _lookup(ACTED_ON, path)
    if acted_on is None:
        return _is_off(value)
    return not isinstance(value, bool) and isinstance(value, (int, float)) and value == acted_on


#: ROLL's env manager class of step prompts: every turn a new conversation, one sample per turn.
STEP_ENV_MANAGER = "StepEnvManager"
#: ROLL's env manager classes whose prompts roll does not build: class name -> what to use instead.
UNSUPPORTED_MANAGERS = {
    "StepConcatEnvManager": "GEM's concatenated-observation step prompts are not built by roll; use StepEnvManager's "
    "(turn_prompt: fresh, whose {history} summarises the last turns) or roll's token history",
}


def _env_block(env: dict[str, Any], key: str) -> list[str]:
    """ROLL's env block: ``agent_template`` (every turn; fields ``{turn_idx}``, ``{observation}``,
    ``{actions_left}``, ``{max_response_length}``) becomes roll's ``turn_template`` and, after the env's
    instruction, its ``first_turn_template``; ``env_config.action_pattern`` becomes a named format when it is one.
    ``env_manager_cls: ...StepEnvManager`` sets ``turn_prompt: fresh`` and ``trajectory_mode: step`` (the template
    then holds ``{env_instruction}`` itself, on every turn); ``env_config.trajectory_mode`` (where ROLL's proxy env
    manager reads it) moves to the block. A block with ROLL's templates and no ``max_steps`` of its own (ROLL
    v0.2's env files) counts turns as ROLL does, up to ``env_config.max_steps``. ROLL's vision-language templates
    and v0.2 keys: :func:`_vl_templates`, :func:`_v02_env_keys`. Returns the dropped keys for the warning line."""
    manager = env.get("env_manager_cls")
    name = manager.rsplit(".", 1)[-1] if isinstance(manager, str) else None
    rolls_templates = any(n in env for n in ("agent_template", *VL_TEMPLATES))
    if name in UNSUPPORTED_MANAGERS:
        raise ConfigError(f"{key}.env_manager_cls", manager, UNSUPPORTED_MANAGERS[name])
    step = name == STEP_ENV_MANAGER
    if step:
        env.pop("env_manager_cls")
        env.setdefault("turn_prompt", "fresh")
        env.setdefault("trajectory_mode", "step")
    config = env.get("env_config")
    if isinstance(config, dict) and "trajectory_mode" in config:
        if "trajectory_mode" in env and env["trajectory_mode"] != config["trajectory_mode"]:
            raise ConfigError(
                f"{key}.env_config.trajectory_mode",
                config["trajectory_mode"],
                f"differs from {key}.trajectory_mode={env['trajectory_mode']!r}; keep one",
            )
        env["trajectory_mode"] = config.pop("trajectory_mode")
    template = env.pop("agent_template", None)
    if template is not None:
        for name in ("turn_template", "first_turn_template"):
            if name in env:
                raise ConfigError(
                    f"{key}.agent_template",
                    template,
                    f"ROLL's template for every turn, and {key}.{name} is set too; keep one",
                )
        env["turn_template"] = template
        env["first_turn_template"] = template if step else "{instruction}\n" + template
    ignored = _vl_templates(env, key, template is not None, step)
    if isinstance(config, dict):
        _v02_env_keys(env, config, key)
        if rolls_templates and "max_steps" in config and not {"max_steps", "max_actions_per_traj"} & set(env):
            env["max_actions_per_traj"] = config["max_steps"]  # ROLL's {actions_left} counts the env's max_steps
    if isinstance(config, dict) and isinstance(config.get("action_pattern"), str):
        config["action_pattern"] = ACTION_PATTERNS.get(config["action_pattern"], config["action_pattern"])
    return ignored


#: ROLL's VLTrajEnvManager's templates: a turn's user message is ``pre_step_template`` (``{turn_idx}``), the
#: observation's frame, then ``next_step_template`` (``{actions_left}``, ``{max_response_length}``).
VL_TEMPLATES = ("pre_step_template", "next_step_template")


def _vl_templates(env: dict[str, Any], key: str, had_agent_template: bool, step: bool) -> list[str]:
    """ROLL's ``pre_step_template`` + frame + ``next_step_template`` become roll's templates with ``{image}``
    between them (the first turn after the env's instruction, as ROLL's VLTrajEnvManager writes it). ROLL v0.2's
    ``reward_template`` (``{reward}``) goes before every later turn's template, as its managers wrote it (with
    ROLL's StepEnvManager it is dropped and returned). A template set twice is a one-line error."""
    pre, post = (env.pop(name, None) for name in VL_TEMPLATES)
    if pre is not None or post is not None:
        for name in ("turn_template", "first_turn_template"):
            if had_agent_template or name in env:
                other = "agent_template" if had_agent_template else name
                raise ConfigError(
                    f"{key}.pre_step_template",
                    pre,
                    f"ROLL's VLTrajEnvManager template, and {key}.{other} is set too; keep one",
                )
        body = (pre or "") + "{image}" + (post or "")
        env["first_turn_template"], env["turn_template"] = "{instruction}" + body, body
    reward = env.pop("reward_template", None)
    if reward is None:
        return []
    if step:
        return [f"{key}.reward_template"]
    if not had_agent_template and pre is None and post is None:
        raise ConfigError(
            f"{key}.reward_template",
            reward,
            "ROLL writes it before agent_template or pre_step_template, and neither is set; with roll's "
            "turn_template put {reward} in it",
        )
    env["turn_template"] = reward + env["turn_template"]
    return []


def _v02_env_keys(env: dict[str, Any], config: dict[str, Any], key: str) -> None:
    """ROLL v0.2's env kwargs: ``dim_x`` and ``dim_y`` are ``dim_room: [dim_x, dim_y]``; ``env_instruction`` (the
    task rules shown first) becomes the block's ``instruction``."""
    if "dim_x" in config or "dim_y" in config:
        if "dim_x" not in config or "dim_y" not in config or "dim_room" in config:
            raise ConfigError(
                f"{key}.env_config.dim_x",
                config.get("dim_x"),
                "ROLL's dim_x and dim_y are dim_room: [dim_x, dim_y]; set both, or dim_room alone",
            )
        config["dim_room"] = [config.pop("dim_x"), config.pop("dim_y")]
    if "env_instruction" in config:
        if "instruction" in env:
            raise ConfigError(
                f"{key}.env_config.env_instruction",
                config["env_instruction"],
                f"ROLL's name for {key}.instruction, which is set too; keep one",
            )
        env["instruction"] = config.pop("env_instruction")


def _manager_cls(env: dict[str, Any], key: str) -> list[str]:
    """ROLL's ``env_manager_cls``: a ``...ProxyEnvManager`` is kept (agent runners through the gateway); any other
    class (``TrajEnvManager``, ``StepEnvManager``, ...) is dropped, roll's env manager plays the tag (returned for
    the warning line). ``agent_runner_cls: null`` is dropped; a runner that is set is kept (checked with the
    manager)."""
    if env.get("agent_runner_cls", "") is None:
        del env["agent_runner_cls"]
    cls = env.get("env_manager_cls")
    if cls is None or cls in ("traj", "proxy") or str(cls).endswith("ProxyEnvManager"):
        return []
    del env["env_manager_cls"]
    return [f"{key}.env_manager_cls"]


def _train_sampling(tree: dict[str, Any], given: dict[str, Any]) -> None:
    """ROLL's ``train_env_manager.generating_args`` is the training rollouts' sampling: merged into
    ``actor_infer.generating_args`` (a key the config sets in both places with different values is an error)."""
    manager = tree.get("train_env_manager")
    sampling = manager.pop("generating_args", None) if isinstance(manager, dict) else None
    if not sampling:
        return
    infer = tree.setdefault("actor_infer", {}).setdefault("generating_args", {})
    written = (given.get("actor_infer") or {}) if isinstance(given.get("actor_infer"), dict) else {}
    written = written.get("generating_args") if isinstance(written.get("generating_args"), dict) else {}
    for key, value in sampling.items():
        if key in written and written[key] != value:
            raise ConfigError(
                f"train_env_manager.generating_args.{key}",
                value,
                f"differs from actor_infer.generating_args.{key}={written[key]!r}, which is the same "
                f"setting (training rollouts' sampling); keep one",
            )
        infer[key] = value


def _block_envs(tree: dict[str, Any]) -> None:
    """ROLL's per-role and per-manager ``system_envs`` join the top-level ``system_envs`` (roll sets one set of
    variables in every worker); one variable with two values is an error."""
    merged = tree.setdefault("system_envs", {}) if tree.get("system_envs") is not None else {}
    for name in (*ROLES, *MANAGERS):
        block = tree.get(name)
        extra = block.pop("system_envs", None) if isinstance(block, dict) else None
        for var, value in (extra or {}).items():
            if var in merged and str(merged[var]) != str(value):
                raise ConfigError(
                    f"{name}.system_envs.{var}",
                    value,
                    f"differs from system_envs.{var}={merged[var]!r}; roll sets one value in every worker",
                )
            merged[var] = value
    if merged:
        tree["system_envs"] = merged


#: ROLL's default ``reward_normalization.method`` (roll's is ``mean_std``): what a block that sets ROLL's norm types
#: and no method derives its unset type from.
ROLL_DEFAULT_NORM_METHOD = "identity"


def _norm_types(block: Any, written: Any) -> None:
    """ROLL's ``norm_mean_type`` / ``norm_std_type`` are roll's keys too; ROLL derives a type left null from
    ``method``, whose default there is ``identity``: a block that sets a norm type and no ``method`` (``written``,
    the block as the config wrote it) gets ROLL's default, so its null type means "none", as in ROLL."""
    if not isinstance(block, dict) or not isinstance(written, dict):
        return
    sets_type = written.get("norm_mean_type") is not None or written.get("norm_std_type") is not None
    if sets_type and "method" not in written:
        block["method"] = ROLL_DEFAULT_NORM_METHOD


def is_alias_key(dotted: str) -> bool:
    """Whether a command-line override names a ROLL key this module handles (the loader adds it with ``+``)."""
    parent, _, leaf = dotted.rpartition(".")
    block = _lookup(ALIASES, parent) if parent else ALIASES[""]
    return (
        bool(block and leaf in block)
        or _lookup(IGNORED, dotted) is not None
        or _lookup(UNSUPPORTED, dotted) is not None
        or (dotted.startswith("custom_envs.") and leaf in ("agent_template", "reward_template", *VL_TEMPLATES))
    )


def warning_line(ignored: list[str]) -> str:
    """The one warning line naming the dropped keys."""
    return f"ROLL keys without meaning in roll, ignored: {', '.join(ignored)} (docs/migrating_from_roll.md says why)"
