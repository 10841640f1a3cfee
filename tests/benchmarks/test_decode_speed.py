"""``benchmarks/decode_speed.py`` runs end to end on a small shape (so that it does not rot): both paths time, the
tokens agree, the JSON holds a ratio."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))


def test_decode_speed_runs_and_checks_the_tokens(tiny_model_dir, tmp_path):
    import decode_speed

    out = tmp_path / "decode.json"
    assert decode_speed.main(["--model", tiny_model_dir, "--repeats", "1", "--shapes", "8x6x5", "--out", str(out)]) == 0
    [row] = json.loads(out.read_text())["shapes"]
    assert row["same_tokens"] and (row["sequences"], row["prompt_tokens"], row["new_tokens"]) == (8, 6, 5)
    assert row["generate"]["median_s"] > 0 and row["lean"]["median_s"] > 0 and row["ratio"] > 0
