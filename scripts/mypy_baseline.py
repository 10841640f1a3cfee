"""mypy over ``roll/`` against a baseline that only shrinks.

``mypy-baseline.txt`` lists the findings mypy still reports on ``roll/`` (one ``count<TAB>file: [code] message`` line
each, without line numbers, so that unrelated edits do not churn it). This script runs mypy (settings in
``setup.cfg``, section ``[mypy]``) and fails when a finding is new or more frequent than the baseline says, and also
when a listed finding is gone (fixed): then ``--update`` writes the smaller baseline. ``--update`` never adds or
grows an entry: a new finding is fixed in the code, not listed. The modules configured strict in ``setup.cfg``
(``algorithms``, ``data``, ``registry``, ``strategies.base``) are expected to have no entry at all.

    python scripts/mypy_baseline.py            # check (pre-commit)
    python scripts/mypy_baseline.py --update   # after fixing findings: shrink the baseline
    python scripts/mypy_baseline.py --strict   # CI: the strict modules alone, no finding allowed

CI runs ``--strict`` only: the whole tree's findings include messages about third-party types (transformers,
DeepSpeed, Ray: unpinned), which a new release of one of them can change, while the strict modules see little but
torch (pinned in CI). The full check runs in the pre-commit hook, with the developer's installed versions.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASELINE = REPO / "mypy-baseline.txt"
FINDING = re.compile(r"^(?P<file>[^:]+):\d+:(?:\d+:)? error: (?P<message>.*?)\s+\[(?P<code>[\w-]+)\]$")


def findings(output: str) -> Counter[str]:
    """Findings of mypy's output as ``file: [code] message`` keys with their counts (notes and summary skipped).

    >>> findings('roll/a.py:3: error: Bad thing  [arg-type]\\nroll/a.py:9: note: see\\nFound 1 error')
    Counter({'roll/a.py: [arg-type] Bad thing': 1})
    """
    out: Counter[str] = Counter()
    for line in output.splitlines():
        match = FINDING.match(line.strip())
        if match:
            out[f"{match['file']}: [{match['code']}] {match['message']}"] += 1
    return out


def read_baseline(path: Path | None = None) -> Counter[str]:
    """The baseline file's entries (``count<TAB>entry`` lines; default :data:`BASELINE`)."""
    path = path or BASELINE
    out: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                count, _, entry = line.partition("\t")
                out[entry] = int(count)
    return out


def write_baseline(entries: Counter[str], path: Path | None = None) -> None:
    """Write ``entries`` sorted, one ``count<TAB>entry`` line each (default :data:`BASELINE`)."""
    (path or BASELINE).write_text("".join(f"{n}\t{entry}\n" for entry, n in sorted(entries.items()) if n > 0))


def compare(found: Counter[str], baseline: Counter[str]) -> tuple[list[str], list[str]]:
    """``(new, fixed)``: findings above their baseline count, and baseline entries above what mypy found.

    >>> compare(Counter({'a': 2, 'b': 1}), Counter({'a': 1, 'c': 1}))
    (['a (2 found, 1 in the baseline)', 'b (1 found, 0 in the baseline)'], ['c (0 found, 1 in the baseline)'])
    """

    def line(e: str) -> str:
        return f"{e} ({found[e]} found, {baseline[e]} in the baseline)"

    return [line(e) for e in sorted(found) if found[e] > baseline[e]], [
        line(e) for e in sorted(baseline) if baseline[e] > found[e]
    ]


#: The modules ``setup.cfg`` checks strictly (its ``[mypy-...]`` section), as mypy targets.
STRICT = ["roll/algorithms", "roll/data", "roll/registry.py", "roll/strategies/base.py"]


def run_mypy(targets: list[str] | None = None) -> str:
    """mypy's output on ``roll/`` or on ``targets`` alone (the modules they import checked silently); settings from
    ``setup.cfg``."""
    args = ["roll"] if targets is None else ["--follow-imports=silent", *targets]
    proc = subprocess.run([sys.executable, "-m", "mypy", *args], cwd=REPO, capture_output=True, text=True)
    if proc.returncode not in (0, 1):  # 2: mypy itself failed (a config or syntax error)
        raise SystemExit(f"mypy failed to run:\n{proc.stdout}{proc.stderr}")
    return proc.stdout


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="shrink the baseline to what mypy still finds")
    parser.add_argument("--strict", action="store_true", help="only the strict modules, which must have no finding")
    args = parser.parse_args(argv)
    if args.strict:
        strict = findings(run_mypy(STRICT))
        print(f"mypy --strict modules ({', '.join(STRICT)}): {sum(strict.values())} finding(s)")
        print("\n".join(f"  {line}" for line in sorted(strict)))
        return 1 if strict else 0
    found, baseline = findings(run_mypy()), read_baseline()
    new, fixed = compare(found, baseline)
    if new:
        print(f"mypy: {len(new)} finding(s) not in {BASELINE.name}; fix them (the baseline never grows):")
        print("\n".join(f"  {line}" for line in new))
        return 1
    if fixed and not args.update:
        print(f"mypy: {len(fixed)} baseline entr(y/ies) fixed; run python scripts/mypy_baseline.py --update:")
        print("\n".join(f"  {line}" for line in fixed))
        return 1
    if fixed:
        write_baseline(found)
        print(f"mypy: baseline shrunk by {sum(baseline.values()) - sum(found.values())} to {sum(found.values())}")
    else:
        print(f"mypy: {sum(found.values())} known finding(s) in {BASELINE.name}, none new")
    return 0


if __name__ == "__main__":
    sys.exit(main())
