# Sourced by the GPU shell scripts: their CPU smoke mode, SMOKE=1 (CI runs it: tests/scripts/test_gpu_scripts_smoke.py).
# A smoke run skips what only a GPU machine has (bundles, nvidia-smi, the 0.5B model, GPU-only tests) and runs the
# script's own Python steps, summary and checks on CPU, each GPU config replaced by its tiny stand-in
# (scripts/cpu_smoke.py: hf_infer, distributed=local, seconds per step).
#   SCRATCH        where OUT and WORK default: /tmp on the GPU machine, $SMOKE_DIR (default output/smoke) in a smoke run
#   stop_ray       `ray stop --force` between GPU runs; nothing in a smoke run (its runs use no Ray, and a shared
#                  machine's other Ray instances are not the script's to stop)
#   smoke_args LAUNCHER_ARGS...   sets SMOKE_ARGS: the launcher arguments (--config-name, --config-path, overrides) of
#                  the smoke run standing in for LAUNCHER_ARGS (the tiny config, the overrides merged)
#   results_dir    where the Python benchmarks write their results JSON: benchmarks/results, or $WORK/results
#   smoke_flag     the --smoke argument of the Python scripts (empty on the GPU machine)
SMOKE=${SMOKE:-0}
if [ "$SMOKE" = 1 ]; then SCRATCH=${SMOKE_DIR:-output/smoke}; else SCRATCH=/tmp; fi
stop_ray() { [ "$SMOKE" = 1 ] || ray stop --force >/dev/null 2>&1; }
smoke_args() { mapfile -t SMOKE_ARGS < <(python3 scripts/cpu_smoke.py "$WORK" "$@"); }
results_dir() { if [ "$SMOKE" = 1 ]; then echo "$WORK/results"; else echo benchmarks/results; fi; }
smoke_flag() { if [ "$SMOKE" = 1 ]; then echo "--smoke=$WORK"; fi; }
