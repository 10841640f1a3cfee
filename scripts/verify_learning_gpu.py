"""Does each training backend learn on the pipeline's own first RL batch? (GPU verification, issue 27.)

    python scripts/verify_learning_gpu.py --config-name sokoban_qwen05b_megatron --steps 3 \
        --backends megatron_train,deepspeed_train,fsdp2_train [key=value ...]

1. Runs the config's pipeline for ``--steps`` RL steps (warm start included) and keeps every step's metrics. Before
   the update of the first step whose advantages are not all zero, it saves that batch and the actor's weights.
2. Then, in fresh processes, each backend of ``--backends`` starts from those weights (a LoRA run's adapter merged
   into its base; the probe then trains fresh adapters on that, as the run would) and makes one PPO step on
   that batch through the pipeline's loss (:mod:`roll.ppo.learning_probe`, with an offload / reload cycle as
   between colocated phases; learning rate ``--probe-lr``, large enough for a bf16 weight to move).

Checks (exit 1 when one fails; PASS/FAIL lines): the run had a learning signal (some step with non-zero
advantages); ``actor/grad_norm`` > 0 on every step whose advantages are not all zero; each backend's probe learned
(grad norm > 0, weights moved, the same loss on the same batch went down); the backends' grad norms agree within
``--grad-rtol`` (2%) of the first backend's; update cosines are reported. Results:
``benchmarks/results/learning_<config>_<gpu>.json`` (``steps``: per-step metrics, ``probes``: per backend).

CPU smoke mode (CI runs it, ``tests/scripts/test_gpu_scripts_smoke.py``): ``--smoke [DIR]`` runs the same two
phases and checks on CPU: the pipeline run on the tiny config of the same kind (``scripts/cpu_smoke.py``), then the
probes (megatron_train through the CPU shim of ``tests/megatron/mcore_cpu.py``, gloo); scratch and results JSON in
DIR (default ``output/smoke``), never in ``benchmarks/results``:

    python scripts/verify_learning_gpu.py --config-name sokoban_qwen05b_megatron --steps 2 --smoke
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"
SMOKE_DIR = "output/smoke"  # repository-relative scratch of the CPU smoke modes (git-ignored)
STEP_KEYS = (
    "actor/grad_norm",
    "actor/pg_loss",
    "actor/lr",
    "critic/advantages_max",
    "critic/advantages_min",
    "critic/score_mean",
    "rollout/zero_signal_groups",
    "rollout/success_rate",
    "time/step",
)


def _has_signal(row: dict) -> bool:
    return row.get("critic/advantages_max", 0.0) != 0.0 or row.get("critic/advantages_min", 0.0) != 0.0


# ---------------------------------------------------------------------------- phase 1: the pipeline run
def run_pipeline(args: argparse.Namespace, work: Path) -> None:
    import torch

    from benchmarks.gpu_step import _pipeline_kind
    from roll.config.loader import apply_system_envs
    from roll.launch.command import load_checked
    from roll.launch.preflight import visible_gpus

    config_name = args.config_name
    overrides = [
        f"max_steps={args.steps}",
        "eval_steps=0",
        "save_steps=0",
        f"output_dir={work}/run",
        f"logging_dir={work}/run/logs",
        *args.overrides,
    ]
    if args.smoke:
        from scripts.cpu_smoke import stand_in

        config_name, overrides = stand_in(args.config_name, args.config_path, overrides, args.smoke)
        print(f"[learn] smoke: {config_name} on CPU in place of {args.config_name}", flush=True)
    schema, pipeline_cls = _pipeline_kind(config_name, args.config_path)
    cfg = load_checked(config_name, args.config_path, overrides, schema=schema, gpus=visible_gpus())
    apply_system_envs(cfg.system_envs)

    class Capturing(pipeline_cls):  # keeps the first batch with a learning signal, before its update
        def setup(self, run_id=None):
            super().setup(run_id)
            update = self.trainer.update

            def capture(step, batch, *args, **kwargs):  # PPOTrainer.update's own arguments pass through as given
                from roll.ppo.loss_fns import loss_mask

                if not (work / "batch.pt").exists() and (batch["advantages"] * loss_mask(batch)).abs().sum() > 0:
                    self.roles.actor_train.save_pretrained(str(work / "actor"))
                    if (work / "actor" / "adapter_config.json").is_file():  # LoRA: the probes start from the merge
                        from roll.models.lora import merge_adapter_dir

                        (work / "actor").rename(work / "adapter")
                        merge_adapter_dir(work / "adapter", work / "actor")
                    torch.save(batch.to("cpu"), work / "batch.pt")
                    (work / "captured.json").write_text(json.dumps({"step": step}))
                return update(step, batch, *args, **kwargs)

            self.trainer.update = capture

    Capturing(cfg).run()
    rows = [json.loads(line) for line in (work / "run" / "logs" / "metrics.jsonl").read_text().splitlines()]
    (work / "steps.json").write_text(json.dumps([r for r in rows if "time/step" in r]))
    (work / "worker.pkl").write_bytes(__import__("pickle").dumps((cfg.actor_train, _loss_config(cfg))))


def _loss_config(cfg):
    from roll.ppo.epochs import actor_loss_config

    return actor_loss_config(cfg)


# ---------------------------------------------------------------------------- phase 2: one step per backend
def _probe_rank(rank: int, work: str, backend: str, options: dict, lr: float) -> dict | None:
    import pickle

    import torch

    from roll.ppo.learning_probe import probe_actor
    from roll.strategies.base import StrategyContext
    from roll.strategies.registry import build_strategy

    worker, loss_cfg = pickle.loads(Path(work, "worker.pkl").read_bytes())
    worker.model_args.model_name_or_path = str(Path(work, "actor"))
    worker.strategy_args.strategy_name, worker.strategy_args.strategy_config = backend, dict(options)
    worker.training_args.learning_rate, worker.training_args.warmup_steps = lr, 0
    batch = torch.load(Path(work, "batch.pt"), weights_only=False)
    targs = worker.training_args
    targs.gradient_accumulation_steps = len(batch) // targs.per_device_train_batch_size  # the batch: one step
    s = build_strategy(worker, "actor_train", rank, int(os.environ["WORLD_SIZE"]))
    s.initialize(StrategyContext(seed=1, max_grad_norm=1.0, total_steps=1))
    result = probe_actor(s, batch, loss_cfg)
    if rank:
        return None
    return {
        "grad_norm": result.grad_norm,
        "loss_before": result.loss_before,
        "loss_after": result.loss_after,
        "update_norm": result.update_norm,
        "update": {k: v.half() for k, v in result.update.items()},
        "metrics": result.metrics,
    }


def probe_backends(args: argparse.Namespace, work: Path) -> dict[str, dict]:
    import pickle

    from tests.megatron.mcore_cpu import run_ranks

    worker, _ = pickle.loads((work / "worker.pkl").read_bytes())
    own = worker.strategy_args
    out = {}
    for backend in args.backends.split(","):
        name, _, tp = backend.partition(":")  # megatron_train:2 = tensor parallel 2
        options = dict(own.strategy_config) if own.strategy_name == name else {}
        if name == "megatron_train":
            options["tensor_model_parallel_size"] = int(tp or options.get("tensor_model_parallel_size", 1))
        if name == "deepspeed_train":
            options.setdefault("zero_stage", 2)
        world = options.get("tensor_model_parallel_size", 1) if name == "megatron_train" else 1
        shim = bool(args.smoke) and name == "megatron_train"  # megatron-core on CPU needs the tests' shim
        print(f"[learn] probing {backend} ({world} {'process' if args.smoke else 'GPU'}(s), {options})", flush=True)
        out[backend] = run_ranks(_probe_rank, world, str(work), name, options, args.probe_lr, shim=shim, timeout=900)
        out[backend] = out[backend][0]
        print(
            f"[learn] {backend}: grad_norm {out[backend]['grad_norm']:.5f} loss {out[backend]['loss_before']:.6f}"
            f" -> {out[backend]['loss_after']:.6f} update norm {out[backend]['update_norm']:.4e}",
            flush=True,
        )
    return out


def _cosine(a: dict, b: dict) -> float:
    from roll.ppo.learning_probe import ProbeResult, update_cosine

    def result(p):
        return ProbeResult(
            p["grad_norm"], p["loss_before"], p["loss_after"], {k: v.float() for k, v in p["update"].items()}
        )

    return update_cosine(result(a), result(b))


def learning_checks(rc: int, rows: list[dict], probes: dict[str, dict], grad_rtol: float) -> dict[str, bool]:
    """The named checks of the module docstring (True = passed) on the pipeline run's exit code and step rows and
    on the backends' probes (the first backend is the reference of the grad-norm agreement)."""
    checks: dict[str, bool] = {"pipeline run exit 0": rc == 0}
    signal = [r for r in rows if _has_signal(r)]
    checks["some step has non-zero advantages (else this run verified nothing)"] = bool(signal)
    checks["actor/grad_norm > 0 on every step with non-zero advantages"] = bool(signal) and all(
        r.get("actor/grad_norm", 0.0) > 0 for r in signal
    )
    first = next(iter(probes), None)
    for name, p in probes.items():
        checks[f"{name}: grad norm > 0, weights moved, loss went down"] = (
            p["grad_norm"] > 0 and p["update_norm"] > 0 and p["loss_after"] < p["loss_before"]
        )
        if name != first:
            reference = probes[first]["grad_norm"]
            rel = abs(p["grad_norm"] - reference) / reference if reference > 0 else float("inf")
            checks[f"{name} grad norm within {grad_rtol:.0%} of {first}'s ({rel:.2%})"] = rel <= grad_rtol
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-name", required=True)
    parser.add_argument("--config-path", default=None)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument(
        "--backends",
        default="megatron_train,deepspeed_train,fsdp2_train",
        help="comma-separated; megatron_train:2 = TP 2 (needs 2 GPUs)",
    )
    parser.add_argument(
        "--probe-lr",
        type=float,
        default=1e-5,
        help="small enough for a first-order step (Adam's first step moves every weight by ~lr), "
        "large enough to move bf16 weights",
    )
    parser.add_argument("--reuse", action="store_true", help="probe the batch of an earlier run in --work again")
    parser.add_argument("--grad-rtol", type=float, default=0.02)
    parser.add_argument("--work", default=None, help="scratch folder (default /tmp/roll-verify-learning; smoke: DIR)")
    parser.add_argument("--tag", default="")
    parser.add_argument(
        "--smoke",
        nargs="?",
        const=SMOKE_DIR,
        default=None,
        metavar="DIR",
        help=f"CPU smoke run on the tiny config of the same kind; scratch and results in DIR (default {SMOKE_DIR})",
    )
    parser.add_argument("--phase", choices=["all", "run"], default="all", help=argparse.SUPPRESS)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args(argv)
    default_work = Path(args.smoke) / "verify_learning" if args.smoke else Path("/tmp/roll-verify-learning")
    work = Path(args.work or default_work) / (args.config_name + (f"_{args.tag}" if args.tag else ""))
    if args.smoke:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the probes' DeepSpeed (the pipeline's workers set it)
    if args.phase == "run":
        run_pipeline(args, work)
        return 0
    import shutil

    import torch

    given = sys.argv[1:] if argv is None else list(argv)
    rc = 0
    if not args.reuse:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        rc = subprocess.run([sys.executable, __file__, "--phase", "run", *given]).returncode
        if shutil.which("ray") and not args.smoke:  # the GPU run's Ray (a smoke run is distributed=local)
            subprocess.run(["ray", "stop", "--force"], capture_output=True)
    steps = json.loads((work / "steps.json").read_text()) if (work / "steps.json").exists() else []
    rows = [{"step": r.get("step"), **{k: r[k] for k in STEP_KEYS if k in r}} for r in steps]
    probes = probe_backends(args, work) if (work / "batch.pt").exists() else {}
    checks = learning_checks(rc, rows, probes, args.grad_rtol)
    first = next(iter(probes), None)
    cosines = {f"{name} vs {first}": _cosine(p, probes[first]) for name, p in probes.items() if name != first}
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    captured = json.loads((work / "captured.json").read_text())["step"] if (work / "captured.json").exists() else None
    result = {
        "date": datetime.date.today().isoformat(),
        "gpu": device,
        "gpus": torch.cuda.device_count(),
        "config": args.config_name,
        "smoke": bool(args.smoke),
        "overrides": args.overrides,
        "probe_lr": args.probe_lr,
        "command": "python scripts/verify_learning_gpu.py " + " ".join(given),
        "steps": rows,
        "probed_batch_of_step": captured,
        "probes": {k: {m: v for m, v in p.items() if m not in ("update", "metrics")} for k, p in probes.items()},
        "update_cosines": cosines,
        "checks": checks,
        "passed": all(checks.values()),
    }
    for name, ok in checks.items():
        print(f"[learn] {'PASS' if ok else 'FAIL'} {name}", flush=True)
    for name, c in cosines.items():
        print(f"[learn] update cosine {name}: {c:.4f}", flush=True)
    slug = "".join(ch if ch.isalnum() else "_" for ch in device).strip("_")
    results = Path(args.smoke) / "results" if args.smoke else RESULTS
    path = results / f"learning_{args.config_name}{'_' + args.tag if args.tag else ''}_{slug}.json"
    results.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=1))
    print(f"[learn] results written to {path}", flush=True)
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
