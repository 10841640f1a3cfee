"""Pure rules of a loaded config: each field's choices and range (declared on the field, ``fld(..., allowed=...)``,
checked by :func:`check_fields`), device mappings and the rules that span several fields.

:func:`normalize` puts spellings into their canonical form once, when the config loads (``device_mapping`` strings
into lists, ``world_size`` from the mapping, a single data file into a list); :func:`validate` then only reads.
Each rule raises :class:`ConfigError` with the key, value and fix. The rules of one pipeline live next to its
dataclasses (``AgenticConfig.check_pipeline``, ``RLVRConfig.check_pipeline``).

Nothing here imports above ``roll.config``: rules that need the registries (estimators, losses, rewards, envs,
strategies), installed packages or data files run in the preflight at launch (:mod:`roll.launch.preflight`).
"""

from __future__ import annotations

import ast
import dataclasses
from typing import Any

from roll.config.errors import ConfigError
from roll.config.fields import check_field
from roll.config.lora import check_lora, reference_from_actor, share_engine_lora
from roll.config.megatron import MEGATRON_STRATEGIES, parse_megatron_options
from roll.config.worker import MASKLESS_ATTENTION

#: The worker blocks of a config (their proxies: :mod:`roll.distributed.roles`).
ROLES = ("actor_train", "actor_infer", "reference", "critic")


def worker_blocks(cfg: Any) -> dict[str, Any]:
    """role -> worker block, for each of :data:`ROLES` that ``cfg`` configures (a missing or null block is left
    out), in :data:`ROLES` order."""
    return {role: getattr(cfg, role) for role in ROLES if getattr(cfg, role, None) is not None}


def check_choices(obj: Any, prefix: str = "") -> None:
    """Check every field's declared ``choices`` and ``allowed`` range, recursively through nested dataclasses and
    dicts."""
    if not dataclasses.is_dataclass(obj):
        return
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}{f.name}"
        check_field(f, value, key)
        if dataclasses.is_dataclass(value):
            check_choices(value, key + ".")
        elif isinstance(value, dict):
            for k, v in value.items():
                check_choices(v, f"{key}.{k}.")
        elif isinstance(value, list):
            for i, v in enumerate(value):
                check_choices(v, f"{key}.{i}.")


def parse_device_mapping(value: Any, key: str = "device_mapping") -> list[int]:
    """A device mapping as a list of GPU ids: a list, None/'' (CPU), or the string ``list(range(a, b[, s]))``."""
    if value is None or value == "" or value == []:
        return []
    if isinstance(value, str):
        text = value.strip()
        try:
            tree = ast.parse(text, mode="eval").body
            if (
                isinstance(tree, ast.Call)
                and isinstance(tree.func, ast.Name)
                and tree.func.id == "list"
                and len(tree.args) == 1
                and isinstance(tree.args[0], ast.Call)
                and getattr(tree.args[0].func, "id", None) == "range"
            ):
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


def normalize(cfg: Any) -> None:
    """Canonical forms, set once when the config loads: each role's ``device_mapping`` as a list of GPU ids and, on
    GPU, its ``world_size`` = ``len(device_mapping) / num_gpus_per_worker``; ``data_args.file_name`` as a list;
    actor_infer's LoRA keys from actor_train's (:func:`roll.config.lora.share_engine_lora`)."""
    for role, worker in worker_blocks(cfg).items():
        worker.device_mapping = parse_device_mapping(worker.device_mapping, f"{role}.device_mapping")
        if (
            worker.device_mapping
            and worker.num_gpus_per_worker >= 1
            and len(worker.device_mapping) % worker.num_gpus_per_worker == 0
        ):
            worker.world_size = len(worker.device_mapping) // worker.num_gpus_per_worker
        worker.data_args.file_name = _file_list(worker.data_args.file_name, f"{role}.data_args.file_name")
    share_engine_lora(cfg)


def check_workers(cfg: Any) -> None:
    """Device mappings are lists of GPU ids that fit the declared GPUs and split into whole workers; sampling and
    prefix-sharing rules; dynamic batching has a token budget."""
    total_gpus = cfg.num_gpus_per_node * cfg.num_nodes
    for role, worker in worker_blocks(cfg).items():
        mapping = parse_device_mapping(worker.device_mapping, f"{role}.device_mapping")
        if mapping:
            if total_gpus == 0:
                raise ConfigError(
                    f"{role}.device_mapping",
                    mapping,
                    "GPU ids given but num_gpus_per_node is 0; set num_gpus_per_node or clear the mapping",
                )
            if max(mapping) >= total_gpus:
                raise ConfigError(
                    f"{role}.device_mapping", mapping, f"ids must be < num_nodes * num_gpus_per_node = {total_gpus}"
                )
            if len(mapping) % worker.num_gpus_per_worker:
                raise ConfigError(
                    f"{role}.num_gpus_per_worker",
                    worker.num_gpus_per_worker,
                    f"must divide len(device_mapping) = {len(mapping)}",
                )
        if role == "actor_infer":
            worker.generating_args.check(f"{role}.generating_args")
        if worker.use_prefix_sharing not in ("auto", False):  # true: required, so checked
            check_prefix_sharing(worker, role)
        for phase in ("train", "infer"):
            budget = getattr(worker, f"max_tokens_per_microbatch_in_{phase}")
            if getattr(worker, f"use_dynamic_batching_in_{phase}") and budget < 1:
                raise ConfigError(
                    f"{role}.max_tokens_per_microbatch_in_{phase}",
                    budget,
                    f"must be >= 1 with use_dynamic_batching_in_{phase}: true (e.g. 8192)",
                )


def check_prefix_sharing(worker: Any, role: str) -> None:
    """``use_prefix_sharing: true`` needs no packing and an attention implementation that takes a mask (that the
    strategy runs roll's log-prob forward is its registry entry's ``prefix_sharing``, checked by the preflight)."""
    key = f"{role}.use_prefix_sharing"
    if worker.use_sequence_packing:
        raise ConfigError(key, True, f"cannot be combined with {role}.use_sequence_packing; choose one")
    if worker.model_args.attn_implementation in MASKLESS_ATTENTION:
        raise ConfigError(
            key,
            True,
            f"{role}.model_args.attn_implementation="
            f"{worker.model_args.attn_implementation} takes no attention mask; use sdpa or "
            f"eager (or leave it unset)",
        )


def _file_list(value: Any, key: str) -> list[str] | None:
    """``data_args.file_name`` as a list of paths: None stays None, one path becomes ``[path]``."""
    if value is None or isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    if isinstance(value, str):
        return [value]
    raise ConfigError(key, value, "expected a path or a list of paths")


#: Keys the agentic pipeline does not act on yet (the RLVR pipeline does), with the only value it accepts. ROLL's keys
#: that no pipeline acts on are not in the schema: :data:`roll.config.roll_compat.UNSUPPORTED` refuses them.
NOT_IMPLEMENTED_AGENTIC = {"actor_infer.model_update_frequency": 1}


PIPELINES = ("agentic", "RLVR")
#: The value a key of :data:`UNUSED` is acted on at: the field's default.
DEFAULT = "<default>"
#: Keys of the config roll accepts but does not act on, in one table: key -> (the pipelines that do not act on it,
#: the value they act on (:data:`DEFAULT`: the field's default), why and what to do instead). Any other value is a
#: warning at launch (printed by the preflight), never silently ignored. Beside it: a strategy's options name their
#: own unused keys (``ignored()``), and ROLL's keys without meaning in roll are dropped when the config loads
#: (:data:`roll.config.roll_compat.IGNORED`).
UNUSED: dict[str, tuple[tuple[str, ...], Any, str]] = {
    "generate_opt_level": (
        PIPELINES,
        1,
        "roll has one generation protocol (requests are submitted and polled; the "
        "engine batches whatever is pending); remove the key or set it to 1",
    ),
    "is_num_return_sequences_expand": (
        PIPELINES,
        True,
        "roll always sends each of a prompt's samples as its own "
        "request (the samples are the same; SGLang's prefix cache "
        "shares the prompt); remove the key or set it to true",
    ),
    "prompt_length": (
        ("agentic",),
        DEFAULT,
        "the agentic pipeline does not cut prompts; a whole sample is bounded by sequence_length",
    ),
    "response_length": (
        ("agentic",),
        DEFAULT,
        "the agentic pipeline limits each turn instead: use custom_envs.<tag>.max_tokens_per_step",
    ),
    "num_return_sequences_in_group": (
        ("agentic",),
        DEFAULT,
        "the agentic group size is train_env_manager.group_size (envs sharing a seed)",
    ),
    "reward_norm": (("agentic",), DEFAULT, "agentic scores are normalized by reward_normalization.grouping / .method"),
    "reward_shift": (("agentic",), DEFAULT, "agentic scores are normalized by reward_normalization.method (e.g. mean)"),
    "reward_scale": (
        ("agentic",),
        DEFAULT,
        "agentic scores are normalized by reward_normalization.method (e.g. mean_std)",
    ),
    "is_use_additional_prompts": (
        ("agentic",),
        DEFAULT,
        "RLVR only (dynamic sampling); the agentic batch refills with train_env_manager.max_refill_rounds",
    ),
    "val_batch_size": (("RLVR",), DEFAULT, "RLVR validates validation.max_samples prompts (0 = all)"),
    "render_save_dir": (
        ("RLVR",),
        DEFAULT,
        "agentic only (frames of env episodes); RLVR validation responses are dumped with rollout_dump_steps",
    ),
}


def trainer_old_log_probs_needed_by(cfg: Any) -> str | None:
    """The key whose setting needs the trainer's old log-probs before the update (so ``old_log_probs_source:
    engine`` yields to the trainer's pass), or None: a KL penalty in the reward, the train/inference correction
    (it compares the two), ``enable_old_logprobs_recompute`` and asynchronous generation (decoupled PPO's proximal
    policy)."""
    for key, on in (
        ("add_token_level_kl", cfg.add_token_level_kl),
        ("train_infer_correction", cfg.train_infer_correction.on()),
        ("enable_old_logprobs_recompute", cfg.enable_old_logprobs_recompute),
        ("async_generation_ratio", bool(cfg.async_generation_ratio)),
    ):
        if on:
            return key
    return None


def engine_old_log_probs(cfg: Any) -> bool:
    """Whether the PPO ratio's old log-probs are the engine's (``old_log_probs_source: engine`` and nothing that
    needs the trainer's, :func:`trainer_old_log_probs_needed_by`)."""
    return cfg.old_log_probs_source == "engine" and trainer_old_log_probs_needed_by(cfg) is None


def unused_settings(cfg: Any) -> list[str]:
    """One warning per :data:`UNUSED` key that ``cfg``'s pipeline (its ``pipeline``) does not act on, set to
    another value than the one acted on: the key, the value, why and what to do."""
    defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
    pipeline, out = getattr(cfg, "pipeline", None), []
    for key, (pipelines, acted_on, why) in UNUSED.items():
        if pipeline not in pipelines and pipelines != PIPELINES:
            continue
        value = getattr(cfg, key)
        if value != (defaults[key] if acted_on == DEFAULT else acted_on):
            where = "is ignored" if pipelines == PIPELINES else f"is not used by the {pipeline} pipeline"
            out.append(f"{key}={value!r} {where}: {why}")
    needed_by = trainer_old_log_probs_needed_by(cfg)
    if cfg.old_log_probs_source == "engine" and needed_by:
        out.append(
            f"old_log_probs_source='engine' does not apply: {needed_by} needs the trainer's old log-probs, so the "
            "trainer's pass runs before each update (set old_log_probs_source: trainer to silence this)"
        )
    return out


def check_not_implemented(cfg: Any, table: dict[str, Any]) -> None:
    """Reject a non-default value of a key in ``table`` (dotted paths; a missing block is skipped)."""
    for dotted, default in table.items():
        node = cfg
        *path, leaf = dotted.split(".")
        for part in path:
            node = getattr(node, part, None)
        if node is not None and getattr(node, leaf) != default:
            raise ConfigError(
                dotted, getattr(node, leaf), f"not implemented in roll yet; remove it or set it to {default!r}"
            )


def model_parallel_size(strategy_name: str, strategy_config: dict) -> int:
    """Ranks that share one data-parallel replica: TP x PP x CP for megatron_train / megatron_infer (expert
    parallelism does not divide the batch), 1 for DeepSpeed ZeRO, where every rank is a data-parallel rank."""
    if strategy_name not in MEGATRON_STRATEGIES:
        return 1
    return parse_megatron_options(strategy_config, "strategy_args.strategy_config").model_parallel_size


def data_parallel_size(worker: Any) -> int:
    """Data-parallel replicas of a worker block: ``world_size / (TP x PP x CP)`` (``world_size`` without model
    parallelism)."""
    strategy = worker.strategy_args
    return max(1, worker.world_size // model_parallel_size(strategy.strategy_name, dict(strategy.strategy_config)))


def global_train_batch(worker: Any) -> int:
    """Samples of one optimizer step of a training worker block, over all its ranks:
    ``per_device_train_batch_size x gradient_accumulation_steps x`` :func:`data_parallel_size`."""
    ta = worker.training_args
    return ta.per_device_train_batch_size * ta.gradient_accumulation_steps * data_parallel_size(worker)


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
    strategy = worker.strategy_args
    mp = model_parallel_size(strategy.strategy_name, dict(strategy.strategy_config))
    if worker.world_size % mp:
        raise ConfigError(
            f"{role}.strategy_args.strategy_config",
            dict(strategy.strategy_config),
            f"TP x PP x CP = {mp} must divide world_size ({worker.world_size})",
        )
    data_parallel, global_batch = data_parallel_size(worker), global_train_batch(worker)
    if samples_per_step % global_batch:
        formula = "world_size" if mp == 1 else "world_size / (TP x PP x CP)"
        sizes = f"{worker.world_size}" if mp == 1 else f"{worker.world_size} / {mp}"
        one_step = samples_per_step / (ta.per_device_train_batch_size * data_parallel)
        fix = (
            f"for one optimizer step per rollout set gradient_accumulation_steps = {samples_per_step} / "
            f"({ta.per_device_train_batch_size} x {data_parallel}) = {one_step:g}"
            if one_step == int(one_step)
            else f"pick per_device_train_batch_size x {formula} dividing {samples_per_step}"
        )
        raise ConfigError(
            f"{role}.training_args.gradient_accumulation_steps",
            ta.gradient_accumulation_steps,
            f"the global train batch per_device_train_batch_size ({ta.per_device_train_batch_size}) x "
            f"gradient_accumulation_steps ({ta.gradient_accumulation_steps}) x {formula} ({sizes}) = "
            f"{global_batch} must divide the {samples_per_step} samples of a step; {fix}",
        )


def optimizer_steps_per_rollout(cfg: Any, role: str, samples_per_step: int) -> int:
    """Optimizer steps one rollout makes per ppo epoch: ``samples_per_step / global train batch``."""
    return samples_per_step // global_train_batch(getattr(cfg, role))


def check_ppo(cfg: Any) -> None:
    """Algorithm settings that contradict each other or need a missing role (what an estimator, loss or KL type
    needs is checked against the registries in the preflight)."""
    if cfg.add_token_level_kl and cfg.use_kl_loss and not cfg.allow_kl_in_reward_and_loss:
        raise ConfigError(
            "use_kl_loss",
            True,
            "KL is already in the reward (add_token_level_kl: true); use one, or set allow_kl_in_reward_and_loss: true",
        )
    if (cfg.add_token_level_kl or cfg.use_kl_loss) and cfg.reference is None and not reference_from_actor(cfg):
        raise ConfigError(
            "reference",
            None,
            "a KL term is on (add_token_level_kl or use_kl_loss) but no `reference:` worker block is configured "
            "(with LoRA, actor_train.model_args.lora_reference: adapters_off needs none)",
        )
    if cfg.dual_clip_loss and cfg.dual_clip_c <= 1:
        raise ConfigError("dual_clip_c", cfg.dual_clip_c, "must be > 1")
    check_algorithm(cfg)


def check_algorithm(cfg: Any) -> None:
    """Advantage, KL and loss settings that a pipeline cannot run, or that it would silently ignore."""
    if cfg.use_kl_loss and cfg.kl_loss_coef <= 0:
        raise ConfigError(
            "kl_loss_coef",
            cfg.kl_loss_coef,
            "use_kl_loss is on, so it must be > 0 (e.g. 0.001); or set use_kl_loss: false",
        )
    if cfg.critic_warmup > 0 and cfg.critic is None:
        raise ConfigError("critic_warmup", cfg.critic_warmup, "> 0 needs a `critic:` block; add one or set it to 0")


def check_fields(cfg: Any) -> None:
    """:func:`check_choices` over the whole config; a bad value of a key this pipeline does not read (:data:`UNUSED`)
    also says where its equivalent lives."""
    try:
        check_choices(cfg)
    except ConfigError as exc:
        pipelines, _, why = UNUSED.get(exc.key, ((), None, ""))
        if getattr(cfg, "pipeline", None) in pipelines and pipelines != PIPELINES:
            raise ConfigError(exc.key, exc.value, f"{exc.expected}, and is not used: {why}") from None
        raise


def validate(cfg: Any) -> None:
    """Run every pure rule that applies to ``cfg`` (the pipeline's own through ``cfg.check_pipeline()``)."""
    check_fields(cfg)  # choices and ranges of every field
    if getattr(cfg, "tiny_model", None) is not None:
        cfg.tiny_model.check("tiny_model")
    check_workers(cfg)
    check_placement(cfg)
    check_ppo(cfg)
    check_lora(cfg)
    pipeline_rules = getattr(cfg, "check_pipeline", None)
    if pipeline_rules is not None:
        pipeline_rules()


CHECKPOINT_KEYS = {"max_to_keep"}


def check_placement(cfg: Any) -> None:
    """Placement rules across roles (after :func:`check_workers`) and the checkpoint keys.

    On a GPU run every role needs a device_mapping (overlapping ids colocate roles); one worker's GPUs must sit on
    one node; ``async_generation_ratio`` needs actor_infer on GPUs no other role uses; ``resume_from_checkpoint``
    is a bool or a path; ``checkpoint_config`` keys are known."""
    workers = worker_blocks(cfg)
    mapped = sorted(r for r, w in workers.items() if w.device_mapping)
    for role, worker in workers.items():
        if mapped and not worker.device_mapping:
            raise ConfigError(
                f"{role}.device_mapping",
                worker.device_mapping,
                f"empty while {', '.join(mapped)} run on GPUs; give every role GPU ids (overlapping "
                f"ids colocate roles, e.g. the same list as actor_train)",
            )
        k, per_node = worker.num_gpus_per_worker, max(1, cfg.num_gpus_per_node)
        for i in range(0, len(worker.device_mapping), k):
            gpus = worker.device_mapping[i : i + k]
            if len({g // per_node for g in gpus}) > 1:
                raise ConfigError(
                    f"{role}.device_mapping",
                    worker.device_mapping,
                    f"worker {i // k} gets GPUs {gpus} on several nodes (num_gpus_per_node="
                    f"{cfg.num_gpus_per_node}); align each worker's {k} GPUs inside one node",
                )
    if cfg.async_generation_ratio and "actor_infer" in workers:
        shared = set(workers["actor_infer"].device_mapping) & {
            gpu for role, worker in workers.items() if role != "actor_infer" for gpu in worker.device_mapping
        }
        if shared:
            raise ConfigError(
                "async_generation_ratio",
                cfg.async_generation_ratio,
                f"generating while training needs actor_infer on GPUs of its own; GPUs {sorted(shared)} "
                f"are shared with other roles (colocated roles take turns): set it to 0, or "
                f"disaggregate: give actor_infer its own device_mapping (e.g. actor_train [0], "
                f"actor_infer [1]; docs/async.md)",
            )
    if not isinstance(cfg.resume_from_checkpoint, (bool, str)) and cfg.resume_from_checkpoint is not None:
        raise ConfigError(
            "resume_from_checkpoint",
            cfg.resume_from_checkpoint,
            "true (newest complete checkpoint in output_dir), false, or a checkpoint directory path",
        )
    unknown = set(cfg.checkpoint_config) - CHECKPOINT_KEYS
    if unknown:
        raise ConfigError(
            "checkpoint_config",
            dict(cfg.checkpoint_config),
            f"unknown keys {sorted(unknown)}; known: {sorted(CHECKPOINT_KEYS)}",
        )
    if int(cfg.checkpoint_config.get("max_to_keep", 0)) < 0:
        raise ConfigError(
            "checkpoint_config.max_to_keep", cfg.checkpoint_config["max_to_keep"], "must be >= 0 (0 = keep all)"
        )
