"""The SFT warm start writes demonstrations in the env's own action format (answer and think_answer): the trained
response tokens decode to text the env parses back to the solver's action, and every demonstration is solved."""

import pytest

from roll.config.agentic import CustomEnvConfig
from roll.envs.parsing import ActionParser
from roll.models.loading import load_tokenizer
from roll.pipelines.sft_warmup import make_demo_batches

SPEC = CustomEnvConfig(env_type="sokoban", env_config={"dim_room": [6, 6], "num_boxes": 1, "max_steps": 10,
                                                        "max_solution_length": 6},
                       max_actions_per_traj=10, max_tokens_per_step=24, system_prompt="You are a Sokoban player.")


@pytest.mark.parametrize("action_format, pattern", [("answer", "<answer>{}</answer>"),
                                                    ("think_answer", "<think></think><answer>{}</answer>")])
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
