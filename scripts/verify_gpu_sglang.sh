#!/usr/bin/env bash
# GPU verification of the sglang strategy (issue 8), one command on the GPU machine, from the repo root:
#   bash scripts/verify_gpu_sglang.sh            # STEPS=4 HF_STEPS=2 DIST=ray MODEL=/tmp/roll-models/qwen05b-rand
# 1. builds a random-weight Qwen2.5-0.5B-shaped model (hidden 896, 24 layers, 14/2 heads, vocab 151936, tied
#    embeddings) with roll's hub-free tokenizer at $MODEL, unless one is there (scripts/build_qwen05b_rand.py);
# 2. runs the agentic pipeline (Sokoban) with actor_infer = sglang colocated with actor_train = deepspeed_train
#    (ZeRO-2) on GPU 0: examples/config/sokoban_qwen05b_sglang.yaml, $STEPS steps;
# 3. runs the same config with actor_infer = hf_infer for $HF_STEPS steps (0 skips a run) (same seeds: the same first-turn
#    prompts of every step), for a throughput comparison;
# 4. writes $OUT/summary.json and prints a table: rollout tokens/s, sync time, log-prob mismatch, step breakdown.
# Needs: torch + CUDA, sglang, deepspeed, ray, hydra, gymnasium importable (on the lent machines: source the
# bundle's activate.sh first, see ../shared/device/README.md). Logs: $OUT/{build,sglang,hf}.log.
# CPU smoke mode (CI runs it): SMOKE=1 STEPS=2 HF_STEPS=2 bash scripts/verify_gpu_sglang.sh: no model build, both runs
# on sokoban_tiny with hf_infer (scripts/smoke_mode.sh), then the same summary and checks; OUT and WORK default to
# output/smoke/.
set -uo pipefail
. "$(dirname "$0")/smoke_mode.sh"
OUT=${OUT:-$SCRATCH/roll-verify-sglang}
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
STEPS=${STEPS:-4}
HF_STEPS=${HF_STEPS:-2}
DIST=${DIST:-ray}
WORK=${WORK:-$SCRATCH/roll-verify-sglang-work}
mkdir -p "$OUT" "$WORK/config"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

[ "$SMOKE" = 1 ] || python3 scripts/build_qwen05b_rand.py "$MODEL" 2>&1 | tee "$OUT/build.log"

python3 - "$WORK/config" <<'PY'
import sys, yaml, pathlib
src = pathlib.Path("examples/config/sokoban_qwen05b_sglang.yaml")
cfg = yaml.safe_load(src.read_text())
cfg["exp_name"] = "sokoban_qwen05b_hf"
cfg["actor_infer"]["strategy_args"] = {"strategy_name": "hf_infer", "strategy_config": {"generate_batch_size": 128}}
pathlib.Path(sys.argv[1], "sokoban_qwen05b_hf.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
PY

run() {  # name, config dir, config name, steps
    stop_ray
    local t0=$(date +%s) args=(--config-path "$2" --config-name "$3" pretrain="$MODEL" max_steps="$4"
        distributed="$DIST" output_dir="$WORK/$1" logging_dir="$WORK/$1/logs")
    [ "$SMOKE" = 1 ] && { smoke_args "${args[@]}"; args=("${SMOKE_ARGS[@]}"); }
    python3 examples/start_agentic_pipeline.py "${args[@]}" 2>&1 | tee "$OUT/$1.log"
    local rc=${PIPESTATUS[0]}
    echo "[verify] $1: exit $rc after $(( $(date +%s) - t0 ))s"
    cp -f "$WORK/$1/logs/metrics.jsonl" "$OUT/$1_metrics.jsonl" 2>/dev/null
    return $rc
}
rc_sgl=0; rc_hf=0  # STEPS=0 or HF_STEPS=0 skips that run (the summary still reads an earlier run's metrics)
[ "$STEPS" -gt 0 ] && { run sglang "$PWD/examples/config" sokoban_qwen05b_sglang "$STEPS"; rc_sgl=$?; }
[ "$HF_STEPS" -gt 0 ] && { run hf "$WORK/config" sokoban_qwen05b_hf "$HF_STEPS"; rc_hf=$?; }

python3 - "$OUT" "$WORK" <<'PY'
import json, sys, pathlib, platform
out, work = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def steps(name):
    p = work / name / "logs" / "metrics.jsonl"
    return [json.loads(l) for l in p.read_text().splitlines()] if p.exists() else []
def tokens(m):  # generated tokens of the step's rollout batch
    return m.get("rollout/response_tokens_per_turn", 0) * m.get("rollout/mean_actions", 0) * m.get("rollout/batch_size", 0)
keys = ["time/step", "time/rollout", "time/rollout_generate", "time/rollout_env", "time/offload_reload",
        "time/old_log_probs", "time/train", "time/sync", "rollout/logprob_mismatch", "rollout/logprob_mismatch_max",
        "rollout/mean_actions", "rollout/response_tokens_per_turn", "rollout/invalid_action_rate",
        "rollout/success_rate"]
summary = {"python": platform.python_version()}
try:
    import torch; summary.update(torch=torch.__version__, gpu=torch.cuda.get_device_name(0))
    import sglang, deepspeed, ray, transformers
    summary.update(sglang=sglang.__version__, deepspeed=deepspeed.__version__, ray=ray.__version__,
                   transformers=transformers.__version__)
except Exception as exc:
    summary["version_error"] = str(exc)
for name in ("sglang", "hf"):
    rows = [m for m in steps(name) if "time/step" in m]
    summary[name] = [{"step": m.get("step"), "gen_tokens": round(tokens(m)),
                      "rollout_tok_per_s": round(tokens(m) / m["time/rollout"]) if m.get("time/rollout") else None,
                      **{k: round(m[k], 4) for k in keys if k in m}} for m in rows]
    sft = [m for m in steps(name) if "time/sft" in m]
    if sft:
        summary[f"{name}_sft"] = {k: round(v, 3) for k, v in sft[0].items() if k.startswith(("sft/", "time/"))}
sys.path.insert(0, "scripts")
from signal_check import signal_checks
ok = True
for name in ("sglang", "hf"):
    rows = [m for m in steps(name) if "time/step" in m]
    if rows:
        summary[f"{name}_checks"] = signal_checks(rows)
        for check, passed in summary[f"{name}_checks"].items():
            print(f"[verify] {name}: {'PASS' if passed else 'FAIL'} {check}")
            ok &= passed
(out / "summary.json").write_text(json.dumps(summary, indent=1))
print(json.dumps(summary, indent=1))
sys.exit(0 if ok else 1)
PY
rc_sig=$?
echo "[verify] sglang exit $rc_sgl, hf exit $rc_hf, learning-signal checks exit $rc_sig; summary in $OUT/summary.json"
exit $(( rc_sgl != 0 ? rc_sgl : (rc_hf != 0 ? rc_hf : rc_sig) ))
