#!/usr/bin/env bash
# roll vs verl on the lent GPU machine (benchmarks/vs_verl_gpu.py), from the repo root. The verl bundle
# (scripts/build_verl_bundle.sh, 4 MB in .dev/verl) travels with call 1 beside .dev/sglang; prepare needs the base
# bundle (Ray), so it runs in call 2 (see ../shared/device/README.md for the bundles):
#   call 1, carry [.dev/sglang, .dev/verl]:  source .dev/sglang/activate.sh && bash scripts/vs_verl_gpu.sh unpack
#   call 2, carry [.dev/base]:               source .dev/base/activate.sh && bash scripts/vs_verl_gpu.sh prepare bench
#   later calls on the same warm machine:    source /tmp/site/activate.sh && bash scripts/vs_verl_gpu.sh bench
# Modes (several in one call run in order):
#   unpack    verl bundle and its wheels (liger-kernel, python-multipart) into /tmp/site
#   prepare   the random-weight Qwen2.5-0.5B-shaped model, and an import check of verl
#   bench     the runs in $ORDER (default roll,verl), alternating, into $WORK, with $BENCH_ARGS
#   rescore   the results JSON from every run folder in $WORK (runs of earlier calls on this machine too)
# Measured on an H100 (2026-11-26): a roll run of 3 steps took 4 minutes; a verl run took 3.7 minutes to start and
# 2.3 more for its first step (torch.compile warm-up), so both sides with 3+ steps do not fit one 10-minute call:
# run ORDER=roll, then ORDER=verl with BENCH_ARGS="--steps 3 --skip 1 --timeout 540", in back-to-back calls on one
# warm machine, then rescore. Logs and the results JSON land in $OUT (and benchmarks/results/).
# CPU smoke mode (CI runs it): SMOKE=1 bash scripts/vs_verl_gpu.sh unpack prepare bench: unpack and prepare skip what
# needs the bundles (verl, SGLang) and the 0.5B model; bench runs benchmarks/vs_verl_gpu.py --smoke (roll's side on
# a tiny model through the same run, summary and JSON code; verl's config check where verl is installed); OUT and
# WORK default to output/smoke/, results in $WORK/results. (rescore then finds no verl run: no ratio, exit 1.)
set -uo pipefail
. "$(dirname "$0")/smoke_mode.sh"
OUT=${OUT:-$SCRATCH/roll-vs-verl-out}
MODEL=${MODEL:-/tmp/roll-models/qwen05b-rand}
ORDER=${ORDER:-roll,verl}
WORK=${WORK:-$SCRATCH/roll-vs-verl}
BENCH_ARGS=${BENCH_ARGS:-}
RESULTS=$(results_dir)
[ "$SMOKE" = 1 ] && MODEL=$WORK/models/tiny-math  # built by the smoke bench
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 RAY_DEDUP_LOGS=0
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

rc=0
for mode in "$@"; do
    case $mode in
        unpack)
            [ "$SMOKE" = 1 ] && { echo "[vs_verl] unpack: no bundle in a smoke run"; continue; }
            tar -xJf .dev/verl/verl-site.tar.xz -C /tmp/site --strip-components=1 --no-same-owner || rc=1
            for whl in .dev/verl/*.whl; do python3 -m zipfile -e "$whl" /tmp/site || rc=1; done
            touch /tmp/site/.bundles/verl;;
        prepare)
            [ "$SMOKE" = 1 ] && { echo "[vs_verl] prepare: no model or bundle check in a smoke run"; continue; }
            [ -e /tmp/site/.bundles/verl ] || echo "[vs_verl] WARNING: verl not unpacked on this machine: 'unpack' first"
            python3 scripts/build_qwen05b_rand.py "$MODEL" 2>&1 | tee "$OUT/build.log"
            python3 -c "import verl, liger_kernel, multipart, soundfile, sglang, transformers, torch
print('[vs_verl] verl', verl.__version__, 'sglang', sglang.__version__, 'transformers', transformers.__version__,
      'torch', torch.__version__)" || rc=1;;
        bench|rescore)
            [ "$mode" = rescore ] && extra=(--rescore) || extra=(--order "$ORDER")
            [ "$SMOKE" = 1 ] && [ "$mode" = rescore ] && extra+=(--gpu cpu --out "$RESULTS/vs_verl_cpu.json")
            [ "$SMOKE" = 1 ] && [ "$mode" = bench ] && extra=("--smoke=$WORK")
            # shellcheck disable=SC2086
            python3 benchmarks/vs_verl_gpu.py --model "$MODEL" --work "$WORK" "${extra[@]}" $BENCH_ARGS 2>&1 \
                | tee "$OUT/$mode.log"
            rc=$(( rc || PIPESTATUS[0] ))
            cp -f "$RESULTS"/vs_verl_*.json "$OUT/" 2>/dev/null
            for d in "$WORK"/*_*/; do  # each run's log tail (the full logs stay on the machine)
                [ -f "$d/run.log" ] && tail -c 300000 "$d/run.log" > "$OUT/$(basename "$d").log"
            done;;
        *) echo "unknown mode $mode (unpack | prepare | bench | rescore)"; rc=2;;
    esac
done
exit $rc
