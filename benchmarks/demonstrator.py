"""How good is the warm start's demonstrator? Per ``demo_noise``, the share of rooms it solves, played by the warm
start's own code (:func:`roll.pipelines.sft_warmup.demo_trajectory`) on the rooms it would demonstrate
(``sft_warmup.seed``), and the mean length of its solved episodes.

A demonstrator far above where the trained policy ends means the demonstrations do not hold the policy back (the
model's pace of learning does); one at the policy's level is an imperfect solver that RL has to surpass. Noise 1.0
(every move random, a room counted solved only if it ends solved) is a random policy's level.

    python benchmarks/demonstrator.py --noise 0 0.5 0.9 1.0 --rooms 600
    python benchmarks/demonstrator.py --config-name frozen_lake_tiny --noise 0 0.5 -- sft_warmup.seed=7
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def success_rates(config_name: str, noises: list[float], rooms: int, overrides: list[str]) -> list[dict]:
    """One row per noise: ``noise``, ``rooms`` (those with a plan), ``solved``, ``success``, ``mean_turns``."""
    from transformers import AutoTokenizer

    from roll.agentic.chat import ChatFormatter
    from roll.config.agentic import AgenticConfig
    from roll.config.loader import load_config
    from roll.envs import make_env
    from roll.models.tiny_vl import ensure_tiny_model_of
    from roll.pipelines.sft_warmup import NO_PLAN, demo_env, demo_seed, demo_trajectory

    cfg = load_config(config_name, None, overrides, schema=AgenticConfig)
    if cfg.tiny_model is not None:  # the formatter needs the model's tokenizer: build it as a run would
        ensure_tiny_model_of(cfg.pretrain, **vars(cfg.tiny_model))
    tag, spec, kwargs = demo_env(cfg)
    formatter = ChatFormatter(AutoTokenizer.from_pretrained(cfg.pretrain), spec.system_prompt)
    env = make_env(spec.env_type, kwargs)
    rows = []
    for noise in noises:
        solved, planned, turns = 0, 0, []
        for index in range(rooms):
            traj = demo_trajectory(env, spec, formatter, demo_seed(cfg.sft_warmup.seed, index), tag, noise=noise)
            if traj == NO_PLAN:
                continue
            planned += 1
            if not isinstance(traj, str):
                solved += 1
                turns.append(len(traj.turns))
        rows.append(
            {
                "noise": noise,
                "rooms": planned,
                "solved": solved,
                "success": solved / planned if planned else 0.0,
                "mean_turns": statistics.mean(turns) if turns else 0.0,
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0], epilog="Arguments after -- are extra Hydra overrides."
    )
    parser.add_argument("--config-name", default="sokoban_tiny")
    parser.add_argument("--noise", type=float, nargs="+", default=[0.0, 0.5, 0.9, 1.0])
    parser.add_argument("--rooms", type=int, default=600)
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args, extra = parser.parse_known_args(argv)
    bad = [n for n in args.noise if not 0 <= n <= 1]
    if bad:
        parser.error(f"--noise {bad}: each must be in [0, 1]")
    rows = success_rates(args.config_name, args.noise, args.rooms, [x for x in extra if x != "--"])
    print("| demo_noise | rooms | solved | success | turns of a solved episode |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['noise']} | {r['rooms']} | {r['solved']} | {100 * r['success']:.1f}% | {r['mean_turns']:.2f} |")
    if args.out:
        args.out.write_text(json.dumps({"config": args.config_name, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
