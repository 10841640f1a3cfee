"""OpenAI's Chat Completions format on the gateway's side: which request keys are served, and the response objects.

Served: ``messages`` (content a string or ``text`` and ``image_url`` parts; images as data URLs, for a
vision-language actor: :mod:`roll.agentic.gateway.images`), ``tools``, ``tool_choice`` (``auto``, ``none``),
``max_tokens`` / ``max_completion_tokens``, ``stop``, ``n`` = 1, ``stream`` with ``stream_options.include_usage``
(the reply is sampled exactly as without streaming, then sent as server-sent events in OpenAI's chunk format:
:func:`chunks`), ``logprobs`` (the log-probs the engine sampled with, per generated token), ``temperature`` (only
where the gateway does not fix the sampling; training fixes it), ``parallel_tool_calls`` (every call the model wrote
is returned: a model cannot be stopped from writing two), ``response_format`` ``{"type": "text"}``. Keys that only
label a request (``model``, ``user``, ``metadata``, ``store``, ``seed``, ``service_tier``, ...) are accepted and
have no effect. Refused with a 400 in OpenAI's error format, naming the key (``param``): whatever would change what
is sampled, since the trainer could not reproduce the log-probs of a distribution it does not have (:data:`REFUSED`,
:func:`check_request`).
"""

from __future__ import annotations

import json
from typing import Any

from roll.agentic.gateway.session import GatewayError
from roll.agentic.gateway.tool_parsers import ParsedReply

#: Request keys that would change the sampled distribution, with the values that leave it alone.
REFUSED: dict[str, tuple[Any, ...]] = {
    "n": (1, None),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "top_logprobs": (None, 0),
}
#: How each framework asks for plain tool calls instead of forced ones (docs/agents.md has the same lines).
FORCED_TOOLS_FIX = (
    "send tool_choice='auto' or leave it out (smolagents: OpenAIModel(..., tool_choice='auto'); OpenAI Agents SDK: "
    "ModelSettings(tool_choice='auto'); LangChain: bind_tools(tools) without tool_choice)"
)


def check_request(body: dict[str, Any]) -> None:
    """A 400 naming the first key of ``body`` whose value would change what is sampled, or a forced tool call."""
    for key, allowed in REFUSED.items():
        if key in body and body[key] not in allowed:
            raise GatewayError(
                400,
                f"{key}={body[key]!r} is not supported by roll's gateway (allowed: "
                f"{[a for a in allowed if a is not None]}): it would change what is sampled and recorded for training",
                "unsupported_parameter",
                key,
            )
    choice = body.get("tool_choice")
    if choice not in (None, "auto", "none"):
        raise GatewayError(
            400,
            f"tool_choice={choice!r} is not supported by roll's gateway: a forced call is sampled from a constrained "
            f"distribution that the trainer cannot reproduce; {FORCED_TOOLS_FIX}",
            "unsupported_parameter",
            "tool_choice",
        )
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type", "text") == "text"):
        raise GatewayError(
            400,
            f"response_format={fmt!r} is not supported by roll's gateway: constrained decoding "
            f"would change what is sampled; ask for the format in the prompt and parse the reply",
            "unsupported_parameter",
            "response_format",
        )


def assistant_message(session_id: str, turn: int, parsed: ParsedReply) -> dict[str, Any]:
    """The reply in OpenAI's format; tool-call ids name the session and turn (the same from run to run)."""
    message: dict[str, Any] = {"role": "assistant", "content": parsed.content}
    if parsed.calls:
        message["tool_calls"] = [
            {
                "id": f"call_{session_id}_{turn}_{i}",
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for i, c in enumerate(parsed.calls)
        ]
    return message


def logprobs(tokens: list[str], log_probs: list[float]) -> dict[str, Any]:
    """``choices[0].logprobs``: per generated token its text, sampling log-prob and UTF-8 bytes (no alternatives)."""
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8")), "top_logprobs": []}
            for t, lp in zip(tokens, log_probs)
        ]
    }


def chunks(response: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
    """A finished chat completion as the ``chat.completion.chunk`` objects a stream sends, in order: the role, the
    content, each tool call (whole, with its index), the finish reason (with the log-probs, when asked for), and the
    usage when ``include_usage`` (``stream_options``). Concatenated, they give the completion back."""
    head = {k: response[k] for k in ("id", "created", "model")}
    choice, message = response["choices"][0], response["choices"][0]["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict[str, Any]:
        body = {"index": 0, "delta": delta, "logprobs": extra.pop("logprobs", None), "finish_reason": finish}
        return {**head, "object": "chat.completion.chunk", "choices": [body], **extra}

    out = [chunk({"role": "assistant", "content": ""})]
    if message.get("content"):
        out.append(chunk({"content": message["content"]}, logprobs=choice["logprobs"]))
    elif choice["logprobs"]:
        out.append(chunk({}, logprobs=choice["logprobs"]))
    for i, call in enumerate(message.get("tool_calls") or []):
        out.append(chunk({"tool_calls": [{"index": i, **call}]}))
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": response["usage"]})
    return out


def server_sent_events(response: dict[str, Any], include_usage: bool = False) -> str:
    """:func:`chunks` as the body of a ``text/event-stream`` response, ending with ``data: [DONE]``."""
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks(response, include_usage)) + "data: [DONE]\n\n"
