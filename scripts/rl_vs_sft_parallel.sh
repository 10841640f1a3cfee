#!/usr/bin/env bash
# benchmarks/rl_vs_sft.py with its seeds side by side, each pinned to two cores of its own (taskset), for a machine
# with at least 2 x (number of seeds) cores. Logs: OUT/seed<N>.log; then the table of the finished seeds.
# FIRST_CORE=k starts the pinning at core k (two studies side by side).
#
#   bash scripts/rl_vs_sft_parallel.sh OUT "1 2 3 4 5" [rl_vs_sft.py options] [-- Hydra overrides]
set -euo pipefail
out=$1; seeds=$2; shift 2
mkdir -p "$out"
i=0; pids=()
for s in $seeds; do
  c=$(( ${FIRST_CORE:-0} + 2 * i ))
  taskset -c $c,$((c + 1)) python benchmarks/rl_vs_sft.py --seeds "$s" --out "$out" "$@" \
    > "$out/seed$s.log" 2>&1 &
  pids+=($!); i=$((i + 1))
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
python benchmarks/rl_vs_sft.py --seeds $seeds --out "$out" --summarize || true
exit $rc
