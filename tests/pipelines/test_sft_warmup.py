"""The SFT warm start writes demonstrations in the env's own action format (answer and think_answer): the trained
response tokens decode to text the env parses back to the solver's action, and every demonstration is solved."""

import pytest

from roll.config.agentic import CustomEnvConfig
from roll.envs.parsing import ActionParser
from roll.models.loading import load_tokenizer
from roll.pipelines.sft_warmup import make_demo_batches

SPEC = CustomEnvConfig(
    env_type="sokoban",
    env_config={"dim_room": [6, 6], "num_boxes": 1, "max_steps": 10, "max_solution_length": 6},
    max_actions_per_traj=10,
    max_tokens_per_step=24,
    system_prompt="You are a Sokoban player.",
)


@pytest.mark.parametrize(
    "action_format, pattern",
    [("answer", "<answer>{}</answer>"), ("think_answer", "<think></think><answer>{}</answer>")],
)
def test_demonstrations_use_the_env_action_format(tiny_model_dir, action_format, pattern):
    tokenizer = load_tokenizer(tiny_model_dir)
    kwargs = {**SPEC.env_config, "action_format": action_format}
    batches = make_demo_batches(SPEC, kwargs, tokenizer, "S", num_demos=4, batch_size=4, steps=1, seed=1)
    batch, parser = batches[0], ActionParser(action_format)
    assert all(batch["success"])
    replies = 0
    for ids, mask in zip(batch["input_ids"], batch["response_mask"]):
        trained = ids[mask.bool()].tolist()  # every turn's reply tokens (the end-of-turn token included)
        text = tokenizer.decode(trained, skip_special_tokens=False)
        for reply in text.split(tokenizer.eos_token)[:-1]:
            action = parser.parse(reply)
            assert action in ("Up", "Down", "Left", "Right") and reply == pattern.format(action)
            replies += 1
    assert replies >= 4


def test_render_round_trips_and_custom_formats_have_none():
    for fmt in ("answer", "think_answer"):
        parser = ActionParser(fmt)
        assert parser.parse(parser.render("Left")) == "Left"
    assert ActionParser("think_answer").render("Up", thought="push") == "<think>push</think><answer>Up</answer>"
    with pytest.raises(ValueError, match="custom regex"):
        ActionParser(r"Action: (\w+)").render("Up")


def test_no_demonstration_says_why(tiny_model_dir):
    """A solver whose plan never reaches success is told so (not "does it implement solution()?"); a plan longer
    than max_actions_per_traj is counted apart."""
    from roll.envs.registry import register_env, unregister_env
    from tests.agentic.helpers import FlakyEnv

    class Unsolved(FlakyEnv):
        def solution(self):
            return ["go"] * 2 if (self.np_random_seed or 0) % 2 else ["go"] * 9  # never a success; some too long

    register_env("unsolved_test", Unsolved)
    try:
        spec = CustomEnvConfig(env_type="unsolved_test", max_actions_per_traj=4, max_tokens_per_step=8)
        with pytest.raises(RuntimeError) as info:
            make_demo_batches(spec, {}, load_tokenizer(tiny_model_dir), "U", num_demos=4, batch_size=4, steps=1, seed=1)
    finally:
        unregister_env("unsolved_test")
    message = str(info.value)
    assert message.startswith("sft_warmup: env 'unsolved_test' gave no demonstration from 20 seeds (")
    assert "the plan did not reach success" in message and "the plan was longer than max_actions_per_traj" in message
    assert "max_actions_per_traj=4)" in message and "implement solution" not in message


def replayed_deviations(tokenizer, noise: float, demos: int = 120) -> tuple[int, int, int]:
    """(turns, turns whose move is not the solver's first move from that state, demonstrations) of ``demos`` seeds'
    demonstrations, replayed in a fresh env."""
    from roll.agentic.chat import ChatFormatter
    from roll.envs import make_env
    from roll.pipelines.sft_warmup import demo_trajectory

    kwargs = dict(SPEC.env_config)
    env, replay = make_env("sokoban", kwargs), make_env("sokoban", kwargs)
    formatter, parser = ChatFormatter(tokenizer, SPEC.system_prompt), ActionParser("answer")
    turns = off_plan = kept = 0
    for seed in range(demos):
        traj = demo_trajectory(env, SPEC, formatter, seed, "S", noise=noise)
        if isinstance(traj, str):
            continue
        kept += 1
        replay.reset(seed=seed)
        for turn in traj.turns:
            action = parser.parse(tokenizer.decode(turn.response_ids[:-1]))  # the end-of-turn token left out
            off_plan += action != replay.solution()[0]
            turns += 1
            *_, info = replay.step(parser.render(action))
        assert info["success"]  # every kept demonstration solves its room, detours included
    return turns, off_plan, kept


def test_imperfect_demonstrator_detours_at_its_rate(tiny_model_dir):
    """``demo_noise`` p: before each move the demonstrator takes a random move with probability p (a quarter of
    them happen to be the plan's move), then plans again. Replayed, the demonstrations leave the solver's plan on
    about 3p/4 of their turns (fewer, since detours that lose the room are not kept); p = 0 never does."""
    tokenizer = load_tokenizer(tiny_model_dir)
    turns, off_plan, kept = replayed_deviations(tokenizer, 0.0)
    assert off_plan == 0 and kept == 120 and turns > 120
    turns, off_plan, kept = replayed_deviations(tokenizer, 0.5)
    assert 0.2 < off_plan / turns < 0.375, off_plan / turns
    assert 80 < kept < 120  # some detours lose the room (a box pushed into a corner): those seeds give none


def test_demo_noise_is_checked_before_any_worker():
    from roll.config.agentic import AgenticConfig
    from roll.config.errors import ConfigError
    from roll.config.loader import load_config

    with pytest.raises(ConfigError, match=r"sft_warmup.demo_noise=1.0.*\[0, 1\)"):
        load_config("sokoban_tiny", None, ["sft_warmup.demo_noise=1.0"], schema=AgenticConfig)


@pytest.mark.parametrize("mode", ["traj", "step"])
def test_fresh_turn_prompts_are_demonstrated_as_rollouts_see_them(tiny_model_dir, mode):
    """With ``turn_prompt: fresh`` (ROLL's step prompts) each later turn is a new conversation, system + the turn
    template with ``{history}`` (the last turn: its observation, action and reward), that starts a sample; the
    batch has one sample per turn and is one optimizer step (its sample count varies with the turns). With the
    default (append) the turns are deltas and an episode is one sample."""
    from dataclasses import replace

    from roll.agentic.chat import ChatFormatter

    tokenizer = load_tokenizer(tiny_model_dir)
    spec = replace(
        SPEC, turn_prompt="fresh", trajectory_mode=mode, turn_template="{history}\n{observation}", history_length=2
    )
    sizes = dict(num_demos=3, batch_size=3, steps=1, seed=42)
    batches = make_demo_batches(spec, dict(spec.env_config), tokenizer, "S", **sizes)
    formatter, parser = ChatFormatter(tokenizer, spec.system_prompt), ActionParser("answer")
    turns = 0
    for traj in batches.demos:
        first, *later = traj.turns
        assert not first.starts_sample and all(t.starts_sample for t in later)
        for before, turn in zip(traj.turns, later):
            action = parser.parse(tokenizer.decode(before.response_ids[:-1]))
            history = f"(step: {len(traj.turns[: traj.turns.index(turn)])}, observation: {before.observation}, "
            history += f"action: {action}, reward: {before.reward})"
            assert turn.prompt_ids == formatter.first_prompt(f"{history}\n{turn.observation}")
        turns += len(traj.turns)
    batch = batches[0]
    assert turns == 8 and len(batch) == turns and batch.info.get("one_optimizer_step") is True

    appended = make_demo_batches(SPEC, dict(SPEC.env_config), tokenizer, "S", **sizes)
    assert len(appended[0]) == 3 and "one_optimizer_step" not in appended[0].info
    assert not any(t.starts_sample for traj in appended.demos for t in traj.turns)


@pytest.mark.parametrize("turn_prompt", ["append", "fresh"])
def test_later_demonstrated_turns_show_the_env_instruction(tiny_model_dir, turn_prompt):
    """A turn template with ``{instruction}`` shows the env's instruction in every demonstrated turn, as rollouts
    show it (:func:`roll.agentic.chat.next_turn`; the warm start once left it empty after the first turn)."""
    from dataclasses import replace

    from roll.agentic.chat import ChatFormatter
    from roll.envs import make_env

    tokenizer = load_tokenizer(tiny_model_dir)
    spec = replace(SPEC, turn_template="{instruction}|{observation}", turn_prompt=turn_prompt)
    _, info = make_env(spec.env_type, dict(spec.env_config)).reset(seed=0)
    instruction = info["env_instruction"]
    assert instruction
    batches = make_demo_batches(spec, dict(spec.env_config), tokenizer, "S", num_demos=2, batch_size=2, steps=1, seed=3)
    formatter = ChatFormatter(tokenizer, spec.system_prompt)
    later = [turn for traj in batches.demos for turn in traj.turns[1:]]
    assert later
    for turn in later:
        text = f"{instruction}|{turn.observation}"
        expected = formatter.first_prompt(text) if turn_prompt == "fresh" else formatter.turn_delta(text)
        assert turn.prompt_ids == expected
