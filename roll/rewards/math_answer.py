"""Rule-based math reward: extract a final answer from a response and check it against the ground truth.

Extraction order (:func:`extract_answer`), first rule that finds something wins:

1. the **last** ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces allowed — so with several boxed answers,
   the last one counts;
2. the last GSM8K-style ``#### answer`` (to the end of its line or the next ``<``);
3. the last ``<answer>...</answer>`` block;
4. the last number in the text (``-1,234.5``, ``3/4``).

Comparison (:func:`answers_match`): both sides are normalized (:func:`normalize_answer`), then compared as
exact rationals by a small safe arithmetic parser (numbers, ``+ - * / ^``, parentheses, ``\\frac``; never
``eval``); a percent sign means "this number, or this number / 100". Anything the parser cannot read
(``\\sqrt{2}``, ``x+1``, intervals, sets) goes to math-verify in a child process with a time limit
(:mod:`roll.rewards.symbolic`).
"""

from __future__ import annotations

import re

from roll.rewards.arith import parse_number
from roll.rewards.registry import RewardResult, register_reward
from roll.rewards.symbolic import symbolic_equivalent

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_HASHES = re.compile(r"####\s*([^\n<]*)")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+")


def _last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` whose braces are balanced, or None."""
    for match in reversed(list(_BOXED.finditer(text))):
        depth, start = 1, match.end()
        for i in range(start, len(text)):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start:i].strip()
    return None


def extract_answer_with_source(text: str) -> tuple[str | None, str]:
    """Like :func:`extract_answer`, also naming the rule that found the answer.

    Returns:
        ``(answer, source)`` with source one of ``"boxed"``, ``"hashes"``, ``"answer_tag"``,
        ``"last_number"``, or ``(None, "none")``.
    """
    boxed = _last_boxed(text)
    if boxed:
        return boxed, "boxed"
    hashes = [m.strip() for m in _HASHES.findall(text)]
    if hashes and hashes[-1]:
        return hashes[-1], "hashes"
    tags = [m.strip() for m in _ANSWER_TAG.findall(text)]
    if tags and tags[-1]:
        return tags[-1], "answer_tag"
    numbers = _NUMBER.findall(text)
    if numbers:
        return numbers[-1].strip(), "last_number"
    return None, "none"


def extract_answer(text: str) -> str | None:
    """The final answer in ``text`` (see the module docstring for the order of rules), or None."""
    return extract_answer_with_source(text)[0]


_TEXT_CMD = re.compile(r"\\(?:text|textbf|mathrm|mbox)\s*\{([^{}]*)\}")
_THOUSANDS = re.compile(r"(?<![\d.])(-?\d{1,3}(?:,\d{3})+)(?![\d,])")
_REMOVE = ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\$", "$", "^\\circ", "^{\\circ}", "\\displaystyle")
_NUM_TOKEN = r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:/\d+)?%?"
_NUM_WITH_WORDS = re.compile(rf"^(?:[a-z\s.:=]*[\s:=])?({_NUM_TOKEN})(?:\s+[a-z\s.]*)?$")


def normalize_answer(s: str) -> str:
    """Canonical text form of an answer, for comparison.

    Lowercases; removes ``$``/``\\$``, ``\\left``/``\\right``, LaTeX spacing, degree signs and a trailing
    period; unwraps ``\\text{...}``; writes ``\\dfrac``/``\\tfrac`` as ``\\frac`` and ``\\%`` as ``%``;
    drops thousands separators (``1,234`` -> ``1234``); drops a leading ``x =``; and reduces
    "words around one number" (``42 apples``, ``5 dollars``, ``answer: 7``) to the number.
    Trailing zeros of decimals go (``5.0`` -> ``5``, ``2.50`` -> ``2.5``).
    """
    s = s.strip()
    s = _TEXT_CMD.sub(r"\1", s)
    for token in _REMOVE:
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac").replace("\\%", "%")
    s = _THOUSANDS.sub(lambda m: m.group(1).replace(",", ""), s)
    s = " ".join(s.lower().split()).rstrip(".").strip()
    s = re.sub(r"\s*percent\b", "%", s)
    s = re.sub(r"^[a-z]\s*=\s*", "", s)
    words = _NUM_WITH_WORDS.match(s)
    if words:
        s = words.group(1)
    s = re.sub(r"^(-?\d+)\.0*(%?)$", r"\1\2", s)  # 5.0 -> 5
    return re.sub(r"^(-?\d*\.\d*?[1-9])0+(%?)$", r"\1\2", s)  # 2.50 -> 2.5


def _numeric_candidates(s: str) -> list | None:
    """Rational values ``s`` may denote: one value, or two for a percentage (``x`` and ``x/100``)."""
    if s.endswith("%"):
        value = parse_number(s[:-1])
        return None if value is None else [value, value / 100]
    value = parse_number(s)
    return None if value is None else [value]


def answers_match(pred: str | None, truth: str, *, timeout_s: float = 1.0) -> bool:
    """Whether the predicted answer ``pred`` equals the ground truth ``truth``.

    Args:
        pred: the extracted answer (None or empty never matches).
        truth: the reference answer.
        timeout_s: time limit for the symbolic (math-verify) comparison; exceeding it counts as no match.
    """
    if pred is None or not pred.strip():
        return False
    p, t = normalize_answer(pred), normalize_answer(truth)
    if p == t:
        return True
    p_values, t_values = _numeric_candidates(p), _numeric_candidates(t)
    if p_values is not None and t_values is not None:
        return any(a == b for a in p_values for b in t_values)
    return symbolic_equivalent(p, t, timeout_s)


@register_reward("math")
def math_reward(
    response: str, ground_truth: str, *, format_reward: float = 0.0, timeout_s: float = 1.0
) -> RewardResult:
    """Score a math response: 1.0 if its final answer matches ``ground_truth``, else 0.0.

    Args:
        response: the model's full response text.
        ground_truth: the reference answer (e.g. ``"72"``, ``"\\frac{1}{2}"``).
        format_reward: bonus added when the answer is given in an explicit format (``\\boxed{}``, ``####``,
            ``<answer>``), whether or not it is correct; 0 by default.
        timeout_s: time limit for the symbolic comparison.

    Returns:
        ``RewardResult(score=correct + format_reward * format_ok, correct, extracted, format_ok)``.
    """
    extracted, source = extract_answer_with_source(response)
    format_ok = source in ("boxed", "hashes", "answer_tag")
    correct = answers_match(extracted, ground_truth, timeout_s=timeout_s)
    score = float(correct) + (format_reward if format_ok else 0.0)
    return RewardResult(score=score, correct=correct, extracted=extracted, format_ok=format_ok)
