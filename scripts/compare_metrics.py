"""Compare two ``metrics.jsonl`` files step by step, bit for bit, ignoring timing keys.

Usage: ``python scripts/compare_metrics.py BEFORE.jsonl AFTER.jsonl [--ignore PREFIX ...]``. Exit code 0 when
every step has the same keys and exactly equal values (``time/*``, ``perf/*`` and ``timestamp`` are ignored by
default: they measure the machine, not the run), 1 otherwise, with one line per difference. Used to check that a
refactoring leaves a fixed-seed run unchanged (``docs/architecture.md``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

DEFAULT_IGNORE = ("time/", "perf/", "timestamp")


def load(path: str | Path) -> dict[int, dict[str, float]]:
    """Records of a metrics.jsonl file by step (a later record of a step updates an earlier one)."""
    steps: dict[int, dict[str, float]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                record = json.loads(line)
                steps.setdefault(int(record.pop("step")), {}).update(record)
    return steps


def same(a: object, b: object) -> bool:
    """Exact equality; two NaNs are equal."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def differences(before: dict[int, dict], after: dict[int, dict], ignore: tuple[str, ...]) -> list[str]:
    """One line per step or key that differs between two loaded files."""
    out = []
    for step in sorted(set(before) | set(after)):
        if step not in before or step not in after:
            out.append(f"step {step}: only in {'after' if step in after else 'before'}")
            continue
        b, a = before[step], after[step]
        for key in sorted(set(b) | set(a)):
            if key.startswith(ignore):
                continue
            if key not in b or key not in a:
                out.append(f"step {step}: {key} only in {'after' if key in a else 'before'}")
            elif not same(b[key], a[key]):
                out.append(f"step {step}: {key}: {b[key]!r} != {a[key]!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--ignore", nargs="*", default=list(DEFAULT_IGNORE), help="key prefixes to skip")
    args = parser.parse_args(argv)
    before, after = load(args.before), load(args.after)
    diffs = differences(before, after, tuple(args.ignore))
    for line in diffs:
        print(line)
    keys = sum(len(v) for v in after.values())
    print(f"{len(after)} steps, {keys} values: " + ("identical" if not diffs else f"{len(diffs)} differences"))
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
