"""roll vs TRL's GRPOTrainer on one tiny RLVR workload, side by side, alternating repeats.

The workload (both sides the same): a ~1M-parameter Qwen2 built from a config (roll's tiny model, warm-started
once on the training answers so that rewards are not all zero), ``data/math_tiny`` prompts with roll's system
prompt and chat template, 8 prompts x 8 samples x at most 16 new tokens per step, GRPO (group mean/std advantage),
PPO clip 0.2, one optimizer step per batch (``num_iterations=1``), token-mean loss (TRL's ``dapo``), AdamW at a
constant 1e-4, gradient clipping 1.0, beta 0 (no reference model), fp32, no gradient checkpointing, roll's rule
``math`` reward on both sides. Installs nothing: TRL runs in its own virtualenv (``--trl-python``; see
``benchmarks/README.md``), each run a subprocess, so peak memory is per run.

Prints the median seconds per step of each side (intervals between step ends, steps 1-3 left out), the ratio
roll / TRL, the CPU seconds per step of each run's process tree (all cores; robust to other load on the
machine), roll's step breakdown, the peak RSS of each run's process tree (Ray's processes included), and the
greedy and sampled accuracies of the final models on the held-out ``data/math_tiny/test.jsonl`` prompts, all
scored by the same code here. Results JSON goes to ``--out``.

    python benchmarks/vs_trl.py --repeats 3 --steps 30
    python benchmarks/vs_trl.py --modes ray --roll-strategy fsdp2_train          # another training strategy
    python benchmarks/vs_trl.py --modes local -- actor_train.num_cpus_per_worker=1  # extra roll overrides
    python benchmarks/vs_trl.py --modes ray --roll-world-size 2 -- actor_train.num_cpus_per_worker=1 \
        actor_infer.num_cpus_per_worker=1                                            # 2 data-parallel workers
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "data" / "math_tiny"
SYSTEM_PROMPT = "Give the final answer as <answer>N</answer>."  # rlvr_tiny's; the TRL side gets the same
SKIP = 3  # leading steps left out of the medians (start-up: first forward passes, allocator growth)
BREAKDOWN = ["time/rollout", "time/rollout_generate", "time/log_probs", "time/train", "time/sync", "time/step"]


def workload(args: argparse.Namespace) -> dict:
    """The shared settings, as written to the results."""
    return {"prompts_per_step": args.prompts, "samples_per_prompt": args.group, "max_new_tokens": args.max_new_tokens,
            "learning_rate": args.lr, "steps": args.steps, "dtype": "fp32", "beta": 0.0, "clip": 0.2,
            "data": str(DATA.relative_to(ROOT))}


# ---------------------------------------------------------------------------- runs
def tree_usage(pid: int) -> tuple[int, float]:
    """(summed RSS in bytes, summed user + system CPU seconds) of process ``pid`` and all its descendants."""
    import psutil

    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0, 0.0
    rss, cpu = 0, 0.0
    for p in procs:
        try:
            rss += p.memory_info().rss
            times = p.cpu_times()
            cpu += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return rss, cpu


def run_measured(cmd: list[str], log: Path, env: dict | None = None) -> tuple[int, float, float, list]:
    """Run ``cmd`` (output to ``log``); returns (exit code, wall seconds, peak RSS of its process tree in GiB,
    ``[(epoch time, CPU seconds of the tree so far), ...]`` sampled every 0.2 s)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
        peak, cpu, done = [0], [], threading.Event()

        def sample() -> None:
            while not done.is_set():
                rss, seconds = tree_usage(proc.pid)
                peak[0] = max(peak[0], rss)
                if seconds:
                    cpu.append((time.time(), seconds))
                done.wait(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        rc = proc.wait()
        done.set()
        sampler.join()
    return rc, time.perf_counter() - start, peak[0] / 2 ** 30, cpu


def cpu_per_step(samples: list[tuple[float, float]], timestamps: list[float]) -> float:
    """CPU seconds (all cores, whole process tree) per step between the end of step ``SKIP`` and the last step's
    end, interpolated in the tree's CPU samples: a load-robust companion of the wall time per step."""
    import numpy as np

    t, c = np.array([s[0] for s in samples]), np.array([s[1] for s in samples])
    first, last = timestamps[SKIP - 1], timestamps[-1]
    return float(np.interp(last, t, c) - np.interp(first, t, c)) / (len(timestamps) - SKIP)


def roll_overrides(args: argparse.Namespace, mode: str, run_dir: Path, seed: int) -> list[str]:
    """Hydra overrides that turn ``rlvr_tiny`` into the shared workload."""
    strategy, per_rank = args.roll_strategy, args.prompts * args.group // args.roll_world_size
    sc = "{zero_stage:0}" if strategy == "deepspeed_train" else "{}"
    return [f"pretrain={args.work / 'start'}", "tiny_model=null", "sft_warmup.enabled=false", f"seed={seed}",
            f"max_steps={args.steps}", "eval_steps=0", "save_steps=0", "rollout_dump_steps=0", "track_with=stdout",
            f"output_dir={run_dir}", f"logging_dir={run_dir / 'logs'}", f"distributed={mode}",
            f"rollout_batch_size={args.prompts}", f"num_return_sequences_in_group={args.group}",
            f"response_length={args.max_new_tokens}", f"sequence_length={64 + args.max_new_tokens}",
            f"actor_infer.generating_args.max_new_tokens={args.max_new_tokens}", "dynamic_sampling.enabled=false",
            "is_use_additional_prompts=false", f"actor_train.training_args.learning_rate={args.lr}",
            "actor_train.training_args.lr_scheduler_type=constant", "actor_train.training_args.warmup_steps=0",
            f"actor_train.training_args.per_device_train_batch_size={per_rank}",
            f"actor_train.world_size={args.roll_world_size}", f"actor_infer.world_size={args.roll_world_size}",
            "actor_train.training_args.gradient_accumulation_steps=1", "validation.file_name=[]",
            f"actor_train.strategy_args.strategy_name={strategy}", f"actor_train.strategy_args.strategy_config={sc}",
            *args.extra]


def step_intervals(timestamps: list[float]) -> list[float]:
    """Seconds between consecutive step ends, for steps ``SKIP + 1`` onwards (step 1's start is not recorded)."""
    return [b - a for a, b in zip(timestamps, timestamps[1:])][SKIP - 1:]


def run_roll(args: argparse.Namespace, mode: str, run_dir: Path, seed: int) -> dict:
    """One roll run; step times from ``metrics.jsonl`` (the timestamps and roll's own phase timings)."""
    cmd = [sys.executable, str(ROOT / "examples" / "start_rlvr_pipeline.py"), "--config-name", "rlvr_tiny",
           *roll_overrides(args, mode, run_dir, seed)]
    rc, wall, rss, cpu = run_measured(cmd, run_dir / "run.log")
    if rc != 0:
        raise RuntimeError(f"roll ({mode}) exited with {rc}; see {run_dir / 'run.log'}")
    rows = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step" in r]
    stamps = [r["timestamp"] for r in rows]
    breakdown = {k: statistics.median(r.get(k, 0.0) for r in rows[SKIP:]) for k in BREAKDOWN}
    return {"intervals": step_intervals(stamps), "cpu_s_per_step": cpu_per_step(cpu, stamps), "wall_s": wall,
            "peak_rss_gib": rss, "breakdown": breakdown, "final": str(run_dir / "final")}


def run_trl(args: argparse.Namespace, run_dir: Path, seed: int) -> dict:
    """One TRL run in the TRL virtualenv (``benchmarks/trl_grpo.py``)."""
    cmd = [str(args.trl_python), str(ROOT / "benchmarks" / "trl_grpo.py"), "--model", str(args.work / "start"),
           "--out", str(run_dir), "--steps", str(args.steps), "--seed", str(seed), "--prompts", str(args.prompts),
           "--group", str(args.group), "--max-new-tokens", str(args.max_new_tokens), "--lr", str(args.lr),
           "--system-prompt", SYSTEM_PROMPT]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    rc, wall, rss, cpu = run_measured(cmd, run_dir / "run.log", env)
    if rc != 0:
        raise RuntimeError(f"TRL exited with {rc}; see {run_dir / 'run.log'}")
    stamps = [json.loads(line)["timestamp"] for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    return {"intervals": step_intervals(stamps), "cpu_s_per_step": cpu_per_step(cpu, stamps), "wall_s": wall,
            "peak_rss_gib": rss, "final": str(run_dir / "final")}


def prepare_start_model(args: argparse.Namespace) -> Path:
    """The shared start model: roll's tiny model after rlvr_tiny's supervised warm start (built once)."""
    start = args.work / "start"
    if (start / "config.json").exists():
        return start
    build = args.work / "build"
    cmd = [sys.executable, str(ROOT / "examples" / "start_rlvr_pipeline.py"), "--config-name", "rlvr_tiny",
           "max_steps=0", "distributed=local", "eval_steps=0", "track_with=stdout", f"pretrain={build / 'tiny'}",
           f"output_dir={build}", f"logging_dir={build / 'logs'}"]
    print(f"[vs_trl] building the start model: {' '.join(cmd[1:])}", flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    (build / "final").rename(start)
    return start


# ---------------------------------------------------------------------------- evaluation
def evaluate(model_dir: str, samples: int, seed: int = 0) -> dict:
    """Greedy accuracy (one answer per held-out prompt) and sampled accuracy (``samples`` answers per prompt at
    temperature 1) of a saved model on ``data/math_tiny/test.jsonl``, scored by roll's ``math`` reward."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from roll.data.rlvr_dataset import encode_prompts, load_rlvr_dataset
    from roll.rewards.math_answer import math_reward

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    examples = load_rlvr_dataset([str(DATA / "test.jsonl")], prompt_key="prompt")
    ids, _ = encode_prompts(examples, tok, prompt_length=64, system_prompt=SYSTEM_PROMPT)
    width = max(map(len, ids))
    input_ids = torch.tensor([[tok.pad_token_id] * (width - len(p)) + p for p in ids])
    mask = (torch.arange(width)[None, :] >= torch.tensor([width - len(p) for p in ids])[:, None]).long()
    out = {}
    torch.manual_seed(seed)
    for name, kwargs, n in (("greedy", {"do_sample": False}, 1),
                            ("sampled", {"do_sample": True, "temperature": 1.0, "top_p": 1.0}, samples)):
        with torch.no_grad():
            seqs = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=16,
                                  num_return_sequences=n, pad_token_id=tok.pad_token_id,
                                  eos_token_id=tok.eos_token_id, **kwargs)[:, width:]
        texts = tok.batch_decode([[t for t in s.tolist() if t not in (tok.eos_token_id, tok.pad_token_id)]
                                  for s in seqs], skip_special_tokens=False)
        truths = [ex.ground_truth for ex in examples for _ in range(n)]
        correct = [math_reward(t, g, format_reward=0.0).correct for t, g in zip(texts, truths)]
        out[name] = sum(correct) / len(correct)
        out[f"{name}_n"] = len(correct)
    return out


# ---------------------------------------------------------------------------- summary
def spread(values: list[float]) -> dict:
    """Median, min, max and count."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def side_summary(runs: list[dict]) -> dict:
    """Per side: s/step over all runs' intervals, each run's median, peak RSS, accuracies (mean, SE over runs)."""
    out = {"s_per_step": spread([x for r in runs for x in r["intervals"]]),
           "run_medians": [statistics.median(r["intervals"]) for r in runs],
           "cpu_s_per_step": spread([r["cpu_s_per_step"] for r in runs]),
           "peak_rss_gib": max(r["peak_rss_gib"] for r in runs), "wall_s": [r["wall_s"] for r in runs]}
    for key in ("greedy", "sampled"):
        values = [r["eval"][key] for r in runs]
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
        out[key] = {"mean": statistics.mean(values), "se_over_runs": se, "runs": values}
    if "breakdown" in runs[0]:
        out["breakdown"] = {k: statistics.median(r["breakdown"][k] for r in runs) for k in BREAKDOWN}
    return out


def report(results: dict) -> str:
    """The printed table."""
    sides, start = results["sides"], results["start_model_eval"]
    trl = sides.get("trl", {}).get("s_per_step", {}).get("median")
    lines = [f"start model: greedy {100 * start['greedy']:.1f}%, sampled {100 * start['sampled']:.1f}%",
             "| side | s/step (median, min-max) | roll/TRL | CPU s/step | peak RSS | greedy acc | sampled acc |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, s in sides.items():
        t = s["s_per_step"]
        ratio = f"{t['median'] / trl:.2f}" if trl and name != "trl" else "-"
        lines.append(f"| {name} | {t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f}) | {ratio} | "
                     f"{s['cpu_s_per_step']['median']:.3f} | {s['peak_rss_gib']:.2f} GiB | "
                     f"{100 * s['greedy']['mean']:.1f}% | {100 * s['sampled']['mean']:.1f}% |")
    for name, s in sides.items():
        if "breakdown" in s:
            parts = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in s["breakdown"].items())
            lines.append(f"{name} step breakdown (medians, s): {parts}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                     epilog="Arguments after -- are extra Hydra overrides for every roll run.")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["ray", "local"], choices=["ray", "local"],
                        help="roll's distributed modes to run")
    parser.add_argument("--roll-strategy", default="deepspeed_train", help="actor_train's training strategy")
    parser.add_argument("--roll-world-size", type=int, default=1,
                        help="workers of actor_train and actor_infer (data parallel; Ray mode only)")
    parser.add_argument("--no-trl", action="store_true", help="run roll only")
    parser.add_argument("--trl-python", type=Path, default=ROOT / ".venv-trl" / "bin" / "python")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--eval-samples", type=int, default=8, help="sampled answers per held-out prompt")
    parser.add_argument("--seed", type=int, default=0, help="repeat r runs with seed + r on every side")
    parser.add_argument("--work", type=Path, default=ROOT / "output" / "vs_trl")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vs_trl_cpu.json")
    args, extra = parser.parse_known_args(argv)
    args.extra = [x for x in extra if x != "--"]
    args.work = args.work.resolve()
    if (args.prompts * args.group) % args.roll_world_size or (args.roll_world_size > 1 and "local" in args.modes):
        parser.error(f"--roll-world-size {args.roll_world_size}: must divide {args.prompts * args.group} samples "
                     "and needs --modes ray (local mode runs one worker per role)")
    if not args.no_trl and not args.trl_python.exists():
        parser.error(f"--trl-python {args.trl_python} does not exist; make the TRL virtualenv "
                     "(benchmarks/README.md) or pass --no-trl")
    prepare_start_model(args)
    sides = [f"roll-{m}" for m in args.modes] + ([] if args.no_trl else ["trl"])
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    load = [os.getloadavg()[0]]
    for r in range(args.repeats):
        for side in sides[r % len(sides):] + sides[:r % len(sides)]:  # rotate the order between repeats
            run_dir = args.work / "runs" / f"{side}-{r}"
            seed = args.seed + r
            print(f"[vs_trl] repeat {r + 1}/{args.repeats}: {side} (seed {seed})", flush=True)
            res = (run_trl(args, run_dir, seed) if side == "trl"
                   else run_roll(args, side.split("-", 1)[1], run_dir, seed))
            res["eval"] = evaluate(res["final"], args.eval_samples)
            print(f"[vs_trl]   median {statistics.median(res['intervals']):.3f} s/step "
                  f"({res['cpu_s_per_step']:.3f} CPU s/step), wall {res['wall_s']:.0f} s, "
                  f"peak RSS {res['peak_rss_gib']:.2f} GiB, greedy {res['eval']['greedy']:.3f}, "
                  f"sampled {res['eval']['sampled']:.3f}", flush=True)
            runs[side].append(res)
            load.append(os.getloadavg()[0])
    results = {"workload": workload(args), "roll_strategy": args.roll_strategy, "roll_overrides": args.extra,
               "roll_world_size": args.roll_world_size,
               "cpus": os.cpu_count(), "load_average_1min": load, "repeats": args.repeats, "skip_steps": SKIP,
               "start_model_eval": evaluate(str(args.work / "start"), args.eval_samples),
               "sides": {s: side_summary(rs) for s, rs in runs.items()}, "runs": runs}
    trl = results["sides"].get("trl")
    for side, s in results["sides"].items():
        if trl and side != "trl":
            s["ratio_to_trl"] = s["s_per_step"]["median"] / trl["s_per_step"]["median"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(report(results))
    print(f"[vs_trl] results in {args.out}; 1-min load average before/during/after: "
          f"{', '.join(f'{x:.1f}' for x in load)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
