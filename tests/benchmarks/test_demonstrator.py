"""benchmarks/demonstrator.py: the warm start's demonstrator, played by the warm start's own code, solves every room
without noise (in exactly its plan's moves) and fewer, in longer episodes, as its moves turn random."""

import importlib.util
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
_SPEC = importlib.util.spec_from_file_location("bench_demonstrator", ROOT / "benchmarks" / "demonstrator.py")
demonstrator = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(demonstrator)


def test_noise_lowers_the_demonstrators_success_and_lengthens_its_episodes(tmp_path):
    overrides = [f"pretrain={tmp_path / 'model'}", "tiny_model.hidden_size=32", "tiny_model.num_hidden_layers=1"]
    rows = demonstrator.success_rates("sokoban_tiny", [0.0, 0.5, 1.0], 60, overrides)
    exact, noisy, random_ = rows
    assert exact["rooms"] == noisy["rooms"] == random_["rooms"] == 60  # every 6x6 room of the seed has a plan
    assert exact["solved"] == 60
    assert 0 < random_["success"] < noisy["success"] < 1.0
    assert noisy["mean_turns"] > exact["mean_turns"]

    # without noise the demonstrator plays the solver's plan, move for move: its episodes are the plans' lengths
    from roll.config.agentic import AgenticConfig
    from roll.config.loader import load_config
    from roll.envs import make_env
    from roll.pipelines.sft_warmup import demo_env, demo_seed

    cfg = load_config("sokoban_tiny", None, overrides, schema=AgenticConfig)
    _, spec, kwargs = demo_env(cfg)
    env = make_env(spec.env_type, kwargs)
    lengths = []
    for index in range(60):
        env.reset(seed=demo_seed(cfg.sft_warmup.seed, index))
        lengths.append(len(env.solution()))
    assert exact["mean_turns"] == pytest.approx(statistics.mean(lengths))


def test_a_noise_outside_0_1_is_refused(capsys):
    with pytest.raises(SystemExit):
        demonstrator.main(["--noise", "1.5"])
    assert "--noise [1.5]: each must be in [0, 1]" in capsys.readouterr().err
