"""The run-health check inside a real run (the RLVR pipeline, tiny model, local mode): a rule whose bound every step
breaks fires at its third step with one line, the metrics, health.jsonl and metrics.png carry it, and the run ends
with the health summary; ``run_health.enabled=false`` logs no health key."""

from __future__ import annotations

import json

import pytest

from roll.tracking.health import HEALTH_FILE, read_events
from tests.pipelines.test_async_k0_unchanged import REPO, run

pytestmark = pytest.mark.slow


def records(path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        out.setdefault(record.pop("step"), {}).update(record)
    return out


def test_a_rule_fires_in_a_run_and_the_run_says_so(tmp_path, capfd):
    # any non-zero gradient is above this bound: the rule is out of range on every step, whatever the machine
    metrics = run(REPO, "rlvr", tmp_path, "run_health.grad_norm_max=1e-9")
    out, err = capfd.readouterr()
    fired = [line for line in err.splitlines() if line.startswith("[roll] health:") and "grad_norm" in line]
    assert len(fired) == 1 and fired[0].startswith("[roll] health: step 3: actor/grad_norm ")
    assert "> 1e-09 for 3 steps: loss spikes" in fired[0] and fired[0].endswith("(run_health.grad_norm_max)")
    steps = records(metrics)
    assert [steps[s]["health/grad_norm"] for s in (1, 2, 3)] == [0.0, 0.0, 1.0]
    assert steps[3]["health/alerts"] >= 1.0 and steps[0]["health/alerts"] == 0.0  # step 0: the first validation
    assert 0.0 <= steps[1]["rollout/zero_signal_frac"] <= 1.0
    events = read_events(metrics.parent / HEALTH_FILE)
    assert [(e["step"], e["rule"], e["event"]) for e in events if e["rule"] == "grad_norm"] == [
        (3, "grad_norm", "fired")
    ]
    assert "grad_norm at step 3 (still firing)" in out and "validation success 0 at the start" in out
    assert (metrics.parent / "metrics.png").is_file()


def test_disabled_health_logs_no_health_key(tmp_path, capfd):
    metrics = run(REPO, "rlvr", tmp_path, "run_health.enabled=false", "run_health.grad_norm_max=1e-9")
    assert not any(k.startswith("health/") for step in records(metrics).values() for k in step)
    assert "[roll] health: step" not in capfd.readouterr().err
    assert not (metrics.parent / HEALTH_FILE).exists()
