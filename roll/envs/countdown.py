"""Countdown: combine given numbers with + - * / to reach a target.

Answers are checked without ``eval``: the text is parsed with :mod:`ast`, only integer literals,
the four binary operators and parentheses are accepted, and the tree is evaluated exactly with
:class:`fractions.Fraction`.
"""

from __future__ import annotations

import ast
import operator
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from typing import Any

import numpy as np

from roll.envs.base import TextEnv, Transition
from roll.envs.registry import register_env

_OPS: dict[type, tuple[str, Callable[[Fraction, Fraction], Fraction]]] = {
    ast.Add: ("+", operator.add),
    ast.Sub: ("-", operator.sub),
    ast.Mult: ("*", operator.mul),
    ast.Div: ("/", operator.truediv),
}
#: Longest answer accepted, in characters (bounds parsing work).
MAX_EXPRESSION_CHARS = 200


def parse_expression(text: str) -> ast.expr | None:
    """The AST of ``text`` if it is only integers, + - * / and parentheses, else ``None``.

    A trailing ``= value`` (``"(3 + 5) * 2 = 16"``) is ignored.
    """
    text = text.split("=", 1)[0].strip()
    if not text or len(text) > MAX_EXPRESSION_CHARS:
        return None
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            continue
        if isinstance(node, ast.Constant) and type(node.value) is int and node.value >= 0:
            continue
        if isinstance(node, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
            continue
        return None
    return tree


def leaves(tree: ast.expr) -> list[int]:
    """The integer literals of a tree accepted by :func:`parse_expression`, left to right."""
    if isinstance(tree, ast.BinOp):
        return leaves(tree.left) + leaves(tree.right)
    assert isinstance(tree, ast.Constant)
    return [tree.value]


def evaluate(tree: ast.expr) -> Fraction:
    """Exact value of a tree accepted by :func:`parse_expression`. Raises ZeroDivisionError."""
    if isinstance(tree, ast.Constant):
        return Fraction(tree.value)
    assert isinstance(tree, ast.BinOp)
    return _OPS[type(tree.op)][1](evaluate(tree.left), evaluate(tree.right))


@register_env("countdown")
class CountdownEnv(TextEnv):
    """Make the target number from the given numbers with +, -, * and / (each number at most once).

    Action space:
        Model text whose answer is an arithmetic expression such as ``(25 - 5) * 3`` (integers,
        ``+ - * /``, parentheses; a trailing ``= 60`` is ignored). No unary minus, no other syntax.

    Observation space:
        ``"Numbers: 3 7 25 50\\nTarget: 71"``; after a wrong answer with retries left, a feedback line
        (``"Wrong: ..."``) followed by the task.

    Starting state:
        ``num_numbers`` integers in ``[min_number, max_number]`` and a target in ``[1, max_target]``
        built by combining all of them in a random expression, so a solution always exists.

    Rewards:
        1 for an expression that equals the target and uses only given numbers, each at most once
        (all of them exactly once with ``use_all_numbers``); 0 for any other expression;
        ``format_penalty`` for an answer that is missing or not such an expression.

    Episode end:
        Terminated on a correct answer (``success=True``) or when ``max_steps`` answers (default 1:
        single turn) are used up: the answer budget is a rule of the task, not a time limit, so it
        terminates rather than truncates (``max_steps_terminates = True``).

    Info:
        The base keys, plus ``value`` (the answer's value as a string, or None on division by zero)
        after a valid answer.

    Args:
        num_numbers: how many numbers are given (2..6).
        min_number, max_number: range of the given numbers.
        max_target: largest target.
        use_all_numbers: require every number to be used exactly once.
        max_steps: answers per episode; more than 1 allows retries after feedback.
        format_penalty, action_format, render_mode: see :class:`~roll.envs.base.TextEnv`.
    """

    max_steps_terminates = True

    def __init__(
        self,
        num_numbers: int = 4,
        min_number: int = 1,
        max_number: int = 100,
        max_target: int = 1000,
        use_all_numbers: bool = False,
        max_steps: int = 1,
        format_penalty: float = -0.1,
        action_format: str = "answer",
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            max_steps=max_steps, format_penalty=format_penalty, action_format=action_format, render_mode=render_mode
        )
        if not 2 <= num_numbers <= 6:
            raise ValueError(f"num_numbers={num_numbers!r} must be in [2, 6].")
        if not 1 <= min_number <= max_number:
            raise ValueError(
                f"min_number={min_number!r}, max_number={max_number!r}: need 1 <= min_number <= max_number."
            )
        if max_target < 1:
            raise ValueError(f"max_target={max_target!r} must be >= 1.")
        self.num_numbers, self.min_number, self.max_number = int(num_numbers), int(min_number), int(max_number)
        self.max_target, self.use_all_numbers = int(max_target), bool(use_all_numbers)
        self.numbers: list[int] = []
        self.target = 0
        self._solution = ""
        self._feedback = ""

    def instruction(self) -> str:
        """The rules and the answer format."""
        usage = "each number exactly once" if self.use_all_numbers else "each number at most once"
        return (
            "You are playing Countdown. Combine the given numbers with +, -, *, / and parentheses to make the "
            f"target, using {usage}. Answer with the expression only, e.g. <answer>(3 + 7) * 5</answer>."
        )

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> str:
        """Draw numbers and a reachable target (or take ``options["numbers"]`` and ``options["target"]``)."""
        self._feedback = ""
        if "numbers" in options:
            self.numbers, self.target = [int(n) for n in options["numbers"]], int(options["target"])
            self._solution = str(options.get("solution", ""))
            return self._observation()
        for _ in range(1000):
            numbers = [int(n) for n in rng.integers(self.min_number, self.max_number + 1, size=self.num_numbers)]
            built = _random_expression(numbers, rng)
            if built is not None and 1 <= built[0] <= self.max_target and built[0] not in numbers:
                self.numbers, self.target, self._solution = numbers, built[0], built[1]
                return self._observation()
        raise RuntimeError(
            f"no target in [1, {self.max_target}] reached in 1000 tries for numbers in "
            f"[{self.min_number}, {self.max_number}]; raise max_target or narrow the number range."
        )

    def _canonical_action(self, parsed: str) -> str | None:
        tree = parse_expression(parsed)
        return None if tree is None else ast.unparse(tree)

    def _apply(self, action: str) -> Transition:
        tree = parse_expression(action)
        assert tree is not None  # _canonical_action accepted it
        used, given = Counter(leaves(tree)), Counter(self.numbers)
        try:
            value: Fraction | None = evaluate(tree)
        except ZeroDivisionError:
            value = None
        if used - given:
            problem = f"{action} uses {sorted((used - given).elements())}, which are not available"
        elif self.use_all_numbers and used != given:
            problem = f"{action} must use every number exactly once"
        elif value is None:
            problem = f"{action} divides by zero"
        elif value != self.target:
            problem = f"{action} = {value}, not {self.target}"
        else:
            problem = ""
        correct = not problem
        self._feedback = "" if correct else f"Wrong: {problem}. Try again.\n"
        info = {"value": None if value is None else str(value)}
        return Transition(self._observation(), 1.0 if correct else 0.0, correct, success=correct, info=info)

    def _observation(self) -> str:
        return f"{self._feedback}Numbers: {' '.join(map(str, self.numbers))}\nTarget: {self.target}"

    def solution(self) -> list[str]:
        """A correct answer for the current numbers (the expression the target was built from)."""
        return [self._solution]


def _random_expression(numbers: list[int], rng: np.random.Generator) -> tuple[int, str] | None:
    """Combine all ``numbers`` in random order with random operators, keeping every intermediate a
    positive integer; return ``(value, expression)`` or ``None`` if a step had no legal operator."""
    pool: list[tuple[int, str]] = [(n, str(n)) for n in numbers]
    while len(pool) > 1:
        i, j = (int(k) for k in rng.choice(len(pool), size=2, replace=False))
        (a, ea), (b, eb) = pool[i], pool[j]
        options = [(a + b, f"{ea} + {eb}"), (a * b, f"{ea} * {eb}")]
        if a > b:
            options.append((a - b, f"{ea} - {eb}"))
        if b > 1 and a % b == 0:
            options.append((a // b, f"{ea} / {eb}"))
        value, expr = options[int(rng.integers(len(options)))]
        pool = [p for k, p in enumerate(pool) if k not in (i, j)] + [(value, f"({expr})")]
    value, expr = pool[0]
    return value, ast.unparse(ast.parse(expr, mode="eval"))  # drop redundant parentheses
