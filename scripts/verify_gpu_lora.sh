#!/usr/bin/env bash
# GPU verification of issue 39 (LoRA with adapter-only sync and the memory planner), on the lent GPU machine, from the
# repo root, after the bundles are active (../shared/device/README.md: one call carries .dev/sglang and .dev/peft,
# the next .dev/base; later calls `source /tmp/site/activate.sh`):
#   bash scripts/verify_gpu_lora.sh prepare   # peft + accelerate wheels into /tmp/site, the 0.5B and 7B random models
#   bash scripts/verify_gpu_lora.sh full05    # benchmarks/gpu_step.py, sokoban_qwen05b_sglang (full weights), $STEPS
#   bash scripts/verify_gpu_lora.sh lora05    # the same config with LoRA (sokoban_qwen05b_sglang_lora), $STEPS
#   bash scripts/verify_gpu_lora.sh lora7b    # sokoban_qwen7b_lora: a 7B-shaped agent on one GPU, $STEPS_7B steps
#   bash scripts/verify_gpu_lora.sh refuse    # the 7B config without its LoRA keys: refused before any worker
#   bash scripts/verify_gpu_lora.sh probe     # scripts/verify_learning_gpu.py on the LoRA 0.5B run (DeepSpeed, FSDP2)
# Several modes in one call: bash scripts/verify_gpu_lora.sh full05 lora05. Logs, metrics and result JSONs land in
# $OUT (and benchmarks/results/); EXTRA adds overrides to every benchmark run; each run has its own timeout (TIMEOUT
# seconds). Each step of a run must carry a learning signal (scripts/signal_check.py --every-step); a LoRA run must
# sync in adapter mode (sync/mode 4) with sync/gib at most 1/MIN_RATIO (20) of the full weights in bf16; `refuse` must
# exit 2 with the one-line memory error that proposes LoRA.
# CPU smoke mode (CI runs it): SMOKE=1 STEPS=2 bash scripts/verify_gpu_lora.sh lora05 refuse: every run goes through
# benchmarks/gpu_step.py --smoke on the tiny config of the same kind (the LoRA keys kept), `refuse` asks
# `python3 -m roll doctor --gpu-memory-gib 80` (no GPU to refuse on), OUT and WORK default to output/smoke/.
set -uo pipefail
. "$(dirname "$0")/smoke_mode.sh"
OUT=${OUT:-$SCRATCH/roll-verify-lora}
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
MODEL_7B=${MODEL_7B:-/tmp/roll-models/qwen7b-rand}
STEPS=${STEPS:-8}
STEPS_7B=${STEPS_7B:-6}
TIMEOUT=${TIMEOUT:-540}
WORK=${WORK:-$SCRATCH/roll-verify-lora-work}
RESULTS=$(results_dir)
# how many times fewer bytes an adapter sync must send than the full weights (issue 39: 20); the smoke run's tiny
# model (width 64) is about as large as its rank-32 adapter, so there only the mode and a size > 0 are checked
MIN_RATIO=${MIN_RATIO:-$([ "$SMOKE" = 1 ] && echo 0.01 || echo 20)}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LORA_KEYS=("~actor_train.model_args.lora_target" "~actor_train.model_args.lora_rank" "~actor_train.model_args.lora_alpha")

bench() {  # name, config, model, extra args...
    local name=$1 config=$2 model=$3; shift 3
    stop_ray
    rm -rf "${WORK:?}/$name"  # no metrics of an earlier run checked in place of this one's
    local t0=$(date +%s)
    # shellcheck disable=SC2046,SC2086  # smoke_flag: no word or one; EXTRA: several
    timeout "$TIMEOUT" python3 benchmarks/gpu_step.py --config-name "$config" $(smoke_flag) --tag "$name" "$@" \
        pretrain="$model" ${EXTRA:-} output_dir="$WORK/$name" logging_dir="$WORK/$name/logs" 2>&1 | tee "$OUT/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "[verify] $name: exit $rc after $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
    cp -f "$RESULTS"/"${config}"_"${name}"*.json "$OUT/" 2>/dev/null
    cp -f "$WORK/$name/logs/metrics.jsonl" "$OUT/${name}_metrics.jsonl" 2>/dev/null
    python3 scripts/signal_check.py --every-step "$WORK/$name/logs/metrics.jsonl" | tee -a "$OUT/summary.txt"
    local signal=${PIPESTATUS[0]}
    return $(( rc || signal ))
}

adapter_sync() {  # name config: every sync of the run in adapter mode, at most 1/20 of the model's bf16 bytes
    python3 - "$WORK/$1/logs/metrics.jsonl" "$1" "$RESULTS/${2}_${1}"_*.json "$MIN_RATIO" <<'PY' | tee -a "$OUT/summary.txt"
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
syncs = [r for r in rows if "sync/mode" in r]
modes = sorted({r["sync/mode"] for r in syncs})
gib = max((r.get("sync/gib", 0.0) for r in syncs), default=0.0)
full = json.load(open(sys.argv[3]))["parameters"] * 2 / 2**30  # the full weights in bf16, as a full sync sends
ok = bool(syncs) and modes == [4.0] and 0.0 < gib <= full / float(sys.argv[4])
print(f"[verify] {sys.argv[2]}: {'PASS' if ok else 'FAIL'} adapter sync: {len(syncs)} syncs, modes {modes} (4: adapter), "
      f"sync/gib max {gib:.4f} = 1/{full / max(gib, 1e-12):.0f} of the full weights' {full:.2f}")
sys.exit(0 if ok else 1)
PY
    return "${PIPESTATUS[0]}"
}

rc=0
for mode in "$@"; do
    case $mode in
        prepare)
            [ "$SMOKE" = 1 ] && { echo "[verify] prepare: nothing to do in a smoke run (GPU only)"; continue; }
            for whl in .dev/peft/*.whl; do [ -f "$whl" ] && python3 -m zipfile -e "$whl" /tmp/site; done
            python3 -c "import peft; print('[verify] peft', peft.__version__)" || rc=1
            python3 scripts/build_qwen05b_rand.py "$MODEL" 2>&1 | tee "$OUT/build.log"
            python3 scripts/build_qwen05b_rand.py "$MODEL_7B" --shape 7b 2>&1 | tee -a "$OUT/build.log";;
        full05) bench full05 sokoban_qwen05b_sglang "$MODEL" --steps "$STEPS" || rc=1;;
        lora05) { bench lora05 sokoban_qwen05b_sglang_lora "$MODEL" --steps "$STEPS" && adapter_sync lora05 sokoban_qwen05b_sglang_lora; } || rc=1;;
        lora7b) { bench lora7b sokoban_qwen7b_lora "$MODEL_7B" --steps "$STEPS_7B" --skip 1 && adapter_sync lora7b sokoban_qwen7b_lora; } \
                || rc=1;;
        refuse)
            if [ "$SMOKE" = 1 ]; then  # no GPU here: the planner's verdict for an 80 GiB one, through roll doctor
                # the planner reads the 7B shape from a config.json: write it (no weights) where this run owns it
                python3 scripts/build_qwen05b_rand.py "$WORK/qwen7b-config" --shape 7b --config-only > /dev/null
                python3 -m roll doctor --gpu-memory-gib 80 --config-name sokoban_qwen7b_lora \
                    pretrain="$WORK/qwen7b-config" "${LORA_KEYS[@]}" > "$OUT/refuse.log" 2>&1
                got=$? want=1
                grep -q "does not fit" "$OUT/refuse.log" || got="$got (no 'does not fit')"
            else
                stop_ray
                timeout 300 python3 examples/start_agentic_pipeline.py --config-name sokoban_qwen7b_lora \
                    pretrain="$MODEL_7B" "${LORA_KEYS[@]}" > "$OUT/refuse.log" 2>&1
                got=$? want=2
            fi
            cat "$OUT/refuse.log"
            if [ "$got" = "$want" ] && grep -q "LoRA (actor_train.model_args.lora_target=" "$OUT/refuse.log"; then
                echo "[verify] refuse: PASS exit $got, the full-weight 7B config refused naming LoRA" | tee -a "$OUT/summary.txt"
            else
                echo "[verify] refuse: FAIL exit $got (want $want) or no LoRA in the message" | tee -a "$OUT/summary.txt"
                rc=1
            fi;;
        probe)
            stop_ray
            # shellcheck disable=SC2046  # smoke_flag: no word or one
            timeout "$TIMEOUT" python3 scripts/verify_learning_gpu.py --config-name sokoban_qwen05b_sglang_lora \
                $(smoke_flag) --steps 3 --backends deepspeed_train,fsdp2_train pretrain="$MODEL" 2>&1 | tee "$OUT/probe.log"
            rc=$(( rc || PIPESTATUS[0] ))
            cp -f "$RESULTS"/learning_sokoban_qwen05b_sglang_lora*.json "$OUT/" 2>/dev/null;;
        *) echo "unknown mode $mode"; rc=2;;
    esac
done
exit $rc
