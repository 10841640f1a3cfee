"""A config's actor training step alone on one GPU, in variants side by side: which kernel and batching settings
raise MFU.

Each variant is a list of config overrides (``name=key=value,key=value``) applied to ``--config-name``; it runs in
its own process (kernel patches such as Liger's are process-wide) with a world-size-1 ``actor_train`` strategy
built from the config, on a synthetic rollout of the config's shape: ``--samples`` samples, prompts of
``--prompt`` tokens and responses of uniformly random length in ``--response`` (random ids; the actor loss of the
config with random advantages and old/reference log-probs). Per variant it prints the median of ``--repeats``
timed ``train_step`` calls after one warm-up call, trained tokens/s, MFU (6 x parameters x tokens / time / the
GPU's dense bf16 peak) and the peak memory, and the ratio to the first variant. Results:
``benchmarks/results/gpu_train_step_<config>_<gpu>.json``.

    python benchmarks/gpu_train_step.py --config-name rlvr_qwen05b_gpu --model /tmp/roll-models/qwen05b-rand \\
        --variant shipped= --variant liger=actor_train.model_args.use_liger_kernel=true

Exit 1 when a variant failed. CPU smoke mode (CI runs it, ``tests/scripts/test_gpu_scripts_smoke.py``):
``--smoke [DIR]`` runs the same code on the tiny config of the same kind (``scripts/cpu_smoke.py``) with a tiny model
built in DIR (default ``output/smoke``; ``--model`` optional), 8 samples of at most 16 tokens, one timed call;
the results JSON goes to DIR/results, never to ``benchmarks/results``:

    python benchmarks/gpu_train_step.py --config-name rlvr_qwen05b_gpu --smoke --variant shipped= \\
        --variant eager_head=actor_train.model_args.compile_log_probs=false
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_step import RESULTS, ROOT, SMOKE_DIR, _slug, count_parameters, peak_flops  # noqa: E402


def rollout_batch(samples: int, prompt: int, response: tuple[int, int], vocab: int, seed: int = 0):
    """Right-padded samples (``prompt`` prompt tokens, a random-length response) with everything the actor loss
    reads: advantages, old and reference log-probs."""
    import torch

    from roll.data.batch import Batch

    gen = torch.Generator().manual_seed(seed)
    lens = prompt + torch.randint(response[0], response[1] + 1, (samples,), generator=gen)
    width = int(lens.max())
    mask = (torch.arange(width)[None] < lens[:, None]).long()
    ids = torch.randint(10, vocab - 10, (samples, width), generator=gen) * mask
    resp = mask.clone()
    resp[:, :prompt] = 0
    shape = (samples, width - 1)
    old = -torch.rand(shape, generator=gen) * 5
    return Batch(
        {
            "input_ids": ids,
            "attention_mask": mask,
            "response_mask": resp,
            "advantages": torch.randn(samples, 1, generator=gen).expand(shape).contiguous(),
            "old_log_probs": old,
            "ref_log_probs": old + 0.01 * torch.randn(shape, generator=gen),
        }
    )


def run_variant(args: argparse.Namespace, overrides: list[str]) -> dict:
    """Build the variant's strategy in this process and time its train steps."""
    os.environ.update(
        {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": os.environ.get("MASTER_PORT", "29531"),
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
        }
    )
    import torch

    from roll.config.loader import load_config
    from roll.config.rlvr import RLVRConfig
    from roll.ppo.epochs import actor_loss_config
    from roll.ppo.loss_fns import PPOActorLoss
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import build_strategy

    schema = RLVRConfig if "rlvr" in args.config_name else None
    model = [f"pretrain={args.model}", f"actor_train.model_args.model_name_or_path={args.model}"]
    cfg = load_config(args.config_name, args.config_path, [*model, *overrides], schema=schema)
    worker = cfg.actor_train
    strategy = build_strategy(worker, "actor_train")
    strategy.initialize(StrategyContext(seed=0, max_grad_norm=cfg.max_grad_norm, total_steps=100))
    targs = worker.training_args
    per_step = targs.per_device_train_batch_size * targs.gradient_accumulation_steps
    samples = max(per_step, args.samples - args.samples % per_step)
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(args.model).vocab_size
    batch = rollout_batch(samples, args.prompt, tuple(args.response), vocab)
    loss_fn = PPOActorLoss(actor_loss_config(cfg))
    times, cuda = [], torch.cuda.is_available()  # (a CPU run only checks the script)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for i in range(args.repeats + 1):  # call 0 warms up (and compiles)
        sync()
        start = time.perf_counter()
        strategy.train_step(batch, loss_fn, lr=0.0, with_entropy=True)
        sync()
        times.append(time.perf_counter() - start)
        print(f"[gpu_train_step] call {i}: {times[-1]:.2f} s", flush=True)
    if args.profile_variant and args.profile_variant == args.variant_name:
        print(_profile(lambda: strategy.train_step(batch, loss_fn, lr=0.0, with_entropy=True)), flush=True)
    tokens = int(batch["attention_mask"].sum())
    step = statistics.median(times[1:])
    return {
        "overrides": overrides,
        "samples": samples,
        "tokens": tokens,
        "warmup_s": times[0],
        "step_s": step,
        "times_s": times[1:],
        "tokens_per_s": tokens / step,
        "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        "peak_reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0,
    }


def _profile(step, rows: int = 30) -> str:
    """One more call under ``torch.profiler``: the costliest operations by device time, and the share of the wall
    time the GPU was busy (kernel time / wall)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    start = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    wall = time.perf_counter() - start
    events = prof.key_averages()
    kernels = sum(e.self_device_time_total for e in events) / 1e6
    table = events.table(sort_by="self_device_time_total", row_limit=rows)
    return (
        f"{table}\n[gpu_train_step] profiled call: wall {wall:.2f} s (profiler on), kernels {kernels:.2f} s, "
        f"GPU busy {100 * kernels / wall:.0f}%"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-name", required=True)
    parser.add_argument("--config-path", default=None)
    parser.add_argument("--model", default=None, help="model directory (pretrain=); required unless --smoke")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=OVERRIDES",
        help="NAME=key=value,key=value (repeatable; NAME= alone: the config as shipped)",
    )
    parser.add_argument("--samples", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=100)
    parser.add_argument("--response", type=int, nargs=2, default=[800, 1300], help="min and max response length")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tag", default="")
    parser.add_argument(
        "--profile-variant",
        default=None,
        metavar="NAME",
        help="profile one more train step of this variant (torch.profiler table, GPU busy share)",
    )
    parser.add_argument(
        "--smoke",
        nargs="?",
        const=SMOKE_DIR,
        default=None,
        metavar="DIR",
        help=f"CPU smoke run on the tiny config of the same kind; scratch and results in DIR (default {SMOKE_DIR})",
    )
    parser.add_argument("--variant-name", default=None, help=argparse.SUPPRESS)  # internal: the child's variant
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # internal: run one variant, print JSON
    args = parser.parse_args(argv)
    if args.one is not None:
        result = run_variant(args, json.loads(args.one))
        print("[gpu_train_step] RESULT " + json.dumps(result), flush=True)
        return 0
    results_dir, args.gpu_config = RESULTS, None  # gpu_config: the GPU config a smoke run stands in for
    if args.smoke:
        results_dir = Path(args.smoke) / "results"
        smoke_setup(args)
    elif args.model is None:
        parser.error("--model is required (or --smoke)")

    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    peak, params = peak_flops(device), count_parameters(args.model)
    variants = dict(v.split("=", 1) for v in (args.variant or ["shipped="]))
    results: dict[str, dict] = {}
    for name, spec in variants.items():
        overrides = [o for o in spec.split(",") if o]
        print(f"[gpu_train_step] variant {name}: {overrides}", flush=True)
        proc = subprocess.run(
            [sys.executable, __file__, *_child_args(args), "--one", json.dumps(overrides), "--variant-name", name],
            capture_output=True,
            text=True,
        )
        if args.profile_variant == name:
            print(
                "\n".join(ln for ln in proc.stdout.splitlines() if not ln.startswith("[gpu_train_step] RESULT")),
                flush=True,
            )
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[gpu_train_step] RESULT ")]
        if proc.returncode or not lines:
            print(proc.stdout[-3000:], proc.stderr[-6000:], sep="\n", flush=True)
            results[name] = {"overrides": overrides, "error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
            continue
        row = json.loads(lines[-1].removeprefix("[gpu_train_step] RESULT "))
        row["mfu"] = 6 * params * row["tokens_per_s"] / peak if peak else float("nan")
        results[name] = row
        first = next(iter(results.values()))
        print(
            f"[gpu_train_step] {name:14s} step {row['step_s']:.2f} s  {row['tokens_per_s'] / 1e3:.1f}k tok/s  "
            f"MFU {100 * row['mfu']:.1f}%  peak reserved {row['peak_reserved_gib']:.1f} GiB  "
            f"warm-up {row['warmup_s']:.1f} s  vs first {row['step_s'] / first.get('step_s', row['step_s']):.2f}x",
            flush=True,
        )
    out = {
        "date": datetime.date.today().isoformat(),
        "gpu": device,
        "config": args.gpu_config or args.config_name,
        **({"smoke_config": args.config_name} if args.gpu_config else {}),
        "parameters": params,
        "peak_bf16_flops": peak,
        "samples": args.samples,
        "prompt": args.prompt,
        "response": args.response,
        "repeats": args.repeats,
        "variants": results,
    }
    tag = f"_{args.tag}" if args.tag else ""
    name = f"gpu_train_step_{args.gpu_config or args.config_name}{tag}_{_slug(device)}.json"
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / name).write_text(json.dumps(out, indent=1))
    print(f"[gpu_train_step] results written to {results_dir / name}", flush=True)
    failed = [name for name, row in results.items() if "error" in row]
    if failed:
        print(f"[gpu_train_step] FAIL: variant(s) {', '.join(failed)} did not run", flush=True)
    return 1 if failed else 0


def smoke_setup(args: argparse.Namespace) -> None:
    """``--smoke``: the tiny config in place of ``--config-name``, a tiny model (built once in the smoke folder)
    in place of ``--model``, a batch of seconds."""
    sys.path.insert(0, str(ROOT))
    from scripts.cpu_smoke import smoke_config, tiny_model

    args.gpu_config, args.config_name = args.config_name, smoke_config(args.config_name, args.config_path)
    if args.model is None:
        args.model = str(tiny_model(Path(args.smoke) / "models" / "tiny-train"))
    args.samples, args.prompt, args.response, args.repeats = 8, 8, [4, 8], 1
    print(f"[gpu_train_step] smoke: {args.config_name} on CPU in place of {args.gpu_config}", flush=True)


def _child_args(args: argparse.Namespace) -> list[str]:
    """The command line of the child that runs one variant (given by ``--one``)."""
    out = ["--config-name", args.config_name, "--model", args.model, "--samples", str(args.samples)]
    out += ["--prompt", str(args.prompt), "--response", *map(str, args.response), "--repeats", str(args.repeats)]
    if args.config_path:
        out += ["--config-path", args.config_path]
    if args.profile_variant:
        out += ["--profile-variant", args.profile_variant]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
