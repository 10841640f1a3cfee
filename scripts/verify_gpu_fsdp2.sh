#!/usr/bin/env bash
# GPU verification of fsdp2_train / fsdp2_infer (issue 21, point 3), on the lent GPU machine, from the repo root.
# Bundles and calls as in ../shared/device/README.md (the two bundles travel in two calls to one warm machine):
#   call 1, carry [".dev/sglang"]:  source .dev/sglang/activate.sh
#   call 2, carry [".dev/base"]:    source .dev/base/activate.sh > $OUT/activate.log 2>&1; bash scripts/verify_gpu_fsdp2.sh prepare
#   call 3, carry nothing:          source /tmp/site/activate.sh > $OUT/activate.log 2>&1; bash scripts/verify_gpu_fsdp2.sh sokoban
#                                   (two GPUs: ... bash scripts/verify_gpu_fsdp2.sh two)
# Modes (several in one call: bash scripts/verify_gpu_fsdp2.sh prepare sokoban):
#   prepare  builds the random-weight Qwen2.5-0.5B-shaped model at $MODEL and runs tests/strategies/test_fsdp2_gpu.py:
#            bf16 step of fsdp2_train vs deepspeed_train ZeRO-2 (log-probs, loss, grad norm, applied gradients),
#            offload/reload between phases, CPU offload during training, device weight buckets + fsdp2_infer, and on
#            two GPUs two NCCL ranks vs one (~2-3 min; measured diffs are printed into $OUT/gpu_tests.log)
#   sokoban  benchmarks/gpu_step.py on sokoban_qwen05b_sglang (one GPU, SGLang colocated, CUDA IPC weight sync),
#            $STEPS steps with actor_train on fsdp2_train (--tag fsdp2), then on deepspeed_train ZeRO-2 (--tag zero2)
#            for a same-machine comparison (RUNS="fsdp2" skips it) (~5-6 min)
#   two      two GPUs: dp2 = the same config with fsdp2_train on GPUs [0,1] (world size 2) and one SGLang engine per
#            GPU (each fed by CUDA IPC from the trainer rank on its GPU); disagg = sokoban_qwen05b_sglang_disagg with
#            fsdp2_train on GPU 0 and SGLang on GPU 1 (NCCL broadcast of fsdp2's gathered buckets) (~5-6 min)
# Every run has its own timeout (RUN_TIMEOUT s). Checks per run (PASS/FAIL lines, then $OUT/summary_fsdp2.json):
# exit 0, $STEPS steps, the actor ran on fsdp2_train, every step synced in the expected mode (2 cuda_ipc, 1 nccl),
# rollout/logprob_mismatch < $MISMATCH_MAX every step (bf16 noise is ~0.001-0.005; a sync that did not arrive
# gives ~1 after the warm start). Results JSON and metrics go to $OUT (and benchmarks/results/). Exit 1 on a FAIL.
# CPU smoke mode (CI runs it): SMOKE=1 STEPS=2 bash scripts/verify_gpu_fsdp2.sh prepare sokoban two: prepare skips its
# GPU-only steps; every run goes through benchmarks/gpu_step.py --smoke (sokoban_tiny, one process: GPU placement
# dropped, every sync "direct", sync/mode 3), then the same checks; OUT and WORK default to output/smoke/.
set -uo pipefail
. "$(dirname "$0")/smoke_mode.sh"
OUT=${OUT:-$SCRATCH/roll-verify-fsdp2}
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
STEPS=${STEPS:-6}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
MISMATCH_MAX=${MISMATCH_MAX:-0.01}
RUNS=${RUNS:-fsdp2 zero2}
WORK=${WORK:-$SCRATCH/roll-verify-fsdp2-work}
RESULTS=$(results_dir)
if [ "$SMOKE" = 1 ]; then COLOCATED=3 DISAGG=3; else COLOCATED=2 DISAGG=1; fi  # sync/mode: cuda_ipc, nccl; direct
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ROLL_GPU_MODEL="$MODEL"
T0=$(date +%s)
FSDP2="actor_train.strategy_args.strategy_name=fsdp2_train"  # zero_stage of the config is ignored with a warning
CHECKS=()

run() {  # name, expected sync mode, gpu_step arguments...
    local name=$1 mode=$2; shift 2
    stop_ray
    local t=$(date +%s)
    # shellcheck disable=SC2046  # smoke_flag: no word or one
    timeout --kill-after=15 "$RUN_TIMEOUT" python3 benchmarks/gpu_step.py $(smoke_flag) "$@" pretrain="$MODEL" \
        output_dir="$WORK/$name" logging_dir="$WORK/$name/logs" > "$OUT/$name.log" 2>&1
    local rc=$?
    echo "[verify] $name: exit $rc after $(( $(date +%s) - t ))s ($(( $(date +%s) - T0 ))s in all)" | tee -a "$OUT/summary.txt"
    grep -E "^\[roll\] (weight sync|weight group|warning)|Error|error:" "$OUT/$name.log" | cut -c1-300 | head -8
    cp -f "$WORK/$name/logs/metrics.jsonl" "$OUT/${name}_metrics.jsonl" 2>/dev/null
    stop_ray
    CHECKS+=("$name:$rc:$mode")
}

for m in "$@"; do
    case $m in
        prepare)
            [ "$SMOKE" = 1 ] && { echo "[verify] prepare: nothing to do in a smoke run (GPU only)"; continue; }
            python3 scripts/build_qwen05b_rand.py "$MODEL" 2>&1 | tee "$OUT/build.log"
            nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv | tee "$OUT/gpu.txt"
            timeout --kill-after=10 420 python3 -m pytest -q -s -p no:cacheprovider tests/strategies/test_fsdp2_gpu.py \
                > "$OUT/gpu_tests.log" 2>&1
            rc=$?
            grep -E "diff|freed|passed|failed|skipped|Error" "$OUT/gpu_tests.log" | tail -12
            if [ $rc = 0 ]; then echo "PASS gpu tests"; else echo "FAIL gpu tests (exit $rc, $OUT/gpu_tests.log)"; fi
            CHECKS+=("gpu_tests:$rc:-");;
        sokoban)
            for r in $RUNS; do
                case $r in
                    fsdp2) run fsdp2 $COLOCATED --config-name sokoban_qwen05b_sglang --steps "$STEPS" --tag fsdp2 "$FSDP2";;
                    zero2) run zero2 $COLOCATED --config-name sokoban_qwen05b_sglang --steps "$STEPS" --tag zero2;;
                esac
            done;;
        two)
            run dp2 $COLOCATED --config-name sokoban_qwen05b_sglang --steps "$STEPS" --tag fsdp2_dp2 --no-bare "$FSDP2" \
                num_gpus_per_node=2 "actor_train.device_mapping=[0,1]" "actor_infer.device_mapping=[0,1]" \
                actor_train.training_args.gradient_accumulation_steps=8
            run disagg $DISAGG --config-name sokoban_qwen05b_sglang_disagg --steps "$STEPS" --tag fsdp2 --no-bare "$FSDP2";;
        *) echo "unknown mode $m (prepare, sokoban, two)"; exit 2;;
    esac
done
cp -f "$RESULTS"/sokoban_qwen05b_sglang*_{fsdp2,zero2}*.json "$OUT/" 2>/dev/null

python3 - "$OUT" "$STEPS" "$MISMATCH_MAX" "${CHECKS[@]}" <<'PY'
import json, pathlib, sys
sys.path.insert(0, "scripts")
from signal_check import signal_checks
out, steps, max_mismatch = pathlib.Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
summary, ok = {}, True
for item in sys.argv[4:]:
    name, rc, mode = item.split(":")
    checks = {"exit 0": rc == "0"}
    if mode != "-":
        path = out / f"{name}_metrics.jsonl"
        rows = [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.is_file() else []
        rows = [r for r in rows if "time/step" in r]
        log = (out / f"{name}.log").read_text(errors="replace") if (out / f"{name}.log").is_file() else ""
        checks[f"{steps} steps"] = len(rows) == steps
        if name != "zero2":
            checks["actor on fsdp2_train"] = "[roll] actor_train: fsdp2_train" in log  # start_roles' line
        checks.update(signal_checks(rows))
        checks[f"sync mode {mode} every step"] = bool(rows) and all(r.get("sync/mode") == float(mode) for r in rows)
        mism = [r.get("rollout/logprob_mismatch", float("nan")) for r in rows]
        checks[f"logprob mismatch < {max_mismatch}"] = bool(rows) and all(m < max_mismatch for m in mism)
        summary[name] = {"mismatch": mism, "step_s": [r.get("time/step") for r in rows],
                         "train_s": [r.get("time/train") for r in rows]}
    for check, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'} {name}: {check}")
        ok &= passed
    summary.setdefault(name, {})["checks"] = checks
results = {p.stem: json.loads(p.read_text()) for p in out.glob("sokoban_qwen05b_sglang*.json")}
fs = next((r for k, r in results.items() if "_fsdp2_" in k and "_dp2_" not in k and "disagg" not in k), None)
ds = next((r for k, r in results.items() if "_zero2_" in k), None)
if fs and ds:
    for key in ("step_s", "train_s", "train_tokens_per_s", "mfu", "sync_s", "actor_train_peak_allocated_gib",
                "bare_train_s"):
        if key in fs and key in ds:
            print(f"[verify] median {key}: fsdp2 {fs[key]:.4g}  zero2 {ds[key]:.4g}  ratio {fs[key] / ds[key]:.3f}")
            summary.setdefault("fsdp2_vs_zero2", {})[key] = [fs[key], ds[key]]
(out / "summary_fsdp2.json").write_text(json.dumps(summary, indent=1))
print("[verify] all checks passed" if ok else "[verify] SOME CHECKS FAILED")
sys.exit(0 if ok else 1)
PY
