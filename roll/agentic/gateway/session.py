"""A gateway session: one agent episode's model calls, recorded as the engine saw them.

Every request of a session carries the whole conversation (the OpenAI API is stateless). The gateway renders it with
the tokenizer's chat template and decides what the engine is given (:meth:`Session.plan`):

- *extends*: the request's messages are the previous request's, then the reply the gateway returned, then new
  messages, and the template renders that history as a prefix of the new prompt (append-only). The engine gets the
  ids it saw before (prompt + generated reply, never re-tokenized) plus the tokens of the new messages, rendered
  after the reply's end-of-turn token: ``Turn.prompt_ids`` is that delta.
- *template break*: anything else (a template that strips earlier ``<think>`` blocks or re-renders tool calls, a
  harness that edits or truncates its history, a side conversation). The engine gets the full rendered prompt and
  the turn starts a new sample (``Turn.starts_sample``), so no sample ever holds tokens the engine did not see.

A reply is recorded with the ids and log-probs the engine returned; a reply cut by length or by a stop string gets
an end-of-turn token appended (``Turn.appended_eos``, not trained on), as the template closes the message there.

A session with ``max_turns`` answers the request after its last allowed turn with a 400 (code
``max_turns_exceeded``) and remembers it (``Session.turn_limit_hit``): the episode was cut by its turn limit.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from roll.agentic.gateway.tool_parsers import ParsedReply
from roll.data.trajectory import Turn


class GatewayError(Exception):
    """An error answered in OpenAI's format: HTTP ``status``, ``message``, ``code`` and the request key it is about
    (``param``, or None): ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, code: str = "invalid_request_error", param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict[str, Any]:
        """The JSON body OpenAI's clients parse (``openai.BadRequestError.code`` is ``code``)."""
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


def _arguments(value: Any) -> Any:
    """Tool-call arguments as an object (the OpenAI format sends a JSON string)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _text(content: Any, placeholder: str) -> str:
    """Message content as text: None -> "", a list of parts -> their texts, each image part as ``placeholder``
    (parts are checked before: :func:`roll.agentic.gateway.images.message_images`)."""
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(
            placeholder if p.get("type") == "image_url" else p.get("text", "") for p in content if isinstance(p, dict)
        )
    return str(content)


def template_message(message: dict[str, Any], placeholder: str = "", image_digest: str | None = None) -> dict[str, Any]:
    """An OpenAI message in the form Hugging Face chat templates read (content a string, arguments an object); an
    image part becomes ``placeholder`` (the actor's image tokens, before expansion), and ``image_digest`` (its
    images', :func:`roll.agentic.gateway.images.digest`) tells messages with equal text and other images apart."""
    out: dict[str, Any] = {"role": message["role"], "content": _text(message.get("content"), placeholder)}
    if image_digest is not None:
        out["image_digest"] = image_digest
    calls = message.get("tool_calls") or []
    if calls:
        out["tool_calls"] = [
            {
                "type": "function",
                "id": c.get("id"),
                "function": {
                    "name": c["function"]["name"],
                    "arguments": _arguments(c["function"].get("arguments", {})),
                },
            }
            for c in calls
        ]
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            out[key] = message[key]
    return out


def message_key(message: dict[str, Any]) -> str:
    """What makes two messages the same conversation step (ids of tool calls and extra keys do not count)."""
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
    key = [message["role"], message["content"], calls, message.get("tool_call_id")]
    if message.get("image_digest"):
        key.append(message["image_digest"])
    return json.dumps(key, sort_keys=True)


@dataclass
class Session:
    """One episode's record. ``context``: the ids the engine saw in the current sample (prompts and replies)."""

    session_id: str
    key: str
    tool_parser: str
    max_tokens: int
    order: int = 0  # the gateway's start order: a turn's batch holds its requests in this order (reproducible)
    max_turns: int = 0  # model calls allowed (0: no limit); the next one is refused with code max_turns_exceeded
    turns: list[Turn] = field(default_factory=list)
    history: list[str] = field(default_factory=list)  # message keys of the last request + the returned reply
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation so far (template form)
    context: list[int] = field(default_factory=list)
    turn_rewards: dict[int, float] = field(default_factory=dict)
    reward: float | None = None  # the episode reward posted by the harness
    template_breaks: int = 0
    parse_errors: int = 0
    truncated: bool = False  # a request would have exceeded sequence_length
    turn_limit_hit: bool = False  # a request past max_turns was refused
    decoded: dict[str, Any] = field(default_factory=dict, repr=False)  # images sent, by URL digest (images.py)
    ended: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check_turn_limit(self) -> None:
        """Refuse a request past ``max_turns``: a 400 the harness can end on; the episode counts as truncated."""
        if self.max_turns and len(self.turns) >= self.max_turns:
            self.turn_limit_hit = True
            raise GatewayError(
                400,
                f"turn limit reached: this episode has made its {self.max_turns} model calls (task.max_turns: "
                f"custom_envs.<tag>.max_actions_per_traj); end the episode",
                "max_turns_exceeded",
            )

    def plan(
        self,
        formatter: Renderer,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        images: list[list[Any]] | None = None,
    ) -> tuple[list[int], list[int], bool, list[Any]]:
        """``(engine prompt, Turn.prompt_ids, starts_sample, Turn.images)`` for a request with ``messages``
        (template form) and each message's ``images``: the images shown in ``Turn.prompt_ids`` are those of the
        messages it renders (the new ones when it extends the history, all when it starts a sample)."""
        images = images or [[] for _ in messages]
        full = formatter.render(messages, tools, True)
        keys = [message_key(m) for m in messages]
        if self.turns and keys[: len(self.history)] == self.history:
            prefix = formatter.render(messages[: len(self.history)], tools, False)
            cut = prefix.rfind(formatter.eos_text)
            if cut >= 0 and full.startswith(prefix[: cut + len(formatter.eos_text)]):
                new = [im for ims in images[len(self.history) :] for im in ims]
                delta = formatter.encode(full[cut + len(formatter.eos_text) :], new)
                return self.context + delta, delta, False, new
        shown = [im for ims in images for im in ims]
        ids = formatter.encode(full, shown)
        return ids, ids, bool(self.turns), shown

    def sample_images(self) -> list[Any]:
        """The images of the current sample (the turns since the last that starts one), in prompt order."""
        out: list[Any] = []
        for turn in self.turns:
            out = list(turn.images) if turn.starts_sample else out + list(turn.images)
        return out

    def record(
        self,
        messages: list[dict[str, Any]],
        prompt: list[int],
        prompt_ids: list[int],
        starts: bool,
        token_ids: list[int],
        log_probs: list[float],
        finish_reason: str,
        text: str,
        reply: dict[str, Any],
        parsed: ParsedReply,
        eos_id: int,
        version: int,
        images: list[Any] | None = None,
    ) -> Turn:
        """Append the turn the engine produced; ``reply`` is the assistant message returned (template form);
        ``images``: those shown in ``prompt_ids`` (:meth:`plan`)."""
        observation = next((m["content"] for m in reversed(messages) if m["role"] != "assistant"), "")
        turn = Turn(
            prompt_ids=prompt_ids,
            response_ids=list(token_ids),
            response_log_probs=list(log_probs),
            observation=observation,
            response_text=text,
            finish_reason=finish_reason,
            action_is_valid=parsed.errors == 0,
            starts_sample=starts,
            policy_version=version,
            images=list(images or []),
            parsed_action=json.dumps([[c.name, c.arguments] for c in parsed.calls]) if parsed.calls else None,
        )
        if finish_reason != "stop" or not token_ids or token_ids[-1] != eos_id:
            turn.response_ids.append(eos_id)
            turn.appended_eos = True
        self.template_breaks += starts
        self.parse_errors += parsed.errors
        self.turns.append(turn)
        self.context = prompt + turn.response_ids
        self.messages = messages + [reply]
        self.history = [message_key(m) for m in self.messages]
        return turn

    def scored_turns(self) -> list[Turn]:
        """The turns with their rewards: per-turn rewards where posted, the episode reward on the last turn."""
        for i, turn in enumerate(self.turns):
            turn.reward = self.turn_rewards.get(i, 0.0)
        if self.turns and self.reward is not None:
            self.turns[-1].reward += self.reward
        return self.turns


class Renderer:
    """The tokenizer's chat template as text and ids (tools passed through to the template).

    Args:
        tokenizer: the actor's tokenizer.
        image_tokens: a vision-language actor's image tokens (``expand(ids, images)``: each image placeholder's pad
            token repeated to the image's token count, :class:`roll.models.vision.ImageInputs`); None: text-only.
        placeholder: the text of one image in a rendered prompt, before expansion.
    """

    def __init__(self, tokenizer: Any, image_tokens: Any = None, placeholder: str = ""):
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.eos_text = tokenizer.decode([self.eos_id])
        self.image_tokens, self.placeholder = image_tokens, placeholder

    def render(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, add_generation_prompt: bool
    ) -> str:
        """The template's text of ``messages`` (the gateway's ``image_digest`` key is not shown to the template)."""
        shown = [{k: v for k, v in m.items() if k != "image_digest"} for m in messages]
        return self.tokenizer.apply_chat_template(
            shown, tools=tools or None, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def encode(self, text: str, images: list[Any] | None = None) -> list[int]:
        """The ids of ``text``; on a vision-language actor with the image pads of ``images`` expanded (a 400 when
        the text holds another number of image placeholders than there are images)."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if self.image_tokens is None:
            return ids
        try:
            return list(self.image_tokens.expand(ids, images or []))
        except ValueError as err:
            raise GatewayError(
                400,
                f"{err}: image placeholder text ({self.placeholder!r}) in a message stands for an image_url part; "
                f"send images as parts, not as that text",
                "invalid_image",
            ) from None

    def decode(self, ids: list[int]) -> str:
        """A reply's text: markup tokens (``<tool_call>``, ``<think>``) may be special, so none is skipped."""
        return self.tokenizer.decode(ids, skip_special_tokens=False)
