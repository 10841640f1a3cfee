"""Tests for roll.rewards.math_answer: extraction order, normalization, matching, timeouts."""

import time

import pytest

from roll.rewards.arith import parse_number
from roll.rewards.math_answer import (
    answers_match,
    extract_answer,
    extract_answer_with_source,
    math_reward,
    normalize_answer,
)
from roll.rewards.symbolic import SymbolicVerifier

EXTRACTION_CASES = [
    ("so \\boxed{3}", "3", "boxed"),
    ("first \\boxed{3}, then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "boxed"),  # last boxed wins
    ("\\boxed{\\frac{a}{\\{b\\}}} done", "\\frac{a}{\\{b\\}}", "boxed"),  # nested braces
    ("\\boxed{7} and #### 8", "7", "boxed"),  # boxed beats ####
    ("steps...\n#### 1,234\n", "1,234", "hashes"),
    ("#### 5 \n#### 6", "6", "hashes"),
    ("#### 9 <answer>10</answer>", "9", "hashes"),  # #### beats <answer>
    ("<think>2+2</think><answer> 42 </answer>", "42", "answer_tag"),
    ("<answer>1</answer> then <answer>2</answer>", "2", "answer_tag"),
    ("I think 3 and then -7.5.", "-7.5", "last_number"),
    ("she pays 1,200 dollars", "1,200", "last_number"),
    ("no answer at all", None, "none"),
    ("\\boxed{unclosed", None, "none"),
]


@pytest.mark.parametrize("text,answer,source", EXTRACTION_CASES)
def test_extraction_order(text, answer, source):
    assert extract_answer_with_source(text) == (answer, source)
    assert extract_answer(text) == answer


MATCH_CASES = [
    # (prediction, truth, expected)
    ("1,234", "1234", True),  # thousands separator
    ("1,234,567", "1234567", True),
    ("1 234", "1234", False),  # a space is not a separator
    ("  72 ", "72", True),  # spaces
    ("\\$5", "5", True),  # dollars
    ("$5.00", "5", True),
    ("5 dollars", "5", True),  # units / words around a number
    ("42 apples", "42", True),
    ("\\text{42 apples}", "42", True),
    ("The answer is 18.", "18", True),
    ("x = 7", "7", True),
    ("2x", "2", False),  # a variable is not a unit
    ("0.5", "\\frac{1}{2}", True),  # fractions vs decimals
    ("\\dfrac{1}{2}", "1/2", True),
    ("\\tfrac{3}{4}", "0.75", True),
    ("1/3", "0.33", False),  # exact comparison: no rounding tolerance
    ("-3", "-3", True),  # negative numbers
    ("-5", "5", False),
    ("- 5", "-5", True),
    ("5.0", "5", True),  # trailing .0
    ("12.50", "12.5", True),
    ("50%", "50", True),  # percent: x or x/100
    ("50\\%", "0.5", True),
    ("50 percent", "50", True),
    ("25%", "50", False),
    ("2+3", "5", True),  # simple expressions, safe parser
    ("3 \\times 4", "12", True),
    ("2^{10}", "1024", True),
    ("4", "5", False),
    ("", "5", False),  # no answer
    ("\\sqrt{2}/2", "\\frac{\\sqrt{2}}{2}", True),  # symbolic, via math-verify
    ("x+1", "1+x", True),
    ("(1,2)", "(1, 2)", True),
]


@pytest.mark.parametrize("pred,truth,expected", MATCH_CASES)
def test_answers_match_table(pred, truth, expected):
    assert answers_match(pred, truth) is expected


def test_none_prediction_never_matches():
    assert answers_match(None, "5") is False


@pytest.mark.parametrize(
    "raw,normalized",
    [("\\$1,234.50", "1234.5"), ("\\dfrac{1}{2}", "\\frac{1}{2}"), ("5 Dollars.", "5"), ("50\\%", "50%"), ("5.", "5")],
)
def test_normalize_answer(raw, normalized):
    assert normalize_answer(raw) == normalized


@pytest.mark.parametrize(
    "text,value",
    [("1/2", (1, 2)), ("\\frac{3}{4}", (3, 4)), ("2+3*4", (14, 1)), ("-0.25", (-1, 4)), ("(1+1)^{3}", (8, 1))],
)
def test_parse_number_values(text, value):
    result = parse_number(text)
    assert (result.numerator, result.denominator) == value


@pytest.mark.parametrize("text", ["x+1", "10^{10^{10}}", "1/0", "__import__('os')", "(1", "\\frac{1}", "1" * 300])
def test_parse_number_rejects(text):
    assert parse_number(text) is None


def test_math_reward_scores_and_format_bonus():
    boxed = math_reward("so \\boxed{12}", "12", format_reward=0.1)
    assert (boxed.score, boxed.correct, boxed.extracted, boxed.format_ok) == (1.1, True, "12", True)
    loose = math_reward("it is 12", "12", format_reward=0.1)
    assert (loose.score, loose.correct, loose.format_ok) == (1.0, True, False)
    wrong = math_reward("<answer>13</answer>", "12", format_reward=0.1)
    assert (wrong.score, wrong.correct, wrong.format_ok) == (0.1, False, True)
    nothing = math_reward("I don't know", "12")
    assert (nothing.score, nothing.correct, nothing.extracted) == (0.0, False, None)


def test_pathological_input_times_out_as_no_match():
    verifier = SymbolicVerifier()
    try:
        assert verifier.equivalent("1", "1", timeout_s=30.0)  # starts the child; warm-up not timed
        start = time.monotonic()
        # sympy evaluates 10^(10^10) exactly, which runs for minutes inside C code
        assert verifier.equivalent("10^{10^{10}}+x", "1+x", timeout_s=0.5) is False
        assert time.monotonic() - start < 10.0  # generous bound: returned, did not hang for minutes
        assert verifier.timeouts == 1
        assert verifier.equivalent("x+1", "1+x", timeout_s=30.0)  # a fresh child serves the next call
    finally:
        verifier.close()
