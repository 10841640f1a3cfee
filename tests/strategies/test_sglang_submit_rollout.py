"""Per-env request path (CPU, no SGLang): an env manager whose generator ``supports_submit`` sends each env's turn
on its own and steps replies as they finish; with a deterministic generator it must produce exactly the
trajectories of the lock-step path, whatever order replies come back in. Also checks rank routing and aborts of
:class:`SubmitClient` over in-process workers."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from roll.agentic.env_manager import EnvManager, plan_groups
from roll.config.agentic import CustomEnvConfig, EnvManagerConfig
from roll.config.worker import GeneratingArgs
from roll.distributed.group import LocalWorkerGroup
from roll.distributed.roles import InferProxy
from roll.rollout.client import BatchClient, SubmitClient
from roll.strategies.base import GenerationOutput

ACTIONS = ["Up", "Down", "Left", "Right"]


class Scripted:
    """Reply = ``<answer>{action}</answer><|im_end|>``, the action a function of the prompt (deterministic)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer

    def reply(self, prompt: list[int]) -> GenerationOutput:
        ids = self.tok.encode(f"<answer>{ACTIONS[sum(prompt) % 4]}</answer>") + [self.tok.eos_token_id]
        return GenerationOutput(ids, [-0.1] * len(ids), "stop")

    def generate(self, prompts, args, max_new_tokens=None):
        return [self.reply(p) for p in prompts]

    def leave(self):
        pass


class ScriptedSubmit(Scripted):
    """The same replies, but handed back a few at a time in random order; records what was aborted."""

    def __init__(self, tokenizer, seed=0):
        super().__init__(tokenizer)
        self.rng, self.inflight, self.max_inflight, self.aborted = random.Random(seed), {}, 0, []

    def submit(self, requests, args, max_new_tokens=None):
        for rid, prompt in requests:
            assert rid not in self.inflight
            self.inflight[rid] = self.reply(prompt)
        self.max_inflight = max(self.max_inflight, len(self.inflight))

    def poll(self, rids):
        ready = [r for r in rids if r in self.inflight]
        pick = self.rng.sample(ready, k=min(len(ready), self.rng.randint(1, 3)))
        return {r: self.inflight.pop(r) for r in pick}

    def abort(self, rids):
        self.aborted += rids


def _manager(tokenizer_path: str) -> EnvManager:
    env = CustomEnvConfig(
        env_type="sokoban",
        env_config={"dim_room": [6, 6], "num_boxes": 1, "max_steps": 6, "max_solution_length": 6, "show_border": False},
        max_actions_per_traj=5,
        max_tokens_per_step=12,
    )
    cfg = EnvManagerConfig(tags=["S"], env_groups=3, group_size=2, env_threads=2)
    return EnvManager(
        cfg,
        plan_groups(cfg, {"S": env}),
        tokenizer_path,
        GeneratingArgs(max_new_tokens=12),
        sequence_length=2048,
        seed=1,
        phase="train",
        raise_env_errors=True,
    )


def _summary(result):
    return [(t.traj_id, t.token_ids(), [turn.reward for turn in t.turns], t.success) for t in result.trajectories]


def test_submit_path_matches_lockstep(tiny_model_dir):
    manager = _manager(tiny_model_dir)
    tok = manager.tokenizer
    lockstep = manager.rollout(3, BatchClient(Scripted(tok)))  # every poll generates all pending turns
    gen = ScriptedSubmit(tok, seed=5)
    per_env = manager.rollout(3, gen)
    assert _summary(per_env) == _summary(lockstep)
    assert sum(len(t.turns) for t in per_env.trajectories) > 6  # several turns happened
    assert gen.inflight == {} and gen.aborted == []
    assert gen.max_inflight == 6  # every env had a request in flight at once, none waited for a batch


def test_submit_path_aborts_on_error(tiny_model_dir):
    manager = _manager(tiny_model_dir)
    gen = ScriptedSubmit(manager.tokenizer)

    def broken_poll(rids):
        raise RuntimeError("engine died")

    gen.poll = broken_poll
    with pytest.raises(RuntimeError, match="engine died"):
        manager.rollout(0, gen)
    assert len(gen.aborted) == 6 and sorted(gen.aborted) == sorted(gen.inflight)  # all in flight aborted


class _FakeStrategy:
    def __init__(self):
        self.got, self.outs = [], {}

    def submit(self, requests, args, max_new_tokens):
        self.got += [rid for rid, _ in requests]
        self.outs.update({rid: GenerationOutput([len(p)], [0.0]) for rid, p in requests})

    def poll(self, rids, timeout):
        return {r: self.outs.pop(r) for r in rids if r in self.outs}

    def abort(self, rids):
        return [r for r in rids if self.outs.pop(r, None) is not None]


def test_submit_generator_routes_a_trajectory_to_one_rank():
    workers = [_FakeStrategy() for _ in range(3)]  # stand-ins for Workers: same submit/poll/abort signatures
    gen = SubmitClient(InferProxy(LocalWorkerGroup.of("actor_infer", workers)))
    rids = [f"train-0-g{g}-e0-t0/turn{k}" for g in range(6) for k in range(2)]
    gen.submit([(r, [1] * (i + 1)) for i, r in enumerate(rids)], GeneratingArgs())
    for g in range(6):  # both turns of a trajectory went to the same rank
        owners = {i for i, w in enumerate(workers) for r in w.got if r.startswith(f"train-0-g{g}-")}
        assert len(owners) == 1
    done = gen.poll(rids[:4])
    assert sorted(done) == sorted(rids[:4]) and done[rids[3]].token_ids == [4]
    gen.abort(rids[4:])
    assert all(not w.outs for w in workers)
    outs = gen.generate([[1], [1, 2], [1, 2, 3]], GeneratingArgs())
    assert [o.token_ids for o in outs] == [[1], [2], [3]]


def test_supported_reads_the_strategy_class():
    cfg = SimpleNamespace(actor_infer=SimpleNamespace(strategy_args=SimpleNamespace(strategy_name="sglang")))
    assert SubmitClient.supported(cfg)
    cfg.actor_infer.strategy_args.strategy_name = "hf_infer"
    assert not SubmitClient.supported(cfg)
