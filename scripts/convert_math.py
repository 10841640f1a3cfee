"""Convert MATH-style data (``problem``, ``solution`` with a ``\\boxed{}`` answer) to RLVR JSONL.

Usage::

    python scripts/convert_math.py MATH/train/*.jsonl -o data/math/train.jsonl [--instruction "..."] [--tag math]

Inputs may be ``.parquet`` or ``.jsonl``. The ground truth is the content of the **last** ``\\boxed{...}`` in the
solution (nested braces allowed). ``level`` and ``type`` are kept when present. Rows without a problem or a boxed
answer stop the conversion with one error listing them.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling script
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))  # the repo, when roll is not installed

from convert_gsm8k import raise_bad_rows, read_rows, run_cli, write_jsonl  # noqa: E402

from roll.rewards.math_answer import extract_answer_with_source  # noqa: E402


def convert_math(inputs: list[str], output: str, *, instruction: str | None = None, tag: str = "math") -> int:
    """Convert MATH-style files to one RLVR JSONL file; returns the number of rows written."""
    out_rows = []
    for path in inputs:
        bad = []
        for row, rec in enumerate(read_rows(path)):
            problem, solution = rec.get("problem"), rec.get("solution")
            answer, source = extract_answer_with_source(solution) if isinstance(solution, str) else (None, "none")
            if not isinstance(problem, str) or not problem.strip():
                bad.append((row, "missing or empty 'problem'"))
            elif source != "boxed":
                bad.append((row, "'solution' has no \\boxed{...} answer"))
            else:
                prompt = problem.strip() + (f"\n{instruction}" if instruction else "")
                out = {"prompt": prompt, "ground_truth": answer, "tag": tag}
                out.update({k: rec[k] for k in ("level", "type") if k in rec})
                out_rows.append(out)
        raise_bad_rows(path, bad)
    return write_jsonl(out_rows, output)


def main(argv: list[str] | None = None) -> None:
    run_cli(convert_math, __doc__.split("\n")[0], "MATH-style", argv)


if __name__ == "__main__":
    main()
