"""Extract the action from raw model text.

Every env receives the model's raw generated text and hands it to :class:`ActionParser`, so all envs
share one definition of "a well-formed answer". The decisions below are deliberate and tested in
``tests/envs/test_parsing.py``:

- Tags are matched case-insensitively (``<Answer>`` works); the captured content keeps its case and
  has surrounding whitespace stripped. An empty or whitespace-only answer counts as unparseable.
- A missing closing ``</answer>`` is accepted when the answer runs to the end of the text: generation
  is often stopped *at* ``</answer>`` (a stop string) or by the token limit.
- More than one answer block is ambiguous and rejected (``None``) by default; a format penalty teaches
  one answer per turn and stops hedging (listing several answers hoping one counts). Pass
  ``multiple="first"`` or ``multiple="last"`` to pick one instead.
- ``think_answer`` requires a closed ``</think>`` before the answer, with only whitespace between
  them. The opening ``<think>`` may be missing, since some chat templates put it in the prompt.
- A custom format is any regular expression with exactly one capture group, searched with
  ``re.DOTALL`` (case-sensitive unless the pattern says ``(?i)``).
"""

from __future__ import annotations

import re
from typing import Literal

NAMED_FORMATS: dict[str, str] = {
    # <answer>X</answer>; the closing tag may be cut off at the end of the text.
    "answer": r"<answer>(.*?)(?:</answer>|\Z)",
    # [<think>]...</think> <answer>X</answer>
    "think_answer": r"\A\s*(?:<think>)?(?:(?!<answer>).)*?</think>\s*<answer>(.*?)(?:</answer>|\Z)",
}
_CASE_INSENSITIVE = {"answer", "think_answer"}
_ANSWER_OPEN = re.compile(r"<answer>", re.IGNORECASE)

MultiplePolicy = Literal["reject", "first", "last"]


class ActionParser:
    """Parse the action out of model text, e.g. ``"<answer>Up</answer>" -> "Up"``.

    Args:
        action_format: ``"answer"`` (``<answer>X</answer>``), ``"think_answer"``
            (``<think>...</think><answer>X</answer>``) or a regular expression with exactly one
            capture group that holds the action.
        multiple: what to do when the text holds several answers: ``"reject"`` (unparseable),
            ``"first"`` or ``"last"``.

    Raises:
        ValueError: the format is neither a known name nor a regex with one capture group, or
            ``multiple`` is not one of the allowed policies.
    """

    def __init__(self, action_format: str = "answer", multiple: MultiplePolicy = "reject") -> None:
        if multiple not in ("reject", "first", "last"):
            raise ValueError(f"multiple={multiple!r} is not allowed; use 'reject', 'first' or 'last'.")
        self.action_format = action_format
        self.multiple = multiple
        self._named = action_format in NAMED_FORMATS
        self.pattern = self._compile(action_format)

    @staticmethod
    def _compile(action_format: str) -> re.Pattern[str]:
        if action_format in NAMED_FORMATS:
            flags = re.DOTALL | (re.IGNORECASE if action_format in _CASE_INSENSITIVE else 0)
            return re.compile(NAMED_FORMATS[action_format], flags)
        try:
            pattern = re.compile(action_format, re.DOTALL)
        except re.error as err:
            raise ValueError(
                f"action_format={action_format!r} is neither one of {sorted(NAMED_FORMATS)} nor a valid "
                f"regular expression ({err}). Use a named format or a regex with one capture group."
            ) from err
        if pattern.groups != 1:
            raise ValueError(
                f"action_format={action_format!r} has {pattern.groups} capture groups; a custom format needs "
                "exactly one, around the action, e.g. r'Action: (\\w+)'. Use (?:...) for other groups."
            )
        return pattern

    def parse(self, text: str) -> str | None:
        """Return the stripped action in ``text``, or ``None`` if the text holds no single valid answer."""
        if not isinstance(text, str):
            return None
        if self._named:
            return self._parse_named(text)
        answers = [m.group(1) for m in self.pattern.finditer(text) if m.group(1) is not None]
        return self._choose([a.strip() for a in answers])

    def render(self, action: str, thought: str = "") -> str:
        """The text a model would write to take ``action`` in this format (demonstrations): ``answer`` ->
        ``<answer>action</answer>``, ``think_answer`` -> ``<think>thought</think><answer>action</answer>``;
        ``parse(render(a)) == a``.

        Raises:
            ValueError: a custom regex format, which has no canonical rendering.
        """
        if self.action_format == "answer":
            return f"<answer>{action}</answer>"
        if self.action_format == "think_answer":
            return f"<think>{thought}</think><answer>{action}</answer>"
        raise ValueError(
            f"action_format={self.action_format!r} is a custom regex, which has no canonical rendering "
            f"of an action for demonstrations; use 'answer' or 'think_answer' for the warm start"
        )

    def _parse_named(self, text: str) -> str | None:
        if self.action_format == "think_answer":
            match = self.pattern.search(text)
            if match is None:
                return None
            # The answer block starts after </think>; only answers from there on count.
            answers = self._answer_blocks(text[match.start(1) - len("<answer>") :])
        else:
            answers = self._answer_blocks(text)
        return self._choose(answers)

    @staticmethod
    def _answer_blocks(text: str) -> list[str]:
        """All ``<answer>`` contents; an unclosed block runs to the next ``<answer>`` or the end."""
        starts = [m.end() for m in _ANSWER_OPEN.finditer(text)]
        blocks = []
        for i, start in enumerate(starts):
            end = starts[i + 1] - len("<answer>") if i + 1 < len(starts) else len(text)
            segment = text[start:end]
            close = segment.lower().find("</answer>")
            blocks.append((segment if close < 0 else segment[:close]).strip())
        return blocks

    def _choose(self, answers: list[str]) -> str | None:
        if not answers:
            return None
        if len(answers) > 1 and self.multiple == "reject":
            return None
        answer = answers[-1] if self.multiple == "last" else answers[0]
        return answer or None

    def __repr__(self) -> str:
        return f"ActionParser(action_format={self.action_format!r}, multiple={self.multiple!r})"
