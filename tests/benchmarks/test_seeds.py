"""benchmarks/seeds.py: per-seed overrides, reading validation curves, the gain and its standard error."""

import importlib.util
import json
import math
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("bench_seeds", Path(__file__).parents[2] / "benchmarks" / "seeds.py")
seeds = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(seeds)


def _write_metrics(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_seed_overrides_give_each_seed_its_own_weights_demos_and_dirs(tmp_path):
    ov = seeds.seed_overrides(3, tmp_path / "seed3")
    assert "seed=3" in ov and "tiny_model.seed=3" in ov and "sft_warmup.seed=12348" in ov
    assert f"pretrain={tmp_path / 'seed3' / 'model'}" in ov
    assert f"logging_dir={tmp_path / 'seed3' / 'logs'}" in ov


def test_validation_curve_skips_train_rows_and_reads_episode_count(tmp_path):
    path = _write_metrics(
        tmp_path / "m.jsonl",
        [
            {"step": 0, "val/success_rate": 0.25, "val/batch_size": 400},
            {"step": 1, "rollout/success_rate": 0.9},
            {"step": 2, "val/success_rate": 0.5, "val/batch_size": 400},
        ],
    )
    assert seeds.validation_curve(path) == ([(0, 0.25), (2, 0.5)], 400)


def test_gain_and_its_standard_error_by_hand():
    # first 0.25, last 0.5 on 400 episodes: se = sqrt((0.25*0.75 + 0.5*0.5) / 400) = sqrt(0.4375/400)
    d, se = seeds.gain([(0, 0.25), (40, 0.3), (80, 0.5)], 400)
    assert d == pytest.approx(25.0)
    assert se == pytest.approx(100 * math.sqrt(0.4375 / 400))


def test_table_has_a_column_per_eval_step_and_marks_missing_ones():
    out = seeds.table([(1, [(0, 0.25), (80, 0.5)], 400, 300.0), (2, [(0, 0.4)], 400, None)])
    lines = out.splitlines()
    assert lines[0] == "| seed | val @ 0 | val @ 80 | change (points) | wall |"
    assert lines[2].startswith("| 1 | 25.0% | 50.0% | +25.0 +- 3.3 | 5.0 min |")
    assert lines[3] == "| 2 | 40.0% | - | - | - |"


def test_table_ends_with_the_mean_change_over_seeds():
    # gains +25 (se 3.307) and -10 (first 0.5, last 0.4: se sqrt((0.25 + 0.24) / 400) = 3.5): mean +7.5,
    # se sqrt(3.307^2 + 3.5^2) / 2 = 2.41
    out = seeds.table([(1, [(0, 0.25), (80, 0.5)], 400, None), (2, [(0, 0.5), (80, 0.4)], 400, None)])
    assert out.splitlines()[-1] == "| mean | | | +7.5 +- 2.4 | |"


def test_rlvr_runs_read_their_held_out_accuracy_and_use_their_own_start_script(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "val/accuracy": 0.1, "val/batch_size": 30}, {"step": 5, "rollout/accuracy": 0.9}]
    rows.append({"step": 20, "val/accuracy": 0.2, "val/batch_size": 30})
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert seeds.validation_curve(path) == ([(0, 0.1), (20, 0.2)], 30)
    assert seeds.start_script("rlvr_tiny").name == "start_rlvr_pipeline.py"
    assert seeds.start_script("sokoban_tiny").name == "start_agentic_pipeline.py"
