r"""``async_generation_ratio: 0`` is the synchronous path, bit for bit: short ``sokoban_tiny`` and ``rlvr_tiny`` runs
(tiny model built from its config, warm start, validation) log exactly the metrics stored in
``tests/pipelines/data/`` (timings excepted, compared by ``scripts/compare_metrics.py``). The references were written
by the code before asynchronous rollouts existed (commit f07da49), with one later change applied to it: the
prefix-sharing planner's attention cost per pair, ``1 / (4 d)`` instead of ``1 / (8 d)``, which changes which
samples share a row and so the last bits of the metrics:

    git archive f07da49 | tar -x -C /tmp/f07da49
    sed -i 's|return 1.0 / (8 \* hidden_size)|return 1.0 / (4 * hidden_size)|' \\
        /tmp/f07da49/roll/models/prefix_sharing.py
    PYTHONPATH=/tmp/f07da49 python tests/pipelines/test_async_k0_unchanged.py tests/pipelines/data

A change that alters a synchronous run (a new metric key included) fails here; if it is meant to, write the references
again with the new code and say why in the commit. Keys added since, with the value a run without that feature must
log, are listed in :data:`ADDED` (each must have exactly that value, then it is left out of the comparison); keys
computed after the step from the compared metrics themselves (:data:`DERIVED`) are left out.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
COMMON = [
    "tiny_model.hidden_size=32",
    "tiny_model.intermediate_size=64",
    "tiny_model.num_hidden_layers=1",
    "tiny_model.vocab_size=400",
    "track_with=stdout",
    "distributed=local",
    "save_steps=0",
    "max_steps=3",
    "sft_warmup.steps=3",
    "zero_signal_patience=0",
    "actor_train.num_cpus_per_worker=1",
    "actor_infer.num_cpus_per_worker=1",
]
ADDED = {"rollout/template_breaks": 0.0}  # trajectory_mode (issue 30): no sample splits in these runs
#: Keys that count generated tokens since issue 40 (the end-of-turn token appended after a length cut was counted
#: before): each is at most one token per turn below its reference, never above; then left out of the comparison.
RECOUNTED = ("response_tokens_per_turn", "generated_tokens")
#: Prefixes of keys read off the compared metrics after the step, which change nothing in the run: the run-health
#: check (issue 41: health/<rule>, health/alerts) and the share of zero-signal groups it reads (the count,
#: rollout/zero_signal_groups, is compared).
DERIVED = ("health/", "rollout/zero_signal_frac")
RUNS = {
    "sokoban": (
        "sokoban_tiny",
        [
            "rollout_batch_size=8",
            "train_env_manager.env_groups=2",
            "train_env_manager.group_size=4",
            "val_env_manager.env_groups=4",
            "eval_steps=2",
            "trajectory_dump_steps=0",
            "sequence_length=256",
            "custom_envs.SimpleSokoban.max_actions_per_traj=3",
            "actor_train.training_args.per_device_train_batch_size=4",
            "actor_train.training_args.gradient_accumulation_steps=1",
            "sft_warmup.batch_size=4",
            "sft_warmup.num_demos=16",
        ],
    ),
    "rlvr": (
        "rlvr_tiny",
        [
            "rollout_batch_size=4",
            "num_return_sequences_in_group=4",
            "eval_steps=2",
            "validation.max_samples=4",
            "rollout_dump_steps=0",
            "actor_infer.generating_args.max_new_tokens=8",
            "actor_train.training_args.per_device_train_batch_size=8",
            "actor_train.training_args.gradient_accumulation_steps=2",
            "sft_warmup.batch_size=16",
            "rewards.num_workers=1",
        ],
    ),
}


def run(name: str, root: Path, *extra: str) -> Path:
    """Run ``name`` (a key of :data:`RUNS`) under ``root``; returns its metrics.jsonl."""
    from roll.config.loader import load_config

    config, overrides = RUNS[name]
    out = root / name
    shutil.rmtree(out, ignore_errors=True)
    args = [
        f"pretrain={root}/model-{name}",
        f"output_dir={out}",
        f"logging_dir={out}/logs",
        *COMMON,
        *overrides,
        *extra,
    ]
    if name == "rlvr":
        from roll.config.rlvr import RLVRConfig
        from roll.pipelines.rlvr_pipeline import RLVRPipeline

        RLVRPipeline(load_config(config, overrides=args, schema=RLVRConfig)).run()
    else:
        from roll.pipelines.agentic_pipeline import AgenticPipeline

        AgenticPipeline(load_config(config, overrides=args)).run()
    return out / "logs" / "metrics.jsonl"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_k0_matches_the_synchronous_reference(name, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    from compare_metrics import DEFAULT_IGNORE, differences, load

    after = load(run(name, tmp_path, "async_generation_ratio=0"))
    for metrics in after.values():
        for key, value in ADDED.items():
            assert metrics.pop(key, value) == value, key
        for key in [k for k in metrics if k.startswith(DERIVED)]:
            del metrics[key]
    before = load(DATA / f"k0_{name}.jsonl")
    for step, metrics in after.items():
        for prefix in ("rollout", "val"):
            turns = before[step].get(f"{prefix}/mean_actions", 1.0) * before[step].get(f"{prefix}/batch_size", 1.0)
            for key, most in zip(RECOUNTED, (1.0, turns)):
                name_ = f"{prefix}/{key}"
                if name_ in before[step]:
                    fewer = before[step].pop(name_) - metrics.pop(name_)
                    assert 0.0 <= fewer <= most + 1e-9, (step, name_, fewer)
    assert sorted(after) == [0, 1, 2, 3]
    assert differences(before, after, DEFAULT_IGNORE) == []


if __name__ == "__main__":  # write the references (see the module docstring)
    target = Path(sys.argv[1])
    target.mkdir(parents=True, exist_ok=True)
    scratch = Path("/tmp/roll-k0-reference")
    for key in RUNS:
        shutil.copy(run(key, scratch), target / f"k0_{key}.jsonl")
