"""The CPU smoke mode of the GPU scripts: which tiny config stands in for a GPU config, and the overrides that make
a run of it take seconds.

Every GPU verification script and GPU benchmark has a smoke mode (``--smoke`` for Python, ``SMOKE=1`` for shell)
that runs its own code (argument parsing, the pipeline hooks it patches, its result JSON and its pass/fail checks)
on CPU, so that a change elsewhere that breaks a script breaks a test (``tests/scripts/test_gpu_scripts_smoke.py``).
A GPU config is replaced by the tiny config of the same kind (:data:`TINY_CONFIGS`: the engine is ``hf_infer``, the
trainer the tiny config's own, the model built from its ``tiny_model`` block, hub-free) and shrunk by
:func:`smoke_overrides`; the script's own overrides stay, but for those the smoke run sets and those that only mean
something on GPUs (:func:`merge`).

    python scripts/cpu_smoke.py WORK --config-name NAME [--config-path DIR] [OVERRIDE ...]

prints the smoke run's launcher arguments, one a line (the shell scripts' ``smoke_args``, ``scripts/smoke_mode.sh``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The tiny config standing in for a GPU config, by kind (:func:`config_kind`).
TINY_CONFIGS = {"agentic": "sokoban_tiny", "agent": "sokoban_agent_tiny", "rlvr": "rlvr_tiny"}

#: The model: a 2-layer Qwen2 of width 64 (``roll.models.tiny``), built by the pipeline at its first use
#: (:data:`MODEL`) or by :func:`tiny_model` for a script that needs one before any pipeline.
MODEL_DIMS = dict(
    hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2
)
MODEL = [f"tiny_model.{key}={value}" for key, value in MODEL_DIMS.items()]
#: Every kind: one process, no checkpoints or validation, no stop for a dead signal (the scripts check it).
COMMON = [
    "distributed=local",
    "eval_steps=0",
    "save_steps=0",
    "max_train_minutes=0",
    "zero_signal_patience=0",
    "track_with=stdout",
    "actor_train.num_cpus_per_worker=1",
    "actor_infer.num_cpus_per_worker=1",
]
#: Sokoban's sizes: 2 groups of 4 envs, 3 actions of at most 6 tokens each.
SOKOBAN_SIZES = [
    "rollout_batch_size=8",
    "train_env_manager.env_groups=2",
    "train_env_manager.group_size=4",
    "actor_train.training_args.per_device_train_batch_size=4",
    "actor_train.training_args.gradient_accumulation_steps=1",
    "custom_envs.SimpleSokoban.max_actions_per_traj=3",
    "custom_envs.SimpleSokoban.max_tokens_per_step=6",
    "actor_infer.generating_args.max_new_tokens=6",
    "sequence_length=512",
]
#: Sokoban without warm start, validation or dumps; identity normalization keeps the raw (negative) scores of an
#: untrained policy, so every step has a learning signal.
AGENTIC = [
    *SOKOBAN_SIZES,
    "sft_warmup.enabled=false",
    "val_env_manager=null",
    "trajectory_dump_steps=0",
    "reward_normalization.method=identity",
]
#: RLVR: 4 prompts x 4 answers after a 20-step warm start (the model then answers in the format and sometimes
#: right); no dynamic sampling, no validation set.
RLVR = [
    "sft_warmup.steps=20",
    "sft_warmup.batch_size=32",
    "rollout_batch_size=4",
    "num_return_sequences_in_group=4",
    "dynamic_sampling.enabled=false",
    "is_use_additional_prompts=false",
    "validation.file_name=[]",
    "rollout_dump_steps=0",
    "rewards.num_workers=1",
    "actor_train.training_args.per_device_train_batch_size=8",
    "actor_train.training_args.gradient_accumulation_steps=1",
]


def tiny_model(path: str | Path) -> Path:
    """The smoke runs' model at ``path`` (built there unless a model is there already; hub-free)."""
    from roll.models.tiny import ensure_tiny_model

    return ensure_tiny_model(path, **MODEL_DIMS)


def config_kind(config_name: str, config_path: str | None = None) -> str:
    """``agentic``, ``agent`` (an agent harness through the gateway) or ``rlvr``, from the config's keys."""
    from omegaconf import OmegaConf

    from roll.config.loader import resolve_config_dir

    raw = OmegaConf.load(resolve_config_dir(config_path) / f"{config_name}.yaml")  # the keys that tell, not merged
    if "custom_envs" not in raw and "train_env_manager" not in raw:
        parents = [d for d in raw.get("defaults") or [] if isinstance(d, str) and d != "_self_" and "@" not in d]
        return config_kind(parents[0], config_path) if parents else "rlvr"  # a config that extends another
    envs = raw.get("custom_envs") or {}
    return "agent" if any((env or {}).get("env_manager_cls") == "proxy" for env in envs.values()) else "agentic"


def smoke_config(config_name: str, config_path: str | None = None) -> str:
    """The tiny config that stands in for ``config_name`` (a tiny config stands for itself)."""
    if config_name in TINY_CONFIGS.values():
        return config_name
    return TINY_CONFIGS[config_kind(config_name, config_path)]


def smoke_overrides(config_name: str, work: str | Path) -> list[str]:
    """Overrides that shrink tiny config ``config_name`` to a run of seconds; the model is built in
    ``work/models`` (one per kind: the RLVR tokenizer is fitted to its data)."""
    kind = config_kind(config_name)
    model = Path(work) / "models" / ("tiny-math" if kind == "rlvr" else "tiny")
    return [f"pretrain={model}", *MODEL, *COMMON, *(RLVR if kind == "rlvr" else AGENTIC)]


#: Keys (last component) of GPU placement and GPU-only kernels: a smoke run drops them (one process, CPU).
GPU_ONLY = {
    "device_mapping",
    "num_gpus_per_node",
    "num_gpus_per_worker",
    "tp_size",
    "mem_fraction_static",
    "use_liger_kernel",
}


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def merge(overrides: list[str], smoke: list[str]) -> list[str]:
    """``overrides`` without those whose key ``smoke`` sets (a key given twice is an error where the config has no
    default for it) or that only mean something on GPUs (:data:`GPU_ONLY`), then ``smoke``."""
    keys = {_key(o) for o in smoke}
    return [o for o in overrides if _key(o) not in keys and _key(o).rsplit(".", 1)[-1] not in GPU_ONLY] + smoke


#: Keys of the GPU config a smoke run keeps (what the run is about, not its size): LoRA on the trainer.
CARRIED = tuple(f"actor_train.model_args.lora_{key}" for key in ("target", "rank", "alpha", "dropout"))


def carried(config_name: str, config_path: str | None = None) -> list[str]:
    """Overrides giving the tiny config the :data:`CARRIED` keys that ``config_name`` (its own file) sets."""
    from omegaconf import OmegaConf

    from roll.config.loader import resolve_config_dir

    raw = OmegaConf.load(resolve_config_dir(config_path) / f"{config_name}.yaml")
    found = {key: OmegaConf.select(raw, key) for key in CARRIED}
    return [
        f"{key}={json.dumps(OmegaConf.to_object(v) if OmegaConf.is_config(v) else v)}"
        for key, v in found.items()
        if v is not None
    ]


def stand_in(
    config_name: str, config_path: str | None, overrides: list[str], work: str | Path
) -> tuple[str, list[str]]:
    """The tiny config standing in for ``config_name`` and the smoke run's overrides: the GPU config's
    :data:`CARRIED` keys, ``overrides`` and :func:`smoke_overrides`, merged (:func:`merge`)."""
    tiny = smoke_config(config_name, config_path)
    given = {_key(o) for o in overrides}  # an override of the same key wins
    kept = [o for o in carried(config_name, config_path) if _key(o) not in given] if tiny != config_name else []
    return tiny, merge([*kept, *overrides], smoke_overrides(tiny, work))


def smoke_command(launcher_args: list[str], work: str | Path) -> list[str]:
    """A launcher's arguments (``--config-name``, ``--config-path``, overrides) turned into the smoke run's: the tiny
    config (from the repository's examples) and the overrides merged with :func:`smoke_overrides`."""
    name, path, overrides, rest = None, None, [], list(launcher_args)
    while rest:
        arg = rest.pop(0)
        flag, _, value = arg.partition("=")
        if flag in ("--config-name", "--config-path"):
            value = value or rest.pop(0)
            name, path = (value, path) if flag == "--config-name" else (name, value)
        else:
            overrides.append(arg)
    if name is None:
        raise SystemExit("cpu_smoke: --config-name is required")
    tiny, merged = stand_in(name, path, overrides, work)
    return ["--config-name", tiny, *merged]


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print("usage: python scripts/cpu_smoke.py WORK --config-name NAME [--config-path DIR] [OVERRIDE ...]")
        return 2
    print("\n".join(smoke_command(argv[1:], argv[0])))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main(sys.argv[1:]))
