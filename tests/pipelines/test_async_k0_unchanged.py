"""``async_generation_ratio: 0`` is the synchronous loop, bit for bit: short ``sokoban_tiny`` and ``rlvr_tiny`` runs of
this tree at k = 0 log exactly the metrics (timings excepted, compared by ``scripts/compare_metrics.py``) that the same
runs log on the code from before asynchronous rollouts existed, :data:`REFERENCE` (commit f07da49) with
:data:`PATCHES` applied. Both runs are made here, in the same test, on the same machine: a fixed-seed CPU run is exact
on one machine, but another CPU rounds differently (the first warm-start loss differs in the 7th decimal between an
AMD EPYC and a Xeon) and RL turns that into a different run, so metrics recorded on another machine cannot be
compared bit for bit. The reference tree comes from this repository's history (``git archive``); where the history
is missing (a shallow clone, an unpacked archive) the test is skipped and says why.

What k = 0 must leave alone, and what a broken change does here: at k = 0 no producer, group buffer or forced
old-log-prob recompute runs, and the batch comes from ``RolloutScheduler.rollout`` / ``RLVRPipeline.collect`` as it did
before. A change that forces the recompute at k = 0 (as k >= 1 does) moves ``actor/loss``, ``actor/grad_norm``,
``actor/entropy`` and ``rollout/logprob_mismatch`` of the RLVR run in the last bits (13 values over its 3 steps,
checked by hand); one that logs the buffer's metrics at k = 0 adds keys; one that lets the policy-version counter reach
sampling or seeding changes the tokens, and every metric after them. Any other change to the warm start, the rollouts,
the advantages or the update changes some logged value or key of some step too, and the comparison names the step and
the key.

A change that is meant to alter a synchronous run fails here too: add the same change to :data:`PATCHES` (as was done
for the prefix-sharing planner's cost constant, which moves the last bits), or point :data:`REFERENCE` at a later
commit whose synchronous run is the intended one, and say why in the commit. Keys added since the reference, with the
value a run without that feature must log, are listed in :data:`ADDED` (each must have exactly that value in this
tree's run, then it is left out of the comparison).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tiny_runs import TINY_LOCAL_RUN

REPO = Path(__file__).resolve().parents[2]
#: the code before asynchronous rollouts existed
REFERENCE = "f07da49"
#: changes meant to alter a synchronous run since REFERENCE, applied to its tree: (file, old text, new text). The
#: planner's attention cost per pair (commit 17cea58) changes which samples share a row, so the last bits
PATCHES = [("roll/models/prefix_sharing.py", "return 1.0 / (8 * hidden_size)", "return 1.0 / (4 * hidden_size)")]
ADDED = {"rollout/template_breaks": 0.0}  # trajectory_mode (issue 30): no sample splits in these runs

COMMON = [*TINY_LOCAL_RUN, "max_steps=3", "sft_warmup.steps=3"]
#: Keys that count generated tokens since issue 40 (the end-of-turn token appended after a length cut was counted
#: before): each is at most one token per turn below its reference, never above; then left out of the comparison.
RECOUNTED = ("response_tokens_per_turn", "generated_tokens")
#: Prefixes of keys read off the compared metrics after the step, which change nothing in the run: the run-health
#: check (issue 41: health/<rule>, health/alerts) and the share of zero-signal groups it reads (the count,
#: rollout/zero_signal_groups, is compared).
DERIVED = ("health/", "rollout/zero_signal_frac")
#: Keys this tree logs where the reference did not (issue 41: the RLVR validation's count of responses, which
#: benchmarks/seeds.py reads); compared where the reference has them (the agentic validation's).
NEW_KEYS = ("val/batch_size",)
#: Overrides for this tree only, for what changed since the reference: issue 41's imperfect demonstrator is off,
#: as the reference's plans are perfect, the old log-probs come from the trainer's pass, as they did, and the RL
#: learning rate is the reference's (sokoban_tiny's went from 5e-4 to 3e-4).
THIS_TREE = {
    "sokoban": (
        "sft_warmup.demo_noise=0",
        "old_log_probs_source=trainer",
        "actor_train.training_args.learning_rate=5e-4",
        "custom_envs.SimpleSokoban.turn_prompt=append",  # the reference's prompts and samples (issue 41's default
        "custom_envs.SimpleSokoban.trajectory_mode=traj",  # now prompts every turn afresh, one sample per turn)
        "actor_train.use_dynamic_batching_in_train=false",
    ),
    "rlvr": (),
}
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

#: runs one of :data:`RUNS` with the code of the tree given first (checked: ``roll`` is imported from there), as the
#: references were first written: the pipeline on ``load_config``'s config, in-process (names both trees have)
DRIVER = r"""
import sys
from pathlib import Path

import roll

tree, name, config, *overrides = sys.argv[1:]
assert Path(roll.__file__).resolve().is_relative_to(Path(tree)), (roll.__file__, tree)
from roll.config.loader import load_config

if name == "rlvr":
    from roll.config.rlvr import RLVRConfig
    from roll.pipelines.rlvr_pipeline import RLVRPipeline

    RLVRPipeline(load_config(config, overrides=overrides, schema=RLVRConfig)).run()
else:
    from roll.pipelines.agentic_pipeline import AgenticPipeline

    AgenticPipeline(load_config(config, overrides=overrides)).run()
"""


def reference_tree(root: Path) -> Path:
    """:data:`REFERENCE`'s ``roll/``, ``examples/`` and ``data/`` under ``root``, :data:`PATCHES` applied; skips
    where git or the commit is missing."""
    tree = root / f"reference-{REFERENCE}"
    try:
        archive = subprocess.run(
            ["git", "-C", str(REPO), "archive", REFERENCE, "roll", "examples", "data"], capture_output=True, check=True
        )
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"the reference code needs git and commit {REFERENCE} in this repository's history: {exc}")
    tree.mkdir()
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True)
    for name, old, new in PATCHES:
        path = tree / name
        text = path.read_text()
        assert text.count(old) == 1, f"{REFERENCE}:{name} no longer has {old!r} once: fix PATCHES"
        path.write_text(text.replace(old, new))
    return tree


def run(tree: Path, name: str, root: Path, *extra: str) -> Path:
    """Run ``name`` (a key of :data:`RUNS`) with ``tree``'s code in a fresh interpreter, under ``root``; returns its
    metrics.jsonl."""
    config, overrides = RUNS[name]
    out = root / name
    out.mkdir(parents=True)
    args = [f"pretrain={root}/model-{name}", f"output_dir={out}", f"logging_dir={out}/logs", *COMMON, *overrides]
    env = {**os.environ, "PYTHONPATH": str(tree)}  # nothing of the other tree on the path
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, str(tree), name, config, *args, *extra],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"{name} on {tree}: exit {proc.returncode}\n{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
    sys.stdout.write(proc.stdout)  # the run's output, as an in-process run shows it (tests read its lines)
    sys.stderr.write(proc.stderr)
    return out / "logs" / "metrics.jsonl"


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(RUNS))
def test_k0_is_the_synchronous_loop_of_the_reference(name, tmp_path):
    sys.path.insert(0, str(REPO / "scripts"))
    from compare_metrics import DEFAULT_IGNORE, differences, load

    reference = load(run(reference_tree(tmp_path), name, tmp_path / "reference"))
    after = load(run(REPO, name, tmp_path / "this-tree", "async_generation_ratio=0", *THIS_TREE[name]))
    for step, metrics in after.items():
        for key in [k for k in NEW_KEYS if k not in reference.get(step, {})]:
            metrics.pop(key, None)
        for key, value in ADDED.items():
            assert metrics.pop(key, value) == value, key
        for key in [k for k in metrics if k.startswith(DERIVED)]:
            del metrics[key]
    for step, metrics in after.items():
        for prefix in ("rollout", "val"):
            turns = reference[step].get(f"{prefix}/mean_actions", 1.0) * reference[step].get(
                f"{prefix}/batch_size", 1.0
            )
            for key, most in zip(RECOUNTED, (1.0, turns)):
                name_ = f"{prefix}/{key}"
                if name_ in reference[step]:
                    fewer = reference[step].pop(name_) - metrics.pop(name_)
                    assert 0.0 <= fewer <= most + 1e-9, (step, name_, fewer)
    assert sorted(after) == [0, 1, 2, 3]
    assert differences(reference, after, DEFAULT_IGNORE) == []
