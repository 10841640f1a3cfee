"""The OpenAI-compatible gateway: an HTTP server on loopback between agent harnesses and the inference engine.

Routes (nothing else is served; no engine endpoint is ever forwarded):

- ``POST /v1/chat/completions`` (session key): one model turn. The keys served and refused (a 400 naming the key:
  whatever would change what is sampled) are listed in :mod:`roll.agentic.gateway.openai_format`; ``max_tokens`` /
  ``max_completion_tokens`` are capped by the session's budget.
- ``GET /v1/models`` (session key): the one model.
- ``POST /v1/reward`` (session key): ``{"reward": float, "turn": int | null}``: a reward for the episode or a turn.
- ``POST /sessions``, ``POST /sessions/{id}/end`` (the gateway's admin key): start/end a session from outside
  Python (the env manager calls :meth:`Gateway.start_session` directly).

Anything else (the Responses API, an unknown route, a body that is not JSON) is answered in OpenAI's error format.

Keys: a session key (``Authorization: Bearer <key>``, the OpenAI client's ``api_key``) reaches its own session
only; a wrong or ended key gets 401. Keys are random (``secrets.token_urlsafe``); the server binds 127.0.0.1 only.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import replace
from typing import Any

from roll.agentic.gateway.engine import GenerationLoop
from roll.agentic.gateway.images import digest, message_images
from roll.agentic.gateway.openai_format import assistant_message, check_request, logprobs
from roll.agentic.gateway.session import GatewayError, Renderer, Session, template_message
from roll.agentic.gateway.tool_parsers import TOOL_PARSERS, ParsedReply
from roll.config.worker import GeneratingArgs
from roll.data.trajectory import ImagePrompt

#: Requests whose timings :attr:`Gateway.timings` keeps.
MAX_TIMINGS = 10_000


class Gateway:
    """Sessions, rendering, generation and tool-call parsing behind one loopback HTTP server.

    Args:
        tokenizer: the policy's tokenizer (its chat template renders every request).
        sampling: the sampling of every request (``temperature`` of a request overrides it only when
            ``honor_temperature``; training fixes it so that the trainer's log-probs match).
        sequence_length: most ids of one sample (prompt + reply); a longer request is a 400 and marks the session
            truncated.
        model_name: what ``/v1/models`` lists (any model name in a request is accepted).
        wait_s: how long a turn's batch waits for open sessions that have not sent their next request
            (:mod:`roll.agentic.gateway.engine`; training passes ``gateway_wait_s``).
        image_inputs: a vision-language actor's :class:`~roll.models.vision.ImageInputs` (its image tokens): requests
            may then hold ``image_url`` parts (:mod:`roll.agentic.gateway.images`), rendered as image placeholders
            expanded to each image's token count, and generated from with the sample's images
            (:class:`~roll.data.trajectory.ImagePrompt`); None: a text-only actor, which refuses image parts.
    """

    def __init__(
        self,
        tokenizer: Any,
        sampling: GeneratingArgs,
        sequence_length: int,
        model_name: str = "roll-policy",
        honor_temperature: bool = True,
        wait_s: float = 0.02,
        image_inputs: Any = None,
    ):
        placeholder = ""
        if image_inputs is not None:
            from roll.models.vision import IMAGE_PLACEHOLDER as placeholder
        self.renderer = Renderer(tokenizer, image_inputs, placeholder)
        #: the actor as errors name it (its model path)
        self.actor = getattr(tokenizer, "name_or_path", "") or model_name
        self.sampling, self.sequence_length, self.model_name = sampling, sequence_length, model_name
        self.honor_temperature = honor_temperature
        self.engine = GenerationLoop(wait_s)
        self._started = 0  # sessions started so far: their order in a batch
        self.admin_key = secrets.token_urlsafe(24)
        self._sessions: dict[str, Session] = {}
        self._by_key: dict[str, Session] = {}
        self._lock = threading.Lock()
        #: response id -> (seconds in :meth:`complete`, of them in the engine), the latest ``MAX_TIMINGS`` requests
        self.timings: dict[str, tuple[float, float]] = {}
        self._server: Any = None
        self.base_url = ""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> str:
        """Serve on 127.0.0.1 (a free port) in a daemon thread; returns the OpenAI base URL (``.../v1``)."""
        import uvicorn

        from roll.agentic.gateway.app import build_app

        config = uvicorn.Config(build_app(self), host="127.0.0.1", port=0, log_level="warning", access_log=False)
        self._server = uvicorn.Server(config)
        thread = threading.Thread(target=self._server.run, daemon=True, name="roll-gateway-http")
        thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the gateway's HTTP server did not start within 30 s")
            time.sleep(0.01)
        port = self._server.servers[0].sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self.base_url

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        self.engine.stop()

    # ------------------------------------------------------------------ sessions
    def start_session(
        self, max_tokens: int, tool_parser: str = "hermes", name: str | None = None, max_turns: int = 0
    ) -> tuple[str, str]:
        """A new session: ``(session id, key)``; ``max_tokens`` caps every reply of it, ``max_turns`` (0: no limit)
        its model calls (the next one is a 400 with code ``max_turns_exceeded``). ``name`` makes the id
        ``s-<name>`` (the env manager passes the trajectory id, so that ids, and the tool-call ids derived from them,
        are the same from run to run); the key is always random."""
        TOOL_PARSERS.resolve(tool_parser)
        session_id = f"s-{name}" if name else f"s-{secrets.token_hex(6)}"
        with self._lock:
            if session_id in self._sessions:
                raise ValueError(f"a live session is already named {session_id!r}")
            session = Session(
                session_id, secrets.token_urlsafe(24), tool_parser, max_tokens, order=self._started, max_turns=max_turns
            )
            self._started += 1
            self._sessions[session.session_id] = session
            self._by_key[session.key] = session
            self.engine.open(session.session_id, session.order)
        return session.session_id, session.key

    def session(self, session_id: str) -> Session:
        """The record of a live session."""
        with self._lock:
            return self._sessions[session_id]

    def end_session(self, session_id: str) -> Session | None:
        """Close a session (its key stops working) and return its record; None if it was closed already."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is None:
                return None
            self._by_key.pop(session.key, None)
            session.ended = True
            self.engine.close(session_id)
        return session

    def session_of(self, authorization: str | None) -> Session:
        """The live session of a ``Bearer`` key (401 otherwise)."""
        key = (authorization or "").removeprefix("Bearer ").strip()
        session = self._by_key.get(key)
        if session is None or session.ended:
            raise GatewayError(
                401, "invalid or ended session key: use the api_key of a live session", "invalid_api_key"
            )
        return session

    def post_reward(self, session: Session, reward: float, turn: int | None = None) -> None:
        """Add ``reward`` to the episode (``turn`` None) or to turn ``turn`` (0-based; -1 = the latest)."""
        with session.lock:
            if turn is None:
                session.reward = (session.reward or 0.0) + reward
                return
            index = turn if turn >= 0 else len(session.turns) + turn
            if not 0 <= index < len(session.turns):
                raise GatewayError(400, f"turn={turn}: the session has {len(session.turns)} turns")
            session.turn_rewards[index] = session.turn_rewards.get(index, 0.0) + reward

    # ------------------------------------------------------------------ completions
    def _args(self, body: dict[str, Any]) -> GeneratingArgs:
        check_request(body)
        temperature = _number(body, "temperature", float, 0.0)
        if temperature is None or not self.honor_temperature:
            return self.sampling
        return replace(self.sampling, temperature=temperature, do_sample=temperature > 0)

    def complete(self, session: Session, body: dict[str, Any]) -> dict[str, Any]:
        """One chat completion in OpenAI's response format (see the module docstring for the keys)."""
        start = time.perf_counter()
        args = self._args(body)
        choice = body.get("tool_choice")
        raw = body.get("messages")
        if not isinstance(raw, list) or not raw or not all(isinstance(m, dict) and "role" in m for m in raw):
            raise GatewayError(400, "messages must be a non-empty list of {role, content} objects")
        text_only = None if self.renderer.image_tokens is not None else self.actor
        images = message_images(raw, text_only, session.decoded)
        messages = [template_message(m, self.renderer.placeholder, digest(ims)) for m, ims in zip(raw, images)]
        tools = body.get("tools") or None
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        requested = (
            _number(body, "max_completion_tokens", int, 1) or _number(body, "max_tokens", int, 1) or session.max_tokens
        )
        with session.lock:  # one request of a session at a time: each turn extends the last
            if session.ended:
                raise GatewayError(401, "the session has ended (its episode was closed)", "invalid_api_key")
            session.check_turn_limit()
            prompt, prompt_ids, starts, shown = session.plan(self.renderer, messages, tools, images)
            budget = min(int(requested), session.max_tokens, self.sequence_length - len(prompt))
            if budget < 1:
                session.truncated = True
                raise GatewayError(
                    400,
                    f"the prompt has {len(prompt)} tokens; with a reply it exceeds "
                    f"sequence_length={self.sequence_length}",
                    "context_length_exceeded",
                )
            extends = bool(session.turns) and not starts  # the engine continues the sample's ids and images
            sample = session.sample_images() + shown if extends else shown
            engine_prompt = ImagePrompt(prompt, sample) if sample else prompt
            t = time.perf_counter()
            out = self.engine.generate(
                f"{session.session_id}/turn{len(session.turns)}", session.session_id, engine_prompt, args, budget
            )
            engine_s = time.perf_counter() - t
            ids, log_probs, finish = list(out.token_ids), list(out.log_probs), out.finish_reason
            ids, log_probs, finish = self._cut_at_stop(ids, log_probs, finish, stops)
            eos = self.renderer.eos_id
            text = self.renderer.decode(ids[:-1] if ids and ids[-1] == eos else ids)
            text = _before_stop(text, stops)
            parsed = (
                ParsedReply(text or None)
                if choice == "none" or not tools  # no tools offered: plain text
                else TOOL_PARSERS.get(session.tool_parser)(text)
            )
            offered = {(t.get("function") or {}).get("name") for t in tools or [] if isinstance(t, dict)}
            parsed.errors += sum(c.name not in offered for c in parsed.calls)  # returned, but not a valid call
            reply = assistant_message(session.session_id, len(session.turns), parsed)
            session.record(
                messages,
                prompt,
                prompt_ids,
                starts,
                ids,
                log_probs,
                finish,
                text,
                template_message(reply),
                parsed,
                eos,
                out.policy_version,
                shown,
            )
        response_id = f"chatcmpl-{session.session_id}-{len(session.turns) - 1}"
        self.timings[response_id] = (time.perf_counter() - start, engine_s)
        if len(self.timings) > MAX_TIMINGS:  # keep memory flat over a long run
            self.timings.pop(next(iter(self.timings)))
        reason = "length" if finish == "length" else "tool_calls" if parsed.calls else "stop"
        return {
            "id": response_id,
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model") or self.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": reply,
                    "finish_reason": reason,
                    "logprobs": logprobs(self._pieces(ids), log_probs) if body.get("logprobs") else None,
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(ids),
                "total_tokens": len(prompt) + len(ids),
            },
        }

    def _pieces(self, ids: list[int]) -> list[str]:
        """Each generated id as text (the end-of-turn token included, as the engine produced it)."""
        return [self.renderer.decode([i]) for i in ids]

    def _cut_at_stop(
        self, ids: list[int], log_probs: list[float], finish: str, stops: list[str]
    ) -> tuple[list[int], list[float], str]:
        """Keep the ids up to the token that completes a stop string (the rest was never shown to anyone)."""
        if not stops:
            return ids, log_probs, finish
        for k in range(1, len(ids) + 1):
            if any(s in self.renderer.decode(ids[:k]) for s in stops):
                return ids[:k], log_probs[:k], "stop" if k < len(ids) or finish != "length" else finish
        return ids, log_probs, finish


def _number(body: dict[str, Any], key: str, kind: type, minimum: float) -> Any:
    """``body[key]`` as ``kind`` (None when absent); not a number or below ``minimum`` is a 400 naming the key."""
    value = body.get(key)
    if value is None:
        return None
    try:
        number = kind(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < minimum or isinstance(value, bool):
        raise GatewayError(400, f"{key}={value!r}: expected a number >= {minimum}")
    return number


def _before_stop(text: str, stops: list[str]) -> str:
    """OpenAI's rule: the returned text ends before the first stop string."""
    cuts = [text.find(s) for s in stops if s in text]
    return text[: min(cuts)] if cuts else text
