"""Every GPU verification script and GPU benchmark runs its own code on CPU (its smoke mode: ``--smoke`` /
``SMOKE=1``, ``scripts/cpu_smoke.py``), so a change elsewhere that breaks a script fails here and not on the GPU
machine. Each script's checks are also fed a run that must fail them (zero advantages, a zero gradient norm, a
stale engine, a mismatch bound of 0...) and must say so.

The shell scripts run as on the GPU machine, from the repository root, with ``SMOKE=1`` and their scratch in the
test's folder; a smoke run uses no Ray (``distributed=local``) except ``verify_two_nodes.sh``, which starts and
stops its own two nodes.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: A check line: ``[tag] name: PASS check``, ``PASS name: check`` ... (not a JSON dump's ``"no FAIL line": true``).
VERDICT = re.compile(r"^(?:\[[^\]]+\] )?(?:[\w=.-]+: )?(PASS|FAIL) ")


def _module(path: str):
    """A script as a module (its own ``sys.path`` setup runs; ``scripts/`` is importable for its siblings)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    spec = importlib.util.spec_from_file_location(f"smoke_{Path(path).stem}", ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _run(tmp_path: Path, cmd: list[str], timeout: float = 800, **env: object) -> subprocess.CompletedProcess:
    """``cmd`` from the repository root in smoke mode, scratch in ``tmp_path`` (OUT, WORK); this interpreter's
    ``python3`` first on PATH."""
    environ = {
        **os.environ,
        "SMOKE": "1",
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        **{k: str(v) for k, v in env.items()},
    }
    return subprocess.run(cmd, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout)


def _verdicts(proc: subprocess.CompletedProcess) -> list[tuple[str, str]]:
    """``(PASS|FAIL, line)`` of every check line the script printed."""
    return [(m.group(1), line) for line in proc.stdout.splitlines() if (m := VERDICT.match(line))]


def _tail(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


def _all_pass(proc: subprocess.CompletedProcess, at_least: int) -> list[str]:
    """Exit 0 and at least ``at_least`` check lines, all PASS; returns the lines."""
    verdicts = _verdicts(proc)
    assert proc.returncode == 0 and len(verdicts) >= at_least, _tail(proc)
    assert all(v == "PASS" for v, _ in verdicts), _tail(proc)
    return [line for _, line in verdicts]


def _rows(path: Path, **changes: float) -> None:
    """Two step rows of a run with a learning signal (``changes`` replace keys of every row) into ``path``."""
    rows = [
        {
            "step": step,
            "time/step": 1.0,
            "time/rollout": 0.5,
            "actor/grad_norm": 0.5,
            "critic/advantages_max": 1.0,
            "critic/advantages_min": -1.0,
            "rollout/logprob_mismatch": 0.001,
            "rollout/staleness_max": 1.0,
            "sync/mode": 3.0,
            "sync/buckets": 1.0,
            **changes,
        }
        for step in (1, 2)
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


# ------------------------------------------------------------------------------------------------ the shared checks
def test_signal_checks_fail_a_run_without_signal_or_gradient(tmp_path):
    sig = _module("scripts/signal_check.py")
    good, no_signal, no_grad = tmp_path / "good.jsonl", tmp_path / "zero_adv.jsonl", tmp_path / "zero_grad.jsonl"
    _rows(good)
    _rows(no_signal, **{"critic/advantages_max": 0.0, "critic/advantages_min": 0.0})
    _rows(no_grad, **{"actor/grad_norm": 0.0})
    assert all(sig.signal_checks(sig.step_rows(good)).values())
    assert list(sig.signal_checks(sig.step_rows(no_signal)).values()) == [False, True]
    assert list(sig.signal_checks(sig.step_rows(no_grad)).values()) == [True, False]
    assert not any(sig.signal_checks(sig.step_rows(tmp_path / "missing.jsonl")).values())
    # a step without signal may have a zero norm (nothing to learn from), but --every-step fails the run on it
    mixed = tmp_path / "mixed.jsonl"
    rows = sig.step_rows(good)
    rows[0].update({"critic/advantages_max": 0.0, "critic/advantages_min": 0.0, "actor/grad_norm": 0.0})
    mixed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert list(sig.signal_checks(sig.step_rows(mixed)).values()) == [True, True]
    assert list(sig.signal_checks(sig.step_rows(mixed), every_step=True).values()) == [True, True, False]
    assert sig.main(["--every-step", str(good)]) == 0 and sig.main(["--every-step", str(mixed)]) == 1
    assert sig.main([str(good)]) == 0 and sig.main([str(good), str(no_grad)]) == 1


def test_cpu_smoke_maps_gpu_configs_and_drops_gpu_placement(tmp_path):
    smoke = _module("scripts/cpu_smoke.py")
    assert smoke.smoke_config("sokoban_qwen05b_sglang") == "sokoban_tiny"
    assert smoke.smoke_config("sokoban_agent_sglang") == "sokoban_agent_tiny"
    assert smoke.smoke_config("rlvr_qwen05b_megatron") == "rlvr_tiny"
    args = smoke.smoke_command(
        [
            "--config-path",
            str(ROOT / "examples" / "config"),
            "--config-name=sokoban_qwen05b_sglang_disagg",
            "distributed=ray",
            "actor_infer.device_mapping=[1]",
            "+actor_infer.strategy_args.strategy_config.tp_size=2",
            "async_generation_ratio=1",
        ],
        tmp_path,
    )
    assert args[:2] == ["--config-name", "sokoban_tiny"]
    assert "async_generation_ratio=1" in args and "distributed=local" in args and "distributed=ray" not in args
    assert not any("device_mapping" in a or "tp_size" in a for a in args)
    assert f"pretrain={tmp_path / 'models' / 'tiny'}" in args
    # every override the smoke run adds is a key of the tiny configs (Hydra refuses a key it does not know)
    from roll.config.agentic import AgenticConfig
    from roll.config.loader import load_config
    from roll.config.rlvr import RLVRConfig

    load_config("sokoban_tiny", overrides=args[2:], schema=AgenticConfig)
    load_config("rlvr_tiny", overrides=smoke.smoke_overrides("rlvr_tiny", tmp_path), schema=RLVRConfig)


def test_learning_checks_fail_on_zero_signal_zero_gradient_and_disagreeing_backends():
    learn = _module("scripts/verify_learning_gpu.py")
    rows = [{"step": 1, "actor/grad_norm": 1.0, "critic/advantages_max": 1.0, "critic/advantages_min": -1.0}]
    probe = {"grad_norm": 2.0, "update_norm": 1e-3, "loss_before": 0.5, "loss_after": 0.4}
    probes = {"megatron_train": probe, "deepspeed_train": {**probe, "grad_norm": 2.02}}
    assert all(learn.learning_checks(0, rows, probes, 0.02).values())

    def failed(rc=0, rows=rows, probes=probes):
        return [name for name, ok in learn.learning_checks(rc, rows, probes, 0.02).items() if not ok]

    assert failed(rc=1) == ["pipeline run exit 0"]
    no_signal = [{**rows[0], "critic/advantages_max": 0.0, "critic/advantages_min": 0.0}]
    assert len(failed(rows=no_signal)) == 2  # no signal, so the grad-norm check has nothing to pass on either
    assert failed(rows=[{**rows[0], "actor/grad_norm": 0.0}]) == [
        "actor/grad_norm > 0 on every step with non-zero advantages"
    ]
    assert failed(probes={**probes, "deepspeed_train": {**probe, "loss_after": 0.6}}) == [
        "deepspeed_train: grad norm > 0, weights moved, loss went down"
    ]
    far = failed(probes={**probes, "deepspeed_train": {**probe, "grad_norm": 2.1}})  # 5% off
    assert len(far) == 1 and far[0].startswith("deepspeed_train grad norm within 2% of megatron_train's (5.00%)")
    zero = failed(probes={"megatron_train": {**probe, "grad_norm": 0.0}, "deepspeed_train": probe})
    assert len(zero) == 2  # the reference's own check, and no agreement with a zero reference


def test_summarize_gpu_megatron_fails_a_zero_gradient_and_a_failed_learn_run(tmp_path):
    summarize = _module("scripts/summarize_gpu_megatron.py")
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    (out / "learn.log").write_text("[learn] PASS pipeline run exit 0\n[learn] PASS some step has non-zero advantages\n")
    _rows(work / "sokoban" / "logs" / "metrics.jsonl")
    rcs = {"learn": "0", "sokoban": "0"}
    assert summarize.main(out, work, 2, 0.02, str(tmp_path / "no-model"), 1, rcs) == 0
    assert json.loads((out / "summary_megatron_1gpu.json").read_text())["passed"] is True
    _rows(work / "sokoban" / "logs" / "metrics.jsonl", **{"actor/grad_norm": 0.0})
    assert summarize.main(out, work, 2, 0.02, str(tmp_path / "no-model"), 1, rcs) == 1
    summary = json.loads((out / "summary_megatron_1gpu.json").read_text())
    assert summary["learn"]["passed"] and not summary["sokoban"]["passed"]
    _rows(work / "sokoban" / "logs" / "metrics.jsonl")
    (out / "learn.log").write_text("[learn] FAIL fsdp2_train grad norm within 2% of megatron_train's (9.00%)\n")
    assert summarize.main(out, work, 2, 0.02, str(tmp_path / "no-model"), 1, rcs) == 1


def test_gpu_step_summary_by_hand(tmp_path):
    gpu_step = _module("benchmarks/gpu_step.py")
    row = {
        "time/step": 4.0,
        "time/train": 2.0,
        "time/rollout_generate": 1.0,
        "perf/tokens": 1000.0,
        "rollout/generated_tokens": 300.0,
        "time/sync": 0.5,
        "sync/gib": 2.0,
    }
    out = gpu_step.summarize(row, params=100, peak=1e6)
    assert out["train_tokens_per_s"] == 500.0 and out["gen_tokens_per_s"] == 300.0
    assert out["gen_train_fraction"] == 0.75 and out["sync_gib_per_s"] == 4.0
    assert out["mfu"] == 6 * 100 * 500.0 / 1e6
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({**row, "step": s, "time/step": t}) + "\n" for s, t in [(1, 9.0), (2, 4.0)]))
    argv = ["--config-name", "x", "--from-metrics", str(metrics), "--skip", "1", "--gpu", "NVIDIA H100", "--smoke"]
    assert gpu_step.main([*argv, str(tmp_path), "--parameters", "100"]) == 0
    result = json.loads((tmp_path / "results" / "x_h100.json").read_text())
    assert result["step_s"] == 4.0 and result["mfu"] == 6 * 100 * 500.0 / 989.4e12 and result["median_of_steps"] == [2]


def test_gpu_step_counts_a_vision_language_models_parameters(tiny_vl_model_dir):
    """A Qwen2.5-VL directory is counted whole (decoder and vision tower), as transformers builds it; the causal-LM
    auto class refuses its config, which is how the H200 run's summary failed after its five steps."""
    from transformers import AutoModelForImageTextToText

    gpu_step = _module("benchmarks/gpu_step.py")
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir)
    tower = sum(p.numel() for p in model.model.visual.parameters())
    assert tower > 0
    assert gpu_step.count_parameters(tiny_vl_model_dir) == sum(p.numel() for p in model.parameters())


def test_nccl_check_catches_a_sync_that_does_not_arrive(tmp_path, monkeypatch):
    nccl = _module("scripts/check_nccl_weight_sync.py")
    assert nccl.cli(["--smoke", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "nccl_check" / "nccl_check.json").read_text())
    assert result["passed"] and result["buckets"] >= 1 and len(result["syncs"]) == 2
    assert result["after_sync_mismatch"] < nccl.MAX_MISMATCH < result["stale_mismatch"]
    monkeypatch.setattr(nccl.CpuEngine, "load", lambda self, named: None)  # received, never loaded
    assert nccl.cli(["--smoke", str(tmp_path), str(tmp_path / "models" / "tiny-train"), str(tmp_path / "bad")]) == 1
    checks = json.loads((tmp_path / "bad" / "nccl_check.json").read_text())["checks"]
    assert [ok for ok in checks.values()] == [True, False, False]


def test_vs_verl_smoke_checks_fail_short_responses_and_a_ratio_without_verl():
    vs = _module("benchmarks/vs_verl_gpu.py")
    w = vs.SMOKE_WORKLOAD
    step = {"generated_tokens": float(w.samples * w.response_length)}
    run = {"rc": 0, "steps": [step] * w.steps}
    assert not vs.smoke_checks(w, run, *vs.compare({}, {}))["no ratio without verl's side"]  # refused for roll
    assert all(vs.smoke_checks(w, run, None, "verl: no steps").values())
    short = {**run, "steps": [step, {"generated_tokens": step["generated_tokens"] - 1}, step]}
    assert [ok for ok in vs.smoke_checks(w, short, None, "verl: no steps").values()] == [True, True, False, True]
    assert not vs.smoke_checks(w, run, 0.8, "same work")["no ratio without verl's side"]


def test_verl_varlen_registers_the_attention_verl_is_told_to_use():
    """``benchmarks/verl_varlen.py`` is imported by every verl process (``VERL_USE_EXTERNAL_MODULES``); verl's
    config names ``roll_varlen``, which only that import makes known to transformers."""
    code = (
        "import importlib; from transformers import AttentionInterface as A; "
        "before = 'roll_varlen' in A().valid_keys(); importlib.import_module('benchmarks.verl_varlen'); "
        "print(before, 'roll_varlen' in A().valid_keys())"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.stdout.split() == ["False", "True"], _tail(proc)
    vs = _module("benchmarks/vs_verl_gpu.py")
    overrides = vs.verl_overrides(vs.Workload(), "m", Path("d"), Path("r"))
    assert "+actor_rollout_ref.model.override_config.attn_implementation=roll_varlen" in overrides


# ------------------------------------------------------------------------------------------------ the Python scripts
@pytest.mark.slow
def test_verify_agent_gateway_smoke_tabulates_both_sides(tmp_path):
    proc = _run(tmp_path, [sys.executable, "scripts/verify_agent_gateway.py", "--smoke", str(tmp_path)])
    assert proc.returncode == 0, _tail(proc)
    results = json.loads((tmp_path / "verify_agent_gateway" / "results.json").read_text())
    assert set(results) == {"native-s1", "gateway-s1"}
    for side in results.values():
        assert len(side["rollout"]) == 2 and None not in side["rollout"]
        assert side["val_start"] is not None and side["val_end"] is not None and side["logprob_gap"] < 1e-3
    assert "| seed 1 |" in (tmp_path / "verify_agent_gateway" / "table.md").read_text()


# ------------------------------------------------------------------------------------------------ the shell scripts
@pytest.mark.slow
def test_verify_gpu_sglang_smoke_and_a_run_without_signal(tmp_path):
    proc = _run(tmp_path, ["bash", "scripts/verify_gpu_sglang.sh"], STEPS=2, HF_STEPS=2)
    assert len(_all_pass(proc, at_least=4)) == 4  # two checks for each of the two runs
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert len(summary["sglang"]) == len(summary["hf"]) == 2
    # the summary alone (no runs) on a run whose steps all had zero advantages
    zero = {"critic/advantages_max": 0.0, "critic/advantages_min": 0.0}
    _rows(tmp_path / "work" / "sglang" / "logs" / "metrics.jsonl", **zero)
    proc = _run(tmp_path, ["bash", "scripts/verify_gpu_sglang.sh"], STEPS=0, HF_STEPS=0)
    failed = [line for v, line in _verdicts(proc) if v == "FAIL"]
    assert proc.returncode == 1 and failed == [
        "[verify] sglang: FAIL learning signal: 0 of 2 steps have non-zero advantages (none: the run verified nothing)"
    ], _tail(proc)


@pytest.mark.slow
def test_verify_gpu_step_smoke_rlvr_and_kernels(tmp_path):
    proc = _run(tmp_path, ["bash", "scripts/verify_gpu_step.sh", "prepare", "rlvr", "kernels"], RLVR_STEPS=2)
    _all_pass(proc, at_least=2)
    results = tmp_path / "work" / "results"
    step = json.loads((results / "rlvr_qwen05b_gpu_cpu.json").read_text())
    assert step["smoke_config"] == "rlvr_tiny" and len(step["steps"]) == 2 and step["bare_train_s"] > 0
    kernels = json.loads((results / "gpu_train_step_rlvr_qwen05b_gpu_cpu.json").read_text())
    assert set(kernels["variants"]) == {"shipped", "eager_head"}
    assert all(v["step_s"] > 0 for v in kernels["variants"].values())
    # a variant that cannot run fails the kernels mode (it used to be reported and exit 0)
    proc = _run(tmp_path, ["bash", "scripts/verify_gpu_step.sh", "kernels"], KERNEL_VARIANTS="--variant bad=no_key=1")
    assert proc.returncode == 1 and "FAIL: variant(s) bad did not run" in proc.stdout, _tail(proc)


@pytest.mark.slow
def test_verify_gpu_megatron_smoke_learn_and_a_mismatch_bound_of_zero(tmp_path):
    """The learn run is ``scripts/verify_learning_gpu.py --smoke`` on sokoban_qwen05b_megatron (2 steps, a 30-step
    warm start, the three backends): its own checks are read from its log and results here (one run for both)."""
    proc = _run(tmp_path, ["bash", "scripts/verify_gpu_megatron.sh"], STEPS=2, RUNS="learn sokoban", MISMATCH_MAX=0)
    verdicts = _verdicts(proc)
    failed = [line for v, line in verdicts if v == "FAIL"]
    assert proc.returncode == 1 and failed == ["[verify] sokoban: FAIL rollout/logprob_mismatch < 0 every step"], _tail(
        proc
    )
    assert ("PASS", "[verify] learn: PASS no FAIL line") in verdicts
    assert ("PASS", "[verify] sokoban: PASS 2 steps logged") in verdicts
    # verify_learning_gpu.py itself: exit 0, every check line PASS (run, signal, grad norm, 3 probes, 2 agreements)
    assert "[verify] learn: exit 0 after" in proc.stdout, _tail(proc)
    learn = subprocess.CompletedProcess([], 0, (tmp_path / "out" / "learn.log").read_text(), "")
    lines = _all_pass(learn, at_least=8)
    assert any("megatron_train: grad norm > 0" in line for line in lines)
    result = json.loads((tmp_path / "out" / "learning_sokoban_qwen05b_megatron_cpu.json").read_text())
    assert result["passed"] and result["smoke"] and result["probed_batch_of_step"] == 1
    assert set(result["probes"]) == {"megatron_train", "deepspeed_train", "fsdp2_train"}
    assert (tmp_path / "work" / "results" / "learning_sokoban_qwen05b_megatron_cpu.json").is_file()  # smoke: in WORK
    assert not (ROOT / "benchmarks" / "results" / "learning_sokoban_qwen05b_megatron_cpu.json").exists()


@pytest.mark.slow
def test_verify_gpu_fsdp2_smoke_and_a_mismatch_bound_of_zero(tmp_path):
    cmd = ["bash", "scripts/verify_gpu_fsdp2.sh", "prepare", "sokoban"]
    proc = _run(tmp_path, cmd, STEPS=2, RUNS="fsdp2", MISMATCH_MAX=0)
    verdicts = _verdicts(proc)
    assert proc.returncode == 1 and [line for v, line in verdicts if v == "FAIL"] == [
        "FAIL fsdp2: logprob mismatch < 0.0"
    ], _tail(proc)
    for check in ("exit 0", "2 steps", "actor on fsdp2_train", "sync mode 3 every step"):
        assert ("PASS", f"PASS fsdp2: {check}") in verdicts, _tail(proc)
    assert json.loads((tmp_path / "out" / "sokoban_qwen05b_sglang_fsdp2_cpu.json").read_text())["smoke_config"]


@pytest.mark.slow
def test_verify_gpu_sglang_2gpu_smoke_prepare_and_disagg(tmp_path):
    proc = _run(tmp_path, ["bash", "scripts/verify_gpu_sglang_2gpu.sh", "prepare"])
    assert len(_all_pass(proc, at_least=3)) == 3  # check_nccl_weight_sync.py --smoke
    assert json.loads((tmp_path / "out" / "nccl_check.json").read_text())["passed"]
    proc = _run(tmp_path, ["bash", "scripts/verify_gpu_sglang_2gpu.sh"], STEPS=2, RUNS="disagg", MISMATCH_MAX=0)
    verdicts = _verdicts(proc)
    assert proc.returncode == 1 and [line for v, line in verdicts if v == "FAIL"] == [
        "[verify] disagg: FAIL rollout/logprob_mismatch < 0 every step"
    ], _tail(proc)
    assert ("PASS", "[verify] disagg: PASS every step synced with sync/mode 3") in verdicts


@pytest.mark.slow
def test_verify_async_gpu_smoke_and_a_stale_step(tmp_path):
    proc = _run(tmp_path, ["bash", "scripts/verify_async_gpu.sh"], KS=1, STEPS=2)
    _all_pass(proc, at_least=5)
    summary = json.loads((tmp_path / "out" / "async_unknown.json").read_text())
    assert summary["passed"] and summary["runs"]["k1"]["staleness_max"] <= 1
    assert not (ROOT / "benchmarks" / "results" / "async_unknown.json").exists()
    # the summary alone, on a run whose policy lagged 2 versions behind with k = 1
    _rows(tmp_path / "out" / "k1_metrics.jsonl", **{"rollout/staleness_max": 2.0})
    proc = _run(tmp_path, ["bash", "scripts/verify_async_gpu.sh", "summarize"], STEPS=2)
    assert proc.returncode == 1 and ("FAIL", "[verify] k=1: FAIL rollout/staleness_max <= 1 on every step") in (
        _verdicts(proc)
    ), _tail(proc)


@pytest.mark.slow
def test_verify_gateway_gpu_smoke_and_a_short_run(tmp_path):
    proc = _run(tmp_path, ["bash", "scripts/verify_gateway_gpu.sh"], STEPS=2, GW_ARGS="max_steps=1")
    verdicts = _verdicts(proc)
    assert proc.returncode == 1 and [line for v, line in verdicts if v == "FAIL"] == [
        "[verify] gateway: FAIL 2 steps logged"
    ], _tail(proc)
    for check in ("exit 0", "2 steps logged", "learning signal: 2 of 2 steps"):
        assert any(v == "PASS" and line.startswith(f"[verify] native: PASS {check}") for v, line in verdicts)
    assert len(json.loads((tmp_path / "out" / "summary.json").read_text())["gateway"]) == 1


@pytest.mark.slow
def test_verify_two_nodes_smoke(tmp_path):
    proc = _run(tmp_path, ["bash", "scripts/verify_two_nodes.sh"], STEPS=2, timeout=850)
    lines = _all_pass(proc, at_least=7)
    assert (
        "[verify] PASS two nodes alive" in lines
        and "[verify] PASS actor_train and actor_infer on different nodes" in (lines)
    )
    assert json.loads((tmp_path / "out" / "two_nodes_cpu.json").read_text())["passed"]


@pytest.mark.slow
def test_vs_verl_gpu_smoke_bench(tmp_path):
    proc = _run(tmp_path, ["bash", "scripts/vs_verl_gpu.sh", "unpack", "prepare", "bench"])
    assert len(_all_pass(proc, at_least=4)) == 4, _tail(proc)
    result = json.loads((tmp_path / "out" / "vs_verl_smoke.json").read_text())
    assert result["roll"]["steps_logged"] == 3 and result["roll"]["generated_tokens"] == 16 * 8
    assert result["roll_gpu_config"] == "loaded"


@pytest.mark.slow
def test_verify_gpu_lora_smoke_and_a_run_that_syncs_full_weights(tmp_path):
    proc = _run(tmp_path, ["bash", "scripts/verify_gpu_lora.sh", "prepare", "lora05", "refuse"], STEPS=2)
    lines = _all_pass(proc, at_least=4)
    assert any(line.startswith("[verify] lora05: PASS adapter sync: 2 syncs, modes [4.0]") for line in lines), lines
    assert "[verify] refuse: PASS exit 1, the full-weight 7B config refused naming LoRA" in lines
    result = json.loads((tmp_path / "work" / "results" / "sokoban_qwen05b_sglang_lora_lora05_cpu.json").read_text())
    assert result["smoke_config"] == "sokoban_tiny" and len(result["steps"]) == 2
    # the same run with LoRA off syncs full weights: the adapter check must say so
    proc = _run(
        tmp_path,
        ["bash", "scripts/verify_gpu_lora.sh", "lora05"],
        STEPS=2,
        EXTRA=" ".join(f"actor_train.model_args.lora_{k}=null" for k in ("target", "rank", "alpha")),
    )
    failed = [line for v, line in _verdicts(proc) if v == "FAIL"]
    assert proc.returncode == 1 and len(failed) == 1 and "modes [3.0]" in failed[0], _tail(proc)
