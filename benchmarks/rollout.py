"""Rollout throughput vs bare ``generate`` on the same prompts (tiny model, CPU, distributed=local).

For each env count N: one timed rollout of N Sokoban envs (groups of 8) through ``RolloutScheduler``, recording
every generate call it makes; then the same calls replayed straight to the inference worker. Greedy decoding makes
the replay do exactly the same work. Overhead = rollout wall time / bare generate time - 1 (everything the rollout
adds: env steps, tokenization, bookkeeping, batching).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/rollout.py --sizes 8 64 256

``--kv-reuse`` instead times whole rollouts with hf_infer's ``reuse_kv_cache`` on and off, side by side
(alternating, fastest of ``--repeats`` kept), and reports the speed-up; greedy decoding, so both produce the same
trajectories (checked).

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/rollout.py --kv-reuse --sizes 32 128 --max-actions 10
"""

from __future__ import annotations

import argparse
import time


def _config(n_envs: int, max_actions: int, max_tokens: int):
    from roll.config.agentic import AgenticConfig, CustomEnvConfig, EnvManagerConfig

    cfg = AgenticConfig()
    cfg.distributed, cfg.sequence_length, cfg.rollout_batch_size = "local", 1024, n_envs
    cfg.custom_envs = {
        "Sokoban": CustomEnvConfig(
            env_type="sokoban",
            env_config={"dim_room": [6, 6], "num_boxes": 1, "max_steps": max_actions, "show_border": False},
            max_actions_per_traj=max_actions,
            max_tokens_per_step=max_tokens,
            system_prompt="You are a Sokoban player.",
        )
    }
    group = min(8, n_envs)
    cfg.train_env_manager = EnvManagerConfig(
        tags=["Sokoban"], env_groups=n_envs // group, group_size=group, conformance_samples=0
    )
    cfg.actor_infer.generating_args.do_sample = False
    cfg.actor_infer.generating_args.max_new_tokens = max_tokens
    return cfg


class _Recorder:
    """Wraps the real generator; keeps every call's prompts and budget."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def generate(self, prompts, args, max_new_tokens=None):
        self.calls.append((prompts, args, max_new_tokens))
        return self.inner.generate(prompts, args, max_new_tokens)

    def leave(self):
        self.inner.leave()


def bench(n_envs: int, model: str, group, max_actions: int, max_tokens: int, repeats: int = 3) -> dict[str, float]:
    from roll.agentic.scheduler import RolloutScheduler
    from roll.rollout.client import BatchClient

    cfg = _config(n_envs, max_actions, max_tokens)
    sched = RolloutScheduler(cfg, cfg.train_env_manager, "train", model, group, use_ray=False)
    sched.rollout(0, n_envs)  # warm-up (tokenizer caches, first-call costs)
    inner, wall, bare = sched.generator.inner, float("inf"), float("inf")  # the batch generator of the client
    for _ in range(repeats):  # alternate rollout and replay; keep the fastest of each (shared machines are noisy)
        recorder = _Recorder(inner)
        sched.generator = BatchClient(recorder)
        start = time.perf_counter()
        trajs, metrics = sched.rollout(1, n_envs)
        wall = min(wall, time.perf_counter() - start)
        start = time.perf_counter()
        for prompts, args, max_new in recorder.calls:
            group.generate(prompts, args, max_new)
        bare = min(bare, time.perf_counter() - start)
    steps = sum(len(t.turns) for t in trajs)
    tokens = sum(len(turn.response_ids) - turn.appended_eos for t in trajs for turn in t.turns)
    return {
        "envs": n_envs,
        "wall_s": wall,
        "bare_generate_s": bare,
        "overhead": wall / bare - 1,
        "traj_per_s": len(trajs) / wall,
        "env_steps_per_s": steps / wall,
        "gen_tokens_per_s": tokens / wall,
        "env_s": metrics["time/rollout_env"],
        "calls": len(recorder.calls),
    }


def bench_kv_reuse(
    n_envs: int, model: str, groups: dict, max_actions: int, max_tokens: int, repeats: int = 3
) -> dict[str, float]:
    """Rollout wall time with and without ``reuse_kv_cache`` (``groups``: ``{"on": group, "off": group}``)."""
    from roll.agentic.scheduler import RolloutScheduler

    cfg = _config(n_envs, max_actions, max_tokens)
    scheds = {
        k: RolloutScheduler(cfg, cfg.train_env_manager, "train", model, g, use_ray=False) for k, g in groups.items()
    }
    best, tokens = {k: float("inf") for k in groups}, {}
    for sched in scheds.values():
        sched.rollout(0, n_envs)  # warm-up
    for _ in range(repeats):
        for key, sched in scheds.items():
            start = time.perf_counter()
            trajs, _ = sched.rollout(1, n_envs)
            best[key] = min(best[key], time.perf_counter() - start)
            tokens[key] = sorted(t.token_ids() for t in trajs)
    if tokens["on"] != tokens["off"]:
        raise AssertionError("reuse_kv_cache changed the greedy trajectories")
    turns = sum(len(t.turns) for t in trajs)
    return {
        "envs": n_envs,
        "turns": turns,
        "on_s": best["on"],
        "off_s": best["off"],
        "speedup": best["off"] / best["on"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[8, 16, 32, 64, 128, 256])
    parser.add_argument("--model", default="/tmp/roll-bench-tiny", help="tiny model dir (built if missing)")
    parser.add_argument("--max-actions", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=3, help="timed rollout/replay pairs (fastest kept)")
    parser.add_argument("--threads", type=int, default=2, help="torch threads of the inference worker")
    parser.add_argument("--kv-reuse", action="store_true", help="compare reuse_kv_cache on/off instead")
    args = parser.parse_args()

    from roll.config.worker import WorkerConfig
    from roll.distributed.group import LocalWorkerGroup
    from roll.distributed.roles import InferProxy
    from roll.models.tiny import ensure_tiny_model
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import strategy_spec

    ensure_tiny_model(
        args.model,
        hidden_size=128,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=1024,
    )

    def infer_group(**options):
        worker = WorkerConfig()
        worker.model_args.model_name_or_path = args.model
        worker.strategy_args.strategy_config = {"generate_batch_size": 256, **options}
        infer = InferProxy(LocalWorkerGroup("actor_infer", worker, num_threads=args.threads), strategy_spec("hf_infer"))
        infer.initialize(StrategyContext(seed=0))
        return infer

    if args.kv_reuse:
        groups = {"on": infer_group(reuse_kv_cache=True), "off": infer_group(reuse_kv_cache=False)}
        print(f"{'envs':>5} {'turns':>6} {'reuse s':>8} {'re-encode s':>11} {'speed-up':>8}")
        for n in args.sizes:
            r = bench_kv_reuse(n, args.model, groups, args.max_actions, args.max_tokens, args.repeats)
            print(
                f"{r['envs']:>5} {r['turns']:>6} {r['on_s']:>8.2f} {r['off_s']:>11.2f} {r['speedup']:>7.2f}x",
                flush=True,
            )
        return
    group = infer_group()
    print(
        f"{'envs':>5} {'rollout s':>9} {'bare gen s':>10} {'overhead':>8} {'traj/s':>7} {'steps/s':>8} "
        f"{'tok/s':>7} {'env s':>6} {'calls':>5}"
    )
    for n in args.sizes:
        r = bench(n, args.model, group, args.max_actions, args.max_tokens, args.repeats)
        print(
            f"{r['envs']:>5} {r['wall_s']:>9.2f} {r['bare_generate_s']:>10.2f} {r['overhead']:>8.1%} "
            f"{r['traj_per_s']:>7.1f} {r['env_steps_per_s']:>8.1f} {r['gen_tokens_per_s']:>7.0f} "
            f"{r['env_s']:>6.2f} {r['calls']:>5}",
            flush=True,
        )


if __name__ == "__main__":
    main()
