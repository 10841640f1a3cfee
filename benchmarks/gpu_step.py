"""Where a pipeline step's time goes on a GPU, against the bare components doing the same work.

Runs ``--steps`` steps of any config (agentic or RLVR, picked from the config's keys), then, in the same process and
on the same workers:

- the engine alone generating the step's number of tokens (one batch: the step's requests, each the mean prompt and
  response length, ``ignore_eos``), and
- one training step alone on the step's number of tokens (random ids, the same sample count and lengths),

and prints per step and as medians (steps after ``--skip``): the breakdown, generated tokens/s, trained tokens/s,
MFU (training FLOPs per trained token x trained tokens / time/train / the GPU's dense bf16 peak, from the device
name; 6 x parameters with full weights, 4 x parameters + 6 x adapter parameters with LoRA: the frozen base gets no
weight gradients, only activation gradients), the fraction
(generate + train) / step, sync GiB/s, and pipeline step / (bare generate + bare train). Results go to
``benchmarks/results/<config>_<gpu>.json``.

    python benchmarks/gpu_step.py --config-name sokoban_qwen05b_sglang --steps 8 pretrain=/tmp/roll-models/qwen05b-rand

CPU smoke mode (CI runs it, ``tests/scripts/test_gpu_scripts_smoke.py``): ``--smoke [DIR]`` runs the same code on
the tiny config of the same kind (``scripts/cpu_smoke.py``: ``hf_infer``, a model built from its config, seconds
per step), scratch and results JSON in DIR (default ``output/smoke``), never in ``benchmarks/results``:

    python benchmarks/gpu_step.py --config-name sokoban_qwen05b_sglang --steps 2 --smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

#: Dense bf16 tensor-core peak (FLOP/s) by a substring of the device name (vendor data sheets; SXM parts).
PEAK_BF16 = {
    "H200": 989.4e12,
    "H100": 989.4e12,
    "H800": 989.4e12,
    "B200": 2250e12,
    "A100": 312e12,
    "A800": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "4090": 165.2e12,
}
ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
SMOKE_DIR = "output/smoke"  # repository-relative scratch of the CPU smoke modes (git-ignored)


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device by name; None when unknown (MFU is then not reported)."""
    for key, value in PEAK_BF16.items():
        if key in device_name:
            return value
    return None


def count_parameters(model_path: str) -> int:
    """Parameters of the model at ``model_path`` (tied embeddings counted once; a vision-language model's vision
    tower included), built on the meta device."""
    import torch
    from transformers import AutoConfig

    from roll.models.loading import auto_model_class

    config = AutoConfig.from_pretrained(model_path)
    with torch.device("meta"):
        model = auto_model_class(config).from_config(config)
    return sum(p.numel() for p in model.parameters())


def step_rows(metrics_path: Path) -> list[dict]:
    """The training steps' metric rows of a run (rows with ``time/step``)."""
    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "time/step" in r]


def train_flops_per_token(model_path: str, lora: tuple[int, tuple[str, ...]] | None) -> tuple[float, str]:
    """Training FLOPs per trained token and the formula: ``6 P`` for full weights; with LoRA of rank ``r`` on its
    target modules, ``4 P + 6 P_a`` (forward 2 P, activation gradients 2 P through the frozen base, the adapters'
    forward, backward and weight gradients 6 P_a)."""
    params = count_parameters(model_path)
    if not lora or not lora[0]:
        return 6.0 * params, "6 P"
    import json

    from roll.launch.memory import ModelShape

    shape = ModelShape.from_config(json.loads((Path(model_path) / "config.json").read_text()))
    adapter = shape.lora_params(*lora)
    return 4.0 * params + 6.0 * adapter, f"4 P + 6 P_a (P_a = {adapter} adapter parameters)"


def summarize(row: dict, params: int, peak: float | None, flops_per_token: float | None = None) -> dict[str, float]:
    """One step's figures (see the module docstring); ``flops_per_token`` defaults to ``6 x params``."""
    step, train = row["time/step"], max(row.get("time/train", 0.0), 1e-9)
    generate = row.get("time/rollout_generate", row.get("time/rollout", 0.0))
    tokens = row.get("perf/tokens", 0.0)
    generated = row.get("rollout/generated_tokens", 0.0)
    trained_per_s = row.get("perf/train_tokens_per_s", tokens / train)
    out = {
        "step_s": step,
        "generate_s": generate,
        "rollout_s": row.get("time/rollout", 0.0),
        "train_s": train,
        "old_log_probs_s": row.get("time/old_log_probs", row.get("time/log_probs", 0.0)),
        "sync_s": row.get("time/sync", 0.0),
        "offload_reload_s": row.get("time/offload_reload", 0.0),
        "gen_tokens_per_s": generated / max(generate, 1e-9),
        "train_tokens_per_s": trained_per_s,
        "gen_train_fraction": (generate + train) / step,
        "sync_gib_per_s": row.get("sync/gib", 0.0) / max(row.get("time/sync", 0.0), 1e-9),
        "sync_gib": row.get("sync/gib", float("nan")),
        "grad_norm": row.get("actor/grad_norm", float("nan")),
        "advantages_max": row.get("critic/advantages_max", float("nan")),
        "advantages_min": row.get("critic/advantages_min", float("nan")),
        "logprob_mismatch": row.get("rollout/logprob_mismatch", float("nan")),
        "sync_mode": row.get("sync/mode", float("nan")),
        "tokens": tokens,
        "generated_tokens": generated,
        "samples": row.get("perf/samples", 0.0),
    }
    out["mfu"] = (flops_per_token or 6.0 * params) * trained_per_s / peak if peak else float("nan")
    for key in ("perf/actor_train_peak_allocated_gib", "perf/actor_train_peak_reserved_gib", "perf/gpu_used_gib"):
        if key in row:
            out[key.removeprefix("perf/")] = row[key]
    return out


def memory_estimate(cfg) -> dict:
    """The preflight's memory estimate of the run (:mod:`roll.launch.memory_plan`), per GPU and phase, in GiB: to
    compare with the measured peaks (``actor_train_peak_reserved_gib``, ``gpu_used_gib``)."""
    from roll.launch import memory_plan

    gpu_gib = cfg.gpu_memory_gib or memory_plan.detected_gpu_gib() or 80.0
    try:
        plan = memory_plan.plan_memory(cfg, gpu_gib)
    except Exception as exc:  # a config the planner cannot estimate still gets its timings
        return {"error": f"{type(exc).__name__}: {exc}"}
    columns = {
        f"{c.where} {c.phase}": {"total": c.total, **{f"{t.role} {t.what}": t.gib for t in c.terms}}
        for c in plan.columns
    }
    return {"gpu_gib": gpu_gib, "peak_gib": plan.peak().total if plan.columns else None, "columns": columns}


def bare_components(pipeline, row: dict, repeats: int = 2, profile: bool = False) -> dict[str, float]:
    """Seconds of the engine generating the step's tokens alone and of one training step on its tokens alone."""
    import torch

    from roll.config.worker import GeneratingArgs
    from roll.data.batch import Batch
    from roll.ppo.loss_fns import SFT_LOSS

    groups, cfg = pipeline.groups, pipeline.cfg
    samples = int(row.get("perf/samples") or cfg.rollout_batch_size * max(1, cfg.num_return_sequences_in_group))
    requests = int(round(samples * row.get("rollout/mean_actions", 1.0)))
    generated = row.get("rollout/generated_tokens", 0.0)
    new_tokens = max(1, int(round(generated / max(1, requests))))
    tokens = row.get("perf/tokens", 0.0)
    prompt = max(1, int(round((tokens - generated) / max(1, requests))))
    vocab = len(pipeline.tokenizer)
    gen = torch.Generator().manual_seed(0)
    prompts = torch.randint(10, vocab - 10, (requests, prompt), generator=gen).tolist()
    args = GeneratingArgs(max_new_tokens=new_tokens, ignore_eos=True, temperature=1.0)
    pipeline.phases.activate(groups, {"actor_infer"})
    gen_s = []
    for _ in range(repeats):
        start = time.perf_counter()
        _generate_dp(groups["actor_infer"], prompts, args)
        gen_s.append(time.perf_counter() - start)
    pipeline.phases.activate(groups, {"actor_train", "reference", "critic"})
    length = max(2, int(round(tokens / max(1, samples))))
    ids = torch.randint(10, vocab - 10, (samples, length), generator=gen)
    response = torch.zeros_like(ids)
    response[:, max(1, length - max(1, int(generated / max(1, samples)))) :] = 1
    batch = Batch({"input_ids": ids, "attention_mask": torch.ones_like(ids), "response_mask": response})
    ta = cfg.actor_train.training_args
    step_samples = ta.per_device_train_batch_size * ta.gradient_accumulation_steps * cfg.actor_train.world_size
    batch = batch.select(range(samples - samples % step_samples)) if samples >= step_samples else batch
    train_s = []
    for _ in range(repeats):
        start = time.perf_counter()
        groups["actor_train"].call_dp("train_step", batch, loss_fn=SFT_LOSS, lr=0.0)
        train_s.append(time.perf_counter() - start)
    if profile:
        print(groups["actor_train"].call_rank0("profile_train_step", batch, SFT_LOSS, lr=0.0), flush=True)
    return {
        "bare_generate_s": min(gen_s),
        "bare_train_s": min(train_s),
        "bare_requests": float(requests),
        "bare_prompt_tokens": float(prompt),
        "bare_new_tokens": float(new_tokens),
        "bare_train_tokens": float(batch["attention_mask"].sum()),
    }


def _generate_dp(group, prompts: list[list[int]], args) -> None:
    """Prompts split over the inference workers, generated concurrently."""
    n = group.world_size
    parts = [prompts[r::n] for r in range(n)]
    group.call_each("generate", [(p, args) for p in parts])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-name", required=True)
    parser.add_argument("--config-path", default=None)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--skip", type=int, default=2, help="first steps left out of the medians (warm-up)")
    parser.add_argument("--tag", default="", help="suffix of the results file name (variants of a config)")
    parser.add_argument("--no-bare", action="store_true", help="skip the bare-component measurements")
    parser.add_argument("--profile", action="store_true", help="print a torch.profiler table of one bare train step")
    parser.add_argument(
        "--from-metrics",
        default=None,
        metavar="METRICS_JSONL",
        help="summarize an earlier run's metrics.jsonl instead of running (no bare components); "
        "with --gpu naming the device it ran on and --parameters the model's size",
    )
    parser.add_argument("--gpu", default=None, help="device name for --from-metrics (e.g. 'NVIDIA H100 80GB HBM3')")
    parser.add_argument("--parameters", type=int, default=None, help="model parameters for --from-metrics")
    parser.add_argument(
        "--smoke",
        nargs="?",
        const=SMOKE_DIR,
        default=None,
        metavar="DIR",
        help=f"CPU smoke run on the tiny config of the same kind; scratch and results in DIR (default {SMOKE_DIR})",
    )
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    results_dir = Path(args.smoke) / "results" if args.smoke else RESULTS

    import torch

    from roll.config.loader import apply_system_envs
    from roll.launch.command import load_checked
    from roll.launch.preflight import visible_gpus

    if args.from_metrics:  # the config (with the run's overrides) tells the model and its LoRA, nothing runs
        pipeline, rows = None, step_rows(Path(args.from_metrics))
        cfg = _config_if_any(args.config_name, args.config_path, args.overrides)
        model_path = (cfg.actor_train.model_args.model_name_or_path or cfg.pretrain) if cfg is not None else ""
        has_model = not args.parameters and bool(model_path) and (Path(model_path) / "config.json").is_file()
        device = args.gpu or "unknown"
        params = args.parameters or (count_parameters(model_path) if has_model else 0)
    else:
        config_name, overrides = args.config_name, [f"max_steps={args.steps}", "eval_steps=0", "save_steps=0"]
        overrides += args.overrides
        if args.smoke:
            config_name, overrides = smoke_run(args.config_name, args.config_path, overrides, args.smoke)
        schema, pipeline_cls = _pipeline_kind(config_name, args.config_path)
        # as a launch: the config's rules, then the preflight (its warnings name ignored keys)
        cfg = load_checked(config_name, args.config_path, overrides, schema=schema, gpus=visible_gpus())
        apply_system_envs(cfg.system_envs)
        pipeline = pipeline_cls(cfg)
        pipeline.run()
        rows = step_rows(Path(cfg.logging_dir) / "metrics.jsonl")
        device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
        model_path = cfg.actor_train.model_args.model_name_or_path or cfg.pretrain
        params, has_model = count_parameters(model_path), True
    from roll.launch.memory import lora_of

    lora = lora_of(cfg.actor_train.model_args) if cfg is not None else None
    if pipeline is not None or has_model:
        flops, formula = train_flops_per_token(model_path, lora)
    else:
        flops, formula = 6.0 * params, "6 P"
    peak = peak_flops(device)
    per_step = [{"step": r.get("step"), **summarize(r, params, peak, flops)} for r in rows]
    kept = per_step[args.skip :] or per_step
    medians = {k: statistics.median(s[k] for s in kept) for k in kept[0] if k != "step"}
    bare = {} if args.no_bare or pipeline is None else bare_components(pipeline, rows[-1], profile=args.profile)
    if bare:
        bare["pipeline_over_components"] = medians["step_s"] / (bare["bare_generate_s"] + bare["bare_train_s"])
    result = {
        "date": datetime.date.today().isoformat(),
        "gpu": device,
        "config": args.config_name,
        **({"smoke_config": config_name} if args.smoke and not args.from_metrics else {}),
        "source": Path(args.from_metrics).name if args.from_metrics else "this run",
        "overrides": args.overrides,
        "num_steps": args.steps,
        "median_of_steps": [s["step"] for s in kept],
        "parameters": params,
        "lora": {"rank": lora[0], "targets": list(lora[1])} if lora and lora[0] else None,
        "train_flops_per_token": flops,
        "mfu_formula": formula,
        **({"memory_estimate": memory_estimate(cfg)} if pipeline is not None else {}),
        "peak_bf16_flops": peak,
        **medians,
        **bare,
        "steps": per_step,  # one row per logged step
    }
    _print(per_step, medians, bare)
    name = f"{args.config_name}{'_' + args.tag if args.tag else ''}_{_slug(device)}.json"
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / name).write_text(json.dumps(result, indent=1))
    print(f"[gpu_step] results written to {results_dir / name}", flush=True)
    return 0


def smoke_run(config_name: str, config_path: str | None, overrides: list[str], work: str) -> tuple[str, list[str]]:
    """The tiny config standing in for ``config_name`` and the overrides of a CPU smoke run (``scripts/cpu_smoke.py``;
    output under ``work`` unless the overrides name it)."""
    sys.path.insert(0, str(ROOT))
    from scripts.cpu_smoke import smoke_config, stand_in

    out = Path(work) / smoke_config(config_name, config_path)
    defaults = [f"output_dir={out}", f"logging_dir={out / 'logs'}"]
    tiny, merged = stand_in(config_name, config_path, [*defaults, *overrides], work)
    print(f"[gpu_step] smoke: {tiny} on CPU in place of {config_name}", flush=True)
    return tiny, merged


def _config_if_any(config_name: str, config_path: str | None, overrides: list[str]) -> Any:
    """The config ``config_name`` with ``overrides``, or None where there is no such file (--from-metrics of a run
    whose config is not at hand: then --parameters gives the model's size)."""
    from roll.config.loader import load_config, resolve_config_dir

    if not (resolve_config_dir(config_path) / f"{config_name}.yaml").is_file():
        return None
    return load_config(config_name, config_path, overrides, schema=_pipeline_kind(config_name, config_path)[0])


def _pipeline_kind(config_name: str, config_path: str | None):
    """(schema, pipeline class): agentic when the config or one it extends has env keys, else RLVR
    (``scripts/cpu_smoke.py``'s :func:`config_kind`)."""
    sys.path.insert(0, str(ROOT))
    from scripts.cpu_smoke import config_kind

    if config_kind(config_name, config_path) != "rlvr":
        from roll.config.agentic import AgenticConfig
        from roll.pipelines.agentic_pipeline import AgenticPipeline

        return AgenticConfig, AgenticPipeline
    from roll.config.rlvr import RLVRConfig
    from roll.pipelines.rlvr_pipeline import RLVRPipeline

    return RLVRConfig, RLVRPipeline


def _print(per_step: list[dict], medians: dict, bare: dict) -> None:
    cols = [
        "step_s",
        "generate_s",
        "train_s",
        "old_log_probs_s",
        "sync_s",
        "offload_reload_s",
        "gen_tokens_per_s",
        "train_tokens_per_s",
        "mfu",
        "gen_train_fraction",
        "sync_gib_per_s",
        "logprob_mismatch",
    ]
    print("step " + " ".join(f"{c:>14}" for c in cols))
    for s in per_step:
        print(f"{s['step']:>4} " + " ".join(f"{s[c]:>14.4g}" for c in cols))
    print("med  " + " ".join(f"{medians[c]:>14.4g}" for c in cols))
    for key, value in bare.items():
        print(f"{key}: {value:.4g}")


def _slug(device: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in device.replace("NVIDIA ", "")).strip("_").lower()


if __name__ == "__main__":
    sys.exit(main())
