#!/usr/bin/env bash
# GPU verification of issue 8 on 2 GPUs (nvidia-h200-x2): the disaggregated NCCL weight sync, and tp_size 2.
# Three calls on one warm machine, from the repo root (the two bundles do not fit one call, and the model build
# needs the base bundle: see ../shared/device/README.md):
#   call 1, carry [".dev/sglang"]:  source .dev/sglang/activate.sh      (unpacks SGLang; nothing else runs yet)
#   call 2, carry [".dev/base"]:    source .dev/base/activate.sh >$OUT/activate.log 2>&1;
#                                   bash scripts/verify_gpu_sglang_2gpu.sh prepare
#     builds the random-weight Qwen2.5-0.5B-shaped model at $MODEL (scripts/build_qwen05b_rand.py), then
#     scripts/check_nccl_weight_sync.py: an SGLang engine on GPU 1 receives NCCL broadcasts of perturbed weights
#     from a WeightGroup on GPU 0, and its log-probs must then match the trainer model's ($OUT/nccl_check.json).
#     CHECK_NCCL=0 only builds the model.
#   call 3, carry nothing:          source /tmp/site/activate.sh >$OUT/activate.log 2>&1;
#                                   bash scripts/verify_gpu_sglang_2gpu.sh
#     (a) disagg: examples/config/sokoban_qwen05b_sglang_disagg.yaml: actor_train (DeepSpeed ZeRO-2) on GPU 0,
#         actor_infer (sglang) on GPU 1, weight sync by NCCL broadcast (sync/mode 1);
#     (b) tp2: examples/config/sokoban_qwen05b_sglang.yaml with actor_infer on GPUs [0, 1], num_gpus_per_worker 2,
#         tp_size 2: one TP-2 engine colocated with training on GPU 0 (released while training), weights by copy +
#         update_weights_from_tensor (sync/mode 0): with 2 GPUs, a TP-2 engine cannot also be disaggregated;
#     each $STEPS steps after a $SFT_STEPS-step warm start (the first sync after it moves the weights far from
#     the initial ones, so a sync that did not arrive shows as a large log-prob mismatch at step 1), logs in
#     $OUT/<run>.log and $OUT/<run>_metrics.jsonl; then $OUT/summary_2gpu.json. Checks: exit 0 and $STEPS steps,
#     every step synced in its mode, rollout/logprob_mismatch < $MISMATCH_MAX every step. Exit 1 when one fails.
# Each run is killed after RUN_TIMEOUT s (default 240), so call 3 stays under ~520 s (measured: 354 s on 2 H200s);
# RUNS="disagg tp2" picks runs.
# CPU smoke mode (CI runs it): SMOKE=1 bash scripts/verify_gpu_sglang_2gpu.sh prepare, then SMOKE=1 STEPS=2 bash
# scripts/verify_gpu_sglang_2gpu.sh: prepare runs check_nccl_weight_sync.py --smoke (hf_infer and gloo in place of
# SGLang and NCCL, a tiny model); the runs go on sokoban_tiny in one process (GPU placement dropped, every sync
# "direct", sync/mode 3; scripts/smoke_mode.sh), then the same summary and checks; OUT, WORK under output/smoke/.
set -uo pipefail
. "$(dirname "$0")/smoke_mode.sh"
OUT=${OUT:-$SCRATCH/roll-verify-2gpu}
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
STEPS=${STEPS:-3}
SFT_STEPS=${SFT_STEPS:-5}
RUN_TIMEOUT=${RUN_TIMEOUT:-240}
RUNS=${RUNS:-disagg tp2}
MISMATCH_MAX=${MISMATCH_MAX:-0.01}
WORK=${WORK:-$SCRATCH/roll-verify-2gpu-work}
if [ "$SMOKE" = 1 ]; then EXPECT='{"disagg": 3, "tp2": 3}'; else EXPECT='{"disagg": 1, "tp2": 0}'; fi  # sync/mode
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
T0=$(date +%s)

[ "$SMOKE" = 1 ] || python3 scripts/build_qwen05b_rand.py "$MODEL" 2>&1 | tee -a "$OUT/build.log"
if [ "${1:-run}" = prepare ]; then
    [ "${CHECK_NCCL:-1}" = 1 ] || exit 0
    CHECK_MODEL=$([ "$SMOKE" = 1 ] && echo "$WORK/models/tiny-train" || echo "$MODEL")  # smoke: built if missing
    # shellcheck disable=SC2046  # smoke_flag: no word or one
    timeout --kill-after=10 400 python3 scripts/check_nccl_weight_sync.py $(smoke_flag) "$CHECK_MODEL" "$OUT" 2>&1 \
        | tee "$OUT/nccl_check.log"
    rc=${PIPESTATUS[0]}
    echo "[verify] nccl check exit $rc after $(( $(date +%s) - T0 ))s"
    exit "$rc"
fi
[ "$SMOKE" = 1 ] || nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv \
    | tee "$OUT/gpu.txt"

COMMON=(pretrain="$MODEL" max_steps="$STEPS" sft_warmup.steps="$SFT_STEPS" distributed=ray save_steps=0)
TP2="num_gpus_per_node=2 actor_infer.device_mapping=[0,1] actor_infer.num_gpus_per_worker=2"
declare -A ARGS=(
    [disagg]="--config-name sokoban_qwen05b_sglang_disagg"
    [tp2]="--config-name sokoban_qwen05b_sglang $TP2 +actor_infer.strategy_args.strategy_config.tp_size=2"
)
declare -A RC
for name in $RUNS; do
    stop_ray
    t=$(date +%s)
    # shellcheck disable=SC2206  # ARGS holds several words
    args=(--config-path "$PWD/examples/config" ${ARGS[$name]} "${COMMON[@]}" exp_name="verify_$name"
          output_dir="$WORK/$name" logging_dir="$WORK/$name/logs")
    [ "$SMOKE" = 1 ] && { smoke_args "${args[@]}"; args=("${SMOKE_ARGS[@]}"); }
    timeout --kill-after=15 "$RUN_TIMEOUT" python3 examples/start_agentic_pipeline.py "${args[@]}" > "$OUT/$name.log" 2>&1
    RC[$name]=$?
    echo "[verify] $name: exit ${RC[$name]} after $(( $(date +%s) - t ))s ($(( $(date +%s) - T0 ))s in all)" \
        | tee -a "$OUT/gpu.txt"
    grep -E "^\[roll\] weight (sync|group)|Error|error:" "$OUT/$name.log" | cut -c1-300 | head -8
    cp -f "$WORK/$name/logs/metrics.jsonl" "$OUT/${name}_metrics.jsonl" 2>/dev/null
    stop_ray
    [ "$SMOKE" = 1 ] || nvidia-smi --query-gpu=index,memory.used --format=csv,noheader | tee -a "$OUT/gpu.txt"
done

RCS=""
for name in $RUNS; do RCS="$RCS $name=${RC[$name]}"; done
python3 - "$OUT" "$WORK" "$STEPS" "$MISMATCH_MAX" "$EXPECT" $RCS <<'PY'
import json, pathlib, platform, sys
out, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
steps, max_mismatch = int(sys.argv[3]), float(sys.argv[4])
expect_mode = {name: float(mode) for name, mode in json.loads(sys.argv[5]).items()}
rcs = dict(a.split("=") for a in sys.argv[6:])
keys = ["time/step", "time/rollout", "time/rollout_generate", "time/offload_reload", "time/old_log_probs",
        "time/train", "time/sync", "time/sync_push", "sync/buckets", "sync/gib", "sync/mode",
        "rollout/logprob_mismatch", "rollout/logprob_mismatch_max", "rollout/mean_actions",
        "rollout/response_tokens_per_turn", "rollout/success_rate", "perf/actor_train_peak_reserved_gib",
        "perf/actor_infer_peak_reserved_gib"]
summary, passed = {"python": platform.python_version()}, True
sys.path.insert(0, "scripts")
from signal_check import signal_checks
try:
    import torch, sglang, deepspeed, ray, transformers
    summary.update(torch=torch.__version__, gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(),
                   sglang=sglang.__version__, deepspeed=deepspeed.__version__, ray=ray.__version__,
                   transformers=transformers.__version__)
except Exception as exc:
    summary["version_error"] = str(exc)
for name, rc in rcs.items():
    path = work / name / "logs" / "metrics.jsonl"
    rows = [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []
    step_rows = [m for m in rows if "time/step" in m]
    sft = next((m for m in rows if "time/sft" in m), {})
    log = (out / f"{name}.log").read_text(errors="replace") if (out / f"{name}.log").exists() else ""
    mismatches = [m.get("rollout/logprob_mismatch", float("inf")) for m in step_rows]
    checks = {"exit 0": rc == "0", f"{steps} steps logged": len(step_rows) == steps,
              f"every step synced with sync/mode {expect_mode[name]:g}": bool(step_rows) and all(
                  m.get("sync/mode") == expect_mode[name] and m.get("sync/buckets", 0) >= 1 for m in step_rows),
              f"rollout/logprob_mismatch < {max_mismatch:g} every step":
                  bool(mismatches) and max(mismatches) < max_mismatch}
    checks.update(signal_checks(step_rows))
    if expect_mode[name] == 1.0:  # nccl
        checks["log: weight sync mode nccl, group up"] = ("weight sync actor_train -> actor_infer: nccl" in log
                                                          and "weight group 'roll_weights' up" in log)
    gen_tokens = [m.get("rollout/response_tokens_per_turn", 0) * m.get("rollout/mean_actions", 0)
                  * m.get("rollout/batch_size", 0) for m in step_rows]
    summary[name] = {"exit": rc, "checks": checks, "passed": all(checks.values()),
                     "sft": {k: round(v, 4) for k, v in sft.items() if k.startswith(("sft/", "time/"))},
                     "steps": [{"step": m.get("step"), "gen_tokens": round(g),
                                "rollout_tok_per_s": round(g / m["time/rollout"]) if m.get("time/rollout") else None,
                                **{k: round(m[k], 4) for k in keys if k in m}} for m, g in zip(step_rows, gen_tokens)]}
    passed &= summary[name]["passed"]
summary["passed"] = passed
(out / "summary_2gpu.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
for name in rcs:
    for check, ok in summary[name]["checks"].items():
        print(f"[verify] {name}: {'PASS' if ok else 'FAIL'} {check}")
sys.exit(0 if passed else 1)
PY
rc=$?
echo "[verify] done in $(( $(date +%s) - T0 ))s, exit $rc; summary in $OUT/summary_2gpu.json"
exit $rc
