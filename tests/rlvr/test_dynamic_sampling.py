"""Dynamic sampling: group filters, the refilling loop (hand-computed rounds) and the prompt stream."""

from dataclasses import dataclass

import pytest

from roll.config.rlvr import DynamicSamplingConfig
from roll.pipelines.dynamic_sampling import PromptSampler, collect_groups, filter_reason, group_stats


@dataclass
class G:
    index: int
    scores: list


@pytest.mark.parametrize(
    "scores, cfg, expected",
    [
        ([1, 1, 1, 1], DynamicSamplingConfig(enabled=True), "all_equal"),
        ([0, 0, 0, 0], DynamicSamplingConfig(enabled=True), "all_equal"),
        ([0, 1, 0, 0], DynamicSamplingConfig(enabled=True), None),
        ([1, 1, 1, 1], DynamicSamplingConfig(enabled=True, drop_all_equal=False), None),
        # mean 0.25, population std sqrt(3)/4 = 0.433
        ([0, 1, 0, 0], DynamicSamplingConfig(enabled=True, std_min=0.44), "std_low"),
        ([0, 1, 0, 0], DynamicSamplingConfig(enabled=True, std_min=0.43), None),
        ([0, 1, 0, 0], DynamicSamplingConfig(enabled=True, mean_low=0.3), "mean_low"),
        ([0, 1, 1, 1], DynamicSamplingConfig(enabled=True, mean_high=0.7), "mean_high"),
        ([0, 1, 1, 1], DynamicSamplingConfig(enabled=True, mean_low=0.75, mean_high=0.75), None),
    ],
)
def test_filter_reason(scores, cfg, expected):
    assert filter_reason(scores, cfg) == expected


def test_group_stats_population_std():
    mean, std = group_stats([0.0, 1.0, 0.0, 0.0])
    assert mean == 0.25 and std == pytest.approx(0.4330127, abs=1e-6)


def make_round(pattern):
    """run_round over a fixed stream of groups: pattern[i] True = mixed rewards (kept), False = all equal."""
    state = {"next": 0, "asks": []}

    def run_round(k):
        state["asks"].append(k)
        out = [G(i, [0.0, 1.0] if pattern[i] else [1.0, 1.0]) for i in range(state["next"], state["next"] + k)]
        state["next"] += k
        return out

    return run_round, state


def test_disabled_is_one_round_without_metrics():
    run_round, state = make_round([False] * 8)
    groups, metrics = collect_groups(4, run_round, DynamicSamplingConfig(enabled=False), True, 16)
    assert [g.index for g in groups] == [0, 1, 2, 3] and metrics == {} and state["asks"] == [4]


def test_refill_rounds_follow_keep_rate():
    # round 1: 4 prompts, 2 kept (keep rate 1/2) -> missing 2 -> ask ceil(2 * 4 / 2) = 4 -> 3 more kept, 1 surplus
    pattern = [True, False, True, False, True, True, True, False]
    run_round, state = make_round(pattern)
    groups, m = collect_groups(4, run_round, DynamicSamplingConfig(enabled=True), True, 16)
    assert state["asks"] == [4, 4]
    assert [g.index for g in groups] == [0, 2, 4, 5]
    assert m["dynamic_sampling/rounds"] == 2 and m["dynamic_sampling/prompts_drawn"] == 8
    assert m["dynamic_sampling/additional_prompts"] == 4
    assert m["dynamic_sampling/groups_filtered"] == 3 and m["dynamic_sampling/filtered_all_equal"] == 3
    assert m["dynamic_sampling/surplus_discarded"] == 1 and m["dynamic_sampling/filled_with_filtered"] == 0
    assert m["dynamic_sampling/kept_ratio"] == 5 / 8


def test_budget_limit_fills_with_filtered_groups():
    # nothing is ever kept: round 1 asks 4, round 2 the whole budget left (max_additional = 3), then fill
    run_round, state = make_round([False] * 20)
    groups, m = collect_groups(4, run_round, DynamicSamplingConfig(enabled=True), True, 3)
    assert state["asks"] == [4, 3]
    assert len(groups) == 4 and [g.index for g in groups] == [0, 1, 2, 3]  # equal std: draw order
    assert m["dynamic_sampling/filled_with_filtered"] == 4 and m["dynamic_sampling/additional_prompts"] == 3


def test_fill_prefers_highest_std():
    cfg = DynamicSamplingConfig(enabled=True, std_min=0.45)
    fixed = [G(0, [0, 0, 0, 1]), G(1, [0, 0, 1, 1]), G(2, [1, 1, 1, 1]), G(3, [0, 1, 1, 1])]
    groups, m = collect_groups(2, lambda k: fixed[:k] if k == 2 else [], cfg, False, 16)
    # group 1 (std 0.5) passes; group 0 (std 0.433) fills the gap
    assert [g.index for g in groups] == [1, 0]
    assert m["dynamic_sampling/filtered_std_low"] == 1 and m["dynamic_sampling/filled_with_filtered"] == 1


def test_without_additional_prompts_only_one_round():
    run_round, state = make_round([True, False, False, False, True])
    groups, m = collect_groups(4, run_round, DynamicSamplingConfig(enabled=True), False, 16)
    assert state["asks"] == [4] and len(groups) == 4 and groups[0].index == 0
    assert m["dynamic_sampling/filled_with_filtered"] == 3


def test_prompt_sampler_epochs_and_resume():
    s = PromptSampler(5, seed=3)
    first = s.draw(3) + s.draw(4)  # crosses into epoch 1
    assert sorted(first[:5]) == [0, 1, 2, 3, 4] and s.epoch == 1 and s.position == 2
    again = PromptSampler(5, seed=3)
    assert again.draw(7) == first
    state = s.state_dict()
    later = s.draw(6)
    resumed = PromptSampler(5, seed=3)
    resumed.load_state_dict(state)
    assert resumed.draw(6) == later
