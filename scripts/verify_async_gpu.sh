#!/usr/bin/env bash
# GPU measurement of issue 29 on 2 GPUs (nvidia-h100-x2 or nvidia-h200-x2): asynchronous rollouts against the
# synchronous loop on the same two GPUs, disaggregated (actor_train on GPU 0, actor_infer = SGLang on GPU 1), with
# the long-tail agentic config examples/config/sokoban_qwen05b_async.yaml (256-token replies, 1-10 turns, 5% slow
# env steps). From the repo root, on one warm machine (bundles as in scripts/verify_gpu_sglang_2gpu.sh):
#   call 1, carry [".dev/sglang"]:  source .dev/sglang/activate.sh
#   call 2, carry [".dev/base"]:    source .dev/base/activate.sh >$OUT/activate.log 2>&1;
#                                   CHECK_NCCL=0 bash scripts/verify_gpu_sglang_2gpu.sh prepare   (builds $MODEL)
#   call 3.., carry nothing:        source /tmp/site/activate.sh >$OUT/activate.log 2>&1;
#                                   KS="0 1 2" bash scripts/verify_async_gpu.sh
#     runs async_generation_ratio=k for each k in $KS: $STEPS steps after a $SFT_STEPS-step warm start, each killed
#     after RUN_TIMEOUT s; logs and metrics in $OUT/k<k>.log, $OUT/k<k>_metrics.jsonl (kept across calls: run one k
#     per call when a call's 10 minutes do not hold three runs, then `bash scripts/verify_async_gpu.sh summarize`).
#   PIPELINE=rlvr: the RLVR GPU config (examples/config/rlvr_qwen05b_gpu.yaml) on the same two GPUs instead:
#     actor_train and reference on GPU 0, actor_infer on GPU 1 (mem_fraction_static $RLVR_MEM), $RLVR_STEPS steps,
#     Liger off (its wheel is not in the bundles), validation off; files rlvr_k<k>.*, summary rlvr_async_<gpu>.json.
#   summarize: $OUT/async_<gpu>.json (copied to benchmarks/results/): per k, steps per hour (steps 2.., the first
#     step of an async run has no batch ready) and its ratio to k = 0 (target >= 1.5), the trainer's idle fraction
#     (time/rollout: waiting for a batch, over time/step), the engine's (k = 0: the step's time outside the rollout;
#     k >= 1: the producers' admission waits over producers x step time), staleness mean/max, dropped groups,
#     the correction's weight mean and truncated fraction, the log-prob mismatch; checks: each run exits 0 with
#     $STEPS steps, staleness_max <= k on every step, the learning signal (scripts/signal_check.py). Exit 1 on a
#     failed check.
# CPU smoke mode (CI runs it): SMOKE=1 KS="0 1" STEPS=3 bash scripts/verify_async_gpu.sh (and PIPELINE=rlvr): no model
# build, no nvidia-smi; each k runs on the tiny config of the same kind in one process (GPU placement dropped;
# scripts/smoke_mode.sh), then the same summary and checks; OUT and WORK default to output/smoke/, and the summary
# JSON stays in $OUT (not copied to benchmarks/results).
set -uo pipefail
. "$(dirname "$0")/smoke_mode.sh"
OUT=${OUT:-$SCRATCH/roll-verify-async}
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
STEPS=${STEPS:-6}
SFT_STEPS=${SFT_STEPS:-10}
RUN_TIMEOUT=${RUN_TIMEOUT:-280}
KS=${KS:-0 1 2}
PIPELINE=${PIPELINE:-agentic}
RLVR_STEPS=${RLVR_STEPS:-5}
RLVR_MEM=${RLVR_MEM:-0.7}
P=$([ "$PIPELINE" = rlvr ] && echo rlvr_ || echo "")
WORK=${WORK:-$SCRATCH/roll-verify-async-work}
RESULTS=$([ "$SMOKE" = 1 ] || echo benchmarks/results)  # where the summary is copied (a smoke run: nowhere)
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)

if [ "${1:-run}" != summarize ]; then
    if [ "$SMOKE" != 1 ]; then
        [ -f "$MODEL/config.json" ] || python3 scripts/build_qwen05b_rand.py "$MODEL" 2>&1 | tee -a "$OUT/build.log"
        nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
    fi
    for k in $KS; do
        stop_ray
        t=$(date +%s)
        if [ "$PIPELINE" = rlvr ]; then
            launcher=examples/start_rlvr_pipeline.py
            args=(--config-path "$PWD/examples/config" --config-name rlvr_qwen05b_gpu pretrain="$MODEL"
                max_steps="$RLVR_STEPS" async_generation_ratio="$k" distributed=ray num_gpus_per_node=2
                actor_train.device_mapping=[0] reference.device_mapping=[0] actor_infer.device_mapping=[1]
                actor_infer.strategy_args.strategy_config.mem_fraction_static="$RLVR_MEM"
                actor_train.model_args.use_liger_kernel=false eval_steps=0 save_steps=0 rollout_dump_steps=0
                exp_name="rlvr_async_k$k" output_dir="$WORK/${P}k$k" logging_dir="$WORK/${P}k$k/logs")
        else
            launcher=examples/start_agentic_pipeline.py
            args=(--config-path "$PWD/examples/config" --config-name sokoban_qwen05b_async pretrain="$MODEL"
                max_steps="$STEPS" sft_warmup.steps="$SFT_STEPS" async_generation_ratio="$k" distributed=ray
                exp_name="async_k$k" output_dir="$WORK/k$k" logging_dir="$WORK/k$k/logs")
        fi
        [ "$SMOKE" = 1 ] && { smoke_args "${args[@]}"; args=("${SMOKE_ARGS[@]}"); }
        timeout --kill-after=15 "$RUN_TIMEOUT" python3 "$launcher" "${args[@]}" > "$OUT/${P}k$k.log" 2>&1
        echo "$?" > "$OUT/${P}k$k.rc"
        echo "[verify] ${P}k=$k: exit $(cat "$OUT/${P}k$k.rc") after $(( $(date +%s) - t ))s ($(( $(date +%s) - T0 ))s in all)"
        grep -E "^\[roll\] weight (sync|group)|Error|error:" "$OUT/${P}k$k.log" | cut -c1-300 | head -6
        cp -f "$WORK/${P}k$k/logs/metrics.jsonl" "$OUT/${P}k${k}_metrics.jsonl" 2>/dev/null
        stop_ray
    done
fi

python3 - "$OUT" "$([ "$PIPELINE" = rlvr ] && echo "$RLVR_STEPS" || echo "$STEPS")" "$P" "$RESULTS" <<'PY'
import json, pathlib, shutil, statistics, sys
out, steps, prefix, results = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
sys.path.insert(0, "scripts")
from signal_check import signal_checks, step_rows
config = "rlvr_qwen05b_gpu" if prefix else "sokoban_qwen05b_async"
summary, passed = {"config": f"examples/config/{config}.yaml", "steps": steps}, True
try:
    import torch, sglang
    summary.update(gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(), torch=torch.__version__,
                   sglang=sglang.__version__)
except Exception as exc:
    summary["version_error"] = str(exc)
mean = lambda rows, key: statistics.fmean(r[key] for r in rows) if rows and all(key in r for r in rows) else None
runs = {}
for path in sorted(out.glob(f"{prefix}k*_metrics.jsonl")):
    k = int(path.name[len(prefix) + 1:].split("_")[0])
    rows = step_rows(path)
    timed = rows[1:] or rows  # step 1 of an async run starts with nothing buffered
    rc = (out / f"{prefix}k{k}.rc").read_text().strip() if (out / f"{prefix}k{k}.rc").exists() else "?"
    step_s, wait_s = mean(timed, "time/step"), mean(timed, "time/rollout")
    producers = 1 if prefix else 4  # RLVR: one producer; agentic: train_env_manager.num_env_managers
    if k == 0 or step_s is None:
        engine_idle = 1 - wait_s / step_s if step_s and wait_s is not None else None
    else:
        engine_idle = (mean(timed, "time/rollout_admission_wait") or 0.0) / (producers * step_s)
    checks = {"exit 0": rc == "0", f"{steps} steps logged": len(rows) == steps}
    if k:
        checks[f"rollout/staleness_max <= {k} on every step"] = bool(rows) and all(
            r.get("rollout/staleness_max", 1e9) <= k for r in rows)
    checks.update(signal_checks(rows))
    runs[k] = {"exit": rc, "checks": checks, "passed": all(checks.values()),
               "steps_per_hour": 3600 / step_s if step_s else None, "step_s": step_s,
               "trainer_idle_frac": wait_s / step_s if step_s and wait_s is not None else None,
               "engine_idle_frac": engine_idle,
               **{name: mean(rows, key) for name, key in [
                   ("staleness_mean", "rollout/staleness_mean"), ("staleness_max", "rollout/staleness_max"),
                   ("dropped_groups", "rollout/dropped_groups"), ("is_weight_mean", "actor/is_weight_mean"),
                   ("is_weight_truncated_frac", "actor/is_weight_truncated_frac"),
                   ("logprob_mismatch", "rollout/logprob_mismatch"), ("success_rate", "rollout/success_rate"),
                   ("mean_actions", "rollout/mean_actions"), ("sync_s", "time/sync")]}}
    passed &= runs[k]["passed"]
base = runs.get(0, {}).get("steps_per_hour")
for k, run in runs.items():
    run["speedup_vs_k0"] = run["steps_per_hour"] / base if base and run["steps_per_hour"] else None
summary["runs"], summary["passed"] = {f"k{k}": v for k, v in sorted(runs.items())}, passed and bool(runs)
gpu = summary.get("gpu", "unknown").replace("NVIDIA ", "").split()[0].lower()
target = out / f"{prefix}async_{gpu}.json"
target.write_text(json.dumps(summary, indent=1))
if results:
    pathlib.Path(results).mkdir(parents=True, exist_ok=True)
    shutil.copy(target, pathlib.Path(results) / target.name)
print(json.dumps(summary, indent=1))
for k, run in runs.items():
    for check, ok in run["checks"].items():
        print(f"[verify] k={k}: {'PASS' if ok else 'FAIL'} {check}")
sys.exit(0 if summary["passed"] else 1)
PY
rc=$?
echo "[verify] done in $(( $(date +%s) - T0 ))s, exit $rc"
exit $rc
