"""Tests for scripts/: the math data generator (reproducibility of the shipped files) and the converters."""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd

from roll.data.rlvr_dataset import load_rlvr_dataset
from roll.rewards.math_answer import answers_match

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts"
SHIPPED = [
    "math_arith/train.jsonl",
    "math_arith/test.jsonl",
    "gsm8k_sample/train.jsonl",
    "gsm8k_sample/test.jsonl",
    "math_tiny/train.jsonl",
    "math_tiny/test.jsonl",
]


def run_script(name, *args):
    return subprocess.run([sys.executable, str(SCRIPTS / name), *map(str, args)], capture_output=True, text=True)


def test_generator_reproduces_shipped_files(tmp_path):
    result = run_script("make_math_data.py", "--out", tmp_path)
    assert result.returncode == 0, result.stderr
    for rel in SHIPPED:
        assert (tmp_path / rel).read_bytes() == (REPO / "data" / rel).read_bytes(), rel
    assert sum((REPO / "data" / rel).stat().st_size for rel in SHIPPED) < 1_000_000


def test_shipped_data_is_consistent():
    arith = load_rlvr_dataset([REPO / "data/math_arith/train.jsonl", REPO / "data/math_arith/test.jsonl"])
    assert len(arith) == 500 and {e.tag for e in arith} == {"math"}
    train_prompts = {e.prompt for e in arith[:400]}
    assert not train_prompts & {e.prompt for e in arith[400:]}  # no test problem in train
    assert any("." in e.ground_truth for e in arith) and any("/" in e.ground_truth for e in arith)
    tiny = load_rlvr_dataset(REPO / "data/math_tiny/train.jsonl")
    for e in tiny:  # "What is a op b?" with the right answer
        a, op, b = e.prompt[len("What is ") : -1].split()
        assert int(e.ground_truth) == (int(a) + int(b) if op == "+" else int(a) - int(b))
    rows = [json.loads(line) for line in (REPO / "data/gsm8k_sample/train.jsonl").read_text().splitlines()]
    assert len(rows) == 160 and all(r["answer"].split("\n")[-1].startswith("#### ") for r in rows)


def test_convert_gsm8k_parquet_and_jsonl(tmp_path):
    pq = tmp_path / "gsm.parquet"
    pd.DataFrame({"question": ["How many? ", "How much?"], "answer": ["1000 + 234\n#### 1,234", "#### 5"]}).to_parquet(
        pq
    )
    jl = tmp_path / "gsm.jsonl"
    jl.write_text(json.dumps({"question": "Q3", "answer": "x\n#### -7"}) + "\n")
    out = tmp_path / "out" / "rlvr.jsonl"
    result = run_script("convert_gsm8k.py", pq, jl, "-o", out, "--instruction", "Answer in <answer></answer>.")
    assert result.returncode == 0, result.stderr
    examples = load_rlvr_dataset(out)
    assert [(e.prompt, e.ground_truth, e.tag) for e in examples] == [
        ("How many?\nAnswer in <answer></answer>.", "1234", "math"),
        ("How much?\nAnswer in <answer></answer>.", "5", "math"),
        ("Q3\nAnswer in <answer></answer>.", "-7", "math"),
    ]


def test_convert_gsm8k_reports_bad_rows(tmp_path):
    jl = tmp_path / "bad.jsonl"
    jl.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"question": "ok", "answer": "#### 1"},
                {"question": "", "answer": "#### 1"},
                {"question": "q", "answer": "2"},
            ]
        )
    )
    result = run_script("convert_gsm8k.py", jl, "-o", tmp_path / "o.jsonl")
    assert result.returncode != 0
    assert "2 row(s) cannot be converted" in result.stderr
    assert "row 1: missing or empty 'question'" in result.stderr and "row 2: 'answer' has no '#### N'" in result.stderr


def test_convert_math(tmp_path):
    rows = [
        {
            "problem": "Simplify 2/4.",
            "solution": "Divide: $\\boxed{\\frac{1}{2}}$.",
            "level": "Level 1",
            "type": "Algebra",
        },
        {"problem": "Find x.", "solution": "First \\boxed{3}, no: $x = \\boxed{\\{1, 2\\}}$"},
    ]
    jl = tmp_path / "math.jsonl"
    jl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "rlvr.jsonl"
    result = run_script("convert_math.py", jl, "-o", out)
    assert result.returncode == 0, result.stderr
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert written == [
        {
            "prompt": "Simplify 2/4.",
            "ground_truth": "\\frac{1}{2}",
            "tag": "math",
            "level": "Level 1",
            "type": "Algebra",
        },
        {"prompt": "Find x.", "ground_truth": "\\{1, 2\\}", "tag": "math"},
    ]
    assert answers_match("0.5", written[0]["ground_truth"])
    jl.write_text(json.dumps({"problem": "p", "solution": "the answer is 4"}) + "\n")
    result = run_script("convert_math.py", jl, "-o", out)
    assert result.returncode != 0 and "row 0: 'solution' has no \\boxed{...} answer" in result.stderr
