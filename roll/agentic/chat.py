"""Chat formatting at token level: the first prompt, and the tokens between one model reply and the next.

History is appended as token ids and never re-templated, so the ids a trajectory trains on are exactly the ids the
model was given and produced. :meth:`ChatFormatter.turn_delta` derives, from the tokenizer's own chat template, the
text that follows an assistant reply's end-of-turn token (``<|im_end|>``): e.g. ``\\n<|im_start|>user\\n{obs}
<|im_end|>\\n<|im_start|>assistant\\n``. :meth:`ChatFormatter.conformance` re-renders the whole conversation with the
template and reports whether the ids agree (templates that strip earlier ``<think>`` blocks do not).
:func:`history_summary` writes the ``{history}`` of ROLL's step prompts (``turn_prompt: fresh``), where every turn
is a new conversation; :func:`next_turn` writes the user message and prompt ids before each turn (the env manager's
rollouts and the warm start's demonstrations share it).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

_PROBE = "\x00probe\x00"
_PROBE_USER = "\x00user-probe\x00"


class ChatFormatter:
    """Builds prompt token ids from chat messages with ``tokenizer``'s chat template."""

    def __init__(self, tokenizer: Any, system_prompt: str | None):
        self.tokenizer = tokenizer
        self.system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        self.eos_id = tokenizer.eos_token_id
        self.eos_text = tokenizer.decode([self.eos_id])
        self._delta_parts: dict[str, tuple[str, str]] = {}

    def render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def first_prompt(self, user_text: str, role: str = "user") -> list[int]:
        """Token ids of system + first user message + the assistant header."""
        return self.encode(self.render(self.system + [{"role": role, "content": user_text}], True))

    def turn_delta(self, user_text: str, role: str = "user") -> list[int]:
        """Token ids that follow an assistant reply's end-of-turn token up to the next assistant header."""
        if role not in self._delta_parts:
            self._delta_parts[role] = self._probe_delta(role)
        before, after = self._delta_parts[role]
        return self.encode(before + user_text + after)

    def _probe_delta(self, role: str) -> tuple[str, str]:
        """The template text around a ``role`` message's content after an assistant reply, found by probing."""
        head = self.system + [{"role": "user", "content": "x"}, {"role": "assistant", "content": _PROBE}]
        before = self.render(head, False)
        after = self.render(head + [{"role": role, "content": _PROBE_USER}], True)
        end = before.index(_PROBE) + len(_PROBE)
        cut = before.index(self.eos_text, end) + len(self.eos_text) if self.eos_text in before[end:] else end
        if not after.startswith(before[:cut]) or after.count(_PROBE_USER) != 1:
            raise ValueError(
                "chat template renders a prefix differently once a message is added; "
                "token-level history cannot be used with it"
            )
        delta = after[cut:]
        i = delta.index(_PROBE_USER)
        return delta[:i], delta[i + len(_PROBE_USER) :]

    def conformance(
        self,
        messages: list[dict[str, str]],
        token_ids: list[int],
        expand: Callable[[list[int]], list[int]] | None = None,
    ) -> bool:
        """Whether the template applied to the whole conversation gives exactly ``token_ids``.

        The conversation is taken up to its last assistant reply, and the rendered text is cut after that reply's
        end-of-turn token (the template's trailing newline is not part of what the model produced). ``expand``: what
        turns the encoded text's image placeholders into image tokens (conversations with images).
        """
        last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
        text = self.render(self.system + messages[: last + 1], False)
        end = text.rfind(self.eos_text)
        if last >= 0 and end >= 0:
            text = text[: end + len(self.eos_text)]
        ids = self.encode(text)
        return (expand(ids) if expand is not None else ids) == token_ids


def history_summary(turns: Sequence[Any], history_length: int | None) -> tuple[str, int]:
    """ROLL's ``{history}`` of a step prompt: the last ``history_length - 1`` completed turns (all of them for
    None) as ``(step: k, observation: ..., action: ..., reward: ...)`` joined by ", ", an invalid action marked;
    returns the text and how many turns it shows (``{history_length}``). ``turns`` are
    :class:`~roll.data.trajectory.Turn`-like: ``observation``, ``parsed_action``, ``response_text``, ``reward``,
    ``action_is_valid``.

    >>> from roll.data.trajectory import Turn
    >>> turns = [Turn([], [], [], "A", "<answer>Up</answer>", "Up", True, -0.1), Turn([], [], [], "B", "hm")]
    >>> text, shown = history_summary(turns, 5)
    >>> shown, text.split(", (")[0]
    (2, '(step: 1, observation: A, action: Up, reward: -0.1)')
    >>> history_summary(turns, 2)
    ('(step: 2, observation: B, action: hm (not a valid action: answer in the required format), reward: 0.0)', 1)
    >>> history_summary(turns, 1)
    ('', 0)
    """
    keep = len(turns) if history_length is None else max(0, min(len(turns), history_length - 1))
    first = len(turns) - keep
    parts = []
    for k, turn in enumerate(turns[first:], start=first + 1):
        action = turn.parsed_action if turn.parsed_action is not None else turn.response_text
        if not turn.action_is_valid:
            action += " (not a valid action: answer in the required format)"
        parts.append(f"(step: {k}, observation: {turn.observation}, action: {action}, reward: {turn.reward})")
    return ", ".join(parts), keep


def next_turn(
    spec: Any,
    formatter: ChatFormatter,
    turns: Sequence[Any],
    observation: str,
    *,
    instruction: str = "",
    reward: float = 0.0,
    image_text: str = "",
    role: str = "user",
    restart: bool = False,
) -> tuple[str, list[int], bool]:
    """``(user message, prompt ids, starts a sample)`` before turn ``len(turns) + 1`` of an env of ``spec`` (a
    :class:`~roll.config.agentic.CustomEnvConfig`): the first prompt, a delta after the last reply (``turn_prompt:
    append``), or a new conversation that starts a sample (``fresh``: ROLL's step prompt, its ``{history}`` the
    summary of the last turns). ``restart``: a new conversation with the first-turn template (``overflow:
    restart``). ``image_text``: the observation's image placeholders (the ids are not expanded)."""
    history, shown = history_summary(turns, spec.history_length)
    text = spec.turn_text(
        len(turns),
        observation,
        instruction=instruction,
        reward=reward,
        history=history,
        history_shown=shown,
        first=restart,
        image_text=image_text,
    )
    new = spec.turn_prompt == "fresh" or restart
    ids = formatter.first_prompt(text, role) if not turns or new else formatter.turn_delta(text, role)
    return text, ids, new and bool(turns)
