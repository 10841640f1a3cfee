"""Convert GSM8K (``question``, ``answer`` ending in ``#### N``) to RLVR JSONL (``prompt``, ``ground_truth``, ``tag``).

Usage::

    python scripts/convert_gsm8k.py gsm8k/main/train-00000-of-00001.parquet -o data/gsm8k/train.jsonl \
        [--instruction "Put the final answer in <answer></answer>."] [--tag math]

Inputs may be ``.parquet`` or ``.jsonl`` (several files are concatenated). The ground truth is the text after
the last ``####`` with thousands separators removed (``1,000`` -> ``1000``). Rows without a question or a
``####`` answer stop the conversion with one error listing them.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo, when roll is not installed

from roll.data.files import read_records  # noqa: E402

_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a ``.parquet`` or ``.jsonl`` file as dicts."""
    return read_records(path, "input")


def raise_bad_rows(path: str | Path, bad: list[tuple[int, str]]) -> None:
    """Raise one ValueError naming the file and (up to 20) bad rows with their problems."""
    if bad:
        lines = [f"  row {row}: {why}" for row, why in bad[:20]]
        if len(bad) > 20:
            lines.append(f"  ... and {len(bad) - 20} more")
        raise ValueError(f"{path}: {len(bad)} row(s) cannot be converted:\n" + "\n".join(lines))


def write_jsonl(rows: list[dict[str, Any]], output: str) -> int:
    """Write ``rows`` as one JSON object per line to ``output`` (parents created); returns the row count."""
    Path(output).parent.mkdir(parents=True, exist_ok=True)
    Path(output).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


def run_cli(convert: Callable[..., int], description: str, kind: str, argv: list[str] | None) -> None:
    """The converters' shared command line: ``inputs -o OUTPUT [--instruction TEXT] [--tag TAG]``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("inputs", nargs="+", help=f"{kind} .parquet or .jsonl files")
    parser.add_argument("-o", "--output", required=True, help="RLVR .jsonl file to write")
    parser.add_argument("--instruction", default=None, help="text appended to every prompt (answer format)")
    parser.add_argument("--tag", default="math", help="tag of every row (selects the reward)")
    args = parser.parse_args(argv)
    n = convert(args.inputs, args.output, instruction=args.instruction, tag=args.tag)
    print(f"wrote {n} rows to {args.output}", file=sys.stderr)


def convert_gsm8k(inputs: list[str], output: str, *, instruction: str | None = None, tag: str = "math") -> int:
    """Convert GSM8K files to one RLVR JSONL file; returns the number of rows written."""
    out_rows = []
    for path in inputs:
        bad = []
        for row, rec in enumerate(read_rows(path)):
            question, answer = rec.get("question"), rec.get("answer")
            final = _FINAL.search(answer) if isinstance(answer, str) else None
            if not isinstance(question, str) or not question.strip():
                bad.append((row, "missing or empty 'question'"))
            elif final is None:
                bad.append((row, "'answer' has no '#### N' final answer"))
            else:
                prompt = question.strip() + (f"\n{instruction}" if instruction else "")
                out_rows.append({"prompt": prompt, "ground_truth": final.group(1).replace(",", ""), "tag": tag})
        raise_bad_rows(path, bad)
    return write_jsonl(out_rows, output)


def main(argv: list[str] | None = None) -> None:
    run_cli(convert_gsm8k, __doc__.split("\n")[0], "GSM8K", argv)


if __name__ == "__main__":
    main()
