"""benchmarks/vs_verl_gpu.py: both sides configured for the same work, the work check before a ratio, the medians,
verl's data and log formats; the CPU smoke mode runs where verl is installed."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location(
    "bench_vs_verl", Path(__file__).parents[2] / "benchmarks" / "vs_verl_gpu.py"
)
vs = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = vs  # dataclasses look their module up
_SPEC.loader.exec_module(vs)


def _overrides(items: list[str]) -> dict[str, str]:
    return dict(o.lstrip("+").split("=", 1) for o in items)


def test_both_sides_are_configured_for_the_same_work(tmp_path):
    w = vs.Workload(prompts=32, group=4, response_length=256, mini_batches=2, lr=3e-6, kl_coef=0.01)
    roll = _overrides(vs.roll_overrides(w, "/m", tmp_path))
    verl = _overrides(vs.verl_overrides(w, "/m", tmp_path, tmp_path))
    # samples per step and per optimizer step: roll counts samples, verl counts prompts (x rollout.n)
    assert int(roll["rollout_batch_size"]) * int(roll["num_return_sequences_in_group"]) == 128
    assert int(verl["data.train_batch_size"]) * int(verl["actor_rollout_ref.rollout.n"]) == 128
    roll_mb = int(roll["actor_train.training_args.per_device_train_batch_size"]) * int(
        roll["actor_train.training_args.gradient_accumulation_steps"]
    )
    verl_mb = int(verl["actor_rollout_ref.actor.ppo_mini_batch_size"]) * int(verl["actor_rollout_ref.rollout.n"])
    assert roll_mb == verl_mb == 64  # 2 optimizer steps per rollout on both
    # full-length responses on both
    assert roll["actor_infer.generating_args.max_new_tokens"] == verl["data.max_response_length"] == "256"
    assert roll["actor_infer.generating_args.ignore_eos"] == verl["actor_rollout_ref.rollout.ignore_eos"] == "true"
    # the same optimizer, KL, memory share and token budgets
    assert float(roll["actor_train.training_args.learning_rate"]) == float(verl["actor_rollout_ref.actor.optim.lr"])
    assert float(roll["kl_loss_coef"]) == float(verl["actor_rollout_ref.actor.kl_loss_coef"]) == 0.01
    assert (
        roll["actor_infer.strategy_args.strategy_config.mem_fraction_static"]
        == verl["actor_rollout_ref.rollout.gpu_memory_utilization"]
    )
    assert (
        roll["actor_train.max_tokens_per_microbatch_in_train"]
        == verl["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"]
    )
    # verl's speed settings and the shared attention kernel
    assert verl["actor_rollout_ref.actor.strategy"] == "fsdp2"
    assert verl["actor_rollout_ref.model.use_remove_padding"] == "true"
    assert verl["actor_rollout_ref.actor.use_dynamic_bsz"] == "true"
    assert verl["actor_rollout_ref.model.override_config.attn_implementation"] == "roll_varlen"


def test_ratio_only_for_the_same_work():
    roll = {"step_s": 15.0, "generated_tokens": 262144.0, "trained_tokens": 304000.0}
    verl = {"step_s": 30.0, "generated_tokens": 262144.0 * 0.995, "trained_tokens": 303000.0}
    ratio, why = vs.compare(roll, verl)
    assert ratio == pytest.approx(0.5) and "same work" in why
    ratio, why = vs.compare(roll, {**verl, "generated_tokens": 262144.0 * 0.98})
    assert ratio is None and "generated_tokens" in why
    ratio, why = vs.compare(roll, {**verl, "trained_tokens": 310000.0})
    assert ratio is None and "trained_tokens" in why
    ratio, why = vs.compare(roll, {"error": "1 steps logged"})
    assert ratio is None and why == "verl: 1 steps logged"


def _step(end: float, train: float, tokens: float = 1000.0) -> dict:
    return {
        "end": end,
        "step_s": end,
        "generate_s": 1.0,
        "train_s": train,
        "old_log_probs_s": 0.5,
        "ref_log_probs_s": 0.25,
        "sync_s": 0.1,
        "reward_s": 0.0,
        "trained_tokens": tokens,
        "generated_tokens": 800.0,
        "trainer_peak_allocated_gib": train,
    }


def test_summary_medians_after_warm_up_by_hand():
    # step ends 0, 10, 25, 37, 52; skip 2 -> intervals 25-10=15, 37-25=12, 52-37=15 -> median 15
    run = {
        "rc": 0,
        "gpu_peak_gib": 60.0,
        "log": "x",
        "steps": [_step(0, 9.0), _step(10, 2.0), _step(25, 4.0), _step(37, 2.0), _step(52, 5.0)],
    }
    out = vs.summarize(run, skip=2, params=100, peak=1e6)
    assert out["step_s"] == 15
    assert out["train_s"] == 4.0  # median of 4, 2, 5 (the 9 s warm-up step left out)
    assert out["train_tokens_per_s"] == pytest.approx(250.0)
    assert out["mfu"] == pytest.approx(6 * 100 * 250.0 / 1e6)
    assert out["trainer_peak_allocated_gib"] == 9.0 and out["gpu_peak_used_gib"] == 60.0
    assert out["steps_in_median"] == 3
    assert vs.summarize({**run, "steps": run["steps"][:3]}, skip=2, params=100, peak=1e6)["step_s"] == 15
    assert "error" in vs.summarize({**run, "steps": run["steps"][:2]}, skip=2, params=100, peak=1e6)


def test_verl_data_has_the_same_prompts_and_answers(tmp_path):
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    n = vs.write_verl_data(tmp_path)
    frame = pd.read_parquet(tmp_path / "train.parquet")
    rows = [json.loads(x) for x in vs.DATA.read_text().splitlines() if x.strip()]
    assert n == len(rows) == len(frame)
    assert [m[1]["content"] for m in frame["prompt"]] == [r["prompt"] for r in rows]
    assert {m[0]["content"] for m in frame["prompt"]} == {vs.SYSTEM_PROMPT}
    assert [g["ground_truth"] for g in frame["reward_model"]] == [str(r["ground_truth"]) for r in rows]


def test_verl_steps_from_its_file_logger(tmp_path):
    w = vs.Workload(prompts=2, group=4)
    lines = [
        {
            "step": 1,
            "data": {
                "timing_s/step": 9.0,
                "timing_s/gen": 3.0,
                "timing_s/update_actor": 4.0,
                "timing_s/update_weights": 0.5,
                "perf/total_num_tokens": 900,
                "response_length/mean": 100.0,
                "perf/max_memory_allocated_gb": 7.0,
            },
        },
        {"step": 2, "data": {"val-core/x": 1.0}},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (step,) = vs.verl_steps(w, tmp_path, [100.0, 101.0])
    assert step["end"] == 100.0 and step["train_s"] == 4.0 and step["sync_s"] == 0.5
    assert step["generated_tokens"] == 800.0 and step["trained_tokens"] == 900


def test_rescore_joins_run_folders_into_the_results(tmp_path):
    from transformers import Qwen2Config

    Qwen2Config(
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=16,
        vocab_size=32,
    ).save_pretrained(tmp_path / "model")
    w = vs.Workload(prompts=2, group=4, skip=1)
    roll = tmp_path / "work" / "0_roll" / "logs"
    roll.mkdir(parents=True)
    rows = [
        {
            "step": i + 1,
            "timestamp": end,
            "time/step": 9.0,
            "time/train": 2.0,
            "perf/tokens": 1000.0,
            "rollout/generated_tokens": 800.0,
        }
        for i, end in enumerate([0.0, 10.0, 20.0])
    ]
    (roll / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    verl = tmp_path / "work" / "0_verl"
    verl.mkdir()
    lines = [
        {
            "step": i + 1,
            "data": {
                "timing_s/step": 19.0,
                "timing_s/update_actor": 4.0,
                "perf/total_num_tokens": 1005,
                "response_length/mean": 100.0,
            },
        }
        for i in range(3)
    ]
    (verl / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (verl / "run.json").write_text(json.dumps({"rc": 0, "gpu_peak_gib": 50.0, "stamps": [0.0, 20.0, 40.0]}))
    out = tmp_path / "result.json"
    rc = vs.main(
        [
            "--rescore",
            "--work",
            str(tmp_path / "work"),
            "--model",
            str(tmp_path / "model"),
            "--out",
            str(out),
            "--prompts",
            "2",
            "--group",
            "4",
            "--skip",
            "1",
        ]
    )
    result = json.loads(out.read_text())
    assert rc == 0 and result["ratio"] == pytest.approx(10.0 / 20.0)  # median intervals 10 s vs 20 s
    assert result["roll"]["run"] == "0_roll" and result["verl"]["gpu_peak_used_gib"] == 50.0
    assert w.samples * 100.0 == result["verl"]["generated_tokens"] == result["roll"]["generated_tokens"]


@pytest.mark.skipif(
    importlib.util.find_spec("verl") is None,
    reason="verl is not installed (pip install verl==0.9.1 tensordict==0.10.0 torchdata codetiming "
    "datasets pylatexenc cachetools, see scripts/build_verl_bundle.sh)",
)
def test_smoke_both_configs_compose_and_verl_reads_the_data(tmp_path):
    report = vs.smoke(vs.Workload(), tmp_path)
    assert report["roll_config"] == "loaded" and report["verl_config"] == "composed and validated"
    assert report["verl_rollout_n"] == vs.Workload().group and report["verl_rows"] == 400
