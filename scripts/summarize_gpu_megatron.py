"""Summary of scripts/verify_gpu_megatron.sh: per-step breakdown, train tokens/s, MFU, PASS/FAIL per check.

``python scripts/summarize_gpu_megatron.py OUT WORK STEPS MISMATCH_MAX MODEL GPUS run=rc ...`` writes
OUT/summary_megatron_<GPUS>gpu.json and exits 1 when a check fails. MFU = 6 x parameters x train tokens/s /
(GPUs x dense bf16 peak: 989 TFLOP/s for H100 and H200 SXM). Needs no GPU (versions and MFU are left out without
one): ``SMOKE=1 bash scripts/verify_gpu_megatron.sh`` runs it on CPU, and ``tests/scripts/test_gpu_scripts_smoke.py``
feeds it a run with a zero gradient norm and a learn run with a FAIL line.
"""

import json
import pathlib
import platform
import sys

from signal_check import signal_checks

PEAK_BF16 = 989e12
KEYS = [
    "time/step",
    "time/rollout",
    "time/offload_reload",
    "time/old_log_probs",
    "time/ref_log_probs",
    "time/train",
    "time/sync",
    "sync/gib",
    "sync/mode",
    "rollout/logprob_mismatch",
    "rollout/logprob_mismatch_max",
    "perf/tokens",
    "perf/train_tokens_per_s",
    "perf/actor_train_peak_reserved_gib",
    "actor/grad_norm",
]


def main(out, work, steps, max_mismatch, model, gpus, rcs):
    out, work = pathlib.Path(out), pathlib.Path(work)
    params = None
    summary, passed = {"python": platform.python_version(), "gpus": gpus}, True
    try:
        import megatron.core
        import torch
        from transformers import AutoModelForCausalLM

        summary.update(
            torch=torch.__version__, gpu=torch.cuda.get_device_name(0), megatron_core=megatron.core.__version__
        )
        with torch.device("meta"):
            params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(model).parameters())
    except Exception as exc:  # the summary still reports the runs
        summary["version_error"] = str(exc)
    for name, rc in rcs.items():
        log = (out / f"{name}.log").read_text(errors="replace") if (out / f"{name}.log").exists() else ""
        checks = {"exit 0": rc == "0"}
        entry = {"exit": rc, "checks": checks}
        if name.startswith("equiv"):
            entry["lines"] = [line for line in log.splitlines() if line.startswith("[gpu-equiv]")]
            checks["no test skipped or failed"] = " skipped" not in log and " failed" not in log
        elif name.startswith("learn"):  # verify_learning_gpu.py checks itself (exit 1 on a FAIL line)
            entry["lines"] = [line for line in log.splitlines() if line.startswith("[learn]")]
            checks["no FAIL line"] = bool(entry["lines"]) and not any("FAIL" in line for line in entry["lines"])
        else:
            path = work / name / "logs" / "metrics.jsonl"
            rows = [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []
            step_rows = [m for m in rows if "time/step" in m]
            mism = [m.get("rollout/logprob_mismatch", float("inf")) for m in step_rows]
            checks[f"{steps} steps logged"] = len(step_rows) == steps
            checks[f"rollout/logprob_mismatch < {max_mismatch:g} every step"] = bool(mism) and max(mism) < max_mismatch
            checks.update(signal_checks(step_rows))
            entry["steps"] = []
            for m in step_rows:
                row = {"step": m.get("step"), **{k: round(m[k], 4) for k in KEYS if k in m}}
                if params and m.get("perf/train_tokens_per_s"):
                    row["mfu"] = round(6 * params * m["perf/train_tokens_per_s"] / (gpus * PEAK_BF16), 4)
                entry["steps"].append(row)
        entry["passed"] = all(checks.values())
        passed &= entry["passed"]
        summary[name] = entry
    summary["passed"] = passed
    (out / f"summary_megatron_{gpus}gpu.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    for name in rcs:
        for check, ok in summary[name]["checks"].items():
            print(f"[verify] {name}: {'PASS' if ok else 'FAIL'} {check}")
    return 0 if passed else 1


if __name__ == "__main__":
    a = sys.argv
    sys.exit(main(a[1], a[2], int(a[3]), float(a[4]), a[5], int(a[6]), dict(x.split("=") for x in a[7:])))
