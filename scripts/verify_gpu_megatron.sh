#!/usr/bin/env bash
# GPU verification of megatron_train (issue 17, points 6 and 7), from the repo root on the lent GPU machine.
# Calls on one warm machine (the two bundles do not fit one call; the model build needs the base bundle; see
# ../shared/device/README.md):
#   call 1, carry [".dev/sglang"]:  source .dev/sglang/activate.sh
#   call 2, carry [".dev/base"]:    source .dev/base/activate.sh >$OUT/activate.log 2>&1;
#                                   bash scripts/verify_gpu_megatron.sh prepare     # builds $MODEL (~30 s)
#   call 3, carry nothing:          source /tmp/site/activate.sh >$OUT/activate.log 2>&1;
#                                   bash scripts/verify_gpu_megatron.sh             # one GPU, under ~9 minutes
#   on 2 GPUs (nvidia-h200-x2), call 3: GPUS=2 bash scripts/verify_gpu_megatron.sh
# Runs (RUNS picks a subset; each killed after its timeout, logs in $OUT/<run>.log):
#   GPUS=1: equiv  pytest tests/megatron/test_megatron_gpu.py -k 'not tp2': megatron TP=1 learns like deepspeed ZeRO-2
#                  and fsdp2 (one PPO step after an offload/reload cycle: grad norms within 2%, update cosine,
#                  loss down; log-probs before the step; offload frees memory)                     [EQUIV_TIMEOUT]
#           equiv_fp32 the same in fp32 (update cosine >= 0.99; bf16's bound is 0.95, see the test's comment)
#           learn  scripts/verify_learning_gpu.py on sokoban_qwen05b_megatron: the pipeline's RL steps must have
#                  non-zero advantages and actor/grad_norm > 0, then megatron, deepspeed and fsdp2 each make one
#                  step on the pipeline's first RL batch: grad norms within 2% (results JSON)      [RUN_TIMEOUT x 2]
#           sokoban examples/config/sokoban_qwen05b_megatron.yaml: $STEPS steps after a $SFT_STEPS-step warm start,
#                  megatron_train TP=1 colocated with SGLang on GPU 0                              [RUN_TIMEOUT]
#           rlvr   examples/config/rlvr_qwen05b_megatron.yaml: $STEPS steps (short responses), megatron_train +
#                  megatron_infer reference + SGLang on GPU 0                                      [RUN_TIMEOUT]
#   GPUS=2: equiv2 pytest tests/megatron/test_megatron_gpu.py -k tp2 (TP=2 learns like TP=1 on two GPUs)
#           learn_tp2 the learn run on sokoban_qwen05b_megatron_tp2 (megatron TP=2 vs deepspeed, fsdp2 on one GPU)
#           sokoban_tp2 examples/config/sokoban_qwen05b_megatron_tp2.yaml (TP=2 training + TP-2 SGLang engine)
# Then $OUT/summary_megatron_<GPUS>gpu.json (per-step time breakdown, train tokens/s, MFU by 6 N tokens/s against
# the GPU's dense bf16 peak, log-prob mismatch after each sync, peak memory) and one PASS/FAIL line per check,
# including scripts/signal_check.py's on every run (a step with actor/grad_norm 0, or no step with a non-zero
# advantage, fails: such a run verified nothing).
# Exit 1 when a check fails.
# CPU smoke mode (CI runs it): SMOKE=1 STEPS=2 bash scripts/verify_gpu_megatron.sh: no model build, no nvidia-smi, the
# runs learn, sokoban and rlvr (the equiv runs are GPU-only tests; RUNS may still name them), each on the tiny config
# of the same kind (scripts/smoke_mode.sh; the pipeline's trainer is the tiny config's, the learn run's probes include
# megatron_train through the CPU shim), then the same summary and checks; OUT and WORK default to output/smoke/.
set -uo pipefail
. "$(dirname "$0")/smoke_mode.sh"
OUT=${OUT:-$SCRATCH/roll-verify-megatron}
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
GPUS=${GPUS:-1}
STEPS=${STEPS:-3}
SFT_STEPS=${SFT_STEPS:-30}  # fewer leave the random model without a valid action: all advantages 0
RUN_TIMEOUT=${RUN_TIMEOUT:-200}
EQUIV_TIMEOUT=${EQUIV_TIMEOUT:-150}
MISMATCH_MAX=${MISMATCH_MAX:-0.02}
EQUIV=$([ "$SMOKE" = 1 ] || echo "equiv equiv_fp32")
if [ "$GPUS" = 2 ]; then RUNS=${RUNS:-${EQUIV:+equiv2} learn_tp2 sokoban_tp2}; else RUNS=${RUNS:-$EQUIV learn sokoban rlvr}; fi
WORK=${WORK:-$SCRATCH/roll-verify-megatron-work}
RESULTS=$(results_dir)
SMOKE_FLAG=$(smoke_flag)
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 ROLL_GPU_MODEL="$MODEL"
T0=$(date +%s)

[ "$SMOKE" = 1 ] || python3 scripts/build_qwen05b_rand.py "$MODEL" 2>&1 | tee -a "$OUT/build.log"
[ "${1:-run}" = prepare ] && { python3 -c "import megatron.core as m; print('megatron-core', m.__version__)"; exit $?; }
[ "$SMOKE" = 1 ] || nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv | tee "$OUT/gpu.txt"

COMMON=(pretrain="$MODEL" distributed=ray)
BENCH="python3 benchmarks/gpu_step.py $SMOKE_FLAG --steps $STEPS --skip 1 --no-bare"  # step breakdown, MFU, results
declare -A CMD=(
    [equiv]="python3 -m pytest -q -s -p no:cacheprovider tests/megatron/test_megatron_gpu.py -k 'not tp2'"
    [equiv_fp32]="ROLL_GPU_DTYPE=fp32 python3 -m pytest -q -s -p no:cacheprovider tests/megatron/test_megatron_gpu.py -k 'not tp2 and not offload'"
    [equiv2]="python3 -m pytest -q -s -p no:cacheprovider tests/megatron/test_megatron_gpu.py -k tp2"
    [learn]="python3 scripts/verify_learning_gpu.py $SMOKE_FLAG --config-name sokoban_qwen05b_megatron --steps $STEPS --backends megatron_train,deepspeed_train,fsdp2_train sft_warmup.steps=$SFT_STEPS pretrain=$MODEL"
    [learn_tp2]="python3 scripts/verify_learning_gpu.py $SMOKE_FLAG --config-name sokoban_qwen05b_megatron_tp2 --steps $STEPS --backends megatron_train:2,deepspeed_train,fsdp2_train sft_warmup.steps=$SFT_STEPS pretrain=$MODEL"
    [sokoban]="$BENCH --config-name sokoban_qwen05b_megatron sft_warmup.steps=$SFT_STEPS"
    [sokoban_tp2]="$BENCH --config-name sokoban_qwen05b_megatron_tp2 sft_warmup.steps=$SFT_STEPS"
    [rlvr]="$BENCH --config-name rlvr_qwen05b_megatron response_length=128 sequence_length=640 actor_infer.generating_args.max_new_tokens=128 rollout_batch_size=16 actor_train.training_args.gradient_accumulation_steps=4 dynamic_sampling.enabled=false is_use_additional_prompts=false validation.generating_args.max_new_tokens=128"
)
declare -A RC
for name in $RUNS; do
    stop_ray
    t=$(date +%s)
    limit=$RUN_TIMEOUT; case $name in equiv*) limit=$EQUIV_TIMEOUT;; learn*) limit=$(( 2 * RUN_TIMEOUT ));; esac
    extra=""; case $name in equiv*|learn*) ;; *) extra="${COMMON[*]} exp_name=verify_$name output_dir=$WORK/$name logging_dir=$WORK/$name/logs";; esac
    timeout --kill-after=15 "$limit" bash -c "${CMD[$name]} $extra" > "$OUT/$name.log" 2>&1
    RC[$name]=$?
    echo "[verify] $name: exit ${RC[$name]} after $(( $(date +%s) - t ))s ($(( $(date +%s) - T0 ))s in all)" | tee -a "$OUT/gpu.txt"
    grep -E "^\[gpu-equiv\]|^\[learn\]|^\[roll\] weight sync|Error|error:|passed|failed" "$OUT/$name.log" | cut -c1-300 | head -24
    cp -f "$WORK/$name/logs/metrics.jsonl" "$OUT/${name}_metrics.jsonl" 2>/dev/null
    cp -f "$RESULTS"/*megatron*.json "$OUT/" 2>/dev/null  # gpu_step's and verify_learning_gpu's results
    stop_ray
done

RCS=""
for name in $RUNS; do RCS="$RCS $name=${RC[$name]}"; done
python3 scripts/summarize_gpu_megatron.py "$OUT" "$WORK" "$STEPS" "$MISMATCH_MAX" "$MODEL" "$GPUS" $RCS
rc=$?
echo "[verify] done in $(( $(date +%s) - T0 ))s, exit $rc; summary in $OUT/summary_megatron_${GPUS}gpu.json"
exit $rc
