#!/usr/bin/env bash
# GPU check of the gateway (issue 30, point 6), one command on the GPU machine, from the repo root:
#   bash scripts/verify_gateway_gpu.sh            # STEPS=3 DIST=ray MODEL=/tmp/roll-models/qwen05b-rand
# 1. builds the random-weight Qwen2.5-0.5B-shaped model at $MODEL unless one is there (scripts/build_qwen05b_rand.py);
# 2. runs examples/config/sokoban_agent_sglang.yaml ($STEPS steps): the OpenAI-API Sokoban harness through the gateway,
#    SGLang generating from the gateway's ids (actor_infer colocated with deepspeed_train on GPU 0);
# 3. runs the native env manager on the same config (sokoban_qwen05b_sglang, $STEPS steps) for comparison;
# 4. writes $OUT/summary.json and prints per step: the recorded-vs-recomputed log-prob mismatch (mean, max), template
#    breaks, failures, rollout time and success, for both runs; checks per run (PASS/FAIL lines): exit 0, $STEPS steps,
#    the learning signal (scripts/signal_check.py). Exit 1 when one fails.
# Each run is killed after $RUN_TIMEOUT s. Needs: torch + CUDA, sglang, deepspeed, ray, hydra, gymnasium, fastapi,
# uvicorn, openai importable. Logs: $OUT/*.log.
# CPU smoke mode (CI runs it): SMOKE=1 STEPS=2 bash scripts/verify_gateway_gpu.sh: no model build; the gateway run on
# sokoban_agent_tiny, the native one on sokoban_tiny (hf_infer, one process; scripts/smoke_mode.sh), then the same
# summary and checks; OUT and WORK default to output/smoke/.
set -uo pipefail
. "$(dirname "$0")/smoke_mode.sh"
OUT=${OUT:-$SCRATCH/roll-verify-gateway}
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
STEPS=${STEPS:-3}
DIST=${DIST:-ray}
RUN_TIMEOUT=${RUN_TIMEOUT:-280}   # seconds per run (a hung run cannot take the whole call)
RUNS=${RUNS:-gateway native}      # which runs; GW_ARGS: extra overrides of the gateway run
WORK=${WORK:-$SCRATCH/roll-verify-gateway-work}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

python3 -c "import fastapi, uvicorn, openai" || { echo "[verify] pip install fastapi uvicorn openai first"; exit 2; }
[ "$SMOKE" = 1 ] || python3 scripts/build_qwen05b_rand.py "$MODEL" 2>&1 | tee "$OUT/build.log"

run() {  # name, config name, extra overrides
    stop_ray
    local t0=$(date +%s) args=(--config-name "$2" pretrain="$MODEL" max_steps="$STEPS" distributed="$DIST"
        zero_signal_patience=0 output_dir="$WORK/$1" logging_dir="$WORK/$1/logs" "${@:3}")
    [ "$SMOKE" = 1 ] && { smoke_args "${args[@]}"; args=("${SMOKE_ARGS[@]}"); }
    timeout --kill-after=15 "$RUN_TIMEOUT" python3 examples/start_agentic_pipeline.py "${args[@]}" 2>&1 | tee "$OUT/$1.log"
    local rc=${PIPESTATUS[0]}
    echo "$rc" > "$OUT/$1.rc"
    echo "[verify] $1: exit $rc after $(( $(date +%s) - t0 ))s"
    cp -f "$WORK/$1/logs/metrics.jsonl" "$OUT/$1_metrics.jsonl" 2>/dev/null
    return $rc
}
rc_gw=0; rc_native=0
case " $RUNS " in *" gateway "*) run gateway sokoban_agent_sglang ${GW_ARGS:-}; rc_gw=$? ;; esac
case " $RUNS " in *" native "*) run native sokoban_qwen05b_sglang; rc_native=$? ;; esac

python3 - "$OUT" "$WORK" "$STEPS" $RUNS <<'PY'
import json, sys, pathlib
out, work, steps, runs = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
sys.path.insert(0, "scripts")
from signal_check import signal_checks, step_rows
keys = ["rollout/logprob_mismatch", "rollout/logprob_mismatch_max", "env/SimpleSokoban/template_breaks",
        "rollout/env_failures", "rollout/env_timeouts", "rollout/success_rate", "rollout/mean_actions",
        "time/rollout", "time/rollout_generate", "time/rollout_env", "time/step"]
summary = {}
for name in ("gateway", "native"):
    p = work / name / "logs" / "metrics.jsonl"
    rows = [json.loads(l) for l in p.read_text().splitlines()] if p.exists() else []
    summary[name] = [{"step": m["step"], **{k: round(m[k], 6) for k in keys if k in m}} for m in rows
                     if "time/step" in m]
    for row in summary[name]:
        print(f"[verify] {name} step {row['step']}: " + ", ".join(f"{k}={v}" for k, v in row.items() if k != "step"))
ok = True
for name in runs:
    rc = (out / f"{name}.rc").read_text().strip() if (out / f"{name}.rc").exists() else "?"
    rows = step_rows(work / name / "logs" / "metrics.jsonl")
    checks = {"exit 0": rc == "0", f"{steps} steps logged": len(rows) == steps, **signal_checks(rows)}
    summary[f"{name}_checks"] = checks
    for check, passed in checks.items():
        print(f"[verify] {name}: {'PASS' if passed else 'FAIL'} {check}")
        ok &= passed
(out / "summary.json").write_text(json.dumps(summary, indent=1))
sys.exit(0 if ok else 1)
PY
rc_checks=$?
echo "[verify] gateway exit $rc_gw, native exit $rc_native, checks exit $rc_checks; summary in $OUT/summary.json"
exit $(( rc_gw != 0 ? rc_gw : (rc_native != 0 ? rc_native : rc_checks) ))
