#!/usr/bin/env bash
# Issue 29, point 5: an asynchronous agentic run on a Ray cluster of two nodes joined with `ray start`, as a user
# joins two machines (docs/async.md), here two raylets on one host, each owning one GPU (CUDA_VISIBLE_DEVICES).
#   GPU machine with 2 GPUs (bundles as in scripts/verify_async_gpu.sh; $MODEL built by its `prepare` call):
#       bash scripts/verify_two_nodes.sh
#     examples/config/sokoban_qwen05b_async.yaml with num_gpus_per_node=1: actor_train on GPU "0" of the cluster
#     (one node's GPU), SGLang on GPU "1" (the other node's), async_generation_ratio=$K, $STEPS steps after a
#     $SFT_STEPS-step warm start.
#   CPU rehearsal: DEVICE=cpu bash scripts/verify_two_nodes.sh   (sokoban_tiny; actor_train and actor_infer need 2
#     CPUs each and each node has 3, so they land on different nodes)
# Ray 2.5x starts a head with token authentication: a joining node and the driver need RAY_AUTH_MODE=token and the
# head's token (~/.ray/auth_token, the same file here; copy it to other machines).
# Checks: two alive nodes; the startup log puts actor_train and actor_infer on different nodes; the run exits 0 with
# $STEPS steps, rollout/staleness_max <= k on every step, a learning signal (scripts/signal_check.py).
# Writes $OUT/two_nodes_<device>.json (copied to benchmarks/results/ on the GPU) and $OUT/two_nodes.log.
# CPU smoke mode (CI runs it): SMOKE=1 STEPS=2 bash scripts/verify_two_nodes.sh: the CPU rehearsal on a free port,
# OUT and WORK under output/smoke/; its two nodes run as `ray start --block` processes of this script, stopped by
# their ids (never `ray stop`, which would stop every Ray instance of a shared machine).
set -uo pipefail
. "$(dirname "$0")/smoke_mode.sh"
OUT=${OUT:-$SCRATCH/roll-verify-two-nodes}
DEVICE=${DEVICE:-gpu}
[ "$SMOKE" = 1 ] && DEVICE=cpu
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
K=${K:-1}
STEPS=${STEPS:-4}
SFT_STEPS=${SFT_STEPS:-10}
RUN_TIMEOUT=${RUN_TIMEOUT:-500}
PORT=${PORT:-$([ "$SMOKE" = 1 ] && python3 -c "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])" || echo 6390)}
WORK=${WORK:-$SCRATCH/roll-verify-two-nodes-work}
mkdir -p "$OUT" "$WORK"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=1  # Linux's default: nodes may join (the tests' 0 keeps Ray to one node)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

NODE_PIDS=()
start_node() {  # log file, `ray start` arguments: a node (smoke: a `ray start --block` process of ours, waited for)
    local log=$1; shift
    if [ "$SMOKE" != 1 ]; then ray start "$@" > "$log" 2>&1; return; fi
    ray start --block "$@" > "$log" 2>&1 &
    NODE_PIDS+=($!)
    for _ in $(seq 120); do
        grep -q "Ray runtime started" "$log" && return 0
        kill -0 "${NODE_PIDS[-1]}" 2>/dev/null || return 1
        sleep 1
    done
    return 1
}
stop_nodes() {  # smoke: our nodes only (a --block process takes its node's processes down with it)
    if [ "$SMOKE" = 1 ]; then
        [ ${#NODE_PIDS[@]} -gt 0 ] && { kill "${NODE_PIDS[@]}" 2>/dev/null; wait "${NODE_PIDS[@]}" 2>/dev/null; }
    else
        ray stop --force >/dev/null 2>&1
    fi
}
stop_ray
[ -f "$HOME/.ray/auth_token" ] || ray get-auth-token --generate >/dev/null 2>&1
if [ "$DEVICE" = gpu ]; then
    NODE=(--num-gpus=1 --num-cpus=8)
    RUN=(--config-name sokoban_qwen05b_async pretrain="$MODEL" num_gpus_per_node=1 num_nodes=2
         sft_warmup.steps="$SFT_STEPS")
else
    NODE=(--num-gpus=0 --num-cpus=3)
    RUN=(--config-name sokoban_tiny sft_warmup.enabled=false rollout_batch_size=8 train_env_manager.env_groups=2
         train_env_manager.group_size=4 val_env_manager=null eval_steps=0 actor_train.num_cpus_per_worker=2
         actor_infer.num_cpus_per_worker=2 actor_train.training_args.per_device_train_batch_size=4
         actor_train.training_args.gradient_accumulation_steps=1 zero_signal_patience=0)
    [ "$SMOKE" = 1 ] && RUN+=(pretrain="$WORK/models/tiny")  # not the checkout's output/models
fi
CUDA_VISIBLE_DEVICES=0 start_node "$OUT/ray_head.log" --head --port="$PORT" --include-dashboard=false "${NODE[@]}" \
    || { cat "$OUT/ray_head.log"; stop_nodes; exit 1; }
HEAD=$(python3 -c "import ray; print(ray.util.get_node_ip_address())"):$PORT
CUDA_VISIBLE_DEVICES=1 start_node "$OUT/ray_node2.log" --address="$HEAD" "${NODE[@]}" \
    || { cat "$OUT/ray_node2.log"; stop_nodes; exit 1; }
for _ in $(seq 60); do  # the second node registers a moment after `ray start` returns
    [ "$(ray status --address="$HEAD" 2>/dev/null | grep -c '^ *1 node_')" -ge 2 ] && break
    sleep 1
done
ray status --address="$HEAD" 2>&1 | tee "$OUT/ray_status.txt" | head -20

t0=$(date +%s)
timeout --kill-after=15 "$RUN_TIMEOUT" python3 examples/start_agentic_pipeline.py --config-path "$PWD/examples/config" \
    "${RUN[@]}" ray_address="$HEAD" max_steps="$STEPS" async_generation_ratio="$K" save_steps=0 \
    exp_name=two_nodes output_dir="$WORK/run" logging_dir="$WORK/run/logs" 2>&1 | tee "$OUT/two_nodes.log"
rc=${PIPESTATUS[0]}
echo "[verify] run exit $rc after $(( $(date +%s) - t0 ))s"
cp -f "$WORK/run/logs/metrics.jsonl" "$OUT/two_nodes_metrics.jsonl" 2>/dev/null
stop_nodes

python3 - "$OUT" "$rc" "$STEPS" "$K" "$DEVICE" <<'PY'
import json, pathlib, re, shutil, statistics, sys
out, rc, steps, k, device = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
sys.path.insert(0, "scripts")
from signal_check import signal_checks, step_rows
log = (out / "two_nodes.log").read_text(errors="replace")
# not anchored at a line's start: a Ray worker's output can land on the same line first (seen under load)
where = {m.group(1): m.group(2) for m in re.finditer(r"\[roll\] (actor_train|actor_infer): [^\n]*?rank 0 on ([^\n]*)", log)}
nodes = {role: re.match(r"node (\w+)", w).group(1) for role, w in where.items()}
status = (out / "ray_status.txt").read_text(errors="replace")
rows = step_rows(out / "two_nodes_metrics.jsonl") if (out / "two_nodes_metrics.jsonl").exists() else []
checks = {"two nodes alive": len(re.findall(r"^\s*1 node_", status, re.M)) == 2,
          "actor_train and actor_infer on different nodes": len(nodes) == 2 and len(set(nodes.values())) == 2,
          "exit 0": rc == 0, f"{steps} steps logged": len(rows) == steps,
          f"rollout/staleness_max <= {k} on every step": bool(rows) and all(
              r.get("rollout/staleness_max", 1e9) <= k for r in rows)}
checks.update(signal_checks(rows))
summary = {"device": device, "k": k, "steps": steps, "placement": where, "checks": checks, "passed": all(checks.values()),
           "step_s": [round(r["time/step"], 3) for r in rows if "time/step" in r],
           "staleness_max": [r.get("rollout/staleness_max") for r in rows]}
try:
    import torch
    summary["gpu"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
except Exception as exc:
    summary["gpu_error"] = str(exc)
target = out / f"two_nodes_{device}.json"
target.write_text(json.dumps(summary, indent=1))
if device == "gpu":
    shutil.copy(target, pathlib.Path("benchmarks/results") / target.name)
print(json.dumps(summary, indent=1))
for check, ok in checks.items():
    print(f"[verify] {'PASS' if ok else 'FAIL'} {check}")
sys.exit(0 if summary["passed"] else 1)
PY
