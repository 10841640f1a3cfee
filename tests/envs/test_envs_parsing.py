"""ActionParser on messy model text."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roll.envs.parsing import ActionParser


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<answer>Up</answer>", "Up"),
        ("I will go up. <answer>  Up \n</answer> done", "Up"),
        ("<ANSWER>left</Answer>", "left"),
        ("<answer>Right", "Right"),  # stopped at the </answer> stop string
        ("<answer>Down\n", "Down"),
        ("<answer></answer>", None),
        ("<answer>   </answer>", None),
        ("Up", None),
        ("", None),
        ("<answer>Up</answer><answer>Down</answer>", None),  # ambiguous: rejected
        ("<answer>Up <answer>Down</answer>", None),
        ("<answer>3 + (4 * 5)</answer>", "3 + (4 * 5)"),
        ("<think>go <b>up</b></think><answer>Up</answer>", "Up"),  # think tags ignored in "answer"
    ],
)
def test_answer_format(text, expected):
    assert ActionParser("answer").parse(text) == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("<think>box is above</think><answer>Up</answer>", "Up"),
        ("<think>box\nis above</think>\n  <answer>Up</answer>", "Up"),
        ("box is above</think><answer>Up</answer>", "Up"),  # <think> was in the prompt
        ("<THINK>x</THINK><answer>Left", "Left"),
        ("<answer>Up</answer>", None),  # no think block
        ("<think>x</think> so <answer>Up</answer>", None),  # text between blocks
        ("<think>unclosed <answer>Up</answer>", None),
        ("<think>maybe <answer>Up</answer></think><answer>Down</answer>", None),
        ("<think>a</think><answer>Up</answer><answer>Down</answer>", None),
    ],
)
def test_think_answer_format(text, expected):
    assert ActionParser("think_answer").parse(text) == expected


def test_multiple_policies():
    text = "<answer>Up</answer> no wait <answer>Down</answer>"
    assert ActionParser("answer", multiple="first").parse(text) == "Up"
    assert ActionParser("answer", multiple="last").parse(text) == "Down"
    with pytest.raises(ValueError, match="multiple='all'"):
        ActionParser("answer", multiple="all")


def test_custom_regex():
    parser = ActionParser(r"Action:\s*(\w+)")
    assert parser.parse("I think... Action:  Left\n") == "Left"
    assert parser.parse("no action here") is None
    assert parser.parse("Action: Up. Action: Down") is None
    assert ActionParser(r"(?i)move\s+(\w+)").parse("MOVE up") == "up"


@pytest.mark.parametrize(
    "bad, message", [("(a)(b)", "2 capture groups"), ("no group", "0 capture groups"), ("(unclosed", "neither one of")]
)
def test_bad_formats_raise(bad, message):
    with pytest.raises(ValueError, match=message):
        ActionParser(bad)


def test_non_string_is_unparseable():
    assert ActionParser().parse(None) is None  # type: ignore[arg-type]


TOKENS = st.sampled_from(["<answer>", "</answer>", "<think>", "</think>", "<ANSWER>", "Up", " ", "\n", "<", "/", "x"])


@settings(max_examples=200, deadline=None)
@given(st.lists(TOKENS, max_size=12).map("".join))
def test_parser_never_raises_and_returns_stripped_text(text):
    for fmt in ("answer", "think_answer"):
        result = ActionParser(fmt).parse(text)
        assert result is None or (result == result.strip() and result and "<answer>" not in result.lower())
