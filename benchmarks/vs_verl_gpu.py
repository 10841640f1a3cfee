"""roll vs verl's GRPO trainer on one GPU: the same RLVR work, alternating runs.

The workload (both sides the same, printed side by side before any run): a random-weight Qwen2.5-0.5B-shaped model
with roll's hub-free tokenizer (``scripts/build_qwen05b_rand.py``), the shipped GSM8K-style prompts
(``data/math_arith/train.jsonl``; written to verl's parquet layout with the same system prompt, so both sides
render the same chat), ``--prompts`` x ``--group`` samples per step, responses forced to ``--response-length``
tokens (``ignore_eos``), temperature 1, GRPO with ``--mini-batches`` optimizer steps per rollout, clip 0.2 / 0.28,
KL loss 0.001 (low_var_kl) against a reference model, token-mean loss, AdamW at a constant lr, grad clip 1.0,
bf16 compute, SGLang rollout colocated with training on GPU 0 (memory released while training), the same SGLang
engine arguments (triton attention, pytorch sampling, ``--mem-fraction`` of the GPU, CUDA graphs up to 512 decode
requests), the same training attention kernel (PyTorch's flash varlen, ``roll_varlen``: the machine has no
flash-attn package; verl's remove-padding path gets it through ``benchmarks/verl_varlen.py``) and Liger kernels.

Each side runs with its own best-known speed settings: roll ``rlvr_qwen05b_gpu`` as shipped (DeepSpeed ZeRO-2,
token-budget micro-batches, sequence packing, chunked log-probs, no activation checkpointing); verl 0.9 FSDP2,
``use_remove_padding``, ``use_dynamic_bsz`` with the same token budgets, no activation checkpointing, no offload,
its legacy ``RayPPOTrainer`` (``trainer.use_v1=false``: the v1 trainer needs the TransferQueue service).

Reported per side: step time (median interval between step ends after ``--skip`` warm-up steps, and the side's
own step timer), generation, training, old/ref log-prob and weight-sync times, trained tokens/s and MFU (6 x
parameters x trained tokens / training time / the GPU's dense bf16 peak, the same formula for both), the GPU's
peak memory use (nvidia-smi, all processes) and the trainer's peak allocation; then ``ratio`` = roll's median step
time / verl's. The ratio is refused (``ratio: null`` with the reason) when the generated or trained tokens per
step differ by more than 1%. JSON: ``benchmarks/results/vs_verl_<gpu>.json``. Runs alternate in ``--order``; where a
10-minute call cannot hold both sides, back-to-back calls on one machine run one side each and ``--rescore`` joins
their run folders (``scripts/vs_verl_gpu.sh``).

    python benchmarks/vs_verl_gpu.py --model /tmp/roll-models/qwen05b-rand --order roll,verl
    python benchmarks/vs_verl_gpu.py --smoke     # CPU: configs, data, and roll's side run as here, on a tiny model

CPU smoke mode (CI runs it, ``tests/scripts/test_gpu_scripts_smoke.py``): ``--smoke [DIR]`` (scratch in DIR, default
``output/smoke``) loads roll's GPU config with this benchmark's overrides, composes and validates verl's (where
verl is installed), then runs roll's side through the same code (:func:`run_roll`, :func:`summarize`,
:func:`compare`, the results JSON) on CPU: ``rlvr_tiny`` on a tiny model (``scripts/cpu_smoke.py``), a shrunk
workload. Its checks: the run exits 0 and logs its steps, every response is generated to full length (the work
both sides must share), and no ratio is given without verl's side. Exit 1 when one fails.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from benchmarks.gpu_step import _slug, count_parameters, peak_flops  # noqa: E402

DATA = ROOT / "data" / "math_arith" / "train.jsonl"
SYSTEM_PROMPT = "Please reason step by step, and put your final answer within \\boxed{}."  # rlvr_qwen05b_gpu's
TOLERANCE = 0.01  # the most the work per step may differ between the sides for a ratio


@dataclass
class Workload:
    """The shared settings (the results JSON's ``workload``)."""

    prompts: int = 64
    group: int = 8
    prompt_length: int = 256
    response_length: int = 512
    mini_batches: int = 4  # optimizer steps per rollout
    lr: float = 1e-6
    kl_coef: float = 0.001
    train_tokens_per_microbatch: int = 24576
    infer_tokens_per_microbatch: int = 32768
    mem_fraction: float = 0.35
    steps: int = 5
    skip: int = 2
    seed: int = 42

    @property
    def samples(self) -> int:
        return self.prompts * self.group


# ---------------------------------------------------------------------------- both sides' settings
def roll_overrides(w: Workload, model: str, run_dir: Path) -> list[str]:
    """Hydra overrides that turn ``rlvr_qwen05b_gpu`` into the shared workload (everything else as shipped)."""
    per_device = 8
    return [
        f"pretrain={model}",
        f"seed={w.seed}",
        f"max_steps={w.steps}",
        "eval_steps=0",
        "save_steps=0",
        "rollout_dump_steps=0",
        "track_with=stdout",
        f"output_dir={run_dir}",
        f"logging_dir={run_dir / 'logs'}",
        f"rollout_batch_size={w.prompts}",
        f"num_return_sequences_in_group={w.group}",
        f"prompt_length={w.prompt_length}",
        f"response_length={w.response_length}",
        f"sequence_length={w.prompt_length + w.response_length}",
        "zero_signal_patience=0",
        "dynamic_sampling.enabled=false",
        "is_use_additional_prompts=false",
        "validation.file_name=[]",
        f"validation.generating_args.max_new_tokens={w.response_length}",
        f"actor_infer.generating_args.max_new_tokens={w.response_length}",
        "actor_infer.generating_args.ignore_eos=true",
        f"actor_infer.strategy_args.strategy_config.mem_fraction_static={w.mem_fraction}",
        f"actor_train.training_args.learning_rate={w.lr}",
        "actor_train.training_args.warmup_steps=0",
        "actor_train.training_args.lr_scheduler_type=constant",
        f"actor_train.training_args.per_device_train_batch_size={per_device}",
        f"actor_train.training_args.gradient_accumulation_steps={w.samples // w.mini_batches // per_device}",
        f"actor_train.max_tokens_per_microbatch_in_train={w.train_tokens_per_microbatch}",
        f"actor_train.max_tokens_per_microbatch_in_infer={w.infer_tokens_per_microbatch}",
        f"reference.max_tokens_per_microbatch_in_infer={w.infer_tokens_per_microbatch}",
        f"kl_loss_coef={w.kl_coef}",
    ]


def verl_overrides(w: Workload, model: str, data_dir: Path, run_dir: Path) -> list[str]:
    """Overrides of verl's ``ppo_trainer`` config: the shared workload and verl's best-known speed settings."""
    a, r, sg = "actor_rollout_ref.actor", "actor_rollout_ref.rollout", "actor_rollout_ref.rollout.engine_kwargs.sglang"
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=false",
        "algorithm.norm_adv_by_std_in_grpo=true",
        f"data.train_files={data_dir / 'train.parquet'}",
        f"data.val_files={data_dir / 'train.parquet'}",
        f"data.train_batch_size={w.prompts}",
        f"data.max_prompt_length={w.prompt_length}",
        f"data.max_response_length={w.response_length}",
        "data.filter_overlong_prompts=true",
        "data.truncation=error",
        f"data.seed={w.seed}",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.model.use_liger=true",
        # without flash-attn (absent on the GPU machine) verl's log-probs fall back to a Python loop over token rows
        # (torch_functional.logprobs_from_logits_v2), ~10x slower; its fused linear+log-prob kernels avoid that
        "actor_rollout_ref.model.use_fused_kernels=true",
        "actor_rollout_ref.model.fused_kernel_options.impl_backend=torch",
        "+actor_rollout_ref.model.override_config.attn_implementation=roll_varlen",
        f"{a}.strategy=fsdp2",
        f"{a}.ppo_mini_batch_size={w.prompts // w.mini_batches}",
        f"{a}.ppo_epochs=1",
        f"{a}.use_dynamic_bsz=true",
        f"{a}.ppo_max_token_len_per_gpu={w.train_tokens_per_microbatch}",
        f"{a}.optim.lr={w.lr}",
        f"{a}.optim.weight_decay=0.0",
        f"{a}.optim.lr_warmup_steps=0",
        f"{a}.optim.clip_grad=1.0",
        f"{a}.clip_ratio_low=0.2",
        f"{a}.clip_ratio_high=0.28",
        f"{a}.loss_agg_mode=token-mean",
        f"{a}.entropy_coeff=0",
        f"{a}.use_kl_loss=true",
        f"{a}.kl_loss_coef={w.kl_coef}",
        f"{a}.kl_loss_type=low_var_kl",
        f"{a}.fsdp_config.param_offload=false",
        f"{a}.fsdp_config.optimizer_offload=false",
        "actor_rollout_ref.ref.fsdp_config.param_offload=false",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={w.infer_tokens_per_microbatch}",
        f"{r}.name=sglang",
        f"{r}.mode=async",
        f"{r}.n={w.group}",
        f"{r}.tensor_model_parallel_size=1",
        f"{r}.gpu_memory_utilization={w.mem_fraction}",
        f"{r}.ignore_eos=true",
        f"{r}.temperature=1.0",
        f"{r}.top_p=1.0",
        f"{r}.top_k=-1",
        f"{r}.max_num_seqs={w.samples}",
        f"{r}.free_cache_engine=true",
        f"{r}.log_prob_max_token_len_per_gpu={w.infer_tokens_per_microbatch}",
        f"{r}.seed={w.seed}",
        f"+{sg}.attention_backend=triton",
        f"+{sg}.sampling_backend=pytorch",
        f"+{sg}.disable_prefill_cuda_graph=true",
        f"+{sg}.cuda_graph_max_bs_decode=512",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        f"trainer.total_training_steps={w.steps}",
        "trainer.total_epochs=100",
        "trainer.critic_warmup=0",
        "trainer.logger=[console,file]",
        "trainer.project_name=vs_verl",
        "trainer.experiment_name=grpo",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        f"trainer.default_local_dir={run_dir / 'ckpt'}",
        "trainer.use_v1=false",
        "ray_kwargs.ray_init.num_cpus=12",
        "+ray_kwargs.ray_init.include_dashboard=false",
    ]


def settings_table(w: Workload) -> list[tuple[str, str, str]]:
    """``(setting, roll, verl)`` rows: the effective settings of both sides (printed and stored)."""
    mb = w.samples // w.mini_batches
    return [
        ("samples / step (prompts x group)", f"{w.prompts} x {w.group}", f"{w.prompts} x {w.group}"),
        ("generated tokens / sample", f"{w.response_length} (ignore_eos)", f"{w.response_length} (ignore_eos)"),
        ("optimizer steps / rollout", f"{w.mini_batches} ({mb} samples each)", f"{w.mini_batches} ({mb} samples each)"),
        ("trainer", "DeepSpeed ZeRO-2, bf16", "FSDP2, bf16 compute (fp32 master params)"),
        (
            "training micro-batches",
            f"token budget {w.train_tokens_per_microbatch}, packed",
            f"use_dynamic_bsz, ppo_max_token_len_per_gpu {w.train_tokens_per_microbatch}",
        ),
        (
            "log-prob micro-batches",
            f"token budget {w.infer_tokens_per_microbatch}, packed",
            f"log_prob_max_token_len_per_gpu {w.infer_tokens_per_microbatch}",
        ),
        ("padding-free", "yes (sequence packing)", "yes (use_remove_padding)"),
        ("attention kernel (training)", "roll_varlen (torch varlen flash)", "roll_varlen (torch varlen flash)"),
        ("fused kernels", "Liger (RMSNorm/SwiGLU/RoPE)", "Liger (use_liger)"),
        ("log-probs from logits", "chunked log-softmax", "use_fused_kernels (torch backend; no flash-attn CE)"),
        ("activation checkpointing", "off", "off"),
        ("offload", "none", "none"),
        ("reference model / KL loss", f"on, low_var_kl {w.kl_coef}", f"on, low_var_kl {w.kl_coef}"),
        ("old log-probs", "recomputed (several optimizer steps)", "recomputed"),
        (
            "rollout",
            f"SGLang colocated, mem {w.mem_fraction}, triton attn",
            f"SGLang (async server) colocated, mem {w.mem_fraction}, triton attn",
        ),
        ("optimizer", f"AdamW lr {w.lr} const, wd 0, clip 1.0", f"AdamW lr {w.lr} const, wd 0, clip 1.0"),
        ("reward", "roll's math rule (math-verify)", "verl's gsm8k rule"),
    ]


def print_settings(w: Workload) -> None:
    rows = settings_table(w)
    width = [max(len(r[i]) for r in rows) for i in range(3)]
    print(f"{'setting':<{width[0]}} | {'roll':<{width[1]}} | verl")
    for name, roll, verl in rows:
        print(f"{name:<{width[0]}} | {roll:<{width[1]}} | {verl}")


# ---------------------------------------------------------------------------- data
def write_verl_data(out: Path, source: Path = DATA) -> int:
    """``source`` (roll's jsonl: prompt, ground_truth) as verl's parquet (chat ``prompt`` with the system prompt,
    ``data_source`` openai/gsm8k, rule ``reward_model``); returns the row count."""
    import pandas as pd

    rows = [json.loads(line) for line in source.read_text().splitlines() if line.strip()]
    frame = pd.DataFrame(
        [
            {
                "data_source": "openai/gsm8k",
                "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": r["prompt"]}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(r["ground_truth"])},
                "extra_info": {"index": i, "split": "train"},
            }
            for i, r in enumerate(rows)
        ]
    )
    out.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(out / "train.parquet")
    return len(frame)


# ---------------------------------------------------------------------------- runs
class GpuMemory:
    """Peak GPU memory used by all processes (nvidia-smi, every 0.5 s) while the context is open."""

    def __enter__(self) -> GpuMemory:
        self.peak_gib, self._done = 0.0, threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self) -> None:
        while not self._done.is_set():
            try:
                out = subprocess.run(
                    ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", "0"],
                    capture_output=True,
                    text=True,
                    timeout=10,
                ).stdout
                self.peak_gib = max(self.peak_gib, float(out.split()[0]) / 1024)
            except (OSError, ValueError, IndexError, subprocess.SubprocessError):
                pass
            self._done.wait(0.5)

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join()


def run_logged(cmd: list[str], log: Path, env: dict, timeout: float, stamp: Path | None = None) -> tuple[int, list]:
    """Run ``cmd`` (output to ``log``) with a timeout; when ``stamp`` is given, the wall time at which each line
    of that file first appeared (verl's file logger has no timestamps). Returns (exit code, stamps)."""
    stamps: list[float] = []
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.time() + timeout
        while proc.poll() is None and time.time() < deadline:
            if stamp is not None and stamp.exists():
                lines = stamp.read_bytes().count(b"\n")
                stamps.extend([time.time()] * (lines - len(stamps)))
            time.sleep(0.2)
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
            return 124, stamps
    return proc.returncode, stamps


def stop_ray() -> None:
    """``ray stop --force`` between runs (the benchmark owns the GPU machine; never called by ``--rescore``)."""
    subprocess.run(["ray", "stop", "--force"], capture_output=True, timeout=120)


def run_roll(
    w: Workload,
    model: str,
    run_dir: Path,
    env: dict,
    timeout: float,
    config: str = "rlvr_qwen05b_gpu",
    overrides: list[str] | None = None,
) -> dict:
    """One roll run (``overrides``: :func:`roll_overrides` unless given); per-step rows from its ``metrics.jsonl``."""
    overrides = roll_overrides(w, model, run_dir) if overrides is None else overrides
    cmd = [sys.executable, str(ROOT / "examples" / "start_rlvr_pipeline.py"), "--config-name", config, *overrides]
    with GpuMemory() as mem:
        rc, _ = run_logged(cmd, run_dir / "run.log", env, timeout)
    steps = roll_steps(w, run_dir)
    (run_dir / "run.json").write_text(json.dumps({"rc": rc, "gpu_peak_gib": mem.peak_gib}))
    return {"rc": rc, "steps": steps, "gpu_peak_gib": mem.peak_gib, "log": str(run_dir / "run.log")}


def roll_steps(w: Workload, run_dir: Path) -> list[dict]:
    """Per-step rows of a roll run from its ``metrics.jsonl``."""
    path = run_dir / "logs" / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.exists() else []
    return [
        {
            "end": r["timestamp"],
            "step_s": r["time/step"],
            "generate_s": r.get("time/rollout_generate", 0.0),
            "train_s": r.get("time/train", 0.0),
            "old_log_probs_s": r.get("time/old_log_probs", 0.0),
            "ref_log_probs_s": r.get("time/ref_log_probs", 0.0),
            "sync_s": r.get("time/sync", 0.0),
            "reward_s": r.get("time/reward", 0.0),
            "trained_tokens": r.get("perf/tokens", 0.0),
            "generated_tokens": r.get("rollout/generated_tokens", 0.0),
            "trainer_peak_allocated_gib": r.get("perf/actor_train_peak_allocated_gib"),
        }
        for r in rows
        if "time/step" in r
    ]


def run_verl(w: Workload, model: str, run_dir: Path, env: dict, timeout: float) -> dict:
    """One verl run (``python -m verl.trainer.main_ppo``); per-step rows from its file logger."""
    data_dir = run_dir / "data"
    write_verl_data(data_dir)
    metrics = run_dir / "metrics.jsonl"
    env = {**env, "VERL_FILE_LOGGER_PATH": str(metrics), "VERL_USE_EXTERNAL_MODULES": "benchmarks.verl_varlen"}
    extra = os.environ.get("VERL_EXTRA_OVERRIDES", "").split()  # e.g. a setting tried on the GPU
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *verl_overrides(w, model, data_dir, run_dir), *extra]
    with GpuMemory() as mem:
        rc, stamps = run_logged(cmd, run_dir / "run.log", env, timeout, stamp=metrics)
    (run_dir / "run.json").write_text(json.dumps({"rc": rc, "gpu_peak_gib": mem.peak_gib, "stamps": stamps}))
    return {
        "rc": rc,
        "steps": verl_steps(w, run_dir, stamps),
        "gpu_peak_gib": mem.peak_gib,
        "log": str(run_dir / "run.log"),
    }


def verl_steps(w: Workload, run_dir: Path, stamps: list[float]) -> list[dict]:
    """Per-step rows of a verl run from its file logger, each ended at the wall time its line appeared."""
    metrics = run_dir / "metrics.jsonl"
    rows = [json.loads(x)["data"] for x in metrics.read_text().splitlines() if x.strip()] if metrics.exists() else []
    steps = []
    for r, end in zip(rows, stamps):
        if "timing_s/step" not in r:
            continue
        samples = w.samples
        steps.append(
            {
                "end": end,
                "step_s": r["timing_s/step"],
                "generate_s": r.get("timing_s/gen", 0.0),
                "train_s": r.get("timing_s/update_actor", 0.0),
                "old_log_probs_s": r.get("timing_s/old_log_prob", 0.0),
                "ref_log_probs_s": r.get("timing_s/ref", 0.0),
                "sync_s": r.get("timing_s/update_weights", 0.0),
                "reward_s": r.get("timing_s/reward", 0.0),
                "trained_tokens": r.get("perf/total_num_tokens", 0.0),
                "generated_tokens": r.get("response_length/mean", 0.0) * samples,
                "trainer_peak_allocated_gib": r.get("perf/max_memory_allocated_gb"),
                "verl_mfu_actor": r.get("perf/mfu/actor"),
            }
        )
    return steps


# ---------------------------------------------------------------------------- summary
def summarize(run: dict, skip: int, params: int, peak: float | None) -> dict:
    """Medians over the steps after ``skip``: step time (interval between step ends, and the side's own timer),
    phases, trained tokens/s and MFU (same formula for both sides), memory."""
    steps = run["steps"]
    kept = steps[skip:]
    if not kept:
        return {"error": f"{len(steps)} steps logged (need > {skip}); see {run['log']}", "rc": run["rc"]}
    out = {
        "steps_logged": len(steps),
        "steps_in_median": len(kept),
        "rc": run["rc"],
        "step_s": statistics.median(b["end"] - a["end"] for a, b in zip(steps[skip - 1 :], steps[skip:]))
        if skip >= 1
        else statistics.median(s["step_s"] for s in kept),
    }
    for key in (
        "step_s",
        "generate_s",
        "train_s",
        "old_log_probs_s",
        "ref_log_probs_s",
        "sync_s",
        "reward_s",
        "trained_tokens",
        "generated_tokens",
    ):
        out[key if key != "step_s" else "own_step_timer_s"] = statistics.median(s[key] for s in kept)
    out["train_tokens_per_s"] = out["trained_tokens"] / max(out["train_s"], 1e-9)
    out["mfu"] = 6 * params * out["train_tokens_per_s"] / peak if peak else None
    out["gen_tokens_per_s"] = out["generated_tokens"] / max(out["generate_s"], 1e-9)
    allocated = [s["trainer_peak_allocated_gib"] for s in steps if s.get("trainer_peak_allocated_gib") is not None]
    out["trainer_peak_allocated_gib"] = max(allocated) if allocated else None
    out["gpu_peak_used_gib"] = run["gpu_peak_gib"]
    if any("verl_mfu_actor" in s for s in kept):
        out["verl_own_mfu_actor"] = statistics.median(s.get("verl_mfu_actor") or 0.0 for s in kept)
    return out


def compare(roll: dict, verl: dict, tolerance: float = TOLERANCE) -> tuple[float | None, str]:
    """``(roll step time / verl step time, why)``; the ratio is None when a side has no medians or the generated
    or trained tokens per step differ by more than ``tolerance`` (relative to verl's)."""
    for name, side in (("roll", roll), ("verl", verl)):
        if "step_s" not in side:
            return None, f"{name}: {side.get('error', 'no steps')}"
    for key in ("generated_tokens", "trained_tokens"):
        a, b = roll[key], verl[key]
        if b <= 0 or abs(a - b) / b > tolerance:
            return None, f"work differs: {key} per step roll {a:.0f} vs verl {b:.0f} (more than {tolerance:.0%})"
    return roll["step_s"] / verl["step_s"], "same work (generated and trained tokens per step within 1%)"


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("torch", "transformers", "sglang", "ray", "deepspeed", "verl", "liger-kernel", "tensordict"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "missing"
    return out


# ---------------------------------------------------------------------------- smoke (CPU)
def smoke(w: Workload, work: Path) -> dict:
    """Without a GPU: roll's config loads with the overrides, verl's Hydra config composes with its overrides
    (every key exists) and passes verl's ``validate_config``, and verl's dataset reads the written parquet with the
    same prompts as roll's jsonl. Returns what it checked."""
    import verl
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from verl.utils.config import validate_config

    from roll.config.loader import load_config
    from roll.config.rlvr import RLVRConfig

    model, run_dir = str(work / "model"), work / "run"
    cfg = load_config("rlvr_qwen05b_gpu", overrides=roll_overrides(w, model, run_dir), schema=RLVRConfig)
    assert cfg.actor_infer.generating_args.ignore_eos and cfg.rollout_batch_size == w.prompts
    rows = write_verl_data(work / "data")
    GlobalHydra.instance().clear()
    with initialize_config_dir(str(Path(verl.__file__).parent / "trainer" / "config"), version_base=None):
        vcfg = compose("ppo_trainer", overrides=verl_overrides(w, model, work / "data", run_dir))
    validate_config(vcfg, use_reference_policy=True, use_critic=False)
    import pandas as pd

    frame = pd.read_parquet(work / "data" / "train.parquet")
    source = [json.loads(x) for x in DATA.read_text().splitlines() if x.strip()]
    assert [m[1]["content"] for m in frame["prompt"]] == [r["prompt"] for r in source]
    assert all(m[0]["content"] == SYSTEM_PROMPT == cfg.system_prompt for m in frame["prompt"])
    return {
        "roll_config": "loaded",
        "verl_config": "composed and validated",
        "verl_rows": rows,
        "verl_rollout_n": int(vcfg.actor_rollout_ref.rollout.n),
        "verl_version": verl.__version__,
    }


#: The workload of ``--smoke``: 4 prompts x 4 answers of 8 tokens, 2 optimizer steps per rollout, 3 steps.
SMOKE_WORKLOAD = Workload(prompts=4, group=4, prompt_length=64, response_length=8, mini_batches=2, steps=3, skip=1)


def smoke_checks(w: Workload, run: dict, ratio: float | None, why: str) -> dict[str, bool]:
    """The smoke run's checks (True = passed) on roll's run and on the comparison against no verl side."""
    full = w.samples * w.response_length
    return {
        "roll run exit 0": run["rc"] == 0,
        f"roll logged {w.steps} steps": len(run["steps"]) == w.steps,
        f"every step generates {w.samples} x {w.response_length} tokens (ignore_eos: the shared work)": bool(
            run["steps"]
        )
        and all(s["generated_tokens"] == full for s in run["steps"]),
        "no ratio without verl's side": ratio is None and why.startswith("verl:"),
    }


def cpu_smoke(work: Path, out: Path | None, timeout: float) -> int:
    """``--smoke``: what runs without a GPU (the module docstring says what); returns the exit code."""
    sys.path.insert(0, str(ROOT))
    from roll.config.loader import load_config
    from roll.config.rlvr import RLVRConfig
    from scripts.cpu_smoke import merge, smoke_overrides

    w, work = SMOKE_WORKLOAD, work.resolve()
    run_dir = work / "0_roll"
    run_dir.mkdir(parents=True, exist_ok=True)
    gpu_cfg = load_config("rlvr_qwen05b_gpu", overrides=roll_overrides(w, "model", run_dir), schema=RLVRConfig)
    report: dict = {"roll_gpu_config": "loaded", "rollout_batch_size": gpu_cfg.rollout_batch_size}
    try:
        report.update(smoke(w, work / "verl"))
    except ImportError as exc:  # verl is on the GPU machine's bundle only
        report["verl_config"] = f"not checked: {exc}"
    print(json.dumps(report, indent=1), flush=True)
    overrides = merge(roll_overrides(w, "model", run_dir), smoke_overrides("rlvr_tiny", work))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = run_roll(w, "", run_dir, env, timeout, config="rlvr_tiny", overrides=overrides)
    roll = summarize(run, w.skip, count_parameters(str(work / "models" / "tiny-math")), None)
    checks = smoke_checks(w, run, *compare(roll, {}))
    result = {"smoke": True, "workload": asdict(w), **report, "roll": roll, "checks": checks}
    out = out or work / "results" / "vs_verl_smoke.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    for name, ok in checks.items():
        print(f"[vs_verl] {'PASS' if ok else 'FAIL'} {name}", flush=True)
    print(f"[vs_verl] smoke results written to {out}", flush=True)
    return 0 if all(checks.values()) else 1


# ---------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="/tmp/roll-models/qwen05b-rand")
    p.add_argument(
        "--work", type=Path, default=None, help="run folders (default /tmp/roll-vs-verl; smoke: DIR/vs_verl)"
    )
    p.add_argument("--order", default="roll,verl", help="sides in run order, alternating (e.g. roll,verl,roll,verl)")
    p.add_argument("--timeout", type=float, default=420, help="seconds per run")
    p.add_argument(
        "--out", type=Path, default=None, help="results JSON (default benchmarks/results/vs_verl_<gpu>.json)"
    )
    p.add_argument(
        "--smoke",
        nargs="?",
        const="output/smoke",
        default=None,
        metavar="DIR",
        help="CPU smoke run (see the module docstring); scratch in DIR (default output/smoke)",
    )
    p.add_argument("--gpu", default="unknown GPU", help="device name for --rescore on a machine without the GPU")
    p.add_argument(
        "--rescore",
        action="store_true",
        help="no runs: summarize the run folders already in --work (<i>_roll, <i>_verl) into the results JSON",
    )
    for field, value in asdict(Workload()).items():
        p.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    args = p.parse_args(argv)
    w = Workload(**{f: getattr(args, f) for f in asdict(Workload())})
    if args.smoke:
        print_settings(SMOKE_WORKLOAD)
        return cpu_smoke(args.work or Path(args.smoke) / "vs_verl", args.out, args.timeout)
    args.work = args.work or Path("/tmp/roll-vs-verl")
    print_settings(w)
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else args.gpu
    params, peak = count_parameters(args.model), peak_flops(gpu)
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "NCCL_NVLS_ENABLE": "0",
        "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
        "NVSHMEM_DISABLE_NVLS": "1",
    }
    runs: dict[str, list[dict]] = {"roll": [], "verl": []}
    sides = (
        [(d, d.name.split("_", 1)[1]) for d in sorted(args.work.glob("*_*")) if d.name.split("_", 1)[1] in runs]
        if args.rescore
        else [(args.work / f"{i}_{s}", s) for i, s in enumerate(args.order.split(","))]
    )
    for run_dir, side in sides:
        run_dir.mkdir(parents=True, exist_ok=True)
        start = time.time()
        if args.rescore:
            saved = json.loads((run_dir / "run.json").read_text()) if (run_dir / "run.json").exists() else {}
            steps = roll_steps(w, run_dir) if side == "roll" else verl_steps(w, run_dir, saved.get("stamps", []))
            run = {
                "rc": saved.get("rc"),
                "steps": steps,
                "gpu_peak_gib": saved.get("gpu_peak_gib"),
                "log": str(run_dir / "run.log"),
            }
        else:
            stop_ray()
            run = (run_roll if side == "roll" else run_verl)(w, args.model, run_dir, env, args.timeout)
        summary = summarize(run, w.skip, params, peak)
        summary["wall_s"], summary["run"] = time.time() - start, run_dir.name
        runs[side].append(summary)
        print(f"[vs_verl] {run_dir.name}: exit {run['rc']}, {len(run['steps'])} steps, {summary}", flush=True)
    if not args.rescore:
        stop_ray()
    best = {
        s: min((r for r in rs if "step_s" in r), key=lambda r: r["step_s"], default=rs[-1] if rs else {})
        for s, rs in runs.items()
    }
    ratio, why = compare(best["roll"], best["verl"])
    result = {
        "date": datetime.date.today().isoformat(),
        "gpu": gpu,
        "ratio": ratio,
        "ratio_note": why,
        "target": "roll step <= 0.8 x verl's",
        "workload": asdict(w),
        "parameters": params,
        "peak_bf16_flops": peak,
        "versions": versions(),
        "order": [d.name for d, _ in sides],
        "settings": [{"setting": a, "roll": b, "verl": c} for a, b, c in settings_table(w)],
        "roll": best["roll"],
        "verl": best["verl"],
        "runs": runs,
    }
    out = args.out or ROOT / "benchmarks" / "results" / f"vs_verl_{_slug(gpu)}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"[vs_verl] ratio roll/verl = {ratio if ratio is None else round(ratio, 3)} ({why}); {out}", flush=True)
    return 0 if ratio is not None else 1


if __name__ == "__main__":
    sys.exit(main())
