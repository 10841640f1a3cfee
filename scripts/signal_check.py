"""The learning-signal checks every GPU verification script applies to a run's metrics (issue 27, point 3).

A run verified nothing when no step had a learning signal, and its backend did not learn when a step logged a zero
gradient norm. ``signal_checks(rows)`` returns the named checks (True = passed) for a run's step rows (the rows of
``metrics.jsonl`` with ``time/step``):

- some step has non-zero advantages (``critic/advantages_max`` or ``_min`` != 0): else say so and fail;
- ``actor/grad_norm`` > 0 on every step that logged it (a zero norm: no gradient reached the optimizer).

``python scripts/signal_check.py METRICS_JSONL ...`` prints PASS/FAIL lines and exits 1 on a failure. Needs no GPU: the
shell scripts' smoke runs (``SMOKE=1``) use it as it is, and ``tests/scripts/test_gpu_scripts_smoke.py`` feeds it
runs without a signal or a gradient.
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


def signal_checks(rows: list[dict]) -> dict[str, bool]:
    """The two checks of the module docstring on a run's step rows."""
    signal = [
        r for r in rows if r.get("critic/advantages_max", 0.0) != 0.0 or r.get("critic/advantages_min", 0.0) != 0.0
    ]
    norms = [r["actor/grad_norm"] for r in rows if "actor/grad_norm" in r]
    zero = [r.get("step") for r in rows if "actor/grad_norm" in r and not r["actor/grad_norm"] > 0]
    smallest = f"min {min(norms):.3g}" if norms else "none logged"
    norm_note = f"zero on steps {zero}" if zero else smallest
    return {
        f"learning signal: {len(signal)} of {len(rows)} steps have non-zero advantages (none: the run verified "
        f"nothing)": bool(signal),
        f"actor/grad_norm > 0 on every step ({norm_note})": bool(norms) and not zero,
    }


def main(paths: list[str]) -> int:
    ok = True
    for path in paths:
        for name, passed in signal_checks(step_rows(path)).items():
            print(f"{'PASS' if passed else 'FAIL'} {path}: {name}")
            ok &= passed
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
