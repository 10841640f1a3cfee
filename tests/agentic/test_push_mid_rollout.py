"""Weights pushed in the middle of a multi-turn rollout (hf_infer, CPU, greedy): the push waits for the generate
call in progress and lands between turns, so pushing the same weights changes no token, and every turn carries the
policy version it was generated under (old before the push, new after)."""

from __future__ import annotations

import threading

from roll.config.loader import load_config


class PushingGenerator:
    """A generator that pushes weights from another thread while its ``push_at``-th poll is generating."""

    def __init__(self, inner, push, push_at: int = 2):
        self.inner, self.push, self.push_at, self.polls = inner, push, push_at, 0
        self.thread: threading.Thread | None = None

    def submit(self, requests, args, max_new_tokens=None):
        self.inner.submit(requests, args, max_new_tokens)

    def poll(self, rids):
        self.polls += 1
        if self.polls == self.push_at:
            self.thread = threading.Thread(target=self.push)
            self.thread.start()  # races the generate call below for the engine: it waits for it
        done = self.inner.poll(rids)
        if self.thread is not None:
            self.thread.join()
        return done

    def abort(self, rids):
        self.inner.abort(rids)

    def leave(self):
        self.inner.leave()


def test_pushing_identical_weights_mid_rollout_changes_no_token(tiny_model_dir, tmp_path):
    from roll.pipelines.agentic_pipeline import AgenticPipeline

    cfg = load_config(
        "sokoban_tiny",
        overrides=[
            f"pretrain={tiny_model_dir}",
            "tiny_model=null",
            f"output_dir={tmp_path}",
            f"logging_dir={tmp_path}/logs",
            "distributed=local",
            "track_with=stdout",
            "sft_warmup.enabled=false",
            "val_env_manager=null",
            "rollout_batch_size=8",
            "train_env_manager.env_groups=2",
            "train_env_manager.group_size=4",
            "custom_envs.SimpleSokoban.max_actions_per_traj=4",
            "actor_infer.generating_args.temperature=0",
            "actor_train.training_args.gradient_accumulation_steps=1",
            "actor_train.num_cpus_per_worker=1",
            "actor_infer.num_cpus_per_worker=1",
        ],
    )
    pipe = AgenticPipeline(cfg)
    pipe.setup()
    infer, manager = pipe.roles.actor_infer, pipe.train_rollout.managers[0]
    weights = pipe.roles.actor_train.weights_out.gather()

    def push():
        infer.weights_in.load(weights)
        infer.set_policy_version(1)

    plain = manager.rollout(1000, pipe.train_rollout.generator).trajectories
    infer.set_policy_version(0)
    pushing = PushingGenerator(pipe.train_rollout.generator, push)
    pushed = manager.rollout(1000, pushing).trajectories
    assert pushing.polls >= 3  # the push happened with turns before and after it
    assert [t.token_ids() for t in pushed] == [t.token_ids() for t in plain]
    assert all(turn.policy_version == 0 for t in plain for turn in t.turns)
    versions = [[turn.policy_version for turn in t.turns] for t in pushed]
    assert all(v == sorted(v) for v in versions)  # a trajectory's versions never go back
    assert all(v[0] == 0 for v in versions) and any(v[-1] == 1 for v in versions), versions
