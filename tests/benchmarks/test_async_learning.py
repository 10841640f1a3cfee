"""benchmarks/async_learning.py's table: success after RL per k and the paired differences to k=0, with the mean
over seeds and its standard error (sd / sqrt(n)), checked against hand-computed values."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location(
    "bench_async_learning", Path(__file__).parents[2] / "benchmarks" / "async_learning.py"
)
bench = importlib.util.module_from_spec(_SPEC)
sys.modules["bench_async_learning"] = bench
_SPEC.loader.exec_module(bench)


def test_table_pairs_each_k_with_k0(tmp_path):
    finals = {1: {0: 0.50, 1: 0.40, 2: 0.60}, 2: {0: 0.30, 1: 0.40, 2: 0.30}}
    for seed, by_k in finals.items():
        for k, success in by_k.items():
            logs = tmp_path / f"seed{seed}" / f"k{k}" / "logs"
            logs.mkdir(parents=True)
            rows = [{"step": 0, "val/success_rate": 0.2}, {"step": 5, "val/success_rate": success}]
            (logs / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    lines = bench.table(tmp_path, [1, 2]).splitlines()
    assert lines[2] == "| 1 | 20.0% | 50.0% | 40.0% | 60.0% | -10.0 | +10.0 |"
    assert lines[3] == "| 2 | 20.0% | 30.0% | 40.0% | 30.0% | +10.0 | +0.0 |"
    # k=0: mean 40, sd 14.14, se 10.0; k=1 - k=0: diffs -10, +10 -> mean 0, sd 14.14, se 10.0; k=2: +10, 0 -> 5 +- 5
    assert lines[4] == (
        "| mean +- stderr | | 40.0% +- 10.0 | 40.0% +- 0.0 | 45.0% +- 15.0 | +0.0 +- 10.0 | +5.0 +- 5.0 |"
    )


def test_correction_runs_get_their_own_columns(tmp_path):
    finals = {
        1: {"k0": 0.50, "k1": 0.40, "k2": 0.60, "k1c": 0.55, "k2c": 0.45},
        2: {"k0": 0.30, "k1": 0.40, "k2": 0.30, "k1c": 0.30, "k2c": 0.40},
    }
    for seed, by_name in finals.items():
        for name, success in by_name.items():
            logs = tmp_path / f"seed{seed}" / name / "logs"
            logs.mkdir(parents=True)
            rows = [{"step": 0, "val/success_rate": 0.2}, {"step": 5, "val/success_rate": success}]
            (logs / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.variants(True)["k1c"] == (1, bench.IS_WEIGHT)
    lines = bench.table(tmp_path, [1, 2], correction=True).splitlines()
    assert lines[0].startswith("| seed | after warm start | k=0 | k=1 | k=2 | k=1 + IS weight | k=2 + IS weight |")
    assert lines[2] == "| 1 | 20.0% | 50.0% | 40.0% | 60.0% | 55.0% | 45.0% | -10.0 | +10.0 | +5.0 | -5.0 |"
    # k1c - k0: +5, +0 -> 2.5 +- 2.5; k2c - k0: -5, +10 -> 2.5 +- 7.5
    assert lines[4].endswith("| +2.5 +- 2.5 | +2.5 +- 7.5 |")
    assert bench.table(tmp_path, [1, 2]).splitlines()[0].count("|") == 8  # without correction: the 3 k's only
