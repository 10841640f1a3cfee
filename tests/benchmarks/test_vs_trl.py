"""benchmarks/vs_trl.py's grid: prompt lengths set by the system prompt, the overrides of a shape, pooling two
invocations' runs (hand-computed medians and ratios)."""

import argparse
import importlib.util
import json
from pathlib import Path

import pytest

_SPEC = importlib.util.spec_from_file_location("bench_vs_trl", Path(__file__).parents[2] / "benchmarks" / "vs_trl.py")
vs_trl = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(vs_trl)


@pytest.mark.parametrize("tokens", [None, 64, 128])
def test_system_prompt_sets_the_prompt_length(tiny_model_dir, tokens):
    """``None``: the shortest prompt (the template and the question, no system prompt)."""
    from transformers import AutoTokenizer

    from roll.data.rlvr_dataset import encode_prompts, load_rlvr_dataset

    examples = load_rlvr_dataset([str(vs_trl.DATA / "train.jsonl")], prompt_key="prompt")
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    longest = lambda system: max(
        map(
            len,
            encode_prompts(
                examples,
                tok,
                prompt_length=4096,  # noqa: E731
                system_prompt=system,
            )[0],
        )
    )
    want = longest(None) if tokens is None else tokens
    system, length = vs_trl.system_prompt_for(Path(tiny_model_dir), want)
    assert length == want == longest(system) and (system is None) == (tokens is None)


def _args(**kw) -> argparse.Namespace:
    base = dict(
        roll_strategy="deepspeed_train",
        prompts=8,
        group=4,
        roll_world_size=1,
        work=Path("/w"),
        steps=8,
        max_new_tokens=64,
        lr=1e-4,
        extra=[],
        prompt_tokens=128,
        system_prompt="Be brief.",
        full_length=True,
    )
    return argparse.Namespace(**{**base, **kw})


def test_shape_overrides():
    ov = vs_trl.roll_overrides(_args(), "ray", Path("/r"), 0)
    assert "system_prompt='Be brief.'" in ov and "actor_infer.generating_args.ignore_eos=true" in ov
    assert "zero_signal_patience=0" in ov and "prompt_length=128" in ov and "sequence_length=192" in ov
    assert "actor_train.training_args.per_device_train_batch_size=32" in ov and "distributed=ray" in ov
    plain = vs_trl.roll_overrides(
        _args(prompt_tokens=44, system_prompt=vs_trl.SYSTEM_PROMPT, full_length=False, max_new_tokens=16),
        "local",
        Path("/r"),
        0,
    )
    assert not any(o.startswith(("system_prompt", "zero_signal")) for o in plain) and "sequence_length=80" in plain
    assert "system_prompt=null" in vs_trl.roll_overrides(
        _args(system_prompt=None, prompt_tokens=24), "ray", Path("/r"), 0
    )


def _run(intervals, rollout=0.1):
    return {
        "intervals": intervals,
        "cpu_s_per_step": 1.0,
        "wall_s": 10.0,
        "peak_rss_gib": 1.0,
        "breakdown": {"time/rollout": rollout},
        "final": "",
    }


def test_combine_pools_the_runs_of_each_shape(tmp_path):
    def grid(ray, trl):
        return {
            "repeats": 1,
            "grid": [
                {
                    "workload": {"prompt_tokens": 24, "max_new_tokens": 16, "samples_per_prompt": 8},
                    "load_average_1min": [1.0],
                    "runs": {"roll-ray": [_run(ray)], "trl": [_run(trl)]},
                }
            ],
        }

    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(grid([0.1, 0.2, 0.3], [0.5, 0.5, 0.5])))
    b.write_text(json.dumps(grid([0.4, 0.5, 0.6], [0.7, 0.8, 0.9])))
    out = vs_trl.combine([a, b])
    shape = out["grid"][0]
    # pooled intervals: roll 0.1..0.6 -> median 0.35; TRL 0.5, 0.5, 0.5, 0.7, 0.8, 0.9 -> median 0.6
    assert shape["sides"]["roll-ray"]["s_per_step"]["median"] == pytest.approx(0.35)
    assert shape["sides"]["trl"]["s_per_step"]["median"] == pytest.approx(0.6)
    assert shape["sides"]["roll-ray"]["ratio_to_trl"] == pytest.approx(0.35 / 0.6)
    assert out["repeats"] == 2 and len(shape["runs"]["trl"]) == 2
    table = vs_trl.grid_report(out)
    # fastest runs' medians: roll 0.2 (first run), TRL 0.5 (first run): 0.40
    assert "| 24 x 16 x 8 | 0.600 | 0.350 (0.58) | - | 0.40 | 0.100 / 0.500, 0.100 / 0.250 | - |" in table


def test_losing_phase_is_where_roll_spends_most_beyond_trl():
    def side(step, rollout):
        return {"s_per_step": {"median": step}, "breakdown": {"time/rollout": rollout}}

    # roll 0.5 = 0.1 rollout + 0.4 rest; TRL 0.5 = 0.3 + 0.2: roll loses 0.2 s in the rest, gains 0.2 in rollout
    assert vs_trl.losing_phase(side(0.5, 0.1), side(0.5, 0.3)) == "rest"
    assert vs_trl.losing_phase(side(0.5, 0.45), side(0.5, 0.3)) == "rollout"


def test_results_record_run_folders_relative_to_the_repository(tmp_path):
    """A results file names no machine's absolute path: a run folder inside the checkout is recorded relative to it
    (and read back from there), one outside it as given."""
    inside = vs_trl.ROOT / "output" / "vs_trl" / "runs" / "roll-ray-0" / "final"
    assert vs_trl.repo_path(inside) == "output/vs_trl/runs/roll-ray-0/final"
    assert vs_trl.ROOT / vs_trl.repo_path(inside) == inside
    assert vs_trl.repo_path(tmp_path / "final") == str((tmp_path / "final").resolve())
