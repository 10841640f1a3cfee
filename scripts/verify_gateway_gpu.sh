#!/usr/bin/env bash
# GPU check of the gateway (issue 30, point 6), one command on the GPU machine, from the repo root:
#   bash scripts/verify_gateway_gpu.sh            # STEPS=3 DIST=ray MODEL=/tmp/roll-models/qwen05b-rand
# 1. builds the random-weight Qwen2.5-0.5B-shaped model at $MODEL unless one is there (scripts/build_qwen05b_rand.py);
# 2. runs examples/config/sokoban_agent_sglang.yaml ($STEPS steps): the OpenAI-API Sokoban harness through the gateway,
#    SGLang generating from the gateway's ids (actor_infer colocated with deepspeed_train on GPU 0);
# 3. runs the native env manager on the same config (sokoban_qwen05b_sglang, $STEPS steps) for comparison;
# 4. writes $OUT/summary.json and prints per step: the recorded-vs-recomputed log-prob mismatch (mean, max), template
#    breaks, failures, rollout time and success, for both runs.
# Each run is killed after $RUN_TIMEOUT s. Needs: torch + CUDA, sglang, deepspeed, ray, hydra, gymnasium, fastapi, uvicorn, openai importable. Logs: $OUT/*.log.
set -uo pipefail
OUT=${OUT:-/tmp/roll-verify-gateway}
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
STEPS=${STEPS:-3}
DIST=${DIST:-ray}
RUN_TIMEOUT=${RUN_TIMEOUT:-280}   # seconds per run (a hung run cannot take the whole call)
RUNS=${RUNS:-gateway native}      # which runs; GW_ARGS: extra overrides of the gateway run
WORK=${WORK:-/tmp/roll-verify-gateway-work}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

python3 -c "import fastapi, uvicorn, openai" || { echo "[verify] pip install fastapi uvicorn openai first"; exit 2; }
python3 scripts/build_qwen05b_rand.py "$MODEL" 2>&1 | tee "$OUT/build.log"

run() {  # name, config name, extra overrides
    ray stop --force >/dev/null 2>&1
    local t0=$(date +%s)
    timeout --kill-after=15 "$RUN_TIMEOUT" python3 examples/start_agentic_pipeline.py --config-name "$2" pretrain="$MODEL" max_steps="$STEPS" \
        distributed="$DIST" zero_signal_patience=0 output_dir="$WORK/$1" logging_dir="$WORK/$1/logs" "${@:3}" 2>&1 \
        | tee "$OUT/$1.log"
    local rc=${PIPESTATUS[0]}
    echo "[verify] $1: exit $rc after $(( $(date +%s) - t0 ))s"
    cp -f "$WORK/$1/logs/metrics.jsonl" "$OUT/$1_metrics.jsonl" 2>/dev/null
    return $rc
}
rc_gw=0; rc_native=0
case " $RUNS " in *" gateway "*) run gateway sokoban_agent_sglang ${GW_ARGS:-}; rc_gw=$? ;; esac
case " $RUNS " in *" native "*) run native sokoban_qwen05b_sglang; rc_native=$? ;; esac

python3 - "$OUT" "$WORK" <<'PY'
import json, sys, pathlib
out, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
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
(out / "summary.json").write_text(json.dumps(summary, indent=1))
PY
echo "[verify] gateway exit $rc_gw, native exit $rc_native; summary in $OUT/summary.json"
exit $(( rc_gw != 0 ? rc_gw : rc_native ))
