"""The learning-signal checks every GPU verification script applies to a run's metrics (issue 27, point 3).

A run verified nothing when no step had a learning signal, and its backend did not learn when a step logged a zero
gradient norm. ``signal_checks(rows)`` returns the named checks (True = passed) for a run's step rows (the rows of
``metrics.jsonl`` with ``time/step``):

- some step has non-zero advantages (``critic/advantages_max`` or ``_min`` != 0): else say so and fail;
- ``actor/grad_norm`` > 0 on every step with non-zero advantages (a zero norm there: no gradient reached the
  optimizer; a step whose advantages are all zero has nothing to learn from, so its zero norm is no failure);
- with ``every_step=True`` (``--every-step``) also: every step has non-zero advantages.

``python scripts/signal_check.py [--every-step] METRICS_JSONL ...`` prints PASS/FAIL lines and exits 1 on a failure.
Needs no GPU: the shell scripts' smoke runs (``SMOKE=1``) use it as it is, and
``tests/scripts/test_gpu_scripts_smoke.py`` feeds it runs without a signal or a gradient.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def step_rows(path: str | Path) -> list[dict]:
    """The training steps' rows of a ``metrics.jsonl`` (empty when the file is missing)."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r for r in rows if "time/step" in r]


def signal_checks(rows: list[dict], every_step: bool = False) -> dict[str, bool]:
    """The checks of the module docstring on a run's step rows."""
    signal = [
        r for r in rows if r.get("critic/advantages_max", 0.0) != 0.0 or r.get("critic/advantages_min", 0.0) != 0.0
    ]
    norms = [r["actor/grad_norm"] for r in signal if "actor/grad_norm" in r]
    zero = [r.get("step") for r in signal if "actor/grad_norm" in r and not r["actor/grad_norm"] > 0]
    smallest = f"min {min(norms):.3g}" if norms else ("none logged" if signal else "no such step")
    norm_note = f"zero on steps {zero}" if zero else smallest
    checks = {
        f"learning signal: {len(signal)} of {len(rows)} steps have non-zero advantages (none: the run verified "
        f"nothing)": bool(signal),
        f"actor/grad_norm > 0 on every step with non-zero advantages ({norm_note})": bool(rows)
        and not zero
        and (bool(norms) or not signal),
    }
    if every_step:
        without = [r.get("step") for r in rows if r not in signal]
        checks[f"every step has a learning signal (without: {without or 'none'})"] = bool(rows) and not without
    return checks


def main(paths: list[str]) -> int:
    every_step = "--every-step" in paths
    ok = True
    for path in [p for p in paths if p != "--every-step"]:
        for name, passed in signal_checks(step_rows(path), every_step).items():
            print(f"{'PASS' if passed else 'FAIL'} {path}: {name}")
            ok &= passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
