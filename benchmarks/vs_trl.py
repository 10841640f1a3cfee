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
    python benchmarks/vs_trl.py --grid --repeats 2 --steps 10 --out benchmarks/results/vs_trl_cpu_grid.json

``--grid`` runs the workload on each shape of :data:`GRID` (prompt tokens x reply tokens x samples per prompt, 8
prompts per step), alternating roll and TRL within each shape. A shape's prompt length is set by the system prompt
(:func:`system_prompt_for`: the question and chat template alone are 24 tokens of the tiny tokenizer, the shortest
prompt there is), and every reply is generated to its full length on both sides (roll's ``ignore_eos``, TRL's
``min_new_tokens``), so both sides do exactly the shape's work whatever the model says. The grid skips the
held-out evaluation, and roll's dead-signal stop is off (``zero_signal_patience=0``: full-length replies may score
0). Per shape it reports the ratio roll/TRL per mode and each side's rollout (generation and rewards) and the rest
of the step (training, weight sync, driver work).
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
#: ``(prompt tokens, reply tokens, samples per prompt)`` of ``--grid``: prompts 24-128 tokens, replies 8-64, groups
#: 4-16; the first is the issue-31 shape (prompts up to 32 tokens, 16-token replies, 8 x 8).
GRID = [(24, 16, 8), (24, 8, 4), (24, 64, 4), (64, 32, 8), (128, 8, 16), (128, 64, 4)]
FILLER = " Read the question, add or subtract the two numbers, check the result once more, then answer."


def workload(args: argparse.Namespace) -> dict:
    """The shared settings, as written to the results."""
    return {
        "prompts_per_step": args.prompts,
        "samples_per_prompt": args.group,
        "max_new_tokens": args.max_new_tokens,
        "prompt_tokens": args.prompt_tokens,
        "system_prompt": args.system_prompt,
        "full_length": args.full_length,
        "learning_rate": args.lr,
        "steps": args.steps,
        "dtype": "fp32",
        "beta": 0.0,
        "clip": 0.2,
        "data": str(DATA.relative_to(ROOT)),
    }


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
    return rc, time.perf_counter() - start, peak[0] / 2**30, cpu


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
    prompt_length = max(64, args.prompt_tokens or 0)
    shape = (
        []
        if args.system_prompt == SYSTEM_PROMPT
        else ["system_prompt=null" if args.system_prompt is None else f"system_prompt='{args.system_prompt}'"]
    )
    if args.full_length:
        shape += ["actor_infer.generating_args.ignore_eos=true", "zero_signal_patience=0"]
    return [
        *shape,
        f"prompt_length={prompt_length}",
        f"pretrain={args.work / 'start'}",
        "tiny_model=null",
        "sft_warmup.enabled=false",
        f"seed={seed}",
        f"max_steps={args.steps}",
        "eval_steps=0",
        "save_steps=0",
        "rollout_dump_steps=0",
        "track_with=stdout",
        f"output_dir={run_dir}",
        f"logging_dir={run_dir / 'logs'}",
        f"distributed={mode}",
        f"rollout_batch_size={args.prompts}",
        f"num_return_sequences_in_group={args.group}",
        f"response_length={args.max_new_tokens}",
        f"sequence_length={prompt_length + args.max_new_tokens}",
        f"actor_infer.generating_args.max_new_tokens={args.max_new_tokens}",
        "dynamic_sampling.enabled=false",
        "is_use_additional_prompts=false",
        f"actor_train.training_args.learning_rate={args.lr}",
        "actor_train.training_args.lr_scheduler_type=constant",
        "actor_train.training_args.warmup_steps=0",
        f"actor_train.training_args.per_device_train_batch_size={per_rank}",
        f"actor_train.world_size={args.roll_world_size}",
        f"actor_infer.world_size={args.roll_world_size}",
        "actor_train.training_args.gradient_accumulation_steps=1",
        "validation.file_name=[]",
        f"actor_train.strategy_args.strategy_name={strategy}",
        f"actor_train.strategy_args.strategy_config={sc}",
        *args.extra,
    ]


def step_intervals(timestamps: list[float]) -> list[float]:
    """Seconds between consecutive step ends, for steps ``SKIP + 1`` onwards (step 1's start is not recorded)."""
    return [b - a for a, b in zip(timestamps, timestamps[1:])][SKIP - 1 :]


def run_roll(args: argparse.Namespace, mode: str, run_dir: Path, seed: int) -> dict:
    """One roll run; step times from ``metrics.jsonl`` (the timestamps and roll's own phase timings)."""
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "start_rlvr_pipeline.py"),
        "--config-name",
        "rlvr_tiny",
        *roll_overrides(args, mode, run_dir, seed),
    ]
    rc, wall, rss, cpu = run_measured(cmd, run_dir / "run.log")
    if rc != 0:
        raise RuntimeError(f"roll ({mode}) exited with {rc}; see {run_dir / 'run.log'}")
    rows = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "time/step" in r]
    stamps = [r["timestamp"] for r in rows]
    breakdown = {k: statistics.median(r.get(k, 0.0) for r in rows[SKIP:]) for k in BREAKDOWN}
    return {
        "intervals": step_intervals(stamps),
        "cpu_s_per_step": cpu_per_step(cpu, stamps),
        "wall_s": wall,
        "peak_rss_gib": rss,
        "breakdown": breakdown,
        "final": repo_path(run_dir / "final"),
    }


def repo_path(path: Path) -> str:
    """``path`` as the results record it: relative to the repository when inside it (a results file names no
    machine's absolute path), else as it is."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def run_trl(args: argparse.Namespace, run_dir: Path, seed: int) -> dict:
    """One TRL run in the TRL virtualenv (``benchmarks/trl_grpo.py``)."""
    cmd = [
        str(args.trl_python),
        str(ROOT / "benchmarks" / "trl_grpo.py"),
        "--model",
        str(args.work / "start"),
        "--out",
        str(run_dir),
        "--steps",
        str(args.steps),
        "--seed",
        str(seed),
        "--prompts",
        str(args.prompts),
        "--group",
        str(args.group),
        "--max-new-tokens",
        str(args.max_new_tokens),
        "--lr",
        str(args.lr),
        "--system-prompt",
        args.system_prompt or "",
        *(["--full-length"] if args.full_length else []),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    rc, wall, rss, cpu = run_measured(cmd, run_dir / "run.log", env)
    if rc != 0:
        raise RuntimeError(f"TRL exited with {rc}; see {run_dir / 'run.log'}")
    rows = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    stamps = [r["timestamp"] for r in rows]
    rollout = statistics.median(r.get("rollout_s", 0.0) for r in rows[SKIP:])
    return {
        "intervals": step_intervals(stamps),
        "cpu_s_per_step": cpu_per_step(cpu, stamps),
        "wall_s": wall,
        "peak_rss_gib": rss,
        "breakdown": {"time/rollout": rollout},
        "final": repo_path(run_dir / "final"),
    }


def system_prompt_for(start: Path, tokens: int | None) -> tuple[str | None, int]:
    """The system prompt that makes the longest training prompt (chat template applied) ``tokens`` long, and that
    length: none at the shortest (24 tokens: the template and the question), else rlvr_tiny's instruction cut or
    extended with :data:`FILLER` one character at a time. ``tokens`` None: rlvr_tiny's own system prompt."""
    from transformers import AutoTokenizer

    from roll.data.rlvr_dataset import encode_prompts, load_rlvr_dataset

    tok = AutoTokenizer.from_pretrained(start)
    examples = load_rlvr_dataset([str(DATA / "train.jsonl")], prompt_key="prompt")
    length = lambda sp: max(map(len, encode_prompts(examples, tok, prompt_length=4096, system_prompt=sp)[0]))  # noqa: E731
    if tokens is None or tokens == length(SYSTEM_PROMPT):
        return SYSTEM_PROMPT, length(SYSTEM_PROMPT)
    if tokens <= length(None):
        return None, length(None)
    text = SYSTEM_PROMPT + FILLER * (1 + tokens // len(FILLER))
    n = 1
    while n < len(text) and length(text[:n].strip()) < tokens:
        n += 1
    return text[:n].strip(), length(text[:n].strip())


def prepare_start_model(args: argparse.Namespace) -> Path:
    """The shared start model: roll's tiny model after rlvr_tiny's supervised warm start (built once)."""
    start = args.work / "start"
    if (start / "config.json").exists():
        return start
    build = args.work / "build"
    cmd = [
        sys.executable,
        str(ROOT / "examples" / "start_rlvr_pipeline.py"),
        "--config-name",
        "rlvr_tiny",
        "max_steps=0",
        "distributed=local",
        "eval_steps=0",
        "track_with=stdout",
        f"pretrain={build / 'tiny'}",
        f"output_dir={build}",
        f"logging_dir={build / 'logs'}",
    ]
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
    for name, kwargs, n in (
        ("greedy", {"do_sample": False}, 1),
        ("sampled", {"do_sample": True, "temperature": 1.0, "top_p": 1.0}, samples),
    ):
        with torch.no_grad():
            seqs = model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=16,
                num_return_sequences=n,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
                **kwargs,
            )[:, width:]
        texts = tok.batch_decode(
            [[t for t in s.tolist() if t not in (tok.eos_token_id, tok.pad_token_id)] for s in seqs],
            skip_special_tokens=False,
        )
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
    out = {
        "s_per_step": spread([x for r in runs for x in r["intervals"]]),
        "run_medians": [statistics.median(r["intervals"]) for r in runs],
        "cpu_s_per_step": spread([r["cpu_s_per_step"] for r in runs]),
        "peak_rss_gib": max(r["peak_rss_gib"] for r in runs),
        "wall_s": [r["wall_s"] for r in runs],
    }
    for key in ("greedy", "sampled") if "eval" in runs[0] else ():
        values = [r["eval"][key] for r in runs]
        se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
        out[key] = {"mean": statistics.mean(values), "se_over_runs": se, "runs": values}
    if "breakdown" in runs[0]:
        out["breakdown"] = {k: statistics.median(r["breakdown"][k] for r in runs) for k in runs[0]["breakdown"]}
    return out


def report(results: dict) -> str:
    """The printed table."""
    sides, start = results["sides"], results.get("start_model_eval")
    trl = sides.get("trl", {}).get("s_per_step", {}).get("median")
    acc = lambda s, k: f"{100 * s[k]['mean']:.1f}%" if k in s else "-"  # noqa: E731
    lines = [
        f"start model: greedy {100 * start['greedy']:.1f}%, sampled {100 * start['sampled']:.1f}%"
        if start
        else "no held-out evaluation",
        "| side | s/step (median, min-max) | roll/TRL | CPU s/step | peak RSS | greedy acc | sampled acc |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, s in sides.items():
        t = s["s_per_step"]
        ratio = f"{t['median'] / trl:.2f}" if trl and name != "trl" else "-"
        lines.append(
            f"| {name} | {t['median']:.3f} ({t['min']:.3f}-{t['max']:.3f}) | {ratio} | "
            f"{s['cpu_s_per_step']['median']:.3f} | {s['peak_rss_gib']:.2f} GiB | "
            f"{acc(s, 'greedy')} | {acc(s, 'sampled')} |"
        )
    for name, s in sides.items():
        if "breakdown" in s:
            parts = ", ".join(f"{k.split('/')[1]} {v:.3f}" for k, v in s["breakdown"].items())
            lines.append(f"{name} step breakdown (medians, s): {parts}")
    return "\n".join(lines)


def run_shape(args: argparse.Namespace, work: Path) -> dict:
    """The repeats of every side on one workload shape, alternating; the results (JSON-ready) with the ratio of
    each roll side's median s/step to TRL's."""
    sides = [f"roll-{m}" for m in args.modes] + ([] if args.no_trl else ["trl"])
    runs: dict[str, list[dict]] = {s: [] for s in sides}
    load = [os.getloadavg()[0]]
    for r in range(args.repeats):
        k = (r + args.rotate) % len(sides)
        for side in sides[k:] + sides[:k]:  # rotate the order between repeats
            run_dir = work / f"{side}-{r}"
            seed = args.seed + r
            print(f"[vs_trl] repeat {r + 1}/{args.repeats}: {side} (seed {seed})", flush=True)
            for attempt in (1, 2):  # on a shared machine a run can die of others' doings (a killed Ray): once more
                try:
                    res = (
                        run_trl(args, run_dir, seed)
                        if side == "trl"
                        else run_roll(args, side.split("-", 1)[1], run_dir, seed)
                    )
                    break
                except RuntimeError as exc:
                    if attempt == 2:
                        raise
                    print(f"[vs_trl]   {exc}; running it again", flush=True)
            if args.eval_samples:
                res["eval"] = evaluate(str(ROOT / res["final"]), args.eval_samples)
            print(
                f"[vs_trl]   median {statistics.median(res['intervals']):.3f} s/step "
                f"({res['cpu_s_per_step']:.3f} CPU s/step), wall {res['wall_s']:.0f} s, "
                f"peak RSS {res['peak_rss_gib']:.2f} GiB"
                + (
                    f", greedy {res['eval']['greedy']:.3f}, sampled {res['eval']['sampled']:.3f}"
                    if "eval" in res
                    else ""
                ),
                flush=True,
            )
            runs[side].append(res)
            load.append(os.getloadavg()[0])
    results = {
        "workload": workload(args),
        "roll_strategy": args.roll_strategy,
        "roll_overrides": args.extra,
        "roll_world_size": args.roll_world_size,
        "cpus": os.cpu_count(),
        "load_average_1min": load,
        "repeats": args.repeats,
        "skip_steps": SKIP,
        "sides": {s: side_summary(rs) for s, rs in runs.items()},
        "runs": runs,
    }
    if args.eval_samples:
        results["start_model_eval"] = evaluate(str(args.work / "start"), args.eval_samples)
    trl = results["sides"].get("trl")
    for side, s in results["sides"].items():
        if trl and side != "trl":
            s["ratio_to_trl"] = s["s_per_step"]["median"] / trl["s_per_step"]["median"]
    print(f"[vs_trl] 1-min load average before/during/after: {', '.join(f'{x:.1f}' for x in load)}", flush=True)
    return results


#: Issue 31's targets: roll's step time over TRL's, per mode.
TARGETS = {"roll-ray": 0.8, "roll-local": 0.7}


def split(side: dict) -> dict[str, float]:
    """A side's median step as ``rollout`` (generation and rewards) and ``rest`` (training, sync, driver work)."""
    step, rollout = side["s_per_step"]["median"], side["breakdown"]["time/rollout"]
    return {"rollout": rollout, "rest": step - rollout}


def losing_phase(roll: dict, trl: dict) -> str:
    """The phase in which roll spends the most time beyond TRL's (``rollout`` or ``rest``)."""
    mine, theirs = split(roll), split(trl)
    return max(mine, key=lambda k: mine[k] - theirs[k])


def grid_report(results: dict) -> str:
    """The grid's table: per shape, s/step of each side, the ratios, the ratio of each side's fastest run (its
    median; the run least slowed by other load), rollout / rest of the step per side, and for a mode over its
    target (:data:`TARGETS`, on the pooled medians) the phase it loses in."""
    lines = [
        "| prompt x reply x group | TRL s/step | roll Ray s/step (ratio) | roll local s/step (ratio) | "
        "best runs' ratio: Ray, local | rollout / rest (s): TRL, Ray, local | over target: loses in |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for shape in results["grid"]:
        w, sides = shape["workload"], shape["sides"]
        cells = []
        for name in ("roll-ray", "roll-local"):
            s = sides.get(name)
            cells.append(
                "-" if s is None else f"{s['s_per_step']['median']:.3f} ({s.get('ratio_to_trl', float('nan')):.2f})"
            )
        parts = [
            " / ".join(f"{v:.3f}" for v in split(sides[n]).values())
            for n in ("trl", "roll-ray", "roll-local")
            if n in sides
        ]
        over = [
            f"{n.split('-')[1]}: {losing_phase(sides[n], sides['trl'])}"
            for n, target in TARGETS.items()
            if n in sides and "trl" in sides and sides[n]["ratio_to_trl"] > target
        ]
        trl = sides.get("trl", {}).get("s_per_step", {}).get("median", float("nan"))
        best = (
            ", ".join(
                f"{min(sides[n]['run_medians']) / min(sides['trl']['run_medians']):.2f}"
                for n in ("roll-ray", "roll-local")
                if n in sides and "trl" in sides
            )
            or "-"
        )
        lines.append(
            f"| {w['prompt_tokens']} x {w['max_new_tokens']} x {w['samples_per_prompt']} | {trl:.3f} | "
            f"{cells[0]} | {cells[1]} | {best} | {', '.join(parts)} | {'; '.join(over) or '-'} |"
        )
    return "\n".join(lines)


def combine(paths: list[Path]) -> dict:
    """Grid results of several invocations (``--grid``, e.g. one early and one late, or ``--rotate``d) as one:
    per shape, every run of every side pooled, then summarized as one invocation's repeats are."""
    parts = [json.loads(p.read_text()) for p in paths]
    out = {
        **parts[0],
        "grid": [],
        "combined_from": [str(p) for p in paths],
        "repeats": sum(p["repeats"] for p in parts),
    }
    for shapes in zip(*(p["grid"] for p in parts)):
        runs = {side: [r for s in shapes for r in s["runs"][side]] for side in shapes[0]["runs"]}
        shape = {
            **shapes[0],
            "runs": runs,
            "sides": {side: side_summary(rs) for side, rs in runs.items()},
            "load_average_1min": [x for s in shapes for x in s["load_average_1min"]],
        }
        trl = shape["sides"].get("trl")
        for side, summary in shape["sides"].items():
            if trl and side != "trl":
                summary["ratio_to_trl"] = summary["s_per_step"]["median"] / trl["s_per_step"]["median"]
        out["grid"].append(shape)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog="Arguments after -- are extra Hydra overrides for every roll run."
    )
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--modes", nargs="+", default=["ray", "local"], choices=["ray", "local"], help="roll's distributed modes to run"
    )
    parser.add_argument("--roll-strategy", default="deepspeed_train", help="actor_train's training strategy")
    parser.add_argument(
        "--roll-world-size",
        type=int,
        default=1,
        help="workers of actor_train and actor_infer (data parallel; Ray mode only)",
    )
    parser.add_argument("--no-trl", action="store_true", help="run roll only")
    parser.add_argument("--trl-python", type=Path, default=ROOT / ".venv-trl" / "bin" / "python")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=None,
        help="prompt length (system_prompt_for); default: rlvr_tiny's system prompt (44 tokens)",
    )
    parser.add_argument(
        "--full-length",
        action="store_true",
        help="every reply --max-new-tokens long on both sides (roll ignore_eos, TRL min_new_tokens)",
    )
    parser.add_argument("--grid", action="store_true", help="run every shape of GRID (see the module docstring)")
    parser.add_argument(
        "--shapes",
        nargs="+",
        default=None,
        metavar="PxRxG",
        help="with --grid: only these shapes of GRID, e.g. 24x8x4 128x64x4",
    )
    parser.add_argument(
        "--combine",
        type=Path,
        nargs="+",
        default=None,
        metavar="GRID_JSON",
        help="pool the runs of these --grid results into --out and print the table (runs nothing)",
    )
    parser.add_argument(
        "--rotate",
        type=int,
        default=0,
        help="start the side order rotated by this much (a second invocation's runs in another order)",
    )
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument(
        "--eval-samples", type=int, default=8, help="sampled answers per held-out prompt; 0: no held-out evaluation"
    )
    parser.add_argument("--seed", type=int, default=0, help="repeat r runs with seed + r on every side")
    parser.add_argument("--work", type=Path, default=ROOT / "output" / "vs_trl")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vs_trl_cpu.json")
    args, extra = parser.parse_known_args(argv)
    args.extra = [x for x in extra if x != "--"]
    args.work = args.work.resolve()
    if args.combine:
        results = combine(args.combine)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))
        print(grid_report(results))
        return 0
    if (args.prompts * args.group) % args.roll_world_size or (args.roll_world_size > 1 and "local" in args.modes):
        parser.error(
            f"--roll-world-size {args.roll_world_size}: must divide {args.prompts * args.group} samples "
            "and needs --modes ray (local mode runs one worker per role)"
        )
    if not args.no_trl and not args.trl_python.exists():
        parser.error(
            f"--trl-python {args.trl_python} does not exist; make the TRL virtualenv "
            "(benchmarks/README.md) or pass --no-trl"
        )
    prepare_start_model(args)
    if not args.grid:
        args.system_prompt, args.prompt_tokens = system_prompt_for(args.work / "start", args.prompt_tokens)
        results = run_shape(args, args.work / "runs")
        print(report(results))
    else:
        results = {
            "grid": [],
            "cpus": os.cpu_count(),
            "roll_strategy": args.roll_strategy,
            "roll_overrides": args.extra,
            "repeats": args.repeats,
            "skip_steps": SKIP,
        }
        shapes = GRID if args.shapes is None else [tuple(int(v) for v in name.split("x")) for name in args.shapes]
        unknown = sorted(set(shapes) - set(GRID))
        if unknown:
            parser.error(f"--shapes {unknown}: not in the grid; known: {' '.join('x'.join(map(str, g)) for g in GRID)}")
        for prompt_tokens, reply_tokens, group in shapes:
            shape = argparse.Namespace(
                **{**vars(args), "max_new_tokens": reply_tokens, "group": group, "full_length": True, "eval_samples": 0}
            )
            shape.system_prompt, shape.prompt_tokens = system_prompt_for(args.work / "start", prompt_tokens)
            print(
                f"[vs_trl] shape: prompts of {shape.prompt_tokens} tokens, {reply_tokens}-token replies, "
                f"{args.prompts} x {group} samples",
                flush=True,
            )
            out = run_shape(shape, args.work / "grid" / f"p{prompt_tokens}_r{reply_tokens}_g{group}")
            results["grid"].append(out)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(results, indent=1))  # after every shape: a partial grid survives
        print(grid_report(results))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    print(f"[vs_trl] results in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
