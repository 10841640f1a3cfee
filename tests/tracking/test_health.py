"""The run-health rules, each driven by a synthetic metric stream: silent while healthy, one line (the reading, the
likely cause, the action) on the step it fires, one when it recovers, ``health/<rule>`` and ``health/alerts`` per
step, the events in ``health.jsonl``; bounds set to null turn a rule off; the state survives a checkpoint."""

from __future__ import annotations

import dataclasses
import io
import json
import math

import pytest

from roll.config.health import RunHealthConfig
from roll.tracking.health import HEALTH_FILE, HEALTH_RULES, RunHealth, read_events

#: rule -> (metric, a healthy value, an unhealthy value, the reading's words for it at the default bound)
RANGE_RULES = {
    "approx_kl": ("actor/approx_kl", 0.01, 0.12, "0.12 > 0.05"),
    "ref_kl": ("actor/ref_kl", 0.1, 0.8, "0.8 > 0.5"),
    "grad_norm": ("actor/grad_norm", 1.0, 25.0, "25 > 10"),
    "clip_frac": ("actor/clip_frac", 0.05, 0.5, "0.5 > 0.3"),
    "entropy_collapse": ("actor/entropy", 2.0, 0.1, "0.1 < 0.1 x its first value 2"),
    "zero_signal": ("rollout/zero_signal_frac", 0.25, 0.75, "0.75 > 0.5"),
    "logprob_mismatch": ("rollout/logprob_mismatch", 0.001, 0.5, "0.5 > 0.02"),
    "truncation": ("rollout/truncated_by_length", 0.0, 0.5, "0.5 > 0.2"),
}


def drive(health: RunHealth, stream: list[dict[str, float]], first_step: int = 1) -> list[dict[str, float]]:
    return [health(step, metrics) for step, metrics in enumerate(stream, start=first_step)]


def test_every_rule_is_tested_here_and_reads_a_bound_of_the_config():
    assert sorted([*RANGE_RULES, "val_stalled"]) == HEALTH_RULES.names()
    fields = {f.name for f in dataclasses.fields(RunHealthConfig)} - {"enabled"}
    assert sorted(HEALTH_RULES.capabilities(n)["bound"] for n in HEALTH_RULES.names()) == sorted(fields)
    for name in HEALTH_RULES.names():
        caps = HEALTH_RULES.capabilities(name)
        assert caps["metrics"] and caps["cause"] and caps["action"] and caps["steps"] >= 1, name
        assert "Default" in HEALTH_RULES.get(name).__doc__, f"{name}: say where the default comes from"


@pytest.mark.parametrize("name", sorted(RANGE_RULES))
def test_a_range_rule_fires_after_its_steps_once_and_recovers_once(name, tmp_path):
    key, good, bad, words = RANGE_RULES[name]
    out = io.StringIO()
    health = RunHealth(RunHealthConfig(), tmp_path, stream=out)
    # steps 1-2 healthy, 3-6 out of range (fires at the 3rd: step 5), 7 healthy again
    flags = drive(health, [{key: v} for v in (good, good, bad, bad, bad, bad, good)])
    assert [f[f"health/{name}"] for f in flags] == [0, 0, 0, 0, 1, 1, 0]
    assert [f["health/alerts"] for f in flags] == [0, 0, 0, 0, 1, 1, 0]
    lines = out.getvalue().splitlines()
    caps = HEALTH_RULES.capabilities(name)
    assert lines == [
        f"[roll] health: step 5: {key} {words} for 3 steps: {caps['cause']}; {caps['action']} "
        f"(run_health.{caps['bound']})",
        f"[roll] health: step 7: {key} back in range ({good:.3g}): {name} recovered",
    ]
    events = read_events(tmp_path / HEALTH_FILE)
    assert [(e["step"], e["rule"], e["event"], e["metric"], e["value"]) for e in events] == [
        (5, name, "fired", key, bad),
        (7, name, "recovered", key, good),
    ]
    assert [e["line"] for e in events] == lines


@pytest.mark.parametrize("name", sorted(set(RANGE_RULES) - {"entropy_collapse"}))
def test_the_bound_itself_is_healthy(name):
    key = RANGE_RULES[name][0]
    bound = getattr(RunHealthConfig(), HEALTH_RULES.capabilities(name)["bound"])
    flags = drive(RunHealth(RunHealthConfig(), stream=io.StringIO()), [{key: bound}] * 5)
    assert [f[f"health/{name}"] for f in flags] == [0] * 5


def test_an_interrupted_streak_starts_again():
    health = RunHealth(RunHealthConfig(), stream=io.StringIO())
    flags = drive(health, [{"actor/approx_kl": v} for v in (0.1, 0.1, 0.01, 0.1, 0.1, 0.1)])
    assert [f["health/approx_kl"] for f in flags] == [0, 0, 0, 0, 0, 1]


def test_entropy_is_read_against_its_first_value():
    health = RunHealth(RunHealthConfig(), stream=io.StringIO())
    # 0.3 is a collapse for a run that started at 5 (< 0.5), not for one that started at 0.4
    assert [
        f["health/entropy_collapse"] for f in drive(health, [{"actor/entropy": v} for v in (5, 0.3, 0.3, 0.3)])
    ] == [
        0,
        0,
        0,
        1,
    ]
    other = RunHealth(RunHealthConfig(), stream=io.StringIO())
    assert [
        f["health/entropy_collapse"] for f in drive(other, [{"actor/entropy": v} for v in (0.4, 0.3, 0.3, 0.3)])
    ] == [0] * 4


def test_validation_stall_counts_evaluations_since_the_best(tmp_path):
    """The step-0 evaluation (the warm start's level) is the first best; steps without validation do not count."""
    out = io.StringIO()
    health = RunHealth(RunHealthConfig(), tmp_path, stream=out)
    stream = {0: 0.5, 10: 0.5, 15: None, 20: 0.45, 30: 0.49, 40: 0.55, 50: 0.5}
    flags = {
        step: health(step, {} if v is None else {"val/success_rate": v, "actor/approx_kl": 0.0})
        for step, v in stream.items()
    }
    assert {s: f.get("health/val_stalled") for s, f in flags.items()} == {
        0: 0,
        10: 0,
        15: None,  # no reading at this step: no flag
        20: 0,
        30: 1,  # 3 evaluations since the best (0.5 at step 0; an equal value is no new best)
        40: 0,  # a new best
        50: 0,
    }
    assert out.getvalue().splitlines() == [
        "[roll] health: step 30: val/success_rate 0.49, no new best (0.5 at step 0) in 3 evaluations: "
        + f"{HEALTH_RULES.capabilities('val_stalled')['cause']}; {HEALTH_RULES.capabilities('val_stalled')['action']} "
        "(run_health.val_stall_evals)",
        "[roll] health: step 40: val/success_rate back in range (0.55): val_stalled recovered",
    ]
    summary = health.summary()
    assert "1 rule(s) fired: val_stalled at step 30;" in summary
    assert "validation success 0.5 at the start, best 0.55 at step 40, 0.5 at step 50 (the end)" in summary


def test_rlvr_metric_names_are_read_too():
    health = RunHealth(RunHealthConfig(), stream=io.StringIO())
    flags = drive(health, [{"rollout/truncated_rate": 0.9, "val/accuracy": 0.0}] * 4)
    assert [f["health/truncation"] for f in flags] == [0, 0, 1, 1]
    assert [f["health/val_stalled"] for f in flags] == [0, 0, 0, 1]
    assert flags[-1]["health/alerts"] == 2


def test_null_bounds_turn_rules_off_and_disabled_checks_nothing():
    cfg = RunHealthConfig(approx_kl_max=None)
    flags = drive(RunHealth(cfg, stream=io.StringIO()), [{"actor/approx_kl": 1.0, "actor/clip_frac": 0.9}] * 3)
    assert "health/approx_kl" not in flags[-1] and flags[-1]["health/clip_frac"] == 1
    off = RunHealth(RunHealthConfig(enabled=False), stream=io.StringIO())
    assert drive(off, [{"actor/approx_kl": 1.0}] * 3) == [{}, {}, {}]
    assert off.summary() == "[roll] health: run_health.enabled=false, not checked"


def test_non_finite_readings_are_skipped():
    """A NaN gradient norm is max_skipped_updates' case; it neither fires nor breaks a streak here."""
    health = RunHealth(RunHealthConfig(), stream=io.StringIO())
    flags = drive(health, [{"actor/grad_norm": v} for v in (20.0, math.nan, 20.0, math.inf, 20.0)])
    assert [f.get("health/grad_norm") for f in flags] == [0, None, 0, None, 1]


def test_the_state_goes_through_a_checkpoint_and_the_file_is_rewound(tmp_path):
    health = RunHealth(RunHealthConfig(), tmp_path, stream=io.StringIO())
    drive(health, [{"actor/approx_kl": 0.1, "actor/entropy": 4.0}] * 2)  # steps 1, 2: two readings out of range
    saved = json.loads(json.dumps(health.state_dict()))  # plain data (a checkpoint's pipeline.pt)
    drive(health, [{"actor/approx_kl": 0.1}] * 3, first_step=3)  # fires at step 3: the run dies after step 5
    assert [e["step"] for e in read_events(tmp_path / HEALTH_FILE)] == [3]

    resumed = RunHealth(RunHealthConfig(), tmp_path, stream=io.StringIO())
    resumed.rewind(2)  # resume from the step-2 checkpoint: step 3's event is replayed
    resumed.load_state_dict(saved)
    assert read_events(tmp_path / HEALTH_FILE) == []
    again = drive(resumed, [{"actor/approx_kl": 0.1, "actor/entropy": 0.2}], first_step=3)
    assert again[0]["health/approx_kl"] == 1  # the streak went on from the checkpoint
    assert again[0]["health/entropy_collapse"] == 0  # one reading below a tenth of the first value (4.0) so far
    assert [(e["step"], e["rule"]) for e in read_events(tmp_path / HEALTH_FILE)] == [(3, "approx_kl")]
    assert "approx_kl at step 3 (still firing)" in resumed.summary()
    fresh = RunHealth(RunHealthConfig(), tmp_path, stream=io.StringIO())
    fresh.rewind(0)  # a new run in the same logging_dir
    assert read_events(tmp_path / HEALTH_FILE) == []
    assert fresh.summary() == "[roll] health: no rule left its healthy range"


def test_the_docs_table_names_every_rule_and_its_key():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "tracking.md").read_text()
    section = text.split("## Run health", 1)[1]
    for name in HEALTH_RULES.names():
        caps = HEALTH_RULES.capabilities(name)
        default = getattr(RunHealthConfig(), caps["bound"])
        assert f"| `{name}` |" in section and f"`{caps['bound']}`, {default:g} |" in section, name
