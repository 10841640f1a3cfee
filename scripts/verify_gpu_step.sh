#!/usr/bin/env bash
# GPU verification of issue 15 (GPU step at kernel speed), on the lent GPU machine, from the repo root, after the
# bundles are active (see ../shared/device/README.md: call 1 carries .dev/sglang, call 2 .dev/base):
#   bash scripts/verify_gpu_step.sh prepare   # random-weight Qwen2.5-0.5B-shaped model + GPU unit tests (~1 min)
#   bash scripts/verify_gpu_step.sh sokoban   # benchmarks/gpu_step.py on sokoban_qwen05b_sglang, $STEPS steps
#   bash scripts/verify_gpu_step.sh long      # the same with 256-token replies (ignore_eos: not latency-bound)
#   bash scripts/verify_gpu_step.sh hf        # hf_infer colocated (CUDA IPC into hf_infer), 3 steps
#   bash scripts/verify_gpu_step.sh zero3     # ZeRO-3 trainer (CUDA IPC sync gathers per bucket), 3 steps
#   bash scripts/verify_gpu_step.sh rlvr      # rlvr_qwen05b_gpu as shipped (model path only), $RLVR_STEPS steps
#   bash scripts/verify_gpu_step.sh kernels   # benchmarks/gpu_train_step.py: rlvr_qwen05b_gpu's training step alone,
#                                             # kernel and micro-batch variants side by side
# Liger (model_args.use_liger_kernel) is installed from a wheel carried in .dev/liger, where there is one.
# Several modes in one call: bash scripts/verify_gpu_step.sh prepare sokoban long
# Logs and result JSONs land in $OUT (and benchmarks/results/); each run has its own timeout (TIMEOUT seconds).
# CPU smoke mode (CI runs it): SMOKE=1 STEPS=2 RLVR_STEPS=2 bash scripts/verify_gpu_step.sh prepare sokoban kernels:
# prepare skips its GPU-only steps, every run goes through benchmarks/gpu_step.py --smoke (the tiny config of the same
# kind, scripts/smoke_mode.sh) and gpu_train_step.py --smoke (no Liger: CUDA only), with the same learning-signal
# checks; OUT and WORK default to output/smoke/, results JSONs to $WORK/results.
set -uo pipefail
. "$(dirname "$0")/smoke_mode.sh"
OUT=${OUT:-$SCRATCH/roll-verify-step}
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
STEPS=${STEPS:-8}
RLVR_STEPS=${RLVR_STEPS:-4}
TIMEOUT=${TIMEOUT:-480}
WORK=${WORK:-$SCRATCH/roll-verify-step-work}
RESULTS=$(results_dir)
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

bench() {  # name, config, extra args...
    local name=$1 config=$2; shift 2
    stop_ray
    local t0=$(date +%s)
    # shellcheck disable=SC2046  # smoke_flag: no word or one
    timeout "$TIMEOUT" python3 benchmarks/gpu_step.py --config-name "$config" $(smoke_flag) "$@" pretrain="$MODEL" \
        output_dir="$WORK/$name" logging_dir="$WORK/$name/logs" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "[verify] $name: exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
    cp -f "$RESULTS"/${config}*.json "$OUT/" 2>/dev/null
    cp -f "$WORK/$name/logs/metrics.jsonl" "$OUT/${name}_metrics.jsonl" 2>/dev/null
    python3 scripts/signal_check.py "$WORK/$name/logs/metrics.jsonl" | tee -a "$OUT/summary.txt"  # a learning signal
    return $(( rc || PIPESTATUS[0] ))
}

rc=0
for mode in "$@"; do
    case $mode in
        prepare)
            [ "$SMOKE" = 1 ] && { echo "[verify] prepare: nothing to do in a smoke run (GPU only)"; continue; }
            ls .dev/liger/*.whl >/dev/null 2>&1 && python3 -m zipfile -e .dev/liger/*.whl /tmp/site
            python3 scripts/build_qwen05b_rand.py "$MODEL" 2>&1 | tee "$OUT/build.log"
            timeout 300 python3 -m pytest -q -p no:cacheprovider tests/strategies/test_ipc_buckets_gpu.py \
                tests/models/test_varlen_gpu.py tests/models/test_kernels_gpu.py \
                2>&1 | tee "$OUT/gpu_tests.log"; rc=$(( rc || PIPESTATUS[0] ));;
        sokoban) bench sokoban sokoban_qwen05b_sglang --steps "$STEPS" || rc=1;;
        long) bench long sokoban_qwen05b_sglang --steps "$STEPS" --tag long256 \
                actor_infer.generating_args.max_new_tokens=256 actor_infer.generating_args.ignore_eos=true \
                custom_envs.SimpleSokoban.max_tokens_per_step=256 || rc=1;;
        hf) bench hf sokoban_qwen05b_sglang --steps 3 --tag hf_infer --no-bare \
                actor_infer.strategy_args.strategy_name=hf_infer \
                "~actor_infer.strategy_args.strategy_config" "+actor_infer.strategy_args.strategy_config={generate_batch_size:128}" || rc=1;;
        zero3) bench zero3 sokoban_qwen05b_sglang --steps 3 --tag zero3 --no-bare \
                actor_train.strategy_args.strategy_config.zero_stage=3 || rc=1;;
        rlvr) bench rlvr rlvr_qwen05b_gpu --steps "$RLVR_STEPS" --skip 1 --profile || rc=1;;
        kernels)
            L=actor_train.model_args.use_liger_kernel=true M=actor_train.max_tokens_per_microbatch_in_train
            LIGER=(--variant liger=$L --variant liger_16k=$L,$M=16384 --variant liger_24k=$L,$M=24576)
            MODEL_ARG=(--model "$MODEL")
            [ "$SMOKE" = 1 ] && { LIGER=(); MODEL_ARG=(); }  # Liger's kernels are Triton (CUDA) kernels
            # shellcheck disable=SC2046,SC2086  # smoke_flag: no word or one; KERNEL_VARIANTS: several
            timeout "$TIMEOUT" python3 benchmarks/gpu_train_step.py --config-name rlvr_qwen05b_gpu "${MODEL_ARG[@]}" \
                $(smoke_flag) --variant shipped= --variant eager_head=actor_train.model_args.compile_log_probs=false \
                "${LIGER[@]}" ${KERNEL_VARIANTS:-} 2>&1 | tee "$OUT/kernels.log"; rc=$(( rc || PIPESTATUS[0] ))
            cp -f "$RESULTS"/gpu_train_step_*.json "$OUT/" 2>/dev/null;;
        *) echo "unknown mode $mode"; rc=2;;
    esac
done
exit $rc
