"""Where the Ray path's per-step time goes beyond the work itself: every remote call of a step, how long the driver
waited for it and how long the method ran in its actor (Ray's timeline), for an RLVR run.

A call's time splits into the worker's run (deserializing the arguments, executing, storing the results) and what
lies outside it (submission, object-store transfers, the driver's deserialization of the results, scheduling, the
process hop). Also timed: the driver's own ``ray.put`` and the reward pool's calls. Steps ``1..--skip`` are left out
(start-up). Prints one row per call and the pipeline's ``time/*`` medians; JSON to ``--out``.

    python benchmarks/ray_overhead.py --steps 12 -- pretrain=output/vs_trl/start tiny_model=null \\
        sft_warmup.enabled=false rollout_batch_size=8 num_return_sequences_in_group=8
    python benchmarks/ray_overhead.py --sync-ab output/vs_trl/start    # the weight sync's two paths, A/B
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class CallLog:
    """Driver-side seconds of each remote call, by step and method (``step`` is set by the step wrapper)."""

    def __init__(self) -> None:
        self.step = 0
        self.calls: list[dict] = []  # {"step", "method", "driver_s", "start", "end"}

    def record(self, method: str, start: float, end: float) -> None:
        self.calls.append({"step": self.step, "method": method, "driver_s": end - start, "start": start, "end": end})


def instrument(log: CallLog) -> None:
    """Wrap the driver's blocking calls: ``RayWorkerGroup`` calls, reward pool calls, ``ray.put``, each pipeline
    step (to number the calls)."""
    import ray

    from roll.distributed.group import RayWorkerGroup, method_name
    from roll.pipelines.rlvr_pipeline import RLVRPipeline
    from roll.rewards.workers import RewardWorkerPool

    def label(args) -> str:
        """``role.method``; a weight call (a worker's ``weights_out`` / ``weights_in`` entry point) adds the endpoint
        method it runs: ``actor_train.weights_out:gather``."""
        group, method = args[0], method_name(args[1])
        if method not in ("weights_out", "weights_in"):
            return f"{group.role}.{method}"
        endpoint = args[2][0][0] if isinstance(args[2], list) else args[2]  # call_each: per-rank argument tuples
        return f"{group.role}.{method}:{endpoint.__name__}"

    def timed(fn, name_of):
        def wrapper(*args, **kwargs):
            start = time.time()
            try:
                return fn(*args, **kwargs)
            finally:
                log.record(name_of(args), start, time.time())

        return wrapper

    for name in ("call", "call_rank0", "call_each"):
        setattr(
            RayWorkerGroup,
            name,
            timed(getattr(RayWorkerGroup, name), label),
        )
    RewardWorkerPool.compute = timed(RewardWorkerPool.compute, lambda a: "rewards.compute")
    ray.put = timed(ray.put, lambda a: "driver.ray_put")
    step_fn = RLVRPipeline.train_step

    def train_step(self, step):
        log.step = step
        return step_fn(self, step)

    RLVRPipeline.train_step = train_step
    sync_fn = RLVRPipeline.sync_infer
    RLVRPipeline.sync_infer = timed(sync_fn, lambda a: "pipeline.sync_infer")


def worker_tasks() -> list[dict]:
    """Actor method runs from Ray's timeline: ``{"name", "start", "end", "deserialize_s", "execute_s", "store_s"}``
    (epoch seconds; the three phases of the run: arguments deserialized, method executed, results stored)."""
    import ray

    events = [e for e in ray.timeline() if e.get("ph") == "X" and "dur" in e]
    tasks = [
        {"name": e["name"], "start": e["ts"] / 1e6, "end": (e["ts"] + e["dur"]) / 1e6}
        for e in events
        if str(e.get("cat", "")).startswith("task::")
    ]
    phases = [
        (e["cat"].split(":")[1], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)
        for e in events
        if e.get("cat") in ("task:deserialize_arguments", "task:execute", "task:store_outputs")
    ]
    phases.sort(key=lambda p: p[1])
    for t in tasks:
        for phase, lo, hi in phases:
            if lo >= t["start"] and hi <= t["end"]:
                key = {"deserialize_arguments": "deserialize_s", "execute": "execute_s", "store_outputs": "store_s"}[
                    phase
                ]
                t[key] = hi - lo
    return tasks


def summarize(log: CallLog, tasks: list[dict], skip: int) -> dict:
    """Per method, over steps > ``skip``: calls per step, and per call the medians of the driver's wait, the
    worker's run (deserialize arguments, execute, store results) and the rest (overhead outside the worker:
    submission, transfers, the driver's deserialization of the results, scheduling)."""
    steps = sorted({c["step"] for c in log.calls if c["step"] > skip})
    by_method: dict[str, list[dict]] = defaultdict(list)
    for c in log.calls:
        if c["step"] <= skip:
            continue
        short = c["method"].split(".")[-1].split(":")[0]  # the actor method, as Ray's timeline names it
        inside = [
            t for t in tasks if t["name"] == short and t["start"] >= c["start"] - 0.01 and t["end"] <= c["end"] + 0.01
        ]
        if inside:
            run = max(inside, key=lambda t: t["end"] - t["start"])
            c.update(
                {
                    "worker_s": run["end"] - run["start"],
                    **{k: run.get(k, 0.0) for k in ("deserialize_s", "execute_s", "store_s")},
                }
            )
        by_method[c["method"]].append(c)
    rows = {}
    for method, calls in by_method.items():
        per_step: dict[int, float] = defaultdict(float)
        for c in calls:
            per_step[c["step"]] += c["driver_s"]
        med = lambda key, calls=calls: (
            statistics.median(c[key] for c in calls if key in c) if any(key in c for c in calls) else None
        )
        rows[method] = {
            "calls_per_step": len(calls) / max(1, len(steps)),
            "driver_s_per_step": statistics.median(per_step.values()),
            "driver_s": med("driver_s"),
            "worker_s": med("worker_s"),
            "deserialize_s": med("deserialize_s"),
            "execute_s": med("execute_s"),
            "store_s": med("store_s"),
        }
        if rows[method]["worker_s"] is not None:
            rows[method]["outside_s"] = statistics.median(
                c["driver_s"] - c["worker_s"] for c in calls if "worker_s" in c
            )
    return rows


def sync_ab(model_dir: str, repeats: int) -> dict:
    """The copy-mode weight sync between a Ray trainer (deepspeed_train) and a Ray engine (hf_infer) of
    ``model_dir``, three ways, alternating ``repeats`` times: ``via_driver`` (the trainer's weights fetched into the
    driver, put back into the object store, loaded: the path before 2026-11-26), ``ref`` (the object ref passed on:
    :func:`roll.weights.sync.copy_weights`) and ``shared_memory`` (a file in /dev/shm, what a CPU run on
    one machine now does); also an empty round trip (``ping``). Seconds, medians."""
    import ray

    from roll.config.worker import WorkerConfig
    from roll.distributed.group import RayWorkerGroup
    from roll.distributed.roles import ActorProxy, InferProxy
    from roll.distributed.worker import Worker
    from roll.strategies.base import StrategyContext
    from roll.weights.shared_memory import SHARED_DIR
    from roll.weights.sync import WeightSync, copy_weights

    def config(strategy: str) -> WorkerConfig:
        cfg = WorkerConfig()
        cfg.model_args.model_name_or_path = model_dir
        cfg.strategy_args.strategy_name = strategy
        cfg.strategy_args.strategy_config = {"zero_stage": 0} if strategy == "deepspeed_train" else {}
        return cfg

    ray.init(address="local", num_cpus=4, include_dashboard=False)
    train = ActorProxy(RayWorkerGroup("actor_train", config("deepspeed_train"), 300))
    infer = InferProxy(RayWorkerGroup("actor_infer", config("hf_infer"), 300))
    train.initialize(StrategyContext(seed=0))
    infer.initialize(StrategyContext(seed=0))

    def via_driver() -> None:
        infer.weights_in.load(ray.put(train.weights_out.gather()))

    shared = WeightSync(train.weights_out, infer.weights_in, "copy", shared_dir=SHARED_DIR)
    ways = {
        "via_driver": via_driver,
        "ref": lambda: copy_weights(train.weights_out, infer.weights_in),
        "shared_memory": shared,
        "ping": lambda: train.group.call(Worker.ping),
    }
    times: dict[str, list[float]] = defaultdict(list)
    for r in range(repeats + 2):
        for name, fn in ways.items():
            start = time.perf_counter()
            fn()
            if r >= 2:  # two warm-up rounds
                times[name].append(time.perf_counter() - start)
    ray.shutdown()
    return {name: statistics.median(v) for name, v in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config-name", default="rlvr_tiny")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--skip", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "output" / "ray_overhead.json")
    parser.add_argument(
        "--sync-ab",
        type=Path,
        default=None,
        metavar="MODEL_DIR",
        help="instead of a run: time the weight sync's two paths on MODEL_DIR (sync_ab)",
    )
    parser.add_argument("--repeats", type=int, default=30, help="--sync-ab repeats")
    args, extra = parser.parse_known_args(argv)
    extra = [x for x in extra if x != "--"]
    if args.sync_ab:
        result = sync_ab(str(args.sync_ab), args.repeats)
        print(", ".join(f"{k} {v * 1000:.1f} ms" for k, v in result.items()))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps({"sync_ab": result, "model": str(args.sync_ab), "repeats": args.repeats}, indent=1)
        )
        return 0
    from roll.config.rlvr import RLVRConfig
    from roll.launch.command import load_checked
    from roll.pipelines.rlvr_pipeline import RLVRPipeline

    out_dir = ROOT / "output" / "ray_overhead"
    cfg = load_checked(
        args.config_name,
        overrides=[
            f"max_steps={args.steps}",
            "distributed=ray",
            "eval_steps=0",
            "save_steps=0",
            "track_with=stdout",
            f"output_dir={out_dir}",
            f"logging_dir={out_dir / 'logs'}",
            "zero_signal_patience=0",
            *extra,
        ],
        schema=RLVRConfig,
    )
    log = CallLog()
    instrument(log)
    pipeline = RLVRPipeline(cfg)
    pipeline.run()
    import ray

    rows = summarize(log, worker_tasks(), args.skip)
    metrics = [json.loads(x) for x in (out_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    metrics = [m for m in metrics if "time/step" in m][args.skip :]
    times = {k: statistics.median(m.get(k, 0.0) for m in metrics) for k in sorted(metrics[0]) if k.startswith("time/")}
    ray.shutdown()
    print("| call | calls/step | driver s/call | worker: deserialize / execute / store | outside the worker |")
    print("| --- | --- | --- | --- | --- |")
    fmt = lambda x: "-" if x is None else f"{x:.4f}"  # noqa: E731
    for method, r in sorted(rows.items(), key=lambda kv: -kv[1]["driver_s_per_step"]):
        print(
            f"| {method} | {r['calls_per_step']:.1f} | {fmt(r['driver_s'])} | {fmt(r['deserialize_s'])} / "
            f"{fmt(r['execute_s'])} / {fmt(r['store_s'])} | {fmt(r.get('outside_s'))} |"
        )
    print("pipeline time/* medians: " + ", ".join(f"{k[5:]} {v:.4f}" for k, v in times.items()))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"overrides": extra, "steps": args.steps, "skip": args.skip, "calls": rows, "time": times}, indent=1)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
