"""GSM8K as a multi-turn text environment: answer a word problem, get feedback, retry."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from roll.data.files import read_records
from roll.envs.base import TextEnv, Transition
from roll.envs.registry import register_env
from roll.rewards.math_answer import answers_match

#: The shipped sample (written by scripts/make_math_data.py), used when no ``data_path`` is given.
SAMPLE_DIR = Path(__file__).resolve().parents[2] / "data" / "gsm8k_sample"
_FINAL = re.compile(r"####\s*(.+?)\s*$", re.DOTALL)


class Problem(NamedTuple):
    """One GSM8K problem: the question and its final answer (the text after ``####``, commas removed)."""

    question: str
    answer: str


@functools.lru_cache(maxsize=8)
def load_gsm8k(path: str) -> tuple[Problem, ...]:
    """Read GSM8K-format rows (``question``, ``answer`` ending in ``#### N``); cached per path.

    Raises:
        FileNotFoundError: the file is missing.
        ValueError: listing (up to 20) rows without a question or a ``####`` answer.
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(
            f"GSM8K data file {path!r} does not exist; pass data_path= (GSM8K .jsonl/.parquet with "
            "'question' and 'answer' columns) or regenerate the sample with scripts/make_math_data.py"
        )
    problems, bad = [], []
    for row, rec in enumerate(read_records(file, "GSM8K data file")):
        question, answer = rec.get("question"), rec.get("answer")
        final = _FINAL.search(answer) if isinstance(answer, str) else None
        if not isinstance(question, str) or not question.strip() or final is None:
            bad.append(row)
            continue
        problems.append(Problem(question.strip(), final.group(1).replace(",", "")))
    if bad or not problems:
        shown = ", ".join(map(str, bad[:20])) + (f" ... and {len(bad) - 20} more" if len(bad) > 20 else "")
        raise ValueError(
            f"{path}: {len(bad)} row(s) lack a non-empty 'question' or an 'answer' ending in '#### N' "
            f"(rows {shown or 'none; the file holds no rows'}); fix or remove them"
        )
    return tuple(problems)


@register_env("gsm8k")
class GSM8KEnv(TextEnv):
    """Solve a grade-school math word problem, with feedback and retries after a wrong answer.

    Action space:
        Model text whose answer (``<answer>...</answer>`` by default) is the final answer. Any non-empty
        answer is a valid action; it is compared with :func:`roll.rewards.math_answer.answers_match`
        (so ``1,234``, ``$5``, ``5 dollars``, ``0.5`` vs ``1/2`` are handled).

    Observation space:
        The question at reset; after a wrong answer, the feedback text (``"Incorrect, try again."``) with the
        number of attempts left.

    Starting state:
        A problem drawn uniformly from the data file with the reset seed (same seed, same problem), or the
        one at ``options["index"]``.

    Rewards:
        ``retry_discount ** (k - 1)`` for a correct answer at the k-th answer attempt (1.0 on the first try);
        0 for a wrong answer; ``format_penalty`` for text with no parseable answer.

    Episode end:
        Terminated on a correct answer (``success=True``), or when ``max_turns`` actions are used up
        (answers and unparseable texts both count): the attempt budget is part of the task, so running out
        terminates rather than truncates (``max_steps_terminates``).

    Info:
        The base keys; reset adds ``ground_truth`` and ``problem_index``; ``metrics`` has ``attempts``
        (answers given) and ``correct`` (0/1).

    Args:
        data_path: a GSM8K-format ``.jsonl`` or ``.parquet`` file; default: the shipped sample's ``split``.
        split: ``"train"`` or ``"test"`` of the shipped sample (ignored when ``data_path`` is given).
        max_turns: answer attempts per episode (``max_steps`` of the base class).
        retry_discount: reward factor per extra attempt, in (0, 1].
        feedback: the message after a wrong answer.
        timeout_s: time limit of one symbolic answer comparison.
        format_penalty, action_format, render_mode: see :class:`~roll.envs.base.TextEnv`.
    """

    max_steps_terminates = True

    def __init__(
        self,
        data_path: str | None = None,
        split: str = "train",
        max_turns: int = 3,
        retry_discount: float = 1.0,
        feedback: str = "Incorrect, try again.",
        timeout_s: float = 1.0,
        format_penalty: float = -0.1,
        action_format: str = "answer",
        render_mode: str | None = None,
    ) -> None:
        super().__init__(
            max_steps=max_turns, format_penalty=format_penalty, action_format=action_format, render_mode=render_mode
        )
        if not 0.0 < retry_discount <= 1.0:
            raise ValueError(f"retry_discount={retry_discount!r} must be in (0, 1] (1.0: no discount for retries).")
        if data_path is None and split not in ("train", "test"):
            raise ValueError(f"split={split!r} must be 'train' or 'test' (or pass data_path=).")
        self.data_path = str(data_path or SAMPLE_DIR / f"{split}.jsonl")
        self.problems = load_gsm8k(self.data_path)
        self.retry_discount, self.feedback, self.timeout_s = float(retry_discount), feedback, float(timeout_s)
        self.index, self.attempts, self.correct = 0, 0, False
        self._current = ""

    def instruction(self) -> str:
        """How to answer, and how many attempts there are."""
        return (
            "Solve the math word problem. Think step by step if you like, then give only the final number "
            "inside <answer></answer>, e.g. <answer>42</answer>. "
            f"If the answer is wrong you may try again, {self.max_steps} attempts in all."
        )

    def _reset(self, rng: np.random.Generator, options: dict[str, Any]) -> str:
        """Pick the problem: ``options["index"]`` if given, else one drawn with the seeded ``rng``."""
        index = options.get("index")
        if index is None:
            index = int(rng.integers(len(self.problems)))
        elif not 0 <= int(index) < len(self.problems):
            raise ValueError(f"options['index']={index!r} is out of range [0, {len(self.problems)}).")
        self.index, self.attempts, self.correct = int(index), 0, False
        self._current = self.problems[self.index].question
        return self._current

    def _reset_info(self) -> dict[str, Any]:
        return {"ground_truth": self.problems[self.index].answer, "problem_index": self.index}

    def _canonical_action(self, parsed: str) -> str | None:
        """Any non-empty answer text is a valid (possibly wrong) answer."""
        return parsed.strip() or None

    def _apply(self, action: str) -> Transition:
        self.attempts += 1
        if answers_match(action, self.problems[self.index].answer, timeout_s=self.timeout_s):
            self.correct = True
            self._current = "Correct."
            return Transition(self._current, self.retry_discount ** (self.attempts - 1), True, success=True)
        left = self.max_steps - self.num_steps
        self._current = f"{self.feedback} ({left} attempt{'s' if left != 1 else ''} left)"
        return Transition(self._current, 0.0, False)

    def _observation(self) -> str:
        return self._current

    def _metrics(self) -> dict[str, float]:
        return {"attempts": float(self.attempts), "correct": float(self.correct)}
