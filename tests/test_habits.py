"""The tree's habits (docs/contributing.md): the mypy baseline only shrinks, the strict modules stay clean, ruff is
configured for the whole tree."""

from __future__ import annotations

import doctest
import importlib.util
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import mypy_baseline  # noqa: E402


def test_doctests_of_the_baseline_script():
    assert doctest.testmod(mypy_baseline).failed == 0


def test_the_baseline_fails_a_new_finding_and_a_fixed_one(tmp_path, monkeypatch, capsys):
    baseline = tmp_path / "mypy-baseline.txt"
    mypy_baseline.write_baseline(Counter({"roll/a.py: [arg-type] x": 2}), baseline)
    assert baseline.read_text() == "2\troll/a.py: [arg-type] x\n"
    monkeypatch.setattr(mypy_baseline, "BASELINE", baseline)
    out = {
        "same": "roll/a.py:1: error: x  [arg-type]\nroll/a.py:9: error: x  [arg-type]\n",
        "new": "roll/a.py:1: error: x  [arg-type]\nroll/a.py:9: error: x  [arg-type]\nroll/b.py:3: error: y  [misc]\n",
        "fixed": "roll/a.py:1: error: x  [arg-type]\n",
    }
    for case, want in (("same", 0), ("new", 1), ("fixed", 1)):
        monkeypatch.setattr(mypy_baseline, "run_mypy", lambda targets=None, case=case: out[case])
        assert mypy_baseline.main([]) == want, case
    assert "roll/b.py: [misc] y (1 found, 0 in the baseline)" in capsys.readouterr().out
    monkeypatch.setattr(mypy_baseline, "run_mypy", lambda targets=None: out["new"])
    assert mypy_baseline.main(["--update"]) == 1  # --update never adds an entry
    monkeypatch.setattr(mypy_baseline, "run_mypy", lambda targets=None: out["fixed"])
    assert mypy_baseline.main(["--update"]) == 0 and mypy_baseline.read_baseline(baseline) == Counter(
        {"roll/a.py: [arg-type] x": 1}
    )


@pytest.mark.slow
def test_the_strict_modules_have_no_finding_and_an_untyped_function_is_one(tmp_path, monkeypatch):
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed: pip install -e '.[dev]' (CI installs it)")
    assert mypy_baseline.findings(mypy_baseline.run_mypy(mypy_baseline.STRICT)) == Counter()
    # a module under the strict section (roll.algorithms.*) with an untyped function: one finding
    module = ROOT / "roll" / "algorithms" / "_untyped_probe.py"
    module.write_text("def f(x):\n    return x\n")
    try:
        found = mypy_baseline.findings(mypy_baseline.run_mypy([str(module.relative_to(ROOT))]))
    finally:
        module.unlink()
    assert list(found) == ["roll/algorithms/_untyped_probe.py: [no-untyped-def] Function is missing a type annotation"]
